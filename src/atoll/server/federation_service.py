"""The Federation service: what site parents call, over mutual TLS, as themselves.

It is served on the server's event loop (wire/aio_server.py). The calls every connected site
keeps open (its control stream and its task long-poll), its fetch of the job and each reply are
`async`: they wait as tasks, not threads. What blocks (SQLite, building a zip) goes to the
loop's executor.

Every call is admitted before its request is read (`admit`: a site certificate within its
limits, server/auth.py), and every read of a site's stream has a deadline (wire/guard.py). What
a site sends is checked as it is used: a malformed message is answered INVALID_ARGUMENT, never
with a traceback. Every job and task id a site names is of its grammar (spec/names.py) before
it is looked up, stored or logged.
"""

from __future__ import annotations

import asyncio
import json
import logging
import math
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

import grpc

from atoll import __version__
from atoll.server.auth import Gate, peer_identity_async
from atoll.server.relay import END, RelayError
from atoll.server.site_links import HEARTBEAT_S, SiteLink, SiteLinks
from atoll.server.spool import SpoolError
from atoll.spec.names import IdentifierError, check_job_id, check_task_id
from atoll.spec.quantity import is_memory
from atoll.spec.versions import version_refusal
from atoll.wire import frames
from atoll.wire import messages as msg
from atoll.wire.guard import Stalled

if TYPE_CHECKING:
    from atoll.server.jobs import LiveJob
    from atoll.server.store import Store

log = logging.getLogger("atoll.server.federation")


class SiteJobs(Protocol):
    """What the sites' calls do to the jobs (server/jobs.py)."""

    def running_at(self, job_id: str, site: str) -> LiveJob | None: ...

    def app_zip(self, job_id: str, target: str) -> Path: ...

    def site_state(self, site: str, body: dict[str, Any]) -> None: ...

    def site_offline(self, site: str) -> None: ...


class SiteRegistry(Protocol):
    """The sites the server has seen, by org (server/studies.py)."""

    def remember_site(self, name: str, org: str) -> None: ...


class RevocationPush(Protocol):
    """The project's revocation list, sent to a site after its welcome (server/revocation.py)."""

    def on_connect(self, link: SiteLink, context: Any) -> None: ...


def _object(text: str, what: str) -> dict[str, Any]:
    """A JSON object a site sent; ValueError (with what it was) otherwise."""
    try:
        value = json.loads(text or "{}")
    except (ValueError, RecursionError):
        raise ValueError(f"{what} is not JSON") from None
    if not isinstance(value, dict):
        raise ValueError(f"{what} must be a JSON object")
    return value


MAX_RUNNING = 10_000  # job ids one hello or heartbeat may list


def _job_ids(value: Any, what: str) -> list[str]:
    if not isinstance(value, list) or len(value) > MAX_RUNNING:
        raise ValueError(f"{what}'s running_jobs must be a list of at most {MAX_RUNNING:,} "
                         "job ids")
    return [check_job_id(j, f"{what}'s running_jobs entry") for j in value]


def _job_state(text: str) -> dict[str, Any]:
    """A site's job state: its job id of the grammar, its state a short text."""
    body = _object(text, "job_state")
    check_job_id(body.get("job_id"), "job_state's job_id")
    state = body.get("state")
    if not isinstance(state, str) or not 0 < len(state) <= 64:
        raise ValueError("job_state's state must be a state name")
    return body


