"""Another job is the attacker (issue 32, item 6): a Docker job container reaches its own parent
and nothing else, on the real engine of scripts/backends/docker.sh.

The attacker does what was reproduced against the host network: it lists the listeners it can
see in ``/proc/net/tcp`` and ``/proc/net/unix`` and connects to every one, plus the ones it was
told about outright: another job's container listening on every interface (a distributed job's
rendezvous store), listeners on the host's loopback and on every host address (a process-launched
job's rendezvous), an abstract unix socket on the host, and the engine's own sockets (its unix
socket and the abstract ones its daemons hold). Every attempt must fail and none of them may be
listed, while the same container still reaches its parent: a real WorkerLink endpoint accepts its
one-time token through the job's relay socket, and a federated job on a Docker site completes.

Kubernetes: each job's own NetworkPolicy lives exactly as long as its Pod (the test cluster has
no CNI to enforce it; the rules are tested in tests/unit/launchers/test_k8s_network_policy.py).

Docker: scripts/backends/docker.sh up; Kubernetes: scripts/backends/k8s.sh up. Without them the
tests skip, or fail under CI=true (tests/integration/{docker,k8s}/conftest.py).
"""

from __future__ import annotations

import contextlib
import json
import re
import socket
import textwrap
import threading
import uuid
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
import yaml

from atoll.launchers.base import Outcome
from atoll.launchers.docker import DockerLauncher
from atoll.parent.worker_endpoint import WorkerTokens, start_worker_endpoint
from tests.integration.docker.conftest import (
    SESSION_ID,
    SESSION_LABEL,
    Engine,
    make_request,
    site_config,
)
from tests.integration.federation.harness import Federation
from tests.integration.federation.jobs import ECHO, make_job

# --- the attacker, in Python (stdlib only: it runs in the test job image) -----------------------
PROBE = textwrap.dedent(
    """
    import json, os, socket

    def tcp_listeners():
        ports = set()
        for table in ("/proc/net/tcp", "/proc/net/tcp6"):
            try:
                lines = open(table).read().splitlines()[1:]
            except OSError:
                continue
            for line in lines:
                fields = line.split()
                if fields[3] == "0A":  # LISTEN
                    ports.add(int(fields[1].rsplit(":", 1)[1], 16))
        return sorted(ports)

    def abstract_sockets():
        names = set()
        for line in open("/proc/net/unix").read().splitlines()[1:]:
            fields = line.split()
            if len(fields) >= 8 and fields[7].startswith("@"):
                names.add(fields[7][1:])
        return sorted(names)

    def connects(family, kind, address):
        s = socket.socket(family, kind)
        s.settimeout(5)
        try:
            s.connect(address)
            return True
        except OSError:
            return False
        finally:
            s.close()

    seen_ports, seen_abstract = tcp_listeners(), abstract_sockets()
    reached = []
    for port in sorted(set(seen_ports) | set(TARGETS["ports"])):
        for host in ["127.0.0.1", *TARGETS["hosts"]]:
            if connects(socket.AF_INET, socket.SOCK_STREAM, (host, port)):
                reached.append(f"tcp {host}:{port}")
    for name in sorted(set(seen_abstract) | set(TARGETS["abstract"])):
        for kind in (socket.SOCK_STREAM, socket.SOCK_DGRAM):
            if connects(socket.AF_UNIX, kind, "\\0" + name):
                reached.append(f"unix @{name}")
    for path in TARGETS["paths"]:
        if connects(socket.AF_UNIX, socket.SOCK_STREAM, path):
            reached.append(f"unix {path}")
    report = {"seen_ports": seen_ports, "seen_abstract": seen_abstract, "reached": reached}
    text = "NETWORK " + json.dumps(report)
    print(text, flush=True)
    with open(os.path.join(os.environ["ATOLL_WORKDIR"], "network-probe.json"), "w") as out:
        out.write(json.dumps(report))
    """
)

# Another job's rendezvous store: listens on every interface, answers whoever connects.
VICTIM = textwrap.dedent(
    """
    import socket, threading
    store = socket.create_server(("0.0.0.0", PORT))
    print("started", flush=True)
    while True:
        conn, peer = store.accept()
        print("CONNECTION FROM", peer, flush=True)
        conn.sendall(b"rendezvous keys")
        conn.close()
    """
)


