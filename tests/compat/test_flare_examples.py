"""The FLARE-jobs suite: jobs in the shapes of FLARE 2.9's hello-world examples (scripts of our
own writing in flare_examples/), exported by FLARE's own recipe classes
(``flare_examples/job.py export``, run with FLARE's Python) into flare_jobs/, then translated
with ``atoll job import-flare`` and run with ``atoll job simulate --sites 2``: hello-numpy
(NumpyFedAvgRecipe with TensorBoard tracking), hello-numpy-cse (the same with
add_cross_site_evaluation) and hello-pt-recipe (FLARE's PyTorch FedAvgRecipe, tracking and
cross-site evaluation; synthetic images), hello-lightning (the same recipe with a
LightningModule, the script federating its Trainer with ``nvflare.client.lightning.patch``)
hello-huggingface (the same recipe with a tiny GPT-2 built from a config, the script
federating its Hugging Face Trainer with ``nvflare.client.hf.patch``) and hello-tabular-stats
(FedStatsRecipe with a DFStatisticsCore generator over synthetic pandas tables, imported with
the columns to ask about, ``--column``, and served by atoll's statistics under the sites'
rules).

Each example's note: import-flare changes the scripts' import lines only, and what it lists
as not translated is FLARE's server widgets (result files, model selection, the TensorBoard
receiver and its event converter: atoll writes its own metrics, plot and best model), the
PyTorch persistor's ``allow_numpy_conversion`` (atoll's server holds arrays) and, for
cross-site evaluation, NPValidator's dummy validation, whose validate tasks the script answers.

hello-numpy's final model is compared with FLARE's own simulator's (same rounds, same initial
model): flare_examples/hello-numpy/flare_final_model.json is what ``job.py simulate`` left in
FLARE's server workspace.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from atoll.fl.serde import load_file

HERE = Path(__file__).parent
JOBS = HERE / "flare_jobs"
SERVER_WIDGETS = [
    "components.json_generator: nvflare.app_common.widgets.validation_json_generator."
    "ValidationJsonGenerator",
    "components.model_selector: nvflare.app_common.widgets.intime_model_selector."
    "IntimeModelSelector",
    "components.metrics_artifact_writer: nvflare.app_common.widgets.metrics_artifact_writer."
    "MetricsArtifactWriter",
]
EVENT_TO_FED = ("app/config/config_fed_client.json components.event_to_fed: "
                "nvflare.app_common.widgets.convert_to_fed_event.ConvertToFedEvent")
EXPECTED = {
    "hello-numpy": {
        "rewritten": [
            "app/client.py:8: import nvflare.client as flare -> "
            "import atoll.compat.flare_client as flare",
            "app/client.py:9: from nvflare.app_common.np.constants import NPConstants -> "
            "from atoll.compat.flare_constants import NPConstants",
            "app/client.py:10: from nvflare.client.tracking import SummaryWriter -> "
            "from atoll.compat.flare_tracking import SummaryWriter",
        ],
        "not_translated": [f"app/config/config_fed_server.json {w}" for w in SERVER_WIDGETS] + [
            "app/config/config_fed_server.json components.receiver: "
            "nvflare.app_opt.tracking.tb.tb_receiver.TBAnalyticsReceiver", EVENT_TO_FED],
    },
    "hello-pt-recipe": {
        "rewritten": [
            "app/client.py:8: import nvflare.client as flare -> "
            "import atoll.compat.flare_client as flare",
            "app/client.py:11: from nvflare.client.tracking import SummaryWriter -> "
            "from atoll.compat.flare_tracking import SummaryWriter",
        ],
        "not_translated": [f"app/config/config_fed_server.json {w}" for w in SERVER_WIDGETS] + [
            "app/config/config_fed_server.json components.receiver: "
            "nvflare.app_opt.tracking.tb.tb_receiver.TBAnalyticsReceiver",
            "app/config/config_fed_server.json components.component1: "
            "nvflare.app_common.widgets.validation_json_generator.ValidationJsonGenerator",
            EVENT_TO_FED],
    },
    "hello-lightning": {
        "rewritten": [
            "app/client.py:9: import nvflare.client.lightning as flare -> "
            "import atoll.compat.flare_lightning as flare",
        ],
        "not_translated": [f"app/config/config_fed_server.json {w}" for w in SERVER_WIDGETS] + [
            "app/config/config_fed_server.json components.locator: "
            "nvflare.app_opt.pt.file_model_locator.PTFileModelLocator", EVENT_TO_FED],
    },
    "hello-huggingface": {
        "rewritten": [
            "app/client.py:11: import nvflare.client.hf as flare -> "
            "import atoll.compat.flare_hf as flare",
        ],
        "not_translated": [f"app/config/config_fed_server.json {w}" for w in SERVER_WIDGETS
                           if "model_selector" not in w] + [
            "app/config/config_fed_server.json components.persistor.args."
            "allow_numpy_conversion: the server keeps its own models",
            "app/config/config_fed_server.json components.locator: "
            "nvflare.app_opt.pt.file_model_locator.PTFileModelLocator", EVENT_TO_FED],
    },
    "hello-numpy-cse": {
        "rewritten": [
            "app/client.py:6: import nvflare.client as flare -> "
            "import atoll.compat.flare_client as flare",
            "app/client.py:7: from nvflare.app_common.abstract.fl_model import ParamsType -> "
            "from atoll.compat.flare_client import ParamsType",
            "app/client.py:8: from nvflare.app_common.np.constants import NPConstants -> "
            "from atoll.compat.flare_constants import NPConstants",
        ],
        "not_translated": [f"app/config/config_fed_server.json {w}" for w in SERVER_WIDGETS] + [
            "app/config/config_fed_server.json components.component1: "
            "nvflare.app_common.widgets.validation_json_generator.ValidationJsonGenerator",
            "app/config/config_fed_client.json executors[1]: "
            "nvflare.app_common.np.np_validator.NPValidator (its validate tasks go to the "
            "script, which answers them in its flare.is_evaluate() branch)", EVENT_TO_FED],
    },
}


def atoll(*args: str, cwd: Path) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "atoll", *args], capture_output=True,
                          text=True, timeout=600, cwd=cwd)


def import_and_simulate(name: str, tmp_path: Path) -> tuple[dict, Path]:
    out = tmp_path / f"{name}-atoll"
    done = atoll("job", "import-flare", str(JOBS / name), str(out), "--format", "json",
                 cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    report = json.loads(done.stdout)
    original = (JOBS / name / "app" / "custom" / "client.py").read_text().splitlines()
    imported = (out / "app" / "client.py").read_text().splitlines()
    changed = [(a, b) for a, b in zip(original, imported, strict=True) if a != b]
    assert all(a.lstrip().startswith(("import nvflare", "from nvflare")) and
               b.lstrip().startswith(("import atoll.compat", "from atoll.compat"))
               for a, b in changed)
    assert len(changed) == len(EXPECTED[name]["rewritten"])
    results = tmp_path / "results"
    done = atoll("job", "simulate", str(out), "--sites", "2", "--out", str(results),
                 cwd=tmp_path)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "FINISHED:COMPLETED" in done.stdout
    (run,) = results.iterdir()
    return report, run / "results"


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_import_changes_import_lines_only_and_lists_the_rest(name, tmp_path):
    out = tmp_path / "out"
    done = atoll("job", "import-flare", str(JOBS / name), str(out), "--format", "json",
                 cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    report = json.loads(done.stdout)
    assert report["rewritten"] == EXPECTED[name]["rewritten"]
    assert sorted(report["not_translated"]) == sorted(EXPECTED[name]["not_translated"])


def test_hello_numpy_gives_flares_final_model(tmp_path):
    _, results = import_and_simulate("hello-numpy", tmp_path)
    final = load_file(results / "global_model_final.safetensors").params["numpy_key"]
    flare = json.loads((HERE / "flare_examples" / "hello-numpy" /
                        "flare_final_model.json").read_text())
    assert final.dtype == np.dtype(flare["dtype"])
    np.testing.assert_array_equal(final, np.array(flare["array"], dtype=flare["dtype"]))
    # the recipe's model plus one per round, as the script trains
    np.testing.assert_array_equal(final, np.arange(1, 10, dtype=np.float32).reshape(3, 3) + 3)
    # SummaryWriter.add_scalar: the site's log values, FLARE's 0-based round as the step
    logged = [json.loads(line) for line in (results / "metrics.jsonl").read_text().splitlines()]
    steps = sorted((r["site"], r["step"], r["metrics"]["weight_mean"])
                   for r in logged if r["phase"] == "log")
    assert steps == sorted((site, step, 6.0 + step) for site in ("site-1", "site-2")
                           for step in range(3))


def test_hello_numpy_cross_site_evaluation(tmp_path):
    _, results = import_and_simulate("hello-numpy-cse", tmp_path)
    summary = json.loads((results / "summary.json").read_text())
    # two rounds from zeros, one step up each; every site's last model is the same
    assert summary["cross_site_eval"] == {
        model: {"site-1": {"weight_mean": 2.0}, "site-2": {"weight_mean": 2.0}}
        for model in ("global_final", "site-1", "site-2")}


DECORATED = '''
import numpy as np

import atoll.compat.flare_client as flare
from atoll.compat.flare_constants import NPConstants
from atoll.compat.flare_tracking import MLflowWriter, WandBWriter


@flare.evaluate
def check(model):
    return {"before": float(np.mean(model.params[NPConstants.NUMPY_KEY]))}


@flare.train
def step(model):
    assert flare.get_task_name() == "train"
    MLflowWriter().log_metric("m", 1.5, step=model.current_round)
    MLflowWriter().log_param("lr", "text")  # not a number: dropped
    WandBWriter().log({"w": 2.5}, step=model.current_round)
    flare.log("s", {"a": 1, "b": 2}, flare.AnalyticsDataType.SCALARS, global_step=0)
    return flare.FLModel(params={NPConstants.NUMPY_KEY: model.params[NPConstants.NUMPY_KEY] * 2})


flare.init()
while flare.is_running():
    check()
    step()
'''


def test_decorators_and_writers_of_the_client_api(tmp_path):
    """FLARE's @train/@evaluate and the MLflow and W&B writers, in a translated job."""
    out = tmp_path / "job"
    assert atoll("job", "import-flare", str(JOBS / "hello-numpy"), str(out),
                 cwd=tmp_path).returncode == 0
    (out / "app" / "client.py").write_text(DECORATED)
    results = tmp_path / "results"
    done = atoll("job", "simulate", str(out), "--sites", "2", "--set", "num_rounds=2",
                 "--out", str(results), cwd=tmp_path)
    assert done.returncode == 0, done.stdout + done.stderr
    (run,) = results.iterdir()
    records = [json.loads(line) for line in
               (run / "results" / "metrics.jsonl").read_text().splitlines()]
    train = [r["metrics"] for r in records if r["phase"] == "train" and r["site"] == "site-1"]
    assert train == [{"before": 5.0}, {"before": 10.0}]  # @evaluate's metrics ride with @train
    logged = {(k, r.get("step")) for r in records if r["phase"] == "log"
              and r["site"] == "site-1" for k in r["metrics"]}
    assert logged == {("m", 0), ("m", 1), ("w", 0), ("w", 1), ("s/a", 0), ("s/b", 0)}
    final = load_file(run / "results" / "global_model_final.safetensors").params["numpy_key"]
    np.testing.assert_array_equal(final, np.arange(1, 10, dtype=np.float32).reshape(3, 3) * 4)


