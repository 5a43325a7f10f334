"""The relay as the server's event loop uses it: PullTask waits as a task, not a thread, while
the workflow's side writes from threads; replies arrive frame by frame."""

from __future__ import annotations

import asyncio
import threading
import time

import pytest

from atoll.server.relay import END, JobRelay, RelayError
from atoll.server.spool import Budget, SpillFiles, Spool, SpoolError
from atoll.wire import frames


def _relay(tmp_path, sites, budget=1 << 20):
    return JobRelay("j", tmp_path, sites, Budget(budget))


async def _collect(spool, reader):
    return [raw async for raw in spool.aread(reader)]


def test_waiting_tasks_are_woken_by_a_task_written_from_a_thread(tmp_path):
    relay = _relay(tmp_path, ["a", "b"])
    parts = [frames.data(bytes([i]) * 1000) for i in range(5)]

    async def main():
        waiting = [asyncio.create_task(relay.wait_task(s, 5)) for s in ("a", "b")]
        await asyncio.sleep(0.05)  # both are waiting before the workflow sends
        writer = threading.Thread(target=relay.add_task, args=(["a", "b"], "train", {}, parts))
        writer.start()
        entries = await asyncio.gather(*waiting)
        got = await asyncio.gather(*(_collect(e.spool, s) for e, s in zip(entries, "ab", strict=True)))
        writer.join(5)
        return entries, got

    entries, got = asyncio.run(main())
    assert [e.topic for e in entries] == ["train", "train"]
    assert got == [parts, parts]
    assert relay.budget.used == 0  # every reader took every frame: memory given back


def test_a_wait_with_nothing_to_do_times_out_and_the_end_wakes_it(tmp_path):
    relay = _relay(tmp_path, ["a"])

    async def main():
        started = time.monotonic()
        nothing = await relay.wait_task("a", 0.1)
        waited = time.monotonic() - started
        ender = asyncio.get_running_loop().call_later(0.05, relay.end)
        ended = await relay.wait_task("a", 30)
        ender.cancel()
        return nothing, waited, ended

    nothing, waited, ended = asyncio.run(main())
    assert nothing is None and waited >= 0.1
    assert ended is END
    with pytest.raises(RelayError, match="not a site of job j"):
        asyncio.run(relay.wait_task("stranger", 0))


def test_a_live_reader_on_the_loop_sees_a_writer_thread_fail(tmp_path):
    spool = Spool(SpillFiles(tmp_path), ["a"], Budget(1 << 20), live=True)

    def write():
        spool.append(frames.data(b"first"))
        time.sleep(0.05)
        spool.fail("the workflow crashed")

    async def main():
        got = []
        threading.Thread(target=write).start()
        with pytest.raises(SpoolError, match="the workflow crashed"):
            async for raw in spool.aread("a"):
                got.append(raw)
        return got

    assert asyncio.run(main()) == [frames.data(b"first")]


def test_a_reply_reaches_the_workflow_only_when_committed_and_an_abandoned_one_may_come_again(
        tmp_path):
    relay = _relay(tmp_path, ["a"], budget=1024)  # small: most of the reply spills
    task_id = relay.add_task(["a"], "train", {}, [frames.data(b"x")])
    list(asyncio.run(relay.wait_task("a", 1)).spool.read("a"))
    half = relay.open_reply("a", task_id, {})
    half.append(frames.data(b"y" * 4000))
    assert relay.next_reply(task_id, 0.05) is None  # half a reply is not a reply
    with pytest.raises(RelayError, match="already replied"):
        relay.open_reply("a", task_id, {})
    half.abandon()  # the site went away mid-upload
    whole = relay.open_reply("a", task_id, {"n": 2})
    parts = [frames.data(b"z" * 4000) for _ in range(3)]
    for raw in parts:
        whole.append(raw)
    whole.commit()
    reply = relay.next_reply(task_id, 1)
    assert reply.headers == {"n": 2}
    assert list(reply.spool.read("workflow")) == parts
    assert relay.budget.used == 0


def test_a_reply_over_the_payload_limit_is_refused_and_taken_back(tmp_path):
    relay = JobRelay("j", tmp_path, ["a"], Budget(1 << 20), max_payload=100)
    task_id = relay.add_task(["a"], "train", {}, [frames.data(b"x")])
    reply = relay.open_reply("a", task_id, {})
    with pytest.raises(frames.FrameError, match="larger than the limit of 100 bytes"):
        reply.append(frames.data(b"y" * 200))
    reply.abandon()
    assert relay.open_reply("a", task_id, {}) is not None  # the site may try again
