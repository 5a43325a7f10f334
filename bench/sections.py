"""BENCHMARKS.md's generated sections: each benchmark rewrites only the text between its own
``<!-- NAME:begin -->`` and ``<!-- NAME:end -->`` markers, or adds the section at the end."""

from __future__ import annotations

from pathlib import Path


def write_section(path: Path, name: str, heading: str, text: str) -> None:
    begin, end = f"<!-- {name}:begin -->", f"<!-- {name}:end -->"
    body = path.read_text() if path.exists() else "# Benchmarks\n"
    block = f"{begin}\n{text}\n{end}"
    if begin in body and end in body:
        body = body[:body.index(begin)] + block + body[body.index(end) + len(end):]
    else:
        body = body.rstrip("\n") + f"\n\n## {heading}\n\n{block}\n"
    path.write_text(body if body.endswith("\n") else body + "\n")
