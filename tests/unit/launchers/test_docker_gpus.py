"""Each Docker container gets exactly the GPU ids the site reserved for it (issue 32, item 7).

A ``count`` in a device request means the engine's first N GPUs, whatever other containers hold:
two one-GPU jobs both got GPU 0 while the site counted two in use. The launcher now reserves ids
(``docker.gpu_ids``, default 0..capacity.gpus-1) and the container asks for those ids.

The test engine has no NVIDIA runtime (scripts/backends/docker.sh: GPU requests fail), so the
engine here is a stand-in that records what the launcher asked it for; the render and the
reservation are the launcher's own.
"""

from __future__ import annotations

import itertools
from pathlib import Path
from typing import Any

import pytest

from atoll.launchers.base import JobIdentity, LaunchError, LaunchRequest, Outcome
from atoll.launchers.docker import DockerLauncher
from atoll.spec.resources import Resources
from atoll.spec.site_config import parse_site_config

docker_errors = pytest.importorskip("docker.errors")


class _Container:
    def __init__(self, kwargs: dict[str, Any], number: int) -> None:
        self.id, self.kwargs, self.attrs = f"c{number}", kwargs, {"State": {}}

    def start(self) -> None: ...
    def wait(self) -> dict[str, Any]:
        return {"StatusCode": 0}

    def reload(self) -> None: ...
    def logs(self, **_: Any) -> Any:
        return iter([b"done\n"])

    def stop(self, **_: Any) -> None: ...
    def remove(self, **_: Any) -> None:
        self.engine.pop(self.id, None)


class _Containers:
    """What a Docker engine keeps of the containers the launcher created."""

    def __init__(self) -> None:
        self.live: dict[str, _Container] = {}
        self.created: list[dict[str, Any]] = []
        self._numbers = itertools.count()

    def create(self, **kwargs: Any) -> _Container:
        container = _Container(kwargs, next(self._numbers))
        container.engine = self.live
        self.live[container.id] = container
        self.created.append(kwargs)
        return container

    def get(self, container_id: str) -> _Container:
        if container_id not in self.live:
            raise docker_errors.NotFound(container_id)
        return self.live[container_id]


class _Engine:
    def __init__(self) -> None:
        self.containers = _Containers()

    def close(self) -> None: ...


def one_gpu_job(tmp_path: Path, site_config: Any, n: int) -> LaunchRequest:
    job_id = f"{n:032x}"
    return LaunchRequest(
        identity=JobIdentity(job_id, "gpu-job", "imaging", "site-1", "site"),
        resources=Resources(num_of_gpus=1, num_of_cpus=1, memory="1Gi"),
        launcher_spec={}, study_runtime=None, site_config=site_config,
        workdir=tmp_path / job_id, parent_address="127.0.0.1:7001",
        worker_env={}, credentials={"ATOLL_JOB_TOKEN": "t"}, worker_args=("-c", "pass"),
    )


def device_ids(kwargs: dict[str, Any]) -> list[str]:
    [request] = kwargs["device_requests"]
    assert request["count"] == 0  # never "the first N"
    return request["device_ids"]


@pytest.mark.parametrize("site", [
    {"launcher": "docker", "docker": {"default_image": "job:1", "gpu_ids": [0, 1]}},
    {"launcher": "docker", "docker": {"default_image": "job:1"}, "capacity": {"gpus": 2}},
], ids=["gpu_ids", "capacity"])
def test_two_one_gpu_jobs_get_different_gpus(tmp_path: Path, site: dict[str, Any]) -> None:
    config = parse_site_config(site)
    engine = _Engine()
    launcher = DockerLauncher(config, client=engine)
    first = launcher.launch(one_gpu_job(tmp_path, config, 1))
    second = launcher.launch(one_gpu_job(tmp_path, config, 2))
    assert [device_ids(k) for k in engine.containers.created] == [["0"], ["1"]]
    with pytest.raises(LaunchError, match=r"only 0 of this site's 2 are free"):
        launcher.launch(one_gpu_job(tmp_path, config, 3))
    assert launcher.wait(first).outcome is Outcome.COMPLETED  # GPU 0 is free again
    third = launcher.launch(one_gpu_job(tmp_path, config, 4))
    assert device_ids(engine.containers.created[-1]) == ["0"]
    launcher.cancel(second)
    launcher.cancel(third)
    fourth = launcher.launch(one_gpu_job(tmp_path, config, 5))
    assert device_ids(engine.containers.created[-1]) == ["0"]
    launcher.wait(fourth)
    launcher.close()


def test_listed_ids_are_handed_out_as_listed(tmp_path: Path) -> None:
    site = {"launcher": "docker", "docker": {"default_image": "job:1", "gpu_ids": [3, 1]}}
    config = parse_site_config(site)
    engine = _Engine()
    launcher = DockerLauncher(config, client=engine)
    assert device_ids(launcher.render(one_gpu_job(tmp_path, config, 1))["containers.run"]) == [
        "3"]
    launcher.launch(one_gpu_job(tmp_path, config, 1))
    launcher.launch(one_gpu_job(tmp_path, config, 2))
    assert [device_ids(k) for k in engine.containers.created] == [["3"], ["1"]]
    launcher.close()
