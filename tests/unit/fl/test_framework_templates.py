"""The Lightning and Hugging Face templates (`atoll job init --framework lightning|hf|hf-lora`)
train in the simulator through the callbacks atoll ships, and the LoRA job exchanges adapters
only. On a real local federation: tests/integration/federation/test_framework_templates.py."""

from __future__ import annotations

import importlib
import json

import numpy as np
import pytest
from click.testing import CliRunner

from atoll.cli.job_init import init_command
from atoll.fl.serde import load_file
from atoll.fl.simulator import simulate

SITES = {"site-1": {}, "site-2": {}}


def _job(tmp_path, framework: str, rounds: int = 3):
    job = tmp_path / "job"
    result = CliRunner().invoke(init_command, [str(job), "--framework", framework])
    assert result.exit_code == 0, result.output
    app = job / "app" / "app.yaml"
    app.write_text(app.read_text().replace("num_rounds: 5", f"num_rounds: {rounds}"))
    return job


def _validation(results, metric: str) -> list[float]:
    rows = [json.loads(line) for line in (results / "metrics.jsonl").read_text().splitlines()]
    return [r["metrics"][metric] for r in rows if r["phase"] == "validate" and r["site"] == "global"]


def test_the_lightning_template_trains_through_the_callback(tmp_path):
    importlib.import_module("lightning")  # required: a process this test starts loads it
    job = _job(tmp_path, "lightning", rounds=4)
    script = (job / "app" / "train.py").read_text()
    assert "FederatedCallback()" in script and "load_state_dict" not in script
    simulate(job, SITES, results_dir=tmp_path / "results")
    accuracy = _validation(tmp_path / "results", "accuracy")
    assert len(accuracy) == 4 and accuracy[-1] > 0.75 and accuracy[-1] > accuracy[0]
    # every site sent its trained weights: the global model is the module's state_dict
    final = load_file(tmp_path / "results" / "global_model_final.safetensors").params
    assert sorted(final) == ["net.0.bias", "net.0.weight", "net.2.bias", "net.2.weight"]


def test_the_hf_template_trains_a_model_built_from_a_config(tmp_path):
    importlib.import_module("transformers")  # required: a process this test starts loads it
    job = _job(tmp_path, "hf")
    assert "key_metric_mode: \"min\"" in (job / "app" / "app.yaml").read_text()
    simulate(job, SITES, results_dir=tmp_path / "results")
    loss = _validation(tmp_path / "results", "eval_loss")
    assert len(loss) == 3 and loss[-1] < loss[0] - 0.5  # the counting task is learnt
    final = load_file(tmp_path / "results" / "global_model_final.safetensors").params
    assert "transformer.wte.weight" in final and not any("lora" in k for k in final)


def test_the_lora_job_exchanges_the_adapters_only(tmp_path):
    importlib.import_module("peft")  # required: a process this test starts loads it
    job = _job(tmp_path, "hf-lora", rounds=2)
    assert "get_peft_model" in (job / "app" / "train.py").read_text()
    simulate(job, SITES, results_dir=tmp_path / "results")
    assert len(_validation(tmp_path / "results", "eval_loss")) == 2
    final = load_file(tmp_path / "results" / "global_model_final.safetensors").params
    # FedAvg without an initial model: the global model holds exactly what the sites sent
    assert final and all(".lora_A." in k or ".lora_B." in k for k in final), sorted(final)
    adapter_bytes = sum(a.nbytes for a in final.values())
    # r=4 on c_attn (32 -> 96) in 2 layers: A is 4x32, B 96x4, float32
    assert adapter_bytes == 2 * (4 * 32 + 96 * 4) * 4 == 4096
    full = load_file(_full_model(tmp_path)).params
    assert adapter_bytes * 10 < sum(a.nbytes for a in full.values())


def _full_model(tmp_path):
    folder = tmp_path / "full"
    folder.mkdir()
    job = _job(folder, "hf", rounds=1)
    simulate(job, SITES, results_dir=folder / "results")
    return folder / "results" / "global_model_final.safetensors"


def test_a_global_model_with_foreign_adapters_is_refused(monkeypatch):
    """A server's model naming weights the site's PEFT model lacks fails the site with the
    names, instead of being silently dropped."""
    importlib.import_module("peft")
    from peft import LoraConfig, get_peft_model
    from transformers import GPT2Config, GPT2LMHeadModel

    import atoll.client
    from atoll.fl.client_runtime import ClientError
    from atoll.fl.hf_trainer import FederatedTrainerCallback
    from atoll.fl.model import Model

    config = GPT2Config(vocab_size=8, n_positions=4, n_embd=8, n_layer=1, n_head=1)
    model = get_peft_model(GPT2LMHeadModel(config), LoraConfig(
        r=2, target_modules=["c_attn"], fan_in_fan_out=True))
    callback = FederatedTrainerCallback()
    params = callback.params_of(model)
    assert params and all("lora" in k for k in params)
    params["base_model.model.extra.lora_A.weight"] = np.zeros((2, 2), np.float32)
    # the task's model, as fl.receive() would hand it over
    monkeypatch.setattr(atoll.client, "receive", lambda: Model(params=params))
    with pytest.raises(ClientError, match="extra"):
        callback.load(model)
    del params["base_model.model.extra.lora_A.weight"]
    callback.load(model)  # the site's own adapters load
