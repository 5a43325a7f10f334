"""Run a job in one process: the server's workflow and every site's script, in threads.

No federation, certificates or workers: an in-memory ``ServerChannel``/``SiteChannel`` pair
(queues) carries the tasks and replies. Payload chunks are copied as they are sent, like a wire
would, so a script that keeps training after ``fl.send()`` cannot change what the server got.
Use it to develop a job before submitting it, and in tests:

```python
from atoll.fl.simulator import simulate
result = simulate("examples/hospitals", {"hospital-1": {"records": "/tmp/data/hospital-1"}, ...})
print(result.results_dir, result.events[-1])
```

Sites share the process: their scripts see one ``sys.argv`` and working directory (the site
app's, set once), so every site app of a simulated job must use the same folder and arguments.
They also share what ML libraries keep per process (accelerate's ``AcceleratorState``, which
each Hugging Face ``TrainingArguments`` resets), so site scripts take turns: one runs at a time,
and gives up its turn while it waits for a task (``Turns``); the server's workflow runs beside
them.
A site script that raises "drops out" exactly as a crashed worker would: the server sees an
error reply for its pending and later tasks. ``Federation`` gives tests the channels directly.
"""

from __future__ import annotations

import ast
import importlib
import importlib.util
import json
import os
import queue
import sys
import tempfile
import threading
import time
import traceback
import uuid
from collections.abc import Callable, Iterable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

# The app.yaml models, loaded here once: the sites' threads would each import them at their
# first app.yaml the plain check leaves to them (fl/runner.py), all at once.
import atoll.fl.app_config  # noqa: F401
from atoll.fl.channels import Chunk, Reply, Task
from atoll.spec.budget_ledger import LedgerRefused, StudyBudget, StudyLedger
from atoll.spec.errors import EXIT_INVALID, AtollError

EventSink = Callable[[dict[str, Any]], None]


class SimulationError(AtollError, RuntimeError):
    """The job cannot be simulated as given (meta.json, sites); the message says what to fix."""

    exit_code = EXIT_INVALID


@dataclass
class _TaskState:
    targets: list[str]
    waiting: set[str]
    replies: queue.Queue = field(default_factory=queue.Queue)


class MemoryLedger:
    """The simulator's stand-in for the site parents' privacy ledgers (site/privacy_ledger.py):
    one study, in memory, the same arithmetic. Give one to several Federations to simulate a
    study's jobs one after the other; ``budgets`` is site -> kind -> budget (none: no limit)."""

    def __init__(self, study: str = "simulated",
                 budgets: dict[str, dict[str, StudyBudget]] | None = None):
        self.study = study
        self.budgets = budgets or {}
        self.ledgers: dict[str, StudyLedger] = {}
        self._lock = threading.Lock()

    def spend(self, site: str, job_id: str, kind: str, epsilon: float, delta: float) -> float:
        from atoll.fl.privacy.accounting import BudgetExhausted

        with self._lock:
            ledger = self.ledgers.setdefault(
                site, StudyLedger(site, self.study, "in memory, the simulator's"))
            try:
                return ledger.spend(kind, job_id, epsilon, delta,
                                    self.budgets.get(site, {}).get(kind))
            except LedgerRefused as exc:
                raise BudgetExhausted(str(exc)) from None


