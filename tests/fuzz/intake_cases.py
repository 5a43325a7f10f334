"""Generated job uploads for the intake fuzzer, built in memory: random zip entries (names such as
`.`, `..`, absolute, repeated, a file and a folder of one name, deep nesting), meta documents
(deep, huge lists, not an object, not UTF-8, random JSON), and damaged archives (wrong declared
sizes, flags, cut short, bytes flipped).

Every accepted job must wait, never run: each meta that could be valid names `site-1`, a site
that never comes online in the fuzzer's federation.
"""

from __future__ import annotations

import io
import json
import zipfile
from typing import Any

from hypothesis import strategies as st

from tests.integration.federation.zips import job_zip, patch

SITE = "site-1"
SPECIAL_NAMES = [
    ".", "..", "./", "/", "//", "/etc/passwd", "../escape.py", "a/../../b", "./app/x.py",
    "app//x.py", "a\\b", "C:x", "~x", "meta.json", "meta.json/", "meta.json/inner", "app",
    "app/", "app/app.yaml", "app/app.yaml/x", "app/x\x1b[2J", "app/new\nline", "", " ",
    "app/é.py", "app/中文.py", "app/" + "n" * 255, "app/" + "n" * 256, "app/\x7f",
]
SEGMENTS = st.one_of(
    st.sampled_from([".", "..", "", "app", "meta.json", "x", "é", "\x00", "\x1b", "a b"]),
    st.text(alphabet=st.characters(codec="utf-8", exclude_categories=("Cs",)), max_size=12),
)


@st.composite
def entry_names(draw) -> str:
    kind = draw(st.integers(0, 9))
    if kind < 3:
        return draw(st.sampled_from(SPECIAL_NAMES))
    if kind == 3:  # deep: past the nesting and length limits (2,100 levels was reported)
        depth = draw(st.sampled_from([31, 32, 33, 100, 2100]))
        return "/".join(["d"] * depth) + draw(st.sampled_from(["", "/", "/x.py"]))
    return "/".join(draw(st.lists(SEGMENTS, min_size=1, max_size=5)))


CONTENTS = st.one_of(st.none(), st.binary(max_size=64), st.just(b"print('x')\n" * 50))

JSON_SCALARS = st.one_of(
    st.none(), st.booleans(), st.integers(-(10**20), 10**20), st.floats(allow_nan=True),
    st.text(max_size=8), st.sampled_from([SITE, "server", "@ALL", "@default", "app", "Gi"]),
)
KEYS = st.sampled_from(["name", "deploy_map", "min_clients", "mandatory_clients",
                        "resource_spec", "launcher_spec", "study", "submitter", "app", "x"])
RANDOM_JSON = st.recursive(
    JSON_SCALARS,
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(KEYS | st.text(max_size=5),
                                                                inner, max_size=4),
    max_leaves=12,
)
TARGETS = st.sampled_from([SITE, "server", "@ALL", "site-2", "bad name", "", "server\x1b"])


def _waits(targets: list[str]) -> list[str]:
    """Targets that keep an accepted job waiting for SITE (or invalid: @ALL alongside)."""
    return targets if SITE in targets or "@ALL" in targets else [*targets, SITE]


@st.composite
def metas(draw) -> Any:
    """A meta close to valid, with some of its fields made hostile."""
    apps = draw(st.lists(st.sampled_from(["app", "other", ".", "..", "a/b", "", "x\n",
                                          "n" * 300]), min_size=0, max_size=3, unique=True))
    deploy = {a: draw(st.lists(TARGETS, max_size=4)) for a in apps}
    if deploy:
        first = next(iter(deploy))
        deploy[first] = _waits(deploy[first])
    meta: dict[str, Any] = {"name": draw(st.text(max_size=300) | JSON_SCALARS),
                            "deploy_map": deploy}
    if draw(st.booleans()):
        size = draw(st.sampled_from([0, 2, 3, 100, 10_000, 10_001, 20_000, 120_000]))
        meta["mandatory_clients"] = [draw(TARGETS)] * size
    for key in ("min_clients", "resource_spec", "launcher_spec", "study", "submitter"):
        if draw(st.integers(0, 3)) == 0:
            meta[key] = draw(RANDOM_JSON)
    if draw(st.integers(0, 4)) == 0:
        meta[draw(KEYS)] = draw(RANDOM_JSON)
    return meta


@st.composite
def meta_bytes(draw) -> bytes:
    kind = draw(st.integers(0, 11))
    if kind == 0:  # nested far past the limit, or just past it
        depth = draw(st.sampled_from([31, 33, 1000, 200_000]))
        opener, closer = draw(st.sampled_from([("[", "]"), ('{"a":', "}")]))
        inner = opener * depth + "0" + closer * depth
        return ('{"name": "deep", "launcher_spec": ' + inner + "}").encode()
    if kind == 1:  # not an object
        return json.dumps(draw(st.lists(JSON_SCALARS, max_size=3) | JSON_SCALARS)).encode()
    if kind == 2:  # not UTF-8, or a lone surrogate
        good = json.dumps(draw(metas())).encode()
        at = draw(st.integers(0, len(good)))
        return good[:at] + draw(st.sampled_from([b"\xff", b"\xc3", b"\\ud800", b"\xed\xa0\x80"])
                                ) + good[at:]
    if kind == 3:
        return json.dumps(draw(RANDOM_JSON)).encode()
    if kind == 4:  # cut short
        good = json.dumps(draw(metas())).encode()
        return good[: draw(st.integers(0, len(good)))]
    return json.dumps(draw(metas())).encode()


def _zip_of(entries: list[tuple[str, bytes | None]], stored: bool) -> bytes:
    buffer = io.BytesIO()
    method = zipfile.ZIP_STORED if stored else zipfile.ZIP_DEFLATED
    with zipfile.ZipFile(buffer, "w", compression=method) as zf:
        for name, data in entries:
            info = zipfile.ZipInfo(name)
            if data is None:  # a folder entry, as archivers write them
                info = zipfile.ZipInfo(name if name.endswith("/") else name + "/")
                info.external_attr = 0o40755 << 16
                data = b""
            info.compress_type = method
            zf.writestr(info, data)  # a repeated name is written twice, as asked
    return buffer.getvalue()


@st.composite
def uploads(draw) -> bytes:
    """One upload: a job zip, perhaps with hostile entries, perhaps damaged."""
    import warnings

    kind = draw(st.integers(0, 9))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # zipfile warns of the repeated names it writes
        if kind == 0:  # entries only, meta.json among them or not
            entries = draw(st.lists(st.tuples(entry_names(), CONTENTS), max_size=8))
            data = _zip_of(entries, draw(st.booleans()))
        else:
            extra = dict(draw(st.lists(st.tuples(entry_names(), CONTENTS), max_size=4)))
            extra.pop("meta.json", None)
            data = job_zip(raw_meta=draw(meta_bytes()), extra=extra)
    damage = draw(st.integers(0, 9))
    if damage == 0:  # a size declared smaller or larger than the entry holds
        data = patch(data, "meta.json", file_size=draw(st.sampled_from([0, 5, 10**6, 2**32 - 1])))
    elif damage == 1:  # encrypted, or a name marked UTF-8 (and maybe not)
        data = patch(data, "meta.json", flags=draw(st.sampled_from([0x1, 0x800, 0x8])))
    elif damage == 2:  # cut short
        data = data[: draw(st.integers(0, len(data)))]
    elif damage == 3:  # one byte changed
        at = draw(st.integers(0, max(len(data) - 1, 0)))
        data = data[:at] + bytes([draw(st.integers(0, 255))]) + data[at + 1:]
    return data
