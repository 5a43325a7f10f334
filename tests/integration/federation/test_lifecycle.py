"""A job's whole life on real processes over real mTLS, and what happens when things break."""

from __future__ import annotations

import io
import json
import os
import signal
import zipfile

import grpc
import pytest

from atoll.admin.errors import Refused
from atoll.admin.session import CHECK_BEFORE_UPLOAD
from atoll.pki.kit import load_kit
from atoll.pki.tls import channel_credentials
from atoll.spec.errors import SpecError
from atoll.wire import frames, rpc
from atoll.wire import messages as msg
from tests.integration.federation.conftest import ADMIN, USERS
from tests.integration.federation.harness import Federation, pids_with_env, wait_for
from tests.integration.federation.jobs import CRASH, LEFT_FOR_EXIT, STALL, make_job


def _all_running(session, job_id):
    parts = session.status(job_id)["parts"]
    return all(p["state"] == "RUNNING" for p in parts.values()) and parts


def test_submit_complete_download(federation, tmp_path):
    with federation.session(ADMIN) as s:
        job = s.submit(make_job(tmp_path / "echo", rounds=2), wait=True, timeout=120)
        assert job["state"] == "FINISHED:COMPLETED", job
        assert {p["state"] for p in job["parts"].values()} == {"FINISHED:COMPLETED"}
        assert job["job_id"] in {j["job_id"] for j in s.list_jobs()}
        out = s.download(job["job_id"], tmp_path / "results")
    summary = json.loads((out / "job.json").read_text())
    assert summary["state"] == "FINISHED:COMPLETED"
    assert (out / "logs" / "site-1.log").exists() and (out / "logs" / "server").is_dir()


def test_workers_on_their_parents_host_pass_payloads_as_files_both_ways(federation, tmp_path):
    """The process launcher shares each parent's host: tasks and replies go between every worker
    and its parent through the job's handoff folder (wire/handoff.py), every byte arrives as
    sent, round after round, and the folders go with the job."""
    size = 3 * frames.CHUNK + 7  # several frames, the last one short
    with federation.session(ADMIN) as s:
        job = s.submit(make_job(tmp_path / "files", rounds=3, payload_bytes=size), wait=True,
                       timeout=120)
        logs = s.logs(job["job_id"])["logs"]
        out = s.download(job["job_id"], tmp_path / "results")
    assert job["state"] == "FINISHED:COMPLETED", job
    sites = sorted(p for p in job["parts"] if p != "server")
    for part in ["server", *sites]:
        assert "payloads come and go as files through" in logs[part], part
    result = json.loads(next(out.rglob("scatter_gather.json")).read_text())
    assert [sorted(r["replies"]) for r in result["rounds"]] == [sites] * 3
    assert all(reply["echoed"] for r in result["rounds"] for reply in r["replies"].values())
    assert not (federation.workspace("server") / "jobs" / job["job_id"] / "relay").exists()
    for site in sites:
        assert not (federation.workspace(site) / "jobs" / job["job_id"] / "handoff").exists()


def test_a_worker_leaving_quickly_still_does_what_exit_would(federation, tmp_path):
    """Workers end with os._exit (atoll.worker): a script's unclosed file, atexit function and
    non-daemon thread must still get what a normal interpreter exit gives them."""
    with federation.session(ADMIN) as s:
        job = s.submit(make_job(tmp_path / "exit", script=LEFT_FOR_EXIT), wait=True, timeout=120)
    assert job["state"] == "FINISHED:COMPLETED", job
    sites = [p for p in job["parts"] if p != "server"]
    assert sites
    for site in sites:  # written into the worker's own run folder, all it may write to
        out = federation.workspace(site) / "jobs" / job["job_id"]
        assert (out / f"{site}-unclosed.txt").read_text() == "flushed at exit\n"
        assert (out / f"{site}-atexit.txt").read_text() == "ran\n"
        assert (out / f"{site}-thread.txt").read_text() == "waited for\n"


