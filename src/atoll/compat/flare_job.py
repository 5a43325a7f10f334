"""``atoll job import-flare``: an NVIDIA FLARE 2.9 job folder becomes an atoll job folder.

What it reads, from a job FLARE's FedAvg recipe exports (``recipe.export(job_dir)``) with a
Client API script:

- ``meta.json``: name, ``deploy_map``, ``min_clients``, ``mandatory_clients``, ``resource_spec``,
  ``launcher_spec``, in any spelling FLARE 2.9 accepts (``spec.meta`` reads them);
- per app, ``config/config_fed_server.json``: the ``FedAvg`` workflow's ``num_rounds`` and
  ``num_clients``/``min_clients``, a ``CrossSiteModelEval`` workflow after it (atoll's
  ``cross_site_eval: all``; its model locators need nothing more), and the persistor's
  initial model, which becomes the app's ``server.initial_model``: a PyTorch persistor's model
  class (``model.SimpleNetwork``) or checkpoint, a NumPy persistor's array or checkpoint;
- per app, ``config/config_fed_client.json``: the Client API executor's script
  (``task_script_path``), its arguments (``task_script_args``) and exchange format;
- per app, ``custom/``: the script and the modules it imports, copied into the atoll app; in
  each ``.py`` file the import lines of FLARE's Client API (``FLARE_MODULES``: ``import
  nvflare.client as flare``, ``from nvflare.client.tracking import SummaryWriter``...) are
  pointed at ``atoll.compat`` (their one change; atoll installs nothing under FLARE's name,
  which would shadow it).

A statistics job (FLARE's ``FedStatsRecipe``: ``StatisticsController``, ``StatisticsExecutor``)
becomes atoll's statistics workflow over the columns the importer names
(``flare_statistics_job``).

Everything else (other components, filters, executor options such as an external process) is
listed in the report as not translated, with the file and the path it came from. A workflow
other than FedAvg or statistics, a job without a Client API executor, or a ``.conf`` (HOCON)
config stops the import with an error naming the file and the field.
"""

from __future__ import annotations

import importlib
import json
import re
import shlex
import shutil
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath
from typing import Any

import yaml

from atoll.compat import flare_statistics_job
from atoll.spec.errors import Issue, SpecError

SERVER_CONFIG = "config_fed_server"
CLIENT_CONFIG = "config_fed_client"
META_KEYS = ("name", "deploy_map", "min_clients", "mandatory_clients", "resource_spec",
             "launcher_spec")
FEDAVG = ("FedAvg", "PTFedAvg", "FedAvgEarlyStopping")
CLIENT_API_EXECUTORS = ("ClientAPIExecutor", "InProcessClientAPIExecutor",
                        "PTInProcessClientAPIExecutor", "ClientAPILauncherExecutor",
                        "PTClientAPILauncherExecutor")
