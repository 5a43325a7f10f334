"""A parent's own ``local/`` files, checked at start without keeping pydantic in the parent.

Validating ``site.yaml`` (and a site's ``study_runtime.yaml``) needs pydantic and the spec
models: about 13 MiB that would stay in a long-lived parent for good. At rest a parent needs
only a few plain values: its launcher's name, its capacity and its worker endpoint. So at start,
while the parent still runs one thread, the files are validated in a forked child, which sends
back those values and the validated ``SiteConfig``, pickled. The parent unpickles the model, and
makes its launcher, when a job first needs them; only then is pydantic imported.

A folder that passed the check before, unchanged since, is not checked again: its record in the
workspace (local_record.py) gives the values, and the model is parsed from the bytes of
``site.yaml`` that were fingerprinted, on first use.
"""

from __future__ import annotations

import pickle
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from atoll.launchers.process_options import ProcessOptions, ProcessSite
from atoll.parent.forked import Forked, start_forked
from atoll.parent.local_record import fingerprint, read_record, write_record
from atoll.spec.study_runtime_plain import PlainStudyRuntime

if TYPE_CHECKING:
    from atoll.launchers.base import Launcher
    from atoll.launchers.process_sandbox import SandboxHost
    from atoll.spec.site_config import SiteConfig

@dataclass(frozen=True)
class Endpoint:
    """Where the parent listens for its own workers (site.yaml's worker_endpoint, resolved)."""

    host: str
    port: int
    dial_host: str
    uses_tls: bool


@dataclass(frozen=True)
class Checked:
    """What the check sends back to the parent."""

    launcher: str
    capacity: dict[str, Any]
    endpoint: Endpoint
    site_config: bytes | None = None  # the validated SiteConfig, pickled by the check's child
    site_yaml: bytes | None = None  # or site.yaml as fingerprinted, when a record vouched for it
    unconfined: bool = False  # process/slurm.sandbox: none (the parent warns at every start)
    # site.yaml's process.python and process.bwrap (None: the defaults), so that probing the
    # sandbox beside a start vouched for by a record needs no pydantic parse of site.yaml.
    sandbox_python: str | None = None
    sandbox_bwrap: str | None = None
    # The process launcher's sandbox facts, probed by the check's child (not recorded: they
    # depend on the host's Python and bwrap, not on local/).
    sandbox: SandboxHost | None = None
    # retention.run_folders_days (None: keep every run folder) and where run folders go as
    # site.yaml says it (spec/run_folders.runs_setting: a path as written, never resolved here,
    # so that a record stays right for a kit moved elsewhere), so that a parent at rest needs no
    # SiteConfig for them.
    retention_days: float | None = None
    runs_setting: str | None = None
    # site.yaml's supervision: heartbeat_s, stall_s, rejoin_s (spec/parent_settings.py)
    supervision: tuple[float, float, float] = (10.0, 120.0, 300.0)
    progress_s: float = 21600.0  # supervision.progress_s: a worker holding a task, silent
    max_resumes: int = 3  # the server's restarts.max_resumes
    tls_record_bytes: int = 16384  # the server's links.tls_record_bytes
    # logs.max_size in bytes and logs.keep: a detached parent's log is rotated from its start
    log_rotation: tuple[int, int] = (64 << 20, 5)
    # the process launcher's share of site.yaml: it is made from these, without a SiteConfig
    process: ProcessOptions | None = None
    # study_runtime.yaml as the models accepted it, for a confined process-launcher site whose
    # entries have the common shape (spec/study_runtime_plain.py): a job reads it without them
    study_runtime: PlainStudyRuntime | None = None

    def values(self) -> dict[str, Any]:
        """What a record keeps (local_record.py)."""
        ep = self.endpoint
        return {"launcher": self.launcher, "capacity": self.capacity,
                "unconfined": self.unconfined,
                "retention_days": self.retention_days, "runs_setting": self.runs_setting,
                "supervision": list(self.supervision), "progress_s": self.progress_s,
                "max_resumes": self.max_resumes, "tls_record_bytes": self.tls_record_bytes,
                "log_rotation": list(self.log_rotation),
                "process": self.process.values() if self.process is not None else None,
                "study_runtime": (self.study_runtime.values()
                                  if self.study_runtime is not None else None),
                "sandbox": {"python": self.sandbox_python, "bwrap": self.sandbox_bwrap},
                "endpoint": {"host": ep.host, "port": ep.port, "dial_host": ep.dial_host,
                             "uses_tls": ep.uses_tls}}


