"""A site admits a job once and hands what it read on: study_runtime.yaml is read once per
launch, and the launch request carries the admitted resources and the study entry read then."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import pytest

from atoll.launchers import request as request_mod
from atoll.launchers.base import JobIdentity
from atoll.launchers.request import build_request
from atoll.parent.worker_endpoint import WorkerTokens
from atoll.site.supervisor import Supervisor
from atoll.spec.meta import load_meta
from atoll.spec.resources import resolve_resources
from atoll.spec.site_config import load_site_config
from atoll.spec.study_runtime import load_study_runtime

SEED = Path(__file__).parents[2] / "fixtures/seed"


@pytest.fixture
def local(tmp_path):
    local = tmp_path / "local"
    local.mkdir()
    (local / "site.yaml").write_text((SEED / "site_process.yaml").read_text())
    (local / "study_runtime.yaml").write_text((SEED / "study_runtime_process.yaml").read_text())
    return local


class Host:
    launcher = SimpleNamespace(name="process")  # the backend's name: its launcher_spec block

    def __init__(self, local: Path):
        self.local, self.reads = local, 0

    def study_runtime(self):
        self.reads += 1
        return load_study_runtime(self.local, "process")

    def capacity(self):
        return {}

    def runs_root(self):
        return self.local.parent / "ws"


def _supervisor(tmp_path, host) -> Supervisor:
    kit = SimpleNamespace(name="hospital-a", workspace=tmp_path / "ws")
    return Supervisor(kit, host=host, link=None, server=None, tokens=None)


def test_admission_reads_study_runtime_once_and_keeps_what_it_read(tmp_path, local):
    host = Host(local)
    meta = load_meta(SEED / "meta.json")
    job = _supervisor(tmp_path, host)._admit("j" * 32, "pathology", meta)
    assert host.reads == 1
    assert job.entry is not None and job.entry == job.runtime.entry("pathology")
    assert job.resources == resolve_resources(meta.resource_spec, "hospital-a")


def test_a_study_the_site_does_not_map_is_not_admitted(tmp_path, local):
    supervisor = _supervisor(tmp_path, Host(local))
    with pytest.raises(Exception, match="does not map study 'other'"):
        supervisor._admit("j" * 32, "other", load_meta(SEED / "meta.json"))
    assert supervisor.running_jobs() == []


def test_the_launch_request_takes_the_admitted_resources(local, monkeypatch):
    meta = load_meta(SEED / "meta.json")
    admitted = resolve_resources(meta.resource_spec, "hospital-a")

    def again(*_):
        raise AssertionError("resources resolved again")

    monkeypatch.setattr(request_mod, "asked_at", again)
    request = build_request(
        meta=meta, identity=JobIdentity("j" * 32, meta.name, "pathology", "hospital-a", "site"),
        site_config=load_site_config(local), study_runtime=load_study_runtime(local, "process"),
        workdir=local.parent / "job", parent_address="127.0.0.1:1", resources=admitted)
    assert request.resources is admitted


class Link:
    def __init__(self):
        self.states = []

    def send_state(self, job_id, state, reason="", **extra):
        self.states.append((state, reason))


def test_a_meta_sent_as_a_path_is_refused_unread(tmp_path, local):
    """The site trusts nothing the server sends: a `meta` that is a string would be a path on
    the site's own disk for load_meta. It is refused before anything reads it."""
    secret = tmp_path / "site-secret.json"
    secret.write_text('{"name": "SITE-FILE-CONTENT"}')
    link = Link()
    kit = SimpleNamespace(name="hospital-a", workspace=tmp_path / "ws")
    supervisor = Supervisor(kit, host=Host(local), link=link, server=None, tokens=WorkerTokens())
    supervisor._run({"job_id": "k" * 32, "study": "pathology", "meta": str(secret)})
    state, reason = link.states[-1]
    assert state == "FINISHED:FAILED"
    assert "the server sent no meta document" in reason and "SITE-FILE-CONTENT" not in reason


@pytest.mark.parametrize("job_id", ["../x", "a/b", "x" * 65, 7, None])
def test_a_dispatch_of_a_crafted_job_id_starts_nothing(tmp_path, local, job_id):
    """The id names the job's thread, folder and state: checked before anything starts."""
    import threading

    link = Link()
    kit = SimpleNamespace(name="hospital-a", workspace=tmp_path / "ws")
    supervisor = Supervisor(kit, host=Host(local), link=link, server=None, tokens=WorkerTokens())
    before = set(threading.enumerate())
    supervisor.dispatch({"job_id": job_id, "study": "pathology", "meta": {}})
    assert set(threading.enumerate()) <= before  # no job thread
    if isinstance(job_id, str):  # the server hears why when it can match the id
        ((state, reason),) = link.states
        assert state == "FINISHED:FAILED" and "is not a valid job id" in reason
    else:
        assert link.states == []
    assert not (tmp_path / "ws").exists()


@pytest.mark.parametrize("study", ["../etc", "a/b", "Pathology", {"x": 1}, None])
def test_a_dispatch_of_a_crafted_study_is_refused_naming_its_grammar(tmp_path, local, study):
    link = Link()
    kit = SimpleNamespace(name="hospital-a", workspace=tmp_path / "ws")
    supervisor = Supervisor(kit, host=Host(local), link=link, server=None, tokens=WorkerTokens())
    supervisor._run({"job_id": "k" * 32, "study": study, "meta": {}})
    ((state, reason),) = link.states
    assert state == "FINISHED:FAILED" and "is not a valid study name" in reason, reason
