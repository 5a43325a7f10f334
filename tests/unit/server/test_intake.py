"""The server's intake (server/intake.py) on the memory store: a job it refuses leaves nothing
behind, and each refusal names the field; the checks are spec/admission.py's, as the CLI's."""

from __future__ import annotations

import json
from types import SimpleNamespace

import pytest

from atoll.pki.identity import Identity
from atoll.server.intake import Intake
from atoll.server.store import open_store
from atoll.wire.job_archive import IntakeError, zip_folder

LEAD = Identity("lead@a.org", "org-a", "admin", "lead")


class Unreached:
    """The signature check: these jobs are refused before it."""

    def verify(self, tree, who, study):
        raise AssertionError("the signature was checked before the job's own rules")


def _intake(tmp_path, store, online=None):
    queue = SimpleNamespace(submitted=lambda job_id, meta: pytest.fail("queued"))
    return Intake(store=store, studies=SimpleNamespace(sites=lambda study: ["site-a", "site-b"]),
                  links=SimpleNamespace(online=lambda: online or {}), queue=queue,
                  check=Unreached(), limits=SimpleNamespace(max_upload_bytes=1 << 20,
                                                            max_job_bytes=1 << 20),
                  workspace=tmp_path / "ws", jobs_dir=tmp_path / "ws" / "jobs")


def _upload(tmp_path, meta) -> list[bytes]:
    from atoll.wire import frames

    job = tmp_path / "job"
    (job / "app").mkdir(parents=True)
    (job / "app" / "app.yaml").write_text("# app\n")
    (job / "meta.json").write_text(json.dumps(meta))
    out = zip_folder(job, tmp_path / "job.zip")
    return [frames.data(out.read_bytes())]


def test_a_job_for_a_site_outside_the_study_is_refused_with_its_field(tmp_path):
    store = open_store(None)
    meta = {"name": "j", "deploy_map": {"app": ["server", "site-z"]},
            "mandatory_clients": ["site-z"]}
    with pytest.raises(IntakeError) as refused:
        _intake(tmp_path, store).submit(LEAD, "s", iter(_upload(tmp_path, meta)))
    text = str(refused.value)
    assert "- deploy_map.app[1]: site 'site-z' is not enrolled in study 's'" in text
    assert "- mandatory_clients[0]: site 'site-z' is not enrolled in study 's'" in text
    jobs = tmp_path / "ws" / "jobs"
    assert store.list_jobs() == [] and not (jobs.exists() and any(jobs.iterdir()))
    assert not any((tmp_path / "ws" / "tmp").iterdir())  # the upload is gone too


def test_a_job_no_online_site_could_ever_run_is_refused(tmp_path):
    store = open_store(None)
    online = {"site-a": SimpleNamespace(capacity={"gpus": 1}, launcher="process")}
    meta = {"name": "j", "deploy_map": {"app": ["server", "site-a"]},
            "resource_spec": {"site-a": {"num_of_gpus": 2}}}
    with pytest.raises(IntakeError, match="site 'site-a' could never run this job: 2 GPU"):
        _intake(tmp_path, store, online).submit(LEAD, "s", iter(_upload(tmp_path, meta)))
    assert store.list_jobs() == []


def test_an_invalid_meta_is_refused_naming_the_file(tmp_path):
    with pytest.raises(IntakeError, match="meta.json is invalid"):
        _intake(tmp_path, open_store(None)).submit(
            LEAD, "s", iter(_upload(tmp_path, {"deploy_map": {"app": ["server"]}})))


class Signed:
    """The signature check, passed: what the intake's own parsing costs is what is counted."""

    def verify(self, tree, who, study):
        return "sha256:stand-in"


def test_the_intake_validates_the_jobs_meta_once_and_queues_that_object(tmp_path, monkeypatch):
    """The count of meta.json parses at the server's intake: one (the instrumentation of
    tests/unit/site/test_meta_parsed_once.py: every meta validation is spec/meta.py's
    ``_validate``); the scheduler gets the parsed object, never the text."""
    from atoll.spec import meta as meta_module

    validated, queued = [], []
    original = meta_module._validate
    monkeypatch.setattr(meta_module, "_validate",
                        lambda data, label: validated.append(label) or original(data, label))
    intake = _intake(tmp_path, open_store(None))
    intake.check = Signed()
    intake.queue = SimpleNamespace(submitted=lambda job_id, meta: queued.append(meta))
    upload = _upload(tmp_path, {"name": "j", "deploy_map": {"app": ["server", "site-a"]}})
    record = intake.submit(LEAD, "s", iter(upload))
    assert record.state == "SUBMITTED" and record.meta["study"] == "s"
    assert [m.name for m in queued] == ["j"]
    assert len(validated) == 1, validated
