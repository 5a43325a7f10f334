"""Hostile jobs on a real local federation (issue #19): two studies share a site.

Study alpha (the victim) and study beta (the attacker) are both mapped at the site ``shared``
(process launcher): alpha with a dataset and a secret, beta with its own. The site parent also
holds a secret of its own, and so does the server parent. Beta's lead submits one hostile job;
its site script and its server-side code (``server.initial_model``) run the same attacks
(hostile_job/attacks.py): first they watch /proc for another job's worker and race it for its
one-time token while an alpha job runs, then they try to read the parents' environments and
open files, other processes' environments, every key of the federation, the site's
study_runtime.yaml, alpha's dataset, alpha's job folders and the job store, and to write to the
store (adding beta's lead to alpha) and to the site's files. Each attempt is recorded in the
worker's run folder; every test below asserts one confinement on those records and on what the
federation shows afterwards. What the attacker got it also exfiltrates, as a job can: printed
to its log, written to its results, raised as its failure reason.

The confinement checked is the process launcher's, as configured by default. With
ATOLL_TEST_SANDBOX=none (or bwrap) the fixture writes ``process: {sandbox: <mode>}`` into every
parent's local/site.yaml instead. Without the confinement every test here fails: that was shown
by running this suite against the code before the sandbox (the attacks all succeed there). A
site with ``sandbox: none`` refuses to map two studies, so that mode cannot stage the
cross-study attacks at all: its parents refuse to start.
"""

from __future__ import annotations

import base64
import hashlib
from pathlib import Path

import pytest

from tests.security.hostile_scenario import (
    ALPHA_DATA,
    ALPHA_JOB_NOTE,
    BETA_DATA,
    BETA_SECRET,
    LEAD_A,
    LEAD_B,
    SIDES,
    SITE,
    Outcome,
    run_scenario,
    secret_needles,
    two_studies,
)


@pytest.fixture(scope="module")
def federation(tmp_path_factory):
    with two_studies(tmp_path_factory.mktemp("hostile")) as setup:
        yield setup


@pytest.fixture(scope="module")
def outcome(federation, tmp_path_factory) -> Outcome:
    return run_scenario(federation, tmp_path_factory.mktemp("jobs"))


# -- reading the records ---------------------------------------------------------------------------

def _entries(out: Outcome, attack: str, sides=SIDES) -> list[tuple[str, dict]]:
    return [(side, e) for side in sides for e in out.records[side]["attacks"].get(attack, [])]


def _got(out: Outcome, attack: str, sides=SIDES) -> list[str]:
    """What succeeded, by target and size (never the content: it may be secret)."""
    return [f"{side}: {e['target']} ({e['size']} bytes)"
            for side, e in _entries(out, attack, sides) if e["ok"]]


def _tried(out: Outcome, attack: str, sides=SIDES, at_least: int = 1) -> None:
    """The attack did run from each side (a blocked attack must not be one that never ran)."""
    for side in sides:
        n = len(out.records[side]["attacks"].get(attack, []))
        assert n >= at_least, f"{side} tried {attack} {n} times, expected {at_least}+"


def _data(entry: dict) -> bytes:
    return base64.b64decode(entry.get("data", ""))


# -- the tests -------------------------------------------------------------------------------------

def test_the_victim_study_job_completes(outcome):
    """Nobody took alpha's workers' tokens (registered first) or stopped them."""
    victim = outcome.victim
    assert victim["state"] == "FINISHED:COMPLETED", (victim["reason"], victim["parts"])
    assert {p: v["state"] for p, v in victim["parts"].items()} == {
        "server": "FINISHED:COMPLETED", SITE: "FINISHED:COMPLETED"}


def test_another_jobs_token_is_never_found_nor_accepted(outcome):
    # Each side scanned /proc all along the victim's run (from before its submission until
    # after it ended), several times a second.
    for side in SIDES:
        passes = [int(_data(e)) for _, e in _entries(outcome, "hunt_passes", (side,))]
        assert passes and passes[0] >= 3, f"{side} barely hunted: {passes}"
    assert _got(outcome, "foreign_token") == []
    assert _got(outcome, "stop_victim") == []
    assert _got(outcome, "register_foreign") == []


def test_the_parents_environment_is_out_of_reach(outcome):
    _tried(outcome, "parent_environ", at_least=2)  # the site parent and the server parent
    assert _got(outcome, "parent_environ") == []


def test_the_parents_cannot_be_signalled_or_looked_into(outcome):
    """Signal 0 (may I signal it?), its open files, its root and working folder via /proc."""
    _tried(outcome, "parent_signal", at_least=2)
    _tried(outcome, "parent_files", at_least=2)
    assert _got(outcome, "parent_signal") == []
    assert _got(outcome, "parent_files") == []


def test_other_processes_environments_give_the_job_nothing(outcome):
    """Whatever /proc shows the job (its own sandbox at most) holds no secret, no token of
    another job, and nothing of the parents."""
    leaks = []
    for side, entry in _entries(outcome, "proc_environ"):
        data = _data(entry)
        leaks += [f"{side}: {what} in {entry['target']}"
                  for what, needle in secret_needles().items() if needle in data]
        env = dict(item.split(b"=", 1) for item in data.split(b"\0") if b"=" in item)
        if b"ATOLL_JOB_TOKEN" in env and env.get(b"ATOLL_JOB_ID") != outcome.hostile_id.encode():
            leaks.append(f"{side}: another job's token in {entry['target']}")
        if b"SITE_BACKUP_PASSWORD" in env or b"SERVER_SMTP_PASSWORD" in env:
            leaks.append(f"{side}: a parent's environment in {entry['target']}")
    assert leaks == []


