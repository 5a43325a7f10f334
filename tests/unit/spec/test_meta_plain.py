"""The plain meta.json check (spec/meta_plain.py) accepts only what the models accept, with the
same values, and spares the CLI's check and the server worker pydantic when it vouches."""

from __future__ import annotations

import copy
import json
import subprocess
import sys

import pytest

from atoll.spec.errors import SpecError
from atoll.spec.meta import JobMeta, validate_meta
from atoll.spec.meta_plain import MAX_CLIENTS, PlainMeta, read_meta, vouch_meta

BASES = [
    {"name": "tiny", "deploy_map": {"app": ["@ALL"]}, "min_clients": 2},  # bench/compare's
    {"name": "two apps", "deploy_map": {"srv": ["server"], "cli": ["site-1", "site-2"]},
     "mandatory_clients": ["site-1"], "min_clients": 1},
    {"name": "n", "deploy_map": {"app": ["server", "site-1"]}, "resource_spec": {},
     "launcher_spec": {}, "study": "someone's", "submitter": "else"},
    {"name": "m", "deploy_map": {"app": ["@ALL"]}, "mandatory_clients": ["site-3"]},
]

DEEP: list = []
for _ in range(40):
    DEEP = [DEEP]

PROBES = [None, True, False, 0, 1, 2, 3, -1, MAX_CLIENTS, MAX_CLIENTS + 1, 1.0, "2", "", "x",
          "x" * 256, "x" * 257, "@ALL", "@all", "server", "site-1", "site-3", "site 1", "../a",
          "-a", "\ud800", [], ["@ALL"], ["@all"], ["server"], ["site-1"], ["site-1", "site-1"],
          ["@ALL", "server"], ["server", "site-9"], [1], [None], ("site-1",), {},
          {"app": ["@ALL"]}, {"a": []}, {"a": [], "b": ["@ALL"]}, {"app": "@ALL"},
          {"app": {"targets": ["@ALL"]}}, {"@default": {"num_of_gpus": 1}},
          {"default": {"process": {}}}, {1: ["@ALL"]}, DEEP]


def _variants(base):
    yield base
    for key in list(base):
        for probe in PROBES:
            yield {**copy.deepcopy(base), key: copy.deepcopy(probe)}
        yield {k: v for k, v in base.items() if k != key}
    for key in ("min_clients", "mandatory_clients", "resource_spec", "launcher_spec",
                "unknown_key"):
        if key not in base:
            for probe in PROBES:
                yield {**copy.deepcopy(base), key: copy.deepcopy(probe)}
    for app in base["deploy_map"]:  # each app's targets, and its name
        for probe in PROBES:
            doc = copy.deepcopy(base)
            doc["deploy_map"][app] = copy.deepcopy(probe)
            yield doc
            if isinstance(probe, str):
                doc = copy.deepcopy(base)
                doc["deploy_map"] = {(probe if a == app else a): t
                                     for a, t in doc["deploy_map"].items()}
                yield doc


def _models(doc) -> JobMeta | None:
    try:
        return validate_meta(copy.deepcopy(doc))
    except SpecError:
        return None


def _same(plain: PlainMeta, meta: JobMeta, doc) -> None:
    for name in JobMeta.model_fields:
        assert getattr(plain, name) == getattr(meta, name), (name, doc)
    assert plain.targets() == meta.targets() and plain.sites() == meta.sites(), doc
    for target in [*meta.targets(), "server", "site-9"]:
        assert plain.app_for(target) == meta.app_for(target), (target, doc)
    assert plain.expand_targets(["site-1", "site-9"]) == meta.expand_targets(["site-1", "site-9"])
    # the server's record of the job (intake), the document its sites are sent
    for dumped in ((plain, meta), (plain.with_server_fields("s", "u@o"),
                                   meta.with_server_fields("s", "u@o"))):
        assert dumped[0].model_dump(mode="json") == dumped[1].model_dump(mode="json"), doc
        assert (json.dumps(dumped[0].model_dump(mode="json"))
                == json.dumps(dumped[1].model_dump(mode="json"))), doc  # key order too


@pytest.mark.parametrize("base", BASES, ids=range(len(BASES)))
def test_it_vouches_only_for_what_the_models_accept_with_their_values(base):
    vouched = refused = 0
    for doc in _variants(base):
        plain = vouch_meta(copy.deepcopy(doc))
        if plain is None:
            refused += 1
            continue
        vouched += 1
        meta = _models(doc)
        assert meta is not None, f"vouched for what the models refuse: {doc!r}"
        _same(plain, meta, doc)
    assert vouch_meta(copy.deepcopy(base)) is not None  # the base itself takes the fast path
    assert vouched > 1 and refused > 0


def test_what_it_leaves_to_the_models():
    for doc in [
        {"name": "r", "deploy_map": {"app": ["@ALL"]}, "resource_spec": {"@default": {"num_of_gpus": 1}}},
        {"name": "l", "deploy_map": {"app": ["@ALL"]}, "launcher_spec": {"default": {"process": {}}}},
        {"name": "f", "deploy_map": {"app": {"targets": ["@ALL"]}}},  # FLARE's spellings
        {"name": "f", "deploy_map": {"app": ["@all"]}},
        {"name": "f", "deploy_map": {"app": ["@ALL"]}, "min_clients": "2"},
        {"name": "f", "deploy_map": {"app": ["@ALL"], "idle": []}},
        "not a mapping",
        [1],
    ]:
        assert vouch_meta(doc) is None, doc


def test_read_meta_takes_the_models_where_it_does_not_vouch():
    flare = json.dumps({"name": "f", "deploy_map": {"app": {"targets": ["@all"]}},
                        "min_clients": "2", "resource_spec": {"@default": {"num_of_gpus": 1}}})
    meta = read_meta(flare.encode())
    assert isinstance(meta, JobMeta)
    assert meta.deploy_map == {"app": ["@ALL"]} and meta.min_clients == 2
    plain = read_meta(b'{"name": "p", "deploy_map": {"app": ["@ALL"]}}')
    assert isinstance(plain, PlainMeta) and plain.app_for("server") == "app"
    with pytest.raises(SpecError, match="min_clients"):  # the models word every problem
        read_meta(b'{"name": "p", "deploy_map": {"app": ["server", "site-1"]}, "min_clients": 2}')
    with pytest.raises(SpecError, match="not valid JSON"):
        read_meta(b"{")


def test_the_clis_check_of_a_common_job_loads_no_pydantic(tmp_path):
    """In a fresh interpreter, as `atoll job submit` checks a job folder before sending it."""
    job = tmp_path / "job"
    (job / "app").mkdir(parents=True)
    (job / "meta.json").write_text(json.dumps(BASES[0]))
    (job / "app" / "app.yaml").write_text(
        "server: {workflow: fedavg, args: {num_rounds: 3}, initial_model: 'model.py:make'}\n"
        "site: {script: train.py}\n")
    (job / "app" / "model.py").write_text("def make():\n    return {}\n")
    (job / "app" / "train.py").write_text("")
    code = ("import sys, json\nfrom pathlib import Path\n"
            "from atoll.fl.job_folder_check import check_job\n"
            f"problems = check_job(Path({str(job)!r}), 'default', ['site-1'])\n"
            "print(json.dumps({'problems': problems, 'pydantic': 'pydantic' in sys.modules}))\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True).stdout
    # min_clients 2 of a study of one site: the plain path still finds what the models would
    answer = json.loads(out)
    assert answer["pydantic"] is False
    assert [p["path"] for p in answer["problems"]] == ["min_clients"]
