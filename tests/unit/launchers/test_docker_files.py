"""Static checks of docker/: the user images and the compose example.

The job image is also built for real from docker/job.Dockerfile by scripts/backends/docker.sh
(offline, without PyTorch) and used by tests/integration/docker; the parent image builds the same
way with ATOLL_DOCKER_IMAGES=parent. Building them with PyTorch and from PyPI needs the network
and minutes, so here the files are checked as text: what each must and must not contain.
"""

from __future__ import annotations

import re
import tomllib
from pathlib import Path

import pytest
import yaml

REPO = Path(__file__).resolve().parents[3]
DOCKER = REPO / "docker"
SOCKET = "/var/run/docker.sock"


def instructions(name: str) -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) of a Dockerfile, continuation lines joined, comments dropped."""
    text = (DOCKER / name).read_text()
    logical = re.sub(
        r"\\\n\s*",
        " ",
        "\n".join(line for line in text.splitlines() if not line.lstrip().startswith("#")),
    )
    out = []
    for line in logical.splitlines():
        if line.strip():
            word, _, rest = line.strip().partition(" ")
            out.append((word.upper(), rest.strip()))
    return out


@pytest.mark.parametrize("name", ["job.Dockerfile", "parent.Dockerfile"])
def test_dockerfile_shape(name: str) -> None:
    steps = instructions(name)
    words = [w for w, _ in steps]
    assert set(words) <= {
        "ARG",
        "FROM",
        "ENV",
        "RUN",
        "COPY",
        "USER",
        "WORKDIR",
        "CMD",
        "ENTRYPOINT",
    }, words
    assert steps[0] == ("ARG", "BASE_IMAGE=python:3.11-slim-bookworm")  # a build arg for offline
    assert ("FROM", "${BASE_IMAGE}") in steps and words.count("FROM") == 1
    users = [arg for w, arg in steps if w == "USER"]
    assert users and users[-1] not in ("0", "root", "0:0"), "the image must end as a non-root user"
    for word, arg in steps:
        if word == "COPY":  # every source is in the repository and let through .dockerignore
            for source in arg.split()[:-1]:
                assert source == "." or (REPO / source).exists(), f"{name}: COPY {source}"
    assert SOCKET not in (DOCKER / name).read_text()


def test_job_image_runs_the_worker_with_the_pinned_torch() -> None:
    steps = dict(instructions("job.Dockerfile"))
    assert steps["CMD"] == '["python", "-m", "atoll.worker"]'
    pyproject = tomllib.loads((REPO / "pyproject.toml").read_text())
    (torch,) = pyproject["project"]["optional-dependencies"]["torch"]
    assert f'ARG TORCH_REQUIREMENT="{torch}"' in (DOCKER / "job.Dockerfile").read_text()
    assert "download.pytorch.org/whl/cpu" in (DOCKER / "job.Dockerfile").read_text()


def test_parent_image_has_no_torch() -> None:
    text = (DOCKER / "parent.Dockerfile").read_text()
    assert "torch" not in text.lower().replace("no pytorch", "")
    assert dict(instructions("parent.Dockerfile"))["ENTRYPOINT"] == '["atoll"]'


def test_dockerignore_keeps_the_context_to_the_package() -> None:
    lines = (REPO / ".dockerignore").read_text().split()
    assert lines[lines.index("*")] == "*"
    assert {"!src", "!pyproject.toml", "!docker/wheels"} <= set(lines)


def load_compose() -> dict:
    """compose.yaml with its variables as compose fills them when unset (defaults; '999')."""
    text = (DOCKER / "compose.yaml").read_text()
    text = re.sub(r"\$\{\w+:-([^}]*)\}", r"\1", text)
    text = re.sub(r"\$\{\w+:\?[^}]*\}", "999", text)
    assert "${" not in text, "a variable without a default or a required-message"
    return yaml.safe_load(text)


def test_compose_gives_the_socket_to_the_parents_and_binds_kits_by_host_path() -> None:
    # Each parent (the server's workflow too) runs its job workers as containers on the engine:
    # the socket is the parents'; job containers never get it (the launcher refuses it).
    compose = load_compose()
    services = compose["services"]
    assert set(services) == {"server", "site-a", "site-b"}
    for name, service in services.items():
        volumes = service.get("volumes", [])
        assert f"{SOCKET}:{SOCKET}" in volumes, name
        assert service["image"] == "atoll-parent:0.1"
        assert service["group_add"] == ["999"] and service["networks"] == ["fl"]
        assert service["command"][:2] == (["server", "start"] if name == "server"
                                          else ["site", "start"])
        # The run folders are bound by host path: same path inside as outside.
        kit = next(v for v in volumes if not v.startswith(SOCKET))
        host, inside = kit.split(":")
        assert host == inside and inside == service["command"][2]
    assert compose["networks"]["fl"]["name"] == "atoll-fl"


def test_compose_project_matches_the_services() -> None:
    project = yaml.safe_load((DOCKER / "project.yaml").read_text())
    compose = load_compose()
    assert project["server"]["host"] == "server"
    assert {s["name"] for s in project["sites"]} | {"server"} == set(compose["services"])
    for name, service in compose["services"].items():
        assert service["command"][2].endswith(f"/{project['name']}/{name}")
