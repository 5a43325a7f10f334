"""`atoll job submit|list|status|watch|logs|abort|delete|download`; `init`, `validate`,
`simulate` and `import-flare` live in modules of their own."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import click

from atoll.cli.common import (
    LazyCommands,
    emit,
    format_option,
    handle_errors,
    kit_option,
    log_text,
    open_session,
    printable,
    study_option,
)
from atoll.cli.job_validate import check_or_fail, job_to_run, set_option, study_sites

job_arg = click.argument("job_id")


@click.group("job", cls=LazyCommands, lazy={
    "init": ("atoll.cli.job_init", "init_command"),
    "import-flare": ("atoll.cli.job_import_flare", "import_flare_command"),
    "validate": ("atoll.cli.job_validate", "validate_command"),
    "simulate": ("atoll.cli.job_simulate", "simulate_command"),
})
def job_group() -> None:
    """Jobs of the session's study."""


def _ago(ts: float) -> str:
    seconds = max(0, int(time.time() - ts))
    if seconds < 120:
        return f"{seconds}s ago"
    return f"{seconds // 60}m ago" if seconds < 7200 else f"{seconds // 3600}h ago"


def _parts(job: dict[str, Any]) -> str:
    lines = []
    for name, part in sorted(job.get("parts", {}).items(), key=lambda p: p[0] != "server"):
        # the job's reason is shown once, above: a participant's line repeats only its own
        own = part.get("reason") and part["reason"] != job.get("reason")
        reason = f"  ({printable(part['reason'])})" if own else ""
        lines.append(f"  {printable(name):<20} {printable(part['state'])}{reason}")
    return "\n".join(lines)


def _metrics(metrics: dict[str, Any] | None) -> list[str]:
    """``name=value`` of each number; the names are the job's own."""
    return [f"{printable(k)}={v:.4g}" for k, v in (metrics or {}).items()
            if isinstance(v, int | float)]


def _round(event: dict[str, Any]) -> str:
    """The round of a progress event: counted from 1, as in the job's metrics files and logs
    (written by the job's workflow: any type)."""
    return printable(event.get("round", "-"))


def _is_round(event: dict[str, Any]) -> bool:
    """A round's report, not the bookkeeping a resumable workflow also reports with a round
    number (its checkpoint after each round, its restore after a server restart)."""
    return "round" in event and event.get("event", "round") == "round"


def _status_text(job: dict[str, Any], parts: bool = True) -> str:
    """The job as `status` prints it; without ``parts`` after a follow, which printed each
    participant's state and reason as it came."""
    reason = f"\nreason: {printable(job['reason'], lines=True)}" if job.get("reason") else ""
    lines = [f"job {printable(job['job_id'])}  '{printable(job['name'])}'  "
             f"study {printable(job['study'])}",
             f"state: {printable(job['state'])}{reason}"]
    if parts:
        lines += ["participants:", _parts(job)]
    rounds = [e for e in job.get("progress", []) if _is_round(e)]
    if rounds:
        last = rounds[-1]
        lines.append(f"progress: round {_round(last)}"
                     + (f"/{printable(last['num_rounds'])}" if last.get("num_rounds") else "")
                     + "".join(f"  {m}" for m in _metrics(last.get("metrics"))))
    return "\n".join(lines)


@job_group.command("submit")
@click.argument("job_dir", type=click.Path(exists=True, file_okay=False, path_type=Path))
@kit_option
@study_option
@click.option("--wait", is_flag=True, help="Follow the job until it ends; exit 1 unless COMPLETED.")
@click.option("--timeout", type=float, default=None, help="With --wait: give up after SECONDS.")
@set_option
@format_option
@handle_errors
def submit(job_dir: Path, kit: Path | None, study: str | None, wait: bool,
           timeout: float | None, sets: tuple[str, ...], fmt: str) -> None:
    """Submit JOB_DIR (a folder with meta.json and its apps) to the session's study.

    The job is first checked here as `atoll job validate` does (exit 2 listing every problem,
    nothing sent). It is signed with your kit's key: the server and every site check that
    nobody changed it on the way (docs/security.md)."""
    from atoll.compat.flare_job import flare_apps

    if apps := flare_apps(job_dir):
        from atoll.cli.common import render_error

        render_error(f"{job_dir} is an NVIDIA FLARE job folder ({', '.join(apps)} have "
                     "config/config_fed_* and no app.yaml): translate it first with "
                     f"`atoll job import-flare {job_dir} OUT_DIR`, then submit OUT_DIR", fmt)
    with open_session(kit) as session:
        where, sites = study_sites(session, study)
        overrides = check_or_fail(job_dir, sets, where, sites)
        with job_to_run(job_dir, overrides) as folder:
            job = session.submit(folder, study=study)
        if fmt == "text":
            click.echo(f"submitted job {printable(job['job_id'])} ({printable(job['name'])}) "
                       f"to study {printable(job['study'])}")
        if wait:
            job = _follow(session, job["job_id"], study, timeout, fmt)
    emit(job, fmt, _status_text(job, parts=False) if wait else None)
    if wait and job["state"] != "FINISHED:COMPLETED":
        from atoll.spec.errors import EXIT_FAILED

        raise SystemExit(EXIT_FAILED)


