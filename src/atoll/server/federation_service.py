"""The Federation service: what site parents call, over mutual TLS, as themselves.

It is served on the server's event loop (wire/aio_server.py). The calls every connected site
keeps open (its control stream, and each running job's task stream: `Tasks`, or the older
`PullTask` long poll and `PushReply`) and its fetch of the job are `async`: they wait as tasks,
not threads. What blocks (SQLite, building a zip) goes to the
loop's executor.

Every call is admitted before its request is read (`admit`: a site certificate within its
limits, server/auth.py), and every read of a site's stream has a deadline (wire/guard.py). What
a site sends is checked as it is used: a malformed message is answered INVALID_ARGUMENT, never
with a traceback. Every job and task id a site names is of its grammar (spec/names.py) before
it is looked up, stored or logged.
"""

from __future__ import annotations

import asyncio
import functools
import itertools
import json
import logging
import math
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

import grpc

from atoll import __version__
from atoll.server import site_ops
from atoll.server.auth import Gate, peer_identity_async
from atoll.server.relay import END, RelayError, TaskEntry
from atoll.server.site_links import SiteLink, SiteLinks
from atoll.server.site_ops import SiteJobs
from atoll.server.spool import SpoolError
from atoll.spec.names import IdentifierError, check_job_id, check_task_id
from atoll.wire import frames
from atoll.wire import messages as msg
from atoll.wire.bodies import Heartbeat, Hello, JobState, SiteReport
from atoll.wire.guard import Deadlines, Stalled

if TYPE_CHECKING:
    from atoll.server.store import Store

log = logging.getLogger("atoll.server.federation")

# A Tasks call is quiet while its site trains on a task, for as long as a round takes; inside a
# reply, each frame comes within a stream's usual deadline.
TASKS_QUIET_S = 7 * 24 * 3600.0
REPLY_FRAME_S = Deadlines().next_s


class SiteRegistry(Protocol):
    """The sites the server has seen, by org (server/studies.py)."""

    def remember_site(self, name: str, org: str) -> None: ...


class RevocationPush(Protocol):
    """The project's revocation list, sent to a site after its welcome (server/revocation.py)."""

    def on_connect(self, link: SiteLink, context: Any) -> None: ...


