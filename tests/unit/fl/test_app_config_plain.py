"""The site worker's plain app.yaml check (fl/app_config_plain.py) accepts only what the models
accept, with the same values, and spares the site worker pydantic when it vouches."""

from __future__ import annotations

import copy
import json
import math
import subprocess
import sys
import types
import typing
from pathlib import Path

import pytest
from pydantic import BaseModel

from atoll.fl import app_config as models
from atoll.fl.app_config_plain import SECTION_FIELDS, WORKFLOW_FIELDS, PlainApp, vouch
from atoll.fl.runner import _site_config

# --- the tables are the models' -----------------------------------------------------------------


def _kind(annotation) -> object:
    """A model field's annotation as the plain table writes it."""
    args = typing.get_args(annotation)
    if isinstance(annotation, types.UnionType) or typing.get_origin(annotation) is typing.Union:
        rest = [a for a in args if a is not type(None)]
        assert len(rest) == 1 and len(args) == 2, annotation
        inner = _kind(rest[0])
        return f"{inner}?" if isinstance(inner, str) else ("optional", inner)
    if typing.get_origin(annotation) is typing.Literal:
        return ("literal", args)
    if annotation is dict or typing.get_origin(annotation) is dict:
        assert args in ((), (str, typing.Any)), annotation
        return "dict"
    if typing.get_origin(annotation) is list:
        assert args == (str,), annotation
        return "list[str]"
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return "section"
    return {int: "int", float: "float", str: "str", bool: "bool"}[annotation]


def _bounds(info) -> dict:
    out = {}
    for item in info.metadata:
        for name in ("ge", "gt", "lt", "le", "min_length", "max_length"):
            if hasattr(item, name):
                out[name] = getattr(item, name)
    return out


def _table(model: type[BaseModel]) -> dict:
    table = {}
    for name, info in model.model_fields.items():
        default = None
        if not info.is_required():
            default = info.default_factory() if info.default_factory else info.default
            if isinstance(default, BaseModel):
                default = None  # a section: the plain check reads it from the document
        kind = _kind(info.annotation)
        if kind == "section?":
            kind = "object?"  # MLflow's: the plain check leaves any value of it to the models
        table[name] = (kind, info.is_required(), default, _bounds(info))
    return table


@pytest.mark.parametrize("workflow", sorted(models.WORKFLOW_ARGS))
def test_each_workflows_table_is_its_argument_model(workflow):
    assert WORKFLOW_FIELDS[workflow] == _table(models.WORKFLOW_ARGS[workflow])
    assert set(WORKFLOW_FIELDS) == set(models.WORKFLOW_ARGS)


@pytest.mark.parametrize("section, model", [("server", models.ServerSection),
                                            ("tracking", models.TrackingSection),
                                            ("site", models.SiteSection)])
def test_each_sections_table_is_its_model(section, model):
    assert SECTION_FIELDS[section] == _table(model)


def test_the_top_level_keys_are_the_models():
    assert set(models.AppConfig.model_fields) == {"server", "site", "privacy"}


# --- the same verdicts, field by field ------------------------------------------------------------

BASES = [
    {  # bench/compare's tiny job: one app for the server and both sites
        "server": {"workflow": "fedavg",
                   "args": {"num_rounds": 3, "min_clients": 2, "round_timeout": 3600,
                            "evaluate_every": 0, "cross_site_eval": "none"},
                   "initial_model": "model.py:make"},
        "site": {"script": "train.py", "args": ["--mark-dir", "/tmp/m"]},
    },
    {"site": {"script": "src/train.py", "config": {"lr": 0.1, "layers": [1, 2]}}},
    {"server": {"workflow": "fedopt", "args": {"num_rounds": 2, "optimizer": "yogi",
                                               "beta1": 0.5, "tau": 1}},
     "site": {"script": "t.py"}},
    {"server": {"workflow": "fedprox", "args": {"num_rounds": 1, "mu": 0},
                "tracking": {"tensorboard": False}},
     "site": {"script": "t.py"}, "privacy": None},
    {"server": {"workflow": "scatter_gather", "args": {"payload_bytes": 0, "topic": "t"},
                "initial_model": "init.safetensors"},
     "site": {"script": "t.py", "args": []}},
    {"server": {"workflow": "flows/my.py:MyFlow", "args": {"anything": [1]}},
     "site": {"script": "t.py"}},
    {"server": None, "site": {"script": "t.py"}},
]

