"""ServerChannel and SiteChannel over the WorkerLink to the worker's own parent."""

from __future__ import annotations

import json
import time
from collections.abc import Iterable, Iterator, Sequence
from pathlib import Path
from typing import Any

import grpc

from atoll.fl.channels import Chunk, Reply, Task
from atoll.spec.errors import EXIT_FAILED, AtollError
from atoll.spec.names import check_round, check_task_id, check_task_name
from atoll.wire import frames
from atoll.wire import messages as msg
from atoll.wire.handoff import KEY, HandoffDir
from atoll.wire.worker_link import HANDOFF_KEY, MANY_REPLIES_KEY

POLL_S = 5.0  # long-poll slice: short enough to notice a dead parent, long enough to be idle


class _Link:
    def __init__(self, stub, session: str, job_id: str):
        self.stub = stub
        self.job_id = job_id
        self.metadata = (("x-atoll-worker", session),)

    def report(self, event: dict[str, Any]) -> None:
        self.stub.Report(msg.Json(body=json.dumps(event)), metadata=self.metadata)


class CheckpointHomeError(AtollError):
    """A checkpoint that goes home to the parent (the run folder goes with the worker) did not
    go, or came back damaged."""

    exit_code = EXIT_FAILED


class GrpcServerChannel(_Link):
    def __init__(self, stub, session: str, job_id: str, sites: list[str], results_dir: Path,
                 handoff: HandoffDir | None = None, send_home: bool = False):
        super().__init__(stub, session, job_id)
        self.sites = list(sites)
        self.results_dir = results_dir
        # the workflow's checkpoints: beside its results in the run folder, not in the download
        self.checkpoint_dir: Path | None = Path(results_dir).parent / "checkpoint"
        self._expected: dict[str, int] = {}
        self.handoff = handoff  # payloads come and go as files in it (wire/handoff.py)
        # the run folder goes with the worker (a Pod): each checkpoint goes home to the parent
        # (wire/checkpoint_home.py), and a resumed worker fetches it from there
        self.send_home = send_home

    def checkpoint_committed(self, round_: int) -> None:
        """The workflow committed its checkpoint of ``round_`` (atoll.fl.checkpoint): where
        the run folder goes with the worker, send it home with the results so far before the
        workflow reports it, so that the server holds every round it says was committed."""
        if not self.send_home:
            return
        from atoll.wire.checkpoint_home import zip_checkpoint

        run_folder = Path(self.results_dir).parent
        archive = zip_checkpoint(run_folder, run_folder / "checkpoint-home.zip")
        try:
            self.stub.SendCheckpoint(frames.payload_frames({}, frames.file_chunks(archive)),
                                     metadata=self.metadata, timeout=3600)
        except grpc.RpcError as exc:
            raise CheckpointHomeError(f"the checkpoint of round {round_} could not be sent to the "
                                    f"server parent: {exc.details()}") from None
        finally:
            archive.unlink(missing_ok=True)

    def fetch_checkpoint(self) -> int:
        """After a server restart: the checkpoint (and the results so far) the parent kept,
        unpacked into the run folder; its round (0: the parent kept none)."""
        from atoll.wire.checkpoint_home import unpack_checkpoint
        from atoll.wire.job_archive import IntakeError

        stream = self.stub.FetchCheckpoint(msg.Json(body="{}"), metadata=self.metadata)
        head, chunks = frames.split(iter(stream))
        if head.get("none"):
            return 0
        try:
            return unpack_checkpoint(chunks, Path(self.results_dir).parent)
        except IntakeError as exc:
            raise CheckpointHomeError(f"cannot resume after the server restart: the checkpoint "
                                    f"the server parent kept is damaged: {exc}") from None

    def send(self, targets: Sequence[str], topic: str, headers: dict[str, Any],
             payload: Iterable[Chunk]) -> str:
        head = {"targets": list(targets), "topic": topic, "headers": headers}
        answer = _send(self.stub.SendTask, head, payload, self.handoff, self.metadata)
        task_id = json.loads(answer.body)["task_id"]
        self._expected[task_id] = len(targets)
        return task_id

    def replies(self, task_id: str, timeout: float | None = None) -> Iterator[Reply]:
        deadline = None if timeout is None else time.monotonic() + timeout
        left_to_get = self._expected.get(task_id, 0)
        metadata = self.metadata + (("x-atoll-task", task_id), (MANY_REPLIES_KEY, "1"))
        if self.handoff is not None:
            metadata += ((HANDOFF_KEY, "1"),)
        stream = None
        try:
            while left_to_get > 0:
                wait = POLL_S if deadline is None else min(POLL_S, deadline - time.monotonic())
                if wait <= 0:
                    return
                stream = self.stub.NextReply(msg.PullRequest(job_id=self.job_id, wait_s=wait),
                                             metadata=metadata)
                for head, chunks in frames.split_many(stream):
                    if head.get("none"):
                        break
                    left_to_get -= 1
                    if head.get("error"):
                        yield Reply(site=head["site"], error=head["error"],
                                    retry=head.get("retry") is True)
                    else:
                        if KEY in head and self.handoff is not None:
                            chunks = frames.Payload(self.handoff.read(head[KEY]))
                        yield Reply(site=head["site"], headers=head.get("headers", {}),
                                    chunks=iter(chunks))
                    if self.handoff is not None:  # the caller is done with the last reply
                        self.handoff.give_back()
        finally:
            if stream is not None:
                stream.cancel()  # a caller that stops early must not leave a call open
            if self.handoff is not None:
                self.handoff.give_back()