class FederationService:
    def __init__(self, *, store: Store, jobs: SiteJobs, studies: SiteRegistry,
                 links: SiteLinks, revocations: RevocationPush, wake: Callable[[], None],
                 stopping: Callable[[], bool]):
        self.store = store  # the gate's audit entries and the sites' progress events
        self.jobs = jobs
        self.studies = studies
        self.links = links
        self.revocations = revocations
        self.wake = wake  # the scheduler: a site came online
        self.stopping = stopping
        self.gate = Gate("Federation", "site", store)
        self.admit = self.gate.admit  # wire/guard.py: before a request is read

    async def Connect(self, request_iterator, context):
        who = await peer_identity_async(context, "site")
        events = request_iterator.__aiter__()
        try:
            first = await events.__anext__()
        except StopAsyncIteration:
            return
        if first.WhichOneof("kind") != "hello":
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, "a site must start with hello")
        try:
            hello = Hello.parse(first.hello)
        except ValueError as exc:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, str(exc))
        if why := site_ops.hello_refusal(hello, __version__):  # spec/versions.py
            log.warning("refused site %s: %s", who.name, why)
            await context.abort(grpc.StatusCode.FAILED_PRECONDITION, why)
        loop = asyncio.get_running_loop()
        link = SiteLink(who.name, who.org, hello.doc, loop,
                        heartbeat_s=self.links.heartbeat_period())
        await loop.run_in_executor(None, self.studies.remember_site, who.name, who.org)
        # its parts that had not ended before this link: dispatched on an earlier one
        known = self.jobs.parts_at(who.name)
        self.links.attach(link)
        self.revocations.on_connect(link, context)  # the CRL follows the welcome
        log.info("site %s connected (%s)", who.name, link.hello.get("launcher", "?"))
        reader = asyncio.create_task(self._read(link, events), name=f"site-{who.name}")
        try:
            yield msg.ServerCommand(welcome=json.dumps({"heartbeat_s": link.heartbeat_s,
                                                       "server_time": time.time()}))
            # reconcile after a reconnect
            for job_id in site_ops.stale_jobs(self.jobs, who.name, hello.running_jobs):
                link.send("abort", {"job_id": job_id, "reason": site_ops.GONE})
            if known:  # a restarted site parent is sent its parts again
                await loop.run_in_executor(None, site_ops.back, self.jobs, who.name,
                                           hello.running_jobs, known)
            self.wake()
            while (command := await link.outbox.get()) is not None:
                yield command
        finally:
            reader.cancel()
            # (a server that is stopping has stopped its jobs and closes its store)
            if self.links.detach(link) and not self.stopping():
                log.info("site %s disconnected", who.name)
                loop.run_in_executor(None, site_ops.offline, self.jobs, who.name)

    async def _read(self, link: SiteLink, events) -> None:
        loop = asyncio.get_running_loop()
        try:
            async for event in events:
                link.last_seen = time.monotonic()
                kind = event.WhichOneof("kind")
                if kind == "heartbeat":
                    site_ops.heartbeat(link, Heartbeat.parse(event.heartbeat))
                elif kind == "job_state":
                    # one site's states stay in order: the next waits for this one
                    await loop.run_in_executor(None, site_ops.job_state, self.jobs, link.name,
                                               JobState.parse(event.job_state))
        except (grpc.RpcError, asyncio.CancelledError):
            pass
        except (Stalled, ValueError) as exc:  # the site reconnects; say why it was dropped
            log.warning("dropping the link of site %s: %s", link.name, exc)
        except Exception:  # noqa: BLE001
            log.exception("bad event from site %s", link.name)
        finally:
            link.close()

    async def FetchJob(self, request, context):
        site = (await peer_identity_async(context, "site")).name
        await _checked_id(context, request.job_id)
        loop = asyncio.get_running_loop()
        # the first fetch builds the zip; the rest find it (and a small one's frames, shared)
        path = await _mapped(context, loop.run_in_executor(None, site_ops.app_zip, self.jobs,
                                                           site, request.job_id))
        for raw in _app_frames(path):
            yield raw

    async def PullTask(self, request, context):
        site = (await peer_identity_async(context, "site")).name
        await _checked_id(context, request.job_id)
        head, entry = await self._next_task(context, site, request.job_id, request.wait_s)
        yield frames.header(head)
        if entry is not None:
            async for raw in _spooled(context, entry, site):
                yield raw

    async def PushReply(self, request_iterator, context):
        site = (await peer_identity_async(context, "site")).name
        stream = request_iterator.__aiter__()
        head = await _first_header(context, stream)
        answer = await self._take_reply(context, site, head, stream)
        return msg.Json(body=json.dumps(answer))

    async def Tasks(self, request_iterator, context):
        """One job's tasks and replies for the calling site, on one call for the job's life
        rather than two calls a round (issue 40: the calls, not the bytes, are the server's cost
        at 10,000 sites). The site sends {job_id}, then in turn:

        - {pull: wait_s}: answered as PullTask answers. A task whose payload is complete names
          its number of data frames (`frames`); one still arriving ends with {done}.
        - {reply: {task_id, headers}}, the reply's data, then {sent: true}: answered by
          {ack: ...} as PushReply answers. {sent: true, pull: wait_s} asks for the next task
          too, which then follows the ack (a message less each way and round). A reply whose
          size the site knows (a worker's handoff file) says so instead, {reply: ..., bytes:
          n, pull: wait_s}, and its data ends after n bytes, with no {sent}.

        A site that opens with {job_id, compact: true} reads a round in one message: the ack
        and the next task's header in one, and a complete payload of at most INLINE_MAX bytes
        inside it ({bytes: n}, n the payload's size, and the payload inline, no data frames).
        It may then send a sized reply's payload inline the same way (`bytes` is then the
        payload's size, not its frames').
        """
        site = (await peer_identity_async(context, "site")).name
        stream = request_iterator.__aiter__()
        opener = await _first_header(context, stream)
        job_id, compact = opener.get("job_id"), opener.get("compact") is True
        await _checked_id(context, job_id)
        async for raw in stream:  # quiet while the site trains: TASKS_QUIET_S (app.py)
            head, inline = await _message(context, raw)
            ack: dict[str, Any] = {}
            if isinstance(head.get("reply"), dict):
                reply, size = head["reply"], head.get("bytes")
                if size is not None and (isinstance(size, bool) or not isinstance(size, int)
                                         or size < 0):
                    await context.abort(grpc.StatusCode.INVALID_ARGUMENT,
                                        "a reply's bytes must be a number of bytes")
                if inline is not None and size != len(inline):
                    await context.abort(grpc.StatusCode.INVALID_ARGUMENT,
                                        "an inline reply's bytes must be its payload's size")
                closing = {"pull": head["pull"]} if size is not None and "pull" in head else {}
                data = (_inline_frames(inline) if inline is not None
                        else _reply_data(stream, closing, size))
                answer = await self._take_reply(
                    context, site,
                    {"job_id": job_id, "task_id": reply.get("task_id"),
                     "headers": reply.get("headers")}, data)
                # Nothing of the reply stays referenced while the next task is awaited: a round
                # at 10,000 sites, and every site's last message otherwise held for it.
                raw = inline = data = reply = None
                if "pull" not in closing or not compact:
                    yield frames.header({"ack": answer})
                    if "pull" not in closing:
                        continue
                else:  # with the next task's header
                    ack = {"ack": answer}
                head = closing
            elif inline is not None:
                await context.abort(grpc.StatusCode.INVALID_ARGUMENT,
                                    "only a reply carries a payload inline")
            elif "pull" not in head:
                await context.abort(grpc.StatusCode.INVALID_ARGUMENT,
                                    "expected {pull: seconds} or {reply: {task_id, headers}}")
            task, entry = await self._next_task(context, site, job_id, head["pull"])
            spool = entry.spool if entry is not None else None
            payload = (spool.whole(site, frames.INLINE_MAX)
                       if compact and spool is not None else None)
            if payload is not None:
                yield _compact_task(entry, ack, task, payload)
            else:
                count = spool.frame_count if spool is not None else None
                yield frames.header({**ack, **task, **({} if count is None
                                                        else {"frames": count})})
                if entry is not None:
                    async for out in _spooled(context, entry, site):
                        yield out
                    if count is None:
                        yield frames.header({"done": True})
            if task.get("end"):
                return
            payload = out = None  # nor the task's bytes while the site trains on it

    async def _next_task(self, context, site: str, job_id: str, wait_s: Any
                         ) -> tuple[dict[str, Any], TaskEntry | None]:
        """The header of the site's next task and the task; or {end} or {none} (after wait_s,
        at most 30 s) and None."""
        live = self.jobs.running_at(job_id, site)
        if live is None:
            return {"end": True}, None
        if isinstance(wait_s, bool) or not isinstance(wait_s, int | float) \
                or not math.isfinite(wait_s):
            wait_s = 0.0
        try:
            entry = await live.relay.wait_task(site, min(max(wait_s, 0.0), 30.0))
        except RelayError as exc:
            await context.abort(grpc.StatusCode.FAILED_PRECONDITION, str(exc))
        if entry is END:
            return {"end": True}, None
        if entry is None:
            return {"none": True}, None
        return {"task_id": entry.task_id, "topic": entry.topic, "headers": entry.headers}, entry

    async def _take_reply(self, context, site: str, head: dict[str, Any],
                          data: AsyncIterator[bytes]) -> dict[str, Any]:
        """One reply of the site's: head {job_id, task_id, headers}, then its data frames."""
        job_id, headers = head.get("job_id"), head.get("headers") or {}
        await _checked_id(context, job_id)
        await _checked_id(context, head.get("task_id"), check_task_id, "task_id")
        if not isinstance(headers, dict):
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT,
                                "the reply's headers must be a JSON object")
        live = await _mapped(context, _now(site_ops.running, self.jobs, job_id, site))
        if live.relay.stale(head["task_id"]):  # to the run a server restart interrupted:
            async for _ in data:  # read and dropped; the site gets the task again
                pass
            return {"stale": True}
        try:
            reply = live.relay.open_reply(site, head["task_id"], headers)
        except RelayError as exc:
            await context.abort(grpc.StatusCode.FAILED_PRECONDITION, str(exc))
        try:
            async for raw in data:
                reply.append(frames.data_only(raw))
        except frames.FrameError as exc:
            reply.abandon()
            await context.abort(grpc.StatusCode.FAILED_PRECONDITION, str(exc))
        except BaseException:  # the site went away mid-reply: it may send it again
            reply.abandon()
            raise
        reply.commit()
        return {}

    async def Report(self, request, context):
        site = (await peer_identity_async(context, "site")).name
        body = await _mapped(context, _now(SiteReport.parse, request.body))
        await _mapped(context, asyncio.get_running_loop().run_in_executor(
            None, site_ops.report, self.store, self.jobs, site, body))
        return msg.Json(body="{}")


