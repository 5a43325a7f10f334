"""``atoll job import-flare`` through the CLI: its report, --format json, and a refusal rendered
as an error naming the file and field (exit 2), never a traceback."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

from click.testing import CliRunner

from atoll.cli.main import cli

HELLO_PT = Path(__file__).parents[2] / "compat" / "flare_jobs" / "hello-pt"


def test_text_report_lists_the_changed_import_and_what_was_not_translated(tmp_path):
    result = CliRunner().invoke(cli, ["job", "import-flare", str(HELLO_PT), str(tmp_path / "o")])
    assert result.exit_code == 0, result.output
    assert "import line changed: app_site-1/client.py:14: import nvflare.client as flare" \
        in result.output
    assert "not translated (6):" in result.output
    assert "IntimeModelSelector" in result.output


def test_json_report(tmp_path):
    result = CliRunner().invoke(cli, ["job", "import-flare", str(HELLO_PT), str(tmp_path / "o"),
                                      "--format", "json"])
    report = json.loads(result.output)
    assert report["ok"] is True and "meta.json" in report["files"]
    assert len(report["rewritten"]) == 2 and len(report["not_translated"]) == 6


def test_a_job_it_cannot_translate_is_an_error_naming_the_file(tmp_path):
    job = Path(shutil.copytree(HELLO_PT, tmp_path / "job"))
    config = job / "app_server" / "config" / "config_fed_server.json"
    data = json.loads(config.read_text())
    data["workflows"][0]["path"] = "nvflare.app_common.workflows.scaffold.Scaffold"
    config.write_text(json.dumps(data))
    result = CliRunner().invoke(cli, ["job", "import-flare", str(job), str(tmp_path / "o")])
    assert result.exit_code == 2
    assert "app_server/config/config_fed_server.json" in result.output
    assert "workflows" in result.output and "Traceback" not in result.output


def test_submitting_a_flare_job_folder_as_it_is_points_at_import_flare():
    result = CliRunner().invoke(cli, ["job", "submit", str(HELLO_PT)])
    assert result.exit_code == 2
    assert "is an NVIDIA FLARE job folder" in result.output
    assert f"atoll job import-flare {HELLO_PT} OUT_DIR" in result.output
