"""A hostile server's identifiers against a real site parent (issue 32, item 1).

The site parent runs as its own process with its real kit; the server is a small hostile
Federation service in this test, serving the real server kit's certificate over mutual TLS (as
whoever holds the server's key could). It dispatches a job the submitter really signed, under
job ids, studies, app names, task ids, task names and rounds of its choosing, and replays a
signed job under a new id. Afterwards the site's ``local/`` and workspace must be as they were,
no crafted text may have run as a command, and no crafted task may have reached the job's
script.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import queue
import threading
import time
import zipfile
from pathlib import Path
from typing import Any

import grpc
import numpy as np
import pytest

from atoll.fl.model import Model
from atoll.fl.serde import encode
from atoll.pki.job_signature import sign_archive
from atoll.pki.kit import load_kit
from atoll.pki.tls import server_credentials
from atoll.wire import frames, rpc
from atoll.wire import messages as msg
from atoll.wire.grpc_setup import new_server
from atoll.wire.job_archive import zip_folder
from tests.integration.federation.harness import Federation, job_folder, wait_for

SITE, ADMIN = "site-1", "admin@consortium.org"
USERS = [{"name": ADMIN, "org": "consortium", "role": "project_admin"}]
STUDY = "default"
WAIT_S = 120  # an outer limit on one job's end; each wait returns at the event itself
TRAIN = ("import atoll.client as fl\nfl.init()\nwhile fl.is_running():\n"
         "    m = fl.receive()\n    if m is None:\n        break\n"
         "    fl.send(fl.Model(params=m.params, num_examples=1))\n")
APP_YAML = "site:\n  script: train.py\n"


class HostileServer:
    """The Federation service as a hostile server runs it: it sends what the test queues."""

    def __init__(self) -> None:
        self.commands: queue.Queue[msg.ServerCommand | None] = queue.Queue()
        self.zips: dict[str, Path] = {}  # job id -> the signed zip FetchJob serves
        self.tasks: dict[str, list[dict[str, Any]]] = {}  # job id -> task headers, in turn
        self.fetched: list[str] = []
        self.replies: list[dict[str, Any]] = []
        self.states: list[dict[str, Any]] = []
        self.connected = threading.Event()
        self._changed = threading.Condition()
        self._stream = 0  # the newest Connect: only it takes commands (a restarted site's old
        # stream may look active for a moment, and a command it took would be lost)

    # -- what the test does ----------------------------------------------------------------------
    def send(self, kind: str, body: Any) -> None:
        self.commands.put(msg.ServerCommand(**{kind: json.dumps(body)}))

    def dispatch(self, job_id: Any, zip_path: Path, meta: dict[str, Any], study: Any = STUDY,
                 name: str = "job") -> None:
        if isinstance(job_id, str):
            self.zips[job_id] = zip_path
        served = {**meta, "study": study, "submitter": ADMIN}
        self.send("dispatch", {"job_id": job_id, "name": name, "study": study, "meta": served})

    def final(self, job_id: str) -> dict[str, Any]:
        """The site's final state of the job, when it comes (WAIT_S at most)."""
        deadline = time.monotonic() + WAIT_S
        with self._changed:
            while True:
                for state in self.states:
                    if state.get("job_id") == job_id and str(state.get("state")).startswith(
                            "FINISHED:"):
                        return state
                left = deadline - time.monotonic()
                if left <= 0:
                    raise TimeoutError(f"no final state of {job_id!r}; got {self.states}")
                self._changed.wait(left)

    # -- the service -------------------------------------------------------------------------------
    def Connect(self, request_iterator, context):
        def read() -> None:
            with contextlib.suppress(grpc.RpcError):  # the site went away (a restart)
                for event in request_iterator:
                    if event.WhichOneof("kind") == "job_state":
                        with self._changed:
                            self.states.append(json.loads(event.job_state))
                            self._changed.notify_all()

        threading.Thread(target=read, daemon=True).start()
        with self._changed:
            self._stream += 1
            stream = self._stream
        yield msg.ServerCommand(welcome=json.dumps({"heartbeat_s": 5, "server_time": time.time()}))
        self.connected.set()
        while context.is_active() and stream == self._stream:
            try:
                command = self.commands.get(timeout=0.5)
            except queue.Empty:
                continue
            if stream != self._stream:  # a newer stream came meanwhile: it is the site's now
                self.commands.put(command)
                return
            if command is None:
                return
            yield command

    def FetchJob(self, request, context):
        self.fetched.append(request.job_id)
        path = self.zips[request.job_id]
        yield frames.header({"size": path.stat().st_size})
        yield from frames.file_frames(path)

    def PullTask(self, request, context):
        yield from self._task(request.job_id)

    def _task(self, job_id: str):
        pending = self.tasks.get(job_id) or []
        if not pending:
            yield frames.header({"end": True})
            return
        head = pending.pop(0)
        model = Model(params={"w": np.zeros(4, dtype=np.float32)}, num_examples=1)
        yield from frames.payload_frames(head, encode(model))

    def PushReply(self, request_iterator, context):
        head, chunks = frames.split(iter(request_iterator))
        for _ in chunks.frames():
            pass
        self.replies.append(head)
        return msg.Json(body="{}")

    def Tasks(self, request_iterator, context):
        """The same tasks on a site's task stream (site/task_stream.py)."""
        requests = iter(request_iterator)
        job_id = frames.read_header(next(requests))["job_id"]
        for raw in requests:
            head = frames.read_header(raw)
            if "reply" in head:  # its data: `bytes` of it, or up to {sent}
                got = 0
                while got < head.get("bytes", got + 1) and frames.is_data(raw := next(requests)):
                    got += len(raw)
                self.replies.append({**head["reply"], "job_id": job_id})
                yield frames.header({"ack": {}})
                if "pull" not in (head if "bytes" in head else frames.read_header(raw)):
                    continue
            sent = list(self._task(job_id))
            yield from sent
            if len(sent) == 1:  # {end}
                return
            yield frames.header({"done": True})

    def Report(self, request, context):
        return msg.Json(body="{}")


