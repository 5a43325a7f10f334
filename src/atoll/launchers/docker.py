"""The Docker launcher: one container per job worker, through the Docker SDK (or Podman's API).

``render`` is ``docker_render.render_docker``. The I/O goes through one injected
``docker.DockerClient`` (default: site.yaml ``docker.base_url``, else what the Docker SDK reads
from its own ``DOCKER_HOST``; this launcher reads no environment itself):

- launch: reserve the job's GPU ids (exclusive, ``docker.gpu_ids``; the container gets exactly
  those), open the job's relay socket to the parent where the worker has no network of its own
  (launchers/socket_relay.py), create the container (pulling a missing image only when ``docker.pull_policy`` is
  ``missing``), add the job token and the study's secret variables to its environment (their
  values come only from the request's credentials, where the site parent put them), start it.
  Engine refusals become LaunchError naming what to change: the image and where it was
  configured, GPUs on an engine without the NVIDIA runtime, a bind source that does not exist.
- wait: ``container.wait()``; the exit code and ``State.OOMKilled`` become an Outcome; the
  container's logs are saved to ``<workdir>/logs/worker.log``; the container is removed, its
  relay closed and its GPUs released.
- cancel: stop (1 s of SIGTERM grace), save the logs, remove, release. Idempotent.
"""

from __future__ import annotations

import logging
import os
import signal
import threading
import time
from pathlib import Path
from typing import Any

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
from atoll.launchers.docker_render import network_plan, render_docker, site_gpu_ids
from atoll.launchers.job_files import create_job_file
from atoll.launchers.process_allocation import GpuAllocator
from atoll.launchers.request import launch_credentials
from atoll.launchers.socket_relay import UnixRelay
from atoll.spec import worker_env

log = logging.getLogger(__name__)

STOP_GRACE_S = 1
LOG_FILE = Path("logs") / "worker.log"


