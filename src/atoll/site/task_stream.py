"""One job's tasks and replies on one long-lived call to the server (`Federation.Tasks`).

A site parent relayed each of its worker's pulls and replies as a call of its own: two calls a
round. At 10,000 sites it is the calls, not the bytes, that cost the server (issue 40), so a
job's pulls and replies share one call, opened at the first pull and closed when the job ends
here. The frames a pull yields and a reply sends are those of `PullTask` and `PushReply`: the
site checks them the same way (site/worker_backend.py).

A reply asks for the next task as it ends (`{sent: true, pull: seconds}`), or in its header
with its size where that is known (a worker's handoff file: `{reply, bytes, pull}`, and no
`{sent}`); a task whose payload the server holds whole names its number of frames. A round is
then two or three messages each way, not four.

The site opens the call as `compact`: the server may then answer a reply with the ack and the
next task in one message, and send a small complete payload (at most frames.INLINE_MAX) inside
its header's message. Once the server has done either on a call, a sized reply of that size
goes inline too: a small model's round is one message each way. What the stream yields and
takes stays in the PullTask/PushReply shapes, so the site's checks are the same.

The stream serves one operation at a time. A second that comes while one holds it (a worker
that pulls on one thread and replies on another) goes as a call of its own, as before. An
operation that breaks off leaves the stream in an unknown place, so it is dropped; the next
operation opens a new one.
"""

from __future__ import annotations

import json
import queue
import threading
from collections.abc import Iterable, Iterator
from typing import Any, Protocol

from atoll.wire import frames
from atoll.wire import messages as msg

OUTBOX = 4  # frames queued for gRPC to send: a reply streams through, never held whole
PUT_POLL_S = 1.0  # how often a sender blocked on a full outbox looks whether the call ended
DEFAULT_WAIT_S = 5.0  # a reply's pull for the next task, before the worker's first pull


class TaskCalls(Protocol):
    """The server's calls for a job's tasks (the parent's Federation stub)."""

    def Tasks(self, request_iterator: Iterator[bytes]) -> Any: ...

    def PullTask(self, request: Any, timeout: float | None = None) -> Iterator[bytes]: ...

    def PushReply(self, request_iterator: Iterator[bytes]) -> Any: ...


