"""The Store contract (server/store.py): SQLite (what a server runs on) and memory (what the
handlers' unit tests run on) give the same answers to the same calls."""

from __future__ import annotations

import threading

import pytest

from atoll.server.memory_store import MemoryStore
from atoll.server.sqlite_store import SqliteStore
from atoll.server.store import Store, open_store


@pytest.fixture(params=["sqlite", "memory"])
def store(request, tmp_path):
    opened: Store = open_store(tmp_path / "atoll.db" if request.param == "sqlite" else None)
    assert isinstance(opened, SqliteStore if request.param == "sqlite" else MemoryStore)
    yield opened
    opened.close()


def _add(store: Store, job_id: str, study: str = "s", parts=("server", "site-a")) -> None:
    store.add_job(job_id, f"job-{job_id}", study, "lead", "org-a", {"name": job_id, "n": [1]},
                  list(parts))


def test_a_job_is_added_submitted_with_its_parts(store):
    _add(store, "a")
    record = store.get_job("a")
    assert (record.id, record.seq, record.name, record.study, record.submitter,
            record.submitter_org, record.state, record.reason) == (
        "a", 1, "job-a", "s", "lead", "org-a", "SUBMITTED", "")
    assert record.meta == {"name": "a", "n": [1]}
    assert record.parts == {"server": {"state": "SUBMITTED", "reason": ""},
                            "site-a": {"state": "SUBMITTED", "reason": ""}}
    assert record.created == record.updated and not record.finished
    assert store.get_job("nope") is None


def test_what_comes_out_is_a_copy(store):
    _add(store, "a")
    store.get_job("a").meta["n"].append(2)
    assert store.get_job("a").meta == {"name": "a", "n": [1]}


def test_states_change_and_parts_are_upserted(store):
    _add(store, "a")
    store.set_job_state("a", "RUNNING", "dispatched")
    store.set_part_state("a", "site-a", "RUNNING")
    store.set_part_state("a", "site-b", "FINISHED:FAILED", "refused")
    record = store.get_job("a")
    assert (record.state, record.reason) == ("RUNNING", "dispatched")
    assert record.parts == {"server": {"state": "SUBMITTED", "reason": ""},
                            "site-a": {"state": "RUNNING", "reason": ""},
                            "site-b": {"state": "FINISHED:FAILED", "reason": "refused"}}
    assert record.updated >= record.created
    store.set_job_state("a", "FINISHED:COMPLETED")
    assert store.get_job("a").finished


def test_each_parts_state_changes_are_kept_with_the_servers_time(store):
    _add(store, "a")
    _add(store, "b")
    store.set_part_state("a", "site-a", "DISPATCHED")
    store.set_part_state("a", "site-a", "DISPATCHED")  # no change: nothing kept
    store.set_part_state("a", "site-a", "DISPATCHED", "site parent disconnected")
    store.set_part_state("a", "server", "RUNNING")
    store.set_part_state("b", "server", "RUNNING")
    history = store.part_history("a")
    assert [(h["part"], h["state"], h["reason"]) for h in history] == [
        ("server", "SUBMITTED", ""), ("site-a", "SUBMITTED", ""), ("site-a", "DISPATCHED", ""),
        ("site-a", "DISPATCHED", "site parent disconnected"), ("server", "RUNNING", "")]
    times = [h["at"] for h in history]
    assert times == sorted(times) and times[0] == store.get_job("a").created
    store.delete_job("a")
    assert store.part_history("a") == [] and len(store.part_history("b")) == 3


def test_many_parts_change_in_one_write_and_only_changes_are_kept(store):
    _add(store, "a", parts=("server", "site-a", "site-b"))
    store.set_part_state("a", "site-a", "DISPATCHED")
    store.set_part_states("a", {"site-a": ("DISPATCHED", ""), "site-b": ("DISPATCHED", ""),
                                "site-c": ("FINISHED:FAILED", "offline")})
    assert store.get_job("a").parts == {
        "server": {"state": "SUBMITTED", "reason": ""},
        "site-a": {"state": "DISPATCHED", "reason": ""},
        "site-b": {"state": "DISPATCHED", "reason": ""},
        "site-c": {"state": "FINISHED:FAILED", "reason": "offline"}}
    changes = [(h["part"], h["state"]) for h in store.part_history("a")
               if h["state"] != "SUBMITTED"]
    # site-a's second DISPATCHED is not a change
    assert sorted(changes) == [("site-a", "DISPATCHED"), ("site-b", "DISPATCHED"),
                               ("site-c", "FINISHED:FAILED")]


def test_a_job_kept_before_the_history_shows_each_parts_state_since_its_last_change(tmp_path):
    store = SqliteStore(tmp_path / "atoll.db")
    _add(store, "a")
    store.set_part_state("a", "site-a", "RUNNING")
    store._exec("DELETE FROM part_states")  # as an older server's store has none
    assert [(h["part"], h["state"]) for h in store.part_history("a")] == [
        ("server", "SUBMITTED"), ("site-a", "RUNNING")]
    store.close()