PERSISTORS = ("PTFileModelPersistor", "PTModelPersistor")
NP_PERSISTORS = ("NPModelPersistor",)
NP_VALIDATORS = ("NPValidator",)
MODEL_LOCATORS = ("NPModelLocator", "PTFileModelLocator")
NUMPY_KEY = "numpy_key"  # FLARE's NPConstants.NUMPY_KEY: the NumPy persistor's one array
INITIAL_CKPT_STEM = "flare_initial_ckpt"  # + the checkpoint's own suffix
PT_CHECKPOINTS = (".pt", ".pth", ".ckpt")
NP_CHECKPOINTS = (".npy", ".npz")
CROSS_SITE_EVAL = ("CrossSiteModelEval", "CrossSiteEval")
STATISTICS = flare_statistics_job.CONTROLLERS  # FLARE's FedStatsRecipe
INITIAL_MODEL_FILE = "flare_initial_model.py"
FLARE_FEDAVG_ROUNDS = 5  # FLARE's FedAvg default
SCRIPT_PREFIXES = ("/local/custom/", "local/custom/", "custom/", "/")
ATOLL_CLIENT = "atoll.compat.flare_client"
# FLARE's modules a Client API script imports, and the atoll module that serves each
FLARE_MODULES = {
    "nvflare.client": ATOLL_CLIENT,
    "nvflare.client.api": ATOLL_CLIENT,
    "nvflare.client.decorator": ATOLL_CLIENT,
    "nvflare.app_common.abstract.fl_model": ATOLL_CLIENT,
    "nvflare.apis.analytix": ATOLL_CLIENT,
    "nvflare.client.tracking": "atoll.compat.flare_tracking",
    "nvflare.client.lightning": "atoll.compat.flare_lightning",
    "nvflare.app_opt.lightning": "atoll.compat.flare_lightning",
    "nvflare.client.hf": "atoll.compat.flare_hf",
    "nvflare.app_opt.hf": "atoll.compat.flare_hf",
    "nvflare.app_common.np.constants": "atoll.compat.flare_constants",
    "nvflare.app_common.app_constant": "atoll.compat.flare_constants",
    "nvflare.apis.fl_constant": "atoll.compat.flare_constants",
    "nvflare.apis.fl_context": "atoll.compat.flare_statistics",
    "nvflare.app_common.abstract.statistics_spec": "atoll.compat.flare_statistics",
    "nvflare.app_opt.statistics.df.df_core_statistics": "atoll.compat.flare_statistics",
}
STATISTICS_NEEDS_COLUMNS = (
    "StatisticsController (FLARE's FedStatsRecipe): name the columns to ask about, "
    "import again with --column DATASET/FEATURE for each (for example --column train/Age): "
    "FLARE's export names none (its sites report their generator's features), and in atoll "
    "the job names the columns its sites answer for under their statistics rules")
_NAME = r"[A-Za-z_]\w*"
_DOTTED = rf"{_NAME}(?:\.{_NAME})*"
_TAIL = r"\s*(?P<comment>#.*)?$"
IMPORT_AS = re.compile(rf"^(?P<indent>\s*)import (?P<module>{_DOTTED}) as (?P<alias>{_NAME}){_TAIL}")
FROM_IMPORT = re.compile(
    rf"^(?P<indent>\s*)from (?P<module>{_DOTTED}) import (?P<names>{_NAME}(?: as {_NAME})?"
    rf"(?:\s*,\s*{_NAME}(?: as {_NAME})?)*)\s*,?{_TAIL}")
NVFLARE_IMPORT = re.compile(r"^\s*(?:import|from)\s+nvflare\b")


@dataclass
class ImportReport:
    """What was written, and what was not translated (one sentence each)."""

    out_dir: Path
    files: list[str] = field(default_factory=list)
    rewritten: list[str] = field(default_factory=list)  # import lines pointed at atoll
    not_translated: list[str] = field(default_factory=list)


def import_flare_job(source: Path, out_dir: Path,
                     columns: list[str] | None = None) -> ImportReport:
    """Translate the FLARE job folder ``source`` into the atoll job folder ``out_dir``.

    ``columns``: for a statistics job (FLARE's FedStatsRecipe), the ``DATASET/FEATURE`` columns
    to ask about. Raises SpecError naming the file and field that stops the import; ``out_dir``
    must not exist or be empty.
    """
    from atoll.spec.meta import load_meta  # pydantic: not for `job submit`'s flare_apps check

    source, out_dir = Path(source), Path(out_dir)
    if out_dir.exists() and any(out_dir.iterdir()):
        raise SpecError([Issue("", f"{out_dir} is not empty; choose a new folder")])
    report = ImportReport(out_dir)
    meta_doc = _meta_document(source, report)
    meta = load_meta(meta_doc)  # FLARE's spellings -> atoll's; every problem at once
    apps: dict[str, dict[str, Any]] = {}
    for app, targets in meta.deploy_map.items():
        runs_server = "server" in targets or "@ALL" in targets
        runs_site = any(t != "server" for t in targets)
        app_dir = source / app
        if not app_dir.is_dir():
            raise SpecError([Issue(f"deploy_map.{app}", f"{app_dir} is not a folder of the job")],
                            source=str(source / "meta.json"))
        config: dict[str, Any] = {}
        if runs_server:
            config["server"] = _server_section(app_dir, report, meta.min_clients, columns)
        if runs_site:
            config["site"] = _site_section(app_dir, report)
        apps[app] = config
    out_dir.mkdir(parents=True, exist_ok=True)
    canonical = meta.model_dump(exclude_none=True, exclude={"study", "submitter"})
    canonical = {k: v for k, v in canonical.items() if v not in ({}, [])}
    _write(out_dir / "meta.json", json.dumps(canonical, indent=2) + "\n", report)
    for app, config in apps.items():
        _copy_custom(source / app, out_dir / app, report)
        for part in ("server", "site"):
            for name, text in config.get(part, {}).pop("_files", {}).items():
                _write(out_dir / app / name, text, report)
        initial = config.get("server", {}).pop("_initial_model", None)
        checkpoint = config.get("server", {}).pop("_initial_ckpt", None)
        if checkpoint is not None:
            (out_dir / app).mkdir(parents=True, exist_ok=True)
            name = INITIAL_CKPT_STEM + checkpoint.suffix
            shutil.copyfile(checkpoint, out_dir / app / name)
            report.files.append(f"{app}/{name}")
        if initial is not None:
            _write(out_dir / app / INITIAL_MODEL_FILE, initial, report)
        _write(out_dir / app / "app.yaml", yaml.safe_dump(config, sort_keys=False), report)
    from atoll.fl.app_config import load_app_config  # the translation must load as written

    for app in apps:
        load_app_config(out_dir / app)
    return report


