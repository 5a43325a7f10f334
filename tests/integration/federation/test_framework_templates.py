"""The Lightning, Hugging Face and LoRA templates (`atoll job init --framework ...`) on a real
local federation: a server and two site parents as processes over mutual TLS, each site's
worker started by the process launcher in its sandbox. The same jobs in the simulator:
tests/unit/fl/test_framework_templates.py."""

from __future__ import annotations

import importlib

import pytest
from click.testing import CliRunner

from atoll.cli.job_init import init_command
from atoll.fl.serde import load_file
from tests.integration.federation.conftest import ADMIN


def _job(tmp_path, framework: str):
    job = tmp_path / framework
    result = CliRunner().invoke(init_command, [str(job), "--framework", framework,
                                               "--sites", "site-1,site-2"])
    assert result.exit_code == 0, result.output
    app = job / "app" / "app.yaml"
    app.write_text(app.read_text().replace("num_rounds: 5", "num_rounds: 2"))
    return job


@pytest.mark.parametrize("framework,module", [("lightning", "lightning"),
                                              ("hf", "transformers"), ("hf-lora", "peft")])
def test_the_framework_template_completes_on_a_federation(federation, tmp_path, framework,
                                                          module):
    importlib.import_module(module)  # required: the site workers load it
    with federation.session(ADMIN) as s:
        done = s.submit(_job(tmp_path, framework), wait=True, timeout=400)
        logs = s.logs(done["job_id"])["logs"] if done["state"] != "FINISHED:COMPLETED" else {}
        assert done["state"] == "FINISHED:COMPLETED", (done["reason"], done["parts"], logs)
        out = s.download(done["job_id"], tmp_path / "download")
    final = load_file(next(out.rglob("global_model_final.safetensors"))).params
    if framework == "hf-lora":  # the adapters alone went to the server and came back
        assert final and all(".lora_A." in k or ".lora_B." in k for k in final), sorted(final)
        assert sum(a.nbytes for a in final.values()) == 4096
    elif framework == "hf":
        assert "transformer.wte.weight" in final
    else:
        assert sorted(final) == ["net.0.bias", "net.0.weight", "net.2.bias", "net.2.weight"]