APP_SHARED_MAX = 1 << 20


@functools.lru_cache(maxsize=8)
def _shared_app(path: Path, stamp: tuple[int, int, int]) -> tuple[bytes, ...]:
    return (frames.header({"size": stamp[2]}), *frames.file_frames(path))


def _app_frames(path: Path) -> Iterable[bytes]:
    """A job's app as FetchJob sends it: its size, then its data frames. A small app's frames
    are read once and shared by every site's fetch (10,000 sites fetch it in the same second:
    one read, not 10,000 open files); a larger one is read from its file for each."""
    info = path.stat()
    if info.st_size > APP_SHARED_MAX:
        return itertools.chain([frames.header({"size": info.st_size})],
                               frames.file_frames(path))
    return _shared_app(path, (info.st_ino, info.st_mtime_ns, info.st_size))


def _compact_task(entry: TaskEntry, ack: dict[str, Any], task: dict[str, Any],
                  payload: bytes) -> bytes:
    """A task in one message, with the ack before it. Every site that gets the same ack (in a
    plain round, all of them) gets the same bytes: gRPC holds a stream's last message until the
    next, so while 10,000 sites train the server holds one, not 10,000 (issue 40)."""
    built = entry.compact
    if built is not None and built[0] == ack:
        return built[1]
    message = frames.header({**ack, **task, "bytes": len(payload)}, payload)
    entry.compact = (ack, message)
    return message


