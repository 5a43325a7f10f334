"""`atoll dashboard` on a local federation (issue 39): first page load, the jobs list with
10,000 jobs (paged), round end to page, and the dashboard's memory at rest.

    .venv/bin/python -m bench.dashboard [--jobs 10000] [--no-write]      (make bench-dashboard)

A real federation (tests/integration/federation/harness.py: a server and two sites as
processes, mutual TLS, SQLite) whose server store holds ``--jobs`` finished jobs of the study
(written into its SQLite store while the server is stopped, as many jobs as a long-lived
study gathers), and `atoll dashboard` as its own process, opened in Debian's headless Chromium.

Reported, each against its target where the issue sets one (the table's last column says
whether it is met): the first page load (navigation start to the overview's first render, the
``atoll:first-render`` mark of dashboard.js; median and worst of fresh loads with the cache
off, and how much of it the page's own files took before the server's data), the JSON of the
jobs list's first, middle and last page (median of 20 HTTP requests each, their bytes, and the
dashboard's CPU time for them), the time from each round's end (the server's event time) to
the job page (a FedAvg job of 5 rounds), and the dashboard's RSS at rest with whether numpy or
torch are mapped in it. Writes its section of BENCHMARKS.md unless --no-write.
"""

from __future__ import annotations

import argparse
import datetime as dt
import http.client
import os
import statistics
import tempfile
import time
from pathlib import Path

from bench.sections import write_section
from tests.integration.federation.dashboard_browser import browser, start_dashboard
from tests.integration.federation.harness import Federation, job_folder
from tests.integration.federation.test_dashboard import MODEL, TRAIN

ROOT = Path(__file__).resolve().parent.parent
LEAD = "lead@a.org"
USERS = [{"name": LEAD, "org": "org-site-1", "role": "lead"}]
STUDIES = {"alpha": {"sites": ["site-1", "site-2"], "admins": [LEAD]}}
RUNTIME = {s: "format_version: 2\nstudies:\n  alpha: {}\n" for s in ("site-1", "site-2")}
ROUNDS = 5
APP = f"""server:
  workflow: fedavg
  args: {{num_rounds: {ROUNDS}, round_timeout: 120}}
  initial_model: model.py:make
site:
  script: train.py
"""


def fill_store(db: Path, count: int) -> None:
    """``count`` finished jobs of study alpha, written as the server's intake and end would."""
    from atoll.server.store import open_store

    store = open_store(db)
    try:
        for n in range(count):
            job_id = f"{n:032x}"
            store.add_job(job_id, f"job-{n}", "alpha", LEAD, "org-site-1", {"name": f"job-{n}"},
                          ["server", "site-1", "site-2"])
            store.set_job_state(job_id, "FINISHED:COMPLETED", "")
    finally:
        store.close()


