"""DockerLauncher on the real engine of scripts/backends/docker.sh (marker: docker)."""

from __future__ import annotations

import socket
import textwrap
import time
from pathlib import Path

import pytest

from atoll.launchers.base import LaunchError, Outcome
from atoll.launchers.docker import DockerLauncher
from atoll.spec.resources import Resources
from tests.integration.docker.conftest import (
    STUDY,
    Engine,
    make_request,
    site_config,
    study_entry,
)

pytestmark = pytest.mark.docker

SLEEPER = "import time; print('started', flush=True); time.sleep(300)"


def wait_running(engine: Engine, container_id: str) -> dict:
    """The container's inspect data once the worker printed 'started' (bounded poll)."""
    container = engine.client.containers.get(container_id)
    for _ in range(100):
        if b"started" in container.logs():
            container.reload()
            return container.attrs
        time.sleep(0.1)
    raise AssertionError(f"worker never started; logs: {container.logs()!r}")


def assert_gone(engine: Engine, container_id: str) -> None:
    import docker

    with pytest.raises(docker.errors.NotFound):
        engine.client.containers.get(container_id)


def test_worker_completes_with_mounts_env_and_secrets(
    docker_engine: Engine, tmp_path: Path
) -> None:
    ro, rw = tmp_path / "ro-data", tmp_path / "rw-data"
    ro.mkdir()
    rw.mkdir(mode=0o777)
    rw.chmod(0o777)
    (ro / "slide.txt").write_text("tissue")
    study = study_entry(
        datasets={
            "slides": {"source": str(ro), "mode": "ro"},
            "scratch": {"source": str(rw), "mode": "rw"},
        },
        env={"EPOCHS": "3"},
        secret_env={"DB_PASSWORD": {"source": "env", "key": "IT_DB_PASSWORD"}},
    )
    program = textwrap.dedent(f"""
        import os, pathlib
        assert os.getuid() == 1000, os.getuid()
        root = pathlib.Path(os.environ["ATOLL_DATA_ROOT"])
        assert root == pathlib.Path("/data/{STUDY}")
        assert (root / "slides" / "slide.txt").read_text() == "tissue"
        try:
            (root / "slides" / "x").write_text("no")
            raise SystemExit("read-only dataset was writable")
        except OSError:
            pass
        (root / "scratch" / "out.txt").write_text("written")
        assert os.environ["EPOCHS"] == "3" and os.environ["DB_PASSWORD"] == "pw-from-parent"
        assert os.environ["ATOLL_JOB_TOKEN"].startswith("token-")
        assert not pathlib.Path("/var/run/docker.sock").exists()
        workdir = pathlib.Path(os.environ["ATOLL_WORKDIR"])
        (workdir / "result.txt").write_text("done")
        print("worker finished")
    """)
    launcher = DockerLauncher(site_config(docker_engine))
    # The site parent read DB_PASSWORD's value from its environment (IT_DB_PASSWORD): it reaches
    # the launcher only in the request's credentials.
    request = make_request(tmp_path / "run", program, site_config=launcher.site_config, study=study,
                           credentials={"DB_PASSWORD": "pw-from-parent"})
    (tmp_path / "run").mkdir()
    handle = launcher.launch(request)
    result = launcher.wait(handle)
    log = (tmp_path / "run" / "logs" / "worker.log").read_text()
    assert result.outcome is Outcome.COMPLETED, f"{result}; worker log:\n{log}"
    assert "worker finished" in log
    assert (tmp_path / "run" / "result.txt").read_text() == "done"
    assert (rw / "out.txt").read_text() == "written"
    assert_gone(docker_engine, handle.native_id)


