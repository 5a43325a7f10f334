"""Parents at rest keep pydantic and PyYAML out of their memory: the kit comes from its kit.json
(an edited kit.yaml, and local/ when it changed, are read in a forked child: parent/run.py,
local_config.py), the spec models load with a job. They never map the system's OpenSSL (gRPC has
its own TLS; parent.run._without_system_openssl), and shutil's compressors come with the first
job. Nothing loads the protobuf runtime (wire/messages.py speaks the few control messages), and
each keeps one heap arena."""

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


def _arena_heaps(pid: int) -> list[str]:
    """The process's malloc arenas besides the main one: glibc maps each as 64 MiB of address
    space aligned to 64 MiB (HEAP_MAX_SIZE on 64-bit), a read-write start and the rest reserved.
    A parent sets one arena before its second thread (base/malloc_tuning.py one_arena): with a
    second, its growth over 100 MB round trips was half as much again (make bench)."""
    regions = []
    for line in Path(f"/proc/{pid}/maps").read_text().splitlines():
        parts = line.split()
        start, end = (int(x, 16) for x in parts[0].split("-"))
        regions.append((start, end, parts[1], parts[5] if len(parts) > 5 else ""))
    heaps = []
    for i, (start, end, perms, path) in enumerate(regions):
        if start % (64 << 20) or path or not perms.startswith("rw"):
            continue
        nxt = regions[i + 1] if i + 1 < len(regions) else None
        if nxt and nxt[0] == end and nxt[2].startswith("---") and not nxt[3]:
            end = nxt[1]
        if end - start == 64 << 20:
            heaps.append(hex(start))
    return heaps


def _assert_at_rest(name: str, pid: int) -> None:
    maps = Path(f"/proc/{pid}/maps").read_text()
    assert "grpc/_cython/cygrpc" in maps  # the parent itself, not a wrapper process
    loaded = [package for package, so in NOT_AT_REST.items() if so in maps]
    assert not loaded, f"{name} parent at rest has loaded {loaded}"
    assert _arena_heaps(pid) == [], f"{name} parent has a second heap arena"


def test_parents_at_rest_load_none_of_what_they_do_not_need(federation):
    assert set(federation.procs) == {"server", "site-1", "site-2"}
    for name, proc in federation.procs.items():
        _assert_at_rest(name, proc.pid)


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
            _assert_at_rest(f"detached {name}", pid)
    finally:
        atoll("poc", "down")