class GrpcSiteChannel(_Link):
    def __init__(self, stub, session: str, job_id: str, site: str,
                 handoff: HandoffDir | None = None):
        super().__init__(stub, session, job_id)
        self.site = site
        self.handoff = handoff  # payloads come and go as files in it (wire/handoff.py)

    def receive(self, timeout: float | None = None) -> Task | None:
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            wait = POLL_S if deadline is None else min(POLL_S, deadline - time.monotonic())
            if wait <= 0:
                raise TimeoutError(f"no task from the server within {timeout} s")
            metadata = self.metadata if self.handoff is None else (
                self.metadata + ((HANDOFF_KEY, "1"),))
            stream = self.stub.NextTask(msg.PullRequest(job_id=self.job_id, wait_s=wait),
                                        metadata=metadata)
            head, chunks = frames.split(iter(stream))
            if head.get("end"):
                return None
            if head.get("none"):
                continue
            if KEY in head and self.handoff is not None:
                chunks = frames.Payload(self.handoff.read(head[KEY]))
            headers = head.get("headers") or {}
            if not isinstance(headers, dict):
                raise frames.FrameError("the task's headers are not a JSON object")
            # The server's word, checked again where the job's code receives it.
            check_round(headers.get("round"), "the task's round", optional=True)
            return Task(task_id=check_task_id(head.get("task_id"), "the task's task_id"),
                        topic=check_task_name(head.get("topic"), "the task's topic"),
                        headers=headers, chunks=chunks)

    def reply(self, task_id: str, headers: dict[str, Any], payload: Iterable[Chunk]) -> None:
        head = {"task_id": task_id, "headers": headers}
        _send(self.stub.SendReply, head, payload, self.handoff, self.metadata)

    def spend_budget(self, kind: str, epsilon: float, delta: float) -> float:
        from atoll.fl.privacy.accounting import BudgetExhausted

        body = json.dumps({"kind": kind, "epsilon": epsilon, "delta": delta})
        try:
            answer = self.stub.SpendBudget(msg.Json(body=body), metadata=self.metadata)
        except grpc.RpcError as exc:
            # refused (the ledger's reason) or unanswered: either way nothing is released
            raise BudgetExhausted(exc.details() or f"the site's privacy ledger did not answer: "
                                  f"{exc.code()}") from None
        return float(json.loads(answer.body)["total_epsilon"])


def _send(call, head: dict[str, Any], payload: Iterable[Chunk], handoff: HandoffDir | None,
          metadata) -> Any:
    """One payload to the parent: its data in a handoff file when there is a folder, the
    header naming it; else header and data over the link."""
    if handoff is None:
        return call(frames.payload_frames(head, payload), metadata=metadata)
    handoff.give_back()  # what this worker read last is free to be filled now
    name = handoff.put(payload)
    try:
        return call(iter((frames.header({**head, KEY: name}),)), metadata=metadata)
    finally:
        handoff.discard(name)  # the parent took it, or it never will
