"""Parents at rest keep pydantic and PyYAML out of their memory: the kit comes from its kit.json
(an edited kit.yaml, and local/ when it changed, are read in a forked child: parent/run.py,
local_config.py), the spec models load with a job. They never map the system's OpenSSL (gRPC has
its own TLS; parent.run._without_system_openssl), and shutil's compressors come with the first
job. Nothing loads the protobuf runtime (wire/messages.py speaks the few control messages)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

# Native parts of each package: mapped into a process exactly when the package is imported.
NOT_AT_REST = {"pydantic": "pydantic_core/_pydantic_core", "PyYAML": "yaml/_yaml",
               "the system OpenSSL": "libcrypto.so", "bz2 (shutil)": "_bz2.cpython",
               "lzma (shutil)": "_lzma.cpython", "protobuf": "google/_upb/_message"}


def test_parents_at_rest_load_none_of_what_they_do_not_need(federation):
    assert set(federation.procs) == {"server", "site-1", "site-2"}
    for name, proc in federation.procs.items():
        maps = Path(f"/proc/{proc.pid}/maps").read_text()
        assert "grpc/_cython/cygrpc" in maps  # the parent itself, not a wrapper process
        loaded = [package for package, so in NOT_AT_REST.items() if so in maps]
        assert not loaded, f"{name} parent at rest has loaded {loaded}"


def test_detached_parents_at_rest_load_none_of_it_either(tmp_path):
    """`atoll poc up` starts its parents detached, their logs rotated as site.yaml's `logs`
    says: taken from the check of local/ or its record, not from site.yaml parsed in the
    parent (which loaded pydantic and PyYAML into every detached parent at its start)."""
    env = {**os.environ, "ATOLL_HOME": str(tmp_path / "home")}
    workspace = tmp_path / "ws"

    def atoll(*args: str) -> None:
        subprocess.run([sys.executable, "-m", "atoll", *args, "--workspace", str(workspace)],
                       env=env, check=True, capture_output=True, timeout=120)

    atoll("poc", "up", "--sites", "1")
    try:
        pids = {name: json.loads((workspace / "poc" / name / "workspace" / f"{role}.pid")
                                 .read_text())["pid"]
                for name, role in [("server", "server"), ("site-1", "site")]}
        time.sleep(2)  # past the sandbox's probe and the verifier's start
        for name, pid in pids.items():
            maps = Path(f"/proc/{pid}/maps").read_text()
            assert "grpc/_cython/cygrpc" in maps
            loaded = [package for package, so in NOT_AT_REST.items() if so in maps]
            assert not loaded, f"detached {name} parent at rest has loaded {loaded}"
    finally:
        atoll("poc", "down")
