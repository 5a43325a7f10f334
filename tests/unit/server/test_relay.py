"""The server's relay of one job: tasks to sites, replies to the workflow, drop-outs, the end."""

from __future__ import annotations

import threading

from atoll.server.relay import END, JobRelay


def _read(path):
    return path.read_bytes()


def test_a_task_reaches_each_target_and_replies_reach_the_workflow(tmp_path):
    relay = JobRelay("j", tmp_path, ["a", "b", "c"])
    task_id = relay.add_task(["a", "b"], "train", {"round": 0}, [b"pay", b"load"])
    for site in ("a", "b"):
        entry = relay.next_task(site, 1)
        assert (entry.task_id, entry.topic, _read(entry.path)) == (task_id, "train", b"payload")
        relay.pulled(site, entry)
    assert relay.next_task("c", 0.05) is None  # not a target: nothing for it
    assert not list(tmp_path.glob("*.task"))  # pulled by every target: payload deleted
    relay.add_reply("b", task_id, {"n": 1}, [b"B"])
    reply = relay.next_reply(task_id, 1)
    assert (reply.site, reply.headers, _read(reply.path)) == ("b", {"n": 1}, b"B")


def test_a_waiting_site_is_woken_by_its_task_only(tmp_path):
    relay = JobRelay("j", tmp_path, ["a", "b"])
    got = {}

    def wait(site):
        got[site] = relay.next_task(site, 2)

    threads = [threading.Thread(target=wait, args=(s,)) for s in ("a", "b")]
    for t in threads:
        t.start()
    relay.add_task(["a"], "train", {}, [b"x"])
    threads[0].join(2)
    assert got["a"].topic == "train"
    relay.end()  # the job is over: the other waiter learns it at once
    threads[1].join(2)
    assert got["b"] is END


def test_a_dropped_site_owes_an_error_reply_for_every_open_task(tmp_path):
    relay = JobRelay("j", tmp_path, ["a", "b"])
    first = relay.add_task(["a", "b"], "train", {}, [b"x"])
    relay.drop_site("b", "b dropped out: killed by signal 9")
    reply = relay.next_reply(first, 1)
    assert (reply.site, reply.error) == ("b", "b dropped out: killed by signal 9")
    later = relay.add_task(["a", "b"], "train", {}, [b"y"])  # a task after the drop
    assert relay.next_reply(later, 1).error == "b dropped out: killed by signal 9"
    assert relay.next_task("b", 1) is END
