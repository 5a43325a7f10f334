"""The scheduler parses a job's meta once: intake hands it over with the job, a job from before a
restart is parsed on its first tick, and each is kept only while its job waits."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from atoll.server.scheduler import JobQueue, Scheduler
from atoll.server.sqlite_store import SqliteStore
from atoll.spec.meta import load_meta

META = {"name": "fedavg", "deploy_map": {"app": ["@ALL"]}}


class Jobs:
    def __init__(self):
        self.dispatched, self.aborted = [], []

    def held(self):
        return {}

    def dispatch(self, record, meta, sites, skipped, resources):
        self.dispatched.append((record.id, meta, sites))

    def abort(self, job_id, reason):
        self.aborted.append((job_id, reason))


class Links:
    def __init__(self):
        self.sites = {}

    def online(self):
        return self.sites


@pytest.fixture
def store(tmp_path):
    store = SqliteStore(tmp_path / "atoll.db")
    yield store
    store.close()


def _setup(store):
    queue, jobs, links = JobQueue(), Jobs(), Links()
    studies = SimpleNamespace(sites=lambda study: ["site-a"])
    return queue, jobs, links, Scheduler(queue, store, studies, links, jobs)


def _submit(store, job_id: str, meta=META) -> None:
    store.add_job(job_id, "fedavg", "default", "lead", "org", meta, ["server", "site-a"])


def test_a_meta_handed_over_at_intake_is_not_parsed_again(store, monkeypatch):
    queue, jobs, links, scheduler = _setup(store)
    _submit(store, "a" * 32)
    meta = load_meta(META)
    queue.submitted("a" * 32, meta)
    monkeypatch.setattr("atoll.spec.meta.load_meta", _no_parse)
    for _ in range(3):  # waiting for its site: each tick uses the same meta
        scheduler.tick()
    assert store.get_job("a" * 32).reason.startswith("waiting for sites: 0 of 1 online")
    links.sites["site-a"] = SimpleNamespace(capacity={}, launcher="process")
    scheduler.tick()
    assert jobs.dispatched == [("a" * 32, meta, ["site-a"])]
    store.set_job_state("a" * 32, "DISPATCHED")
    scheduler.tick()
    assert queue.get("a" * 32) is None  # dispatched: not kept


def test_a_job_from_before_a_restart_is_parsed_once(store, monkeypatch):
    queue, jobs, links, scheduler = _setup(store)
    _submit(store, "b" * 32)
    parsed = []

    def counting(source):
        parsed.append(source)
        return load_meta(source)

    monkeypatch.setattr("atoll.spec.meta.load_meta", counting)
    for _ in range(3):
        scheduler.tick()
    assert len(parsed) == 1 and queue.get("b" * 32) is not None
    store.set_job_state("b" * 32, "FINISHED:ABORTED", "aborted by lead")
    scheduler.tick()
    assert queue.get("b" * 32) is None  # no longer waiting: forgotten


def test_a_stored_meta_no_longer_valid_aborts_its_job(store):
    queue, jobs, links, scheduler = _setup(store)
    _submit(store, "c" * 32, {"name": "x", "deploy_map": {"../up": ["@ALL"]}})
    scheduler.tick()
    assert jobs.aborted and jobs.aborted[0][0] == "c" * 32
    assert jobs.aborted[0][1].startswith("meta.json no longer valid")


def _no_parse(source):
    raise AssertionError("the scheduler parsed a meta intake had handed over")


def test_a_native_docker_gpu_count_is_what_the_site_admits(store):
    """NVIDIA FLARE's launcher_spec docker num_of_gpus is the worker's GPUs: the server counts
    them against the site's capacity like resource_spec's."""
    queue, jobs, links, scheduler = _setup(store)
    meta = {**META, "launcher_spec": {"site-a": {"docker": {"num_of_gpus": 2}}}}
    _submit(store, "d" * 32, meta)
    links.sites["site-a"] = SimpleNamespace(capacity={"gpus": 1}, launcher="docker")
    scheduler.tick()
    assert store.get_job("d" * 32).reason == (
        "waiting for resources at site-a: 2 GPU(s) asked, 1 free")
    links.sites["site-a"] = SimpleNamespace(capacity={"gpus": 1}, launcher="k8s")
    scheduler.tick()  # a Kubernetes site does not read the docker block
    assert [d[0] for d in jobs.dispatched] == ["d" * 32]


def test_intake_names_each_online_site_too_small_for_the_job_ever():
    from atoll.server.scheduler import never_fits

    meta = load_meta({**META, "resource_spec": {"@default": {"num_of_gpus": 2},
                                                "site-c": {"num_of_gpus": 1}}})
    online = {"site-a": SimpleNamespace(capacity={"gpus": 1}, launcher="process"),
              "site-b": SimpleNamespace(capacity={}, launcher="process"),  # no limit
              "site-c": SimpleNamespace(capacity={"gpus": 1}, launcher="process")}
    problems = never_fits(meta, ["site-a", "site-b", "site-c", "site-d"], online)
    assert problems == ["resource_spec: site 'site-a' could never run this job: 2 GPU(s) asked, "
                        "1 free with nothing else running there; ask less for it (a per-site "
                        "entry of resource_spec) or leave it out of deploy_map"]
    # site-d is offline: what it holds is not known now, so it does not count against the job
    assert never_fits(meta, ["site-b", "site-d"], online) == []