def flare_apps(job_dir: Path) -> list[str]:
    """App folders of ``job_dir`` that are FLARE's (config/config_fed_*, no app.yaml): such a
    job is translated with import-flare first, not submitted as it is."""
    return sorted(
        p.name for p in Path(job_dir).iterdir()
        if p.is_dir() and not (p / "app.yaml").exists()
        and any((p / "config").glob("config_fed_*"))
    )


def _write(path: Path, text: str, report: ImportReport) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text, encoding="utf-8")
    report.files.append(path.relative_to(report.out_dir).as_posix())


def _meta_document(source: Path, report: ImportReport) -> dict[str, Any]:
    data = _read_config(source, "meta", "meta.json")
    if data is None:
        raise SpecError([Issue("", f"{source} has no meta.json; is it a FLARE job folder?")])
    extra = sorted(k for k in data if k not in META_KEYS)
    for key in extra:
        report.not_translated.append(
            f"meta.json {key}: not an atoll job key (study: give it with atoll job submit "
            "--study; job_id: set by the server)" if key in ("study", "job_id") else
            f"meta.json {key}: not an atoll job key")
    doc = {k: data[k] for k in META_KEYS if k in data}
    doc.setdefault("name", source.resolve().name)  # FLARE names a job by its folder
    return doc


def _read_config(folder: Path, stem: str, label: str) -> dict[str, Any] | None:
    """``stem``.json, .yml or .yaml (FLARE's formats); a .conf is refused, naming the file."""
    for suffix in (".json", ".yml", ".yaml"):
        path = folder / f"{stem}{suffix}"
        if path.is_file():
            try:
                text = path.read_text(encoding="utf-8")
                data = json.loads(text) if suffix == ".json" else yaml.safe_load(text)
            except (ValueError, yaml.YAMLError) as err:
                raise SpecError([Issue("", f"cannot be read: {err}")], source=str(path)) from None
            if not isinstance(data, dict):
                raise SpecError([Issue("", "must be a mapping")], source=str(path))
            return data
    if (folder / f"{stem}.conf").is_file():
        raise SpecError([Issue("", f"{label} is HOCON (.conf), which atoll does not read; "
                                   "export the job as JSON (recipe.export writes JSON)")],
                        source=str(folder / f"{stem}.conf"))
    return None


def _short(path: Any) -> str:
    return str(path).rsplit(".", 1)[-1] if isinstance(path, str) else ""


