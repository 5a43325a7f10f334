"""`python -m atoll.worker`: the job-side runtime a launcher starts for one job.

Exit codes (rows of the one table, atoll.spec.errors.EXIT_CODES): 0 the job's part completed;
1 the workflow or training script failed (traceback in the worker log); 2 the worker was
misconfigured (missing environment); 3 its parent refused it (bad, reused or other-job token);
70 its parent died (worker/lifeline.py).
"""

from __future__ import annotations

import gc
import json
import os
import sys
import traceback
from pathlib import Path

# numpy's OpenBLAS starts a thread per core when it is imported, and each spins for about 0.1 s
# of CPU before it sleeps: three workers starting at once on a 2-core host lost a third of a
# core-second to it. Idle BLAS threads now sleep at once (after 2^4 cycles; the least OpenBLAS
# takes) and are woken by the next parallel call. A study that wants them spinning sets it.
os.environ.setdefault("OPENBLAS_THREAD_TIMEOUT", "4")

from atoll.spec import worker_env
from atoll.spec.errors import EXIT_CONNECTION, EXIT_FAILED, EXIT_INVALID
from atoll.spec.worker_env import RESULTS_HOME_VAR, SEND_RESULTS
from atoll.worker.local_ranks import (
    LocalRanks,
    become_rank_zero,
    one_gpu_per_rank,
    starts_local_ranks,
    write_rank_error,
)

EXIT_CONFIG, EXIT_REFUSED = EXIT_INVALID, EXIT_CONNECTION  # what those rows mean for a worker
TOKEN_VAR = worker_env.JOB_TOKEN
SECAGG_VAR = worker_env.SECAGG_CREDENTIAL  # atoll.pki.worker_credential.CREDENTIAL_VAR


class RankFailed(Exception):
    """Another rank of this site failed; its own error is the message."""


def _error_line(exc: BaseException) -> str:
    if isinstance(exc, RankFailed):
        return str(exc)
    return "".join(traceback.format_exception_only(type(exc), exc)).strip()


def _peer_failed(stub, meta, peers: LocalRanks, reason: str) -> None:
    """A child rank failed while rank 0 trains (maybe blocked in a collective): report, stop."""
    import grpc

    from atoll.wire import messages as msg

    print(f"atoll worker: {reason}; stopping the site's other ranks", file=sys.stderr, flush=True)
    peers.stop()
    try:
        stub.Finish(msg.Json(body=json.dumps({"ok": False, "error": reason[-2000:]})),
                    metadata=meta, timeout=10)
    except grpc.RpcError:
        pass
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(EXIT_FAILED)


def _other_rank(job_id: str, role: str) -> int:
    """A rank other than 0: no token, no link to the parent; it runs the site's script with
    every task broadcast by rank 0 (atoll.fl.distributed)."""
    os.environ.pop(TOKEN_VAR, None)
    fd = os.environ.pop(worker_env.CREDENTIALS_FD, "")
    if fd:  # never for this rank; close it unread if a launcher passed one anyway
        os.close(int(fd))
    if role != "site":
        print("atoll worker: only a site's worker runs with several ranks", file=sys.stderr)
        return EXIT_CONFIG
    from atoll.worker.lifeline import tie_to_parent

    parent_pid = os.environ.get(worker_env.PARENT_PID)
    tie_to_parent(int(parent_pid) if parent_pid else None)
    workdir = Path(os.environ.get(worker_env.WORKDIR, os.getcwd()))
    site = _env(worker_env.SITE)
    rank = int(os.environ["RANK"])
    if not (workdir / "app").is_dir():
        print(f"atoll worker: rank {rank} finds no app in {workdir}: the nodes of a multi-node "
              "job must share the site's workspace folder", file=sys.stderr)
        return EXIT_CONFIG
    try:
        from atoll.fl.distributed import NoLink, Ranks
        from atoll.fl.runner import run_site_app

        datasets = json.loads(os.environ.get(worker_env.DATASETS, "{}") or "{}")
        run_site_app(NoLink(job_id, site), workdir / "app", site, datasets,
                     ranks=Ranks.from_env())
    except BaseException as exc:  # noqa: BLE001 - rank 0 reports it for the site
        if isinstance(exc, SystemExit) and exc.code in (0, None):
            return 0
        traceback.print_exc()
        write_rank_error(workdir, rank, _error_line(exc))
        return EXIT_FAILED
    return 0