class TaskStream:
    def __init__(self, server: TaskCalls, job_id: str):
        self.server, self.job_id = server, job_id
        self._lock = threading.Lock()  # held by the one operation on the stream
        self._call: Any = None
        self._out: queue.Queue[bytes | None] | None = None
        self._ahead = False  # the last reply asked for the next task; no pull has read it yet
        self._wait = DEFAULT_WAIT_S  # the wait of the worker's last pull
        self._compact = False  # the server sent a compact answer on this call: it reads them
        self._next_task: tuple[dict[str, Any], memoryview | None] | None = None  # with an ack

    def pull(self, wait_s: float) -> Iterator[bytes]:
        """The job's next task as PullTask streams it: its header and data frames, or a lone
        {end} or {none} header. gRPC errors and FrameError as they come."""
        if not self._lock.acquire(blocking=False):
            yield from self.server.PullTask(msg.PullRequest(job_id=self.job_id, wait_s=wait_s),
                                            timeout=wait_s + 600)
            return
        whole = False
        try:
            self._open()
            if not self._ahead:  # else the last reply asked for it already
                self._send(frames.header({"pull": wait_s}))
            self._ahead, self._wait = False, wait_s
            if self._next_task is not None:  # it came with the last reply's ack
                (head, inline), self._next_task = self._next_task, None
            else:
                head, inline = self._message()
            yield frames.header(head)
            if inline is not None:
                if "task_id" not in head or head.get("bytes") != len(inline):
                    raise frames.FrameError("the server's inline payload is not a task's, "
                                            "or not of the size it names")
                if inline:
                    yield frames.data(inline)
            elif "task_id" in head:
                yield from self._task_data(head.get("frames"))
            whole = "end" not in head  # the server ends the call after {end}
        finally:
            if not whole:
                self._drop()
            self._lock.release()

    def _task_data(self, count: Any) -> Iterator[bytes]:
        """A task's data frames: as many as its header says, else up to {done}."""
        if count is None:
            while frames.is_data(raw := self._next()):
                yield raw
            if frames.read_header(raw) != {"done": True}:
                raise frames.FrameError("the server's task did not end with {done}")
            return
        if isinstance(count, bool) or not isinstance(count, int) or count < 0:
            raise frames.FrameError("the server's task names no number of frames")
        for _ in range(count):
            if not frames.is_data(raw := self._next()):
                raise frames.FrameError("the server's task has fewer frames than it said")
            yield raw

    def reply(self, head: dict[str, Any], data: Iterable[bytes],
              size: int | None = None) -> dict[str, Any]:
        """Send one reply (head: job_id, task_id, headers; then its data frames, `size` bytes
        of them where known); the server's answer, as PushReply's. On the stream it asks for
        the next task too, with the wait of the worker's last pull: the worker's next pull then
        only reads it."""
        if not self._lock.acquire(blocking=False):
            return _body(self.server.PushReply(_reply_frames(head, data)))
        if self._ahead:  # a reply before the next pull: the server answers that pull first
            self._lock.release()
            return _body(self.server.PushReply(_reply_frames(head, data)))
        whole = False
        try:
            self._open()
            reply = {"task_id": head["task_id"], "headers": head["headers"]}
            sized = {"bytes": size, "pull": self._wait} if size is not None else {}
            if self._compact and size is not None and size <= frames.INLINE_MAX:
                # inline, `bytes` is the payload's size; else its frames' (a handoff file's)
                payload = b"".join(frames.data_view(raw) for raw in data)
                self._send(frames.header({"reply": reply, **sized, "bytes": len(payload)},
                                         payload))
            else:
                self._send(frames.header({"reply": reply, **sized}))
                for raw in data:
                    self._send(raw)
            if size is None:  # the end of the data, and the next task asked for
                self._send(frames.header({"sent": True, "pull": self._wait}))
            self._ahead = True
            answer, inline = self._message()
            ack = answer.pop("ack", None)
            if not isinstance(ack, dict):
                raise frames.FrameError("the server did not acknowledge the reply")
            if answer:  # the next task's header came with it
                self._next_task, self._compact = (answer, inline), True
            elif inline is not None:
                raise frames.FrameError("the server's ack carries a payload")
            whole = True
            return ack
        finally:
            if not whole:
                self._drop()
            self._lock.release()

    def close(self) -> None:
        """The job ended here: end the call (from any thread; an operation waiting on it gets
        CANCELLED)."""
        self._drop()

    def _open(self) -> None:
        if self._call is not None and not self._call.done():
            return
        self._drop()
        out: queue.Queue[bytes | None] = queue.Queue(maxsize=OUTBOX)
        out.put(frames.header({"job_id": self.job_id, "compact": True}))
        self._out, self._call = out, self.server.Tasks(_drain(out))

    def _drop(self) -> None:
        call, out = self._call, self._out
        self._call = self._out = None
        self._ahead = self._compact = False
        self._next_task = None
        if call is not None:
            call.cancel()
        if out is not None:
            try:  # gRPC's sending thread, if it waits on an empty outbox, stops
                out.put_nowait(None)
            except queue.Full:  # it is not waiting, and sends no more of a cancelled call
                pass

    def _send(self, raw: bytes) -> None:
        call, out = self._call, self._out
        if call is None or out is None:
            raise frames.FrameError("the task stream was closed")
        while True:
            try:
                out.put(raw, timeout=PUT_POLL_S)
                return
            except queue.Full:
                if call.done():  # the call ended: no one sends the outbox any more
                    raise call from None  # (a gRPC call is its own RpcError)

    def _message(self) -> tuple[dict[str, Any], memoryview | None]:
        """The server's next header and the payload inline in its message, if any."""
        head, inline = frames.read_message(self._next())
        if inline is not None:
            self._compact = True
        return head, inline

    def _next(self) -> bytes:
        if self._call is None:
            raise frames.FrameError("the task stream was closed")
        try:
            return next(self._call)
        except StopIteration:
            raise frames.FrameError("the server ended the task stream") from None


def _drain(out: queue.Queue[bytes | None]) -> Iterator[bytes]:
    while (raw := out.get()) is not None:
        yield raw


def _reply_frames(head: dict[str, Any], data: Iterable[bytes]) -> Iterator[bytes]:
    yield frames.header(head)
    yield from data


def _body(answer: Any) -> dict[str, Any]:
    return json.loads(answer.body or "{}")