class LocalConfig:
    """Plain values at rest; the SiteConfig model and the launcher on first use. The check may
    still be running in its child: the first value asked for waits for it (and raises its
    SpecError)."""

    def __init__(self, local_dir: Path, checking: Forked[Checked] | Checked,
                 probing: SandboxProbe | None = None):
        self._local_dir = local_dir
        self._checking = checking
        self._probing = probing
        self._site_config: SiteConfig | None = None
        self._launcher: Launcher | None = None
        self._lock = threading.Lock()

    def _checked(self) -> Checked:
        if isinstance(self._checking, Checked):
            return self._checking
        return self._checking.result()

    @property
    def launcher_name(self) -> str:
        return self._checked().launcher

    @property
    def capacity(self) -> dict[str, Any]:
        return self._checked().capacity

    @property
    def endpoint(self) -> Endpoint:
        return self._checked().endpoint

    @property
    def retention_days(self) -> float | None:
        return self._checked().retention_days

    @property
    def supervision(self) -> tuple[float, float, float]:
        """heartbeat_s, stall_s, rejoin_s of site.yaml's ``supervision``."""
        return self._checked().supervision

    @property
    def progress_s(self) -> float:
        """supervision.progress_s: how long a worker holding a task may show no progress."""
        return self._checked().progress_s

    @property
    def max_resumes(self) -> int:
        """restarts.max_resumes of the server's site.yaml."""
        return self._checked().max_resumes

    @property
    def tls_record_bytes(self) -> int:
        """links.tls_record_bytes of the server's site.yaml."""
        return self._checked().tls_record_bytes

    @property
    def log_rotation(self) -> tuple[int, int]:
        """site.yaml's ``logs``: the size in bytes past which a detached parent's log is
        rotated, and how many old files are kept."""
        return self._checked().log_rotation

    def runs_root(self, workspace: Path) -> Path:
        """The folder holding jobs/ (spec/run_folders.py's rule), from what the check found."""
        from atoll.spec.run_folders import resolve_runs_root

        return resolve_runs_root(self._checked().runs_setting, self._local_dir.parent, workspace)

    @property
    def unconfined(self) -> bool:
        """site.yaml opts out of the process launcher's sandbox (``process.sandbox: none``)."""
        return self._checked().unconfined

    @property
    def unconfined_warning(self) -> str | None:
        """What the parent logs at every start when its workers run with its rights."""
        if not self.unconfined:
            return None
        return SLURM_UNCONFINED_WARNING if self.launcher_name == "slurm" else UNCONFINED_WARNING

    @property
    def process_options(self) -> ProcessOptions | None:
        """site.yaml's process: block as the check found it, where the launcher is process:
        the launcher, and a launch whose meta asks nothing of site.yaml, need no SiteConfig."""
        checked = self._checked()
        return checked.process if checked.launcher == "process" else None

    def launch_site(self, meta: Any) -> SiteConfig | ProcessSite:
        """What a launch request for ``meta`` reads of site.yaml (launchers/request.py): on the
        process launcher, for a meta without a launcher_spec, the check's answer is enough (no
        SiteConfig, no model); else the SiteConfig."""
        if self.process_options is None or meta.launcher_spec:
            return self.site_config
        # the kit as SiteConfig.kit_dir has it: site.yaml's folder's parent, links resolved
        return ProcessSite((self._local_dir / "site.yaml").resolve().parent.parent,
                           dict(self.capacity))

    @property
    def plain_study_runtime(self) -> PlainStudyRuntime | None:
        """study_runtime.yaml as the check found it, where it has the common shape of a
        confined process-launcher site (spec/study_runtime_plain.py); else None."""
        return self._checked().study_runtime

    @property
    def site_config(self) -> SiteConfig:
        with self._lock:
            if self._site_config is None:
                checked = self._checked()
                if checked.site_config is not None:
                    self._site_config = pickle.loads(checked.site_config)
                else:
                    from atoll.spec.site_config import parse_site_yaml

                    self._site_config = parse_site_yaml(checked.site_yaml or b"",
                                                        self._local_dir / "site.yaml")
            return self._site_config

    @property
    def launcher(self) -> Launcher:
        options = self.process_options
        config = self.site_config if options is None else None  # the models only without
        with self._lock:
            if self._launcher is None:
                from atoll.launchers.registry import get_launcher

                host = self._checked().sandbox
                if host is None and self._probing is not None:
                    host = self._probing.result()  # SpecError when no sandbox can be made
                extra: dict[str, Any] = {"sandbox_host": host} if host is not None else {}
                if options is not None:
                    extra["options"] = options
                self._launcher = get_launcher(self.launcher_name, config, **extra)
            return self._launcher

    def close(self) -> None:
        if self._probing is not None:
            self._probing.cancel()
        with self._lock:
            launcher, self._launcher = self._launcher, None
        if launcher is not None:
            launcher.close()