def test_hello_pt_recipe_trains_tracks_and_evaluates_across_sites(tmp_path):
    """The PyTorch persistor's model class is round one's model (the script loads the server's
    state_dict); SummaryWriter's losses are logged; cross-site evaluation fills its table."""
    _, results = import_and_simulate("hello-pt-recipe", tmp_path)
    final = load_file(results / "global_model_final.safetensors").params
    assert final["fc3.weight"].shape == (10, 84)
    records = [json.loads(line) for line in (results / "metrics.jsonl").read_text().splitlines()]
    assert sorted((r["site"], r["step"]) for r in records if r["phase"] == "log") == [
        (site, step) for site in ("site-1", "site-2") for step in (0, 1)]
    summary = json.loads((results / "summary.json").read_text())
    assert {model: set(row) for model, row in summary["cross_site_eval"].items()} == {
        model: {"site-1", "site-2"} for model in ("global_final", "site-1", "site-2")}


def test_hello_lightning_patches_the_trainer_and_federates_it(tmp_path):
    """FLARE's Lightning Client API (``flare.patch(trainer)``): round one starts from the
    PyTorch persistor's LitNet, each round's result is the module's weights with the global
    model's validation metrics and the fit's, weighed by the round's optimizer steps."""
    _, results = import_and_simulate("hello-lightning", tmp_path)
    final = load_file(results / "global_model_final.safetensors").params
    assert sorted(final) == ["model.0.bias", "model.0.weight", "model.2.bias", "model.2.weight"]
    records = [json.loads(line) for line in (results / "metrics.jsonl").read_text().splitlines()]
    train = [r for r in records if r["phase"] == "train" and r["site"] != "global"]
    assert sorted((r["site"], r["round"]) for r in train) == [
        (site, n) for site in ("site-1", "site-2") for n in (1, 2)]
    # 300 examples in batches of 32 (10 steps), 2 epochs a round: NUM_STEPS_CURRENT_ROUND
    assert {r["num_examples"] for r in train} == {20}
    assert all({"val_acc_epoch", "val_loss", "train_loss"} <= set(r["metrics"]) for r in train)