def rss_mib(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return float("nan")


def cpu_s(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def cookie_for(dash) -> str:
    host = dash.base.split("//")[1]
    conn = http.client.HTTPConnection(host, timeout=30)
    conn.request("GET", "/" + dash.url.split("/", 3)[3])
    answer = conn.getresponse()
    answer.read()
    conn.close()
    return answer.getheader("set-cookie").split(";", 1)[0]


def timed_get(dash, cookie: str, path: str) -> tuple[float, int]:
    conn = http.client.HTTPConnection(dash.base.split("//")[1], timeout=60)
    started = time.perf_counter()
    conn.request("GET", path, headers={"Cookie": cookie})
    answer = conn.getresponse()
    body = answer.read()
    took = time.perf_counter() - started
    conn.close()
    assert answer.status == 200, (answer.status, body[:200])
    return took, len(body)


def first_render(driver, url: str) -> tuple[float, float]:
    """Navigation start to the first render (ms), and to DOMContentLoaded (the page's own
    files: HTML, CSS, script) of that: the rest is the sites and jobs coming from the server."""
    driver.execute_cdp_cmd("Network.setCacheDisabled", {"cacheDisabled": True})
    driver.get(url)
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        marks = driver.execute_script(
            "return [performance.getEntriesByName('atoll:first-render').map(m => m.startTime),"
            " performance.getEntriesByType('navigation')[0].domContentLoadedEventEnd]")
        if marks[0]:
            return float(marks[0][0]), float(marks[1])
        time.sleep(0.02)
    raise AssertionError(f"{url} never rendered")


def met(ok: bool) -> str:
    return "yes" if ok else "**no**"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--jobs", type=int, default=10_000)
    parser.add_argument("--loads", type=int, default=7)
    parser.add_argument("--no-write", action="store_true")
    args = parser.parse_args()
    work = Path(tempfile.mkdtemp(prefix="bench-dashboard-"))
    fed = Federation.provisioned(work, ["site-1", "site-2"], USERS, STUDIES, runtime=RUNTIME)
    driver = dash = None
    try:
        fed.start_server()
        fed.kill("server")
        filled = time.perf_counter()
        fill_store(fed.workspace("server") / "atoll.db", args.jobs)
        filled = time.perf_counter() - filled
        fed.start_all()
        fed.wait_online(LEAD, study="alpha")
        dash = start_dashboard(fed.kit(LEAD), "alpha", work / "home")
        driver = browser()
        driver.get(dash.url)  # the one-time link: this browser's cookie
        timed = [first_render(driver, dash.base + "/") for _ in range(args.loads)]
        loads, files = [t for t, _ in timed], [f for _, f in timed]
        # a second dashboard for the HTTP measurements: the first one's link is spent
        http_dash = start_dashboard(fed.kit(LEAD), "alpha", work / "home2")
        cookie = cookie_for(http_dash)
        pages = {}
        last = (args.jobs - 1) // 50
        cpu_before = cpu_s(http_dash.proc.pid)
        for label, page in (("first", 0), ("middle", last // 2), ("last", last)):
            runs = [timed_get(http_dash, cookie, f"/api/overview?page={page}") for _ in range(20)]
            pages[label] = (page, statistics.median(t for t, _ in runs) * 1000,
                            max(t for t, _ in runs) * 1000, runs[0][1])
        cpu_pages = cpu_s(http_dash.proc.pid) - cpu_before
        last_page_ms = first_render(driver, f"{dash.base}/?page={last}")[0]
        # round end to page
        folder = job_folder(work / "fedavg", {"name": "bench-live", "deploy_map":
                            {"app": ["@ALL"]}}, APP, {"train.py": TRAIN, "model.py": MODEL})
        with fed.session(LEAD, study="alpha") as s:
            job = s.submit(folder)
            driver.get(f"{dash.base}/jobs/{job['job_id']}")
            s.wait(job["job_id"], timeout=600)
        deadline = time.monotonic() + 30
        seen = []
        while time.monotonic() < deadline and len(seen) < ROUNDS:
            seen = driver.execute_script("return window.atollSeen")
            time.sleep(0.1)
        lags = [(e["seen"] - e["at"]) * 1000 for e in seen]
        time.sleep(3)  # at rest: no page open on it
        driver.get("about:blank")
        time.sleep(2)
        rss = rss_mib(dash.proc.pid)
        maps = Path(f"/proc/{dash.proc.pid}/maps").read_text()
        ml = [name for name in ("numpy", "torch") if f"/{name}/" in maps]
        http_dash.stop()
    finally:
        if driver is not None:
            driver.quit()
        if dash is not None:
            dash.stop()
        fed.stop_all()
    load = os.getloadavg()[0]
    lines = [
        f"Run {dt.date.today().isoformat()} on {os.cpu_count()} cores (load average "
        f"{load:.1f} while it ran: other work shares the machine), with "
        "`.venv/bin/python -m bench.dashboard` (`make bench-dashboard`): a server and two sites "
        "as processes (mutual TLS, SQLite), `atoll dashboard` as its own process, Debian's "
        f"headless Chromium. The study holds {args.jobs:,} finished jobs (written into the "
        f"server's store in {filled:.1f} s while it was stopped).",
        "",
        "| What | Result | Target | Met |",
        "| --- | --- | --- | --- |",
        f"| First page load: navigation to the overview's first render (sites and a page of "
        f"jobs), cache off, {args.loads} loads | median {statistics.median(loads):.0f} ms, "
        f"worst {max(loads):.0f} ms (the page's own files: median "
        f"{statistics.median(files):.0f} ms; the rest, the sites and jobs from the server) | "
        f"≤ 300 ms (median) | {met(statistics.median(loads) <= 300)} |",
    ]
    for label, (page, median, worst, size) in pages.items():
        lines.append(f"| Jobs list, {label} page (page {page}, 50 of {args.jobs:,} jobs, with "
                     f"the sites): `/api/overview`, 20 requests | median {median:.1f} ms, worst "
                     f"{worst:.1f} ms, {size:,} bytes | stays fast | |")
    lines += [
        f"| The dashboard's CPU time for those 60 requests | {cpu_pages * 1000:.0f} ms | | |",
        f"| The last page ({last}) in Chromium: navigation to first render | "
        f"{last_page_ms:.0f} ms | | |",
        f"| Round end (the server's event time) to the job page, {len(lags)} rounds | "
        + (f"median {statistics.median(lags):.0f} ms, worst {max(lags):.0f} ms" if lags
           else "no round seen") + f" | ≤ 1 s | {met(bool(lags) and max(lags) <= 1000)} |",
        f"| The dashboard's RSS at rest | {rss:.1f} MiB | ≤ 60 MiB | {met(rss <= 60)} |",
        f"| ML libraries mapped in the dashboard | {', '.join(ml) or 'none'} | none | "
        f"{met(not ml)} |",
    ]
    text = "\n".join(lines)
    print(text)
    if not args.no_write:
        write_section(ROOT / "BENCHMARKS.md", "dashboard",
                      "The dashboard: page load, 10,000 jobs, live rounds (issue 39)", text)


if __name__ == "__main__":
    main()