def _follow(session, job_id: str, study: str | None, timeout: float | None, fmt: str):
    """Print each change of the job until it ends (what it waits for, each participant's state,
    each round); the job's last status."""
    seen: dict[str, str] = {}
    shown_until = 0.0  # the time of the last event shown: status holds only the latest events

    def update(job: dict[str, Any]) -> None:
        nonlocal shown_until
        if fmt != "text":
            return
        waiting = job.get("reason") if job["state"] == "SUBMITTED" else None
        if waiting and seen.get("\0job") != waiting:  # the scheduler's "waiting for sites: ..."
            seen["\0job"] = waiting
            click.echo(f"  {printable(waiting)}")
        for name, part in job.get("parts", {}).items():
            if seen.get(name) != part["state"]:
                seen[name] = part["state"]
                # the server's reason at its end is the job's, printed once at the end
                own = part.get("reason") and not (name == "server" and "FINISHED" in part["state"])
                reason = f" ({printable(part['reason'])})" if own else ""
                click.echo(f"  {printable(name):<20} {printable(part['state'])}{reason}")
        for event in job.get("progress", []):
            at = event.get("at", 0.0)
            if not isinstance(at, int | float) or at <= shown_until:
                continue
            shown_until = at
            if _is_round(event) and event.get("source") == "server":
                metrics = "".join(f" {m}" for m in _metrics(event.get("metrics")))
                click.echo(f"  round {_round(event)}:{metrics}")

    return session.wait(job_id, study, timeout, update)


@job_group.command("list")
@kit_option
@study_option
@format_option
@handle_errors
def list_jobs(kit: Path | None, study: str | None, fmt: str) -> None:
    """Jobs of the session's study, newest first."""
    with open_session(kit) as session:
        jobs = session.list_jobs(study)
    lines = [f"{'JOB ID':<34}{'NAME':<24}{'STATE':<22}{'SUBMITTER':<28}SUBMITTED"]
    for job in jobs:  # escaped before cut: a name can neither move the cursor nor add a row
        lines.append(f"{printable(job['job_id']):<34}{printable(job['name'])[:22]:<24}"
                     f"{printable(job['state']):<22}{printable(job['submitter'])[:26]:<28}"
                     f"{_ago(job['created'])}")
    emit(jobs, fmt, "\n".join(lines) if jobs else "no jobs")


@job_group.command("status")
@job_arg
@kit_option
@study_option
@click.option("--wait", is_flag=True,
              help="Follow the job until it ends, as `submit --wait` does; exit 1 unless COMPLETED.")
@click.option("--timeout", type=float, default=None, help="With --wait: give up after SECONDS.")
@format_option
@handle_errors
def status(job_id: str, kit: Path | None, study: str | None, wait: bool, timeout: float | None,
           fmt: str) -> None:
    """A job's state, each participant's state and reason, and its progress."""
    if wait:
        _watch(job_id, kit, study, timeout, fmt)
        return
    with open_session(kit) as session:
        job = session.status(job_id, study)
    emit(job, fmt, _status_text(job))


@job_group.command("watch")
@job_arg
@kit_option
@study_option
@click.option("--timeout", type=float, default=None, help="Give up after SECONDS.")
@format_option
@handle_errors
def watch(job_id: str, kit: Path | None, study: str | None, timeout: float | None,
          fmt: str) -> None:
    """Follow a job until it ends, with the live progress of `submit --wait`: re-attach after
    Ctrl-C, or from another terminal. Exits 1 unless the job COMPLETED."""
    _watch(job_id, kit, study, timeout, fmt)


def _watch(job_id: str, kit: Path | None, study: str | None, timeout: float | None,
           fmt: str) -> None:
    with open_session(kit) as session:
        job = _follow(session, job_id, study, timeout, fmt)
    emit(job, fmt, _status_text(job, parts=False))
    if job["state"] != "FINISHED:COMPLETED":
        from atoll.spec.errors import EXIT_FAILED

        raise SystemExit(EXIT_FAILED)


@job_group.command("logs")
@job_arg
@kit_option
@study_option
@click.option("--follow", "-f", is_flag=True,
              help="Keep printing what the logs add until the job ends (the server's log as it "
                   "grows; each site's when its part ends).")
