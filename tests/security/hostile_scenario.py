"""The scenario of tests/security/test_hostile_jobs.py: two studies sharing a site, a hostile
job of beta running its attacks (hostile_job/) while a job of alpha runs, and everything the
federation shows afterwards, gathered once per module."""

from __future__ import annotations

import base64
import contextlib
import hashlib
import json
import os
import secrets
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from atoll.admin.errors import Refused
from tests.integration.federation.harness import Federation, job_folder

SITE = "shared"
ADMIN, LEAD_A, LEAD_B = "admin@consortium.org", "lead@alpha.org", "lead@beta.org"
USERS = [
    {"name": ADMIN, "org": "consortium", "role": "project_admin"},
    {"name": LEAD_A, "org": "alpha-org", "role": "lead"},
    {"name": LEAD_B, "org": "beta-org", "role": "lead"},
]
STUDIES = {
    "alpha": {"sites": [SITE], "admins": [LEAD_A]},
    "beta": {"sites": [SITE], "admins": [LEAD_B]},
}
_RUN = secrets.token_hex(6)  # fresh values per run: nothing else can hold them by chance
ALPHA_SECRET = f"alpha-db-password-{_RUN}"
BETA_SECRET = f"beta-api-key-{_RUN}"
SITE_SECRET = f"site-backup-password-{_RUN}"
SERVER_SECRET = f"server-smtp-password-{_RUN}"
ALPHA_DATA = f"alpha-patient-record-{_RUN}"
BETA_DATA = f"beta-record-{_RUN}"
ALPHA_JOB_NOTE = f"alpha-job-internal-note-{_RUN}"
SITE_ENV = {"ALPHA_DB_PASSWORD": ALPHA_SECRET, "BETA_API_KEY": BETA_SECRET,
            "SITE_BACKUP_PASSWORD": SITE_SECRET}
SERVER_ENV = {"SERVER_SMTP_PASSWORD": SERVER_SECRET}
SANDBOX = os.environ.get("ATOLL_TEST_SANDBOX", "")  # "": the default; "bwrap" or "none"
SIDES = ("site", "server")
HUNT_S = 240  # the attackers' own limit; the test stops them long before
HOSTILE_APP = Path(__file__).with_name("hostile_job")

RUNTIME = """format_version: 2
studies:
  alpha:
    datasets:
      records: {{source: {alpha}, mode: ro}}
    secret_env:
      DB_PASSWORD: {{source: env, key: ALPHA_DB_PASSWORD}}
  beta:
    datasets:
      own: {{source: {beta}, mode: ro}}
    secret_env:
      API_KEY: {{source: env, key: BETA_API_KEY}}
"""

HOSTILE_APP_YAML = """server:
  workflow: scatter_gather
  args: {num_rounds: 1}
  initial_model: model.py:make
site:
  script: train.py
"""
VICTIM_APP_YAML = "server:\n  workflow: scatter_gather\n  args: {num_rounds: 1}\n" \
                  "site:\n  script: train.py\n"

# Alpha's ordinary job: its secret and dataset arrive (checked without printing them), its
# worker lives a while (the attackers scan /proc meanwhile), one round.
VICTIM_SCRIPT = f'''
import hashlib
import os
import time

import atoll.client as fl

got = hashlib.sha256(os.environ["DB_PASSWORD"].encode()).hexdigest()
assert got == "{hashlib.sha256(ALPHA_SECRET.encode()).hexdigest()}", "alpha's secret is wrong"
data = (fl.dataset_path("records") / "records.csv").read_bytes()
assert hashlib.sha256(data).hexdigest() == "{hashlib.sha256(ALPHA_DATA.encode()).hexdigest()}"
time.sleep(1.0)
fl.init()
while fl.is_running():
    model = fl.receive()
    if model is None:
        break
    fl.send(fl.Model(params=model.params, num_examples=1, metrics={{"ok": 1.0}}))
'''

TERMINAL = ("FINISHED:COMPLETED", "FINISHED:FAILED", "FINISHED:ABORTED")


@dataclass
class Setup:
    fed: Federation
    alpha_data: Path
    pids: dict[str, int]


