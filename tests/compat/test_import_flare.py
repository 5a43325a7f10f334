"""``atoll job import-flare`` on FLARE job folders: what it writes, what it reports, and the
errors that stop it (each naming the file and field). The run of a translated job is in
test_flare_job_runs.py."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import yaml

from atoll.compat.flare_job import import_flare_job
from atoll.fl.app_config import load_app_config
from atoll.spec.errors import SpecError
from atoll.spec.meta import load_meta

HELLO_PT = Path(__file__).parent / "flare_jobs" / "hello-pt"


@pytest.fixture
def flare_job(tmp_path: Path) -> Path:
    return Path(shutil.copytree(HELLO_PT, tmp_path / "hello-pt"))


def edit(path: Path, change) -> None:
    data = json.loads(path.read_text())
    change(data)
    path.write_text(json.dumps(data))


def test_fedavg_recipe_job_becomes_an_atoll_job(flare_job, tmp_path):
    out = tmp_path / "out"
    report = import_flare_job(flare_job, out)
    meta = load_meta(out)
    assert meta.name == "hello-pt" and meta.min_clients == 2
    assert meta.deploy_map == {"app_server": ["server"], "app_site-1": ["site-1"],
                               "app_site-2": ["site-2"]}
    server, args = load_app_config(out / "app_server")
    assert server.server.workflow == "fedavg" and server.server.initial_model == (
        "flare_initial_model.py:make_model")
    assert (args.num_rounds, args.min_clients, args.evaluate_every, args.cross_site_eval) == (
        2, 2, 0, "none")
    site, _ = load_app_config(out / "app_site-1")
    assert site.site.script == "client.py"
    assert site.site.args == ["--batch_size", "16", "--epochs", "1", "--num_workers", "0",
                              "--train_size", "64", "--test_size", "32"]
    assert site.site.config == {"nvflare_params_exchange_format": "pytorch"}
    assert (out / "app_site-1" / "model.py").is_file()
    assert report.rewritten == [
        f"app_site-{n}/client.py:14: import nvflare.client as flare -> "
        "import atoll.compat.flare_client as flare" for n in (1, 2)]
    untranslated = "\n".join(report.not_translated)
    for component in ("IntimeModelSelector", "TBAnalyticsReceiver", "ConvertToFedEvent"):
        assert component in untranslated


def test_initial_model_file_makes_the_persistors_model(flare_job, tmp_path):
    from atoll.fl.runner import load_initial_model

    import_flare_job(flare_job, tmp_path / "out")
    model = load_initial_model(tmp_path / "out" / "app_server", "flare_initial_model.py:make_model")
    assert model.params["fc3.weight"].shape == (10, 84)


def test_client_api_imports_are_rewritten_and_the_rest_listed(flare_job, tmp_path):
    script = flare_job / "app_site-1" / "custom" / "client.py"
    head = [
        "from nvflare.client.tracking import SummaryWriter, MLflowWriter",
        "from nvflare.app_common.np.constants import NPConstants  # the key",
        "from nvflare.app_common.abstract.fl_model import FLModel, ParamsType as PT",
        "from nvflare.client import tracking",
        "from nvflare.app_common.app_constant import AppConstants, ModelName",
        "from nvflare.app_opt.xgboost import histogram_based_v2",
        "from nvflare.client.tracking import SummaryWriter, NoSuchWriter",
        "import nvflare.client",
        "from nvflare.client import (",
    ]
    script.write_text("\n".join(head) + "\n" + script.read_text())
    report = import_flare_job(flare_job, tmp_path / "out")
    lines = (tmp_path / "out" / "app_site-1" / "client.py").read_text().splitlines()
    assert lines[:5] == [
        "from atoll.compat.flare_tracking import SummaryWriter, MLflowWriter",
        "from atoll.compat.flare_constants import NPConstants  # the key",
        "from atoll.compat.flare_client import FLModel, ParamsType as PT",
        "import atoll.compat.flare_tracking as tracking",
        "from atoll.compat.flare_constants import AppConstants, ModelName",
    ]
    assert lines[5:9] == head[5:]  # left as they are, and listed
    listed = {line.split(":")[1]: line for line in report.not_translated
              if line.startswith("app_site-1/client.py:")}
    assert sorted(listed) == ["6", "7", "8", "9"]
    assert "nvflare.app_opt.xgboost has no atoll counterpart" in listed["6"]
    assert "NoSuchWriter of nvflare.client.tracking: not in atoll's" in listed["7"]
    assert "import it with a name" in listed["8"] and "several lines" in listed["9"]
    assert len([r for r in report.rewritten if r.startswith("app_site-1/")]) == 6


def test_the_lightning_client_api_is_rewritten(flare_job, tmp_path):
    """FLARE's Lightning Client API, either spelling, is atoll.compat.flare_lightning."""
    script = flare_job / "app_site-1" / "custom" / "client.py"
    head = ["import nvflare.client.lightning as flare",
            "from nvflare.client.lightning import patch, FLModel"]
    script.write_text("\n".join(head) + "\n" + script.read_text())
    import_flare_job(flare_job, tmp_path / "out")
    lines = (tmp_path / "out" / "app_site-1" / "client.py").read_text().splitlines()
    assert lines[:2] == ["import atoll.compat.flare_lightning as flare",
                         "from atoll.compat.flare_lightning import patch, FLModel"]


