"""`atoll dashboard` in a real headless Chromium against a real local federation (a server and
two sites as processes, mutual TLS, SQLite): the sites show online; a FedAvg job's round
counter and curves (global and per site) advance without a reload; a page opened after a DP
job ended shows each part's every state change with the server's times, and ε per round; a
server restart is survived by the overview and by a running job's page, whose job resumes
(each says it reconnected); a lead of another study sees none of it, and that study's job URL
answers as an unknown id does; abort asks for confirmation, works for the job's lead and is
refused for a member; no page logs a console error; Ctrl-C stops the dashboard cleanly. Each
page's screenshot goes to build/dashboard/ (docs/dashboard/ with ATOLL_SCREENSHOTS=docs)."""

from __future__ import annotations

import http.client
import signal

import pytest

from tests.integration.federation.dashboard_browser import (
    browser,
    console_errors,
    screenshot,
    start_dashboard,
    text,
    until,
)
from tests.integration.federation.harness import Federation, job_folder, wait_for
from tests.integration.federation.jobs import STALL, make_job

ADMIN, LEAD_A, MEMBER_A, LEAD_B = ("admin@consortium.org", "lead@a.org", "member@a.org",
                                   "lead@b.org")
USERS = [
    {"name": ADMIN, "org": "consortium", "role": "project_admin"},
    {"name": LEAD_A, "org": "org-site-1", "role": "lead"},
    {"name": MEMBER_A, "org": "org-site-1", "role": "member"},
    {"name": LEAD_B, "org": "org-site-2", "role": "lead"},
]
STUDIES = {
    "alpha": {"sites": ["site-1", "site-2"], "admins": [LEAD_A, MEMBER_A]},
    "beta": {"sites": ["site-2"], "admins": [LEAD_B]},
}
RUNTIME = {"site-1": "format_version: 2\nstudies:\n  alpha: {}\n",
           "site-2": "format_version: 2\nstudies:\n  alpha: {}\n  beta: {}\n"}
ROUNDS = 4
# Each round takes a second or so at each site: the page is watched while they come.
TRAIN = '''
import time
import atoll.client as fl

fl.init()
while fl.is_running():
    model = fl.receive()
    if fl.is_evaluate():
        fl.send(fl.Model(metrics={"accuracy": 0.5 + 0.1 * (model.round or 0)}, num_examples=5))
        continue
    time.sleep(1.0)
    loss = 1.0 / (1 + (model.round or 0))
    fl.send(fl.Model(params={k: v + 1 for k, v in model.params.items()}, num_examples=10,
                     metrics={"loss": loss}))
'''
MODEL = '''
import numpy as np


def make():
    return {"w": np.zeros((2, 2), np.float32)}
'''
APP = f"""server:
  workflow: fedavg
  args: {{num_rounds: {ROUNDS}, round_timeout: 120}}
  initial_model: model.py:make
site:
  script: train.py
"""
UNKNOWN = "0" * 32
DP_ROUNDS = 3
DP_APP = APP.replace(f"num_rounds: {ROUNDS}", f"num_rounds: {DP_ROUNDS}") + (
    "privacy:\n  dp: {clip_norm: 1.0, noise_multiplier: 0.5, delta: 1.0e-5}\n")
RESUME_ROUNDS = 6
RESUME_APP = APP.replace(f"num_rounds: {ROUNDS}", f"num_rounds: {RESUME_ROUNDS}")


@pytest.fixture(scope="module")
def fed(tmp_path_factory):
    fed = Federation.provisioned(tmp_path_factory.mktemp("dash"), ["site-1", "site-2"], USERS,
                                 STUDIES, runtime=RUNTIME)
    fed.start_all()
    fed.wait_online(ADMIN)
    yield fed
    fed.stop_all()


@pytest.fixture(scope="module")
def driver():
    drv = browser()
    yield drv
    drv.quit()


@pytest.fixture(scope="module")
def dashboards(fed, tmp_path_factory):
    home = tmp_path_factory.mktemp("homes")
    started = {who: start_dashboard(fed.kit(who), study, home / who)
               for who, study in ((LEAD_A, "alpha"), (MEMBER_A, "alpha"), (LEAD_B, "beta"))}
    yield started
    for dash in started.values():
        dash.stop()


def _open(driver, dash) -> None:
    """The printed link once (it buys this browser the dashboard's cookie)."""
    driver.get(dash.url)
    assert "token=" not in driver.current_url  # gone from the address bar and history