@dataclass
class Outcome:
    hostile_id: str
    victim_id: str
    victim: dict[str, Any]
    hostile: dict[str, Any]
    records: dict[str, dict[str, Any]]
    run_dirs: dict[str, Path]
    seen: dict[str, dict[str, bytes]] = field(default_factory=dict)  # job -> channel -> bytes
    files_before: dict[str, str] = field(default_factory=dict)
    files_after: dict[str, str] = field(default_factory=dict)
    alpha_users_before: list[str] = field(default_factory=list)
    alpha_users_after: list[str] = field(default_factory=list)
    intruder_login: str = ""
    key_needles: dict[str, list[bytes]] = field(default_factory=dict)


def _confine(kit: Path) -> None:
    if SANDBOX:
        site_yaml = kit / "local" / "site.yaml"
        site_yaml.write_text(site_yaml.read_text() + f"\nprocess: {{sandbox: {SANDBOX}}}\n")


@contextlib.contextmanager
def two_studies(base: Path) -> Iterator[Setup]:
    """The federation: a server and the site both studies share, as separate processes."""
    alpha_data, beta_data = base / "alpha-data", base / "beta-data"
    alpha_data.mkdir()
    beta_data.mkdir()
    (alpha_data / "records.csv").write_text(ALPHA_DATA)
    (beta_data / "records.csv").write_text(BETA_DATA)
    fed = Federation.provisioned(base / "kits", [SITE], USERS, STUDIES,
                                 runtime={SITE: RUNTIME.format(alpha=alpha_data, beta=beta_data)})
    for kit in (SITE, "server"):
        _confine(fed.kit(kit))
    try:
        fed.start_server(env=SERVER_ENV)
        fed.start_site(SITE, env=SITE_ENV)
        fed.wait_online(ADMIN)
        pids = {"site": _pid(fed, SITE), "server": _pid(fed, "server")}
        yield Setup(fed, alpha_data, pids)
    finally:
        fed.stop_all()


def _pid(fed: Federation, name: str) -> int:
    return int(json.loads((fed.root / f"{name}.ready").read_text())["pid"])


def _targets(s: Setup) -> dict[str, Any]:
    """What the attackers aim at (a real one would guess these paths and pids)."""
    fed, site_local = s.fed, s.fed.kit(SITE) / "local"
    return {
        "fed_root": str(fed.root),
        "parents": s.pids,
        "keys": sorted(str(p) for p in fed.root.rglob("*.key")),
        "store": str(fed.workspace("server") / "atoll.db"),
        "local_files": [str(site_local / "study_runtime.yaml"), str(site_local / "site.yaml"),
                        str(fed.kit("server") / "local" / "site.yaml")],
        "study_runtime": str(site_local / "study_runtime.yaml"),
        "victim_datasets": [str(s.alpha_data), "/data/alpha/records"],
        "victim_data_files": [str(s.alpha_data / "records.csv"),
                              "/data/alpha/records/records.csv"],
        "workspace_dirs": [str(fed.workspace(p) / sub) for p in (SITE, "server")
                           for sub in ("", "jobs", "tmp")],
        "job_dirs": [str(fed.workspace(SITE) / "jobs"), str(fed.workspace("server") / "jobs")],
        "victim_job_files": [str(fed.workspace(SITE) / "jobs" / "{victim}" / "app" / "notes.txt"),
                             str(fed.workspace("server") / "jobs" / "{victim}" / "job" / "app"
                                 / "notes.txt")],
        "victim_study": "alpha",
        "intruder": LEAD_B,
        "runner_env": sorted(os.environ),
        "hunt_s": HUNT_S,
    }


def _hostile_job(path: Path, targets: dict[str, Any]) -> Path:
    files = {p.name: p.read_text() for p in sorted(HOSTILE_APP.glob("*.py"))}
    files["targets.json"] = json.dumps(targets, indent=1)
    return job_folder(path, {"name": "beta-hostile", "deploy_map": {"app": ["@ALL"]}},
                      HOSTILE_APP_YAML, files)


def _victim_job(path: Path) -> Path:
    return job_folder(path, {"name": "alpha-victim", "deploy_map": {"app": ["@ALL"]}},
                      VICTIM_APP_YAML, {"train.py": VICTIM_SCRIPT, "notes.txt": ALPHA_JOB_NOTE})