async def _spooled(context, entry, site: str) -> AsyncIterator[bytes]:
    """A task's data frames from its spool, as the site reads them."""
    try:
        async for raw in entry.spool.aread(site):
            yield raw
    except SpoolError as exc:
        await context.abort(grpc.StatusCode.ABORTED, f"task {entry.task_id} broke off: {exc}")


async def _reply_data(stream: AsyncIterator[bytes], closing: dict[str, Any],
                      size: int | None = None) -> AsyncIterator[bytes]:
    """A reply's data frames on a Tasks call: `size` bytes of them, or else up to its {sent:
    true} (kept in `closing`, with the pull it may ask for). Each comes within the read
    deadline of a stream's next message, whatever the call's quiet deadline between tasks."""
    got = 0
    while size is None or got < size:
        try:
            async with asyncio.timeout(REPLY_FRAME_S):
                raw = await stream.__anext__()
        except StopAsyncIteration:
            expected = "{sent: true}" if size is None else f"{size} bytes"
            raise frames.FrameError(f"the call ended inside a reply: expected {expected}") \
                from None
        except TimeoutError:
            raise Stalled(f"the server received nothing for {REPLY_FRAME_S:g} s inside a "
                          "reply; send it without pausing") from None
        if frames.is_data(raw):
            got += len(raw)
            if size is not None and got > size:
                raise frames.FrameError(f"the reply's data is longer than its {size} bytes")
            yield raw
            continue
        if size is not None:
            raise frames.FrameError("a header inside a reply's bytes")
        head = frames.read_header(raw)
        if head.get("sent") is not True or not set(head) <= {"sent", "pull"}:
            raise frames.FrameError("a reply's data must end with {sent: true}")
        closing.update(head)
        return


async def _inline_frames(payload: memoryview) -> AsyncIterator[bytes]:
    """A reply's inline payload as the data frame a relay keeps."""
    if payload:
        yield frames.data(payload)


async def _first_header(context, stream: AsyncIterator[bytes]) -> dict[str, Any]:
    try:
        raw = await stream.__anext__()
    except StopAsyncIteration:
        await context.abort(grpc.StatusCode.INVALID_ARGUMENT,
                            "empty stream: expected a header frame")
    return await _header(context, raw)


async def _message(context, raw: bytes) -> tuple[dict[str, Any], memoryview | None]:
    """raw's header and inline payload (frames.read_message), or INVALID_ARGUMENT."""
    try:
        return frames.read_message(raw)
    except frames.FrameError as exc:
        await context.abort(grpc.StatusCode.INVALID_ARGUMENT, str(exc))


async def _header(context, raw: bytes) -> dict[str, Any]:
    """raw's header (a JSON object), or INVALID_ARGUMENT."""
    try:
        return frames.read_header(raw)
    except frames.FrameError as exc:
        await context.abort(grpc.StatusCode.INVALID_ARGUMENT, str(exc))


async def _now(call: Callable[..., Any], *args: Any) -> Any:
    """A plain call as an awaitable, for `_mapped`."""
    return call(*args)


async def _mapped(context, work: Awaitable[Any]) -> Any:
    """``work``'s result; what a handler raises, as its status code (site_ops.py)."""
    try:
        return await work
    except site_ops.NotRunning as exc:
        await context.abort(grpc.StatusCode.NOT_FOUND, str(exc))
    except ValueError as exc:  # a body or an id out of its grammar (wire/bodies.py)
        await context.abort(grpc.StatusCode.INVALID_ARGUMENT, str(exc))


async def _checked_id(context, value: Any, check: Callable[..., str] = check_job_id,
                      field: str = "job_id") -> None:
    """A site's id of its grammar, else INVALID_ARGUMENT naming it (spec/names.py)."""
    try:
        check(value, field)
    except IdentifierError as exc:
        await context.abort(grpc.StatusCode.INVALID_ARGUMENT, str(exc))
