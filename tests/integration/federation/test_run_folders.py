"""A site's run folders go where local/site.yaml says (process.workdir), in the running site
parent and in `atoll site render` alike: one rule, spec/run_folders.py. The render names the
site by its certificate, not by the folder the kit happens to be in."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

from click.testing import CliRunner

from atoll.cli.site_render import render_command
from atoll.spec.run_folders import server_run_folder
from tests.integration.federation.conftest import ADMIN, USERS
from tests.integration.federation.harness import Federation
from tests.integration.federation.jobs import ECHO, make_job

# The worker writes down the folder it was given, inside that folder.
WHERE = ECHO.replace("fl.init()\n", (
    "fl.init()\nimport os\n"
    "with open(os.path.join(os.environ['ATOLL_WORKDIR'], 'where.txt'), 'w') as out:\n"
    "    out.write(os.environ['ATOLL_WORKDIR'])\n"), 1)


def test_a_site_runs_jobs_under_its_workdir_as_render_shows(tmp_path):
    runs = tmp_path / "runs"  # outside the kit: another disk, say
    fed = Federation.provisioned(tmp_path / "fed", ["site-1"], USERS)
    site_yaml = fed.kit("site-1") / "local" / "site.yaml"
    site_yaml.write_text(site_yaml.read_text() + f"process: {{workdir: {runs}}}\n")
    fed.start_all()
    try:
        fed.wait_online(ADMIN)
        with fed.session(ADMIN) as s:
            job = s.submit(make_job(tmp_path / "job", WHERE), wait=True, timeout=120)
        assert job["state"] == "FINISHED:COMPLETED", (job, fed.log("site-1"))
    finally:
        fed.stop_all()
    job_id = job["job_id"]
    folder = runs / "jobs" / job_id
    assert (folder / "where.txt").read_text() == str(folder)
    assert (folder / "logs" / "worker.log").is_file()
    assert not (fed.workspace("site-1") / "jobs" / job_id).exists()
    assert not list((runs / ".fetching").iterdir())  # the scratch of the fetch is gone
    # The same kit in a folder of another name: render still names it by its certificate.
    moved = tmp_path / "copy-of-the-kit"
    shutil.copytree(fed.kit("site-1"), moved, symlinks=True)
    result = CliRunner().invoke(render_command, [str(moved), str(tmp_path / "job"), "--study",
                                                 "default", "--job-id", job_id,
                                                 "--format", "json"])
    assert result.exit_code == 0, result.output
    out = json.loads(result.output)
    assert out["site"] == "site-1"
    assert out["run_folder"] == str(folder)
    # The server's workflow ran where render --site server says, by the same module's rule.
    server_kit = fed.kit("server")
    result = CliRunner().invoke(render_command, [str(server_kit), str(tmp_path / "job"),
                                                 "--study", "default", "--job-id", job_id,
                                                 "--site", "server", "--format", "json"])
    assert result.exit_code == 0, result.output
    ran = Path(json.loads(result.output)["run_folder"])
    assert ran == server_run_folder(fed.workspace("server"), job_id)
    assert (ran / "logs").is_dir(), sorted(p.name for p in ran.parent.iterdir())
