"""``atoll job simulate JOB_DIR``: the job in one process on this machine (the simulator,
atoll/fl/simulator.py), after the checks of ``job validate``, with the live progress of
``job submit --wait`` and the results folder of ``job download``."""

from __future__ import annotations

import json
import time
import uuid
from pathlib import Path
from typing import Any

import click

from atoll.cli.common import emit, fail, format_option, handle_errors, printable
from atoll.cli.job_validate import check_or_fail, job_to_run, set_option


def _site_folders(entries: tuple[str, ...], dataset: str | None) -> dict[str, dict[str, str]]:
    """--site NAME=DIR: the site's datasets are DIR's entries (DIR/records is dataset
    `records`, as a real site mounts /data/<study>/<dataset>), or DIR itself with --dataset."""
    sites: dict[str, dict[str, str]] = {}
    for entry in entries:
        name, eq, folder = entry.partition("=")
        if not name or (eq and not folder):
            fail(f"--site {entry}: write NAME or NAME=DATASET_DIR")
        if name in sites:
            fail(f"--site {name} is given twice")
        path = Path(folder).resolve() if folder else None
        if path is not None and not path.is_dir():
            fail(f"--site {entry}: {folder} is not a folder")
        if path is None:
            sites[name] = {}
        elif dataset:
            sites[name] = {dataset: str(path)}
        else:
            sites[name] = {p.name: str(p) for p in sorted(path.iterdir())}
    return sites


def _default_sites(job_dir: Path, count: int | None) -> dict[str, dict[str, str]]:
    """The sites deploy_map names, else site-1..N (N: --sites, else min_clients, else 2)."""
    from atoll.spec.meta import load_meta

    meta = load_meta(job_dir)  # checked already
    if meta.sites() and count is None:
        return {site: {} for site in meta.sites()}
    return {f"site-{i}": {} for i in range(1, (count or meta.min_clients or 2) + 1)}


class _Progress:
    """The simulator's events as `submit --wait` prints the federation's."""

    def __init__(self, fmt: str):
        self.fmt = fmt

    def __call__(self, event: dict[str, Any]) -> None:
        from atoll.cli.job import _metrics, _round

        if self.fmt != "text" or "site" in event:
            return
        if event.get("event") == "round":
            metrics = "".join(f" {m}" for m in _metrics(event.get("metrics")))
            click.echo(f"  round {_round(event)}:{metrics}", nl=True)


@click.command("simulate")
@click.argument("job_dir", type=click.Path(file_okay=False, path_type=Path))
@click.option("--sites", "count", type=click.IntRange(1, 256), default=None,
              help="Simulate site-1..site-N [default: the sites deploy_map names, else "
                   "min_clients, else 2].")
@click.option("--site", "site_entries", multiple=True, metavar="NAME[=DATASET_DIR]",
              help="Simulate site NAME; its datasets are the entries of DATASET_DIR "
                   "(DATASET_DIR/records is dataset `records`). Repeat for each site.")
@click.option("--dataset", default=None, metavar="NAME",
              help="With --site: DATASET_DIR itself is this one dataset.")
@set_option
@click.option("--out", type=click.Path(file_okay=False, path_type=Path), default=Path("."),
              show_default=True, help="Write the results into OUT/sim-ID, as `job download` "
                                      "writes OUT/JOB_ID.")
@format_option
@handle_errors
def simulate_command(job_dir: Path, count: int | None, site_entries: tuple[str, ...],
                     dataset: str | None, sets: tuple[str, ...], out: Path, fmt: str) -> None:
    """Run JOB_DIR on this machine, every site in one process: no federation needed.

    The job is checked first as `atoll job validate` checks it (exit 2 listing every
    problem); then each round is printed as `job submit --wait` prints it. Exits 1 unless
    the job completed."""
    from atoll.fl.simulator import simulate

    if site_entries and count is not None:
        fail("give either --sites N or --site NAME=DATASET_DIR ..., not both")
    if dataset and not site_entries:
        fail("--dataset goes with --site NAME=DATASET_DIR")
    check_or_fail(job_dir, sets)  # the job itself; its sites are checked below
    sites = (_site_folders(site_entries, dataset) if site_entries
             else _default_sites(job_dir, count))
    overrides = check_or_fail(job_dir, sets, None, list(sites))
    job_id = f"sim-{uuid.uuid4().hex[:12]}"
    folder = out.resolve() / job_id
    results = folder / "results"
    results.mkdir(parents=True)
    if fmt == "text":
        click.echo(f"simulating {printable(job_dir)} as {job_id} with "
                   f"{len(sites)} site(s): {', '.join(sites)}")
    started = time.time()
    with job_to_run(job_dir, overrides) as run_dir:
        result = simulate(run_dir, sites, results_dir=results, on_event=_Progress(fmt),
                          raise_on_error=False)
    summary = _summary(job_id, job_dir, result, started)
    (folder / "job.json").write_text(json.dumps(summary, indent=2) + "\n")
    text = [f"  {printable(s):<20} FINISHED:FAILED ({printable(r)})"
            for s, r in summary["site_errors"].items()]
    text.append(f"job {job_id}: {printable(summary['state'])}"
                + (f"\nreason: {printable(summary['reason'], lines=True)}"
                   if summary["reason"] else ""))
    text.append(f"results in {printable(folder)}")
    emit(summary, fmt, "\n".join(text))
    if summary["state"] != "FINISHED:COMPLETED":
        from atoll.spec.errors import EXIT_FAILED

        raise SystemExit(EXIT_FAILED)


def _summary(job_id: str, job_dir: Path, result, started: float) -> dict[str, Any]:
    """job.json, as `job download` writes it for a job of the federation."""
    failed = [e for e in result.events if e.get("event") == "failed"]
    reason = _last_line(failed[-1].get("error", "")) if failed else ""
    return {
        "job_id": job_id, "name": job_dir.resolve().name, "study": None, "simulated": True,
        "state": "FINISHED:FAILED" if failed else "FINISHED:COMPLETED", "reason": reason,
        "created": started, "updated": time.time(),
        "site_errors": {site: _last_line(tb) for site, tb in result.site_errors.items()},
        "results_dir": str(result.results_dir),
    }


def _last_line(traceback_text: str) -> str:
    """The exception line of a traceback (the full one went to stderr as the job ran)."""
    lines = [line for line in traceback_text.strip().splitlines() if line.strip()]
    return lines[-1].removeprefix("atoll.fl.workflows.rounds.") if lines else ""