class Turns:
    """One site script runs at a time; a site gives up its turn while it waits for a task. In
    a federation each site is its own process; in one process, two sites training at once
    would change each other's library state mid-step (a Trainer's setup resetting the
    AcceleratorState another site's Trainer is using)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._holder: int | None = None

    @contextmanager
    def turn(self) -> Iterator[None]:
        with self._lock:
            self._holder = threading.get_ident()
            try:
                yield
            finally:
                self._holder = None

    @contextmanager
    def waiting(self) -> Iterator[None]:
        """Around a wait of the thread holding the turn (another thread just waits)."""
        if self._holder != threading.get_ident():
            yield
            return
        self._holder = None
        self._lock.release()
        try:
            yield
        finally:
            self._lock.acquire()
            self._holder = threading.get_ident()


class Federation:
    """The in-memory hub between one server channel and one channel per site."""

    def __init__(
        self,
        sites: Sequence[str],
        results_dir: Path,
        job_id: str = "simulated",
        on_event: EventSink | None = None,
        ledger: MemoryLedger | None = None,
    ):
        self.job_id = job_id
        self.ledger = ledger or MemoryLedger()
        self.sites = list(sites)
        self.results_dir = Path(results_dir)
        self.events: list[dict[str, Any]] = []
        self._on_event = on_event
        self._lock = threading.Lock()
        self.turns = Turns()
        self._inbox: dict[str, queue.Queue] = {s: queue.Queue() for s in self.sites}
        self._tasks: dict[str, _TaskState] = {}
        self.dead: dict[str, str] = {}

    def server_channel(self) -> InMemoryServerChannel:
        return InMemoryServerChannel(self)

    def site_channel(self, site: str) -> InMemorySiteChannel:
        if site not in self._inbox:
            raise SimulationError(f"unknown site {site!r}; sites: {', '.join(self.sites)}")
        return InMemorySiteChannel(self, site)

    def send(
        self, targets: Sequence[str], topic: str, headers: dict[str, Any], payload: Iterable[Chunk]
    ) -> str:
        unknown = [t for t in targets if t not in self._inbox]
        if unknown:
            raise ValueError(f"unknown target site(s) {unknown}; sites: {', '.join(self.sites)}")
        chunks = [bytes(c) for c in payload]  # like the wire: the sender's buffers are free again
        task_id = uuid.uuid4().hex
        state = _TaskState(targets=list(targets), waiting=set())
        with self._lock:
            self._tasks[task_id] = state
            for site in targets:
                if site in self.dead:
                    state.replies.put(Reply(site=site, error=self.dead[site]))
                    continue
                state.waiting.add(site)
                self._inbox[site].put(
                    Task(task_id, topic, json.loads(json.dumps(headers)), iter(chunks))
                )
        return task_id

    def reply(
        self, site: str, task_id: str, headers: dict[str, Any], payload: Iterable[Chunk]
    ) -> None:
        chunks = [bytes(c) for c in payload]
        with self._lock:
            state = self._tasks.get(task_id)
            if state is None or site not in state.waiting:
                raise ValueError(f"{site} answered task {task_id}, which is not waiting for it")
            state.waiting.discard(site)
            state.replies.put(
                Reply(site=site, headers=json.loads(json.dumps(headers)), chunks=iter(chunks))
            )

    def replies(self, task_id: str, timeout: float | None) -> Iterator[Reply]:
        state = self._tasks[task_id]
        deadline = None if timeout is None else time.monotonic() + timeout
        for _ in range(len(state.targets)):
            remaining = None if deadline is None else max(0.0, deadline - time.monotonic())
            try:
                yield state.replies.get(timeout=remaining)
            except queue.Empty:
                return

    def drop(self, site: str, reason: str) -> None:
        """The site is gone (as when its worker dies): error replies for what it still owes."""
        with self._lock:
            self.dead.setdefault(site, reason)
            for state in self._tasks.values():
                if site in state.waiting:
                    state.waiting.discard(site)
                    state.replies.put(Reply(site=site, error=reason))

    def close(self) -> None:
        """The job is over: every site's receive() returns None."""
        for inbox in self._inbox.values():
            inbox.put(None)

    def report(self, event: dict[str, Any]) -> None:
        event = json.loads(json.dumps(event))  # the contract: JSON-safe
        with self._lock:
            self.events.append(event)
        if self._on_event is not None:
            self._on_event(event)

    def receive(self, site: str, timeout: float | None) -> Task | None:
        try:
            with self.turns.waiting():
                return self._inbox[site].get(timeout=timeout)
        except queue.Empty:
            return None


class InMemoryServerChannel:
    def __init__(self, federation: Federation):
        self._federation = federation
        self.job_id = federation.job_id
        self.sites = list(federation.sites)
        self.results_dir = federation.results_dir

    def send(self, targets, topic, headers, payload) -> str:  # noqa: ANN001 - the protocol's types
        return self._federation.send(targets, topic, headers, payload)

    def replies(self, task_id: str, timeout: float | None = None) -> Iterator[Reply]:
        return self._federation.replies(task_id, timeout)

    def report(self, event: dict[str, Any]) -> None:
        self._federation.report(event)