def probe_program(targets: dict[str, Any]) -> str:
    return f"TARGETS = {json.dumps(targets)}\n{PROBE}"


def probe_report(log: str) -> dict[str, Any]:
    found = re.search(r"^NETWORK (\{.*\})$", log, re.MULTILINE)
    assert found, f"the attacker reported nothing; its log:\n{log}"
    return json.loads(found.group(1))


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def host_addresses() -> list[str]:
    """This host's non-loopback IPv4 addresses (where a 0.0.0.0 listener also answers)."""
    try:
        infos = socket.getaddrinfo(socket.gethostname(), None, socket.AF_INET)
    except OSError:
        return []
    return sorted({i[4][0] for i in infos if not i[4][0].startswith("127.")})


def engine_abstract_sockets() -> list[str]:
    """The abstract unix sockets this host lists (the engine's daemons hold some)."""
    names = set()
    for line in Path("/proc/net/unix").read_text().splitlines()[1:]:
        fields = line.split()
        if len(fields) >= 8 and fields[7].startswith("@"):
            names.add(fields[7][1:])
    return sorted(names)


@contextlib.contextmanager
def host_listeners() -> Iterator[dict[str, Any]]:
    """Listeners of a job on the host (a process-launched rendezvous): TCP on every interface
    and on loopback, and an abstract unix socket. Yields what was listening, with every
    connection any of them accepted."""
    anywhere = socket.create_server(("0.0.0.0", 0))
    loopback = socket.create_server(("127.0.0.1", 0))
    abstract = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    name = f"atoll-test-rendezvous-{uuid.uuid4().hex[:12]}"
    abstract.bind("\0" + name)
    abstract.listen(8)
    accepted: list[str] = []

    def serve(listener: socket.socket, what: str) -> None:
        while True:
            try:
                conn, _ = listener.accept()
            except OSError:
                return
            accepted.append(what)
            conn.close()

    listeners = ((anywhere, "tcp 0.0.0.0"), (loopback, "tcp 127.0.0.1"), (abstract, name))
    for listener, what in listeners:
        threading.Thread(target=serve, args=(listener, what), daemon=True).start()
    try:
        yield {"ports": [anywhere.getsockname()[1], loopback.getsockname()[1]],
               "abstract": name, "accepted": accepted}
    finally:
        for listener, _ in listeners:
            with contextlib.suppress(OSError):
                listener.shutdown(socket.SHUT_RDWR)
            listener.close()


def assert_reached_nothing(report: dict[str, Any], targets: dict[str, Any],
                           host: dict[str, Any]) -> None:
    assert report["reached"] == [], f"the job reached other listeners: {report['reached']}"
    assert host["accepted"] == [], f"a host listener took a connection: {host['accepted']}"
    visible = set(report["seen_ports"]) & set(targets["ports"])
    assert not visible, f"the host's (or another job's) listeners are listed: {visible}"
    assert not set(report["seen_abstract"]) & set(targets["abstract"]), report["seen_abstract"]


def wait_started(engine: Engine, container_id: str) -> None:
    container = engine.client.containers.get(container_id)
    for _ in range(600):  # a generous outer limit: the victim prints as soon as it listens
        if b"started" in container.logs():
            return
        container.reload()
        assert container.status in ("created", "running"), container.logs()
        threading.Event().wait(0.1)
    raise AssertionError(f"the victim never listened; its log: {container.logs()!r}")


