"""``python -m atoll.parent server|site KIT [--ready-file FILE] [--log-file FILE] [--verbose]``:
a parent's own process.

``atoll server|site start`` checks its arguments, then replaces itself with this entry (or, with
``--detach``, spawns it), so that a parent that runs for months carries none of the CLI (click
and atoll.cli, ~1.5 MiB). Its kit is read here from the kit.json that provision wrote next to
kit.yaml; a kit.yaml edited since is parsed in a forked child, which keeps PyYAML (~1 MiB) out of
the parent too. Errors and exit codes are those of ``atoll server|site start`` (the table in
``atoll.spec.errors``).
"""

from __future__ import annotations

import importlib
import logging
import os
import sys
from pathlib import Path

RUNNERS = {"server": "atoll.server.app", "site": "atoll.site.app"}


def command(role: str, kit: Path, ready_file: Path | None = None,
            verbose: bool = False, log_file: Path | None = None) -> list[str]:
    """The argv that runs the ``role`` parent of ``kit`` in a process of its own."""
    argv = [sys.executable, "-m", "atoll.parent", role, str(kit)]
    if ready_file is not None:
        argv += ["--ready-file", str(ready_file)]
    if log_file is not None:
        argv += ["--log-file", str(log_file)]
    return argv + (["--verbose"] if verbose else [])


LOG_FORMAT = "ts=%(asctime)s level=%(levelname)s component=%(name)s msg=%(message)r"


def setup_logging(verbose: bool = False, log_file: Path | None = None,
                  logs: tuple[int, int] | None = None) -> None:
    """One structured line per event: time, level, component, message; to standard error, or
    to ``log_file``, rotated past ``logs``' size in bytes keeping its count of old files
    (site.yaml's ``logs``: LocalConfig.log_rotation; required with a log file)."""
    if log_file is None:
        handler: logging.Handler = logging.StreamHandler(sys.stderr)
    else:
        from atoll.parent.log_file import ParentLog

        assert logs is not None, "a parent's log file is rotated as its site.yaml says"
        handler = ParentLog(log_file, *logs)
    logging.basicConfig(level=logging.DEBUG if verbose else logging.INFO, handlers=[handler],
                        format=LOG_FORMAT)


def _fail(message: str, code: int) -> int:
    print(f"error: {message}", file=sys.stderr, flush=True)
    return code


def _without_system_openssl() -> None:
    """Keep the system's OpenSSL (libcrypto, ~4.5 MiB resident once loaded) out of a parent.

    A parent speaks TLS through gRPC, which carries its own BoringSSL; what maps libcrypto is
    only Python's bindings: hashlib and hmac (the parents' SHA-256 digests, which CPython also
    has built in, and hashlib then uses), and `ssl`, which asyncio imports as gRPC loads it
    (asyncio's own TLS, which nothing in a parent uses). So hashlib is told OpenSSL is absent,
    and `ssl` is absent only while gRPC loads: a launcher's client library that needs TLS
    (kubernetes, docker) imports the real module later.
    """
    from atoll.base.sha256 import openssl_out_at_rest

    openssl_out_at_rest()
    if "ssl" in sys.modules or "grpc" in sys.modules:
        return
    sys.modules["ssl"] = None
    try:
        import grpc  # noqa: F401 - loaded here, with asyncio, while `ssl` is absent
    finally:
        del sys.modules["ssl"]


def run(role: str, kit_path: Path, ready_file: Path | None, verbose: bool,
        log_file: Path | None = None) -> int:
    # What a parent and the workers it starts on its host make (results, logs, spill files)
    # is private by default, whatever umask the operator's shell had; the parent also sets the
    # modes of its own folders and files explicitly.
    os.umask(0o077)
    # One heap arena, set before this process has a second thread (the sandbox's probe and
    # the verifier start on timers; base/malloc_tuning.py)
    from atoll.base.malloc_tuning import one_arena

    one_arena()
    _without_system_openssl()
    from atoll.parent import pidfile
    from atoll.parent.forked import run_forked
    from atoll.pki.kit import KitError, load_kit, load_kit_without_yaml
    from atoll.spec.errors import EXIT_CONNECTION, EXIT_INTERRUPTED, EXIT_INVALID, AtollError

    try:
        # The fork and the child's import of PyYAML cost 35-45 ms of start; only an edited
        # kit.yaml (or a kit without kit.json) needs them.
        kit = load_kit_without_yaml(kit_path)
        if kit is None:
            kit = run_forked(load_kit, kit_path)
    except KitError as exc:
        return _fail(str(exc), exc.exit_code)
    if kit.kind != role:
        return _fail(f"{kit_path} is a {kit.kind} kit; `atoll {role} start` needs a {role}'s kit",
                     EXIT_INVALID)
    running = pidfile.read_pid(kit.workspace, role)
    if running:
        return _fail(f"the {role} parent of {kit_path} already runs (pid {running}); "
                     f"`atoll {role} stop {kit_path}`", EXIT_INVALID)
    # The check of local/ starts now, in a child forked before gRPC's threads exist, and runs
    # while this process imports and starts listening.
    from atoll.parent.local_config import load_local_config

    local = load_local_config(kit.local_dir, study_runtime=role == "site",
                              workspace=kit.workspace)
    # The signature verifier starts once this parent is up (a timer thread, after the fork
    # above), so that it has loaded cryptography by the first job (pki/verifier.py).
    from atoll.pki import verifier

    verifier.prestart(verifier.START_AFTER_S)
    run_forever = importlib.import_module(RUNNERS[role]).run_forever
    try:  # detached, the log's rotation waits for the check of local/site.yaml
        logs = local.log_rotation if log_file is not None else None
    except AtollError as exc:
        return _fail(str(exc), exc.exit_code)
    setup_logging(verbose, log_file, logs)
    pidfile.write_pid(kit.workspace, role)
    try:
        return run_forever(kit, ready_file, local)
    except AtollError as exc:  # a SpecError lists every problem of local/
        return _fail(str(exc), exc.exit_code)
    except OSError as exc:
        return _fail(f"cannot start the {role} parent: {exc}", EXIT_CONNECTION)
    except KeyboardInterrupt:
        return _fail("interrupted", EXIT_INTERRUPTED)
    finally:
        pidfile.remove_own(kit.workspace, role, os.getpid())


def main(argv: list[str]) -> None:
    args = list(argv)
    verbose = "--verbose" in args
    if verbose:
        args.remove("--verbose")
    ready_file = None
    if "--ready-file" in args:
        at = args.index("--ready-file")
        ready_file = Path(args[at + 1])
        del args[at:at + 2]
    log_file = None
    if "--log-file" in args:
        at = args.index("--log-file")
        log_file = Path(args[at + 1])
        del args[at:at + 2]
    if len(args) != 2 or args[0] not in RUNNERS:
        sys.exit(_fail("usage: python -m atoll.parent server|site KIT "
                       "[--ready-file FILE] [--log-file FILE] [--verbose]", 2))
    os.environ.setdefault("GRPC_ENABLE_FORK_SUPPORT", "false")  # as atoll.cli.main sets them
    os.environ.setdefault("GRPC_VERBOSITY", "ERROR")
    code = run(args[0], Path(args[1]), ready_file, verbose, log_file)
    # The parent stopped in order: state saved, workers stopped. RPC threads still parked in
    # long polls would hold the interpreter's exit for up to 30 s, so leave now.
    logging.shutdown()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


if __name__ == "__main__":
    main(sys.argv[1:])