class InMemorySiteChannel:
    def __init__(self, federation: Federation, site: str):
        self._federation = federation
        self.job_id = federation.job_id
        self.site = site

    def receive(self, timeout: float | None = None) -> Task | None:
        return self._federation.receive(self.site, timeout)

    def reply(self, task_id: str, headers: dict[str, Any], payload: Iterable[Chunk]) -> None:
        self._federation.reply(self.site, task_id, headers, payload)

    def report(self, event: dict[str, Any]) -> None:
        self._federation.report(event)

    def spend_budget(self, kind: str, epsilon: float, delta: float) -> float:
        return self._federation.ledger.spend(self.site, self.job_id, kind, epsilon, delta)


# --- simulate a job folder ----------------------------------------------------------------------


@dataclass
class SimulationResult:
    results_dir: Path
    events: list[dict[str, Any]]
    site_errors: dict[str, str]  # site -> traceback of a site script that raised


def _apps(job_dir: Path, sites: Sequence[str]) -> tuple[Path, dict[str, Path], dict[str, Any]]:
    meta_path = job_dir / "meta.json"
    try:
        meta = json.loads(meta_path.read_text())
    except FileNotFoundError:
        raise SimulationError(f"{meta_path}: missing; a job folder needs a meta.json") from None
    except json.JSONDecodeError as exc:
        raise SimulationError(f"{meta_path}: not valid JSON: {exc}") from None
    deploy_map = meta.get("deploy_map") if isinstance(meta, dict) else None
    if not isinstance(deploy_map, dict) or not deploy_map:
        raise SimulationError(f"{meta_path}: deploy_map must map app folders to targets")
    server_app, site_apps = None, {}
    for app, targets in deploy_map.items():
        targets = targets if isinstance(targets, list) else []
        if "server" in targets or "@ALL" in targets:
            server_app = job_dir / app
        for site in sites:
            if site in targets or "@ALL" in targets:
                site_apps[site] = job_dir / app
    if server_app is None:
        raise SimulationError(f"{meta_path}: deploy_map gives no app to the server")
    missing = [s for s in sites if s not in site_apps]
    if missing:
        raise SimulationError(
            f"{meta_path}: deploy_map gives no app to site(s) {', '.join(missing)}"
        )
    return server_app, site_apps, meta


def _statistics_budgets(rules: dict[str, dict[str, Any]]) -> dict[str, dict[str, StudyBudget]]:
    """Each simulated site's statistics budget (its rules' ``dp.budget``), as its parent's
    ledger would hold it."""
    from atoll.spec.statistics_rules import StatisticsRules

    budgets = {}
    for site, site_rules in rules.items():
        found = StatisticsRules.model_validate(site_rules or {}).budget()
        if found is not None:
            budgets[site] = {"statistics": StudyBudget(found[0], found[1],
                                                       "the simulated site's statistics.dp")}
    return budgets