UNCONFINED_WARNING = (
    "WARNING: local/site.yaml sets process.sandbox: none. Job code (site scripts, workflows, "
    "initial_model functions) runs with this parent's privileges and can read its key, its "
    "environment, its workspace and every job on this host. Run workers in the sandbox unless "
    "this host cannot have user namespaces (docs/security.md).")
SLURM_UNCONFINED_WARNING = (
    "WARNING: local/site.yaml sets slurm.sandbox: none. A study without a sandbox of its own "
    "runs its workers as bare Slurm jobs of this parent's user: job code can read this user's "
    "files (the kit, when the nodes see it), other jobs' run folders and the secrets of jobs "
    "still pending; such a site maps one study at most. Set slurm.sandbox to apptainer or "
    "pyxis (docs/launchers/slurm.md).")


def load_local_config(local_dir: Path, study_runtime: bool,
                      workspace: Path | None = None) -> LocalConfig:
    """Start validating ``local_dir``'s site.yaml (and study_runtime.yaml) in a forked child.

    Call it before this process starts threads (gRPC's among them): then the check runs while
    the parent goes on importing and starting up. Values wait for it; SpecError lists problems.
    With a ``workspace``, a record there for these very contents stands for the check, and a
    check that passes leaves one.
    """
    found = fingerprint(local_dir, study_runtime) if workspace is not None else None
    if found is not None:
        checked = _from_record(read_record(workspace, found[0]), found[1])
        if checked is not None:
            # The record stands for the check, not for the sandbox's probe (a query of the
            # worker's Python and one empty sandbox: two interpreters, ~0.05 CPU-s). That
            # runs from the recorded settings, off the start and before the first job
            # (SandboxProbe).
            sandboxed = checked.launcher == "process" and not checked.unconfined
            probing = (SandboxProbe(local_dir, checked.sandbox_python, checked.sandbox_bwrap)
                       if sandboxed else None)
            return LocalConfig(local_dir, checked, probing)
    return LocalConfig(local_dir, start_forked(_check, local_dir, study_runtime, workspace,
                                               found[0] if found else None, True))


def record_local_config(local_dir: Path, study_runtime: bool, workspace: Path) -> None:
    """Check ``local_dir`` here and now and record it (``atoll provision``, for the files it
    wrote); SpecError if it does not pass."""
    found = fingerprint(local_dir, study_runtime)
    if found is not None:
        _check(local_dir, study_runtime, workspace, found[0])


