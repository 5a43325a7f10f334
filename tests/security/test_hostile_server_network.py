"""Another study's job at the same site hunts a distributed job's rendezvous (issue 32, item 6).

A real local federation (process launcher, bwrap sandbox): studies alpha and beta share the
site ``shared``. Alpha's job trains with two ranks: ``fl.init()`` rendezvouses them through
PyTorch's TCPStore (unauthenticated, listening on every interface) at ``MASTER_PORT``, and
rank 0 also listens on ``0.0.0.0`` and on ``127.0.0.1`` (ports it writes only into its own run
folder). The host runs a Docker-daemon stand-in (an abstract unix socket: the kind
``dockerd``'s ``@/containerd-shim/...`` sockets are) and a TCP service of its own. Beta's job
is then told every one of those ports and names (a real attacker finds them in
``/proc/net/tcp`` and ``/proc/net/unix``, which it also reads) and tries them all.

With the defence (each worker in a network namespace of its own, its parent through a bound
unix socket) every attempt fails, ``/proc/net`` shows none of them, and still: both of alpha's
ranks rendezvous, and the destination the site allows in site.yaml (an echo service standing
in for its MLflow server) answers through the forwarder. ``ATOLL_TEST_NETWORK=host`` writes
``process: {network: host}`` (the opt-out) instead: then the attack tests fail, as they do
with ``ATOLL_TEST_NETWORK=unset`` (no network setting) on the code before this defence.
"""

from __future__ import annotations

import contextlib
import json
import os
import secrets
import socket
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.integration.federation.harness import Federation, job_folder

pytest.importorskip("torch")

SITE = "shared"
ADMIN, LEAD_A, LEAD_B = "admin@consortium.org", "lead@alpha.org", "lead@beta.org"
USERS = [
    {"name": ADMIN, "org": "consortium", "role": "project_admin"},
    {"name": LEAD_A, "org": "alpha-org", "role": "lead"},
    {"name": LEAD_B, "org": "beta-org", "role": "lead"},
]
STUDIES = {"alpha": {"sites": [SITE], "admins": [LEAD_A]},
           "beta": {"sites": [SITE], "admins": [LEAD_B]}}
RUNTIME = "format_version: 2\nstudies:\n  alpha: {}\n  beta: {}\n"
# "": the default; "host": the opt-out; "unset": no setting (the code before the defence)
NETWORK = os.environ.get("ATOLL_TEST_NETWORK", "")
DAEMON = f"atoll-test-daemon-{secrets.token_hex(6)}"  # the abstract socket's name
TERMINAL = ("FINISHED:COMPLETED", "FINISHED:FAILED", "FINISHED:ABORTED")
APP_YAML = "server:\n  workflow: scatter_gather\n  args: {num_rounds: 1}\nsite:\n  script: train.py\n"

# Alpha: two ranks; rank 0 announces its ports in its own run folder, both wait for "stop".
VICTIM = '''
import json, os, socket, time
from pathlib import Path

import atoll.client as fl
import torch
import torch.distributed as dist

work = Path(os.environ["ATOLL_WORKDIR"])
fl.init()  # the ranks' rendezvous: PyTorch's TCPStore at MASTER_ADDR:MASTER_PORT
total = torch.ones(1)
dist.all_reduce(total)
if fl.rank() == 0:
    listeners = []
    for host in ("0.0.0.0", "127.0.0.1"):
        s = socket.socket()
        s.bind((host, 0))
        s.listen()
        listeners.append(s)
    (work / "ports.tmp").write_text(json.dumps({
        "store": int(os.environ["MASTER_PORT"]), "any": listeners[0].getsockname()[1],
        "loopback": listeners[1].getsockname()[1], "ranks_summed": total.item()}))
    (work / "ports.tmp").rename(work / "ports.json")
while not (work / "stop").exists():
    time.sleep(0.2)
while fl.is_running():
    model = fl.receive()
    if model is None:
        break
    fl.send(fl.Model(params=model.params, num_examples=1))
'''

