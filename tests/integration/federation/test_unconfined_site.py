"""A site that opts out of the process sandbox (`process: {sandbox: none}`): it says so loudly at
every start, and it may map one study at most (docs/security.md)."""

from __future__ import annotations

import pytest

from atoll.parent.local_config import SLURM_UNCONFINED_WARNING, UNCONFINED_WARNING
from tests.integration.federation.conftest import ADMIN, USERS
from tests.integration.federation.harness import Federation
from tests.integration.federation.jobs import make_job

TWO_STUDIES = "format_version: 2\nstudies:\n  default: {}\n  other: {}\n"


def _unconfine(fed: Federation, name: str) -> None:
    site_yaml = fed.kit(name) / "local" / "site.yaml"
    site_yaml.write_text(site_yaml.read_text() + "process: {sandbox: none}\n")


def test_an_unconfined_site_warns_at_start_and_runs_its_one_study(tmp_path):
    fed = Federation.provisioned(tmp_path / "fed", ["site-1"], USERS)
    _unconfine(fed, "site-1")
    fed.start_all()
    try:
        fed.wait_online(ADMIN)
        assert UNCONFINED_WARNING in fed.log("site-1")
        assert UNCONFINED_WARNING not in fed.log("server")  # the server keeps its sandbox
        with fed.session(ADMIN) as s:
            job = s.submit(make_job(tmp_path / "job"), wait=True, timeout=120)
            assert job["state"] == "FINISHED:COMPLETED", job
            # study_runtime.yaml is re-read at every launch, and checked again there.
            (fed.kit("site-1") / "local" / "study_runtime.yaml").write_text(TWO_STUDIES)
            refused = s.submit(make_job(tmp_path / "job2"), wait=True, timeout=120)
        assert refused["state"] == "FINISHED:FAILED"
        assert "maps 2 studies (default, other) while site.yaml sets process.sandbox: none" \
            in refused["parts"]["site-1"]["reason"]
    finally:
        fed.stop_all()


def test_an_unconfined_site_refuses_to_start_with_two_studies(tmp_path):
    fed = Federation.provisioned(tmp_path / "fed", ["site-1"], USERS,
                                 runtime={"site-1": TWO_STUDIES})
    _unconfine(fed, "site-1")
    fed.start_server()
    try:
        with pytest.raises(RuntimeError) as err:
            fed.start_site("site-1")
        text = str(err.value)
        assert "exited 2" in text
        assert "studies: maps 2 studies (default, other) while site.yaml sets " \
               "process.sandbox: none" in text
    finally:
        fed.stop_all()


BARE_SLURM = "launcher: slurm\nslurm: {pending_timeout: 60}\n"  # slurm.sandbox: none, the default


def test_a_bare_slurm_site_refuses_to_start_with_two_studies(tmp_path):
    fed = Federation.provisioned(tmp_path / "fed", ["site-1"], USERS,
                                 runtime={"site-1": TWO_STUDIES})
    (fed.kit("site-1") / "local" / "site.yaml").write_text(BARE_SLURM)
    fed.start_server()
    try:
        with pytest.raises(RuntimeError) as err:
            fed.start_site("site-1")
        text = str(err.value)
        assert "exited 2" in text
        assert ("studies: maps 2 studies (default, other) while the workers of default, other "
                "run as bare Slurm jobs") in text
    finally:
        fed.stop_all()


def test_a_bare_slurm_site_warns_and_refuses_a_launch_once_it_maps_two_studies(tmp_path):
    fed = Federation.provisioned(tmp_path / "fed", ["site-1"], USERS)
    (fed.kit("site-1") / "local" / "site.yaml").write_text(BARE_SLURM)
    fed.start_all()
    try:
        fed.wait_online(ADMIN)
        assert SLURM_UNCONFINED_WARNING in fed.log("site-1")
        # study_runtime.yaml is re-read at every launch, and checked again there: the job is
        # refused before anything reaches Slurm (sbatch is never called).
        (fed.kit("site-1") / "local" / "study_runtime.yaml").write_text(TWO_STUDIES)
        with fed.session(ADMIN) as s:
            refused = s.submit(make_job(tmp_path / "job"), wait=True, timeout=120)
        assert refused["state"] == "FINISHED:FAILED"
        reason = refused["parts"]["site-1"]["reason"]
        assert "maps 2 studies (default, other) while the workers of default, other run as " \
               "bare Slurm jobs" in reason, reason
        assert "sbatch" not in reason
    finally:
        fed.stop_all()
