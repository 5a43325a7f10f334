"""A job's meta.json is bounded: its size, its nesting, its lists; a site is listed once. The
bounds keep the dispatch, which carries the meta to every site in one control message, small."""

from __future__ import annotations

import json

import pytest

from atoll.spec.errors import SpecError
from atoll.spec.meta import (
    MAX_APPS,
    MAX_LIST,
    MAX_META_BYTES,
    MAX_META_DEPTH,
    load_meta,
    parse_meta,
)
from atoll.wire.frames import MAX_CONTROL

from .helpers import by_path, issues_of


def meta(**fields):
    return {"name": "job", "deploy_map": {"app": ["server", "site-a", "site-b"]}, **fields}


def test_a_site_listed_twice_is_named_with_its_first_place():
    issues = by_path(issues_of(load_meta, meta(mandatory_clients=["site-a", "site-b", "site-a"])))
    assert issues == {"mandatory_clients[2]": "'site-a' is already listed at [0]; list each "
                                              "site once"}


def test_thousands_of_repeats_give_a_short_message():
    issues = issues_of(load_meta, meta(mandatory_clients=["site-a"] * MAX_LIST))
    assert [i.path for i in issues] == ["mandatory_clients[1]", "mandatory_clients[2]",
                                        "mandatory_clients[3]", "mandatory_clients"]
    assert issues[-1].message == f"and {MAX_LIST - 4:,} more repeated sites"


def test_lists_and_maps_over_their_limits_are_refused_naming_the_field():
    issues = by_path(issues_of(load_meta, meta(mandatory_clients=["site-a"] * (MAX_LIST + 1))))
    assert issues == {"mandatory_clients": "lists 10,001 sites; at most 10,000 are allowed (list "
                                           "each site once)"}
    targets = ["server", *(f"s{i}" for i in range(MAX_LIST))]
    issues = by_path(issues_of(load_meta, meta(deploy_map={"app": targets})))
    assert list(issues) == ["deploy_map.app"] and "10,001 targets" in issues["deploy_map.app"]
    apps = {f"a{i}": [f"s{i}"] for i in range(MAX_APPS + 1)}
    issues = by_path(issues_of(load_meta, meta(deploy_map=apps)))
    assert issues == {"deploy_map": "has 1,001 apps; at most 1,000 are allowed"}


def test_a_meta_over_the_size_limit_is_refused_before_it_is_read(tmp_path):
    path = tmp_path / "meta.json"
    path.write_text(json.dumps(meta(mandatory_clients=["site-a"] * 150_000)))
    with pytest.raises(SpecError, match=r"meta.json is [\d,]+ bytes; the limit is 1,048,576"):
        load_meta(tmp_path)
    with pytest.raises(SpecError, match="is 1,048,577 bytes"):
        parse_meta(b" " * (MAX_META_BYTES + 1))


def test_nesting_past_the_limit_is_named_by_its_top_level_key():
    nested: dict = {}
    for _ in range(MAX_META_DEPTH - 1):  # the document itself is the first level
        nested = {"x": nested}
    assert "depth" not in str(issues_of(load_meta, meta(resource_spec=nested)))
    issues = by_path(issues_of(load_meta, meta(resource_spec={"x": nested})))
    assert issues == {"resource_spec": "nests deeper than 32 levels"}
    deep = b'{"name": "x", "launcher_spec": ' + b"[" * 100_000 + b"]" * 100_000 + b"}"
    assert by_path(issues_of(parse_meta, deep)) == {"": "nests deeper than 32 levels"}


@pytest.mark.parametrize(("raw", "message"), [
    (b'{"name": "\xff"}', "is not UTF-8 text (byte 10); save it as UTF-8"),
    (b"[1]", "must be a JSON object, not a list"),
    (b'{"name": "\\ud800"}', "holds a lone surrogate"),
    (b'{"name": "x", "deploy_map": {"\\ud83d": ["server"]}}', "holds a lone surrogate"),
    (b'{"name": "x", "deploy_map": {"a\\u001b": ["server"]}}', "control character"),
    (b'{"name": "x", "deploy_map": {"' + b"n" * 256 + b'": ["server"]}}', "at most 255 bytes"),
])
def test_text_no_folder_or_store_could_hold_is_refused(raw, message):
    assert message in str(issues_of(parse_meta, raw))


def test_the_largest_meta_fits_in_one_control_message():
    """Re-encoded as ASCII JSON for the dispatch, a meta grows at most 3x (a 2-byte character
    becomes a 6-byte escape): within MAX_CONTROL, whatever it holds. And a real one at the
    limits: the longest site lists, a name of 2-byte characters."""
    assert 3 * MAX_META_BYTES + 64 * 1024 < MAX_CONTROL
    sites = [f"{i:05d}-" + "s" * 42 for i in range(MAX_LIST - 1)]
    doc = meta(name="é" * 256, deploy_map={"app": ["server", *sites]}, mandatory_clients=sites)
    raw = json.dumps(doc, ensure_ascii=False, separators=(",", ":")).encode()
    assert MAX_META_BYTES - 64 * 1024 < len(raw) <= MAX_META_BYTES
    loaded = parse_meta(raw).model_dump(mode="json")
    dispatch = json.dumps({"job_id": "0" * 32, "name": doc["name"], "study": "s",
                           "meta": loaded})
    assert len(dispatch) < MAX_CONTROL