def _hello(text: str) -> dict[str, Any]:
    """A site's hello, checked where the server relies on it: its capacity goes to the
    scheduler, which must never meet a value it cannot compare."""
    hello = _object(text, "hello")
    _job_ids(hello.get("running_jobs", []), "hello")
    capacity = hello.get("capacity") or {}
    if not isinstance(capacity, dict):
        raise ValueError("hello's capacity must be a JSON object")
    for key in ("gpus", "cpus"):
        value = capacity.get(key)
        if value is not None and (not isinstance(value, int) or isinstance(value, bool)
                                  or value < 0):
            raise ValueError(f"hello's capacity.{key} must be a whole number of at least 0")
    if capacity.get("memory") is not None and not is_memory(capacity["memory"]):
        raise ValueError("hello's capacity.memory must be a size such as 512Gi")
    if not isinstance(hello.get("launcher", ""), str | None):
        raise ValueError("hello's launcher must be a name")
    return hello


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

    def _running(self, job_id: str, site: str) -> LiveJob | None:
        return self.jobs.running_at(job_id, site)

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
            hello = _hello(first.hello)
        except ValueError as exc:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, str(exc))
        if why := version_refusal(hello.get("version"), __version__):  # spec/versions.py
            log.warning("refused site %s: %s", who.name, why)
            await context.abort(grpc.StatusCode.FAILED_PRECONDITION, why)
        loop = asyncio.get_running_loop()
        link = SiteLink(who.name, who.org, hello, loop)
        await loop.run_in_executor(None, self.studies.remember_site, who.name, who.org)
        self.links.attach(link)
        self.revocations.on_connect(link, context)  # the CRL follows the welcome
        log.info("site %s connected (%s)", who.name, link.hello.get("launcher", "?"))
        reader = asyncio.create_task(self._read(link, events), name=f"site-{who.name}")
        try:
            yield msg.ServerCommand(welcome=json.dumps({"heartbeat_s": HEARTBEAT_S,
                                                       "server_time": time.time()}))
            for job_id in link.running_jobs:  # reconcile after a reconnect
                if self._running(job_id, who.name) is None:
                    link.send("abort", {"job_id": job_id,
                                        "reason": "the server no longer runs this job"})
            self.wake()
            while (command := await link.outbox.get()) is not None:
                yield command
        finally:
            reader.cancel()
            # (a server that is stopping has stopped its jobs and closes its store)
            if self.links.detach(link) and not self.stopping():
                log.info("site %s disconnected", who.name)
                loop.run_in_executor(None, self._offline, who.name)

    def _offline(self, site: str) -> None:
        try:
            self.jobs.site_offline(site)
        except Exception:  # noqa: BLE001 - nobody awaits this; say what went wrong
            log.exception("could not mark the jobs of %s as failed", site)

    async def _read(self, link: SiteLink, events) -> None:
        loop = asyncio.get_running_loop()
        try:
            async for event in events:
                link.last_seen = time.monotonic()
                kind = event.WhichOneof("kind")
                if kind == "heartbeat":
                    running = _object(event.heartbeat, "heartbeat").get("running_jobs", [])
                    link.hello["running_jobs"] = _job_ids(running, "heartbeat")
                elif kind == "job_state":
                    # one site's states stay in order: the next waits for this one
                    await loop.run_in_executor(None, self.jobs.site_state, link.name,
                                               _job_state(event.job_state))
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
        if self._running(request.job_id, site) is None:
            await context.abort(grpc.StatusCode.NOT_FOUND,
                                f"job {request.job_id} is not running at {site}")
        loop = asyncio.get_running_loop()
        # the first fetch builds the zip; the rest find it (a page-cache read, chunk by chunk)
        path = await loop.run_in_executor(None, self.jobs.app_zip, request.job_id, site)
        yield frames.header({"size": path.stat().st_size})
        for raw in frames.file_frames(path):
            yield raw

    async def PullTask(self, request, context):
        site = (await peer_identity_async(context, "site")).name
        await _checked_id(context, request.job_id)
        live = self._running(request.job_id, site)
        if live is None:
            yield frames.header({"end": True})
            return
        wait_s = request.wait_s if math.isfinite(request.wait_s) else 0.0
        try:
            entry = await live.relay.wait_task(site, min(max(wait_s, 0.0), 30.0))
        except RelayError as exc:
            await context.abort(grpc.StatusCode.FAILED_PRECONDITION, str(exc))
        if entry is END:
            yield frames.header({"end": True})
            return
        if entry is None:
            yield frames.header({"none": True})
            return
        yield frames.header({"task_id": entry.task_id, "topic": entry.topic,
                             "headers": entry.headers})
        try:
            async for raw in entry.spool.aread(site):
                yield raw
        except SpoolError as exc:
            await context.abort(grpc.StatusCode.ABORTED, f"task {entry.task_id} broke off: {exc}")

    async def PushReply(self, request_iterator, context):
        site = (await peer_identity_async(context, "site")).name
        stream = request_iterator.__aiter__()
        try:
            head = frames.read_header(await stream.__anext__())
        except StopAsyncIteration:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT,
                                "empty stream: expected a header frame")
        except frames.FrameError as exc:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, str(exc))
        job_id, headers = head.get("job_id"), head.get("headers") or {}
        await _checked_id(context, job_id)
        await _checked_id(context, head.get("task_id"), check_task_id, "task_id")
        if not isinstance(headers, dict):
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT,
                                "the reply's headers must be a JSON object")
        live = self._running(job_id, site)
        if live is None:
            await context.abort(grpc.StatusCode.NOT_FOUND, f"job {job_id} is not running at {site}")
        try:
            reply = live.relay.open_reply(site, head["task_id"], headers)
        except RelayError as exc:
            await context.abort(grpc.StatusCode.FAILED_PRECONDITION, str(exc))
        try:
            async for raw in stream:
                reply.append(frames.data_only(raw))
        except frames.FrameError as exc:
            reply.abandon()
            await context.abort(grpc.StatusCode.FAILED_PRECONDITION, str(exc))
        except BaseException:  # the site went away mid-reply: it may send it again
            reply.abandon()
            raise
        reply.commit()
        return msg.Json(body="{}")

    async def Report(self, request, context):
        site = (await peer_identity_async(context, "site")).name
        try:
            body = _object(request.body, "the report")
            event = body.get("event") or {}
            if not isinstance(event, dict):
                raise ValueError("the report's event must be a JSON object")
        except ValueError as exc:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, str(exc))
        job_id = body.get("job_id")
        await _checked_id(context, job_id)
        if self._running(job_id, site) is None:
            await context.abort(grpc.StatusCode.NOT_FOUND, f"job {job_id} is not running at {site}")
        await asyncio.get_running_loop().run_in_executor(
            None, self.store.add_event, job_id, site, event)
        return msg.Json(body="{}")


async def _checked_id(context, value: Any, check: Callable[..., str] = check_job_id,
                      field: str = "job_id") -> None:
    """A site's id of its grammar, else INVALID_ARGUMENT naming it (spec/names.py)."""
    try:
        check(value, field)
    except IdentifierError as exc:
        await context.abort(grpc.StatusCode.INVALID_ARGUMENT, str(exc))