def _check(local_dir: Path, study_runtime: bool, workspace: Path | None = None,
           print_: str | None = None, probe: bool = False) -> Checked:
    from atoll.spec.errors import SpecError
    from atoll.spec.run_folders import runs_setting
    from atoll.spec.site_config import load_site_config
    from atoll.spec.study_runtime import (
        RUNTIME_FILE,
        is_unconfined,
        load_study_runtime,
        unconfined_issues,
    )
    from atoll.spec.study_runtime_plain import file_digest, plain_runtime

    config = load_site_config(local_dir / "site.yaml")
    unconfined = is_unconfined(config)
    plain = None
    if study_runtime:
        before = file_digest(local_dir, RUNTIME_FILE)
        runtime = load_study_runtime(local_dir, config.launcher)
        issues = unconfined_issues(config, runtime)
        if issues:
            raise SpecError(issues, source=str(local_dir / RUNTIME_FILE))
        if not unconfined and file_digest(local_dir, RUNTIME_FILE) == before:
            plain = plain_runtime(runtime, config.launcher, before)
    cap, ep = config.capacity, config.worker_endpoint
    process = config.launcher == "process"
    checked = Checked(config.launcher,
                      {"gpus": cap.gpus, "cpus": cap.cpus, "memory": cap.memory},
                      Endpoint(ep.host, ep.port, ep.dial_host, ep.uses_tls), pickle.dumps(config),
                      unconfined=unconfined,
                      sandbox_python=config.settings.python if process else None,
                      sandbox_bwrap=config.settings.bwrap if process else None,
                      sandbox=_sandbox_of(config, local_dir) if probe else None,
                      retention_days=config.retention.run_folders_days,
                      runs_setting=runs_setting(config),
                      supervision=(config.supervision.heartbeat_s, config.supervision.stall_s,
                                   config.supervision.rejoin_s),
                      progress_s=config.supervision.progress_s,
                      max_resumes=config.restarts.max_resumes,
                      tls_record_bytes=config.links.tls_record_bytes,
                      log_rotation=(config.logs.max_bytes, config.logs.keep),
                      process=ProcessOptions.of(config.settings) if process else None,
                      study_runtime=plain)
    if workspace is not None and print_ is not None:
        again = fingerprint(local_dir, study_runtime)
        if again is not None and again[0] == print_:  # nothing changed while it was checked
            write_record(workspace, print_, checked.values())
    return checked


def _sandbox_of(config: SiteConfig, local_dir: Path) -> SandboxHost | None:
    """The process launcher's sandbox on this host, or None where it has none to make; a host
    that cannot make one is a problem of site.yaml's process.sandbox (SpecError)."""
    if config.launcher != "process" or config.settings.sandbox != "bwrap":
        return None
    return _probe_sandbox(local_dir, config.settings.python, config.settings.bwrap)


# Half a second: the three parents of a `poc up` are up by then on two cores, and a first job
# reaches a site no sooner than its submit, the server's intake and its dispatch (~0.5 s).
PROBE_AFTER_S = 0.5


class SandboxProbe:
    """The process launcher's sandbox probe (``_probe_sandbox``), run on a thread of its own
    ``PROBE_AFTER_S`` after the parent's start or at the first launch, whichever comes first.

    Not at the start itself: its two interpreters then competed with the parents' own start
    (three parents of a `poc up` on two cores connected 0.14 s later, bench/compare (d)).
    Neither a parent's start nor its first job waits for it: a job comes through the server
    after the parent is up, and its launch takes the probe's answer (or runs it)."""

    def __init__(self, local_dir: Path, python: str | None, bwrap: str | None) -> None:
        self._args = (local_dir, python, bwrap)
        self._lock = threading.Lock()
        self._done = threading.Event()
        self._thread: threading.Thread | None = None
        self._answer: tuple[bool, Any] = (False, None)
        self._timer = threading.Timer(PROBE_AFTER_S, self.start)
        self._timer.daemon = True
        self._timer.start()

    def start(self) -> None:
        with self._lock:
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, name="sandbox-probe",
                                                daemon=True)
                self._thread.start()

    def _run(self) -> None:
        try:
            self._answer = (True, _probe_sandbox(*self._args))
        except Exception as exc:  # noqa: BLE001 - raised to whoever takes the result
            self._answer = (False, exc)
        finally:
            self._done.set()

    def cancel(self) -> None:
        """Not started yet: never by the timer (the parent stops)."""
        self._timer.cancel()

    def result(self) -> SandboxHost:
        """The probe's answer (SpecError when no sandbox can be made); starts it if due."""
        self.start()
        self._done.wait()
        ok, value = self._answer
        if ok:
            return value
        raise value