def _signed_job(root: Path, name: str, fed: Federation) -> tuple[Path, dict[str, Any]]:
    """A job the submitter really signed (as `atoll job submit` does), and its meta."""
    meta = {"name": name, "deploy_map": {"app": ["@ALL"]}}
    folder = job_folder(root / name, meta, APP_YAML, {"train.py": TRAIN})
    archive = zip_folder(folder, root / f"{name}.zip")
    sign_archive(archive, load_kit(fed.kit(ADMIN)), STUDY)
    return archive, meta


JOB_LOG = "workspace/jobs.log"  # the site's own record of what it refused (site/job_log.py)


def _snapshot(root: Path) -> dict[str, str]:
    """Every folder and file under ``root``: its kind, and a file's content digest; the site's
    job log is left out (it records each refusal: ``_refusals_logged`` checks that instead)."""
    seen = {}
    for folder, dirs, files in os.walk(root):
        for d in dirs:
            seen[str(Path(folder, d).relative_to(root))] = "dir"
        for f in files:
            path = Path(folder, f)
            seen[str(path.relative_to(root))] = (
                "link" if path.is_symlink() else hashlib.sha256(path.read_bytes()).hexdigest())
    seen.pop(JOB_LOG, None)
    return seen


def _log_lines(root: Path) -> list[dict]:
    path = root / JOB_LOG
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


@pytest.fixture(scope="module")
def fed(tmp_path_factory):
    fed = Federation.provisioned(tmp_path_factory.mktemp("hostile-ids"), [SITE], USERS)
    # The site runs approved code only: an attack that removed local/ would run unapproved code.
    policy = fed.kit(SITE) / "local" / "authorization.json"
    doc = json.loads(policy.read_text())
    policy.write_text(json.dumps({**doc, "code_approval": "required"}))
    yield fed
    fed.stop_all()


@pytest.fixture(scope="module")
def hostile(fed):
    """The hostile server on the real server's address, with the real server kit."""
    service = HostileServer()
    server = new_server()
    rpc.add_servicer(server, "Federation", service)
    kit = load_kit(fed.kit("server"))
    port = int(kit.server_address.rsplit(":", 1)[1])
    assert server.add_secure_port(f"127.0.0.1:{port}", server_credentials(kit)) == port
    server.start()
    fed.start_site(SITE)
    assert service.connected.wait(60), fed.log(SITE)
    yield service
    service.commands.put(None)
    server.stop(0)


