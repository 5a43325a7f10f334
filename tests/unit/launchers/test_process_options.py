"""The process launcher made from the plain values the check of local/ sends (ProcessOptions)
is the launcher made from the SiteConfig, for every shape of site.yaml's process: block; a
record's values of another shape are refused, so the parent checks site.yaml again."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from atoll.launchers.process import ProcessLauncher
from atoll.launchers.process_options import ProcessOptions
from atoll.spec.site_config import parse_site_config

BLOCKS = [
    {},
    {"python": "/usr/bin/python3", "bwrap": "/usr/bin/bwrap"},
    {"gpu_ids": [0, "GPU-1"], "cpu_ids": [0, 1]},
    {"sandbox": "none"},
    {"sandbox": "none", "network": "host"},
    {"network": "host"},
    {"network": {"mode": "isolated", "allow": ["127.0.0.1:5000", "mlflow.example.org:443"]}},
    {"network": {"allow": ["localhost:8080"]}, "workdir": "runs"},
]


def _kept(launcher: ProcessLauncher) -> dict:
    return {"python": launcher._python, "gpus": launcher._gpus._ids,
            "cpus": launcher._cpus.cpus, "sandboxed": launcher.sandboxed, "isolated": launcher.isolated,
            "allow": launcher._allow, "destinations": launcher._destinations,
            "bwrap": launcher._bwrap}


@pytest.mark.parametrize("block", BLOCKS, ids=[json.dumps(b) for b in BLOCKS])
def test_a_launcher_from_the_options_is_the_launcher_from_the_site_config(block):
    config = parse_site_config({"launcher": "process", "process": block})
    options = ProcessOptions.of(config.settings)
    from_config = ProcessLauncher(config, share_cpus=False)
    from_options = ProcessLauncher(None, options=options, share_cpus=False)
    assert _kept(from_options) == _kept(from_config)
    # and what a record keeps of them comes back the same
    assert ProcessOptions.from_values(json.loads(json.dumps(options.values()))) == options


@pytest.mark.parametrize("field, bad", [
    ("python", 3), ("python", ""), ("bwrap", ["x"]), ("gpu_ids", [0]), ("cpu_ids", ["0"]),
    ("cpu_ids", [-1]), ("cpu_ids", [True]), ("sandboxed", "yes"), ("isolated", 1),
    ("allow", [5]), ("destinations", [["h", "80", "h"]]), ("destinations", [["h", 80]]),
    ("destinations", "h:80"), ("extra", True),
])
def test_a_record_of_another_shape_gives_no_options(field, bad):
    doc = ProcessOptions.of(parse_site_config(
        {"launcher": "process",
         "process": {"network": {"allow": ["127.0.0.1:5000"]}}}).settings).values()
    doc = json.loads(json.dumps(doc))
    doc[field] = bad
    assert ProcessOptions.from_values(doc) is None
    del doc[field]
    if field != "extra":
        assert ProcessOptions.from_values(doc) is None


def test_a_launcher_from_options_loads_no_model():
    script = """
import sys
from atoll.launchers.process_options import ProcessOptions
from atoll.launchers.registry import get_launcher
launcher = get_launcher("process", None, options=ProcessOptions(allow=("127.0.0.1:5000",),
                        destinations=(("127.0.0.1", 5000, "127.0.0.1"),)))
print(launcher.name, launcher.isolated, "pydantic" in sys.modules)
"""
    run = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True)
    assert run.returncode == 0, run.stderr[-2000:]
    assert run.stdout.split() == ["process", "True", "False"]