def _server_section(app_dir: Path, report: ImportReport, min_clients: int | None,
                    columns: list[str] | None) -> dict:
    file = f"{app_dir.name}/config/{SERVER_CONFIG}.json"
    config = _read_config(app_dir / "config", SERVER_CONFIG, file)
    if config is None:
        raise SpecError([Issue("", "missing: the app runs on the server")], source=file)
    workflows = config.get("workflows") or []
    found = [(i, w) for i, w in enumerate(workflows)
             if isinstance(w, dict) and _short(w.get("path")) in FEDAVG]
    statistics = [i for i, w in enumerate(workflows)
                  if isinstance(w, dict) and _short(w.get("path")) in STATISTICS]
    if not found and statistics:
        if not columns:
            raise SpecError([Issue(f"workflows[{statistics[0]}]", STATISTICS_NEEDS_COLUMNS)],
                            source=file)
        components = {c.get("id"): c for c in config.get("components") or []
                      if isinstance(c, dict)}
        section = flare_statistics_job.server_section(
            file, statistics[0], workflows[statistics[0]], components, columns,
            report.not_translated)
        if isinstance(min_clients, int):
            section["args"]["min_clients"] = min_clients
        return section
    if not found:
        names = ", ".join(str(w.get("path")) for w in workflows if isinstance(w, dict))
        raise SpecError([Issue("workflows", f"has no FedAvg workflow ({names or 'none'}); "
                                            "import-flare translates FedAvg recipe jobs")],
                        source=file)
    index, workflow = found[0]
    args = dict(workflow.get("args") or {})
    server_args: dict[str, Any] = {
        "num_rounds": args.pop("num_rounds", FLARE_FEDAVG_ROUNDS),
        "evaluate_every": 0,  # FLARE's FedAvg sends no validate task of its own
        "cross_site_eval": "none",
    }
    clients = args.pop("num_clients", args.pop("min_clients", min_clients))
    if isinstance(clients, int):
        server_args["min_clients"] = clients
    persistor_id = args.pop("persistor_id", "persistor")
    if args.get("aggregation_weights") == {}:
        args.pop("aggregation_weights")  # the recipe's default: every site weighs alike
    for key in sorted(args):
        report.not_translated.append(f"{file} workflows[{index}].args.{key}: not a FedAvg "
                                     "argument atoll has")
    components = {c.get("id"): c for c in config.get("components") or [] if isinstance(c, dict)}
    used: set[Any] = set()
    for i, other in enumerate(workflows):
        if i != index and _short(other.get("path")) in CROSS_SITE_EVAL:
            server_args["cross_site_eval"] = "all"  # the global and every site's last model
            # the model locator (NPModelLocator, PTFileModelLocator) finds the global model,
            # which atoll's cross-site evaluation holds itself
            used.update(cid for cid, c in components.items()
                        if _short(c.get("path")) in MODEL_LOCATORS)
        elif i != index:
            report.not_translated.append(f"{file} workflows[{i}]: {other.get('path')}")
    section: dict[str, Any] = {"workflow": "fedavg", "args": server_args}
    persistor = components.get(persistor_id)
    if persistor is not None and _short(persistor.get("path")) in PERSISTORS:
        used.add(persistor_id)
        model = (persistor.get("args") or {}).get("model")
        if isinstance(model, str) and model in components:  # a reference to another component
            used.add(model)
            model = components[model]
        pt_args = persistor.get("args") or {}
        checkpoint = _checkpoint(app_dir, pt_args.get("source_ckpt_file_full_name"),
                                 PT_CHECKPOINTS, report, f"{file} components.{persistor_id}")
        for key in sorted(set(pt_args) - {"model", "source_ckpt_file_full_name"}):
            report.not_translated.append(f"{file} components.{persistor_id}.args.{key}: the "
                                         "server keeps its own models")
        if checkpoint is not None:  # FLARE's first choice, before the model class
            section["initial_model"] = f"{INITIAL_MODEL_FILE}:make_model"
            section["_initial_ckpt"] = checkpoint
            section["_initial_model"] = _pt_checkpoint_source(checkpoint)
        elif isinstance(model, dict) and isinstance(model.get("path"), str):
            section["initial_model"] = f"{INITIAL_MODEL_FILE}:make_model"
            section["_initial_model"] = _initial_model_source(model["path"],
                                                              model.get("args") or {})
    elif persistor is not None and _short(persistor.get("path")) in NP_PERSISTORS:
        used.add(persistor_id)
        _numpy_initial_model(app_dir, persistor.get("args") or {}, section, report,
                             f"{file} components.{persistor_id}")
    if "initial_model" not in section:
        report.not_translated.append(f"{file}: no persistor with a model (PyTorch model class "
                                     "or NumPy array); the first round starts from the "
                                     "sites' own weights")
    for cid, component in components.items():
        if cid not in used:
            report.not_translated.append(f"{file} components.{cid}: {component.get('path')}")
    for key in ("task_data_filters", "task_result_filters"):
        if config.get(key):
            report.not_translated.append(f"{file} {key}: filters are not translated")
    return section