PROBES = [None, True, False, 0, 1, -1, 2, 0.0, 0.5, 1.5, 3600, float("inf"), float("nan"),
          "", "x", "none", "max", "adam", "fedavg", "a.py", "../a.py", "/a.py", "a\\b.py",
          "m.safetensors", "model.py:make", "model.py:1bad", "f.py:Cls", [], ["a"], [1], {},
          {"k": 1}, {1: 2}, ("a",), {"tensorboard": True}, {"mlflow": None},
          {"mlflow": {"tracking_uri": "http://h:5000"}}]


def _paths(doc, prefix=()):
    """Every key path of the document (mappings only)."""
    for key, value in doc.items():
        yield (*prefix, key)
        if isinstance(value, dict):
            yield from _paths(value, (*prefix, key))


def _variants(base):
    yield base
    for path in list(_paths(base)):
        parent = base
        for key in path[:-1]:
            parent = parent[key]
        for probe in PROBES:
            doc = copy.deepcopy(base)
            target = doc
            for key in path[:-1]:
                target = target[key]
            target[path[-1]] = copy.deepcopy(probe)
            yield doc
        doc = copy.deepcopy(base)
        target = doc
        for key in path[:-1]:
            target = target[key]
        del target[path[-1]]
        yield doc
        doc = copy.deepcopy(base)
        target = doc
        for key in path[:-1]:
            target = target[key]
        if isinstance(target, dict):
            target["unknown_key"] = 1
            yield doc


def _models_verdict(doc):
    try:
        config, _ = models.parse_app_config(copy.deepcopy(doc))
    except models.AppConfigError:
        return None
    return config


@pytest.mark.parametrize("base", BASES, ids=range(len(BASES)))
def test_it_vouches_only_for_what_the_models_accept_with_their_values(base):
    vouched = refused = 0
    for doc in _variants(base):
        plain = vouch(copy.deepcopy(doc))
        if plain is None:
            refused += 1
            continue
        vouched += 1
        config = _models_verdict(doc)
        assert config is not None, f"vouched for what the models refuse: {doc!r}"
        assert config.privacy is None and plain.privacy is None
        if config.site is None:
            assert plain.site is None, doc
        else:
            assert (plain.site.script, plain.site.args, plain.site.config) == (
                config.site.script, config.site.args, config.site.config), doc
        _same_server(plain, config, doc)
    assert vouch(copy.deepcopy(base)) is not None  # the base itself takes the fast path
    assert refused > 0


def _same_server(plain, config, doc):
    """The server's section as the server worker reads it: workflow, model, tracking, and a
    built-in workflow's every argument, of the models' value and type."""
    if config.server is None:
        assert plain.server is None, doc
        return
    server = plain.server
    assert (server.workflow, server.initial_model) == (
        config.server.workflow, config.server.initial_model), doc
    assert server.tracking.tensorboard is config.server.tracking.tensorboard, doc
    assert server.tracking.mlflow is None and config.server.tracking.mlflow is None
    if config.server.workflow not in models.WORKFLOW_ARGS:
        assert server.args is None, doc  # a job's own class validates with its own Args
        return
    _, args = models.parse_app_config(copy.deepcopy(doc))
    for name in type(args).model_fields:
        value = getattr(server.args, name)
        assert value == getattr(args, name) and type(value) is type(getattr(args, name)), (
            name, doc)


def test_the_plain_arguments_are_read_only():
    plain = vouch({"server": {"workflow": "fedavg", "args": {"num_rounds": 2}}})
    assert plain.server.args.num_rounds == 2 and plain.server.args.aggregator == "weighted_mean"
    with pytest.raises(AttributeError):
        plain.server.args.num_rounds = 3
    with pytest.raises(AttributeError):
        plain.server.args.no_such_argument  # noqa: B018 - the read is the test


def test_what_it_leaves_to_the_models():
    for doc in [
        {"site": {"script": "t.py"}, "privacy": {"dp": {"mode": "client", "clip_norm": 1.0,
                                                         "noise_multiplier": 1.0}}},
        {"server": {"workflow": "fedavg", "args": {"num_rounds": 1},
                    "tracking": {"mlflow": {"tracking_uri": "http://h:5000"}}}},
        {"server": {"workflow": "fedavg", "args": {"num_rounds": 1, "round_timeout": math.inf}}},
        "not a mapping",
        [1],
    ]:
        assert vouch(doc) is None, doc


# --- the site worker's path ------------------------------------------------------------------------


def _app(tmp_path: Path, text: str) -> Path:
    app = tmp_path / "app"
    app.mkdir()
    (app / "app.yaml").write_text(text)
    (app / "train.py").write_text("")
    return app