def test_jobs_are_listed_newest_first_by_study_state_and_limit(store):
    for job_id, study in (("a", "s"), ("b", "t"), ("c", "s"), ("d", "s")):
        _add(store, job_id, study)
    store.set_job_state("c", "RUNNING")
    assert [r.id for r in store.list_jobs()] == ["d", "c", "b", "a"]
    assert [r.seq for r in store.list_jobs()] == [4, 3, 2, 1]
    assert [r.id for r in store.list_jobs(study="s")] == ["d", "c", "a"]
    assert [r.id for r in store.list_jobs(states=["SUBMITTED"])] == ["d", "b", "a"]
    assert [r.id for r in store.list_jobs(study="s", states=["RUNNING", "X"])] == ["c"]
    assert [r.id for r in store.list_jobs(limit=2)] == ["d", "c"]
    assert [r.id for r in store.list_jobs(limit=2, offset=1)] == ["c", "b"]  # a page
    assert [r.id for r in store.list_jobs(study="s", offset=2)] == ["a"]
    assert store.list_jobs(offset=4) == []
    assert store.list_jobs(states=[]) == []
    assert store.list_jobs()[0].parts == store.get_job("d").parts
    assert (store.count_jobs("s"), store.count_jobs("t"), store.count_jobs("u")) == (3, 1, 0)


def test_a_deleted_job_leaves_its_audit_entries(store):
    _add(store, "a")
    _add(store, "b")
    store.add_event("a", "server", {"round": 1})
    store.audit("lead", "org-a", "lead", "s", "submit", "a", "ok")
    store.delete_job("a")
    assert store.get_job("a") is None and store.events("a") == []
    assert [r.id for r in store.list_jobs()] == ["b"]
    assert [e["target"] for e in store.audit_log()] == ["a"]
    _add(store, "c")
    assert store.get_job("c").seq == 3  # seq follows the highest still held


def test_events_in_time_order_after_since(store):
    _add(store, "a")
    store.add_event("a", "server", {"round": 1})
    store.add_event("a", "site-a", {"loss": 0.5})
    store.add_event("b", "server", {"round": 9})
    events = store.events("a")
    assert [(e["source"], {k: v for k, v in e.items() if k not in ("at", "source")})
            for e in events] == [("server", {"round": 1}), ("site-a", {"loss": 0.5})]
    assert events[0]["at"] <= events[1]["at"]
    assert store.events("a", since=events[1]["at"]) == []
    assert store.recent_events("a") == events


def test_participants_studies_and_members(store):
    store.upsert_participant("site-b", "site", "org-b")
    store.upsert_participant("alice", "user", "org-a", "lead")
    store.upsert_participant("site-b", "site", "org-c")
    assert store.participants() == [
        {"name": "alice", "kind": "user", "org": "org-a", "role": "lead"},
        {"name": "site-b", "kind": "site", "org": "org-c", "role": ""}]
    assert [p["name"] for p in store.participants("site")] == ["site-b"]
    assert store.add_study("t") and store.add_study("s") and not store.add_study("s")
    assert store.studies() == ["s", "t"]
    store.set_member("s", "site-b", "site", True)
    store.set_member("s", "site-a", "site", True)
    store.set_member("s", "site-a", "site", True)
    store.set_member("s", "alice", "user", True)
    assert store.members("s", "site") == ["site-a", "site-b"]
    assert store.members("s", "user") == ["alice"] and store.members("t", "site") == []
    store.set_member("s", "site-b", "site", False)
    assert store.members("s", "site") == ["site-a"]
    store.remove_study("s")
    assert store.studies() == ["t"] and store.members("s", "site") == []


def test_the_audit_log_keeps_the_latest_oldest_first(store):
    for i in range(5):
        store.audit("u", "o", "project_admin", "s" if i % 2 else "t", "act", str(i), "ok",
                    f"d{i}")
    log = store.audit_log()
    assert [e["target"] for e in log] == ["0", "1", "2", "3", "4"]
    assert set(log[0]) == {"id", "at", "user", "org", "role", "study", "action", "target",
                           "outcome", "detail"}
    assert [e["id"] for e in log] == sorted(e["id"] for e in log)
    assert [e["target"] for e in store.audit_log(limit=2)] == ["3", "4"]
    assert [e["target"] for e in store.audit_log(study="s")] == ["1", "3"]
    assert [e["target"] for e in store.audit_log(study="t", limit=2)] == ["2", "4"]


def test_every_write_wakes_a_watcher(store):
    since = store.version
    woke = []
    watcher = threading.Thread(target=lambda: woke.append(store.wait_for_change(since, 60)))
    watcher.start()
    _add(store, "a")
    watcher.join()
    assert woke and woke[0] != since
    for write in (lambda: store.set_job_state("a", "RUNNING"),
                  lambda: store.set_part_state("a", "server", "RUNNING"),
                  lambda: store.add_event("a", "server", {}),
                  lambda: store.upsert_participant("p", "site", "o"),
                  lambda: store.set_member("s", "p", "site", True),
                  lambda: store.audit("u", "o", "r", "s", "a", "t", "ok"),
                  lambda: store.delete_job("a")):
        before = store.version
        write()
        assert store.version != before
    assert store.wait_for_change(store.version, 0) == store.version  # nothing new: times out