def _probe_sandbox(local_dir: Path, python: str | None, bwrap: str | None) -> SandboxHost:
    import sys

    from atoll.launchers.process_sandbox import SandboxUnavailable, bwrap_binary, probe_host
    from atoll.spec.errors import Issue, SpecError

    try:
        return probe_host(python or sys.executable, bwrap_binary(bwrap))
    except SandboxUnavailable as exc:
        raise SpecError([Issue("process.sandbox", str(exc))],
                        source=str(local_dir / "site.yaml")) from None


def _from_record(values: dict[str, Any] | None, site_yaml: bytes) -> Checked | None:
    """The record's values, if they have the shape the check gives; else None (check again)."""
    if values is None:
        return None
    try:
        launcher, capacity, ep = values["launcher"], values["capacity"], values["endpoint"]
        endpoint = Endpoint(str(ep["host"]), int(ep["port"]), str(ep["dial_host"]),
                            bool(ep["uses_tls"]))
        unconfined, sandbox = values["unconfined"], values["sandbox"]
        python, bwrap = sandbox["python"], sandbox["bwrap"]
        days, root = values["retention_days"], values["runs_setting"]
        supervision = tuple(float(v) for v in values["supervision"])
        progress_s = float(values["progress_s"])
        resumes, record = values["max_resumes"], values["tls_record_bytes"]
        log_bytes, log_keep = values["log_rotation"]
        process = (ProcessOptions.from_values(values["process"])
                   if values["process"] is not None else None)
        runtime = (PlainStudyRuntime.from_values(values["study_runtime"])
                   if values["study_runtime"] is not None else None)
        ok = (isinstance(launcher, str) and isinstance(capacity, dict)
              and set(capacity) == {"gpus", "cpus", "memory"} and isinstance(unconfined, bool)
              and all(v is None or isinstance(v, str) for v in (python, bwrap, root))
              and (days is None or (isinstance(days, int | float)
                                    and not isinstance(days, bool) and days > 0))
              and len(supervision) == 3 and all(v >= 0 for v in supervision)
              and progress_s > 0
              and isinstance(resumes, int) and not isinstance(resumes, bool) and resumes >= 0
              and (process is not None) == (launcher == "process")
              and (runtime is not None) == (values["study_runtime"] is not None)
              and (runtime is None or (launcher == "process" and not unconfined))
              and isinstance(record, int) and not isinstance(record, bool)
              and 1024 <= record <= 16384
              and all(isinstance(v, int) and not isinstance(v, bool) and v >= 1
                      for v in (log_bytes, log_keep)))
    except (KeyError, TypeError, ValueError):
        return None
    return (Checked(launcher, capacity, endpoint, site_yaml=site_yaml, unconfined=unconfined,
                    sandbox_python=python, sandbox_bwrap=bwrap, retention_days=days,
                    runs_setting=root, supervision=supervision, progress_s=progress_s,
                    max_resumes=resumes, tls_record_bytes=record,
                    log_rotation=(log_bytes, log_keep), process=process,
                    study_runtime=runtime)
            if ok else None)


def record_kits(folder: Path) -> None:
    """Record the check of every kit's ``local/`` under ``folder`` (or of ``folder`` itself), as
    ``atoll provision`` wrote them: the templates pass the check (a test holds them to it), and
    the record spares each parent's first start the check (local_record.py)."""
    for local in [folder / "local", *sorted(folder.glob("*/local"))]:
        if (local / "site.yaml").is_file():
            record_local_config(local, (local / "study_runtime.yaml").is_file(),
                                local.parent / "workspace")
