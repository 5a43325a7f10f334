"""The FLARE-jobs suite's step with FLARE 2.9 itself (its own virtual environment, made by
``bench/compare/setup_peers.sh flare``, which scripts/run_tests.sh runs; FLARE_PYTHON names
another): FLARE's recipe classes export the jobs again, and they must be the folders checked in
under flare_jobs/ that test_flare_examples.py imports and runs; FLARE's own simulator runs
hello-numpy, and its final model must be the one atoll's simulation gives.

Without FLARE's Python these tests skip, which CI=true counts as a failure."""

from __future__ import annotations

import filecmp
import json
import os
import subprocess
from pathlib import Path

import numpy as np
import pytest

from tests.compat.test_flare_examples import import_and_simulate, load_file

HERE = Path(__file__).parent
ROOT = HERE.parents[1]
FLARE_PYTHON = Path(os.environ.get("FLARE_PYTHON") or ROOT / "bench/.venvs/flare/bin/python")
JOB_PY = HERE / "flare_examples" / "job.py"

pytestmark = pytest.mark.skipif(not FLARE_PYTHON.exists(), reason=(
    f"no FLARE 2.9 Python at {FLARE_PYTHON}: run bench/compare/setup_peers.sh flare"))


def flare(*args: str, cwd: Path) -> None:
    import torch  # FLARE's PyTorch recipe needs torch: atoll's, after FLARE's own packages

    env = {**os.environ, "BORROW_TORCH_FROM": str(Path(torch.__file__).parents[1])}
    done = subprocess.run([str(FLARE_PYTHON), str(JOB_PY), *args], capture_output=True,
                          text=True, timeout=600, cwd=cwd, env=env)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]


def same_tree(a: Path, b: Path) -> list[str]:
    """Files that differ or exist on one side only."""
    cmp = filecmp.dircmp(a, b, ignore=["__pycache__"])
    out = [f"{a.name}/{n}" for n in cmp.left_only + cmp.right_only + cmp.diff_files
           + cmp.funny_files]
    for name in cmp.common_dirs:
        out += [f"{a.name}/{d}" for d in same_tree(a / name, b / name)]
    return out


def test_flare_exports_the_checked_in_jobs(tmp_path):
    flare("export", str(tmp_path), cwd=tmp_path)
    for name in ("hello-numpy", "hello-numpy-cse", "hello-pt-recipe", "hello-lightning",
                 "hello-huggingface", "hello-tabular-stats"):
        assert same_tree(tmp_path / name, HERE / "flare_jobs" / name) == [], name


def test_hello_numpy_final_model_is_flares_own(tmp_path):
    record = tmp_path / "flare_final_model.json"
    flare("simulate", str(tmp_path / "flare-workspace"), str(record), cwd=tmp_path)
    theirs = json.loads(record.read_text())
    (tmp_path / "atoll").mkdir()
    _, results = import_and_simulate("hello-numpy", tmp_path / "atoll")
    ours = load_file(results / "global_model_final.safetensors").params["numpy_key"]
    np.testing.assert_array_equal(ours, np.array(theirs["array"], dtype=theirs["dtype"]))
    assert str(ours.dtype) == theirs["dtype"]