def _site_states(driver) -> dict[str, str]:
    rows = driver.find_elements("css selector", "#sites tbody tr")
    return {r.get_attribute("data-site"): r.find_elements("tag name", "td")[1].text
            for r in rows}


def _traces(driver, chart: str) -> list[str]:
    """The names of a chart's curves, as plotly holds them."""
    return driver.execute_script(
        "const div = document.querySelector(`#charts .chart[data-chart='${arguments[0]}']`);"
        "return div ? div.data.map(t => t.name) : [];", chart)


def _timeline(driver) -> list[tuple[str, str, float]]:
    return [(r.get_attribute("data-part"), r.get_attribute("data-state"),
             float(r.get_attribute("data-at")))
            for r in driver.find_elements("css selector", "#timeline tbody tr")]


def _chart_points(driver) -> int:
    return sum(int(c.get_attribute("data-points") or 0)
               for c in driver.find_elements("css selector", "#charts .chart"))


@pytest.fixture(scope="module")
def opened(driver, dashboards):
    """Each dashboard's link used once, in this one browser (each has its own cookie)."""
    for dash in dashboards.values():
        _open(driver, dash)
    assert console_errors(driver) == []
    return dashboards


def test_the_overview_lists_both_sites_online(driver, opened):
    driver.get(opened[LEAD_A].base + "/")
    until(driver, lambda d: _site_states(d) == {"site-1": "online", "site-2": "online"},
          "both sites online")
    assert "lead@a.org (lead) · study alpha" in text(driver, "who")
    row = driver.find_element("css selector", '#sites tr[data-site="site-1"]').text
    assert "process" in row and "ago" in row  # launcher, last heartbeat
    assert console_errors(driver) == []


def test_a_jobs_round_counter_and_curves_advance_without_reload(driver, opened, fed, tmp_path):
    folder = job_folder(tmp_path / "fedavg", {"name": "fedavg-live", "deploy_map":
                        {"app": ["@ALL"]}}, APP, {"train.py": TRAIN, "model.py": MODEL})
    # The job waits for site-1 while the page opens: every round runs with the page watching.
    fed.kill("site-1")
    with fed.session(LEAD_A, study="alpha") as s:
        wait_for(lambda: not {x["name"]: x for x in s.sites()["sites"]}["site-1"]["online"],
                 what="site-1 offline")
        job = s.submit(folder)
    driver.get(f"{opened[LEAD_A].base}/jobs/{job['job_id']}")
    until(driver, lambda d: "waiting for sites" in text(d, "reason"), "why the job waits")
    assert text(driver, "name") == "fedavg-live" and text(driver, "state") == "SUBMITTED"
    driver.execute_script("window.__sameDocument = true")  # a reload would forget it
    fed.start_site("site-1")
    until(driver, lambda d: text(d, "state") == "FINISHED:COMPLETED", "the job completed",
          timeout=200)
    until(driver, lambda d: text(d, "round") == str(ROUNDS), f"round {ROUNDS}")
    assert driver.execute_script("return window.__sameDocument") is True
    # every round came to the open page over its live stream, and the curves grew with them
    # (the page's own record: a poll from here could miss a round on a loaded machine)
    live = [e["round"] for e in driver.execute_script("return window.atollSeen")]
    assert live == list(range(1, ROUNDS + 1)), live
    drawn = driver.execute_script("return window.atollDrawn")
    assert drawn == sorted(drawn) and len(set(drawn)) >= ROUNDS and drawn[-1] == _chart_points(
        driver), drawn
    titles = {c.get_attribute("data-chart")
              for c in driver.find_elements("css selector", "#charts .chart")}
    assert {"train loss", "validate accuracy"} <= titles, titles
    for chart in ("train loss", "validate accuracy"):  # the global curve and one per site
        assert sorted(_traces(driver, chart)) == ["global", "site-1", "site-2"], chart
    assert text(driver, "rounds") == f"of {ROUNDS}"
    assert "server" in text(driver, "logs")
    assert not driver.find_element("id", "xsec").get_attribute("hidden")  # cross-site table
    magic = driver.execute_async_script(  # the results link, as the page's click fetches it
        "const done = arguments[arguments.length - 1];"
        "fetch(document.getElementById('results').href).then(r => r.arrayBuffer())"
        ".then(b => done(Array.from(new Uint8Array(b.slice(0, 2)))))")
    assert bytes(magic) == b"PK"  # a zip
    driver.find_element("id", "provbtn").click()
    until(driver, lambda d: '"entries"' in text(d, "prov"), "the provenance record")
    screenshot(driver, "job")
    assert console_errors(driver) == []
    driver.get(opened[LEAD_A].base + "/")
    until(driver, lambda d: job["job_id"] in text(d, "jobs"), "the job in the list")
    until(driver, lambda d: _site_states(d) == {"site-1": "online", "site-2": "online"},
          "both sites online")
    row = driver.find_element("css selector", f'#jobs tr[data-job="{job["job_id"]}"]').text
    assert "FINISHED:COMPLETED" in row and LEAD_A in row
    assert console_errors(driver) == []