# --- two jobs' containers, side by side ---------------------------------------------------------
@pytest.mark.docker
def test_a_job_container_reaches_no_other_job_nor_the_host_nor_the_engine(
    docker_engine: Engine, tmp_path: Path
) -> None:
    launcher = DockerLauncher(site_config(docker_engine))
    port = free_port()
    victim_request = make_request(tmp_path / "victim", VICTIM.replace("PORT", str(port)),
                                  site_config=launcher.site_config)
    (tmp_path / "victim").mkdir()
    (tmp_path / "attacker").mkdir()
    victim = launcher.launch(victim_request)
    try:
        wait_started(docker_engine, victim.native_id)
        with host_listeners() as host:
            targets = {
                "ports": [port, *host["ports"]],
                "hosts": host_addresses(),
                "abstract": [host["abstract"], *engine_abstract_sockets()],
                "paths": [docker_engine.env["DOCKER_HOST"].removeprefix("unix://"),
                          "/var/run/docker.sock", "/run/docker.sock"],
            }
            attacker_request = make_request(tmp_path / "attacker", probe_program(targets),
                                            site_config=launcher.site_config)
            result = launcher.wait(launcher.launch(attacker_request))
            log = (tmp_path / "attacker" / "logs" / "worker.log").read_text()
            assert result.outcome is Outcome.COMPLETED, f"{result.reason}; log:\n{log}"
            report = probe_report(log)
            assert_reached_nothing(report, targets, host)
        victim_log = docker_engine.client.containers.get(victim.native_id).logs()
        assert b"CONNECTION FROM" not in victim_log, victim_log
    finally:
        launcher.cancel(victim)
        launcher.close()


# --- ... and still its parent -------------------------------------------------------------------
class _Backend:
    """The parent's side of a worker's registration; the rest is not used here."""

    def __init__(self) -> None:
        self.registered: list[str] = []

    def on_register(self, job_id: str) -> dict[str, Any]:
        self.registered.append(job_id)
        return {"parent_says": "welcome"}


REGISTER = textwrap.dedent(
    """
    import json, os
    from atoll.wire import messages as msg, rpc
    from atoll.wire.worker_link import worker_channel
    parent = os.environ["ATOLL_PARENT"]
    stub = rpc.stub(worker_channel(parent, os.environ.get("ATOLL_PARENT_CERT")), "WorkerLink")
    body = json.dumps({"job_id": os.environ["ATOLL_JOB_ID"], "token": os.environ["ATOLL_JOB_TOKEN"]})
    print("PARENT", parent, stub.Register(msg.Json(body=body), timeout=60).body, flush=True)
    """
)


@pytest.mark.docker
@pytest.mark.parametrize("through", ["parent-unix-socket", "parent-tcp"])
def test_a_job_container_registers_with_its_parent_through_its_socket(
    docker_engine: Engine, tmp_path: Path, through: str
) -> None:
    """The job's relay socket leads to the parent's own unix socket (a site parent's), or to
    its loopback TCP endpoint where it has none."""
    tokens, backend = WorkerTokens(), _Backend()
    endpoint = start_worker_endpoint(tokens, backend, "127.0.0.1", 0)  # the default endpoint
    launcher = DockerLauncher(site_config(docker_engine))
    try:
        request = make_request(tmp_path, REGISTER, site_config=launcher.site_config,
                               parent_address=endpoint.address)
        if through == "parent-unix-socket":
            request = replace(request, parent_socket=endpoint.socket_path)
        token = tokens.issue(request.identity.job_id)
        request.credentials["ATOLL_JOB_TOKEN"] = token
        rendered = launcher.render(request)["containers.run"]
        assert rendered["network_mode"] == "none"
        result = launcher.wait(launcher.launch(request))
    finally:
        launcher.close()
        endpoint.stop(0)
    log = (tmp_path / "logs" / "worker.log").read_text()
    assert result.outcome is Outcome.COMPLETED, f"{result.reason}; log:\n{log}"
    assert backend.registered == [request.identity.job_id]
    assert "PARENT unix:/atoll/job/.atoll-parent.sock" in log and "welcome" in log, log


# --- a real federation: another study's job on a Docker site ------------------------------------
ADMIN = "admin@docker.test"
USERS = [{"name": ADMIN, "org": "test", "role": "project_admin"}]
STUDIES = {"victims": {"sites": ["site-d"], "admins": [ADMIN]},
           "attackers": {"sites": ["site-d"], "admins": [ADMIN]}}
RUNTIME = "format_version: 2\nstudies:\n  victims: {}\n  attackers: {}\n"


