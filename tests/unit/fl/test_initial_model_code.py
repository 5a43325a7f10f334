"""server.initial_model as FILE.py:FUNCTION: the server worker makes the first global model."""

from __future__ import annotations

import importlib
import json
import textwrap

import numpy as np
import pytest

from atoll.fl.app_config import AppConfigError, parse_app_config
from atoll.fl.serde import load_file
from atoll.fl.simulator import simulate

# Records what round 1 brought, and sends back the weights plus the site's number.
RECORD = """
import json
import atoll.client as fl
fl.init()
while fl.is_running():
    model = fl.receive()
    if model.current_round == 1:
        seen = {k: v.tolist() for k, v in model.params.items()}
        open(f"../seen-{fl.site_name()}.json", "w").write(json.dumps(seen))
    bump = {"a": 1.0, "b": 3.0}[fl.site_name()]
    fl.send(fl.Model(params={k: v + bump for k, v in model.params.items()}, num_examples=1))
"""


def _job(tmp_path, model_py: str, reference: str = "model.py:make"):
    job = tmp_path / "job"
    app = job / "app"
    app.mkdir(parents=True)
    (job / "meta.json").write_text(json.dumps({"name": "t", "deploy_map": {"app": ["@ALL"]}}))
    (app / "app.yaml").write_text(
        "server: {workflow: fedavg, args: {num_rounds: 1, evaluate_every: 0, "
        f"cross_site_eval: none}}, initial_model: '{reference}'}}\n"
        "site: {script: record.py}\n"
    )
    (app / "record.py").write_text(textwrap.dedent(RECORD))
    (app / "model.py").write_text(textwrap.dedent(model_py))
    return job


def test_round_0_carries_the_model_the_function_made(tmp_path):
    job = _job(tmp_path, """
        import json
        import numpy as np
        from layers import SHAPE   # a neighbour in the app folder, as a site script may import
        def make():
            import fill            # imported when called, too
            start = json.load(open("start.json"))  # relative to the app folder
            return {"w": np.full(SHAPE, fill.VALUE, dtype=np.float32), "b": np.array(start)}
    """)
    (job / "app" / "layers.py").write_text("SHAPE = (2, 2)\n")
    (job / "app" / "fill.py").write_text("VALUE = 2.0\n")
    (job / "app" / "start.json").write_text("[0, 1, 2]")
    simulate(job, {"a": {}, "b": {}}, results_dir=tmp_path / "out")
    for site in ("a", "b"):
        seen = json.loads((job / f"seen-{site}.json").read_text())
        assert seen == {"w": [[2.0, 2.0], [2.0, 2.0]], "b": [0, 1, 2]}
    final = load_file(tmp_path / "out" / "global_model_final.safetensors")
    np.testing.assert_array_equal(final.params["w"], np.full((2, 2), 4.0, dtype=np.float32))
    assert final.params["w"].dtype == np.float32  # the made model's dtypes are kept
    np.testing.assert_array_equal(final.params["b"], np.arange(3) + 2)


def test_a_torch_state_dict_is_taken_as_it_is(tmp_path):
    importlib.import_module("torch")  # required: a process this test starts loads it
    job = _job(tmp_path, """
        import torch
        def make():
            return torch.nn.Linear(2, 1, bias=False).requires_grad_(False).apply(
                lambda m: m.weight.fill_(0.5) if hasattr(m, "weight") else None).state_dict()
    """)
    simulate(job, {"a": {}, "b": {}}, results_dir=tmp_path / "out")
    assert json.loads((job / "seen-a.json").read_text()) == {"weight": [[0.5, 0.5]]}


@pytest.mark.parametrize(
    ("model_py", "reference", "message"),
    [
        ("def other(): pass\n", "model.py:make", "model.py has no function 'make'"),
        ("make = 3\n", "model.py:make", "model.py has no function 'make'"),
        ("def make(): return [1, 2]\n", "model.py:make", "returned a list; it must return"),
        ("def make(): return {'w': [object()]}\n", "model.py:make",
         r"made params\['w'\]: dtype object cannot be serialized"),
        ("def make(): return {1: [1.0]}\n", "model.py:make", "not a model: Model.params keys"),
        ("", "gone.py:make", "'gone.py' is not a file"),
    ],
)
def test_a_function_that_cannot_make_a_model_is_named(tmp_path, model_py, reference, message):
    job = _job(tmp_path, model_py, reference)
    with pytest.raises(AppConfigError, match=f"server.initial_model: .*{message}"):
        simulate(job, {"a": {}}, results_dir=tmp_path / "out")


def test_the_functions_own_error_propagates_with_its_traceback(tmp_path):
    job = _job(tmp_path, "def make():\n    raise MemoryError('1 TB asked')\n")
    with pytest.raises(MemoryError, match="1 TB asked"):
        simulate(job, {"a": {}}, results_dir=tmp_path / "out")


@pytest.mark.parametrize(
    ("value", "message"),
    [
        ("model.txt:make", "must end with .py, got 'model.txt'"),
        ("/abs/model.py:make", "must be a relative path inside the app folder, got '/abs/model.py'"),
        ("../model.py:make", "must be a relative path inside the app folder, got '../model.py'"),
        ("model.py:", "the part after ':' must name a function, got ''"),
        ("model.py:make-it", "the part after ':' must name a function, got 'make-it'"),
    ],
)
def test_the_reference_is_checked_with_app_yaml(value, message):
    with pytest.raises(AppConfigError) as failure:
        parse_app_config(
            {"server": {"workflow": "fedavg", "args": {"num_rounds": 1}, "initial_model": value}}
        )
    assert failure.value.errors == [f"server.initial_model: {message}"]


def test_a_valid_reference_parses():
    config, _ = parse_app_config(
        {"server": {"workflow": "fedavg", "args": {"num_rounds": 1},
                    "initial_model": "models/net.py:build"}}
    )
    assert config.server.initial_model == "models/net.py:build"