@pytest.fixture(scope="module")
def dp_job(fed, tmp_path_factory):
    """A small FedAvg job with differential privacy, ended before any page shows it."""
    folder = job_folder(tmp_path_factory.mktemp("dp") / "job", {"name": "fedavg-dp",
                        "deploy_map": {"app": ["@ALL"]}}, DP_APP,
                        {"train.py": TRAIN, "model.py": MODEL})
    with fed.session(LEAD_A, study="alpha") as s:
        job = s.submit(folder, wait=True, timeout=300)
        assert job["state"] == "FINISHED:COMPLETED", job
        return job, s.logs(job["job_id"])


def test_a_page_opened_after_the_job_ended_shows_each_parts_every_state(driver, opened,
                                                                          dp_job):
    job, record = dp_job
    driver.get(f"{opened[LEAD_A].base}/jobs/{job['job_id']}")
    until(driver, lambda d: text(d, "state") == "FINISHED:COMPLETED", "the ended job")
    until(driver, lambda d: len(_timeline(d)) == len(record["part_history"]),
          "the parts' history")
    # the server's record, its times included: nothing the page saw itself
    assert _timeline(driver) == [(h["part"], h["state"], h["at"])
                                 for h in record["part_history"]]
    for part in ("server", "site-1", "site-2"):
        states = [state for name, state, _ in _timeline(driver) if name == part]
        assert states[0] == "SUBMITTED" and states[-1] == "FINISHED:COMPLETED", (part, states)
        assert "RUNNING" in states and len(states) >= 4, (part, states)
        since = driver.find_element("css selector", f'#parts tr[data-part="{part}"]').text
        assert since.split()[-1] != "–", since  # when its last change came, by the server
    assert console_errors(driver) == []


def test_dp_epsilon_shows_one_row_per_round(driver, opened, dp_job):
    job, record = dp_job
    spent = [e["privacy"] for e in record["events"]
             if e.get("event") == "round" and e.get("source") == "server"]
    assert len(spent) == DP_ROUNDS
    driver.get(f"{opened[LEAD_A].base}/jobs/{job['job_id']}")
    until(driver, lambda d: d.find_element("id", "dpsec").is_displayed(), "the ε table")
    rows = [[c.text for c in r.find_elements("tag name", "td")]
            for r in driver.find_elements("css selector", "#dp tbody tr")]
    assert [(r[0], r[1], float(r[2])) for r in rows] == [
        (str(n), f"{p['epsilon']:.3f}", p["delta"]) for n, p in enumerate(spent, 1)], rows
    assert [p["epsilon"] for p in spent] == sorted(p["epsilon"] for p in spent)
    assert _traces(driver, "DP ε") == ["global"]
    assert sorted(_traces(driver, "train loss")) == ["global", "site-1", "site-2"]
    assert console_errors(driver) == []


def test_a_server_restart_is_survived_and_the_page_says_so(driver, opened, fed):
    driver.get(opened[LEAD_A].base + "/")
    until(driver, lambda d: _site_states(d) == {"site-1": "online", "site-2": "online"},
          "both sites online")
    driver.execute_script("window.__sameDocument = true")
    fed.kill("server", signal.SIGTERM)
    until(driver, lambda d: "reconnecting" in text(d, "link"), "the server is unreachable")
    fed.start_server()
    until(driver, lambda d: "reconnected" in text(d, "link"), "reconnected")
    until(driver, lambda d: _site_states(d) == {"site-1": "online", "site-2": "online"},
          "both sites online again", timeout=180)
    assert driver.execute_script("return window.__sameDocument") is True
    assert console_errors(driver) == []