# Beta: reads /proc/net, tries every port and name it was told, and the allowed destination.
ATTACKER = '''
import json, os, socket
from pathlib import Path

import atoll.client as fl

work = Path(os.environ["ATOLL_WORKDIR"])
targets = json.loads((work / "app" / "targets.json").read_text())

def listening(path):
    """The ports of the sockets in LISTEN state (0A) that this /proc/net file shows."""
    try:
        lines = Path(path).read_text().splitlines()[1:]
    except OSError:
        return []
    return [int(line.split()[1].rsplit(":", 1)[1], 16) for line in lines
            if line.split()[3] == "0A"]

def attempt(family, address):
    s = socket.socket(family, socket.SOCK_STREAM)
    s.settimeout(3)
    try:
        s.connect(address)
        return "connected"
    except OSError as exc:
        return f"refused: {exc}"
    finally:
        s.close()

record = {"tcp_listening": sorted(set(listening("/proc/net/tcp") + listening("/proc/net/tcp6")))}
try:
    record["unix"] = Path("/proc/net/unix").read_text()
except OSError as exc:
    record["unix"] = f"unreadable: {exc}"
ports = sorted({*targets["ports"], *record["tcp_listening"]})
record["tcp"] = {f"{host}:{port}": attempt(socket.AF_INET, (host, port))
                 for port in ports for host in targets["hosts"]}
record["daemon"] = attempt(socket.AF_UNIX, "\\0" + targets["daemon"])
host, port = targets["allowed"]
try:
    with socket.create_connection((host, port), timeout=10) as s:
        s.sendall(b"ping from the job")
        record["allowed"] = s.recv(100).decode()
except OSError as exc:
    record["allowed"] = f"refused: {exc}"
(work / "attacks.tmp").write_text(json.dumps(record))
(work / "attacks.tmp").rename(work / "attacks.json")
fl.init()
while fl.is_running():
    model = fl.receive()
    if model is None:
        break
    fl.send(fl.Model(params=model.params, num_examples=1))
'''


