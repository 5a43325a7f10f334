"""The server worker's launch: its run folder (the app and the signed files the worker checks
again), its one-use token, the launch on the server parent's launcher, and the wait for its end
(which server/lifecycle.py records).

The signer is checked once more just before the launch, against the list held then: a list that
arrived after the dispatch stops a worker that has not started.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

from atoll.base.files import private_dir
from atoll.launchers.base import LaunchError, Outcome, WorkerExit
from atoll.pki.job_signature import SIGNATURE_FILE
from atoll.spec.errors import SpecError

if TYPE_CHECKING:
    from atoll.parent.worker_endpoint import WorkerTokens
    from atoll.server.jobs import WorkerHost
    from atoll.server.live_jobs import LiveJob
    from atoll.server.store import Store

log = logging.getLogger("atoll.server.jobs")


class ServerWorkerLaunch:
    """The server worker's launch, part of the job manager (server/jobs.py composes it)."""

    store: Store
    host: WorkerHost
    tokens: WorkerTokens

    def _run_server_worker(self, live: LiveJob) -> None:
        import shutil  # with the first job, not at rest: it loads bz2 and lzma

        run_dir = live.folder / "run" / "server"
        try:
            app = live.meta.app_for("server")
            shutil.copytree(live.folder / "job" / app, private_dir(run_dir) / "app",
                            dirs_exist_ok=True)
            signed = private_dir(run_dir / "signed")  # the worker checks them again
            for name in ("meta.json", SIGNATURE_FILE):
                if (live.folder / "job" / name).is_file():
                    shutil.copyfile(live.folder / "job" / name, signed / name)
            token = self.tokens.issue(live.id)
            if self.host.launcher.shares_host:
                live.relay.share_files()
            shared = (live.relay.handoff.path,) if live.relay.handoff is not None else ()
            request = self.host.launch_request(live.record, live.meta, run_dir, token, shared)
            # the list held now, not the one at intake or dispatch (server/job_signer.py)
            why = self._revoked(live.folder / "job")
            if why is not None:
                log.warning("job %s: its server worker is not started: %s", live.id, why)
                self.abort(live.id, f"aborted before the server worker started: {why}")
                self._server_ended(live, WorkerExit(Outcome.FAILED, why))
                return
            if live.aborting:  # aborted (a newer list, an admin) while it was being prepared
                self._server_ended(live, WorkerExit(Outcome.FAILED, live.aborting))
                return
            self.store.set_part_state(live.id, "server", "STARTING")
            if live.resumes:  # what the server worker before the restart left (a Pod)
                self.host.launcher.remove_leftovers(request)
            live.handle = self.host.launcher.launch(request)
        except (LaunchError, SpecError, OSError) as exc:
            self._server_ended(live, WorkerExit(Outcome.FAILED, self._public(
                live, f"server worker could not start: {exc}")))
            return
        if live.aborting:  # aborted while starting
            self.host.launcher.cancel(live.handle)
        self._server_ended(live, self.host.launcher.wait(live.handle))
