"""Simulated sites for the scale run (bench/scale.py): many sites in one process, real protocol.

Each simulated site is what a site parent looks like to the server, without a parent process,
a launcher or a worker: its own mutual-TLS channel with its own certificate (issued by the
project's CA), the `Federation.Connect` control stream with hello and a heartbeat as often as
the server's welcome asks (site/connection.py's rule), and, when a job is dispatched to it, the
same calls a site parent and its worker make: fetch the app (`FetchJob`), report STARTING and
RUNNING, then on one `Tasks` call (site/task_stream.py) a pull, the reply (the payload echoed
back), a pull... until the server says end, then FINISHED:COMPLETED. SCALE_TASKS=calls makes
each pull and reply a call of its own (`PullTask`, `PushReply`), as site parents did before. All sites of a process share one
asyncio event loop (grpc.aio), so a thousand of them fit in a few processes.

    .venv/bin/python -m bench.scale_sites MANIFEST.json --first 0 --count 500 --events OUT.jsonl

MANIFEST.json: {"address": "127.0.0.1:PORT", "ca": PATH, "sites": [[name, cert, key], ...]}.
Every event (connected, dispatch, STARTING, RUNNING, task, reply, end, FINISHED) is written to
OUT.jsonl as {"site", "event", "job_id", "round", "t"} when the process stops (SIGTERM/SIGINT).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import resource
import signal
import sys
import time
from pathlib import Path
from typing import Any

import grpc

from atoll import __version__
from atoll.site.connection import HEARTBEAT_S, backoff_s, heartbeat_of
from atoll.wire import frames, rpc
from atoll.wire import messages as msg
from atoll.wire.grpc_setup import OPTIONS

PULL_WAIT_S = 30.0
# "calls": a call per pull and per reply; "stream-frames": one call, no payload inline
TASKS = os.environ.get("SCALE_TASKS", "stream")
NICE = 10
# Sites of one process that may be connecting at once (TLS handshake until the welcome). Real
# sites start on machines of their own, at moments of their own; ten processes that open a
# thousand channels each in the same second are a storm no federation sees, in which the
# server's handshakes time out, every site retries, and a simulated-site process has grown past
# 20 GiB in gRPC's client (twice, 2026-12-06), killing the run.
CONNECTING = int(os.environ.get("SCALE_CONNECTING", "100"))


class SimSite:
    def __init__(self, name: str, creds: grpc.ChannelCredentials, address: str, log: list,
                 connecting: asyncio.Semaphore):
        self.name = name
        self.connecting = connecting
        self.creds = creds
        self.address = address
        self.log = log
        self.outbox: asyncio.Queue[dict[str, Any] | None] = asyncio.Queue()
        self.jobs: dict[str, asyncio.Task] = {}
        self.channel: grpc.aio.Channel | None = None
        self.stub: object | None = None
        self.heartbeat_s = HEARTBEAT_S

    def record(self, event: str, job_id: str = "", round_: int | None = None) -> None:
        self.log.append((self.name, event, job_id, round_, time.time()))

    # -- the control stream, as atoll.site.connection does it -----------------------------------
    async def run(self) -> None:
        # a private subchannel pool: one TLS connection per simulated site, as with real parents
        options = [*OPTIONS, ("grpc.use_local_subchannel_pool", 1)]
        self.channel = grpc.aio.secure_channel(self.address, self.creds, options=options)
        self.stub = rpc.stub(self.channel, "Federation")
        attempt = 0
        while True:
            await self.connecting.acquire()
            call = self.stub.Connect(self._events())
            welcomed = False
            try:
                async for command in call:
                    kind = command.WhichOneof("kind")
                    if kind == "welcome":  # its heartbeat period, as a site parent takes it
                        self.heartbeat_s = heartbeat_of(json.loads(command.welcome))
                        if not welcomed:  # the call's first: the server restates it later
                            welcomed, attempt = True, 0  # as the federation grows
                            self.connecting.release()
                            self.record("connected")
                    else:
                        self._on_command(kind, json.loads(getattr(command, kind)))
            except grpc.aio.AioRpcError as exc:
                self.record(f"link broken: {exc.code().name}")
            finally:
                if not welcomed:
                    self.connecting.release()
            await asyncio.sleep(backoff_s(attempt))
            attempt += 1

    async def _events(self):
        yield msg.SiteEvent(
            hello=json.dumps(
                {
                    "version": __version__,
                    "launcher": "process",
                    "capacity": {"gpus": None, "cpus": None, "memory": None},
                    "running_jobs": list(self.jobs),
                }
            )
        )
        while True:
            try:
                body = await asyncio.wait_for(self.outbox.get(), self.heartbeat_s)
            except TimeoutError:
                yield msg.SiteEvent(heartbeat=json.dumps({"running_jobs": list(self.jobs)}))
                continue
            if body is None:
                return
            yield msg.SiteEvent(job_state=json.dumps(body))

    def _state(self, job_id: str, state: str, reason: str = "") -> None:
        self.outbox.put_nowait({"job_id": job_id, "state": state, "reason": reason})
        self.record(state, job_id)

    def _on_command(self, kind: str, body: dict[str, Any]) -> None:
        job_id = str(body.get("job_id", ""))
        self.record(kind, job_id)
        if kind == "dispatch" and job_id not in self.jobs:
            self.jobs[job_id] = asyncio.create_task(self._job(job_id))
        elif kind == "abort" and job_id in self.jobs:
            self.jobs.pop(job_id).cancel()
            self._state(job_id, "FINISHED:ABORTED", str(body.get("reason", "")))

    # -- a job, as a site parent plus its worker would run it -----------------------------------
    async def _job(self, job_id: str) -> None:
        assert self.stub is not None
        try:
            async for _ in self.stub.FetchJob(msg.JobRef(job_id=job_id)):
                pass  # the app zip: a real site unpacks it for its worker
            self._state(job_id, "STARTING", "simulated worker")
            self._state(job_id, "RUNNING", "simulated worker connected")
            if TASKS != "calls":
                await self._tasks(job_id)
            while TASKS == "calls":
                head, data = await self._pull(job_id)
                if head.get("end"):
                    break
                if head.get("none"):
                    continue
                headers = head.get("headers") or {}
                round_ = headers.get("round")
                self.record("task", job_id, round_)
                await self.stub.PushReply(_reply_frames(job_id, head, data))
                self.record("reply", job_id, round_)
            self._state(job_id, "FINISHED:COMPLETED")
        except grpc.aio.AioRpcError as exc:
            self.record(f"job call failed: {exc.code().name}: {exc.debug_error_string()}",
                        job_id)
            self._state(job_id, "FINISHED:FAILED", f"{exc.code().name}: {exc.details()}")
        finally:
            self.jobs.pop(job_id, None)

    async def _tasks(self, job_id: str) -> None:
        """Pull and reply on one call for the whole job, as site/task_stream.py does for a
        worker on its host: opened `compact`, each reply says its size, carries a small payload
        inline once the server has sent one, and asks for the next task, which comes with the
        ack (SCALE_TASKS=stream-frames: not compact, every payload in data frames)."""
        compact = TASKS == "stream"
        call = self.stub.Tasks()
        await call.write(frames.header({"job_id": job_id, **({"compact": True} if compact
                                                              else {})}))
        await call.write(frames.header({"pull": PULL_WAIT_S}))
        head, inline = frames.read_message(await call.read())
        inlined = False
        while True:
            head.pop("ack", None)
            if head.get("end"):
                break
            if head.get("none"):
                await call.write(frames.header({"pull": PULL_WAIT_S}))
                head, inline = frames.read_message(await call.read())
                continue
            if inline is not None:  # the payload in the header's message
                data, inlined = [frames.data(inline)] if inline else [], True
            elif "frames" in head:  # a whole payload: its number of frames
                data = [await call.read() for _ in range(head["frames"])]
            else:  # one still arriving: up to {done}
                data = []
                while frames.is_data(raw := await call.read()):
                    data.append(raw)
            round_ = (head.get("headers") or {}).get("round")
            self.record("task", job_id, round_)
            async for raw in _reply_frames(job_id, head, data):
                if frames.is_data(raw):
                    await call.write(raw)
                    continue
                # the reply's header, on this call without its job id; its size known (a
                # site parent knows it from the worker's handoff file), the next task asked for
                reply = frames.read_header(raw)
                reply.pop("job_id")
                sized = {"reply": reply, "pull": PULL_WAIT_S, "bytes": sum(map(len, data))}
                if inlined and sized["bytes"] <= frames.INLINE_MAX:  # bytes: the payload's
                    payload = b"".join(map(frames.data_view, data))
                    await call.write(frames.header({**sized, "bytes": len(payload)}, payload))
                    break
                await call.write(frames.header(sized))  # bytes: its frames
            head, inline = frames.read_message(await call.read())  # {ack}, maybe with a task
            if set(head) == {"ack"}:
                head, inline = frames.read_message(await call.read())
            self.record("reply", job_id, round_)
        await call.done_writing()

    async def _pull(self, job_id: str) -> tuple[dict[str, Any], list[bytes]]:
        assert self.stub is not None
        raw = [frame async for frame in self.stub.PullTask(
            msg.PullRequest(job_id=job_id, wait_s=PULL_WAIT_S))]
        if not raw:
            return {"none": True}, []
        head, payload = frames.split(iter(raw))
        return head, list(payload.frames())


async def _reply_frames(job_id: str, head: dict[str, Any], data: list[bytes]):
    headers = {"topic": head.get("topic"), "round": (head.get("headers") or {}).get("round")}
    yield frames.header({"job_id": job_id, "task_id": head["task_id"], "headers": headers})
    for frame in data:  # the task's payload echoed back, as the echo site script does
        yield frame


def raise_fd_limit(wanted: int) -> int:
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft < wanted:
        soft = min(wanted, hard)
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))
    return soft


async def main_async(args: argparse.Namespace) -> int:
    # Below the server in CPU priority: the simulated sites stand in for machines of their own,
    # and on these 2 shared cores a dozen site processes otherwise starve the server under
    # test (its keepalive answers late, and clients drop their calls: CANCELLED at 3,000).
    os.nice(NICE)
    manifest = json.loads(Path(args.manifest).read_text())
    ca = Path(manifest["ca"]).read_bytes()
    chosen = manifest["sites"][args.first : args.first + args.count]
    raise_fd_limit(4 * len(chosen) + 256)
    log: list = []
    sites = []
    connecting = asyncio.Semaphore(CONNECTING)
    for name, cert, key in chosen:
        creds = grpc.ssl_channel_credentials(
            root_certificates=ca,
            private_key=Path(key).read_bytes(),
            certificate_chain=Path(cert).read_bytes(),
        )
        sites.append(SimSite(name, creds, manifest["address"], log, connecting))
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    tasks = [asyncio.create_task(site.run()) for site in sites]
    await stop.wait()
    for task in tasks:
        task.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)
    await asyncio.gather(
        *(s.channel.close() for s in sites if s.channel is not None), return_exceptions=True
    )
    with open(args.events, "w") as out:
        for name, event, job_id, round_, t in log:
            out.write(
                json.dumps({"site": name, "event": event, "job_id": job_id, "round": round_,
                            "t": t}) + "\n"
            )
    return 0


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("manifest")
    parser.add_argument("--first", type=int, default=0)
    parser.add_argument("--count", type=int, required=True)
    parser.add_argument("--events", required=True)
    return asyncio.run(main_async(parser.parse_args(argv)))


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