def _numpy_initial_model(app_dir: Path, args: dict[str, Any], section: dict[str, Any],
                         report: ImportReport, at: str) -> None:
    """FLARE's NPModelPersistor: its checkpoint (``initial_ckpt``) when the file is on this
    machine, else its ``model`` array, as float32 under ``numpy_key`` as FLARE loads it."""
    model = args.get("model")
    checkpoint = _checkpoint(app_dir, args.get("source_ckpt_file_full_name"), NP_CHECKPOINTS,
                             report, at)
    for key in sorted(set(args) - {"model", "source_ckpt_file_full_name"}):
        report.not_translated.append(f"{at}.args.{key}: the server keeps its own models")
    if checkpoint is None and model is None:
        return
    section["initial_model"] = f"{INITIAL_MODEL_FILE}:make_model"
    if checkpoint is not None:
        section["_initial_ckpt"] = checkpoint
        load = (f"    data = numpy.load({INITIAL_CKPT_STEM + checkpoint.suffix!r}, "
                "allow_pickle=False)\n"
                "    if hasattr(data, 'files'):  # an .npz: its first array\n"
                "        data = data[data.files[0]]\n")
        origin = f"its checkpoint {checkpoint.name}"
    else:
        # the array as JSON text, parsed when the model is made: never code from the config
        load = (f"    data = numpy.array(json.loads({json.dumps(model)!r}), "
                "dtype=numpy.float32)\n")
        origin = "its model array"
    section["_initial_model"] = (
        f'"""Written by atoll job import-flare: the initial model of FLARE\'s NPModelPersistor, '
        f'{origin}, under NPConstants.NUMPY_KEY."""\n\n'
        "import json\n\nimport numpy\n\n\n"
        "def make_model():\n"
        f"{load}"
        f"    return {{{NUMPY_KEY!r}: data}}\n"
    )


def _checkpoint(app_dir: Path, ckpt: Any, suffixes: tuple[str, ...], report: ImportReport,
                at: str) -> Path | None:
    """The persistor's ``source_ckpt_file_full_name`` (the recipe's ``initial_ckpt``) when it is
    a file of one of ``suffixes`` on this machine (absolute, or under the app's custom/, where
    FLARE looks for a relative one); else it is listed and None."""
    if not isinstance(ckpt, str) or not ckpt:
        return None
    where = Path(ckpt) if Path(ckpt).is_absolute() else app_dir / "custom" / ckpt
    # a relative name stays in custom/, links resolved: the folder came from someone else
    inside = Path(ckpt).is_absolute() or where.resolve().is_relative_to(
        (app_dir / "custom").resolve())
    if where.suffix in suffixes and where.is_file() and ".." not in Path(ckpt).parts and inside:
        return where
    report.not_translated.append(
        f"{at}.args.source_ckpt_file_full_name: {ckpt} is not a {'/'.join(suffixes)} file on "
        "this machine (FLARE reads it on its server; atoll carries it in the job): copy it "
        "here and import again")
    return None


def _pt_checkpoint_source(checkpoint: Path) -> str:
    name = INITIAL_CKPT_STEM + checkpoint.suffix
    return (
        f'"""Written by atoll job import-flare: the initial model of FLARE\'s PyTorch persistor, '
        f'its checkpoint {checkpoint.name}."""\n\n'
        "import torch\n\n\n"
        "def make_model():\n"
        "    # weights only: a checkpoint is data, never code to run\n"
        f"    data = torch.load({name!r}, map_location='cpu', weights_only=True)\n"
        "    # FLARE's checkpoints keep the weights under 'model', beside optimizer state\n"
        "    if isinstance(data, dict) and isinstance(data.get('model'), dict):\n"
        "        return data['model']\n"
        "    return data\n"
    )