def preload_imports(script: Path, app_dir: Path) -> None:
    """Import the libraries the site script imports at its top level, once, before the sites'
    threads start: libraries that import lazily (transformers resolves ``from transformers
    import Trainer`` on first use) are not safe to first-import from several threads at once,
    which then see half-made modules. The app folder's own modules are left to the script.
    A library that fails here is left alone: the script's own import reports it, per site."""
    try:
        tree = ast.parse(script.read_bytes(), str(script))
    except (OSError, SyntaxError):
        return  # the site's thread reports it
    app = app_dir.resolve()
    for node in tree.body:
        if isinstance(node, ast.Import):
            wanted = [(alias.name, []) for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            wanted = [(node.module, [alias.name for alias in node.names])]
        else:
            continue
        for name, attributes in wanted:
            try:
                spec = importlib.util.find_spec(name.split(".")[0])
                origin = Path(spec.origin).resolve() if spec and spec.origin else None
                if spec is None or (origin is not None and origin.is_relative_to(app)):
                    continue
                module = importlib.import_module(name)
                for attribute in attributes:  # a name of the module, or one of its submodules
                    if not hasattr(module, attribute):
                        importlib.import_module(f"{name}.{attribute}")
            except Exception:  # noqa: BLE001 - see the docstring: the script reports it
                continue


def simulate(
    job_dir: str | os.PathLike[str],
    sites: dict[str, dict[str, str]],
    results_dir: str | os.PathLike[str] | None = None,
    job_args: dict[str, Any] | None = None,
    on_event: EventSink | None = None,
    raise_on_error: bool = True,
    statistics_rules: dict[str, dict[str, Any]] | None = None,
) -> SimulationResult:
    """Run the job in ``job_dir`` with ``sites`` (site -> {dataset name: path}) in this process.

    ``statistics_rules``: site -> the rules its study_runtime.yaml would set under
    ``statistics`` (``atoll.spec.statistics_rules``) for ``atoll.fl.statistics``.

    Returns where the results are and every progress event. The server workflow's exception is
    re-raised (after the sites stopped) unless ``raise_on_error`` is False; a site script's
    exception is a drop-out, recorded in ``site_errors``.
    """
    from atoll.fl.runner import (
        forget_modules_of,
        run_server_app,
        run_site_app_in_thread,
        site_argv,
    )

    job_dir = Path(job_dir).resolve()
    if not sites:
        raise SimulationError("simulate() needs at least one site")
    server_app, site_apps, meta = _apps(job_dir, list(sites))
    if len(set(site_apps.values())) > 1:
        raise SimulationError(
            "the simulator runs every site in one process, so all sites must run the same app "
            f"folder; deploy_map gives: {', '.join(sorted({p.name for p in site_apps.values()}))}"
        )
    site_app = next(iter(site_apps.values()))
    # resolved now: the sites run in the app folder, and a relative path must mean the caller's
    results = (Path(results_dir).resolve() if results_dir
               else Path(tempfile.mkdtemp(prefix="atoll-sim-")))
    federation = Federation(
        list(sites), results, job_id=f"sim-{uuid.uuid4().hex[:8]}", on_event=on_event,
        ledger=MemoryLedger(budgets=_statistics_budgets(statistics_rules or {})),
    )
    if job_args is None:
        job_args = {k: meta[k] for k in ("min_clients", "mandatory_clients", "name") if k in meta}
    site_errors: dict[str, str] = {}

    def site_main(site: str) -> None:
        try:
            with federation.turns.turn():
                run_site_app_in_thread(federation.site_channel(site), site_app, site,
                                       sites[site], (statistics_rules or {}).get(site))
            federation.drop(site, f"{site}: the site script ended before answering")
        except BaseException as exc:  # noqa: BLE001 - a site's crash is a drop-out, reported
            site_errors[site] = traceback.format_exc()
            # as in a federation: the workflow names the site, its own error is told once
            # (site_errors, the CLI's line for that site)
            federation.drop(site, f"{site} dropped out ({type(exc).__name__})")

    saved_argv, saved_cwd, saved_path = sys.argv[:], os.getcwd(), sys.path[:]
    saved_modules = set(sys.modules)
    sys.argv = site_argv(site_app)
    sys.path.insert(0, str(site_app.resolve()))
    os.chdir(site_app)
    preload_imports(Path(sys.argv[0]), site_app)
    threads = [
        threading.Thread(target=site_main, args=(s,), name=f"site-{s}", daemon=True) for s in sites
    ]
    try:
        for thread in threads:
            thread.start()
        try:
            run_server_app(federation.server_channel(), server_app, job_args)
        except Exception:
            if raise_on_error:
                raise
            federation.report({"event": "failed", "error": traceback.format_exc()})
        finally:
            federation.close()
            for thread in threads:
                thread.join()
    finally:
        sys.argv, sys.path[:] = saved_argv, saved_path
        os.chdir(saved_cwd)
        forget_modules_of(Path(job_dir), saved_modules)
    return SimulationResult(results, federation.events, site_errors)