def _env(name: str) -> str:
    value = os.environ.get(name)
    if not value:
        print(f"atoll worker: {name} is not set; workers are started by a parent", file=sys.stderr)
        sys.exit(EXIT_CONFIG)
    return value


def _beat(stub, metadata, every: str) -> None:
    """Tell the parent now and then that this worker lives, whatever the job's code does: a
    worker that stops (frozen, swapped out, a hung node) stops beating, and its parent stops it
    after supervision.stall_s (site/supervisor.py)."""
    import threading
    import time

    import grpc

    from atoll.wire import messages as msg

    try:
        period = float(every)
    except ValueError:
        return  # a parent that watches no heartbeats
    if not 0 < period <= 3600:
        return
    beat = msg.Json(body=json.dumps({"kind": "heartbeat"}))

    def run() -> None:
        while True:
            time.sleep(period)
            try:
                stub.Report(beat, metadata=metadata, timeout=max(period, 5.0))
            except grpc.RpcError:
                pass  # the parent is away: the channel's own errors end the job if it stays so

    threading.Thread(target=run, name="heartbeat", daemon=True).start()


def _rejoining(stub, job_id: str, token: str, session: str):
    """The stub that waits for a restarted site parent (worker/rejoin.py), where the site set
    supervision.rejoin_s; else the stub itself."""
    try:
        rejoin_s = float(os.environ.get(worker_env.REJOIN_S, "") or 0)
    except ValueError:
        rejoin_s = 0.0
    if not 0 < rejoin_s <= 86400:
        return stub
    from atoll.wire import rpc
    from atoll.wire.parent_address import read_parent
    from atoll.wire.worker_link import worker_channel
    from atoll.worker.rejoin import RejoiningStub

    workdir = Path(os.environ.get(worker_env.WORKDIR, os.getcwd()))
    dialled = [(os.environ.get(worker_env.PARENT, ""), os.environ.get(worker_env.PARENT_CERT))]

    def redial():
        found = read_parent(workdir)
        if found is None or found == dialled[-1]:
            return None
        dialled.append(found)
        return rpc.stub(worker_channel(*found), "WorkerLink")

    return RejoiningStub(stub, job_id, token, session, rejoin_s, redial=redial)


def _fetch_app(stub, metadata, workdir: Path, target: str) -> None:
    from atoll.wire import frames
    from atoll.wire import messages as msg
    from atoll.wire.job_archive import unpack_app
    from atoll.worker.signed_job import keep_signed

    workdir.mkdir(parents=True, exist_ok=True)
    _, chunks = frames.split(iter(stub.FetchApp(msg.Json(body="{}"), metadata=metadata)))
    archive = workdir / "app.zip"
    frames.write_chunks(chunks, archive)
    unpack_app(archive, target, workdir / "app", workdir / "tmp",
               check=lambda tree: keep_signed(tree, workdir))  # for signed_job.check


def _handoff(info: dict):
    """The handoff folder the parent offered, if this worker sees it (wire/handoff.py)."""
    from atoll.wire.handoff import HandoffDir

    path = info.get("handoff")
    if not path:
        return None
    try:
        folder = HandoffDir(Path(path))
    except OSError as exc:
        print(f"atoll worker: handoff folder {path} is not usable here ({exc.strerror}); "
              "payloads go through the worker link", file=sys.stderr)
        return None
    print(f"atoll worker: payloads come and go as files through {path}", flush=True)
    return folder


def _credentials() -> dict[str, str]:
    """The job token and secret values: from the pipe the process launcher hands over (read
    once, then closed: never in an environment block that /proc shows), else from the
    environment (containers, pods and batch jobs get them through their own secret channel)."""
    fd = os.environ.pop(worker_env.CREDENTIALS_FD, "")
    if not fd:
        return {}
    chunks = []
    with os.fdopen(int(fd), "rb") as pipe:
        while chunk := pipe.read(65536):
            chunks.append(chunk)
    return {str(k): str(v) for k, v in json.loads(b"".join(chunks) or b"{}").items()}


def _forward_allowed_destinations() -> None:
    """In a network namespace of its own (process launcher): the site's allowed destinations, on
    their addresses in the namespace, relayed to the parent's sockets for them, before any job
    code runs; the other ranks share the namespace, so rank 0 alone serves them."""
    from atoll.launchers.process_network import FORWARD_ENV, forward_inside

    spec = os.environ.pop(FORWARD_ENV, "")
    if spec:
        try:
            forward_inside(spec)
        except (OSError, ValueError) as exc:  # the job may not need them: it runs, and says so
            print(f"atoll worker: the site's allowed destinations are not reachable from this "
                  f"job: {exc}", file=sys.stderr, flush=True)


