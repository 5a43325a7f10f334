"""From starting a deployment to its site online: a Helm release and parent containers (issue 28).

    .venv/bin/python -m bench.deploy_start [--repeats 3] [--no-write]

Needs the real backends of `make test` with the parent image: `scripts/backends/k8s.sh up` and
`scripts/backends/docker.sh up` (both build it by default). Each repeat provisions a fresh
federation (one server, one site, mutual TLS) and times, from the first call that starts it
until the server reports the site online (an admin session polling every 50 ms):

- Kubernetes: the kits as Secrets made beforehand; `helm install` of the server release, then of
  the site release (helm-sdkpy, no --wait), as the release test does (host network, local
  images); then both releases uninstalled and the namespace deleted.
- Docker: the server's and the site's `docker run` (the parent image, host network, the
  engine's socket), as test_docker_deployment does; then both containers removed.

Writes the table into BENCHMARKS.md between `<!-- deploy-start:begin -->` and
`<!-- deploy-start:end -->`.
"""

from __future__ import annotations

import argparse
import datetime as dt
import os
import statistics
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

from atoll.pki.project import parse_project
from atoll.pki.provision import provision
from bench.sections import write_section
from tests.integration.backend_env import read_env_file
from tests.integration.federation.harness import PROJECT, Federation, free_port, project_doc

ROOT = Path(__file__).resolve().parent.parent
SECTION = "deploy-start"  # its markers in BENCHMARKS.md (bench/sections.py)
HEADING = "Deployments: start to a site online"
ADMIN = "admin@bench.test"
SITE = "site-b"


def _federation(tmp: Path) -> tuple[Federation, int]:
    port = free_port()
    doc = project_doc(port, [SITE], [{"name": ADMIN, "org": "bench", "role": "project_admin"}])
    provision(parse_project(doc, "bench"), tmp)
    return Federation(tmp / PROJECT, [SITE]), port


def helm_once(tmp: Path) -> float:
    import helm_sdkpy as helm
    from kubernetes import client, config

    from tests.integration.k8s.conftest import SESSION_ID, Cluster
    from tests.integration.k8s.helm_support import (
        CHART,
        job_image_tag,
        kit_secret,
        parent_pods,
        release_values,
        run,
        wait_online,
        wait_until,
    )

    env = read_env_file("ATOLL_K8S_BASE", "/tmp/atoll-k8s")
    api = client.CoreV1Api(config.new_client_from_config(config_file=env["KUBECONFIG"]))
    namespace = f"atoll-bench-{uuid.uuid4().hex[:8]}"
    api.create_namespace({"metadata": {"name": namespace}})
    cluster = Cluster(env, api, namespace)
    wait_until(lambda: [s for s in api.list_namespaced_service_account(namespace).items
                        if s.metadata.name == "default"], 30, "the default ServiceAccount")
    fed, port = _federation(tmp)
    kit_secret(cluster, f"server-kit-{SESSION_ID}", fed.kit("server") / "startup")
    kit_secret(cluster, f"site-kit-{SESSION_ID}", fed.kit(SITE) / "startup")
    job_image = job_image_tag(cluster)
    helm_config = helm.Configuration(namespace=namespace, kubeconfig=env["KUBECONFIG"])
    releases = ["bench-server", "bench-site"]
    values = [release_values("server", cluster, env["ATOLL_K8S_PARENT_IMAGE"], job_image,
                             server={"port": port, "service": {"port": port}}),
              release_values("site", cluster, env["ATOLL_K8S_PARENT_IMAGE"], job_image)]
    try:
        started = time.monotonic()
        for release, chosen in zip(releases, values, strict=True):
            run(helm.Install(helm_config).run(release, str(CHART), values=chosen, wait=False))
        wait_online(fed, ADMIN, cluster, releases, 180)
        return time.monotonic() - started
    finally:
        for release in releases:
            run(helm.Uninstall(helm_config).run(release, wait=True, timeout=120))
        wait_until(lambda: not any(parent_pods(cluster, r) for r in releases), 120, "no Pod")
        api.delete_namespace(namespace)


def docker_once(tmp: Path) -> float:
    import docker
    from tests.integration.docker.conftest import Engine
    from tests.integration.docker.deployment import (
        own_kit,
        parent_container,
        wait_online,
        write_local,
    )

    env = read_env_file("ATOLL_DOCKER_BASE", "/tmp/atoll-docker")
    engine = Engine(env, docker.DockerClient(base_url=env["DOCKER_HOST"]))
    fed, _ = _federation(tmp)
    for name in ("server", SITE):
        write_local(fed, name, env["ATOLL_TEST_JOB_IMAGE"])
        own_kit(fed.kit(name))
    gid = os.stat(env["DOCKER_HOST"].removeprefix("unix://")).st_gid
    containers: list[Any] = []
    try:
        started = time.monotonic()
        for role, name in (("server", "server"), ("site", SITE)):
            containers.append(parent_container(engine, env["ATOLL_TEST_PARENT_IMAGE"], role,
                                               fed.kit(name), gid))
        wait_online(fed, ADMIN, containers, 120)
        return time.monotonic() - started
    finally:
        for container in containers:
            container.remove(force=True)
        engine.client.close()


def table(results: dict[str, list[float]], repeats: int) -> str:
    now = dt.datetime.now(dt.UTC).strftime("%Y-%m-%d %H:%M UTC")
    rows = {
        "helm": "`helm install` server + site releases → site online (Kubernetes)",
        "docker": "`docker run` server + site parent containers → site online (Docker)",
    }
    lines = [f"Measured {now} on this machine ({os.cpu_count()} CPUs), one run of:", "",
             f"    .venv/bin/python -m bench.deploy_start --repeats {repeats}", "",
             "| deployment | median | runs (in order) |", "| --- | --- | --- |"]
    for key, times in results.items():
        runs = " / ".join(f"{t:.1f}" for t in times)
        lines.append(f"| {rows[key]} | {statistics.median(times):.1f} s | {runs} s |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--no-write", action="store_true", help="print the table only")
    parser.add_argument("--output", default=str(ROOT / "BENCHMARKS.md"))
    args = parser.parse_args(argv)
    results: dict[str, list[float]] = {"helm": [], "docker": []}
    for _ in range(args.repeats):  # interleaved: drift on the machine hits both alike
        for key, once in (("helm", helm_once), ("docker", docker_once)):
            with tempfile.TemporaryDirectory(prefix=f"atoll-bench-{key}-") as tmp:
                results[key].append(once(Path(tmp)))
                print(f"{key}: {results[key][-1]:.2f} s", flush=True)
    text = table(results, args.repeats)
    print(text)
    if not args.no_write:
        write_section(Path(args.output), SECTION, HEADING, text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
