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


@pytest.mark.parametrize("meta, by_models", [
    ({"name": "j", "deploy_map": {"app": ["server", "site-a"]}}, False),  # the common shape
    ({"name": "j", "deploy_map": {"app": ["server", "site-a"]},
      "resource_spec": {"@default": {"num_of_cpus": 1}}}, True),
])
def test_the_intake_validates_the_jobs_meta_once_and_queues_that_object(
        tmp_path, monkeypatch, meta, by_models):
    """The count of meta.json parses at the server's intake: one (the instrumentation of
    tests/unit/site/test_meta_parsed_once.py: every meta validation by the models is
    spec/meta.py's ``_validate``; the plain check of the common shape is spec/meta_plain.py's
    ``vouch_meta``); the scheduler gets the parsed object, never the text."""
    from atoll.spec import meta as meta_module
    from atoll.spec import meta_plain

    validated, vouched, queued = [], [], []
    original, plain = meta_module._validate, meta_plain.vouch_meta
    monkeypatch.setattr(meta_module, "_validate",
                        lambda data, label: validated.append(label) or original(data, label))
    monkeypatch.setattr(meta_plain, "vouch_meta",
                        lambda data: vouched.append(plain(data)) or vouched[-1])
    intake = _intake(tmp_path, open_store(None))
    intake.check = Signed()
    intake.queue = SimpleNamespace(submitted=lambda job_id, meta: queued.append(meta))
    record = intake.submit(LEAD, "s", iter(_upload(tmp_path, meta)))
    assert record.state == "SUBMITTED" and record.meta["study"] == "s"
    assert [m.name for m in queued] == ["j"]
    assert len(vouched) == 1 and (vouched[0] is None) == by_models, vouched
    assert len(validated) == (1 if by_models else 0), validated
    # the record is the models' own document either way (what the sites are sent)
    assert record.meta == meta_module.load_meta(meta).with_server_fields(
        "s", LEAD.name).model_dump(mode="json")

_FRESH_INTAKE = """
import json, sys
from pathlib import Path
from types import SimpleNamespace
from atoll.pki.identity import Identity
from atoll.server.intake import Intake
from atoll.server.store import open_store
from atoll.spec.admission import asked_at, fits
from atoll.wire import frames
from atoll.wire.job_archive import zip_folder

tmp, meta = Path(sys.argv[1]), json.loads(sys.argv[2])
(tmp / "job" / "app").mkdir(parents=True)
(tmp / "job" / "app" / "app.yaml").write_text("# app\\n")
(tmp / "job" / "meta.json").write_text(json.dumps(meta))
upload = [frames.data(zip_folder(tmp / "job", tmp / "job.zip").read_bytes())]
online = {s: SimpleNamespace(capacity={"cpus": 2}, launcher="process") for s in ("a", "b")}
queued = []
intake = Intake(store=open_store(None), studies=SimpleNamespace(sites=lambda study: ["a", "b"]),
                links=SimpleNamespace(online=lambda: online),
                queue=SimpleNamespace(submitted=lambda job_id, meta: queued.append(meta)),
                check=SimpleNamespace(verify=lambda tree, who, study: "sha256:stand-in"),
                limits=SimpleNamespace(max_upload_bytes=1 << 20, max_job_bytes=1 << 20),
                workspace=tmp / "ws", jobs_dir=tmp / "ws" / "jobs")
intake.submit(Identity("lead@a.org", "org-a", "admin", "lead"), "s", iter(upload))
asked = [asked_at(queued[0], s, "process") for s in ("a", "b")]
room = [fits(online[s].capacity, [], r) for s, r in zip(("a", "b"), asked)]
print(json.dumps({"room": room, "cpus": [r.cpus_counted for r in asked],
                  "pydantic": "pydantic" in sys.modules}))
"""


@pytest.mark.parametrize("meta, models", [
    ({"name": "j", "deploy_map": {"app": ["@ALL"]}, "min_clients": 2}, False),
    ({"name": "j", "deploy_map": {"app": ["@ALL"]}, "resource_spec": {"a": {"num_of_cpus": 2}}},
     True),
])
def test_a_common_job_is_taken_in_and_scheduled_without_pydantic(tmp_path, meta, models):
    """In a fresh interpreter, as a server parent at rest takes its first job: the meta's
    check, the study's and capacity's questions and the queued record need no model, so the job
    reaches its sites before the parent loads any (the launcher's come with its server worker).
    A meta outside the common shape is the models' to check."""
    import subprocess
    import sys

    out = subprocess.run([sys.executable, "-c", _FRESH_INTAKE, str(tmp_path), json.dumps(meta)],
                         capture_output=True, text=True, check=True).stdout
    answer = json.loads(out)
    assert answer["pydantic"] is models
    assert answer["room"] == [None, None]  # room at both sites
    assert answer["cpus"] == ([2, 1] if models else [1, 1])


_FRESH_LAUNCH = """
import json, sys
from pathlib import Path
from types import SimpleNamespace
from atoll.parent.local_config import load_local_config
from atoll.server.app import ServerParent
from atoll.spec.meta_plain import read_meta

local, workspace, meta = Path(sys.argv[1]), Path(sys.argv[2]), json.loads(sys.argv[3])
parent = ServerParent.__new__(ServerParent)  # what launch_request uses of a started parent
parent.local = load_local_config(local, False, workspace)
parent.worker_address = "unix:/nowhere"
parent._endpoint = SimpleNamespace(cert_pem=None, socket_path="/nowhere")
request = parent.launch_request(SimpleNamespace(id="a" * 32, name="j", study="s"),
                                read_meta(json.dumps(meta).encode()), workspace / "run", "t")
launcher = parent.launcher
print(json.dumps({"launcher": launcher.name, "site_config": type(request.site_config).__name__,
                  "cpus": request.resources.cpus_counted,
                  "pydantic": "pydantic" in sys.modules}))
"""


@pytest.mark.parametrize("meta, models", [
    ({"name": "j", "deploy_map": {"app": ["@ALL"]}}, False),
    ({"name": "j", "deploy_map": {"app": ["@ALL"]},
      "launcher_spec": {"server": {"process": {}}}}, True),
])
def test_a_common_jobs_server_worker_is_launched_without_pydantic(tmp_path, meta, models):
    """In a fresh interpreter, as a server parent at rest launches its first server worker on
    the process launcher: the launcher comes from the check's values and the request asks
    site.yaml nothing more, so no SiteConfig (no model) is loaded. A meta with a launcher_spec
    is resolved against the SiteConfig."""
    import subprocess
    import sys

    from atoll.parent.local_config import load_local_config

    local, workspace = tmp_path / "local", tmp_path / "workspace"
    local.mkdir()
    (local / "site.yaml").write_text("launcher: process\n")
    load_local_config(local, False, workspace).close()  # checked: the record is written
    run = subprocess.run([sys.executable, "-c", _FRESH_LAUNCH, str(local), str(workspace),
                          json.dumps(meta)], capture_output=True, text=True)
    assert run.returncode == 0, run.stderr[-3000:]
    answer = json.loads(run.stdout)
    assert answer == {"launcher": "process", "cpus": 1, "pydantic": models,
                      "site_config": "SiteConfig" if models else "ProcessSite"}
