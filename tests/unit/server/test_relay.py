"""The server's relay of one job: tasks to sites, replies to the workflow, drop-outs, the end."""

from __future__ import annotations

import asyncio
import threading

from atoll.server.relay import END, JobRelay
from atoll.server.spool import Budget
from atoll.wire import frames


def _relay(tmp_path, sites):
    return JobRelay("j", tmp_path, sites, Budget(1 << 20))


def _frames(*parts):
    return [frames.data(p) for p in parts]


def _next_task(relay, site, wait_s):
    return asyncio.run(relay.wait_task(site, wait_s))


def _reply(relay, site, task_id, headers, frames_):
    reply = relay.open_reply(site, task_id, headers)
    for raw in frames_:
        reply.append(raw)
    reply.commit()


def _read(spool, reader):
    return b"".join(bytes(chunk) for chunk in frames.Payload(spool.read(reader)))


def test_a_task_reaches_each_target_and_replies_reach_the_workflow(tmp_path):
    relay = _relay(tmp_path, ["a", "b", "c"])
    task_id = relay.add_task(["a", "b"], "train", {"round": 0}, _frames(b"pay", b"load"))
    for site in ("a", "b"):
        entry = _next_task(relay, site, 1)
        got = _read(entry.spool, site)
        assert (entry.task_id, entry.topic, got) == (task_id, "train", b"payload")
    assert _next_task(relay, "c", 0.05) is None  # not a target: nothing for it
    assert relay.budget.used == 0  # read by every target: the payload's memory is back
    _reply(relay, "b", task_id, {"n": 1}, _frames(b"B"))
    reply = relay.next_reply(task_id, 1)
    assert (reply.site, reply.headers, _read(reply.spool, "workflow")) == ("b", {"n": 1}, b"B")
    assert relay.budget.used == 0


def test_a_waiting_site_is_woken_by_its_task_only(tmp_path):
    relay = _relay(tmp_path, ["a", "b"])
    got = {}

    def wait(site):
        got[site] = _next_task(relay, site, 2)

    threads = [threading.Thread(target=wait, args=(s,)) for s in ("a", "b")]
    for t in threads:
        t.start()
    relay.add_task(["a"], "train", {}, _frames(b"x"))
    threads[0].join(2)
    assert got["a"].topic == "train"
    relay.end()  # the job is over: the other waiter learns it at once
    threads[1].join(2)
    assert got["b"] is END


def test_a_dropped_site_owes_an_error_reply_for_every_open_task(tmp_path):
    relay = _relay(tmp_path, ["a", "b"])
    first = relay.add_task(["a", "b"], "train", {}, _frames(b"x"))
    relay.drop_site("b", "b dropped out: killed by signal 9")
    reply = relay.next_reply(first, 1)
    assert (reply.site, reply.error) == ("b", "b dropped out: killed by signal 9")
    later = relay.add_task(["a", "b"], "train", {}, _frames(b"y"))  # a task after the drop
    assert relay.next_reply(later, 1).error == "b dropped out: killed by signal 9"
    assert _next_task(relay, "b", 1) is END


def test_replies_arriving_at_once_hold_no_file_until_whole_and_a_large_one_spills(tmp_path):
    """Ten thousand sites' replies in flight at once each held a file open from its first frame:
    the server ran out of descriptors. A small reply is held until whole; a large one is written
    to its file as it comes."""
    from atoll.server.relay import SMALL_REPLY
    from atoll.wire.handoff import HandoffDir

    sites = [f"s{i}" for i in range(40)]
    relay = JobRelay("j", tmp_path, sites, Budget(1 << 20), handoff=True)
    task_id = relay.add_task(sites, "train", {}, _frames(b"task"))
    handoff = tmp_path / "handoff"
    task_held = relay.budget.used  # the task, not read by its sites yet
    open_now = [relay.open_reply(site, task_id, {"site": site}) for site in sites]
    for writer in open_now:
        writer.append(frames.data(writer.site.encode()))
    assert list(handoff.iterdir()) == []  # forty replies under way, no file among them
    assert relay.budget.used == task_held + sum(len(frames.data(s.encode())) for s in sites)
    large = [frames.data(b"x" * (SMALL_REPLY // 2)) for _ in range(3)]
    open_now[0].append(large[0])
    open_now[0].append(large[1])
    assert len(list(handoff.iterdir())) == 1  # past SMALL_REPLY: it spills as it comes
    tight = JobRelay("j2", tmp_path / "tight", ["a"], Budget(8), handoff=True)
    tight_id = tight.add_task(["a"], "train", {}, _frames(b"task"))
    before = tight.budget.used
    tight.open_reply("a", tight_id, {}).append(frames.data(b"0123456789"))
    assert tight.budget.used == before  # no room in the budget: not held, but in its file
    assert len(list((tmp_path / "tight" / "handoff").iterdir())) == 1
    tight.close()
    for writer in open_now:
        writer.commit()
    worker = HandoffDir(handoff)
    got = {}
    while (reply := relay.next_reply(task_id, 0)) is not None:
        name = reply.spool.hand_over()
        got[reply.site] = b"".join(bytes(c) for c in frames.Payload(worker.read(name)))
        worker.give_back()
    assert got == {site: site.encode() + (b"x" * SMALL_REPLY if site == "s0" else b"")
                   for site in sites}
    assert relay.budget.used == task_held  # what the replies held is given back
    relay.close()
