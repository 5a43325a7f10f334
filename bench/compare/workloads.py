"""The workloads of issue 9, measured identically for every system through its driver.

One call of `run_cycle` is one repeat for one system: a fresh deployment is provisioned,
started and measured, jobs run on it, and it is stopped; every process it started is gone
when the call returns, whatever happened. Each metric is a number or, when that step
failed, a string saying why (the table shows it instead of a number).
"""

from __future__ import annotations

import statistics
import time
from dataclasses import dataclass
from pathlib import Path

from drivers.base import Driver, DriverError, read_marks, wait_until
from proctree import RssSampler

TINY_MB = 4 / 1024  # 4 KiB: "a tiny numpy model (a few KB)"
ALL = ["d", "c", "f", "a", "e", "b100", "b1000", "b4000", "llm1", "llm4", "llm8"]  # in order
# issue 40: language-model-shaped bf16 models (drivers/base.py llm_layers), MiB
LLM = {"llm1": 1024, "llm4": 4096, "llm8": 8192}
ABORT_ROUNDS = 10_000  # a job that would run for hours unless aborted


@dataclass
class Options:
    rounds: int = 3
    ready_timeout: float = 120.0
    settle_s: float = 5.0
    idle_window_s: float = 3.0
    rss_hz: float = 20.0
    rss_limit_bytes: int = 16 * 2**30
    min_available_bytes: int = 2 * 2**30  # the watchdog: stop before the machine runs short
    stop_grace_s: float = 20.0


def job_timeout(model_mb: float, rounds: int) -> float:
    return 180 + rounds * (30 + 150 * model_mb / 1024)


def per_round(marks: dict[int, float]) -> float:
    """Mean time between consecutive rounds' model arrivals at the first client."""
    starts = [marks[r] for r in sorted(marks)]
    if len(starts) < 2:
        raise DriverError(f"only {len(starts)} round(s) were marked by the clients")
    return (starts[-1] - starts[0]) / (len(starts) - 1)


def _job(
    driver: Driver,
    model_mb: float,
    opts: Options,
    marks: Path,
    prefix: str,
    metrics: dict,
    sample_rss: bool,
    shape: str = "flat",
) -> None:
    marks.mkdir(parents=True, exist_ok=True)
    job = driver.prepare_job(model_mb, opts.rounds, marks, shape=shape)

    def over_limit(total: int) -> None:
        driver.log(
            f"  {driver.name}: RSS {total / 2**30:.1f} GiB passed the "
            f"{opts.rss_limit_bytes / 2**30:.0f} GiB limit: stopping the deployment"
        )
        driver.table.kill_all(grace_s=0.5)

    def low_memory(total: int) -> None:
        if sampler.low_memory:
            driver.log(f"  {driver.name}: MemAvailable {sampler.low_memory / 2**30:.1f} GiB, "
                       "under the watchdog's floor: stopping the deployment")
            driver.table.kill_all(grace_s=0.5)
        else:
            over_limit(total)

    sampler = RssSampler(
        driver.table, opts.rss_hz, opts.rss_limit_bytes if sample_rss else None, low_memory,
        min_available=opts.min_available_bytes if sample_rss else None,
    )
    with sampler:
        try:
            run = driver.submit(job)
            driver.wait_finished(run, job_timeout(model_mb, opts.rounds))
        except DriverError:
            if not sampler.limit_hit:
                raise
            # Keep what was measured before the stop: the rounds that did complete.
            limit = f"{opts.rss_limit_bytes / 2**30:.0f} GiB"
            if sampler.low_memory:
                limit = (f"the machine's free memory ({sampler.low_memory / 2**30:.1f} GiB "
                         "available)")
            metrics[f"{prefix}_peak_rss"] = f"over {limit}: stopped at the limit"
            metrics[f"{prefix}_peak_seen"] = sampler.peak
            metrics[f"{prefix}_growth"] = _growth(sampler)
            marked = read_marks(marks)
            if len(marked) >= 2:
                metrics[f"{prefix}_round_s"] = per_round(marked)
                metrics[f"{prefix}_partial_rounds"] = len(marked) - 1
            raise DriverError(f"stopped: RSS passed {limit} during round {len(marked)}") from None
    if not run.status.lower().endswith("completed"):
        raise DriverError(f"job ended {run.status}")
    metrics[f"{prefix}_wall_s"] = run.finished_at - run.submitted_at
    metrics[f"{prefix}_round_s"] = per_round(read_marks(marks))
    metrics[f"{prefix}_submit_cli_s"] = run.extra.get("submit_cli_s")
    if "checkpoint_bytes" in run.extra:  # atoll's server checkpoint (drivers/atoll.py)
        metrics[f"{prefix}_checkpoint_bytes"] = run.extra["checkpoint_bytes"]
    if "cpu_s" in run.extra:  # atoll in the sandbox's cost run (drivers/atoll.py)
        metrics[f"{prefix}_cpu_s"] = run.extra["cpu_s"]
        metrics[f"{prefix}_others_cores"] = run.extra.get("others_cores")
    if sample_rss:
        metrics[f"{prefix}_peak_rss"] = sampler.peak
        metrics[f"{prefix}_growth"] = _growth(sampler)
        driver.log(f"  {prefix} RSS growth by process (first seen -> highest): " + ", ".join(
            f"{name} {first / 2**20:.0f} MiB +{grown / 2**20:.0f} MiB"
            for name, _, first, grown in sampler.growth()))
        driver.log(f"  {prefix} peak RSS by process (of which file-backed): " + ", ".join(
            f"{name} {rss / 2**20:.0f} MiB ({files / 2**20:.0f})"
            for name, rss, files in sorted(sampler.at_peak, key=lambda x: -x[1])))