@format_option
@handle_errors
def logs(job_id: str, kit: Path | None, study: str | None, follow: bool, fmt: str) -> None:
    """The job's worker logs (server and sites) and its progress events.

    On a terminal, control characters in the logs (escape sequences, carriage returns) show as
    escapes such as \\x1b; piped or redirected, the logs are written as the job wrote them.
    """
    with open_session(kit) as session:
        if follow and fmt == "text":
            _follow_logs(session, job_id, study)
            return
        answer = session.logs(job_id, study)
    text = []
    for name, body in answer["logs"].items():
        text.append(f"==> {printable(name)} <==\n{log_text(body.rstrip())}")
    metrics = [e for e in answer["events"] if e.get("metrics")]
    if metrics:
        text.append("==> metrics <==")
        for event in metrics:
            step = f" step {printable(event['step'])}" if event.get("step") is not None else ""
            text.append(f"{printable(event['source']):<16} round {_round(event)}{step}: "
                        f"{' '.join(_metrics(event['metrics']))}")
    emit(answer, fmt, "\n".join(text) or "no logs yet")


def _follow_logs(session, job_id: str, study: str | None) -> None:
    """Print each log's new text as the server answers a change of the job, until it ends."""
    shown: dict[str, str] = {}
    current = None
    job = session.status(job_id, study)
    while True:
        for name, body in session.logs(job_id, study)["logs"].items():
            new = _added(shown.get(name, ""), body)
            if new:
                if current != name:
                    click.echo(f"==> {printable(name)} <==")
                    current = name
                click.echo(log_text(new), nl=False)
            shown[name] = body
        if job["state"].startswith("FINISHED"):
            click.echo(f"\njob {printable(job_id)}: {printable(job['state'])}")
            return
        # the server answers as soon as the job changes, or after 2 s for a log that grew
        job = session.status(job_id, study, since=job["version"], wait_s=2.0)


def _added(before: str, now: str) -> str:
    """What ``now`` (a log's tail) adds to ``before``: the tail moves on, so the overlap is
    found by the end of what was shown (its first match: a repetitive log may print a line
    twice, never lose one); nothing in common (the log grew past the tail): all of ``now``."""
    if now.startswith(before):
        return now[len(before):]
    anchor = before[-512:]
    at = now.find(anchor) if anchor else -1
    return now[at + len(anchor):] if at >= 0 else now


@job_group.command("abort")
@job_arg
@kit_option
@study_option
@format_option
@handle_errors
def abort(job_id: str, kit: Path | None, study: str | None, fmt: str) -> None:
    """Abort a job: every worker of it is stopped."""
    with open_session(kit) as session:
        job = session.abort(job_id, study)
    emit(job, fmt, f"abort requested for job {printable(job_id)}: {printable(job['state'])}")


@job_group.command("delete")
@job_arg
@kit_option
@study_option
@format_option
@handle_errors
def delete(job_id: str, kit: Path | None, study: str | None, fmt: str) -> None:
    """Delete a finished job: its record, progress, logs and results on the server, and its
    run folder at each site that ran it and is online (docs/operations.md, Cleaning up).

    Who may: its submitter, an org admin of the submitter's org, a project admin (a site's
    policy may narrow that). The audit log keeps the deletion. A study without jobs can then
    be removed (`atoll study remove`)."""
    with open_session(kit) as session:
        answer = session.delete(job_id, study)
    emit(answer, fmt, f"deleted job {printable(answer['deleted'])} "
                      f"({printable(answer['name'])}) and its results")


@job_group.command("download")
@job_arg
@kit_option
@study_option
@click.option("--out", "out", type=click.Path(file_okay=False, path_type=Path), default=Path("."),
              show_default=True, help="Folder to write the results into.")
@format_option
@handle_errors
def download(job_id: str, kit: Path | None, study: str | None, out: Path, fmt: str) -> None:
    """Download a job's results (models, metrics, plots, logs) into OUT/JOB_ID, with the job's
    provenance record as OUT/JOB_ID/provenance.json: check it offline with `atoll provenance
    verify OUT/JOB_ID/provenance.json --ca rootCA.pem --model MODEL` (docs/provenance.md)."""
    with open_session(kit) as session:
        path = session.download(job_id, out, study)
    emit({"job_id": job_id, "path": str(path.resolve())}, fmt,
         f"results of job {printable(job_id)} in {printable(path)}")


@job_group.command("provenance")
@job_arg
@kit_option
@study_option
@click.option("--out", "out", type=click.Path(dir_okay=False, path_type=Path), required=True,
              help="The file to write the record to (JSON).")
@format_option
@handle_errors
def provenance(job_id: str, kit: Path | None, study: str | None, out: Path, fmt: str) -> None:
    """Write the job's provenance record to OUT: every entry with the certificates that signed
    it, the server's head signed now. Check it offline with `atoll provenance verify OUT --ca
    rootCA.pem [--model FILE]` (docs/provenance.md). The record is also provenance.json in
    `job download`'s results, which this command fetches."""
    with open_session(kit) as session:
        session.provenance(job_id, out, study)
    emit({"job_id": job_id, "path": str(out.resolve())}, fmt,
         f"provenance of job {printable(job_id)} in {printable(out)}")
