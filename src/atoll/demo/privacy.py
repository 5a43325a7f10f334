"""`python -m atoll.demo.privacy`: the hospitals demo with secure aggregation and DP-FedAvg.

The same three hospitals, data and job as `make demo`, run as variants that differ only in
app.yaml's ``privacy`` section (and an ``initial_model``: privacy works on updates against a
global model): plain FedAvg, secure aggregation, and client-level DP-FedAvg (each hospital clips
its update and adds Gaussian noise, under secure aggregation) at several noise multipliers.
Prints test accuracy against epsilon (delta 1e-5) over a real local federation (mutual TLS,
one process per parent and worker), or in one process with ``--simulate``.

    python -m atoll.demo.privacy [--workspace DIR] [--simulate] [--noise 0.01 0.1 ...]
"""

from __future__ import annotations

import argparse
import json
import shutil
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import yaml

CLIP_NORM = 1.0
DELTA = 1e-5
NOISE_LEVELS = (0.01, 0.03, 0.1)
DP_SGD_LEVELS = (1.0,)
MODEL_PY = '''"""The demo's first global model: zeros, as every site starts from (atoll.demo.task)."""
from atoll.demo.task import make_model


def make():
    return make_model().state_dict()
'''


def variants(noise_levels: tuple[float, ...] = NOISE_LEVELS,
             dp_sgd_levels: tuple[float, ...] = ()) -> dict[str, dict[str, Any] | None]:
    """Variant name -> app.yaml's privacy section (None: none)."""
    out: dict[str, dict[str, Any] | None] = {"fedavg": None, "secagg": {"secure_aggregation": {}}}
    for z in noise_levels:
        out[f"dp-z{z:g}"] = {"dp": {"mode": "client", "clip_norm": CLIP_NORM,
                                    "noise_multiplier": z, "delta": DELTA},
                             "secure_aggregation": {}}
    for z in dp_sgd_levels:  # example level: hides one record, not a whole hospital
        out[f"dpsgd-z{z:g}"] = {"dp_sgd": {"noise_multiplier": z, "max_grad_norm": 1.0,
                                           "delta": DELTA},
                                "secure_aggregation": {}}
    return out


def make_variant(job_dir: Path, out: Path, privacy: dict[str, Any] | None) -> Path:
    """A copy of the hospitals job with ``privacy`` in app.yaml and a zero initial model."""
    shutil.rmtree(out, ignore_errors=True)
    shutil.copytree(job_dir, out)
    app = out / "app" / "app.yaml"
    doc = yaml.safe_load(app.read_text())
    doc["server"]["initial_model"] = "model.py:make"
    if privacy is not None:
        doc["privacy"] = privacy
        if "dp_sgd" in privacy:  # the demo's train.py then trains with Opacus
            doc["site"].setdefault("config", {})["dp_sgd"] = True
    app.write_text(yaml.safe_dump(doc, sort_keys=False))
    (out / "app" / "model.py").write_text(MODEL_PY)
    meta = json.loads((out / "meta.json").read_text())
    meta["name"] = f"hospitals-{out.name}"
    (out / "meta.json").write_text(json.dumps(meta, indent=2))
    return out


def row(name: str, results: Path, data: Path, seconds: float) -> dict[str, Any]:
    from atoll.demo import data as demo_data

    summary = json.loads((results / "summary.json").read_text())
    privacy = summary.get("privacy", {})
    epsilon = privacy.get("epsilon")
    if epsilon is None:  # DP-SGD: the largest epsilon a site reported (example level)
        rows = [json.loads(line) for line in (results / "metrics.jsonl").read_text().splitlines()]
        sgd = [r["metrics"]["dp_sgd_epsilon"] for r in rows if "dp_sgd_epsilon" in r["metrics"]]
        epsilon = max(sgd) if sgd else None
    return {"variant": name, "accuracy": demo_data.federated_accuracy(results, data),
            "epsilon": epsilon, "delta": privacy.get("delta") or (DELTA if epsilon else None),
            "secure_aggregation": bool(privacy.get("secure_aggregation")),
            "rounds": summary["num_rounds"], "seconds": round(seconds, 1)}