def test_a_bad_file_is_refused_by_the_models_naming_the_field(tmp_path):
    app = _app(tmp_path, "server: {workflow: fedavg, args: {num_rounds: 0}}\n"
                         "site: {script: train.py}\n")
    with pytest.raises(models.AppConfigError, match=r"server\.args\.num_rounds"):
        _site_config(app)


def test_a_privacy_section_is_read_by_the_models(tmp_path):
    app = _app(tmp_path, "site: {script: train.py}\n"
                         "privacy: {dp: {mode: client, clip_norm: 1.0, noise_multiplier: 1.0}}\n")
    config = _site_config(app)
    assert not isinstance(config, PlainApp) and config.privacy.dp.clip_norm == 1.0


def test_a_site_worker_reads_a_common_app_yaml_without_pydantic(tmp_path):
    """In a fresh interpreter, as a site worker: the modules it loads and the check it runs."""
    app = _app(tmp_path, "server: {workflow: fedavg, args: {num_rounds: 3, round_timeout: 60}}\n"
                         "site: {script: train.py, args: [--x], config: {k: 1}}\n")
    code = (
        "import sys, json\n"
        "from pathlib import Path\n"
        "import atoll.client, atoll.fl.distributed, atoll.worker.grpc_channels\n"
        "from atoll.fl.runner import _site_config, _site_privacy\n"
        f"config = _site_config(Path({str(app)!r}))\n"
        "assert _site_privacy(config, 'site-1', 'j' * 32, None) is None\n"
        "site = config.site\n"
        "print(json.dumps({'pydantic': 'pydantic' in sys.modules,\n"
        "                  'site': [site.script, site.args, site.config]}))\n"
    )
    assert _fresh(code) == {"pydantic": False, "site": ["train.py", ["--x"], {"k": 1}]}


def _fresh(code: str) -> dict:
    """What ``code`` prints as JSON, run in a fresh interpreter (nothing imported yet)."""
    return json.loads(subprocess.run([sys.executable, "-c", code], capture_output=True,
                                     text=True, check=True).stdout)


def test_the_server_worker_reads_a_common_app_yaml_without_pydantic(tmp_path):
    """In a fresh interpreter, as the server worker: its modules, the signed meta's app, the
    app.yaml and the built-in workflow's arguments; the model still answers ``FedAvg.Args``."""
    app = _app(tmp_path, "server: {workflow: fedavg, args: {num_rounds: 3, round_timeout: 60},"
                         " tracking: {tensorboard: false}}\nsite: {script: train.py}\n")
    code = (
        "import sys, json\n"
        "from pathlib import Path\n"
        "import atoll.worker.grpc_channels, atoll.fl.tracking\n"
        "from atoll.worker.signed_job import _server_app\n"
        "from atoll.fl.runner import _server_config\n"
        "from atoll.fl.workflows import BUILTINS\n"
        "app = _server_app(b'{\"name\": \"j\", \"deploy_map\": {\"app\": [\"@ALL\"]}}')\n"
        f"config, args = _server_config(Path({str(app)!r}))\n"
        "loaded = 'pydantic' in sys.modules\n"
        "workflow = BUILTINS[config.server.workflow]\n"
        "print(json.dumps({'pydantic': loaded, 'app': app, 'args': [args.num_rounds,\n"
        "    args.round_timeout, args.aggregator], 'tensorboard': config.server.tracking.tensorboard,\n"
        "    'model': workflow.Args.__name__}))\n"
    )
    assert _fresh(code) == {"pydantic": False, "app": "app",
                            "args": [3, 60.0, "weighted_mean"], "tensorboard": False,
                            "model": "FedAvgArgs"}


def test_the_server_worker_reads_privacy_and_its_own_workflow_with_the_models(tmp_path):
    from atoll.fl.runner import _server_config

    app = _app(tmp_path, "server: {workflow: fedavg, args: {num_rounds: 2}}\n"
                         "site: {script: train.py}\n"
                         "privacy: {dp: {mode: client, clip_norm: 1.0, noise_multiplier: 1.0}}\n")
    config, args = _server_config(app)
    assert isinstance(config, models.AppConfig) and isinstance(args, models.FedAvgArgs)
    (app / "app.yaml").write_text("server: {workflow: 'flow.py:Mine', args: {x: 1}}\n")
    config, args = _server_config(app)
    assert isinstance(config, models.AppConfig) and config.server.args == {"x": 1}
