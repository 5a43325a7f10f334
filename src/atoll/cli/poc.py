"""`atoll poc up|down`: a whole federation on this machine, as separate processes, with mTLS."""

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
@click.option("--sites", "n_sites", type=click.IntRange(1, 64), default=2, show_default=True)
@workspace_option
@format_option
@handle_errors
def up(n_sites: int, workspace: Path | None, fmt: str) -> None:
    """Provision and start a local federation; log the admin in."""
    from atoll.admin.session import Session
    from atoll.parent import detach, pidfile

    started = time.monotonic()
    workspace = (workspace or default_workspace()).resolve()
    if (workspace / "poc").exists() and pidfile.read_pid(kits(workspace)["server"] / "workspace",
                                                        "server"):
        fail(f"a federation already runs in {workspace}; `atoll poc down` first")
    found = provision_poc(n_sites, workspace)
    roles = [("server", found["server"])] + [("site", k) for n, k in found.items()
                                             if n.startswith("site-")]
    try:
        detach.start_many([(role, kit, kit / "workspace")
                           for role, kit in roles])
        with Session(found["admin"]) as session:
            deadline = time.monotonic() + 30
            while True:
                online = [s for s in session.sites()["sites"] if s["online"]]
                if len(online) == n_sites:
                    break
                if time.monotonic() > deadline:
                    fail(f"only {len(online)} of {n_sites} sites connected within 30 s; see "
                         f"{workspace}/poc/*/workspace/*.log", 3)
                time.sleep(0.02)
            answer = session.login("default")
    except RuntimeError as exc:
        fail(str(exc), 3)
    save_session({"kit": str(found["admin"]), "study": "default", "token": answer["token"],
                  "user": ADMIN})
    seconds = time.monotonic() - started
    emit({"workspace": str(workspace), "sites": [n for n in found if n.startswith("site-")],
          "admin_kit": str(found["admin"]), "user": ADMIN, "study": "default",
          "seconds": round(seconds, 2)}, fmt,
         f"federation up in {seconds:.2f} s: server + {n_sites} sites in {printable(workspace)}\n"
         f"admin kit: {printable(found['admin'])} (logged in; session in "
         f"{printable(atoll_home())})\n"
         "try:\n  atoll job init myjob\n  atoll job submit myjob --wait\n  atoll poc down")


@poc_group.command("down")
@workspace_option
@format_option
@handle_errors
def down(workspace: Path | None, fmt: str) -> None:
    """Stop the local federation's parents (and their workers)."""
    from atoll.parent import detach

    workspace = (workspace or default_workspace()).resolve()
    if not (workspace / "poc").exists():
        fail(f"no federation in {workspace}")
    found = kits(workspace)
    stopped = 0
    for name, kit in found.items():
        if name.startswith("site-"):
            stopped += detach.stop(kit / "workspace", "site")
    stopped += detach.stop(found["server"] / "workspace", "server")
    if saved_session().get("kit") == str(found["admin"]):
        (atoll_home() / "session.json").unlink(missing_ok=True)
    emit({"workspace": str(workspace), "stopped": stopped}, fmt,
         f"stopped {stopped} parent(s) in {printable(workspace)}")