class DockerLauncher(Launcher):
    name = "docker"

    def __init__(self, site_config: Any, client: Any = None) -> None:
        self.site_config = site_config
        self._client = client
        self._cancelled: set[str] = set()
        self._lock = threading.Lock()
        self._gpus = GpuAllocator(site_gpu_ids(site_config), where="docker.gpu_ids")
        self._relays: dict[str, UnixRelay] = {}  # per container id
        if site_config.settings.network == "host":
            log.warning("local/site.yaml sets docker.network: host: job containers share this "
                        "host's network (its loopback listeners, the engine's abstract sockets, "
                        "every other job's listeners); see docs/security.md")

    @property
    def client(self) -> Any:
        if self._client is None:
            import docker  # the [docker] extra: imported only by sites that use this launcher

            base_url = self.site_config.settings.base_url
            try:
                self._client = (
                    docker.DockerClient(base_url=base_url) if base_url else docker.from_env()
                )
            except docker.errors.DockerException as err:
                where = self._engine_url() or "the default socket"
                raise LaunchError(
                    f"cannot reach the Docker engine at {where} (docker.base_url in "
                    f"local/site.yaml, else DOCKER_HOST): {err}"
                ) from None
        return self._client

    def _engine_url(self) -> str:
        """site.yaml ``docker.base_url``, else the engine the Docker SDK finds in its own
        environment (``DOCKER_HOST``), else '' (the SDK's default socket)."""
        if self.site_config.settings.base_url:
            return self.site_config.settings.base_url
        try:
            from docker.errors import DockerException
            from docker.utils import kwargs_from_env
        except ImportError:  # the [docker] extra is missing: `launch` says so
            return ""
        try:
            return kwargs_from_env().get("base_url") or ""
        except DockerException:  # a TLS setting the SDK refuses: the client says so when used
            return ""

    def _engine_socket(self) -> str | None:
        url = self._engine_url()
        return url.removeprefix("unix://") if url.startswith("unix://") else None

    def render(self, request: LaunchRequest, gpu_ids: list[str] | None = None) -> dict[str, Any]:
        """The container of ``request``; without ``gpu_ids`` (the launch's own), what a launch
        would pick now (nothing is taken)."""
        if gpu_ids is None:
            gpu_ids = self._gpus.preview(request.resources.num_of_gpus)
        return render_docker(
            request,
            parent_ids=(os.getuid(), os.getgid()),
            engine_socket=self._engine_socket(),
            gpu_ids=gpu_ids,
        )

    def launch(self, request: LaunchRequest, on_progress: ProgressCallback | None = None) -> Handle:
        key = f"{request.identity.site}/{request.identity.job_id}"
        gpus = self._gpus.allocate(key, request.resources.num_of_gpus)
        relay = None
        try:
            if network_plan(self.site_config.settings.network, request.parent_address).relay:
                relay = self._open_relay(request)
            handle = self._launch(request, on_progress, key, gpus, relay)
        except BaseException:
            self._gpus.release(key)
            if relay is not None:
                relay.close()
            raise
        if relay is not None:
            handle.extra["relay"] = True  # its successor opens the job's socket again
            with self._lock:
                self._relays[handle.native_id] = relay
        return handle

    def reattach(self, handle: Handle, parent_address: str,
                 parent_socket: str | None) -> bool:
        """A container an earlier parent started that still runs: its GPUs are held again,
        and its socket to the parent (in its run folder, bound into it) opened again, now to
        this parent."""
        import docker.errors as errors

        try:
            container = self.client.containers.get(handle.native_id)
        except errors.APIError:  # NotFound included
            return False
        if container.status != "running":
            return False
        relay = None
        if handle.extra.get("relay"):
            target = f"unix:{parent_socket}" if parent_socket else parent_address
            try:
                relay = UnixRelay(target, Path(str(handle.extra["workdir"])))
            except (OSError, LaunchError, KeyError) as exc:
                log.warning("job %s: its container's socket to the parent could not be opened "
                            "again: %s", handle.job_id, exc)
                return False
        self._gpus.claim(handle.extra.get("gpu_key", ""), handle.extra.get("gpu_ids") or [])
        if relay is not None:
            with self._lock:
                self._relays[handle.native_id] = relay
        return True

    def _open_relay(self, request: LaunchRequest) -> UnixRelay:
        """The job's socket to its parent: to the parent's own unix socket where it has one,
        else to its TCP endpoint, which must then be plain (TLS does not pass a unix socket)."""
        url = self._engine_url()
        if url and not url.startswith("unix://"):
            raise LaunchError(
                f"the Docker engine at {url} is on another host: it cannot mount this host's "
                "socket to the parent, so a worker without a network could not reach it; set "
                "docker.network in local/site.yaml to a network whose containers reach the "
                "parent's worker_endpoint"
            )
        if request.parent_socket:
            target = f"unix:{request.parent_socket}"
        elif worker_env.PARENT_CERT in request.worker_env:
            raise LaunchError(
                f"the parent's worker endpoint {request.parent_address} speaks TLS and has no "
                "unix socket, so a worker without a network cannot reach it: set docker.network "
                "in local/site.yaml to a network whose containers reach that address"
            )
        else:
            target = request.parent_address
        try:
            request.workdir.mkdir(parents=True, exist_ok=True)
            return UnixRelay(target, request.workdir)
        except OSError as err:
            raise LaunchError(f"cannot open the job's socket to its parent: {err}") from None

    def _launch(self, request: LaunchRequest, on_progress: ProgressCallback | None, key: str,
                gpus: list[str], relay: UnixRelay | None) -> Handle:
        import docker.errors as errors

        rendered = self.render(request, gpu_ids=gpus)
        kwargs = dict(rendered["containers.run"])
        kwargs["environment"] = {**kwargs["environment"], **launch_credentials(request)}
        image, source = kwargs["image"], rendered["image_source"]
        self._prepare_workdir(request.workdir, kwargs["user"])
        if on_progress:
            on_progress(f"creating container from {image}")
        try:
            container = self._create(kwargs, image, source)
        except errors.APIError as err:
            raise LaunchError(_refusal(err, image, source)) from None
        try:
            container.start()
        except errors.APIError as err:
            _remove_quietly(container)
            raise LaunchError(_refusal(err, image, source)) from None
        return Handle(
            backend=self.name,
            native_id=container.id,
            job_id=request.identity.job_id,
            extra={
                "name": kwargs["name"],
                "image": image,
                "image_id": str((getattr(container, "attrs", None) or {}).get("Image", "")),
                "memory": request.resources.memory,
                "workdir": str(request.workdir),
                "gpu_key": key,
                "gpu_ids": gpus,
                RENDER_DIGEST: render_digest(rendered),  # the create spec, before credentials
            },
        )

    def launched_image(self, handle: Handle) -> dict[str, str]:
        """The image id the engine created the container from (its config's digest)."""
        return {key: str(handle.extra[key]) for key in ("image", "image_id")
                if handle.extra.get(key)}

    def _release(self, handle: Handle) -> None:
        """The job's GPUs and relay, once its container is gone (or never came)."""
        self._gpus.release(handle.extra.get("gpu_key", ""))
        with self._lock:
            relay = self._relays.pop(handle.native_id, None)
        if relay is not None:
            relay.close()

    def _create(self, kwargs: dict[str, Any], image: str, source: str) -> Any:
        import docker.errors as errors

        try:
            return self.client.containers.create(**kwargs)
        except errors.ImageNotFound:
            if self.site_config.settings.pull_policy == "never":
                raise LaunchError(
                    f"image {image} is not on this Docker engine (configured in {source}; "
                    "docker.pull_policy is never): build or load it, or fix the name"
                ) from None
        try:
            self.client.images.pull(image)
        except errors.APIError as err:
            raise LaunchError(
                f"image {image} is not on this Docker engine and pulling it failed (configured "
                f"in {source}): {_explanation(err)}"
            ) from None
        return self.client.containers.create(**kwargs)

    @staticmethod
    def _prepare_workdir(workdir: Path, user: str) -> None:
        """The logs folder exists; a root parent hands the run folder to a numeric job user."""
        (workdir / LOG_FILE.parent).mkdir(parents=True, exist_ok=True)
        uid_gid = user.split(":")
        if os.getuid() != 0 or not all(part.isdigit() for part in uid_gid):
            return
        uid, gid = int(uid_gid[0]), int(uid_gid[1] if len(uid_gid) > 1 else uid_gid[0])
        for root, dirs, files in os.walk(workdir):
            for name in (root, *(os.path.join(root, n) for n in dirs + files)):
                os.chown(name, uid, gid, follow_symlinks=False)

    def wait(self, handle: Handle) -> WorkerExit:
        try:
            return self._wait(handle)
        finally:
            self._release(handle)

    def _wait(self, handle: Handle) -> WorkerExit:
        import docker.errors as errors

        try:
            container = self.client.containers.get(handle.native_id)
            status = container.wait()
            container.reload()
        except errors.NotFound:
            if self._was_cancelled(handle):
                return self._gone(handle)
            return WorkerExit(
                Outcome.FAILED,
                f"the worker container {handle.extra.get('name', handle.native_id)} disappeared "
                "(removed outside atoll?)",
            )
        except errors.APIError as err:
            if self._was_cancelled(handle):
                return self._gone(handle)
            return WorkerExit(Outcome.FAILED, f"lost the worker container: {_explanation(err)}")
        state = container.attrs.get("State", {})
        self._save_logs(container, handle)
        _remove_quietly(container)
        if self._was_cancelled(handle):
            return self._gone(handle)
        return exit_to_outcome(
            status.get("StatusCode"),
            bool(state.get("OOMKilled")),
            (status.get("Error") or {}).get("Message") or state.get("Error") or "",
            handle.extra.get("memory"),
        )

    def cancel(self, handle: Handle) -> None:
        import docker.errors as errors

        with self._lock:
            self._cancelled.add(handle.native_id)
        try:
            container = self.client.containers.get(handle.native_id)
        except errors.NotFound:
            self._release(handle)
            return
        try:
            container.stop(timeout=STOP_GRACE_S)
            self._save_logs(container, handle)
        except errors.APIError:
            pass  # already stopping or gone: removal below settles it
        _remove_quietly(container)
        self._await_gone(handle.native_id)
        self._release(handle)

    def _await_gone(self, container_id: str, timeout: float = 5.0) -> None:
        """Return once the container no longer exists: `wait` may be removing it right now,
        and cancel promises the container is gone when it returns."""
        import docker.errors as errors

        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            try:
                self.client.containers.get(container_id)
            except errors.NotFound:
                return
            time.sleep(0.02)

    def _was_cancelled(self, handle: Handle) -> bool:
        with self._lock:
            return handle.native_id in self._cancelled

    @staticmethod
    def _gone(handle: Handle) -> WorkerExit:
        return WorkerExit(Outcome.ABORTED, "aborted: the worker container was stopped and removed")

    @staticmethod
    def _save_logs(container: Any, handle: Handle) -> None:
        import docker.errors as errors

        workdir = handle.extra.get("workdir")
        if not workdir:
            return
        # The run folder is mounted in the container, so the job may have planted a link at
        # logs/ or logs/worker.log: the log replaces whatever is there, never written through it.
        try:
            (Path(workdir) / LOG_FILE.parent).mkdir(parents=True, exist_ok=True)
            with create_job_file(Path(workdir), LOG_FILE) as out:  # streamed, never held whole
                for chunk in container.logs(stdout=True, stderr=True, stream=True, follow=False):
                    out.write(chunk)
        except (errors.APIError, OSError) as err:
            log.warning("the log of container %s was not saved: %s", handle.native_id, err)

    def close(self) -> None:
        with self._lock:
            relays, self._relays = list(self._relays.values()), {}
        for relay in relays:
            relay.close()
        if self._client is not None:
            self._client.close()


