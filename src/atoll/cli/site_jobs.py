"""`atoll site jobs KIT`: the site's own log of every job it ran or refused (site/job_log.py),
read from the site's workspace; needs no server and no running parent."""

from __future__ import annotations

import datetime as dt
from pathlib import Path

import click

from atoll.cli.common import emit, format_option, handle_errors, printable


@click.command("jobs")
@click.argument("kit", type=click.Path(exists=True, file_okay=False, path_type=Path))
@format_option
@handle_errors
def jobs_command(kit: Path, fmt: str) -> None:
    """Every job the site of KIT ran or refused, oldest first: its decision, study, signer
    and the signed job's digest, as the site verified them. Exits 2 when a line of the log was
    changed, removed or inserted since it was written."""
    from atoll.pki.kit import load_kit
    from atoll.site.job_log import read_log
    from atoll.spec.errors import EXIT_INVALID

    site = load_kit(kit)
    read = read_log(site.workspace / "jobs.log")
    rows = [{k: v for k, v in line.items() if k != "_digest"} for line in read.lines]
    lines = [f"{len(rows)} decisions of site {printable(site.name)} "
             f"({site.workspace / 'jobs.log'})"]
    for r in rows:
        at = dt.datetime.fromtimestamp(int(r.get("at", 0)), dt.UTC)
        named = r.get("server_submitter")
        who = r.get("submitter") or (f"({printable(named)}, unverified)" if named else "-")
        lines.append(f"  {at:%Y-%m-%d %H:%M:%S}  {printable(r.get('job_id', '?')):<36} "
                     f"{printable(r.get('decision', '?')):<20} {printable(r.get('study', '')):<16}"
                     f" {printable(who)}  {printable(r.get('job_digest') or '-')}")
        if r.get("decision") == "refused" and r.get("reason"):
            lines.append(f"      {printable(r['reason'])}")
    if read.broken is not None:
        lines.append(f"the log's chain breaks at line {read.broken + 1}: a line was changed, "
                     "removed or inserted after it was written")
    emit({"site": site.name, "jobs": rows,
          "broken_at_line": None if read.broken is None else read.broken + 1}, fmt,
         "\n".join(lines))
    if read.broken is not None:
        raise SystemExit(EXIT_INVALID)