@pytest.fixture(scope="module")
def signed(fed, tmp_path_factory):
    return _signed_job(tmp_path_factory.mktemp("signed"), "victim", fed)


def _approve(fed: Federation, root: Path, name: str) -> None:
    """The site operator approves the job folder (`atoll site approve`)."""
    import subprocess
    import sys

    done = subprocess.run([sys.executable, "-m", "atoll", "site", "approve", str(fed.kit(SITE)),
                           str(root / name)], capture_output=True, text=True, check=False)
    assert done.returncode == 0, done.stderr


def _sentinel(hostile: HostileServer, signed) -> None:
    """A dispatch the site refuses after every earlier command was handled (commands are
    handled in order): a valid id in a study this site does not map."""
    job_id = f"sentinel{time.monotonic_ns()}"
    hostile.dispatch(job_id, signed[0], signed[1], study="unmapped")
    assert "does not map study" in hostile.final(job_id)["reason"]


MARKER = "/tmp/atoll-hostile-ids-{}"  # a command that ran would create it

BAD_JOB_IDS = [
    "../../local", "..", ".", "../jobs", "a/b", "/tmp/atoll-abs", "x\n$(touch {m})",
    "$(touch {m})", "`touch {m}`", "x;touch {m}", "a\0b", "a b", "-rf", "x" * 65, "", 7, None,
    ["list"], {"a": 1}, "ü",
]


def test_job_ids_that_are_paths_or_commands_touch_nothing(fed, hostile, signed):
    marker = Path(MARKER.format(os.getpid()))
    before = _snapshot(fed.kit(SITE))
    for raw in BAD_JOB_IDS:
        job_id = raw.format(m=marker) if isinstance(raw, str) else raw
        hostile.dispatch(job_id, signed[0], signed[1])
        hostile.send("abort", {"job_id": job_id, "reason": "x"})
        hostile.send("end", {"job_id": job_id})
        hostile.send("forget", {"job_id": job_id})  # `..` would be the whole workspace
    hostile.send("dispatch", [])  # not even an object: ignored, the link lives on
    _sentinel(hostile, signed)
    for raw in BAD_JOB_IDS:
        if isinstance(raw, str):
            job_id = raw.format(m=marker)
            state = hostile.final(job_id)
            assert state["state"] == "FINISHED:FAILED"
            assert "is not a valid job id" in state["reason"], state
    assert _snapshot(fed.kit(SITE)) == before  # local/, startup/ and the workspace as they were
    # refused by the grammar before anything, the site's own job log included, saw them
    bad = {raw.format(m=marker) for raw in BAD_JOB_IDS if isinstance(raw, str)}
    assert not [line for line in _log_lines(fed.kit(SITE)) if line["job_id"] in bad]
    assert not marker.exists()
    assert not any(j for j in hostile.fetched if not j.startswith("sentinel")), hostile.fetched


@pytest.mark.parametrize(("field", "value", "refusal"), [
    ("study", "../../local", "is not a valid study name"),
    ("study", "default\n", "is not a valid study name"),
    ("study", "$(touch {m})", "is not a valid study name"),
    ("app", "../../local", "app name"),
    ("app", "/abs", "app name"),
    ("app", "app\n", "app name"),
])
def test_other_identifiers_of_a_dispatch_touch_nothing(fed, hostile, signed, field, value,
                                                        refusal):
    marker = Path(MARKER.format(os.getpid()))
    value = value.format(m=marker)
    before = _snapshot(fed.kit(SITE))
    job_id = f"{field}{time.monotonic_ns()}"
    meta = dict(signed[1])
    study = STUDY
    if field == "study":
        study = value
    else:
        meta["deploy_map"] = {value: ["@ALL"]}
    hostile.dispatch(job_id, signed[0], meta, study=study)
    state = hostile.final(job_id)
    assert state["state"] == "FINISHED:FAILED"
    assert refusal in state["reason"], state
    assert _snapshot(fed.kit(SITE)) == before
    assert not marker.exists()
    assert job_id not in hostile.fetched  # refused before the job was even fetched


