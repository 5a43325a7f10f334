"""8-bit quantized exchange over a real local federation (processes, mutual TLS, SQLite): a site
whose local/privacy.yaml requires quantized updates refuses a job without them, naming the
rule, and a job with `{type: quantize}` both ways completes, its final model within the
quantization's bound of the exact FedAvg."""

from __future__ import annotations

import zipfile

import numpy as np
import pytest

from atoll.fl.serde import load_file
from tests.integration.federation.conftest import ADMIN, USERS
from tests.integration.federation.harness import Federation
from tests.integration.federation.jobs import privacy_job

SITES = ["site-1", "site-2"]
REQUIRE = "format_version: 1\nrequire: {quantize: true}\n"
TRAIN = '''
import numpy as np
import atoll.client as fl

fl.init()
while fl.is_running():
    model = fl.receive()
    if fl.is_evaluate():
        fl.send(fl.Model(metrics={"accuracy": 1.0}, num_examples=1))
        continue
    assert model.params["w"].dtype == np.float32, model.params["w"].dtype  # decoded, own dtype
    k = int(fl.site_name().split("-")[1])
    update = (0.01 * k * np.sin(np.arange(4096))).astype(np.float32).reshape(64, 64)
    fl.send(fl.Model(params={"w": model.params["w"] + update}, num_examples=10))
'''
MODEL = '''
import numpy as np

def make():
    return {"w": np.random.default_rng(0).normal(0, 1, (64, 64)).astype(np.float32)}
'''
QUANTIZED = """privacy:
  filters:
    task: [{type: quantize}]
    reply: [{type: quantize}]
"""


@pytest.fixture(scope="module")
def federation(tmp_path_factory):
    fed = Federation.provisioned(tmp_path_factory.mktemp("fed"), SITES, USERS)
    (fed.kit("site-2") / "local" / "privacy.yaml").write_text(REQUIRE)
    fed.start_all()
    fed.wait_online(ADMIN)
    yield fed
    fed.stop_all()


def _job(path, privacy: str):
    return privacy_job(path, privacy, TRAIN, MODEL)


def test_a_site_requiring_quantized_updates_refuses_a_job_without_them(federation, tmp_path):
    with federation.session(ADMIN) as s:
        job = s.submit(_job(tmp_path / "plain", ""), wait=True, timeout=240)
    assert job["state"] == "FINISHED:FAILED"
    assert "rule require.quantize: this site sends its updates 8-bit quantized" in (
        job["parts"]["site-2"]["reason"])


def test_a_job_with_quantized_exchange_both_ways_completes(federation, tmp_path):
    with federation.session(ADMIN) as s:
        job = s.submit(_job(tmp_path / "q8", QUANTIZED), wait=True, timeout=300)
        assert job["state"] == "FINISHED:COMPLETED", job
        archive = s.download(job["job_id"], tmp_path / "download")
    folder = tmp_path / "results"
    if archive.is_file():
        with zipfile.ZipFile(archive) as zf:
            zf.extractall(folder)
    else:
        folder = archive
    final = load_file(next(folder.rglob("global_model_final.safetensors"))).params["w"]
    initial = np.random.default_rng(0).normal(0, 1, (64, 64)).astype(np.float32)
    wave = np.sin(np.arange(4096)).reshape(64, 64)
    exact = initial + 2 * (0.01 * 1.5 * wave)  # two rounds of the mean update (equal weights)
    # each round's update travels within half a step of its blocks (the largest: site-2's,
    # a range of 0.04 over 255 steps); the server's model is exact, so only the updates count
    assert final.dtype == np.float32
    error = np.abs(final - exact).max()
    assert 1e-5 < error <= 2 * (0.04 / 255) / 2 + 1e-5  # quantized, far above float32 rounding