def _three_workers(job_id: str) -> list[int]:
    """The job's three workers (the server's and two sites'), once the server worker's check
    of the job's signature, a child of its own for a moment at its start, has ended."""
    def three() -> list[int] | None:
        pids = pids_with_env(f"ATOLL_JOB_ID={job_id}")
        return pids if len(pids) == 3 else None

    return wait_for(three, 10, "the job's three workers alone")


def test_abort_mid_job_leaves_no_worker(federation, tmp_path):
    with federation.session(ADMIN) as s:
        job = s.submit(make_job(tmp_path / "stall", script=STALL))
        job_id = job["job_id"]
        wait_for(lambda: _all_running(s, job_id), what="every worker running")
        _three_workers(job_id)
        s.abort(job_id)
        final = s.wait(job_id, timeout=30)
    assert final["state"] == "FINISHED:ABORTED"
    assert {p["state"] for p in final["parts"].values()} == {"FINISHED:ABORTED"}
    assert "aborted by admin@test.org" in final["parts"]["site-1"]["reason"]
    wait_for(lambda: not pids_with_env(f"ATOLL_JOB_ID={job_id}", sandboxes=True), 10, "workers gone")


def test_killed_site_worker_fails_the_job_naming_the_site(federation, tmp_path):
    with federation.session(ADMIN) as s:
        job_id = s.submit(make_job(tmp_path / "victim", script=STALL, min_clients=2))["job_id"]
        wait_for(lambda: _all_running(s, job_id), what="every worker running")
        site1 = [p for p in pids_with_env(f"ATOLL_JOB_ID={job_id}")
                 if b"ATOLL_SITE=site-1" in open(f"/proc/{p}/environ", "rb").read()]
        assert len(site1) == 1
        os.kill(site1[0], signal.SIGKILL)
        final = s.wait(job_id, timeout=60)
    assert final["state"] == "FINISHED:FAILED"
    assert "site-1" in final["reason"]
    assert "SIGKILL" in final["parts"]["site-1"]["reason"]
    wait_for(lambda: not pids_with_env(f"ATOLL_JOB_ID={job_id}", sandboxes=True), 15, "workers gone")


def test_crashing_script_fails_its_site_with_the_traceback(federation, tmp_path):
    # Both sites run the crashing script. The first crash leaves the round short of
    # min_clients; the other site still gets a few seconds to end on its own, so each site
    # shows its own crash, not a copy of the server's reason (issue 25, wrong turn 2).
    with federation.session(ADMIN) as s:
        job = s.submit(make_job(tmp_path / "crash", script=CRASH), wait=True, timeout=120)
        logs = s.logs(job["job_id"])["logs"]
    assert job["state"] == "FINISHED:FAILED"
    sites = {name: part for name, part in job["parts"].items() if name != "server"}
    failed = [name for name, part in sites.items() if part["state"] == "FINISHED:FAILED"]
    assert sorted(failed) == sorted(sites), sites
    for name in failed:
        assert "the training script broke on purpose" in sites[name]["reason"]
        assert "Traceback" in logs[name] and "broke on purpose" in logs[name]


def test_worker_tokens_are_in_no_environment_and_wrong_ones_are_refused(federation, tmp_path):
    """The job token reaches the worker through a pipe (never an environment block /proc shows);
    a wrong token, or one for another job, is refused. Reuse: tests/unit/wire/."""
    with federation.session(ADMIN) as s:
        job_id = s.submit(make_job(tmp_path / "tokens", script=STALL))["job_id"]
        wait_for(lambda: _all_running(s, job_id), what="every worker running")
        workers = _three_workers(job_id)
        environs = [open(f"/proc/{p}/environ", "rb").read() for p in workers]
        assert len(environs) == 3 and not any(b"ATOLL_JOB_TOKEN" in e for e in environs)
        site1 = [e for e in environs if b"ATOLL_SITE=site-1" in e][0]
        env = dict(kv.split(b"=", 1) for kv in site1.split(b"\0") if b"=" in kv)
        stub = rpc.stub(grpc.insecure_channel(env[b"ATOLL_PARENT"].decode()), "WorkerLink")
        codes = []
        for body in ({"job_id": job_id, "token": "not-the-token"},
                     {"job_id": "f" * 32, "token": "not-the-token"}):  # another job's id
            with pytest.raises(grpc.RpcError) as err:
                stub.Register(msg.Json(body=json.dumps(body)), timeout=5)
            codes.append((err.value.code(), err.value.details()))
        s.abort(job_id)
        s.wait(job_id, timeout=30)
    assert {c for c, _ in codes} == {grpc.StatusCode.PERMISSION_DENIED}
    assert all("job token refused" in d for _, d in codes)