@pytest.fixture(scope="module")
def docker_site(docker_engine: Engine, tmp_path_factory: pytest.TempPathFactory):
    fed = Federation.provisioned(tmp_path_factory.mktemp("hostile-net"), ["site-d"], USERS,
                                 STUDIES, runtime={"site-d": RUNTIME})
    site_yaml = {
        "launcher": "docker",
        "docker": {
            "base_url": docker_engine.env["DOCKER_HOST"],
            "default_image": docker_engine.job_image,
            "pull_policy": "never",
            "labels": {"atoll.test": "1", SESSION_LABEL: SESSION_ID},
        },
        "capacity": {"gpus": 0, "cpus": 2, "memory": "2Gi"},
    }  # worker_endpoint: the default, 127.0.0.1
    (fed.kit("site-d") / "local" / "site.yaml").write_text(yaml.safe_dump(site_yaml))
    fed.start_server()
    fed.start_site("site-d")
    fed.wait_online(ADMIN)
    yield fed
    fed.stop_all()


@pytest.mark.docker
def test_another_studys_job_reaches_only_its_parent(docker_site: Federation,
                                                    tmp_path: Path) -> None:
    with host_listeners() as host:  # the victim study's rendezvous, on the site's host
        targets = {"ports": host["ports"], "hosts": host_addresses(),
                   "abstract": [host["abstract"], *engine_abstract_sockets()], "paths": []}
        script = probe_program(targets) + ECHO
        job_dir = make_job(tmp_path / "net-attacker", script=script, sites=["site-d"])
        meta = json.loads((job_dir / "meta.json").read_text())
        meta["resource_spec"] = {"@default": {"num_of_cpus": 1, "memory": "512Mi"}}
        (job_dir / "meta.json").write_text(json.dumps(meta))
        with docker_site.session(ADMIN, study="attackers") as session:
            job = session.submit(job_dir, wait=True, timeout=180)
        site_log = docker_site.log("site-d")
        # The worker reached its parent (the job completed), through the relay socket only.
        assert job["state"] == "FINISHED:COMPLETED", f"{job}\nsite-d log:\n{site_log}"
        folder = docker_site.workspace("site-d") / "jobs" / job["job_id"]
        report = json.loads((folder / "network-probe.json").read_text())
        assert_reached_nothing(report, targets, host)


# --- Kubernetes: the job's own NetworkPolicy on the real API server ----------------------------
@pytest.mark.k8s
def test_a_kubernetes_job_is_under_its_own_network_policy_while_its_pod_lives(
    cluster: Any, tmp_path: Path
) -> None:
    """The test cluster has no CNI (its pods use the host network), so nothing enforces the
    policy here: what is checked is that the API server holds the job's policy, as rendered,
    for as long as the job's Pod exists (created first, removed with it)."""
    from kubernetes import client
    from kubernetes.client.exceptions import ApiException

    from tests.integration.k8s.conftest import make_launcher
    from tests.integration.k8s.conftest import make_request as make_pod_request

    launcher = make_launcher(cluster)
    networking = client.NetworkingV1Api(cluster.api.api_client)
    script = "sleep 1; echo done"
    request = make_pod_request(launcher, script, tmp_path)
    rendered = launcher.render(request)["network_policy"]
    ns, name = cluster.namespace, rendered["metadata"]["name"]
    handle = launcher.launch(request)
    try:
        live = networking.read_namespaced_network_policy(name, ns).to_dict()
        pod = cluster.api.read_namespaced_pod(handle.native_id, ns)
        selector = live["spec"]["pod_selector"]["match_labels"]
        assert selector == rendered["spec"]["podSelector"]["matchLabels"]
        assert selector.items() <= pod.metadata.labels.items()  # it selects the job's Pod
        assert live["spec"]["policy_types"] == ["Ingress", "Egress"]
        assert [p["port"] for p in live["spec"]["egress"][1]["ports"]] == [7001]  # the parent
        assert live["spec"]["egress"][1]["to"][0]["ip_block"]["cidr"] == "127.0.0.1/32"
        owners = live["metadata"]["owner_references"]
        assert [(o["kind"], o["name"]) for o in owners] == [("Pod", handle.native_id)]
        assert launcher.wait(handle).outcome is Outcome.COMPLETED
    finally:
        launcher.cancel(handle)
        launcher.close()
    with pytest.raises(ApiException) as err:
        networking.read_namespaced_network_policy(name, ns)
    assert err.value.status == 404  # gone with the job
