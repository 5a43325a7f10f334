"""Links between the docs lead somewhere: every relative link names a file or folder that
exists, and every #anchor a heading (GitHub's anchor of it) of the page it points to."""

from __future__ import annotations

from pathlib import Path
from urllib.parse import unquote

from tests.unit.docs.markdown import ROOT, anchors, documents, links, slug

EXTERNAL = ("http://", "https://", "mailto:")


def broken_links(doc: Path) -> list[str]:
    found = []
    for line, target in links(doc):
        if target.startswith(EXTERNAL):
            continue
        path, _, anchor = unquote(target).partition("#")
        goal = (doc.parent / path).resolve() if path else doc
        where = f"{doc.relative_to(ROOT)}:{line}: ({target})"
        if not goal.exists():
            found.append(f"{where} {path} does not exist")
        elif not goal.is_relative_to(ROOT):
            found.append(f"{where} leads out of the repository")
        elif anchor and goal.suffix == ".md" and anchor not in anchors(goal):
            found.append(f"{where} {goal.relative_to(ROOT)} has no heading #{anchor}")
    return found


def test_every_relative_link_and_anchor_in_the_docs_resolves():
    docs = documents()
    assert len(docs) > 20 and ROOT / "docs" / "operations.md" in docs
    problems = [p for doc in docs for p in broken_links(doc)]
    assert problems == [], "\n".join(problems)


def test_the_checker_finds_a_missing_file_and_a_missing_anchor(tmp_path, monkeypatch):
    monkeypatch.setattr("tests.unit.docs.test_doc_links.ROOT", tmp_path)
    (tmp_path / "b.md").write_text("# Backup and restore\n## Logs: where, rotation\n")
    doc = tmp_path / "a.md"
    doc.write_text("[ok](b.md#backup-and-restore) [ok](b.md#logs-where-rotation) "
                   "[gone](nowhere.md) [bad](b.md#restore) `[code](x.md)` [web](https://x.org)\n"
                   "```\n[fenced](y.md)\n```\n")
    assert broken_links(doc) == ["a.md:1: (nowhere.md) nowhere.md does not exist",
                                 "a.md:1: (b.md#restore) b.md has no heading #restore"]


def test_anchors_follow_github():
    assert slug("`local/site.yaml`: the study's `slurm` block") == "localsiteyaml-the-studys-slurm-block"
    assert slug("Backup and restore") == "backup-and-restore"
    assert slug("Upgrade (N-1 policy)") == "upgrade-n-1-policy"