def _raw_submit(federation, archive: bytes, head: dict | None = None):
    kit = load_kit(federation.kit(ADMIN))
    channel = grpc.secure_channel(kit.server_address, channel_credentials(kit))
    try:
        stub = rpc.stub(channel, "Admin")
        return stub.Submit(frames.payload_frames(head or {}, [archive]), timeout=30)
    finally:
        channel.close()


def _zip(entries: dict[str, bytes], links: dict[str, str] | None = None) -> bytes:
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w") as zf:
        for name, data in entries.items():
            zf.writestr(name, data)
        for name, target in (links or {}).items():
            info = zipfile.ZipInfo(name)
            info.external_attr = (0o120777 << 16)
            zf.writestr(info, target)
    return buffer.getvalue()


META = json.dumps({"name": "bad", "deploy_map": {"app": ["@ALL"]}}).encode()


@pytest.mark.parametrize(("entries", "links", "message"), [
    ({"meta.json": META, "../escape.py": b"x"}, None, "points outside the folder"),
    ({"meta.json": META, "/etc/evil": b"x"}, None, "points outside the folder"),
    ({"meta.json": META, "app/app.yaml": b""}, {"app/data": "/etc/passwd"}, "symbolic link"),
    ({"meta.json": b"{not json", "app/app.yaml": b""}, None, "meta.json is invalid"),
    ({"meta.json": json.dumps({"name": "x", "deploy_map": {}}).encode()}, None,
     "meta.json is invalid"),
    ({"meta.json": META}, None, "app folder 'app' is missing"),
    ({"meta.json": json.dumps({"name": "x", "deploy_map": {"app": ["site-1"]}}).encode(),
      "app/x": b""}, None, "no app runs on the server"),
])
def test_bad_job_folders_are_refused_and_leave_nothing(federation, entries, links, message):
    jobs_dir = federation.workspace("server") / "jobs"
    before = sorted(jobs_dir.iterdir())
    with pytest.raises(grpc.RpcError) as err:
        _raw_submit(federation, _zip(entries, links))
    assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert message in err.value.details()
    assert sorted(jobs_dir.iterdir()) == before
    assert not list((federation.workspace("server") / "tmp").iterdir())


def test_oversized_and_non_zip_uploads_are_refused(federation):
    with pytest.raises(grpc.RpcError) as err:
        _raw_submit(federation, b"this is not a zip")
    assert "not a zip archive" in err.value.details()
    # A zip bomb's header: an entry that declares 4 GiB (the server reads sizes before
    # extracting anything, and never extracts more than an entry declares).
    bomb = bytearray(_zip({"meta.json": META, "app/blob.bin": b"x"}))
    for signature, offset in ((b"PK\x03\x04", 22), (b"PK\x01\x02", 24)):
        at = bomb.rfind(signature)
        bomb[at + offset:at + offset + 4] = (0xFFFFFFF0).to_bytes(4, "little")
    huge = io.BytesIO(bytes(bomb))
    with pytest.raises(grpc.RpcError) as err:
        _raw_submit(federation, huge.getvalue())
    assert "larger than" in err.value.details()
    assert not list((federation.workspace("server") / "tmp").iterdir())


def test_client_refuses_symlinks_before_upload(federation, tmp_path):
    job = make_job(tmp_path / "linked")
    (job / "app" / "secret").symlink_to("/etc/hostname")
    with federation.session(ADMIN) as s, pytest.raises(Refused, match="symbolic link"):
        s.submit(job)