def test_the_constants_have_flares_values(tmp_path):
    """Every constant atoll.compat serves for a FLARE module has the value FLARE's module has."""
    import torch  # its site-packages has pandas, which FLARE's statistics modules import

    from atoll.compat import flare_client, flare_constants, flare_statistics
    from atoll.compat.flare_job import FLARE_MODULES

    ours = {}
    for module, target in FLARE_MODULES.items():
        served = {"atoll.compat.flare_client": flare_client,
                  "atoll.compat.flare_constants": flare_constants,
                  "atoll.compat.flare_statistics": flare_statistics}.get(target)
        for name in getattr(served, "__all__", ()):
            value = getattr(served, name)
            if isinstance(value, type):  # constant classes and enums: their upper-case names
                ours[f"{module}:{name}"] = {
                    k: getattr(getattr(value, k), "value", getattr(value, k))
                    for k in dir(value) if k.isupper()}
    probe = tmp_path / "probe.py"
    probe.write_text(
        "import importlib, json, sys\n"
        "sys.path.append(sys.argv[2])  # pandas, after FLARE's own packages\n"
        "keys = json.loads(sys.argv[1])\n"
        "out = {}\n"
        "for key, attrs in keys.items():\n"
        "    module, name = key.split(':')\n"
        "    try:\n"
        "        cls = getattr(importlib.import_module(module), name)\n"
        "    except (ImportError, AttributeError):\n"
        "        continue\n"
        "    out[key] = {a: getattr(getattr(cls, a), 'value', getattr(cls, a)) for a in attrs\n"
        "                if hasattr(cls, a)}\n"
        "print(json.dumps(out))\n")
    done = subprocess.run([str(FLARE_PYTHON), str(probe), json.dumps(ours),
                           str(Path(torch.__file__).parents[1])],
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    theirs = json.loads(done.stdout.splitlines()[-1])
    assert {k: ours[k] for k in theirs} == theirs
    # each class atoll serves is found in a FLARE module it is served for, with all its names
    assert {k.split(":")[1] for k in ours} == {k.split(":")[1] for k in theirs}
    for key in theirs:
        assert set(theirs[key]) == set(ours[key]), key
    assert theirs["nvflare.app_common.np.constants:NPConstants"] == {"NUMPY_KEY": "numpy_key"}
    assert theirs["nvflare.app_common.abstract.statistics_spec:DataType"]["DATETIME"] == 5


CLIENT_API = ("nvflare.client", "nvflare.client.api", "nvflare.client.tracking",
              "nvflare.client.lightning", "nvflare.client.hf")
# FLARE's own transport and context classes: atoll's worker is the transport and the context
NOT_SERVED = {"IPCAgent", "APIContext", "MetricsSender"}


def test_the_client_api_modules_serve_flares_names_and_ctx(tmp_path):
    """Each Client API module FLARE 2.9 has (its exports; nvflare.client.api's functions): atoll's
    counterpart serves every name, and takes ``ctx`` wherever FLARE's function does."""
    import importlib
    import inspect

    import torch

    from atoll.compat.flare_job import FLARE_MODULES

    probe = tmp_path / "probe.py"
    probe.write_text(
        "import importlib, inspect, json, sys, types\n"
        "sys.path.append(sys.argv[1])  # torch, Lightning, transformers: after FLARE's own\n"
        "out = {}\n"
        "for name in sys.argv[2:]:\n"
        "    module = importlib.import_module(name)\n"
        "    names = getattr(module, '__all__', None) or [\n"
        "        n for n, v in vars(module).items() if not n.startswith('_')\n"
        "        and not isinstance(v, types.ModuleType)  # FLARE's names, not its import helpers\n"
        "        and getattr(v, '__module__', '').startswith('nvflare')\n"
        "        and not v.__module__.startswith('nvflare.fuel')]\n"
        "    if name.endswith('.api'):  # the functions defined there\n"
        "        names = [n for n, v in vars(module).items() if inspect.isfunction(v)\n"
        "                 and v.__module__ == name and not n.startswith('_')]\n"
        "    out[name] = {n: 'ctx' in getattr(inspect.signature(getattr(module, n)),\n"
        "                                     'parameters', {}) if callable(getattr(module, n))\n"
        "                 and not isinstance(getattr(module, n), type) else False\n"
        "                 for n in names}\n"
        "print(json.dumps(out))\n")
    done = subprocess.run([str(FLARE_PYTHON), str(probe), str(Path(torch.__file__).parents[1]),
                           *CLIENT_API], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    theirs = json.loads(done.stdout.splitlines()[-1])
    for name in CLIENT_API:
        ours = importlib.import_module(FLARE_MODULES[name])
        missing = sorted(set(theirs[name]) - set(ours.__all__) - NOT_SERVED)
        assert missing == [], (name, missing)
        for function, takes_ctx in theirs[name].items():
            if takes_ctx:
                assert "ctx" in inspect.signature(getattr(ours, function)).parameters, (
                    name, function)


def test_the_statistics_spec_types_have_flares_fields():
    """The statistics spec's named tuples a generator builds (Bin, Histogram, Feature...) have
    FLARE 2.9's fields, in FLARE's order."""
    import torch

    from atoll.compat import flare_statistics

    names = ("Bin", "BinRange", "Histogram", "Feature", "StatisticConfig")
    done = subprocess.run(
        [str(FLARE_PYTHON), "-c",
         "import json, sys; sys.path.append(sys.argv[1]); "
         "import nvflare.app_common.abstract.statistics_spec as s; "
         "print(json.dumps({n: list(getattr(s, n)._fields) for n in sys.argv[2:]}))",
         str(Path(torch.__file__).parents[1]), *names],
        capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    theirs = json.loads(done.stdout.splitlines()[-1])
    assert {n: list(getattr(flare_statistics, n)._fields) for n in names} == theirs