def test_hello_huggingface_patches_the_trainer_and_federates_it(tmp_path):
    """FLARE's Hugging Face Client API (``flare.patch(trainer)``, the loop ``trainer.evaluate();
    trainer.train()``): round one starts from the persistor's TinyGPT2, each result is the
    trained model with the global model's evaluation, weighed as FLARE weighs it."""
    _, results = import_and_simulate("hello-huggingface", tmp_path)
    final = load_file(results / "global_model_final.safetensors").params
    assert "transformer.wte.weight" in final and final["transformer.wte.weight"].shape == (32, 32)
    records = [json.loads(line) for line in (results / "metrics.jsonl").read_text().splitlines()]
    train = [r for r in records if r["phase"] == "train" and r["site"] != "global"]
    assert sorted((r["site"], r["round"]) for r in train) == [
        (site, n) for site in ("site-1", "site-2") for n in (1, 2)]
    # NUM_STEPS_CURRENT_ROUND: 8 steps of 16 sequences (128 at each site, one epoch a round)
    assert {r["num_examples"] for r in train} == {128}
    # evaluate() before train() measures the global model: round 2's is the trained average
    loss = {(r["site"], r["round"]): r["metrics"]["eval_loss"] for r in train}
    assert all(loss[(site, 2)] < loss[(site, 1)] - 0.1 for site in ("site-1", "site-2"))


