"""`make demo`: three hospitals train one model over a real local federation.

A server and three hospital sites start as separate processes talking mutual TLS. Each hospital
maps its own non-IID slice of scikit-learn's digits (shipped in the package: nothing is
downloaded) as the study dataset `records`; a FedAvg job trains a small PyTorch model for ten
rounds. Progress shows live; at the end the federated model is compared on the same held-out
split with each hospital training alone and with centralized training.

    python -m atoll.demo [--workspace DIR]
"""

from __future__ import annotations

import argparse
import shutil
import socket
import time
from pathlib import Path
from typing import Any

from rich.console import Console

STUDY = "digits"
RESEARCHER = "researcher@hospitals.example"
console = Console(highlight=False, soft_wrap=True)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def provision_demo(workspace: Path, sites: tuple[str, ...]) -> Path:
    from atoll.pki.project import parse_project
    from atoll.pki.provision import provision

    doc = {
        "name": "hospitals",
        "server": {"name": "server", "host": "127.0.0.1", "port": _free_port()},
        "sites": [{"name": s, "org": s} for s in sites],
        "users": [{"name": RESEARCHER, "org": "research", "role": "lead"}],
        "studies": {STUDY: {"sites": list(sites), "admins": [RESEARCHER]}},
    }
    return provision(parse_project(doc, "demo"), workspace).project_dir


def map_datasets(project: Path, folders: dict[str, Path]) -> None:
    """Each hospital's operator maps the study to its own data, read-only."""
    for site, folder in folders.items():
        (project / site / "local" / "study_runtime.yaml").write_text(
            "format_version: 2\nstudies:\n"
            f"  {STUDY}:\n    datasets:\n      records: {{source: {folder}, mode: ro}}\n")


def show_progress(job: dict[str, Any], seen: dict[str, Any]) -> None:
    for name, part in sorted(job["parts"].items()):
        if seen.get(name) != part["state"]:
            seen[name] = part["state"]
            console.print(f"  [dim]{name:<11}[/dim] {part['state']}"
                          + (f" [dim]({part['reason']})[/dim]" if part.get("reason") else ""))
    rounds = [e for e in job.get("progress", []) if e.get("event") == "round"]
    for event in rounds[seen.get("_rounds", 0):]:
        val = event.get("global", {}).get("validate", {})
        per_site = "  ".join(
            f"{s} {m.get('validate', {}).get('accuracy', float('nan')):.3f}"
            for s, m in sorted(event.get("sites", {}).items()))
        console.print(f"  round {event['round']:>2}/{event['total_rounds']}: validation "
                      f"accuracy [bold]{val.get('accuracy', float('nan')):.3f}[/bold]   "
                      f"[dim]{per_site}[/dim]")
    seen["_rounds"] = len(rounds)


def run(workspace: Path) -> int:
    from atoll.admin.session import Session
    from atoll.demo import data as demo_data
    from atoll.parent import detach

    started = time.monotonic()
    shutil.rmtree(workspace, ignore_errors=True)
    workspace.mkdir(parents=True)
    console.print("[bold]atoll demo[/bold]: three hospitals, one model, no data leaves a site")
    folders = demo_data.prepare(workspace / "data")
    project = provision_demo(workspace, demo_data.SITES)
    map_datasets(project, folders)
    parents = [("server", project / "server")] + [("site", project / s) for s in demo_data.SITES]
    console.print(f"provisioned a PKI and {len(parents)} startup kits in {project}")
    try:
        detach.start_many([(role, kit, kit / "workspace")
                           for role, kit in parents])
        with Session(project / RESEARCHER, study=STUDY) as session:
            while not all(s["online"] for s in session.sites()["sites"]):
                time.sleep(0.02)
            console.print(f"federation up in {time.monotonic() - started:.1f} s: server + "
                          f"{', '.join(demo_data.SITES)} (mutual TLS, process launcher)")
            job = session.submit(demo_data.JOB_DIR)
            console.print(f"submitted FedAvg job {job['job_id']} to study {STUDY!r}")
            seen: dict[str, Any] = {}
            job = session.wait(job["job_id"], timeout=600,
                               on_update=lambda j: show_progress(j, seen))
            if job["state"] != "FINISHED:COMPLETED":
                console.print(f"[red]job {job['state']}: {job['reason']}[/red]")
                for name, body in session.logs(job["job_id"])["logs"].items():
                    console.print(f"--- {name} ---\n{body[-3000:]}", markup=False)
                return 1
            out = session.download(job["job_id"], workspace / "results")
    finally:
        for role, kit in reversed(parents):  # sites first, then the server
            detach.stop(kit / "workspace", role)
    console.print(demo_data.format_comparison(
        demo_data.compare(out / "results", workspace / "data")), markup=False)
    plot = out / "results" / "training_curves.png"
    console.print(f"results: {out}" + (f"\nplot: {plot}" if plot.exists() else ""))
    console.print(f"done in {time.monotonic() - started:.1f} s")
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m atoll.demo", description=__doc__.split("\n")[0])
    parser.add_argument("--workspace", type=Path, default=Path("workspace/demo"),
                        help="where the kits, data and results go (recreated)")
    args = parser.parse_args(argv)
    return run(args.workspace.resolve())