def _growth(sampler: RssSampler) -> list[list]:
    return [[name, pid, first, grown] for name, pid, first, grown in sampler.growth()]


def _abort(driver: Driver, marks: Path, metrics: dict) -> None:
    marks.mkdir(parents=True, exist_ok=True)
    run = driver.submit(driver.prepare_job(TINY_MB, ABORT_ROUNDS, marks))
    driver.forget(run)  # not waited for: aborted
    wait_until(lambda: read_marks(marks), 180, 0.1, "the first round to reach a client")
    wait_until(driver.job_processes, 30, 0.05, "the job's processes")
    t0 = time.time()
    driver.abort(run)
    t_cli = time.time()
    wait_until(lambda: not driver.job_processes(), 180, 0.05, "every job process to exit")
    metrics["e_abort_s"] = time.time() - t0
    metrics["e_abort_cli_s"] = t_cli - t0


def _step(metrics: dict, keys: list[str], fn, *args) -> bool:
    """Run one workload; on failure record the reason under each of its metric keys."""
    try:
        fn(*args)
        return True
    except (DriverError, NotImplementedError, OSError) as exc:
        for key in keys:
            metrics.setdefault(key, f"failed: {exc}")
        return False


def run_cycle(driver: Driver, wanted: list[str], opts: Options) -> dict:
    metrics: dict = {}
    work = driver.workdir
    try:
        driver.prepare()
        ready = driver.watcher("ready")  # armed before the clock starts (drivers/base.py)
        t0 = time.time()
        try:
            driver.start_deployment()
            seen_ready = driver.wait_ready(ready, opts.ready_timeout)
        finally:
            ready.drop()
        metrics["d_ready_s"] = seen_ready - t0
        metrics["d_processes"] = len(driver.deployment_pids())
    except (DriverError, NotImplementedError, OSError) as exc:
        driver.log(f"  {driver.name}: deployment failed: {exc}")
        _finish(driver, opts, metrics)
        return {k: f"failed: {exc}" for k in metric_keys(wanted)} | metrics
    try:
        if "c" in wanted:
            time.sleep(opts.settle_s)
            with RssSampler(driver.table, opts.rss_hz) as s:
                time.sleep(opts.idle_window_s)
            metrics["c_idle_rss"] = s.median
        if "f" in wanted:

            def list_once() -> None:
                driver.list_jobs()  # first call warms the OS file cache, not timed
                t = time.time()
                driver.list_jobs()
                metrics["f_list_s"] = time.time() - t

            _step(metrics, ["f_list_s"], list_once)
        if "a" in wanted:
            _step(
                metrics,
                ["a_wall_s", "a_round_s"],
                _job,
                driver,
                TINY_MB,
                opts,
                work / "marks-a",
                "a",
                metrics,
                False,
            )
        if "e" in wanted:
            _step(metrics, ["e_abort_s"], _abort, driver, work / "marks-e", metrics)
        for size, key in ((100, "b100"), (1024, "b1000"), (4096, "b4000")):
            if key in wanted:
                ok = _step(
                    metrics,
                    [f"{key}_round_s", f"{key}_peak_rss"],
                    _job,
                    driver,
                    size,
                    opts,
                    work / f"marks-{key}",
                    key,
                    metrics,
                    True,
                )
                if not ok and not driver.deployment_pids():
                    break  # the deployment is gone (e.g. the RSS limit): nothing else can run
        for key, size in LLM.items():
            if key in wanted:
                ok = _step(metrics, [f"{key}_round_s", f"{key}_peak_rss"], _job, driver, size,
                           opts, work / f"marks-{key}", key, metrics, True, "llm")
                if not ok and not driver.deployment_pids():
                    break
    finally:
        _finish(driver, opts, metrics)
    return metrics


def _finish(driver: Driver, opts: Options, metrics: dict) -> None:
    """Stop the deployment its own way, give it time to exit, then kill what is left."""
    t0 = time.time()
    try:
        driver.stop_deployment()
        deadline = time.monotonic() + opts.stop_grace_s
        while driver.table.scan() and time.monotonic() < deadline:
            time.sleep(0.1)
    except (DriverError, NotImplementedError, OSError) as exc:
        driver.log(f"  {driver.name}: stop failed: {exc}")
    metrics["stop_s"] = time.time() - t0
    killed = driver.cleanup()
    if killed:
        metrics["killed_after_stop"] = killed


def metric_keys(wanted: list[str]) -> list[str]:
    keys = {
        "d": ["d_ready_s"],
        "c": ["c_idle_rss"],
        "f": ["f_list_s"],
        "a": ["a_wall_s", "a_round_s"],
        "e": ["e_abort_s"],
        "b100": ["b100_round_s", "b100_peak_rss"],
        "b1000": ["b1000_round_s", "b1000_peak_rss"],
        "b4000": ["b4000_round_s", "b4000_peak_rss"],
        **{k: [f"{k}_round_s", f"{k}_peak_rss"] for k in LLM},
    }
    return [k for w in wanted for k in keys[w]]


def median_of(values: list) -> tuple[float | None, int, str]:
    """(median of the numeric values, how many, first failure reason or '')."""
    numbers = [v for v in values if isinstance(v, (int, float))]
    failures = [v for v in values if isinstance(v, str)]
    return (
        statistics.median(numbers) if numbers else None,
        len(numbers),
        failures[0] if failures else "",
    )
