"""A launch request loads a model only for what the job or the site asks: a meta without a
launcher_spec has the empty block on every backend without spec/launcher_spec.py, and a
request without datasets (a server worker's) mounts none without spec/study_runtime.py."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from atoll.spec.launcher_spec import BACKENDS, resolve_launcher_spec
from atoll.spec.meta import load_meta
from atoll.spec.site_config import parse_site_config

RESOURCE_SPECS = [
    {},
    {"@default": {"num_of_gpus": 2}, "site-a": {"num_of_cpus": 4}},
    {"site-a": {"num_of_gpus": 4, "mem_per_gpu_in_GiB": 8}, "server": {"num_of_gpus": 0}},
    {"@default": {"num_of_gpus": 1, "num_of_cpus": 4, "memory": "64Gi"}},
]


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("resource_spec", RESOURCE_SPECS)
@pytest.mark.parametrize("target", ["site-a", "server"])
def test_without_a_launcher_spec_the_block_is_empty_and_unchecked(backend, resource_spec,
                                                                  target):
    """What build_request skips for such a meta is what the resolution would have given."""
    meta = load_meta({"name": "j", "deploy_map": {"app": ["@ALL"]},
                      "resource_spec": resource_spec})
    settings = {"slurm": {"pending_timeout": 60}, "k8s": {"namespace": "n"}}.get(backend, {})
    site_config = parse_site_config({"launcher": backend, backend: settings})
    assert resolve_launcher_spec(meta, target, backend, site_config) == {}
    assert resolve_launcher_spec(meta, target, backend, None) == {}


_FRESH = """
import json, sys
from pathlib import Path
from atoll.launchers.base import JobIdentity
from atoll.launchers.process import dataset_mounts
from atoll.launchers.request import build_request
from atoll.spec.meta_plain import read_meta
from atoll.spec.site_config import parse_site_config

meta = read_meta(json.dumps({"name": "j", "deploy_map": {"app": ["@ALL"]}}).encode())
request = build_request(
    meta=meta, identity=JobIdentity("a" * 32, "j", "s", "server", "server"),
    site_config=parse_site_config({"launcher": "process"}), study_runtime=None,
    workdir=Path(sys.argv[1]), parent_address="unix:/nowhere", check_capacity=False)
print(json.dumps({"mounts": list(dataset_mounts(request)), "spec": request.launcher_spec,
                  "loaded": sorted(m for m in sys.modules if m in (
                      "atoll.spec.launcher_spec", "atoll.spec.study_runtime",
                      "atoll.spec.statistics_rules", "atoll.spec.meta"))}))
"""


def test_a_server_workers_request_loads_no_launcher_spec_or_study_runtime_model(tmp_path):
    run = subprocess.run([sys.executable, "-c", _FRESH, str(tmp_path)], capture_output=True,
                         text=True)
    assert run.returncode == 0, run.stderr[-3000:]
    answer = json.loads(run.stdout)
    assert answer == {"mounts": [], "spec": {}, "loaded": []}