def format_rows(rows: list[dict[str, Any]]) -> str:
    lines = [f"{'variant':<12} {'secure agg':>10} {'epsilon':>12} {'test accuracy':>14}"]
    for r in rows:
        eps = "inf (no DP)" if r["epsilon"] is None else f"{r['epsilon']:.4g}"
        lines.append(f"{r['variant']:<12} {'yes' if r['secure_aggregation'] else 'no':>10} "
                     f"{eps:>12} {100 * r['accuracy']:>13.2f}%")
    return "\n".join(lines)


def simulate_variants(workspace: Path, names: dict[str, dict[str, Any] | None]
                      ) -> list[dict[str, Any]]:
    from atoll.demo import data as demo_data
    from atoll.fl.simulator import simulate

    folders = demo_data.prepare(workspace / "data")
    sites = {site: {demo_data.DATASET: str(folder)} for site, folder in folders.items()}
    rows = []
    for name, privacy in names.items():
        job = make_variant(demo_data.JOB_DIR, workspace / "jobs" / name, privacy)
        started = time.monotonic()
        result = simulate(job, sites, results_dir=workspace / "results" / name)
        if result.site_errors:
            raise RuntimeError(f"{name}: {result.site_errors}")
        rows.append(row(name, result.results_dir, workspace / "data", time.monotonic() - started))
    return rows


def federate_variants(workspace: Path, names: dict[str, dict[str, Any] | None],
                      say: Callable[[str], None] = print) -> list[dict[str, Any]]:
    """Every variant as a job of one local federation (server + three hospitals, mutual TLS)."""
    from atoll.admin.session import Session
    from atoll.demo import data as demo_data
    from atoll.demo.run import RESEARCHER, STUDY, map_datasets, provision_demo
    from atoll.parent import detach

    shutil.rmtree(workspace, ignore_errors=True)
    workspace.mkdir(parents=True)
    folders = demo_data.prepare(workspace / "data")
    project = provision_demo(workspace, demo_data.SITES)
    map_datasets(project, folders)
    parents = [("server", project / "server")] + [("site", project / s) for s in demo_data.SITES]
    rows = []
    try:
        detach.start_many([(role, kit, kit / "workspace") for role, kit in parents])
        with Session(project / RESEARCHER, study=STUDY) as session:
            while not all(s["online"] for s in session.sites()["sites"]):
                time.sleep(0.02)
            for name, privacy in names.items():
                job_dir = make_variant(demo_data.JOB_DIR, workspace / "jobs" / name, privacy)
                started = time.monotonic()
                job = session.submit(job_dir, wait=True, timeout=900)
                seconds = time.monotonic() - started
                if job["state"] != "FINISHED:COMPLETED":
                    logs = session.logs(job["job_id"])["logs"]
                    raise RuntimeError(f"{name}: job {job['state']}: {job.get('reason')}\n"
                                       + "\n".join(f"--- {k} ---\n{v[-2000:]}"
                                                   for k, v in logs.items()))
                out = session.download(job["job_id"], workspace / "download" / name)
                rows.append(row(name, out / "results", workspace / "data", seconds))
                say(format_rows(rows[-1:]).splitlines()[-1] + f"   ({seconds:.1f} s)")
    finally:
        for role, kit in reversed(parents):
            detach.stop(kit / "workspace", role)
    return rows


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m atoll.demo.privacy",
                                     description=__doc__.split("\n")[0])
    parser.add_argument("--workspace", type=Path, default=Path("workspace/demo-privacy"))
    parser.add_argument("--simulate", action="store_true", help="one process, no federation")
    parser.add_argument("--noise", type=float, nargs="*", default=list(NOISE_LEVELS),
                        help="DP-FedAvg noise multipliers to try")
    parser.add_argument("--dp-sgd", type=float, nargs="*", default=list(DP_SGD_LEVELS),
                        help="DP-SGD (example-level) noise multipliers to try")
    parser.add_argument("--json", type=Path, help="also write the table here")
    args = parser.parse_args(argv)
    names = variants(tuple(args.noise), tuple(args.dp_sgd))
    workspace = args.workspace.resolve()
    rows = (simulate_variants(workspace, names) if args.simulate
            else federate_variants(workspace, names))
    print(format_rows(rows))
    if args.json:
        args.json.write_text(json.dumps(rows, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
