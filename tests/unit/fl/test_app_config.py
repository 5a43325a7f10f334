"""app.yaml: strict, every error of the file at once, each naming its field."""

from __future__ import annotations

import pytest

from atoll.fl.app_config import (
    AppConfigError,
    FedOptArgs,
    FedProxArgs,
    ScatterGatherArgs,
    load_app_config,
    parse_app_config,
)
from atoll.fl.model import Model
from atoll.fl.runner import run_server_app, run_site_app
from atoll.fl.serde import save_file
from atoll.fl.simulator import Federation


def _errors(data):
    with pytest.raises(AppConfigError) as failure:
        parse_app_config(data)
    return failure.value.errors


def test_a_valid_app_parses_with_its_workflow_args():
    config, args = parse_app_config(
        {
            "server": {
                "workflow": "fedopt",
                "args": {"num_rounds": 3, "optimizer": "yogi", "round_timeout": 30},
            },
            "site": {"script": "train.py", "args": ["--epochs", "2"], "config": {"lr": 0.1}},
        }
    )
    assert isinstance(args, FedOptArgs) and args.optimizer == "yogi" and args.round_timeout == 30.0
    assert config.site.args == ["--epochs", "2"] and config.site.config == {"lr": 0.1}


@pytest.mark.parametrize(
    ("workflow", "model"), [("fedprox", FedProxArgs), ("scatter_gather", ScatterGatherArgs)]
)
def test_each_workflow_has_its_own_args(workflow, model):
    _, args = parse_app_config({"server": {"workflow": workflow, "args": {"num_rounds": 2}}})
    assert isinstance(args, model)


def test_all_errors_are_reported_together_each_naming_its_field():
    errors = _errors(
        {
            "server": {
                "workflow": "fedavg",
                "args": {
                    "num_rounds": 0,
                    "min_clients": "2",
                    "evaluate_every": -1,
                    "cross_site_eval": "some",
                    "learning_rate": 1,
                },
            },
            "site": {"script": "../train.py", "args": "--epochs 2", "extra": True},
            "clients": {},
        }
    )
    text = "\n".join(errors)
    for expected in [
        "server.args.num_rounds: Input should be greater than or equal to 1",
        "server.args.min_clients: Input should be a valid integer",
        "server.args.evaluate_every: Input should be greater than or equal to 0",
        "server.args.cross_site_eval: Input should be 'none', 'global' or 'all', got 'some'",
        "server.args.learning_rate: unknown key (allowed: min_clients, round_timeout, num_rounds",
        "site.script: must be a relative path inside the app folder, got '../train.py'",
        "site.args: Input should be a valid list",
        "site.extra: unknown key (allowed: script, args, config)",
        "clients: unknown key (allowed: server, site, privacy)",
    ]:
        assert expected in text, f"{expected!r} not in:\n{text}"
    assert len(errors) == 9


@pytest.mark.parametrize(
    ("data", "expected"),
    [
        (
            {"server": {"workflow": "fedsgd"}},
            "server.workflow: must be one of fedavg, fedprox, fedopt, scatter_gather or FILE.py:CLASS "
                "(a workflow class in a file of the app folder), got 'fedsgd'",
        ),
        ({"server": {"workflow": "fedavg"}}, "server.args.num_rounds: Field required"),
        (
            {"server": {"workflow": "fedavg", "args": {"num_rounds": True}}},
            "server.args.num_rounds: Input should be a valid integer",
        ),
        (
            {"server": {"workflow": "fedopt", "args": {"num_rounds": 1, "beta2": 1.0}}},
            "server.args.beta2: Input should be less than 1",
        ),
        (
            {
                "server": {
                    "workflow": "fedavg",
                    "args": {"num_rounds": 1},
                    "initial_model": "/etc/m.safetensors",
                }
            },
            "server.initial_model: must be a relative path inside the app folder, got '/etc/m.safetensors'",
        ),
        (
            {"server": {"workflow": "fedavg", "args": {"num_rounds": 1}, "initial_model": "m.pt"}},
            "server.initial_model: must end with .safetensors, got 'm.pt'",
        ),
        ({"site": {"script": "train.sh"}}, "site.script: must end with .py, got 'train.sh'"),
        ({"site": {}}, "site.script: Field required"),
        (["server"], "(top level): must be a mapping, got list"),
    ],
)
def test_single_errors(data, expected):
    assert _errors(data) == [expected]


def test_load_names_the_file_and_reports_yaml_syntax(tmp_path):
    with pytest.raises(AppConfigError, match="app.yaml: missing"):
        load_app_config(tmp_path)
    (tmp_path / "app.yaml").write_text("server: [unclosed\n")
    with pytest.raises(AppConfigError, match="not valid YAML"):
        load_app_config(tmp_path)


def test_the_runner_needs_the_section_of_its_role(tmp_path):
    (tmp_path / "app.yaml").write_text("site: {script: train.py}\n")
    federation = Federation(["a"], tmp_path / "results")
    with pytest.raises(AppConfigError, match="server: missing: the server runs this app"):
        run_server_app(federation.server_channel(), tmp_path, {})
    (tmp_path / "app.yaml").write_text("server: {workflow: fedavg, args: {num_rounds: 1}}\n")
    with pytest.raises(AppConfigError, match="site: missing: sites run this app"):
        run_site_app(federation.site_channel("a"), tmp_path, "a", {})


def test_files_must_exist_inside_the_app_folder(tmp_path):
    app = tmp_path / "app"
    app.mkdir()
    outside = tmp_path / "outside.safetensors"
    save_file(Model(params={}), outside)
    (app / "link.safetensors").symlink_to(outside)
    federation = Federation(["a"], tmp_path / "results")
    (app / "app.yaml").write_text(
        "server: {workflow: fedavg, args: {num_rounds: 1}, initial_model: link.safetensors}\n"
        "site: {script: missing.py}\n"
    )
    with pytest.raises(
        AppConfigError, match="server.initial_model: 'link.safetensors' resolves outside"
    ):
        run_server_app(federation.server_channel(), app, {})
    with pytest.raises(AppConfigError, match="site.script: 'missing.py' is not a file"):
        run_site_app(federation.site_channel("a"), app, "a", {})


def test_a_broken_initial_model_is_named(tmp_path):
    (tmp_path / "init.safetensors").write_bytes(b"not a model")
    (tmp_path / "app.yaml").write_text(
        "server: {workflow: fedavg, args: {num_rounds: 1}, initial_model: init.safetensors}\n"
    )
    with pytest.raises(AppConfigError, match="server.initial_model: .*header length"):
        run_server_app(Federation(["a"], tmp_path / "r").server_channel(), tmp_path, {})