def test_inspect_shows_the_rendered_cpu_memory_and_mounts(
    launcher: DockerLauncher, docker_engine: Engine, tmp_path: Path
) -> None:
    data = tmp_path / "slides"
    data.mkdir()
    study = study_entry(datasets={"slides": {"source": str(data), "mode": "ro"}})
    request = make_request(
        tmp_path / "run",
        SLEEPER,
        site_config=launcher.site_config,
        study=study,
        resources=Resources(num_of_gpus=0, num_of_cpus=2, memory="300Mi"),
        launcher_spec={"shm_size": "128Mi"},
    )
    rendered = launcher.render(request)["containers.run"]
    handle = launcher.launch(request)
    try:
        attrs = wait_running(docker_engine, handle.native_id)
        host = attrs["HostConfig"]
        assert host["NanoCpus"] == rendered["nano_cpus"] == 2_000_000_000
        assert host["Memory"] == rendered["mem_limit"] == 300 * 1024 * 1024
        assert host["ShmSize"] == 128 * 1024 * 1024
        assert host["NetworkMode"] == "none"  # its parent through the job's relay socket
        mounts = {m["Destination"]: (m["Source"], m["RW"]) for m in attrs["Mounts"]}
        assert mounts == {
            "/atoll/job": (str(tmp_path / "run"), True),
            f"/data/{STUDY}/slides": (str(data), False),
        }
        assert attrs["Config"]["User"] == "1000:1000"
        labels = attrs["Config"]["Labels"]
        assert labels["atoll.job_id"] == request.identity.job_id
        assert labels["atoll.site"] == "site-1" and labels["atoll.study"] == STUDY
    finally:
        launcher.cancel(handle)


def test_memory_hog_fails_with_out_of_memory(launcher: DockerLauncher, tmp_path: Path) -> None:
    hog = "chunks = []\nwhile True: chunks.append(bytearray(16 * 1024 * 1024))"
    request = make_request(
        tmp_path,
        hog,
        site_config=launcher.site_config,
        resources=Resources(num_of_gpus=0, num_of_cpus=1, memory="64Mi"),
    )
    result = launcher.wait(launcher.launch(request))
    assert result.outcome is Outcome.FAILED
    assert result.reason.startswith("out of memory (limit 64Mi)"), result.reason


def test_a_cancelled_workers_log_is_kept(
    launcher: DockerLauncher, docker_engine: Engine, tmp_path: Path
) -> None:
    """The container's log is saved before it is removed (what every launcher does on cancel
    is in tests/integration/launchers/test_contract.py)."""
    handle = launcher.launch(make_request(tmp_path, SLEEPER, site_config=launcher.site_config))
    wait_running(docker_engine, handle.native_id)
    launcher.cancel(handle)
    assert_gone(docker_engine, handle.native_id)
    assert "started" in (tmp_path / "logs" / "worker.log").read_text()


def test_missing_image_names_the_image_and_where_it_was_configured(
    docker_engine: Engine, tmp_path: Path
) -> None:
    config = site_config(docker_engine)
    launcher = DockerLauncher(config)
    study = study_entry(container={"image": "atoll-test/not-built:0"})
    with pytest.raises(LaunchError) as err:
        launcher.launch(make_request(tmp_path, "pass", site_config=config, study=study))
    assert "atoll-test/not-built:0" in str(err.value)
    assert f"local/study_runtime.yaml studies.{STUDY}.container.image" in str(err.value)
    allowing = site_config(docker_engine, allow_job_images=["atoll-test/*"])
    with pytest.raises(
        LaunchError, match=r"atoll-test/job-only:9 .*launcher_spec \(docker.image\)"
    ):
        DockerLauncher(allowing).launch(
            make_request(
                tmp_path,
                "pass",
                site_config=allowing,
                launcher_spec={"image": "atoll-test/job-only:9"},
            )
        )
    assert not docker_engine.session_containers()


