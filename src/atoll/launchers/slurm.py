"""The Slurm launcher: each worker is a batch job, submitted with ``sbatch --parsable``.

Slurm is driven through its commands (no pyslurm release matches current Slurm versions), all
through one injected ``runner`` (argv, timeout) -> CompletedProcess, so tests can record them.

- ``launch``: render (slurm_render.py), write the batch script and the 0600 secrets file into the
  run folder (the job token and secret values, only from the request's credentials, where the
  site parent put them: the launcher reads no environment of its own), submit. A refusal
  (unknown partition, account or QoS, impossible resources) is a LaunchError naming the
  directive, where it was configured and sbatch's own message.
- Watching: one SlurmPoller thread per launcher polls every live job in one ``squeue`` call (and
  ``sacct`` for jobs squeue has forgotten), maps the state through slurm_states.py, reports
  ``pending: <Reason>`` / ``running on <nodes>`` to ``on_progress`` and cancels a job pending
  past its ``pending_timeout``. ``wait`` blocks on it; Slurm's state tells when a worker died
  silently, the site parent hears the worker's own report on its channel.
- ``cancel``: ``scancel``; idempotent (a job Slurm no longer knows counts as cancelled).
"""

from __future__ import annotations

import contextlib
import logging
import os
import subprocess
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, ClassVar

from atoll.launchers.base import (
    RENDER_DIGEST,
    Handle,
    Launcher,
    LaunchError,
    LaunchRequest,
    Outcome,
    ProgressCallback,
    WorkerExit,
    render_digest,
)
from atoll.launchers.file_digests import FileDigests
from atoll.launchers.job_files import read_job_file, read_tail
from atoll.launchers.ranks import MAX_RANK_ERROR_BYTES, RANK_ERROR_FILE
from atoll.launchers.request import launch_credentials
from atoll.launchers.slurm_poller import BACKOFF_S, SlurmPoller, Watched
from atoll.launchers.slurm_render import (
    LOG_DIR,
    render_slurm,
    sandbox_image,
    secrets_file_text,
)
from atoll.launchers.slurm_states import (
    LIVE_STATES,
    SACCT_FIELDS,
    SQUEUE_FIELDS,
    first_failed_task,
    parse_sacct,
    parse_squeue,
)
from atoll.spec.site_config import SlurmSettings

log = logging.getLogger(__name__)

Runner = Callable[[Sequence[str], float], "subprocess.CompletedProcess[str]"]
COMMAND_TIMEOUT_S = 30.0
# Words of sbatch's refusal -> the directive it is about.
_REFUSALS = (  # account first: "Invalid account or account/partition combination"
    ("account", "account"),
    ("qos", "qos"),
    ("partition", "partition"),
    ("reservation", "reservation"),
    ("feature", "constraint"),
    ("constraint", "constraint"),
    ("time limit", "time"),
)
_RESOURCE_WORDS = ("node configuration", "memory", "processors", "node count", "gres", "cpu")
_GONE = ("invalid job id", "already completing or completed", "job has already finished")


def run_command(argv: Sequence[str], timeout: float) -> subprocess.CompletedProcess[str]:
    """The default runner: no shell, no stdin, text output."""
    return subprocess.run(
        list(argv), capture_output=True, text=True, timeout=timeout, stdin=subprocess.DEVNULL
    )


