"""Job code plants links in its run folder; its parents must never read through them.

A real federation (process launcher). The parents start with a marker secret in their
environment. The job's code swaps what its parents read back for links:
- site-1's script: ``logs/worker.log`` -> ``/proc/<site parent>/environ``, then it fails;
- site-2's script: ``logs/worker.log`` -> the site's ``startup/client.key``, and ``app.zip`` -> the
  same key, then it asks its parent for the app again (FetchApp) and keeps what came back;
- the server's initial_model code: ``logs/worker.log`` -> ``/proc/<server parent>/environ``, and
  in ``results/``: links to the server's key, its environment and ``/``, and a hard link to the key.
The links point at what the parent can read and the job must not get: where a sandbox hides the
parent's /proc or kit from the job, the link is still made, and only the parent would follow it.
"""

from __future__ import annotations

import json
import stat
import zipfile
from pathlib import Path

import pytest

from tests.integration.federation.harness import Federation, job_folder

ADMIN = "admin@test.org"
USERS = [{"name": ADMIN, "org": "test", "role": "project_admin"}]
MARKER = "marker-5b1e9c0d7a-parent-only"
ENV = {"ATOLL_TEST_PARENT_SECRET": MARKER}
FORBIDDEN = (MARKER, "PRIVATE KEY")

SITE_SCRIPT = '''
import os
import pathlib

import atoll.client as fl
from atoll.fl import client_runtime
from atoll.wire import frames
from atoll.wire import messages as msg

KEYS = KEYS_HERE
PARENTS = PARENTS_HERE  # a sandboxed worker has no ATOLL_PARENT_PID; a guess would do as well

fl.init()
site = fl.site_name()
work = pathlib.Path(os.environ["ATOLL_WORKDIR"])
log = work / "logs" / "worker.log"
log.unlink()
if site == "site-1":
    log.symlink_to(f"/proc/{PARENTS[site]}/environ")
    print("site-1: the log is now a link to the parent's environment", flush=True)
    raise RuntimeError("site-1 planted a link and stops here")
log.symlink_to(KEYS[site])
app = work / "app.zip"
app.unlink(missing_ok=True)
app.symlink_to(KEYS[site])
channel = client_runtime.current().channel
try:
    stream = channel.stub.FetchApp(msg.Json(body="{}"), metadata=channel.metadata)
    _, chunks = frames.split(iter(stream))
    fetched = b"".join(bytes(c) for c in chunks)
except Exception as exc:
    fetched = f"refused: {exc}".encode()
(work / "fetched.bin").write_bytes(fetched)  # the test reads it there
while fl.is_running():
    model = fl.receive()
    if model is None:
        break
    fl.send(fl.Model(params=model.params, num_examples=1))
'''

INITIAL_MODEL = '''
import os
import pathlib

import numpy as np

KEY = KEY_HERE
PARENT = PARENT_HERE


def make():
    work = pathlib.Path(os.environ["ATOLL_WORKDIR"])
    environ = f"/proc/{PARENT}/environ"
    results = work / "results"
    results.mkdir(exist_ok=True)
    (results / "environ.txt").symlink_to(environ)
    (results / "server.key").symlink_to(KEY)
    (results / "root").symlink_to("/")
    try:
        os.link(KEY, results / "hard.key")
    except OSError:  # a sandbox that hides the key: the links above still stand
        pass
    log = work / "logs" / "worker.log"
    log.unlink()
    log.symlink_to(environ)
    return {"payload": np.arange(16, dtype=np.uint8)}
'''


@pytest.fixture(scope="module")
def fed(tmp_path_factory):
    fed = Federation.provisioned(tmp_path_factory.mktemp("links"), ["site-1", "site-2"], USERS)
    fed.start_server(env=ENV)
    for site in fed.sites:
        fed.start_site(site, env=ENV)
    fed.wait_online(ADMIN)
    yield fed
    fed.stop_all()


def _job(fed: Federation, tmp: Path) -> Path:
    keys = {s: str(fed.kit(s) / "startup" / "client.key") for s in fed.sites}
    pids = {s: fed.procs[s].pid for s in fed.sites}  # `atoll site start` execs the parent
    script = SITE_SCRIPT.replace("KEYS_HERE", repr(keys)).replace("PARENTS_HERE", repr(pids))
    model = (INITIAL_MODEL.replace("KEY_HERE", repr(str(fed.kit("server") / "startup" /
                                                        "server.key")))
             .replace("PARENT_HERE", str(fed.procs["server"].pid)))
    app_yaml = ("server:\n  workflow: scatter_gather\n  initial_model: model.py:make\n"
                "  args: {num_rounds: 1, min_clients: 1, round_timeout: 60}\n"
                "site:\n  script: train.py\n")
    return job_folder(tmp / "planting", {"name": "planting", "deploy_map": {"app": ["@ALL"]}},
                      app_yaml, {"train.py": script, "model.py": model})


def _clean(what: str, text: str | bytes) -> None:
    data = text.encode() if isinstance(text, str) else text
    for secret in FORBIDDEN:
        assert secret.encode() not in data, f"{what} holds {secret!r}"


def test_parents_never_read_through_links_a_job_planted(fed, tmp_path):
    keys = [(fed.kit(n) / "startup" / k).read_bytes() for n, k in
            [("server", "server.key"), ("site-1", "client.key"), ("site-2", "client.key")]]
    with fed.session(ADMIN) as s:
        job = s.submit(_job(fed, tmp_path), wait=True, timeout=180)
        job_id = job["job_id"]
        status = s.status(job_id)
        logs = s.logs(job_id)
        folder = s.download(job_id, tmp_path / "download")

    # The job ends, with reasons that say what happened.
    assert status["state"] == "FINISHED:COMPLETED", json.dumps(status, indent=1)
    assert "site-1 planted a link and stops here" in status["parts"]["site-1"]["reason"]
    assert "site-1" in status["reason"]
    assert status["parts"]["site-2"]["state"] == "FINISHED:COMPLETED", status
    for name in fed.procs:
        assert fed.procs[name].poll() is None, f"{name} parent died:\n{fed.log(name)}"

    # Nothing the parents own came back: not in status, logs, download or FetchApp.
    _clean("the job's status", json.dumps(status))
    _clean("the job's logs", json.dumps(logs))
    for name, body in logs["logs"].items():
        assert "symbolic link" in body, f"{name}'s log says nothing of the link: {body!r}"
    files = sorted(p for p in folder.rglob("*") if p.is_file())
    names = {p.relative_to(folder).as_posix() for p in files}
    assert "results/scatter_gather.json" in names, names
    for path in files:
        data = path.read_bytes()
        _clean(f"download {path.name}", data)
        assert not any(key in data for key in keys), f"download {path.name} holds a key"
    skipped = (folder / "skipped.txt").read_text()
    for name in ("run/server/results/environ.txt", "run/server/results/server.key",
                 "run/server/results/root"):
        assert name in skipped, skipped
    fetched_file = fed.workspace("site-2") / "jobs" / job_id / "fetched.bin"
    fetched = fetched_file.read_bytes()
    _clean("what FetchApp sent the job", fetched)
    assert fetched.startswith(b"PK"), fetched[:200]  # the job's own app, nothing else
    with zipfile.ZipFile(fetched_file) as app:
        assert "app/train.py" in app.namelist()

    # The log tails the server keeps are its own files, 0600.
    tails = fed.workspace("server") / "jobs" / job_id / "logs"
    for tail in tails.iterdir():
        assert stat.S_IMODE(tail.lstat().st_mode) == 0o600, tail
        _clean(f"stored tail {tail.name}", tail.read_bytes())