@pytest.mark.parametrize(("head", "refusal"), [
    ({"task_id": "../../local", "topic": "train", "headers": {}}, "is not a valid task id"),
    ({"task_id": "t1", "topic": "../../x\n$(id)", "headers": {}}, "is not a valid task name"),
    ({"task_id": "t1", "topic": "train", "headers": {"round": "1; id"}},
     "is not a valid round number"),
    ({"task_id": "t1", "topic": "train", "headers": {"round": -1}}, "is not a valid round number"),
])
def test_task_ids_names_and_rounds_are_checked_before_the_job_sees_them(
        fed, hostile, tmp_path, head, refusal):
    name = f"task{time.monotonic_ns()}"
    archive, meta = _signed_job(tmp_path, name, fed)
    _approve(fed, tmp_path, name)
    job_id = f"{name}-id"
    hostile.tasks[job_id] = [head]
    hostile.dispatch(job_id, archive, meta)
    state = hostile.final(job_id)
    assert state["state"] == "FINISHED:FAILED", state
    assert refusal in state.get("reason", "") + state.get("log_tail", ""), state
    assert not [r for r in hostile.replies if r.get("job_id") == job_id]  # never reached train.py


def test_a_signed_job_replayed_under_a_new_id_is_refused_and_its_own_id_may_resume(
        fed, hostile, tmp_path):
    archive, meta = _signed_job(tmp_path, "replayed", fed)
    _approve(fed, tmp_path, "replayed")
    hostile.dispatch("first-run", archive, meta)
    assert hostile.final("first-run")["state"] == "FINISHED:COMPLETED", hostile.states
    run_folder = fed.workspace(SITE) / "jobs" / "first-run"
    assert (run_folder / "app" / "train.py").is_file()
    # the site reports the end, then puts the job's kept app and handoff folder away
    wait_for(lambda: not (fed.workspace(SITE) / "apps" / "first-run.zip").exists(), WAIT_S,
             "the site to put the ended job away")
    wait_for(lambda: not (run_folder / "handoff").exists(), WAIT_S, "the handoff folder to go")
    before = _snapshot(fed.kit(SITE))

    hostile.dispatch("second-run", archive, meta)  # the same signed statement, a new id
    state = hostile.final("second-run")
    assert state["state"] == "FINISHED:FAILED"
    assert "replay" in state["reason"] and "first-run" in state["reason"], state
    assert _snapshot(fed.kit(SITE)) == before  # no run folder, nothing removed

    # The record survives the site parent's restart.
    fed.kill(SITE)
    hostile.connected.clear()
    fed.start_site(SITE)
    assert hostile.connected.wait(60), fed.log(SITE)
    hostile.dispatch("third-run", archive, meta)
    assert "replay" in hostile.final("third-run")["reason"]

    # The same job under its own id again (a resume) runs.
    done = len(hostile.states)
    hostile.dispatch("first-run", archive, meta)
    deadline = time.monotonic() + WAIT_S
    while not any(s.get("job_id") == "first-run" and s["state"].startswith("FINISHED:")
                  for s in hostile.states[done:]):
        assert time.monotonic() < deadline, hostile.states
        time.sleep(0.1)
    resumed = [s for s in hostile.states[done:] if s.get("job_id") == "first-run"]
    assert resumed[-1]["state"] == "FINISHED:COMPLETED", resumed

    # What the submitter signs anew (the same folder) is a new statement: it runs.
    again = tmp_path / "again.zip"
    zip_folder(tmp_path / "replayed", again)
    sign_archive(again, load_kit(fed.kit(ADMIN)), STUDY)
    hostile.dispatch("fourth-run", again, meta)
    assert hostile.final("fourth-run")["state"] == "FINISHED:COMPLETED", hostile.states
    record = json.loads((fed.workspace(SITE) / "signed_jobs.json").read_text())
    ran = [v["job_id"] for v in record["jobs"].values()]
    assert ran.count("first-run") == ran.count("fourth-run") == 1, ran
    assert "second-run" not in ran and "third-run" not in ran, ran
    with zipfile.ZipFile(archive) as a, zipfile.ZipFile(again) as b:
        assert a.read(".atoll-signature.json") != b.read(".atoll-signature.json")