def test_gpu_request_refused_by_the_engine_is_a_clear_launch_error(
    docker_engine: Engine, tmp_path: Path
) -> None:
    launcher = DockerLauncher(site_config(docker_engine, gpu_ids=[0, 1]))
    request = make_request(
        tmp_path,
        "pass",
        site_config=launcher.site_config,
        resources=Resources(num_of_gpus=1, num_of_cpus=1, memory="256Mi"),
    )
    assert launcher.render(request)["containers.run"]["device_requests"][0]["device_ids"] == ["0"]
    try:
        for _ in range(3):  # a refused launch gives its GPU back: GPU 0 is offered each time
            with pytest.raises(LaunchError, match=r"cannot give GPUs .*NVIDIA Container Toolkit"):
                launcher.launch(request)
            assert launcher.render(request)["containers.run"]["device_requests"][0][
                "device_ids"] == ["0"]
    finally:
        launcher.close()
    assert not docker_engine.session_containers()  # the created container was removed


def test_worker_reaches_a_loopback_parent_with_its_token(
    launcher: DockerLauncher, tmp_path: Path
) -> None:
    listener = socket.create_server(("127.0.0.1", 0))
    listener.settimeout(60)
    port = listener.getsockname()[1]
    # No network in the container: its parent is the job's relay socket (launchers/socket_relay),
    # in the run folder.
    program = textwrap.dedent("""
        import os, socket
        parent = os.environ["ATOLL_PARENT"]
        assert parent == "unix:/atoll/job/.atoll-parent.sock", parent
        with socket.socket(socket.AF_UNIX) as conn:
            conn.settimeout(30)
            conn.connect(parent.removeprefix("unix:"))
            conn.sendall(os.environ["ATOLL_JOB_TOKEN"].encode())
    """)
    request = make_request(
        tmp_path, program, site_config=launcher.site_config, parent_address=f"127.0.0.1:{port}"
    )
    handle = launcher.launch(request)
    try:
        conn, _ = listener.accept()
        with conn:
            received = conn.recv(200)
    finally:
        listener.close()
    assert received == f"token-{request.identity.job_id}".encode()
    assert launcher.wait(handle).outcome is Outcome.COMPLETED


def test_job_image_is_built_from_the_users_dockerfile(docker_engine: Engine) -> None:
    config = docker_engine.client.images.get(docker_engine.job_image).attrs["Config"]
    assert config["User"] == "1000:1000"
    assert config["Cmd"] == ["python", "-m", "atoll.worker"]
    assert "VIRTUAL_ENV=/opt/atoll" in config["Env"]
    assert config["Labels"]["atoll.test"] == "1"


def test_container_removed_behind_atolls_back_fails_the_job(
    launcher: DockerLauncher, docker_engine: Engine, tmp_path: Path
) -> None:
    handle = launcher.launch(make_request(tmp_path, SLEEPER, site_config=launcher.site_config))
    wait_running(docker_engine, handle.native_id)
    docker_engine.client.containers.get(handle.native_id).remove(force=True)
    result = launcher.wait(handle)
    assert result.outcome is Outcome.FAILED
    assert "disappeared" in result.reason or "lost the worker container" in result.reason


def test_flare_shm_size_and_no_cpu_limit_as_the_engine_stores_them(
    launcher: DockerLauncher, docker_engine: Engine, tmp_path: Path
) -> None:
    """NVIDIA FLARE 2.9's launcher_spec docker {shm_size: "1g"} in Docker's own units, and a
    job that asks no CPUs: ShmSize is 1 GiB and the container has no CPU limit (NanoCpus 0)."""
    request = make_request(
        tmp_path / "run",
        SLEEPER,
        site_config=launcher.site_config,
        resources=Resources(memory="256Mi"),
        launcher_spec={"shm_size": "1g"},
    )
    rendered = launcher.render(request)["containers.run"]
    assert "nano_cpus" not in rendered
    handle = launcher.launch(request)
    try:
        host = wait_running(docker_engine, handle.native_id)["HostConfig"]
        assert host["ShmSize"] == rendered["shm_size"] == 1 << 30
        assert host["NanoCpus"] == 0 and host["CpuQuota"] == 0
        assert host["Memory"] == 256 << 20
    finally:
        launcher.cancel(handle)