def _hashes(fed: Federation) -> dict[str, str]:
    """The kits' keys (the server's session key too) and the site-owned files."""
    paths = [*fed.root.rglob("*.key"), *fed.root.glob("*/local/*.yaml")]
    return {str(p.relative_to(fed.root)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(paths)}


def _key_needles(fed: Federation) -> dict[str, list[bytes]]:
    """Fragments of every key that must never show: the base64 lines of a PEM key but those
    every key of its kind shares (the algorithm header), the raw bytes of a binary key."""
    bodies: dict[str, list[bytes]] = {}
    for path in sorted(fed.root.rglob("*.key")):
        data, name = path.read_bytes(), str(path.relative_to(fed.root))
        if data.startswith(b"-----BEGIN"):
            bodies[name] = [line.strip() for line in data.splitlines()
                            if line.strip() and not line.startswith(b"-----")]
        else:
            bodies[name] = [data, data.hex().encode(), base64.b64encode(data)]
    seen: dict[bytes, int] = {}
    for lines in bodies.values():
        for line in set(lines):
            seen[line] = seen.get(line, 0) + 1
    return {name: [ln for ln in lines if seen[ln] == 1 and len(ln) >= 24]
            for name, lines in bodies.items()}


def _alpha_users(fed: Federation) -> list[str]:
    with fed.session(ADMIN) as s:
        studies = {x["name"]: x for x in s.call("study_list")["studies"]}
    return sorted(studies["alpha"]["users"])


def _wait_for_hunters(fed: Federation, beta, job_id: str, run_dirs: dict[str, Path]) -> None:
    deadline = time.monotonic() + 120
    while not all((d / f"hunting-{side}").exists() for side, d in run_dirs.items()):
        status = beta.status(job_id)
        if status["state"] in TERMINAL or time.monotonic() > deadline:
            pytest.fail(f"the hostile job never started its attacks: {status['state']} "
                        f"{status['reason']} {json.dumps(status['parts'])[:2000]}\n"
                        f"site parent: {fed.log(SITE)[-1500:]}")
        time.sleep(0.2)


def _channels(session, job_id: str, dest: Path) -> dict[str, bytes]:
    """Everything a study admin gets to see of a job: status, logs and the download."""
    logs = session.logs(job_id)
    folder = session.download(job_id, dest)
    files = b"\n".join(p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file())
    return {"status": json.dumps(session.status(job_id)).encode(),
            "logs": "\n".join(logs["logs"].values()).encode() + json.dumps(logs["events"]).encode(),
            "download": files}


def run_scenario(setup: Setup, jobs: Path) -> Outcome:
    """The hostile job runs its attacks while an alpha job runs; then everything is gathered."""
    fed = setup.fed
    files_before, users_before = _hashes(fed), _alpha_users(fed)
    key_needles = _key_needles(fed)
    with fed.session(LEAD_B, study="beta") as beta, fed.session(LEAD_A, study="alpha") as alpha:
        hostile_id = beta.submit(_hostile_job(jobs / "hostile", _targets(setup)))["job_id"]
        run_dirs = {"site": fed.workspace(SITE) / "jobs" / hostile_id,
                    "server": fed.workspace("server") / "jobs" / hostile_id / "run" / "server"}
        _wait_for_hunters(fed, beta, hostile_id, run_dirs)
        victim_id = ""
        try:
            victim_id = alpha.submit(_victim_job(jobs / "victim"))["job_id"]
            victim = alpha.wait(victim_id, timeout=150)
        finally:  # the attackers hunt until told to stop; they learn alpha's job id then
            for d in run_dirs.values():
                (d / "stop").write_text(victim_id)
        hostile = beta.wait(hostile_id, timeout=150)
        records = {}
        for side, d in run_dirs.items():
            path = d / f"attacks-{side}.json"
            if not path.exists():
                pytest.fail(f"the hostile job's {side} code left no record: {hostile['state']} "
                            f"{hostile['reason']} {json.dumps(hostile['parts'])[:2000]}")
            records[side] = json.loads(path.read_text())
        seen = {"hostile": _channels(beta, hostile_id, jobs / "out-beta"),
                "victim": _channels(alpha, victim_id, jobs / "out-alpha")}
    try:
        fed.session(LEAD_B, study="alpha").close()
        intruder = "logged in"
    except Refused as exc:
        intruder = f"refused: {exc}"
    return Outcome(hostile_id, victim_id, victim, hostile, records, run_dirs, seen, files_before,
                   _hashes(fed), users_before, _alpha_users(fed), intruder, key_needles)


def secret_needles() -> dict[str, bytes]:
    return {"alpha's secret": ALPHA_SECRET.encode(), "the site's own secret": SITE_SECRET.encode(),
            "the server's secret": SERVER_SECRET.encode(), "alpha's dataset": ALPHA_DATA.encode(),
            "alpha's job files": ALPHA_JOB_NOTE.encode()}