def _host_address() -> str | None:
    """An address of this host besides loopback (no packet is sent), if it has one."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        try:
            s.connect(("10.255.255.255", 1))
            address = s.getsockname()[0]
        except OSError:
            return None
    return None if address.startswith("127.") else address


@contextlib.contextmanager
def _listening(family: int, address: Any, echo: bool = False) -> Iterator[socket.socket]:
    """A host service: it accepts (and, with echo, answers) until the test ends."""
    server = socket.socket(family, socket.SOCK_STREAM)
    server.bind(address)
    server.listen(16)

    def serve() -> None:
        while True:
            try:
                conn, _ = server.accept()
            except OSError:
                return
            with conn:
                if echo:
                    with contextlib.suppress(OSError):
                        conn.sendall(b"echo: " + conn.recv(100))

    threading.Thread(target=serve, daemon=True).start()
    try:
        yield server
    finally:
        server.close()


def _site_yaml(kit: Path, allowed_port: int) -> None:
    if NETWORK == "unset":  # the code before this defence knows no process.network
        return
    block = ("{network: host}" if NETWORK == "host"
             else f'{{network: {{allow: ["127.0.0.1:{allowed_port}"]}}}}')
    site_yaml = kit / "local" / "site.yaml"
    site_yaml.write_text(site_yaml.read_text() + f"\nprocess: {block}\n")


def _wait_file(fed: Federation, session, job_id: str, path: Path) -> dict[str, Any]:
    deadline = time.monotonic() + 180
    while not path.exists():
        status = session.status(job_id)
        if status["state"] in TERMINAL or time.monotonic() > deadline:
            pytest.fail(f"job {job_id} left no {path.name}: {status['state']} {status['reason']}"
                        f" {json.dumps(status['parts'])[:1500]}\nsite: {fed.log(SITE)[-1500:]}")
        time.sleep(0.2)
    return json.loads(path.read_text())


@pytest.fixture(scope="module")
def outcome(tmp_path_factory) -> dict[str, Any]:
    base = tmp_path_factory.mktemp("network")
    fed = Federation.provisioned(base / "kits", [SITE], USERS, STUDIES, runtime={SITE: RUNTIME})
    with (_listening(socket.AF_UNIX, "\0" + DAEMON),
          _listening(socket.AF_INET, ("127.0.0.1", 0)) as host_service,
          _listening(socket.AF_INET, ("127.0.0.1", 0), echo=True) as allowed):
        allowed_port, host_port = allowed.getsockname()[1], host_service.getsockname()[1]
        for kit in (SITE, "server"):
            _site_yaml(fed.kit(kit), allowed_port)
        try:
            fed.start_server()
            fed.start_site(SITE)
            fed.wait_online(ADMIN)
            with (fed.session(LEAD_A, study="alpha") as alpha,
                  fed.session(LEAD_B, study="beta") as beta):
                victim_job = job_folder(
                    base / "victim", {"name": "alpha-ddp", "deploy_map": {"app": ["@ALL"]},
                                      "launcher_spec": {SITE: {"process": {
                                          "processes_per_node": 2}}}},
                    APP_YAML, {"train.py": VICTIM})
                victim_id = alpha.submit(victim_job)["job_id"]
                victim_dir = fed.workspace(SITE) / "jobs" / victim_id
                ports = _wait_file(fed, alpha, victim_id, victim_dir / "ports.json")
                targets = {
                    "ports": sorted({ports["store"], ports["any"], ports["loopback"],
                                     host_port}),
                    "hosts": ["127.0.0.1", *filter(None, [_host_address()])],
                    "daemon": DAEMON, "allowed": ["127.0.0.1", allowed_port]}
                attacker_job = job_folder(
                    base / "attacker", {"name": "beta-scan", "deploy_map": {"app": ["@ALL"]}},
                    APP_YAML, {"train.py": ATTACKER, "targets.json": json.dumps(targets)})
                attacker_id = beta.submit(attacker_job)["job_id"]
                attacker_dir = fed.workspace(SITE) / "jobs" / attacker_id
                try:
                    record = _wait_file(fed, beta, attacker_id, attacker_dir / "attacks.json")
                finally:
                    (victim_dir / "stop").write_text("")
                victim = alpha.wait(victim_id, timeout=180)
                attacker = beta.wait(attacker_id, timeout=180)
        finally:
            fed.stop_all()
    return {"ports": ports, "targets": targets, "record": record, "victim": victim,
            "attacker": attacker, "host_service": host_port}


def test_another_jobs_rendezvous_and_listeners_are_unreachable(outcome):
    record, ports = outcome["record"], outcome["ports"]
    victim_ports = {ports["store"], ports["any"], ports["loopback"]}
    reached = {where: how for where, how in record["tcp"].items()
               if int(where.rsplit(":", 1)[1]) in victim_ports and how == "connected"}
    assert not reached, f"the other study's job reached alpha's rendezvous/listeners: {reached}"


def test_the_hosts_own_services_are_unreachable(outcome):
    port = outcome["host_service"]
    reached = {w: h for w, h in outcome["record"]["tcp"].items()
               if int(w.rsplit(":", 1)[1]) == port and h == "connected"}
    assert not reached, f"a job reached a TCP service of the host: {reached}"


def test_the_hosts_abstract_unix_socket_is_unreachable(outcome):
    assert outcome["record"]["daemon"] != "connected", (
        "a job connected to the host's abstract unix socket (the Docker daemon's kind)")


def test_proc_net_lists_no_socket_but_the_jobs_own(outcome):
    record, ports = outcome["record"], outcome["ports"]
    seen = set(record["tcp_listening"])
    others = {ports["store"], ports["any"], ports["loopback"], outcome["host_service"]}
    assert not seen & others, f"/proc/net/tcp shows other jobs' or the host's listeners: " \
                              f"{sorted(seen & others)}"


def test_proc_net_unix_lists_no_socket_of_the_host(outcome):
    assert DAEMON not in outcome["record"]["unix"], "/proc/net/unix lists the host's sockets"


def test_both_ranks_of_a_job_still_rendezvous(outcome):
    assert outcome["ports"]["ranks_summed"] == 2.0  # all_reduce over both ranks
    assert outcome["victim"]["state"] == "FINISHED:COMPLETED", outcome["victim"]


def test_the_destination_the_site_allows_is_reachable(outcome):
    assert outcome["record"]["allowed"] == "echo: ping from the job", outcome["record"]
    assert outcome["attacker"]["state"] == "FINISHED:COMPLETED", outcome["attacker"]