def test_an_invalid_meta_is_refused_with_every_problem_large_folder_or_small(federation,
                                                                              tmp_path):
    bad = {"name": "x", "min_clients": -3}  # and no deploy_map
    small = make_job(tmp_path / "small")
    large = make_job(tmp_path / "large")
    for job in (small, large):
        (job / "meta.json").write_text(json.dumps(bad))
    (large / "app" / "weights.bin").write_bytes(b"\0" * CHECK_BEFORE_UPLOAD)
    jobs_dir = federation.workspace("server") / "jobs"
    before = sorted(jobs_dir.iterdir())
    with federation.session(ADMIN) as s:
        with pytest.raises(Refused) as by_server:  # small: the server's check answers
            s.submit(small)
        with pytest.raises(SpecError) as here:  # large: checked here, nothing uploaded
            s.submit(large)
        with pytest.raises(Refused, match="not a job folder"):
            s.submit(tmp_path / "nowhere")
    for err in (str(by_server.value), str(here.value)):
        assert "2 problems" in err and "deploy_map" in err and "min_clients" in err
    assert str(large / "meta.json") in str(here.value)
    assert sorted(jobs_dir.iterdir()) == before


@pytest.fixture
def own_federation(tmp_path):
    fed = Federation.provisioned(tmp_path / "own", ["site-1", "site-2"], USERS)
    fed.start_all()
    fed.wait_online(ADMIN)
    yield fed
    fed.stop_all()


def test_killed_site_parent_takes_its_workers_along(own_federation, tmp_path):
    fed = own_federation
    with fed.session(ADMIN) as s:
        job_id = s.submit(make_job(tmp_path / "orphan", script=STALL))["job_id"]
        wait_for(lambda: _all_running(s, job_id), what="every worker running")
        fed.kill("site-1", signal.SIGKILL)
        wait_for(lambda: not [p for p in pids_with_env(f"ATOLL_JOB_ID={job_id}", sandboxes=True)
                               if b"ATOLL_SITE=site-1" in _environ(p)],
                  10, "site-1's worker gone")
        # its part waits for the site parent (supervision.rejoin_s; the return:
        # test_site_restart.py), visibly, and an abort still ends the job
        wait_for(lambda: "waiting up to 300 s for it to come back"
                 in s.status(job_id)["parts"]["site-1"]["reason"], 20, "site-1 awaited")
        s.abort(job_id)
        final = s.wait(job_id, timeout=60)
    assert final["state"] == "FINISHED:ABORTED"


def test_server_restart_keeps_records_and_sites_reconnect(own_federation, tmp_path):
    fed = own_federation
    with fed.session(ADMIN) as s:
        done = s.submit(make_job(tmp_path / "before"), wait=True, timeout=120)
        running = s.submit(make_job(tmp_path / "during", script=STALL))["job_id"]
        wait_for(lambda: _all_running(s, running), what="every worker running")
    job_dir = fed.workspace("server") / "jobs" / done["job_id"]
    files_before = sorted(p.relative_to(job_dir) for p in job_dir.rglob("*"))
    fed.kill("server", signal.SIGKILL)
    fed.start_server()
    fed.wait_online(ADMIN, timeout=30)  # the sites came back by themselves
    with fed.session(ADMIN) as s:
        assert s.status(done["job_id"])["state"] == "FINISHED:COMPLETED"
        # resumed with a new server worker, from round 1: no round had completed (its sites'
        # scripts still sleep; test_server_resume.py: jobs that go on to the end)
        wait_for(lambda: "restarted from round 1 after a server restart"
                 in str(s.status(running)["parts"]["server"]), 60, "the job resumed")
        s.abort(running)
        interrupted = s.wait(running, timeout=120)
        assert interrupted["state"] == "FINISHED:ABORTED", interrupted
        assert sorted(p.relative_to(job_dir) for p in job_dir.rglob("*")) == files_before
        wait_for(lambda: not pids_with_env(f"ATOLL_JOB_ID={running}", sandboxes=True), 20, "workers gone")
        again = s.submit(make_job(tmp_path / "after"), wait=True, timeout=120)
    assert again["state"] == "FINISHED:COMPLETED"


def _environ(pid: int) -> bytes:
    """A process's environment; empty once it is gone (it may exit between listing and
    reading: ESRCH or ENOENT)."""
    try:
        with open(f"/proc/{pid}/environ", "rb") as fh:
            return fh.read()
    except OSError:
        return b""