def test_no_key_is_in_reach_and_every_key_is_unchanged(outcome):
    keys = [k for k in outcome.files_before if k.endswith(".key")]
    assert len(keys) >= 6  # CA, server, site, three users, session
    _tried(outcome, "keys_read", at_least=len(keys))
    assert _got(outcome, "keys_read") == []
    assert _got(outcome, "keys_write") == []
    assert {k: outcome.files_after.get(k) for k in keys} == {
        k: outcome.files_before[k] for k in keys}


def test_the_study_runtime_file_is_out_of_reach(outcome):
    _tried(outcome, "local_read", at_least=3)
    _tried(outcome, "local_write")
    assert _got(outcome, "local_read") == []
    assert _got(outcome, "local_write") == []
    local = [k for k in outcome.files_before if k.endswith(".yaml")]
    assert f"{SITE}/local/study_runtime.yaml" in local
    assert {k: outcome.files_after.get(k) for k in local} == {
        k: outcome.files_before[k] for k in local}


def test_another_study_dataset_is_out_of_reach_the_own_one_is_there(outcome):
    _tried(outcome, "victim_dataset", at_least=4)
    assert _got(outcome, "victim_dataset") == []
    leaks = [f"{side}: {e['target']}" for side, e in _entries(outcome, "victim_dataset")
             if ALPHA_DATA.encode() in _data(e)]
    assert leaks == []
    # Beta's own dataset and secret did arrive at its site script: the job was not just broken.
    own = [_data(e) for _, e in _entries(outcome, "own_dataset", ("site",)) if e["ok"]]
    assert own == [BETA_DATA.encode()]
    secret = [_data(e) for _, e in _entries(outcome, "own_secret", ("site",)) if e["ok"]]
    assert secret == [hashlib.sha256(BETA_SECRET.encode()).hexdigest().encode()]


def _on_the_way(own: Path, folder: Path) -> set[str]:
    """What a listing of `folder` may show: the next step towards the job's own run folder."""
    return {own.relative_to(folder).parts[0]} if own.is_relative_to(folder) and own != folder \
        else set()


def test_other_jobs_folders_and_the_parents_workspaces_are_out_of_reach(outcome):
    """Alpha's job folders (at the site, at the server), even by id (the attackers learn it),
    and in the parents' workspaces nothing but the way to the job's own run folder."""
    _tried(outcome, "workspaces", at_least=6)
    _tried(outcome, "job_folders", at_least=4)
    assert _got(outcome, "job_folders") == []
    too_much, leaks = [], []
    for side, e in _entries(outcome, "workspaces"):
        names = set(_data(e).decode(errors="replace").split("\n")) - {"(empty)"}
        extra = names - _on_the_way(outcome.run_dirs[side], Path(e["target"]))
        if e["ok"] and extra:
            too_much.append(f"{side}: {e['target']} shows {len(extra)} more entries")
    assert too_much == []
    for side, e in [*_entries(outcome, "workspaces"), *_entries(outcome, "job_folders")]:
        if outcome.victim_id.encode() in _data(e) or ALPHA_JOB_NOTE.encode() in _data(e):
            leaks.append(f"{side}: {e['target']}")
    assert leaks == []
    # The control: each side did write and read its own run folder.
    assert len(_got(outcome, "own_run_folder")) == 2


def test_the_job_store_cannot_be_read(outcome):
    _tried(outcome, "store_read", at_least=2)
    assert _got(outcome, "store_read") == []


def test_the_job_store_cannot_be_written(outcome):
    """Beta's code tried to add its submitter to alpha's members, as in the issue."""
    _tried(outcome, "store_write")
    assert _got(outcome, "store_write") == []
    assert LEAD_B not in outcome.alpha_users_after
    assert outcome.alpha_users_after == outcome.alpha_users_before == [LEAD_A]
    assert outcome.intruder_login.startswith("refused: lead@beta.org is not a member")


def test_nothing_secret_reaches_job_logs_status_or_download(outcome):
    needles = dict(secret_needles())
    for name, fragments in outcome.key_needles.items():
        for i, fragment in enumerate(fragments):
            needles[f"key {name} (fragment {i})"] = fragment
    assert len(outcome.key_needles) >= 6 and all(outcome.key_needles.values())
    leaks = []
    for job, channels in outcome.seen.items():
        wanted = dict(needles)
        if job == "hostile":  # even the name of another study's job must not reach beta
            wanted["alpha's job id"] = outcome.victim_id.encode()
        for channel, seen in channels.items():
            leaks += [f"{job} {channel}: {what}" for what, n in wanted.items() if n in seen]
    assert leaks == []
    # The channels were read: the hostile job's log holds its attack lines.
    assert b"ATTACK site.keys_read" in outcome.seen["hostile"]["logs"]
    assert b"ATTACK server.keys_read" in outcome.seen["hostile"]["logs"]