def test_a_running_jobs_page_survives_a_server_restart_and_the_job_resumes(driver, opened, fed,
                                                                            tmp_path):
    folder = job_folder(tmp_path / "resume", {"name": "fedavg-resume", "deploy_map":
                        {"app": ["@ALL"]}}, RESUME_APP, {"train.py": TRAIN, "model.py": MODEL})
    with fed.session(LEAD_A, study="alpha") as s:
        job = s.submit(folder)
    driver.get(f"{opened[LEAD_A].base}/jobs/{job['job_id']}")
    until(driver, lambda d: text(d, "round") not in ("", "–") and int(text(d, "round")) >= 2,
          "round 2")
    driver.execute_script("window.__sameDocument = true")
    fed.kill("server", signal.SIGKILL)  # as test_server_resume.py does: the job resumes
    until(driver, lambda d: "reconnecting" in text(d, "link"), "the server is unreachable")
    assert not text(driver, "state").startswith("FINISHED")
    before = int(text(driver, "round"))
    fed.start_server()
    until(driver, lambda d: "reconnected" in text(d, "link"), "reconnected", timeout=180)
    until(driver, lambda d: int(text(d, "round")) > before, f"a round after {before}",
          timeout=180)
    until(driver, lambda d: text(d, "state") == "FINISHED:COMPLETED", "the job completed",
          timeout=300)
    assert text(driver, "round") == str(RESUME_ROUNDS)
    with fed.session(LEAD_A, study="alpha") as s:  # it resumed, not started over
        assert "after a server restart" in str(s.logs(job["job_id"])["events"])
    assert driver.execute_script("return window.__sameDocument") is True
    assert console_errors(driver) == []


def _row(driver, job_id: str) -> str:
    found = driver.find_elements("css selector", f'#jobs tr[data-job="{job_id}"]')
    return found[0].text if found else ""


def test_the_queue_shows_each_jobs_place_and_why_it_waits(driver, opened, fed, tmp_path):
    driver.get(opened[LEAD_A].base + "/")
    fed.kill("site-1")
    until(driver, lambda d: _site_states(d) == {"site-1": "offline", "site-2": "online"},
          "site-1 offline")
    with fed.session(LEAD_A, study="alpha") as s:
        first = s.submit(make_job(tmp_path / "first"))["job_id"]
        second = s.submit(make_job(tmp_path / "second"))["job_id"]
    why = "waiting for sites: 1 of 2 online, 2 needed (min_clients)"
    until(driver, lambda d: f"#1 in the queue · {why}" in _row(d, first)
          and f"#2 in the queue · {why}" in _row(d, second), "both jobs queued")
    screenshot(driver, "overview")
    fed.start_site("site-1")
    until(driver, lambda d: "FINISHED:COMPLETED" in _row(d, first)
          and "FINISHED:COMPLETED" in _row(d, second), "both jobs completed", timeout=300)
    assert "in the queue" not in text(driver, "jobs")
    assert console_errors(driver) == []


def _shown_error(driver, dash, job_id: str) -> str:
    driver.get(f"{dash.base}/jobs/{job_id}")
    until(driver, lambda d: text(d, "error"), "an error")
    return text(driver, "error")


def test_a_lead_of_another_study_sees_none_of_it(driver, opened, fed, tmp_path):
    with fed.session(LEAD_A, study="alpha") as s:
        s.submit(make_job(tmp_path / "alpha-only"))  # in any test order, alpha has a job
        alpha_jobs = [j["job_id"] for j in s.list_jobs()]
    driver.get(opened[LEAD_B].base + "/")
    until(driver, lambda d: _site_states(d) == {"site-2": "online"}, "beta's one site")
    until(driver, lambda d: text(d, "pageinfo") == "no jobs", "no jobs")
    assert not any(j in driver.page_source for j in alpha_jobs)
    assert "alpha-only" not in driver.page_source and "fedavg-live" not in driver.page_source
    forged = _shown_error(driver, opened[LEAD_B], alpha_jobs[0])
    screenshot(driver, "other-study")
    unknown = _shown_error(driver, opened[LEAD_B], UNKNOWN)
    assert forged.replace(alpha_jobs[0], "ID") == unknown.replace(UNKNOWN, "ID")
    assert forged == f"no such job: {alpha_jobs[0]}"
    # the page's own 404s for the two fetches, and nothing else
    assert console_errors(driver, allowed=("status of 404",)) == []


