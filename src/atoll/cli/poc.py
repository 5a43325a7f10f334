"""`atoll poc up|down`: a whole federation on this machine, as separate processes, with mTLS.

The workspace keeps its state between calls: `up` provisions once, then restarts the same kits
and job store; `up --reset` starts afresh; `down` leaves no process of the workspace behind."""

from __future__ import annotations

import os
import socket
import time
from pathlib import Path

import click

from atoll.cli.common import (
    atoll_home,
    emit,
    fail,
    format_option,
    handle_errors,
    printable,
    save_session,
    saved_session,
)

ADMIN = "admin@poc.local"


def default_workspace() -> Path:
    return Path(os.environ.get("ATOLL_POC_WORKSPACE", atoll_home() / "poc"))


workspace_option = click.option(
    "--workspace", type=click.Path(file_okay=False, path_type=Path), default=None,
    help="Where the project, kits and state live (default: $ATOLL_POC_WORKSPACE or ~/.atoll/poc).")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def poc_project(sites: int, port: int) -> dict:
    return {
        "name": "poc",
        "server": {"name": "server", "host": "127.0.0.1", "port": port},
        "sites": [{"name": f"site-{i}", "org": f"org-{i}"} for i in range(1, sites + 1)],
        "users": [{"name": ADMIN, "org": "poc", "role": "project_admin"}],
    }


def provision_poc(n_sites: int, workspace: Path) -> dict[str, Path]:
    """Provision the local federation's kits into ``workspace``; returns them by name.

    Each site's provisioned study_runtime.yaml already takes the default study's jobs, and
    provision recorded every local/ as checked, so the parents start without checking it again:
    keep it that way (editing local/ here would void the record).
    """
    from atoll.parent.local_config import record_kits
    from atoll.pki.project import parse_project
    from atoll.pki.provision import provision

    provision(parse_project(poc_project(n_sites, _free_port()), "poc"), workspace, force=True)
    record_kits(workspace / "poc")
    return kits(workspace)


def kits(workspace: Path) -> dict[str, Path]:
    root = workspace / "poc"
    out = {"server": root / "server", "admin": root / ADMIN}
    for path in sorted(root.glob("site-*")):
        out[path.name] = path
    return out


@click.group("poc")
def poc_group() -> None:
    """A local federation for trying atoll: one server, N sites, one admin."""


@poc_group.command("up")
@click.option("--sites", "n_sites", type=click.IntRange(1, 64), default=None,
              help="Sites of a new federation [default: 2]; an existing one keeps its own.")
@click.option("--reset", is_flag=True,
              help="Start afresh: stop what runs, delete the workspace's kits, jobs and results, "
                   "provision a new federation.")
@workspace_option
@format_option
@handle_errors
def up(n_sites: int | None, reset: bool, workspace: Path | None, fmt: str) -> None:
    """Start the local federation; log the admin in.

    The first call provisions it (a CA, kits, an empty job store) into the workspace; later
    calls restart that same federation, with its kits and its job history. --reset starts
    afresh. A parent of the workspace left running (say after the server crashed) is stopped
    first; a federation whose server runs is left alone."""
    from atoll.admin.session import Session
    from atoll.parent import detach, pidfile

    started = time.monotonic()
    workspace = (workspace or default_workspace()).resolve()
    existing = (workspace / "poc" / "server").is_dir()
    if existing and not reset:
        if pidfile.read_pid(kits(workspace)["server"] / "workspace", "server"):
            fail(f"a federation already runs in {workspace}; `atoll poc down` first")
        have = len([n for n in kits(workspace) if n.startswith("site-")])
        if n_sites is not None and n_sites != have:
            fail(f"the federation in {workspace} has {have} site(s); `atoll poc up --reset "
                 f"--sites {n_sites}` replaces it with a new one (its jobs are deleted)")
    leftovers = _stop_all(workspace)
    if existing and reset:
        import shutil

        shutil.rmtree(workspace / "poc")
    if not existing or reset:
        found = provision_poc(n_sites or 2, workspace)
        how = "provisioned"
    else:
        found = kits(workspace)
        how = "restarted" + (f" (stopped {leftovers} parent(s) left running)" if leftovers else "")
    sites = [n for n in found if n.startswith("site-")]
    roles = [("server", found["server"])] + [("site", found[n]) for n in sites]
    try:
        detach.start_many([(role, kit, kit / "workspace")
                           for role, kit in roles])
        with Session(found["admin"]) as session:
            deadline = time.monotonic() + 30
            while True:
                online = [s for s in session.sites()["sites"] if s["online"]]
                if len(online) == len(sites):
                    break
                if time.monotonic() > deadline:
                    fail(f"only {len(online)} of {len(sites)} sites connected within 30 s; see "
                         f"{workspace}/poc/*/workspace/*.log", 3)
                time.sleep(0.02)
            answer = session.login("default")
            jobs = len(session.list_jobs())
    except RuntimeError as exc:
        _stop_all(workspace)  # never half a federation
        fail(str(exc), 3)
    save_session({"kit": str(found["admin"]), "study": "default", "token": answer["token"],
                  "user": ADMIN})
    seconds = time.monotonic() - started
    emit({"workspace": str(workspace), "sites": sites, "how": how, "jobs_kept": jobs,
          "admin_kit": str(found["admin"]), "user": ADMIN, "study": "default",
          "seconds": round(seconds, 2)}, fmt,
         f"federation up in {seconds:.2f} s ({how}): server + {len(sites)} sites in "
         f"{printable(workspace)}" + (f"; {jobs} job(s) kept" if jobs else "") + "\n"
         f"admin kit: {printable(found['admin'])} (logged in; session in "
         f"{printable(atoll_home())})\n"
         "try:\n  atoll job init myjob\n  atoll job submit myjob --wait\n  atoll poc down")


def _stop_all(workspace: Path) -> int:
    """Stop every parent of the workspace: those its pid files name, then any other atoll
    process found under it (an orphan of a crash, one whose pid file was lost). How many."""
    from atoll.parent import detach

    stopped = 0
    if (workspace / "poc").is_dir():
        found = kits(workspace)
        for name, kit in found.items():
            if name.startswith("site-"):
                stopped += detach.stop(kit / "workspace", "site")
        stopped += detach.stop(found["server"] / "workspace", "server")
    rest = detach.processes_under(workspace / "poc")
    detach.end_processes(rest)
    return stopped + len(rest)


@poc_group.command("down")
@workspace_option
@format_option
@handle_errors
def down(workspace: Path | None, fmt: str) -> None:
    """Stop the local federation: every parent and worker of its workspace, whatever
    happened before. Its kits and jobs stay for the next `atoll poc up`."""
    workspace = (workspace or default_workspace()).resolve()
    if not (workspace / "poc").exists():
        fail(f"no federation in {workspace}")
    found = kits(workspace)
    stopped = _stop_all(workspace)
    if saved_session().get("kit") == str(found["admin"]):
        (atoll_home() / "session.json").unlink(missing_ok=True)
    emit({"workspace": str(workspace), "stopped": stopped}, fmt,
         f"stopped {stopped} parent(s) in {printable(workspace)}")
