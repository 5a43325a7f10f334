"""What parents at rest hold. Their kit comes from its kit.json (an edited kit.yaml, and local/
when it changed, are read in a forked child: parent/run.py, local_config.py); once started,
each loads its job path ahead of its first job (pydantic, the spec models, PyYAML, the process
launcher: parent/job_path.py; pydantic's plugin loader brings zipfile and its compressors).
They never map the system's OpenSSL (gRPC has its own TLS; parent.run._without_system_openssl)
and nothing loads the protobuf runtime (wire/messages.py speaks the few control messages)."""

from __future__ import annotations

from pathlib import Path

from tests.integration.federation.harness import wait_for

# Native parts of each package: mapped into a process exactly when the package is imported.
JOB_PATH = {"pydantic": "pydantic_core/_pydantic_core", "PyYAML": "yaml/_yaml"}
NEVER_AT_REST = {"the system OpenSSL": "libcrypto.so", "protobuf": "google/_upb/_message"}


def _maps(pid: int) -> str:
    return Path(f"/proc/{pid}/maps").read_text()


def test_parents_at_rest_load_their_job_path_ahead_and_nothing_they_do_not_need(federation):
    assert set(federation.procs) == {"server", "site-1", "site-2"}
    for name, proc in federation.procs.items():  # no job has run: loaded ahead, or never
        wait_for(lambda pid=proc.pid: all(so in _maps(pid) for so in JOB_PATH.values()),
                 timeout=60, what=f"the {name} parent loading its job path", poll=0.2)
        maps = _maps(proc.pid)
        assert "grpc/_cython/cygrpc" in maps  # the parent itself, not a wrapper process
        loaded = [package for package, so in NEVER_AT_REST.items() if so in maps]
        assert not loaded, f"{name} parent at rest has loaded {loaded}"