def exit_to_outcome(
    code: int | None, oom_killed: bool, error: str, memory: str | None
) -> WorkerExit:
    """Docker's final state -> our Outcome, with a reason a person can act on."""
    if oom_killed:
        limit = f"limit {memory}" if memory else "no job limit: the host ran out"
        return WorkerExit(
            Outcome.FAILED,
            f"out of memory ({limit}); ask for more memory in resource_spec",
            code,
        )
    if code == 0:
        return WorkerExit(Outcome.COMPLETED, "worker exited with code 0", 0)
    if error:
        return WorkerExit(Outcome.FAILED, f"the engine reports: {error}", code)
    if code is not None and code > 128:
        try:
            name = signal.Signals(code - 128).name
        except ValueError:
            name = f"signal {code - 128}"
        return WorkerExit(
            Outcome.FAILED, f"worker killed by {name} (exit code {code}); see {LOG_FILE}", code
        )
    return WorkerExit(Outcome.FAILED, f"worker exited with code {code}; see {LOG_FILE}", code)


def _explanation(err: Any) -> str:
    return str(getattr(err, "explanation", None) or err)


def _refusal(err: Any, image: str, source: str) -> str:
    """Engine refusals at create/start, turned into what to change."""
    text = _explanation(err)
    if "could not select device driver" in text or "nvidia" in text.lower():
        return (
            "this Docker engine cannot give GPUs to containers (no NVIDIA runtime): install the "
            "NVIDIA Container Toolkit on the host, or ask for num_of_gpus: 0 in resource_spec "
            f"(engine: {text})"
        )
    if "bind source path does not exist" in text:
        return (
            f"a folder to mount does not exist on the Docker host: {text}; check the datasets "
            "and secret_mounts sources in local/study_runtime.yaml"
        )
    if "executable file not found" in text:
        return f"image {image} (configured in {source}) cannot run the worker: {text}"
    return f"the Docker engine refused the worker container (image {image}): {text}"


def _remove_quietly(container: Any) -> None:
    import docker.errors as errors

    try:
        container.remove(force=True)
    except errors.NotFound:
        pass
    except errors.APIError as err:
        if "already in progress" not in _explanation(err):
            raise