def test_hello_huggingface_answers_cross_site_evaluation(tmp_path):
    """A validate task: the patched ``trainer.evaluate()`` loads the model to evaluate and answers
    with its metrics; the ``trainer.train()`` after it in the loop does nothing."""
    out = tmp_path / "job"
    assert atoll("job", "import-flare", str(JOBS / "hello-huggingface"), str(out),
                 cwd=tmp_path).returncode == 0
    results = tmp_path / "results"
    done = atoll("job", "simulate", str(out), "--sites", "2", "--set", "num_rounds=1",
                 "--set", "cross_site_eval=all", "--out", str(results), cwd=tmp_path)
    assert done.returncode == 0, done.stdout + done.stderr
    (run,) = results.iterdir()
    summary = json.loads((run / "results" / "summary.json").read_text())
    table = summary["cross_site_eval"]
    assert {model: set(row) for model, row in table.items()} == {
        model: {"site-1", "site-2"} for model in ("global_final", "site-1", "site-2")}
    assert all(row[site]["eval_loss"] > 0 for row in table.values() for site in row)


def test_lightning_flcallback_and_client_logger(tmp_path):
    """FLARE's Lightning ``FLCallback`` given to the Trainer directly (no ``patch``) and its
    ``logger`` (ClientLogger): the job federates the same, and the logged numbers, under the
    logger's prefix, are the site's metrics."""
    out = tmp_path / "job"
    assert atoll("job", "import-flare", str(JOBS / "hello-lightning"), str(out),
                 cwd=tmp_path).returncode == 0
    script = out / "app" / "client.py"
    text = script.read_text()
    for old, new in (("enable_checkpointing=False,", "enable_checkpointing=False, "
                      "callbacks=[flare.FLCallback(rank=0)], log_every_n_steps=5,"),
                     ("logger=False,", "logger=flare.logger(prefix='lit'),"),
                     ("    flare.patch(trainer)\n", "")):
        assert old in text
        text = text.replace(old, new)
    script.write_text(text)
    results = tmp_path / "results"
    done = atoll("job", "simulate", str(out), "--sites", "2", "--set", "num_rounds=1",
                 "--out", str(results), cwd=tmp_path)
    assert done.returncode == 0, done.stdout + done.stderr
    (run,) = results.iterdir()
    records = [json.loads(line) for line in
               (run / "results" / "metrics.jsonl").read_text().splitlines()]
    train = [r for r in records if r["phase"] == "train" and r["site"] != "global"]
    assert {r["num_examples"] for r in train} == {20}  # FLARE's weight: the round's steps
    logged = {k for r in records if r["phase"] == "log" for k in r["metrics"]}
    assert logged and all(k.startswith("lit-") for k in logged), logged


def test_hello_tabular_stats_without_columns_is_refused_naming_what_to_do(tmp_path):
    """FLARE's FedStatsRecipe export names no columns (its sites report their generator's
    features): without --column, import-flare stops at the server's workflow, says what to
    add, and writes nothing."""
    out = tmp_path / "out"
    done = atoll("job", "import-flare", str(JOBS / "hello-tabular-stats"), str(out),
                 cwd=tmp_path)
    assert done.returncode == 2, done.stdout + done.stderr
    assert "app_server/config/config_fed_server.json" in done.stderr
    assert "workflows[0]: StatisticsController (FLARE's FedStatsRecipe): name the columns" in (
        done.stderr)
    assert "--column DATASET/FEATURE" in done.stderr
    assert not out.exists()


