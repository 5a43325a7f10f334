"""The scale run's table for BENCHMARKS.md, between `<!-- scale:begin -->` and `<!-- scale:end -->`."""

from __future__ import annotations

import datetime as dt
import os
import re
from pathlib import Path

BEGIN, END = "<!-- scale:begin -->", "<!-- scale:end -->"


def _s(value) -> str:
    return "—" if value is None else f"{value:.2f} s"


def _mib(value) -> str:
    return "—" if not value else f"{value / 2**20:.0f} MiB"


def _pct(value) -> str:
    return "—" if value is None else f"{value:.0f} %"


def _get(result: dict, phase: str, key: str):
    return (result.get(phase) or {}).get(key)


def render(results: list[dict], command: str, env: str = "",
           when: dt.datetime | None = None) -> str:
    """The block; `env`: the SCALE_* settings the run had, shown before its command."""
    when = when or dt.datetime.now(dt.timezone.utc)  # noqa: UP017
    date = when.strftime("%Y-%m-%d %H:%M UTC")
    lines = [
        BEGIN,
        f"Measured {date} on this machine ({os.cpu_count()} CPUs, shared), one run of:",
        "",
        f"    {env + ' ' if env else ''}.venv/bin/{command}",
        "",
        "One real server parent (`atoll server start`, mutual TLS on 127.0.0.1, its "
        f"site.yaml's `links.tls_record_bytes` {results[0].get('tls_record_bytes', 16384)}: "
        "`SCALE_TLS_RECORD`) and N simulated "
        "sites (bench/scale_sites.py: each its own certificate from the project's CA and its own "
        "TLS connection, hello + a heartbeat every 5 s, and for the job the calls a site parent "
        "and its worker make: FetchJob, STARTING/RUNNING, on one `Tasks` call opened compact a "
        "pull, then each reply echoing the payload inline and asking for the next task, which "
        "comes with its ack (`SCALE_TASKS=stream-frames`: payloads in data frames; "
        "`SCALE_TASKS=calls`: a `PullTask` and a `PushReply` call each), FINISHED). The job: "
        "scatter_gather to `@ALL`, min_clients N, "
        f"{results[0].get('payload_bytes', '?')} B payload, {results[0].get('rounds', '?')} "
        "rounds. The simulated sites run 250 to a process (`SCALE_SITES_PER_PROCESS`; at least "
        "4 processes), 100 of a process connecting at a time (`SCALE_CONNECTING`), at nice 10 "
        "below the server, on the same 2 CPUs as the server.",
        "",
        "| sites | connect (all online) | deploy (submit → all RUNNING) | time per round | "
        "server CPU idle | server CPU during job | server CPU per site and round | "
        "server RSS idle | server RSS peak | server worker RSS peak |",
        "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    for r in results:
        if r.get("error") and "round_s" not in r:
            welcomed = r.get("sites_welcomed")
            extra = f"; {welcomed} sites got the server's welcome" if welcomed is not None else ""
            lines.append(f"| {r['sites']} | failed: {_short(r['error'] + extra, 120)} |"
                         + " — |" * 8)
            continue
        job_cpu = _get(r, "job", "server_cpu_s")
        job_wall = _get(r, "job", "seconds")
        lines.append(
            f"| {r['sites']} | {_s(r.get('connect_s'))} | {_s(r.get('deploy_s'))} | "
            f"{_round(r)} | {_pct(_get(r, 'idle', 'server_cpu_pct'))} | "
            + (f"{job_cpu:.1f} CPU-s in {job_wall:.1f} s | " if job_cpu is not None else "— | ")
            + _per_site(r)
            + f"{_mib(_get(r, 'idle', 'server_rss_peak'))} | "
            f"{_mib(max(_get(r, p, 'server_rss_peak') or 0 for p in ('idle', 'job')))} | "
            f"{_mib(_get(r, 'job', 'worker_rss_peak'))} |"
        )
    for r in results:
        state = r.get("job_state")
        if state and state != "FINISHED:COMPLETED":
            calls = ", ".join(f"{n} {code}" for code, n in (r.get("job_calls_failed") or {}).items())
            lines += ["", f"{r['sites']} sites: the job ended {state}"
                      + (f"; sites' job calls that failed: {calls}" if calls else "")
                      + f" ({_short(r.get('job_reason', ''), 160)})"]
    lines += [
        "",
        "connect: simulated sites started → the admin's `Session.sites()` lists all N online. "
        "deploy: from the submit call until the last site reported RUNNING (seen at the site). "
        "Time per round: mean interval between consecutive rounds' first task arrival at any "
        "site; from round 2: the same without round 1, whose first tasks overlap the deploy. Per site and round: the server parent's CPU-seconds from the first round's "
        "first task to the last round's last reply, over sites × rounds (heartbeats "
        "included); from round 2: the same from round 2's first task, without the deploy's "
        "tail. CPU % = CPU-seconds per wall second of the server parent (100 % = one core); "
        "RSS and CPU from /proc at 5 Hz.",
        END,
    ]
    return "\n".join(lines)


def _round(r: dict) -> str:
    steady = r.get("round_after_first_s")
    return _s(r.get("round_s")) + (f" (from round 2: {steady:.2f} s)" if steady else "")


def _per_site(r: dict) -> str:
    ms = r.get("server_cpu_ms_per_site_round")
    cpu = _get(r, "rounds_window", "server_cpu_s")
    steady = r.get("server_cpu_ms_per_site_round_after_first")
    after = f"; from round 2: {steady:.2f} ms" if steady is not None else ""
    return "— | " if ms is None else f"{ms:.2f} ms ({cpu:.1f} CPU-s{after}) | "


def write_section(path: Path, block: str) -> None:
    """Replace the scale section; without one, it goes at the end."""
    text = path.read_text() if path.exists() else "# Benchmarks\n"
    pattern = re.compile(re.escape(BEGIN) + ".*?" + re.escape(END), re.S)
    if pattern.search(text):
        text = pattern.sub(lambda _: block, text)
    else:
        text = text.rstrip("\n") + "\n\n## Scale: one server, many sites\n\n" + block + "\n"
    path.write_text(text if text.endswith("\n") else text + "\n")


def _short(text: str, n: int = 80) -> str:
    text = " ".join(str(text).split()).replace("|", "/")
    return text if len(text) <= n else text[: n - 1] + "…"
