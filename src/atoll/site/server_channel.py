"""The site parent's channel to the server, which follows an edited ``server`` in kit.yaml.

When the server moves (docs/provisioning.md, "Moving the server"), its operator re-issues the
server certificate for the new name and each site's operator edits ``server:`` in the site's
``startup/kit.yaml``. A running site notices: whenever the server cannot be reached it reads
kit.yaml again and, if the address changed, dials the new one. No restart, and no job of the
site is lost over it.

kit.yaml's bytes are compared first; only an edited file is parsed (with PyYAML, which then
stays loaded: a parent otherwise never imports it, see pki/kit.py).
"""

from __future__ import annotations

import logging
import threading
from typing import Any

import grpc

from atoll.pki.kit import KIT_FILE, Kit, KitError, load_kit
from atoll.pki.tls import channel_credentials
from atoll.wire import rpc
from atoll.wire.grpc_setup import secure_channel

log = logging.getLogger("atoll.site.connection")


class ServerChannel:
    """The current channel and Federation stub; ``follow()`` re-dials after an edit."""

    def __init__(self, kit: Kit):
        self._kit = kit
        self._kit_file = kit.startup_dir / KIT_FILE
        self._seen = self._read()
        self._lock = threading.Lock()
        self.address = kit.server_address
        self.channel = secure_channel(self.address, channel_credentials(kit), None)
        self.stub = rpc.stub(self.channel, "Federation")

    def _read(self) -> bytes | None:
        try:
            return self._kit_file.read_bytes()
        except OSError:
            return None

    def follow(self) -> bool:
        """Dial kit.yaml's ``server`` if it was edited to another address; True when it was.

        A kit.yaml that no longer reads is logged and the current address kept: a half-saved
        edit must not take the site off the federation.
        """
        data = self._read()
        if data is None or data == self._seen:
            return False
        self._seen = data
        try:
            kit = load_kit(self._kit.kit_dir)
        except KitError as exc:
            log.warning("kit.yaml edited but not readable; still dialling %s: %s",
                        self.address, exc)
            return False
        if kit.server_address == self.address:
            return False
        with self._lock:
            old, self.address = self.channel, kit.server_address
            self.channel = secure_channel(self.address, channel_credentials(self._kit), None)
            self.stub = rpc.stub(self.channel, "Federation")
        old.close()
        log.info("kit.yaml names another server: dialling %s", self.address)
        return True

    def redial(self) -> tuple[grpc.Channel, Any, str] | None:
        """For the server link: the new channel, stub and address after an edit, else None."""
        return (self.channel, self.stub, self.address) if self.follow() else None

    def close(self) -> None:
        self.channel.close()


class CurrentStub:
    """The Federation stub of whichever channel is current, for the parts of the site that call
    the server (the supervisor's fetches, the workers' relays)."""

    def __init__(self, server: ServerChannel):
        self._server = server

    def __getattr__(self, name: str) -> Any:
        return getattr(self._server.stub, name)