STATS_COLUMNS = ("train/Age", "train/Hours per week", "test/Age")


def import_stats(tmp_path: Path) -> tuple[dict, Path]:
    out = tmp_path / "hello-tabular-stats-atoll"
    done = atoll("job", "import-flare", str(JOBS / "hello-tabular-stats"), str(out),
                 *[a for c in STATS_COLUMNS for a in ("--column", c)], "--format", "json",
                 cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout), out


def generator_tables(out: Path, site: str) -> dict:
    """The DataFrames the user's generator loads at ``site``: what the statistics are of."""
    import importlib.util

    spec = importlib.util.spec_from_file_location(f"df_stats_{site}",
                                                  out / "app_site-1" / "df_stats.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)

    class Context:
        def get_identity_name(self, default=""):
            return site

    return module.SyntheticAdultStatistics().load_data(Context())


def test_hello_tabular_stats_becomes_atolls_statistics_under_the_sites_rules(tmp_path):
    """import-flare changes the generator's import lines only; atoll's statistics workflow asks
    the named columns, and each site answers from the generator's DataFrames under its own
    statistics rules (here the default: min_count 10, cells of 1): the global count, sum and
    mean are those of the generator's tables, and no released histogram cell counts 1 to 9."""
    report, out = import_stats(tmp_path)
    for site in ("app_site-1", "app_site-2"):
        original = (JOBS / "hello-tabular-stats" / site / "custom" / "df_stats.py").read_text()
        imported = (out / site / "df_stats.py").read_text()
        changed = [(a, b) for a, b in zip(original.splitlines(), imported.splitlines(),
                                          strict=True) if a != b]
        assert changed == [
            ("from nvflare.apis.fl_context import FLContext",
             "from atoll.compat.flare_statistics import FLContext"),
            ("from nvflare.app_opt.statistics.df.df_core_statistics import DFStatisticsCore",
             "from atoll.compat.flare_statistics import DFStatisticsCore")]
    assert all("site's statistics rules" in line or "histogram" in line or
               "JsonStatsFileWriter" in line for line in report["not_translated"])
    # the simulator runs one site app for every site: FLARE's two identical ones, as one
    meta = json.loads((out / "meta.json").read_text())
    meta["deploy_map"] = {"app_server": ["server"], "app_site-1": ["site-1", "site-2"]}
    (out / "meta.json").write_text(json.dumps(meta))
    results = tmp_path / "results"
    done = atoll("job", "simulate", str(out), "--sites", "2", "--out", str(results),
                 cwd=tmp_path)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "FINISHED:COMPLETED" in done.stdout
    (run,) = results.iterdir()
    stats = json.loads((run / "results" / "statistics.json").read_text())
    tables = {site: generator_tables(out, site) for site in ("site-1", "site-2")}
    for column in STATS_COLUMNS:
        dataset, feature = column.split("/")
        values = np.concatenate([tables[s][dataset][feature].to_numpy() for s in tables])
        total = stats["columns"][column]["global"]
        assert total["count"] == len(values)
        assert total["sum"] == pytest.approx(values.sum())
        assert total["mean"] == pytest.approx(values.mean())
        assert total["std"] == pytest.approx(values.std(ddof=1))
        for site in ("site-1", "site-2"):
            cells = stats["columns"][column]["sites"][site]["histogram"]
            assert all(c is None or c == 0 or c >= 10 for c in cells), (column, site)
    assert stats["rules"]["site-1"]["min_count"] == 10
    assert any("suppressed: under its min_count" in note for note in stats["notes"])


def test_hello_huggingface_loop_that_never_trains_fails_clearly(tmp_path):
    """A loop that only ``evaluate()``s leaves each train task unanswered: the next
    ``flare.is_running()`` stops the script with what to call (FLARE's rule), where waiting on
    the same task would loop for ever."""
    out = tmp_path / "job"
    assert atoll("job", "import-flare", str(JOBS / "hello-huggingface"), str(out),
                 cwd=tmp_path).returncode == 0
    script = out / "app" / "client.py"
    text = script.read_text()
    assert "        trainer.train()\n" in text
    script.write_text(text.replace("        trainer.train()\n", ""))
    done = atoll("job", "simulate", str(out), "--sites", "2", "--set", "num_rounds=1",
                 "--out", str(tmp_path / "results"), cwd=tmp_path)
    assert done.returncode != 0
    assert "the current task is not answered yet; call trainer.train()" in (
        done.stdout + done.stderr)