HOLD_ABORT_ANSWER = """
const fetched = window.fetch;
window.fetch = async (url, options) => {
  const answer = await fetched(url, options);
  if (!String(url).endsWith("/abort")) return answer;
  while (!document.getElementById("state").textContent.startsWith("FINISHED")) {
    await new Promise((done) => setTimeout(done, 50));
  }
  setTimeout(() => { window.atollAbortAnswered = true; }, 300);
  return answer;
};
"""


def test_abort_asks_works_for_the_lead_and_is_refused_for_a_member(driver, opened, fed,
                                                                   tmp_path):
    with fed.session(LEAD_A, study="alpha") as s:
        job = s.submit(make_job(tmp_path / "stall", script=STALL))
    page = f"/jobs/{job['job_id']}"
    driver.get(opened[MEMBER_A].base + page)
    until(driver, lambda d: d.find_element("id", "abort").is_displayed(), "the abort button")
    driver.find_element("id", "abort").click()
    alert = driver.switch_to.alert
    assert job["job_id"] in alert.text
    alert.dismiss()  # asked, and said no: nothing is sent
    assert not driver.find_element("id", "abortmsg").is_displayed()
    driver.find_element("id", "abort").click()
    driver.switch_to.alert.accept()
    until(driver, lambda d: "abort refused" in text(d, "abortmsg"), "the refusal")
    assert "may not abort" in text(driver, "abortmsg")
    assert console_errors(driver, allowed=("status of 403",)) == []
    with fed.session(LEAD_A, study="alpha") as s:
        assert not s.status(job["job_id"])["state"].startswith("FINISHED")
    driver.get(opened[LEAD_A].base + page)
    until(driver, lambda d: d.find_element("id", "abort").is_displayed(), "the abort button")
    # the abort's answer held until the stream has shown the job's end (as a busy machine may
    # have it): the page keeps showing the end, not the job as it was when the abort was asked
    driver.execute_script(HOLD_ABORT_ANSWER)
    driver.find_element("id", "abort").click()
    driver.switch_to.alert.accept()
    until(driver, lambda d: d.execute_script("return window.atollAbortAnswered === true"),
          "the abort's answer handled", timeout=180)
    assert text(driver, "state") == "FINISHED:ABORTED"
    with fed.session(LEAD_A, study="alpha") as s:
        assert s.status(job["job_id"])["state"] == "FINISHED:ABORTED"
    assert console_errors(driver) == []


def test_the_dashboard_is_small_at_rest_and_loads_no_ml_library(driver, opened):
    """After every page above was served: no numpy or torch in its memory map, and its RSS
    within the issue's 60 MiB."""
    from pathlib import Path

    driver.get("about:blank")  # no page open on it: at rest
    for dash in opened.values():
        pid = dash.proc.pid
        maps = Path(f"/proc/{pid}/maps").read_text()
        assert "/numpy/" not in maps and "/torch/" not in maps
        status = Path(f"/proc/{pid}/status").read_text()
        rss_kib = int(status.split("VmRSS:")[1].split()[0])
        assert rss_kib <= 60 * 1024, f"{rss_kib / 1024:.1f} MiB"


def test_ctrl_c_stops_the_dashboard_with_a_page_open(fed, tmp_path):
    """SIGINT, as a terminal's Ctrl-C sends it, while a page follows the study: exit 0 and
    "dashboard stopped", no traceback."""
    dash = start_dashboard(fed.kit(LEAD_A), "alpha", tmp_path / "home")
    try:
        conn = http.client.HTTPConnection(dash.base.split("//")[1], timeout=60)
        conn.request("GET", "/" + dash.url.split("/", 3)[3])
        answer = conn.getresponse()
        answer.read()
        cookie = answer.getheader("set-cookie").split(";", 1)[0]
        conn.request("GET", "/api/overview/stream", headers={"Cookie": cookie})
        stream = conn.getresponse()
        assert stream.status == 200 and stream.readline().startswith(b": atoll")
        dash.proc.send_signal(signal.SIGINT)
        _, err = dash.proc.communicate(timeout=60)
        conn.close()
    finally:
        if dash.proc.poll() is None:
            dash.proc.kill()
            dash.proc.wait()
    assert dash.proc.returncode == 0, err
    assert "dashboard stopped" in err and "Traceback" not in err, err