class SlurmLauncher(Launcher):
    name: ClassVar[str] = "slurm"

    def __init__(
        self,
        site_config: Any = None,
        runner: Runner | None = None,
        *,
        backoff: tuple[float, ...] = BACKOFF_S,
        command_timeout_s: float = COMMAND_TIMEOUT_S,
    ) -> None:
        settings = site_config.settings if site_config is not None else SlurmSettings()
        if not isinstance(settings, SlurmSettings):
            raise LaunchError(f"site.yaml chooses launcher {site_config.launcher}, not slurm")
        self._settings = settings
        self._runner = runner or run_command
        self._timeout = command_timeout_s
        self._poller = SlurmPoller(self._query, self._scancel, backoff=backoff)
        self._images = FileDigests()

    # ----- pure -----------------------------------------------------------------------------

    def render(self, request: LaunchRequest) -> dict[str, Any]:
        return render_slurm(request)

    # ----- I/O ------------------------------------------------------------------------------

    def launch(self, request: LaunchRequest, on_progress: ProgressCallback | None = None) -> Handle:
        rendered = self.render(request)
        values = launch_credentials(request)
        secrets = Path(rendered["secrets_file"]["path"])
        self._write_files(request.workdir, Path(rendered["script_path"]), rendered["script"])
        _write_private(secrets, secrets_file_text(values))
        try:
            result = self._run(rendered["sbatch_argv"])
            native_id = result.stdout.strip().split(";")[0]
            if result.returncode != 0 or not native_id.isdigit():
                raise LaunchError(refusal_message(request, rendered, result))
        except BaseException:
            secrets.unlink(missing_ok=True)
            raise
        limits = self._limits(request, rendered)
        log_file = str(Path(request.workdir) / LOG_DIR / f"slurm-{native_id}.out")
        handle = Handle(
            self.name,
            native_id,
            request.identity.job_id,
            extra={**limits, "log_file": log_file, "secrets_file": str(secrets),
                   "image": sandbox_image(request),
                   RENDER_DIGEST: render_digest(rendered)},  # sbatch's argv, the batch script
        )
        self._watch(handle, on_progress)
        return handle

    def launched_image(self, handle: Handle) -> dict[str, str]:
        """The sandbox's image, and the SHA-256 of its file where it is one on this host (an
        Apptainer SIF or an enroot squashfs at an absolute path, as the nodes see it on the
        shared file system); a registry reference the nodes pull has no digest here."""
        image = handle.extra.get("image")
        if not isinstance(image, str) or not image:
            return {}
        digest = self._images.digest(image) if image.startswith("/") else None
        return {"image": image, **({"image_digest": digest} if digest else {})}

    def wait(self, handle: Handle) -> WorkerExit:
        job = self._watch(handle)
        job.done.wait()
        assert job.result is not None
        return self._naming_the_failed_rank(handle, job.result)

    @staticmethod
    def _naming_the_failed_rank(handle: Handle, result: WorkerExit) -> WorkerExit:
        """A job of several tasks that failed: which rank failed first, on which node, and its
        error if it left one (read as the job's files: never through a link it planted)."""
        log_file = handle.extra.get("log_file")
        if result.outcome is not Outcome.FAILED or not log_file:
            return result
        run_folder = Path(log_file).parents[1]
        try:
            text = read_tail(run_folder, Path(log_file).relative_to(run_folder), 65536)
        except (OSError, ValueError):
            return result
        found = first_failed_task(text.decode("utf-8", "replace"))
        if found is None:
            return result
        tasks, node, what = found
        detail = f"rank {tasks} on {node} failed first: {what}"
        if tasks.isdigit():
            with contextlib.suppress(OSError):
                error = read_job_file(run_folder, RANK_ERROR_FILE.format(rank=tasks),
                                      MAX_RANK_ERROR_BYTES).decode("utf-8", "replace").strip()
                detail += f" ({error})" if error else ""
        return WorkerExit(result.outcome, f"{result.reason}; {detail}", result.exit_code)

    def cancel(self, handle: Handle) -> None:
        job = self._watch(handle)
        if job.result is not None:
            return  # already ended: counts as cancelled
        job.cancelled = True
        self._scancel(handle.native_id)
        self._poller.poke()

    def reattach(self, handle: Handle, parent_address: str,
                 parent_socket: str | None) -> bool:
        """A Slurm job an earlier parent submitted that is still pending or running: watched
        from now on (``wait``); it dials the parent's TCP endpoint, the same again."""
        try:
            state = self._query([handle.native_id]).get(handle.native_id)
        except LaunchError as exc:
            log.warning("job %s: Slurm job %s not asked about: %s", handle.job_id,
                        handle.native_id, exc)
            return False
        return state is not None and state.state in LIVE_STATES

    def close(self) -> None:
        self._poller.close()

    # ----- helpers --------------------------------------------------------------------------

    def _watch(self, handle: Handle, on_progress: ProgressCallback | None = None) -> Watched:
        """The poller's record of ``handle`` (created for a handle from an earlier parent)."""
        extra = handle.extra
        secrets = extra.get("secrets_file")
        return self._poller.watch(
            Watched(
                native_id=handle.native_id,
                pending_timeout=extra.get("pending_timeout"),
                on_progress=on_progress,
                on_final=(lambda: Path(secrets).unlink(missing_ok=True)) if secrets else None,
                mem=extra.get("mem"),
                time_limit=extra.get("time"),
                log_file=extra.get("log_file") or "the job's logs",
            )
        )

    def _limits(self, request: LaunchRequest, rendered: dict[str, Any]) -> dict[str, Any]:
        """What the poller watches the job against: its pending_timeout (the job's, at most the
        site's), and the time and memory limits render decided."""
        asked = request.launcher_spec.get("pending_timeout")
        site = self._settings.pending_timeout
        return {"pending_timeout": min(asked, site) if asked else site, **rendered["limits"]}

    @staticmethod
    def _write_files(workdir: Path, script_path: Path, script: str) -> None:
        (Path(workdir) / LOG_DIR).mkdir(parents=True, exist_ok=True)
        script_path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
        script_path.write_text(script, encoding="utf-8")
        script_path.chmod(0o700)

    def _run(self, argv: Sequence[str]) -> subprocess.CompletedProcess[str]:
        try:
            return self._runner(argv, self._timeout)
        except FileNotFoundError:
            raise LaunchError(
                f"{argv[0]} not found: install Slurm's client commands on the parent's host or "
                "set their paths in local/site.yaml (slurm.sbatch, slurm.squeue, ...)"
            ) from None
        except subprocess.TimeoutExpired:
            raise LaunchError(
                f"{argv[0]} did not answer within {self._timeout:g} s: is slurmctld up?"
            ) from None

    def _query(self, ids: list[str]) -> dict[str, Any]:
        """One squeue call for every id, then sacct for those squeue has forgotten."""
        joined = ",".join(ids)
        squeue = [self._settings.squeue, "-h", "--states=all", f"--jobs={joined}"]
        result = self._run([*squeue, "-O", SQUEUE_FIELDS])
        if result.returncode != 0 and "invalid job id" not in result.stderr.lower():
            raise LaunchError(f"squeue failed: {result.stderr.strip() or result.returncode}")
        states = parse_squeue(result.stdout) if result.returncode == 0 else {}
        missing = [i for i in ids if i not in states]
        if missing:
            sacct = [self._settings.sacct, "-X", "-P", "-n", f"--jobs={','.join(missing)}"]
            with contextlib.suppress(LaunchError):  # no accounting: squeue is all we have
                found = self._run([*sacct, f"--format={SACCT_FIELDS}"])
                if found.returncode == 0:
                    states.update(parse_sacct(found.stdout))
        return states

    def _scancel(self, native_id: str) -> None:
        result = self._run([self._settings.scancel, native_id])
        if result.returncode != 0 and not any(g in result.stderr.lower() for g in _GONE):
            raise LaunchError(
                f"scancel {native_id} failed: {result.stderr.strip() or result.returncode}"
            )