def test_external_process_and_unknown_executor_args_are_reported(flare_job, tmp_path):
    def change(data):
        data["executors"][0]["executor"]["args"].update(launch_external_process=True,
                                                        memory_gc_rounds=2)
    edit(flare_job / "app_site-2" / "config" / "config_fed_client.json", change)
    report = "\n".join(import_flare_job(flare_job, tmp_path / "out").not_translated)
    assert "external process" in report and "args.memory_gc_rounds: no atoll equivalent" in report


def test_flare_meta_spellings_are_read(flare_job, tmp_path):
    def change(data):
        data["deploy_map"] = {"app_server": {"targets": ["server"]},
                              "app_site-1": [{"sites": ["site-1"]}], "app_site-2": "site-2"}
        data["min_clients"] = "2"
        data["job_id"] = "abc"
    edit(flare_job / "meta.json", change)
    report = import_flare_job(flare_job, tmp_path / "out")
    assert load_meta(tmp_path / "out").deploy_map["app_site-2"] == ["site-2"]
    assert any(line.startswith("meta.json job_id") for line in report.not_translated)


def test_a_workflow_other_than_fedavg_stops_the_import(flare_job, tmp_path):
    def change(data):
        data["workflows"][0]["path"] = "nvflare.app_common.workflows.cyclic_ctl.CyclicController"
    edit(flare_job / "app_server" / "config" / "config_fed_server.json", change)
    with pytest.raises(SpecError) as info:
        import_flare_job(flare_job, tmp_path / "out")
    assert info.value.source == "app_server/config/config_fed_server.json"
    assert info.value.issues[0].path == "workflows"
    assert "CyclicController" in info.value.issues[0].message


def test_a_client_without_the_client_api_executor_stops_the_import(flare_job, tmp_path):
    def change(data):
        data["executors"][0]["executor"]["path"] = "custom.trainer.MyTrainer"
    edit(flare_job / "app_site-1" / "config" / "config_fed_client.json", change)
    with pytest.raises(SpecError) as info:
        import_flare_job(flare_job, tmp_path / "out")
    assert (info.value.source, info.value.issues[0].path) == (
        "app_site-1/config/config_fed_client.json", "executors")


def test_a_script_missing_from_custom_stops_the_import(flare_job, tmp_path):
    (flare_job / "app_site-1" / "custom" / "client.py").unlink()
    with pytest.raises(SpecError) as info:
        import_flare_job(flare_job, tmp_path / "out")
    assert info.value.issues[0].path == "executors[0].executor.args.task_script_path"


def test_hocon_configs_are_refused_naming_the_file(flare_job, tmp_path):
    config = flare_job / "app_site-1" / "config"
    (config / "config_fed_client.json").rename(config / "config_fed_client.conf")
    with pytest.raises(SpecError, match="HOCON"):
        import_flare_job(flare_job, tmp_path / "out")


def test_a_flare_meta_error_names_the_field(flare_job, tmp_path):
    edit(flare_job / "meta.json", lambda d: d.update(min_clients=3))
    with pytest.raises(SpecError) as info:
        import_flare_job(flare_job, tmp_path / "out")
    assert [i.path for i in info.value.issues] == ["min_clients"]


def test_the_output_folder_must_be_new(flare_job, tmp_path):
    (tmp_path / "out").mkdir()
    (tmp_path / "out" / "x").write_text("")
    with pytest.raises(SpecError, match="not empty"):
        import_flare_job(flare_job, tmp_path / "out")


def test_app_yaml_is_plain_yaml(flare_job, tmp_path):
    import_flare_job(flare_job, tmp_path / "out")
    assert yaml.safe_load((tmp_path / "out" / "app_server" / "app.yaml").read_text())["server"][
        "args"]["num_rounds"] == 2


def test_cross_site_model_eval_becomes_cross_site_eval_all(flare_job, tmp_path):
    """The recipe's add_cross_site_evaluation adds FLARE's CrossSiteModelEval workflow."""
    def change(data):
        data["workflows"].append({
            "id": "cross_site_validate",
            "path": "nvflare.app_common.workflows.cross_site_model_eval.CrossSiteModelEval",
            "args": {"model_locator_id": "locator"}})
    edit(flare_job / "app_server" / "config" / "config_fed_server.json", change)
    report = import_flare_job(flare_job, tmp_path / "out")
    _, args = load_app_config(tmp_path / "out" / "app_server")
    assert args.cross_site_eval == "all"
    assert not any("CrossSiteModelEval" in line for line in report.not_translated)


