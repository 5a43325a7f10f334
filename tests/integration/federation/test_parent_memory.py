"""Parents at rest keep pydantic and PyYAML out of their memory: the kit comes from its kit.json
(an edited kit.yaml, and local/ when it changed, are read in a forked child: parent/run.py,
local_config.py), the spec models load with a job. They never map the system's OpenSSL (gRPC has
its own TLS; parent.run._without_system_openssl), and shutil's compressors come with the first
job. Nothing loads the protobuf runtime (wire/messages.py speaks the few control messages)."""

from __future__ import annotations

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