def _initial_model_source(class_path: str, args: dict[str, Any]) -> str:
    module, _, name = class_path.rpartition(".")
    return (
        f'"""Written by atoll job import-flare: the initial model of FLARE\'s persistor, '
        f'{class_path}({", ".join(f"{k}=..." for k in args)})."""\n\n'
        "import importlib\n\n\n"
        "def make_model():\n"
        f"    model_class = getattr(importlib.import_module({module!r}), {name!r})\n"
        f"    return model_class(**{args!r}).state_dict()\n"
    )


def _site_section(app_dir: Path, report: ImportReport) -> dict[str, Any]:
    file = f"{app_dir.name}/config/{CLIENT_CONFIG}.json"
    config = _read_config(app_dir / "config", CLIENT_CONFIG, file)
    if config is None:
        raise SpecError([Issue("", "missing: the app runs on sites")], source=file)
    executors = config.get("executors") or []
    statistics = [(i, e["executor"]) for i, e in enumerate(executors)
                  if isinstance(e, dict) and isinstance(e.get("executor"), dict)
                  and _short(e["executor"].get("path")) in flare_statistics_job.EXECUTORS]
    if statistics:
        index, executor = statistics[0]
        section = flare_statistics_job.site_section(file, config, index, executor,
                                                    report.not_translated)
        if section is None:
            raise SpecError([Issue(f"executors[{index}].executor.args.generator_id",
                                   "names no generator component with a module path")],
                            source=file)
        return section
    found = [(i, e.get("executor")) for i, e in enumerate(executors)
             if isinstance(e, dict) and isinstance(e.get("executor"), dict)
             and _short(e["executor"].get("path")) in CLIENT_API_EXECUTORS]
    if not found:
        raise SpecError([Issue("executors", "has no Client API executor (ClientAPIExecutor, "
                                            "written by the recipe's ScriptRunner)")],
                        source=file)
    index, executor = found[0]
    args = dict(executor.get("args") or {})
    at = f"{file} executors[{index}].executor.args"
    script = args.pop("task_script_path", None)
    if not isinstance(script, str) or not script:
        raise SpecError([Issue(f"executors[{index}].executor.args.task_script_path",
                               "missing: name the Client API script")], source=file)
    script = _script_in_app(app_dir, script, file, index)
    script_args = args.pop("task_script_args", "") or ""
    section: dict[str, Any] = {"script": script, "args": shlex.split(str(script_args))}
    from atoll.compat.flare_client import FORMAT_KEY  # the client API's: numpy and atoll.fl

    exchange = args.pop("params_exchange_format", args.pop("framework", None))
    if str(exchange).lower() in ("pytorch", "frameworktype.pytorch"):
        section["config"] = {FORMAT_KEY: "pytorch"}
    for key in ("server_expected_format", "execution_mode", "params_transfer_type"):
        args.pop(key, None)  # atoll moves numpy arrays in-process: nothing to choose
    if args.pop("launch_external_process", False) or _short(executor.get("path")).startswith(
        ("ClientAPILauncher", "PTClientAPILauncher")
    ):
        report.not_translated.append(f"{at}: the script ran in an external process; atoll "
                                     "runs it inside the site worker")
    for key in sorted(args):
        report.not_translated.append(f"{at}.{key}: no atoll equivalent")
    for i, other in enumerate(executors):
        if i == index:
            continue
        path = (other.get("executor") or {}).get("path") if isinstance(other, dict) else None
        if _short(path) in NP_VALIDATORS:  # add_cross_site_evaluation's dummy validator
            report.not_translated.append(
                f"{file} executors[{i}]: {path} (its validate tasks go to the script, which "
                "answers them in its flare.is_evaluate() branch)")
        else:
            report.not_translated.append(f"{file} executors[{i}]: {path}: not translated")
    for component in config.get("components") or []:
        if isinstance(component, dict):
            report.not_translated.append(
                f"{file} components.{component.get('id')}: {component.get('path')}")
    return section


