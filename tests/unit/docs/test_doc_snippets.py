"""Every snippet the docs present as a whole file is checked with the command a reader would
run on it. Mark a fenced block as a file with a comment on the line before the fence:

    <!-- file: local/site.yaml -->
    <!-- file: local/study_runtime.yaml, beside: local/site.yaml -->
    <!-- file: local/privacy.yaml, launcher: k8s -->

`beside` puts the page's latest earlier snippets of those files next to it (a study's `docker`
block is valid only at a Docker site); without a site.yaml beside, the check writes the
smallest one of `launcher` (default: process without its sandbox). A site's `local/` files are checked with `atoll site
validate`, an `app/app.yaml` with `atoll job validate` (in a job folder with a stand-in for each
file it names), a `project.yaml` with `atoll provision`; a marked file with no check here fails."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from click.testing import CliRunner

from atoll.cli.main import cli
from tests.unit.docs.markdown import Block, blocks, documents

MINIMAL_SITE = "launcher: process\nprocess: {sandbox: none}\n"
SITE_FILES = ("local/site.yaml", "local/study_runtime.yaml", "local/privacy.yaml",
              "local/authorization.json")


def marked() -> list[Block]:
    return [b for doc in documents() for b in blocks(doc) if b.marker]


def _earlier(block: Block, path: str) -> Block:
    found = [b for b in blocks(block.doc) if b.marker == path and b.line < block.line]
    if not found:
        raise AssertionError(f"{block.where()}: beside {path}, but no earlier snippet of it")
    return found[-1]


def _job_around(app_yaml: str, folder: Path) -> None:
    """A job folder for an app.yaml: meta.json, and a stand-in for every file it names (a
    function or class of a FILE.py:NAME, an empty safetensors file)."""
    (folder / "app").mkdir(parents=True)
    (folder / "meta.json").write_text('{"name": "doc", "deploy_map": {"app": ["@ALL"]}}')
    (folder / "app" / "app.yaml").write_text(app_yaml)
    for name, symbol in re.findall(r"([\w-]+\.py)(?::(\w+))?", app_yaml):
        path = folder / "app" / name
        text = path.read_text() if path.exists() else ""
        if symbol and symbol[0].isupper():
            text += (f"from atoll.workflow import Workflow\n\n\nclass {symbol}(Workflow):\n"
                     "    def run(self):\n        pass\n")
        elif symbol:
            text += f"def {symbol}():\n    return {{}}\n"
        path.write_text(text)
    for name in re.findall(r"([\w-]+\.safetensors)", app_yaml):
        (folder / "app" / name).write_bytes(b"\x02" + b"\0" * 7 + b"{}")


def check(block: Block, tmp: Path) -> tuple[int, str]:
    """(exit code, output) of the reader's command on the snippet, written where it belongs."""
    if block.marker in SITE_FILES:
        for other in block.beside:
            (tmp / other).parent.mkdir(parents=True, exist_ok=True)
            (tmp / other).write_text(_earlier(block, other).text)
        (tmp / block.marker).parent.mkdir(parents=True, exist_ok=True)
        (tmp / block.marker).write_text(block.text)
        site = tmp / "local" / "site.yaml"
        if not site.exists():
            site.write_text(f"launcher: {block.launcher}\n" if block.launcher else MINIMAL_SITE)
        result = CliRunner().invoke(cli, ["site", "validate", str(tmp)])
    elif block.marker == "app/app.yaml":
        _job_around(block.text, tmp)
        result = CliRunner().invoke(cli, ["job", "validate", str(tmp)])
    elif block.marker == "project.yaml":
        (tmp / "project.yaml").write_text(block.text)
        result = CliRunner().invoke(cli, ["provision", str(tmp / "project.yaml"), "--out",
                                          str(tmp / "out")])
    else:
        return 2, f"no check for {block.marker}: add one to tests/unit/docs/test_doc_snippets.py"
    return result.exit_code, result.output


@pytest.mark.parametrize("block", marked(), ids=Block.where)
def test_a_snippet_marked_as_a_file_passes_the_readers_command(block, tmp_path):
    code, output = check(block, tmp_path)
    assert code == 0, f"{block.where()} ({block.marker}):\n{output}"


def test_the_docs_mark_each_kind_of_file_they_show():
    kinds = {b.marker for b in marked()}
    assert kinds >= {*SITE_FILES, "project.yaml", "app/app.yaml"}, kinds
    assert len(marked()) >= 12


def test_a_broken_snippet_fails_its_check(tmp_path):
    doc = tmp_path / "page.md"
    doc.write_text("<!-- file: local/site.yaml -->\n```yaml\nlauncher: docker\n```\n\n"
                   "<!-- file: local/study_runtime.yaml, beside: local/site.yaml -->\n"
                   "```yaml\nstudies:\n  s: {slurm: {partition: gpu}}\n```\n"
                   "<!-- file: local/privacy.yaml, launcher: k8s -->\n```yaml\nformat_version: 9\n```\n"
                   "<!-- file: job/meta.json -->\n```json\n{}\n```\n")
    site, runtime, privacy, meta = blocks(doc)
    assert (site.marker, runtime.beside) == ("local/site.yaml", ("local/site.yaml",))
    assert (privacy.marker, privacy.launcher) == ("local/privacy.yaml", "k8s")
    assert check(site, tmp_path / "a")[0] == 0
    code, output = check(privacy, tmp_path / "b")
    assert code == 2 and "format_version" in output, output
    assert "launcher k8s" in (tmp_path / "b" / "local" / "site.yaml").read_text().replace(":", "")
    code, output = check(runtime, tmp_path / "c")
    assert code == 2 and "format_version" in output and "slurm" in output, output
    assert "no check for job/meta.json" in check(meta, tmp_path / "d")[1]
