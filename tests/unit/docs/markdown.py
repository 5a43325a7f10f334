"""What the docs tests read of a Markdown file: its fenced blocks (with the marker comment before
each), its links outside code, and the anchors GitHub gives its headings."""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]
FENCE = re.compile(r"^(\s*)(`{3,}|~{3,})\s*([\w+-]*)")
# <!-- file: PATH[, beside: PATH PATH...][, launcher: NAME] -->
MARKER = re.compile(r"^<!--\s*file:\s*(?P<path>[\w./-]+)(?P<options>(?:\s*,\s*\w+:\s*[\w./ -]+?)*)"
                    r"\s*-->\s*$")
LINK = re.compile(r"(?<!\!)\[(?:[^\]\[]|\[[^\]]*\])*\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)")
IMAGE = re.compile(r"!\[[^\]]*\]\(\s*([^)\s]+)")
HTML_ANCHOR = re.compile(r"<a\s+(?:name|id)=\"([^\"]+)\"")


def documents() -> list[Path]:
    """Every Markdown file a reader of the repository opens: README, docs/, deploy/, examples/."""
    found = [ROOT / "README.md", ROOT / "BENCHMARKS.md"]
    for folder in ("docs", "deploy", "examples"):
        found += sorted((ROOT / folder).rglob("*.md"))
    return [p for p in found if p.is_file()]


@dataclass(frozen=True)
class Block:
    doc: Path
    line: int  # of the opening fence, 1-based
    lang: str
    text: str
    marker: str | None  # the file it is, from `<!-- file: PATH -->` on the line before
    beside: tuple[str, ...]  # the page's earlier snippets of these files sit beside it
    launcher: str | None = None  # else the site.yaml the check writes when none is beside

    def where(self) -> str:
        return f"{self.doc.relative_to(ROOT)}:{self.line}"


def blocks(doc: Path) -> list[Block]:
    lines = doc.read_text().splitlines()
    out, i = [], 0
    while i < len(lines):
        opened = FENCE.match(lines[i])
        if not opened:
            i += 1
            continue
        indent, fence, lang = opened.groups()
        start, body = i, []
        i += 1
        while i < len(lines) and not lines[i].strip().startswith(fence):
            body.append(lines[i][len(indent):] if lines[i].startswith(indent) else lines[i])
            i += 1
        marked = MARKER.match(lines[start - 1].strip()) if start else None
        options = dict(re.findall(r",\s*(\w+):\s*([\w./ -]+?)\s*(?=,|$)", marked["options"])) \
            if marked else {}
        out.append(Block(doc, start + 1, lang, "\n".join(body) + "\n",
                         marked["path"] if marked else None,
                         tuple(options.get("beside", "").split()), options.get("launcher")))
        i += 1
    return out


def prose(doc: Path) -> list[tuple[int, str]]:
    """(line number, text) of the lines outside fenced blocks, inline code removed."""
    out, fence = [], None
    for number, line in enumerate(doc.read_text().splitlines(), 1):
        opened = FENCE.match(line)
        if fence is None and opened:
            fence = opened[2]
            continue
        if fence is not None:
            if line.strip().startswith(fence):
                fence = None
            continue
        out.append((number, re.sub(r"(`+).+?\1", "", line)))
    return out


def links(doc: Path) -> list[tuple[int, str]]:
    return [(n, m) for n, line in prose(doc)
            for m in LINK.findall(line) + IMAGE.findall(line)]


def slug(heading: str) -> str:
    """GitHub's anchor of a heading: lowercase, punctuation dropped, spaces to hyphens."""
    text = re.sub(r"<[^>]+>", "", heading.strip().lower())
    text = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", text)  # a link keeps its text
    text = text.replace("`", "")
    text = re.sub(r"[^\w\- ]", "", text)
    return text.replace(" ", "-")


def anchors(doc: Path) -> set[str]:
    seen: dict[str, int] = {}
    out = set()
    for _, line in _heading_lines(doc):
        base = slug(line)
        count = seen.get(base, 0)
        seen[base] = count + 1
        out.add(base if count == 0 else f"{base}-{count}")
    for _, line in prose(doc):
        out.update(HTML_ANCHOR.findall(line))
    return out


def _heading_lines(doc: Path) -> list[tuple[int, str]]:
    out, fence = [], None
    for number, line in enumerate(doc.read_text().splitlines(), 1):
        opened = FENCE.match(line)
        if fence is None and opened:
            fence = opened[2]
            continue
        if fence is not None:
            if line.strip().startswith(fence):
                fence = None
            continue
        heading = re.match(r"^#{1,6}\s+(.*?)\s*#*\s*$", line)
        if heading:
            out.append((number, heading[1]))
    return out