def _script_in_app(app_dir: Path, script: str, file: str, index: int) -> str:
    """The script's path inside the app (FLARE keeps it under custom/)."""
    custom = app_dir / "custom"
    relative = script
    for prefix in SCRIPT_PREFIXES:
        if relative.startswith(prefix):
            relative = relative[len(prefix):]
    candidates = [relative, PurePosixPath(relative).name]
    for candidate in candidates:
        if candidate and ".." not in PurePosixPath(candidate).parts and (
            custom / candidate
        ).is_file():
            return candidate
    raise SpecError([Issue(f"executors[{index}].executor.args.task_script_path",
                           f"{script} is not in {app_dir.name}/custom/")], source=file)


def _copy_custom(app_dir: Path, out_app: Path, report: ImportReport) -> None:
    custom = app_dir / "custom"
    if not custom.is_dir():
        return
    for path in sorted(custom.rglob("*")):
        if path.is_symlink() or "__pycache__" in path.parts or not path.is_file():
            continue
        relative = path.relative_to(custom)
        target = out_app / relative
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(path, target)
        name = f"{out_app.name}/{relative.as_posix()}"
        report.files.append(name)
        if path.suffix == ".py":
            _point_at_atoll(target, name, report)


def _point_at_atoll(path: Path, name: str, report: ImportReport) -> None:
    """The import lines of FLARE's Client API (``FLARE_MODULES``) are the one change a script
    needs; every other nvflare import is listed, naming what atoll lacks."""
    lines = path.read_text(encoding="utf-8").splitlines(keepends=True)
    changed = False
    for number, line in enumerate(lines, 1):
        if not NVFLARE_IMPORT.match(line):
            continue
        new, problem = _translate_import(line.rstrip("\r\n"))
        if new is not None:
            lines[number - 1] = new + "\n"
            report.rewritten.append(f"{name}:{number}: {line.strip()} -> {new.strip()}")
            changed = True
        else:
            report.not_translated.append(f"{name}:{number}: {line.strip()}: {problem}")
    if changed:
        path.write_text("".join(lines), encoding="utf-8")


def _translate_import(line: str) -> tuple[str | None, str]:
    """atoll's line for one nvflare import line, or None and why not."""
    match = IMPORT_AS.match(line)
    if match:
        target = FLARE_MODULES.get(match["module"])
        if target is None:
            return None, _no_counterpart(match["module"])
        return _with_comment(f"{match['indent']}import {target} as {match['alias']}", match), ""
    match = FROM_IMPORT.match(line)
    if not match and re.match(r"^\s*from\s+\S+\s+import\s+\*", line):
        return None, "a star import; name what the script uses to translate it"
    if not match:
        if line.rstrip().endswith(("(", "\\")):
            return None, "an import over several lines; write it on one line to translate it"
        return None, ("import it with a name (import nvflare.client as flare); the module's "
                      "own name cannot be served without shadowing FLARE")
    module = match["module"]
    names = [part.split(" as ") for part in re.split(r"\s*,\s*", match["names"].strip())]
    if all(f"{module}.{n[0]}" in FLARE_MODULES for n in names):  # from nvflare import client
        return _with_comment(match["indent"] + "; ".join(
            f"import {FLARE_MODULES[f'{module}.{n[0]}']} as {n[-1]}" for n in names), match), ""
    target = FLARE_MODULES.get(module)
    if target is None:
        return None, _no_counterpart(module)
    provided = set(getattr(importlib.import_module(target), "__all__", ()))
    missing = [n[0] for n in names if n[0] not in provided]
    if missing:
        return None, f"{', '.join(missing)} of {module}: not in atoll's {target}"
    return _with_comment(f"{match['indent']}from {target} import {match['names'].strip()}",
                         match), ""


def _with_comment(line: str, match: re.Match) -> str:
    return f"{line}  {match['comment']}" if match["comment"] else line


def _no_counterpart(module: str) -> str:
    return (f"{module} has no atoll counterpart (atoll serves "
            f"{', '.join(sorted(FLARE_MODULES))})")
