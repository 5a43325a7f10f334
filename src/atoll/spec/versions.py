"""Which atoll versions may run together in one federation (docs/operations.md, Versions).

A site may run the server's release or one minor release older (same major): the server is
upgraded first, then the sites, one at a time, and a federation keeps running in between. A
site newer than its server, or more than one minor release behind, is refused at connect with
both versions in the message; so is a site that does not say its version. Patch releases never
change the protocol, so they always mix.
"""

from __future__ import annotations

import re

MINOR_BEHIND = 1  # how many minor releases a site may lag behind its server
_VERSION = re.compile(r"(\d+)\.(\d+)(?:\.(\d+))?")
GUIDE = "docs/operations.md, Upgrading"


def parse(text: object) -> tuple[int, int, int] | None:
    """(major, minor, patch) of ``0.2.1``, ``0.2`` or ``0.3.0rc1``; None for anything else."""
    found = _VERSION.match(text) if isinstance(text, str) and len(text) <= 64 else None
    if found is None:
        return None
    return int(found[1]), int(found[2]), int(found[3] or 0)


def version_refusal(site: object, server: str, who: str = "site") -> str | None:
    """Why a site that says it runs ``site`` may not join a server of version ``server``;
    None when it may. ``who`` names the peer in the sentence (the CLI warns of itself)."""
    ours, theirs = parse(server), parse(site)
    if ours is None:  # our own version: a broken install, not the site's fault
        return None
    lowest = f"{ours[0]}.{max(0, ours[1] - MINOR_BEHIND)}"
    if theirs is None:
        shown = repr(site)[:40] if site is not None else "no version"
        return (f"this {who} sent {shown} as its atoll version; the server runs atoll {server} "
                f"and admits {who}s of {lowest} to {ours[0]}.{ours[1]}: upgrade the {who} "
                f"({GUIDE})")
    if theirs[:2] > ours[:2]:
        return (f"this {who} runs atoll {site}, newer than the server's {server}: upgrade the "
                f"server first, then the {who}s ({GUIDE})")
    if theirs[0] < ours[0] or ours[1] - theirs[1] > MINOR_BEHIND:
        return (f"this {who} runs atoll {site}, too old for the server's {server}, which admits "
                f"{who}s of {lowest} to {ours[0]}.{ours[1]}: upgrade the {who} ({GUIDE})")
    return None
