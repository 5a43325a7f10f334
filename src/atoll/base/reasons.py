"""What a parent tells people about a failure: bounded, and without the parent's own paths.

Reasons and refusals travel in control messages, job records and gRPC status details, and come
partly from job code or a careless upload: each is clipped to a size every hop can carry. A
parent's absolute paths (its workspace, a job's run folder) say nothing to the user and tell
them how the host is laid out: they are rewritten relative to the job, or as `<workspace>`.
"""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path

MAX_REASON_CHARS = 2000  # a participant's or a job's reason
# gRPC carries status details in a trailer, percent-encoding every byte outside printable
# ASCII, and clients refuse trailers over 8 KiB: keep the encoded details well under that.
MAX_DETAILS_BYTES = 4000


def clip(text: str, limit: int = MAX_REASON_CHARS) -> str:
    """At most ``limit`` characters, saying how much was left out."""
    if len(text) <= limit:
        return text
    return f"{text[:limit]}... ({len(text) - limit:,} more characters)"


def clip_details(text: str, limit: int = MAX_DETAILS_BYTES) -> str:
    """Status details whose percent-encoded form stays within ``limit`` bytes."""
    cost = 0
    for i, ch in enumerate(text):
        cost += 1 if " " <= ch <= "~" and ch != "%" else 3 * len(ch.encode(errors="replace"))
        if cost > limit - 60:  # room for the note below
            return f"{text[:i]}... ({len(text) - i:,} more characters)"
    return text


def public(text: str, job_folders: Iterable[Path], workspace: Path | None = None,
           limit: int = MAX_REASON_CHARS) -> str:
    """``text`` with paths under ``job_folders`` made relative to them (the first that
    matches wins: list the deepest first) and the rest of ``workspace`` as `<workspace>`,
    clipped to ``limit`` characters."""
    for folder in job_folders:
        text = text.replace(f"{folder}/", "").replace(str(folder), ".")
    if workspace is not None:
        text = text.replace(str(workspace), "<workspace>")
    return clip(text, limit)