def main() -> int:
    job_id, role, parent = _env(worker_env.JOB_ID), _env(worker_env.ROLE), _env(worker_env.PARENT)
    starts_peers = role == "site" and starts_local_ranks(os.environ)
    checker = None
    if role == "server":  # forked first: the process has no other thread yet, nor gRPC
        from atoll.worker.signed_job import Checker

        checker = Checker()
    if os.environ.get("RANK", "0") == "0":  # before the rendezvous port is chosen
        _forward_allowed_destinations()
    node_gpus: list[str | None] = []
    if starts_peers:
        node_gpus = become_rank_zero(os.environ)
    else:
        one_gpu_per_rank(os.environ)
    if os.environ.get("RANK", "0") != "0":
        return _other_rank(job_id, role)
    secret_values = _credentials()
    token = secret_values.pop(TOKEN_VAR, "") or os.environ.get(TOKEN_VAR, "")
    os.environ.pop(TOKEN_VAR, None)  # gone from the environment scripts inherit
    # The site-certified secure aggregation key (pki/worker_credential.py): atoll's, not the
    # job's: kept out of the environment the job's code sees.
    secagg_credential = (secret_values.pop(SECAGG_VAR, "")
                         or os.environ.pop(SECAGG_VAR, "") or None)
    os.environ.pop(SECAGG_VAR, None)
    os.environ.update(secret_values)  # the study's secret_env, for the job's own code
    parent_pid = os.environ.get(worker_env.PARENT_PID)
    workdir = Path(os.environ.get(worker_env.WORKDIR, os.getcwd()))

    import logging

    from atoll.worker.lifeline import tie_to_parent

    logging.basicConfig(level=logging.INFO, stream=sys.stderr,
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")

    tie_to_parent(int(parent_pid) if parent_pid else None)

    from atoll.base.malloc_tuning import tune_for_streaming

    tune_for_streaming()

    import grpc

    from atoll.wire import messages as msg
    from atoll.wire import rpc
    from atoll.wire.worker_link import worker_channel

    stub = rpc.stub(worker_channel(parent, os.environ.get(worker_env.PARENT_CERT)), "WorkerLink")
    try:
        answer = stub.Register(msg.Json(body=json.dumps({"job_id": job_id, "token": token})),
                               timeout=30)
    except grpc.RpcError as exc:
        print(f"atoll worker: parent refused registration: {exc.details()}", file=sys.stderr)
        return EXIT_REFUSED
    info = json.loads(answer.body)
    session = info["session"]
    meta = (("x-atoll-worker", session),)
    print(f"atoll worker: job {job_id} role {role} registered with {parent}", flush=True)
    if role == "site" and parent_pid is None:  # it may outlive its parent: it waits for the next
        stub = _rejoining(stub, job_id, token, session)
    if role == "site":
        _beat(stub, meta, os.environ.get(worker_env.HEARTBEAT_S, ""))

    ok, error, peers = True, "", None
    try:
        if not (workdir / "app").is_dir():  # a container, pod or compute node: fetch the app
            _fetch_app(stub, meta, workdir, os.environ.get(worker_env.SITE, role))
        if role == "server":
            assert checker is not None
            trusted = checker.ask(workdir, info.get("trust"))
            from atoll.fl.runner import run_server_app
            from atoll.worker.grpc_channels import GrpcServerChannel

            trusted()  # the job's signature and signer, checked before any of its code runs
            results = workdir / "results"
            results.mkdir(parents=True, exist_ok=True)
            send_home = os.environ.get(RESULTS_HOME_VAR) == SEND_RESULTS  # a Pod's emptyDir
            channel = GrpcServerChannel(stub, session, job_id, info["sites"], results,
                                        _handoff(info), send_home=send_home)
            if info.get("checkpoints") is False:  # the parent's benchmark switch
                channel.checkpoint_dir = None
            job_args = info.get("job_args", {})
            if send_home and job_args.get("resume"):  # its checkpoint is at the parent
                print(f"atoll worker: the checkpoint of round {channel.fetch_checkpoint()} "
                      "fetched from the parent", flush=True)
            gc.freeze()  # see _exit_now
            run_server_app(channel, workdir / "app", job_args)
        else:
            from atoll.fl.distributed import Ranks
            from atoll.fl.runner import run_site_app
            from atoll.worker.grpc_channels import GrpcSiteChannel

            site = _env(worker_env.SITE)
            datasets = json.loads(os.environ.get(worker_env.DATASETS, "{}") or "{}")
            # The site's statistics rules, taken before the job's code runs (atoll.fl.statistics)
            rules = os.environ.pop(worker_env.STATISTICS_RULES, "")
            channel = GrpcSiteChannel(stub, session, job_id, site, _handoff(info))
            ranks = Ranks.from_env()
            if starts_peers:  # after the app is here: the other ranks run it from the run folder
                peers = LocalRanks(os.environ, workdir, node_gpus, {TOKEN_VAR, *secret_values})
                peers.start()
                peers.watch(lambda reason: _peer_failed(stub, meta, peers, reason))
            gc.freeze()  # see _exit_now
            run_site_app(channel, workdir / "app", site, datasets,
                         statistics_rules=json.loads(rules) if rules else None, ranks=ranks,
                         secagg_credential=secagg_credential)
            if peers is not None and (failure := peers.finish()):
                raise RankFailed(failure)
    except BaseException as exc:  # noqa: BLE001 - every failure must reach the job's status
        if isinstance(exc, SystemExit) and exc.code in (0, None):
            pass
        else:
            ok = False
            if not isinstance(exc, RankFailed):
                traceback.print_exc()
            error = _reason(exc)
            if peers is not None and not isinstance(exc, RankFailed):
                error = peers.root_cause() or error
    if peers is not None:
        peers.stop()
    if os.environ.get(RESULTS_HOME_VAR) == SEND_RESULTS and (
            failure := _send_results(stub, meta, workdir)):
        ok, error = False, f"{error}; {failure}" if error else failure
    try:
        stub.Finish(msg.Json(body=json.dumps({"ok": ok, "error": error[-2000:]})), metadata=meta,
                    timeout=10)
    except grpc.RpcError:
        pass
    sys.stdout.flush()
    sys.stderr.flush()
    return 0 if ok else EXIT_FAILED


def _send_results(stub, metadata, workdir: Path) -> str:
    """Send results/ home (wire/results_archive.py); the reason it failed, or ""."""
    import grpc

    from atoll.wire import frames
    from atoll.wire.results_archive import RESULTS, zip_results

    folder = workdir / RESULTS
    if not folder.is_dir():
        return ""
    archive = zip_results(folder, workdir / "results-home.zip")
    try:
        answer = stub.SendResults(frames.payload_frames({}, frames.file_chunks(archive)),
                                  metadata=metadata, timeout=3600)
    except grpc.RpcError as exc:
        return f"its results could not be sent to the parent: {exc.details()}"
    finally:
        archive.unlink(missing_ok=True)
    print(f"atoll worker: results sent to the parent: {answer.body}", flush=True)
    return ""


def _reason(exc: BaseException) -> str:
    """A failure as the job's status shows it: atoll's own errors by their message (it names
    the file and field), others as ``TypeName: message``; the traceback is in the log."""
    from atoll.spec.errors import AtollError

    if isinstance(exc, AtollError):
        return str(exc)
    return f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__


def _exit_now(code: int) -> None:
    """Leave without tearing the interpreter down module by module (numpy, gRPC, the job's
    own: 0.1-0.3 s here), which the parent waits for before the part is finished. What a normal
    exit does for the job's code is done first: its non-daemon threads are waited for, atexit
    functions run (loggers, writers), files still open are flushed, and unreachable objects are
    collected, so their finalizers run (a zip or event file left open writes its end).
    What atoll itself loaded before the job's code ran was frozen out of the collector
    (gc.freeze in main): scanning and collecting it took 0.3 s per worker here, and none of it
    is the job's."""
    import atexit
    import threading

    for thread in threading.enumerate():
        if thread is not threading.current_thread() and not thread.daemon:
            thread.join()
    atexit._run_exitfuncs()
    _flush_open_files()  # before collecting: a file in a cycle may lose its buffer there
    gc.collect()
    _flush_open_files()
    os._exit(code)


def _flush_open_files() -> None:
    import io

    for obj in gc.get_objects():
        if isinstance(obj, io.IOBase):
            try:
                if not obj.closed:
                    obj.flush()
            except (OSError, ValueError):
                pass


if __name__ == "__main__":
    _exit_now(main())
