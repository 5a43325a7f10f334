"""The scale run's simulated sites speak the real protocol: a real server parent, mutual TLS,
certificates from the project's CA, a scatter_gather job to every simulated site."""

from __future__ import annotations

import json

from atoll.admin.session import Session
from bench.scale import ScaleRun
from bench.scale_proc import children


def test_simulated_sites_run_a_job_against_a_real_server(tmp_path):
    run = ScaleRun(6, rounds=2, payload=1000, work=tmp_path)
    run.idle_s = 0  # no idle measurement in a test
    result = run.run(Session)
    assert result["job_state"] == "FINISHED:COMPLETED", result
    assert result["sites_welcomed"] == 6
    assert result["tasks_per_round"] == [6, 6]  # every site got every round's task
    assert "deploy_s" in result and "round_s" in result
    assert "links_broken" not in result
    # the server checked every echo: each reply carried the payload it had sent
    report = json.loads(
        next((tmp_path / "scale" / "server").rglob("scatter_gather.json")).read_text()
    )
    assert all(r["echoed"] for entry in report["rounds"] for r in entry["replies"].values())
    # everything the run started is gone
    assert run.server is not None and run.server.poll() is not None
    assert all(p.poll() is not None for p in run.procs)
    assert children(run.server.pid) == []
