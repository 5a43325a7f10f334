"""A site frees what a job held before it reports the job FINISHED: the server, told, may send
the next job at once (its scheduler is woken by the report), and that job must find the room."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

from atoll.launchers.base import Outcome, WorkerExit
from atoll.parent.worker_endpoint import WorkerTokens
from atoll.site.supervisor import NotAdmitted, Supervisor
from atoll.spec.meta import load_meta
from atoll.spec.study_runtime import load_study_runtime

SEED = Path(__file__).parents[2] / "fixtures/seed"


class Host:
    launcher = SimpleNamespace(name="process")

    def __init__(self, local: Path, cpus: int):
        self.local, self.cpus = local, cpus

    def study_runtime(self):
        return load_study_runtime(self.local, "process")

    def capacity(self):
        return {"cpus": self.cpus}  # room for one job

    def runs_root(self):
        return self.local.parent / "ws"


class ServerLink:
    """The link to the server, answering FINISHED as the server does: with the next job."""

    def __init__(self):
        self.supervisor: Supervisor | None = None
        self.next_admitted: list[str] = []

    def send_state(self, job_id, state, reason="", **extra):
        if state.startswith("FINISHED:"):
            try:
                self.supervisor._admit("b" * 32, "pathology", load_meta(SEED / "meta.json"))
                self.next_admitted.append("admitted")
            except NotAdmitted as exc:
                self.next_admitted.append(str(exc))


def test_the_next_job_finds_the_room_of_the_one_reported_finished(tmp_path):
    local = tmp_path / "local"
    local.mkdir()
    (local / "site.yaml").write_text((SEED / "site_process.yaml").read_text())
    (local / "study_runtime.yaml").write_text((SEED / "study_runtime_process.yaml").read_text())
    link = ServerLink()
    meta = load_meta(SEED / "meta.json")
    cpus = meta.resource_spec["@default"]["num_of_cpus"]
    supervisor = Supervisor(SimpleNamespace(name="hospital-a", workspace=tmp_path / "ws"),
                            host=Host(local, cpus), link=link, server=None,
                            tokens=WorkerTokens())
    link.supervisor = supervisor
    first = supervisor._admit("a" * 32, "pathology", meta)
    assert first.resources.cpus_counted == cpus
    supervisor._finish(first, WorkerExit(Outcome.COMPLETED, "worker exited with code 0", 0))
    assert link.next_admitted == ["admitted"]