def refusal_message(
    request: LaunchRequest, rendered: dict[str, Any], result: subprocess.CompletedProcess[str]
) -> str:
    """sbatch's refusal, naming the directive, its value and where it was configured."""
    said = " ".join(result.stderr.split()) or f"exit code {result.returncode}"
    if result.returncode == 0:
        said = f"unexpected output {result.stdout.strip()!r}"
    lower = said.lower()
    argv = rendered["sbatch_argv"]
    sources = rendered["directive_sources"]
    what = ""
    for word, key in _REFUSALS:
        if word in lower:
            value = rendered["directives"].get(key)
            where = sources.get(key, "no setting: Slurm's default")
            what = f"{key} {value!r} (from {where})" if value else f"{key} (Slurm's default)"
            break
    if not what and any(word in lower for word in _RESOURCE_WORDS):
        asked = [
            a
            for a in argv
            if a.startswith(("--nodes=", "--cpus-per-task=", "--mem=", "--gres=", "--time="))
        ]
        what = f"resources {' '.join(asked)} (from the job's resource_spec and launcher_spec)"
    ident = request.identity
    head = f"Slurm refused the worker of job {ident.job_id} for {ident.site}"
    return f"{head}: {what + ': ' if what else ''}sbatch said: {said}"


def _write_private(path: Path, text: str) -> None:
    """Create ``path`` with mode 0600 from the start (never readable by others, even briefly)."""
    path.unlink(missing_ok=True)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "w", encoding="utf-8") as f:
        f.write(text)
