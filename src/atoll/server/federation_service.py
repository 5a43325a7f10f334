"""The Federation service: what site parents call, over mutual TLS, as themselves."""

from __future__ import annotations

import json
import logging
import queue
import threading
import time

import grpc

from atoll.server.auth import peer_identity
from atoll.server.relay import END, RelayError
from atoll.server.site_links import HEARTBEAT_S, SiteLink
from atoll.server.spool import SpoolError
from atoll.wire import atoll_pb2 as pb
from atoll.wire import frames

log = logging.getLogger("atoll.server.federation")


class FederationService:
    def __init__(self, parent):
        self.parent = parent

    def _site(self, context) -> str:
        return peer_identity(context, "site").name

    def _live(self, context, job_id: str, site: str):
        live = self.parent.jobs.live.get(job_id)
        if live is None or site not in live.sites:
            context.abort(grpc.StatusCode.NOT_FOUND, f"job {job_id} is not running at {site}")
        return live

    def Connect(self, request_iterator, context):
        who = peer_identity(context, "site")
        try:
            first = next(request_iterator)
        except StopIteration:
            return
        if first.WhichOneof("kind") != "hello":
            context.abort(grpc.StatusCode.INVALID_ARGUMENT, "a site must start with hello")
        link = SiteLink(who.name, who.org, json.loads(first.hello))
        self.parent.studies.remember_site(who.name, who.org)
        self.parent.links.attach(link)
        log.info("site %s connected (%s)", who.name, link.hello.get("launcher", "?"))
        reader = threading.Thread(target=self._read, args=(link, request_iterator), daemon=True,
                                  name=f"site-{who.name}")
        reader.start()
        try:
            yield pb.ServerCommand(welcome=json.dumps({"heartbeat_s": HEARTBEAT_S,
                                                       "server_time": time.time()}))
            for job_id in link.running_jobs:  # reconcile after a reconnect
                live = self.parent.jobs.live.get(job_id)
                if live is None or who.name not in live.sites:
                    link.send("abort", {"job_id": job_id,
                                        "reason": "the server no longer runs this job"})
            self.parent.scheduler.wake()
            while not link.closed.is_set() and context.is_active():
                try:
                    command = link.outbox.get(timeout=1.0)
                except queue.Empty:
                    continue
                if command is None:
                    break
                yield command
        finally:
            if self.parent.links.detach(link):
                log.info("site %s disconnected", who.name)
                self.parent.jobs.site_offline(who.name)

    def _read(self, link: SiteLink, events) -> None:
        try:
            for event in events:
                link.last_seen = time.monotonic()
                kind = event.WhichOneof("kind")
                if kind == "heartbeat":
                    link.hello["running_jobs"] = json.loads(event.heartbeat).get("running_jobs", [])
                elif kind == "job_state":
                    self.parent.jobs.site_state(link.name, json.loads(event.job_state))
        except grpc.RpcError:
            pass
        except Exception:  # noqa: BLE001
            log.exception("bad event from site %s", link.name)
        finally:
            link.close()

    def FetchJob(self, request, context):
        site = self._site(context)
        self._live(context, request.job_id, site)
        path = self.parent.jobs.app_zip(request.job_id, site)
        yield frames.header({"size": path.stat().st_size})
        yield from frames.file_frames(path)

    def PullTask(self, request, context):
        site = self._site(context)
        live = self.parent.jobs.live.get(request.job_id)
        if live is None or site not in live.sites:
            yield frames.header({"end": True})
            return
        try:
            entry = live.relay.next_task(site, min(max(request.wait_s, 0.0), 30.0))
        except RelayError as exc:
            context.abort(grpc.StatusCode.FAILED_PRECONDITION, str(exc))
        if entry is END:
            yield frames.header({"end": True})
            return
        if entry is None:
            yield frames.header({"none": True})
            return
        yield frames.header({"task_id": entry.task_id, "topic": entry.topic,
                             "headers": entry.headers})
        try:
            yield from entry.spool.read(site)
        except SpoolError as exc:
            context.abort(grpc.StatusCode.ABORTED, f"task {entry.task_id} broke off: {exc}")

    def PushReply(self, request_iterator, context):
        site = self._site(context)
        try:
            head, chunks = frames.split(request_iterator)
        except frames.FrameError as exc:
            context.abort(grpc.StatusCode.INVALID_ARGUMENT, str(exc))
        live = self._live(context, str(head.get("job_id")), site)
        try:
            live.relay.add_reply(site, str(head.get("task_id")), dict(head.get("headers") or {}),
                                 chunks.frames())
        except (RelayError, frames.FrameError) as exc:
            context.abort(grpc.StatusCode.FAILED_PRECONDITION, str(exc))
        return pb.Json(body="{}")

    def Report(self, request, context):
        site = self._site(context)
        body = json.loads(request.body or "{}")
        self._live(context, str(body.get("job_id")), site)
        self.parent.store.add_event(str(body["job_id"]), site, dict(body.get("event") or {}))
        return pb.Json(body="{}")