def test_numpy_persistors_checkpoint_wins_over_its_array_and_a_missing_one_is_listed(tmp_path):
    import numpy as np

    from atoll.fl.runner import load_initial_model

    job = Path(shutil.copytree(HELLO_PT.parent / "hello-numpy", tmp_path / "hello-numpy"))
    np.save(tmp_path / "pre.npy", np.full((2, 2), 7.0))
    np.savez(tmp_path / "pre.npz", np.full((2, 2), 7.0))
    config = job / "app" / "config" / "config_fed_server.json"
    for ckpt, out in ((str(tmp_path / "pre.npy"), "a"), (str(tmp_path / "pre.npz"), "a2"),
                      ("/server/missing.npy", "b")):
        edit(config, lambda d, c=ckpt: next(x for x in d["components"] if x["id"] == "persistor")[
            "args"].update(source_ckpt_file_full_name=c))
        report = import_flare_job(job, tmp_path / out)
        model = load_initial_model(tmp_path / out / "app", "flare_initial_model.py:make_model")
        listed = [line for line in report.not_translated if "source_ckpt" in line]
        if out.startswith("a"):
            np.testing.assert_array_equal(model.params["numpy_key"], np.full((2, 2), 7.0))
            assert listed == []
        else:  # the recipe's array, float32 as FLARE loads it
            np.testing.assert_array_equal(model.params["numpy_key"],
                                          np.arange(1, 10, dtype=np.float32).reshape(3, 3))
            assert len(listed) == 1 and "/server/missing.npy" in listed[0]


def test_the_persistors_array_is_read_as_json_by_the_written_file(tmp_path):
    """JSON's null and strings reach numpy as values (its error names them), not as Python
    source (where null would be a NameError and text could be an expression)."""
    from atoll.fl.runner import load_initial_model

    job = Path(shutil.copytree(HELLO_PT.parent / "hello-numpy", tmp_path / "hello-numpy"))
    config = job / "app" / "config" / "config_fed_server.json"
    edit(config, lambda d: next(x for x in d["components"] if x["id"] == "persistor")[
        "args"].update(model=[1, "__import__('os')", None]))
    import_flare_job(job, tmp_path / "out")
    with pytest.raises(ValueError, match="could not convert string to float"):
        load_initial_model(tmp_path / "out" / "app", "flare_initial_model.py:make_model")


def test_a_star_import_is_listed_with_why(flare_job, tmp_path):
    script = flare_job / "app_site-1" / "custom" / "client.py"
    script.write_text("from nvflare.client.tracking import *\n" + script.read_text())
    report = import_flare_job(flare_job, tmp_path / "out")
    assert any(line.startswith("app_site-1/client.py:1:") and "a star import" in line
               for line in report.not_translated)


def test_pytorch_persistors_checkpoint_wins_over_its_model_class(flare_job, tmp_path):
    import importlib.util

    import numpy as np
    import torch

    from atoll.fl.runner import load_initial_model

    spec = importlib.util.spec_from_file_location(
        "flare_model", flare_job / "app_server" / "custom" / "model.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    weights = {k: torch.full_like(v, 0.5) for k, v in module.SimpleNetwork().state_dict().items()}
    torch.save({"model": weights, "optimizer": {"lr": torch.tensor(0.1)}}, tmp_path / "pre.pt")
    config = flare_job / "app_server" / "config" / "config_fed_server.json"
    edit(config, lambda d: next(x for x in d["components"] if x["id"] == "persistor")[
        "args"].update(source_ckpt_file_full_name=str(tmp_path / "pre.pt"), load_device="cpu"))
    report = import_flare_job(flare_job, tmp_path / "out")
    assert (tmp_path / "out" / "app_server" / "flare_initial_ckpt.pt").is_file()
    model = load_initial_model(tmp_path / "out" / "app_server", "flare_initial_model.py:make_model")
    assert set(model.params) == set(weights)
    np.testing.assert_array_equal(model.params["fc3.weight"], np.full((10, 84), 0.5, np.float32))
    assert any("components.persistor.args.load_device" in line for line in report.not_translated)


def test_a_relative_checkpoint_outside_custom_is_listed_not_read(flare_job, tmp_path):
    config = flare_job / "app_server" / "config" / "config_fed_server.json"
    (flare_job / "secret.pt").write_bytes(b"x")
    edit(config, lambda d: next(x for x in d["components"] if x["id"] == "persistor")[
        "args"].update(source_ckpt_file_full_name="../../secret.pt"))
    report = import_flare_job(flare_job, tmp_path / "out")
    assert not (tmp_path / "out" / "app_server" / "flare_initial_ckpt.pt").exists()
    assert any("../../secret.pt is not a .pt/.pth/.ckpt file" in line
               for line in report.not_translated)
    # the model class stays the initial model
    assert (tmp_path / "out" / "app_server" / "flare_initial_model.py").read_text().count(
        "SimpleNetwork") >= 1
