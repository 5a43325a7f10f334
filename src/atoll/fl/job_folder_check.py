"""Check a job folder on the user's machine before anything runs it.

``atoll job validate``, and the first step of ``atoll job submit`` and ``atoll job simulate``:
``meta.json``; every app's ``app.yaml`` (workflow, arguments, sections for where it runs); the
site script, the initial model and every other Python file of each app exist and compile; with
the study's sites, that ``min_clients`` can ever be met. A problem is reported once, naming the
user's own path as they typed it (``myjob/app/app.yaml: server.args.num_round: unknown key ...``),
never a path of the machine that would have run it.

``--set KEY=VALUE`` overrides (``overrides``) change ``app.yaml`` before it is checked and run:
``KEY`` is a workflow argument (``num_rounds``, or ``server.args.num_rounds``) or a site setting
(``site.config.batch_size``); ``VALUE`` is read as YAML (``3`` is a number, ``adam`` a string).
"""

from __future__ import annotations

import ast
import os
from pathlib import Path
from typing import TYPE_CHECKING, Any

import yaml

# The plain checks first (no pydantic: ~0.2 CPU-s of every `atoll job submit`); the models
# (fl/app_config.py, spec/meta.py) load only for a file of a shape the plain checks leave to them.
from atoll.fl.app_config_plain import APP_FILE, AppConfigError, vouch
from atoll.spec.admission import study_issues
from atoll.spec.errors import Issue, SpecError
from atoll.spec.meta_plain import META_FILE, PlainMeta, read_meta, read_meta_bytes
from atoll.spec.names import ALL_SITES, SERVER

if TYPE_CHECKING:
    from atoll.spec.meta import JobMeta

Problem = dict[str, str]  # {"file", "path", "message"}: what the CLI's render_error lists


def _problem(file: str, path: str, message: str) -> Problem:
    return {"file": file, "path": path, "message": message}


def job_label(job_dir: Path) -> str:
    """The job folder as the user wrote it (``myjob``, ``../jobs/x``): the root of every path
    a problem names."""
    return os.path.normpath(str(job_dir))


# --- overrides ------------------------------------------------------------------------------------


def parse_overrides(pairs: list[str] | tuple[str, ...]) -> dict[tuple[str, str], Any]:
    """``--set`` values as {(section, key): value}: section ``server.args`` or ``site.config``."""
    out: dict[tuple[str, str], Any] = {}
    for pair in pairs:
        key, eq, raw = pair.partition("=")
        if not eq or not key.strip():
            raise SpecError([_issue(pair, "write KEY=VALUE, e.g. num_rounds=3")], source="--set")
        key = key.strip()
        section = "server.args"
        for prefix in ("server.args.", "site.config."):
            if key.startswith(prefix):
                section, key = prefix[:-1], key[len(prefix):]
        if not key.isidentifier():
            raise SpecError([_issue(pair, f"{key!r} is not an argument name")], source="--set")
        try:
            out[(section, key)] = yaml.safe_load(raw) if raw.strip() else ""
        except yaml.YAMLError:
            out[(section, key)] = raw
    return out


def _issue(path: str, message: str) -> Issue:
    return Issue(path, message)


def apply_overrides(data: Any, overrides: dict[tuple[str, str], Any]) -> Any:
    """A loaded app.yaml with ``overrides`` set in the sections it has (``server.args`` only
    where the app has a server section, ``site.config`` only where it has a site section)."""
    if not overrides or not isinstance(data, dict):
        return data
    data = dict(data)
    for (section, key), value in overrides.items():
        top, inner = section.split(".")
        block = data.get(top)
        if not isinstance(block, dict):
            continue
        block = data[top] = dict(block)
        values = block.get(inner)
        block[inner] = {**(values if isinstance(values, dict) else {}), key: value}
    return data


# --- the check ------------------------------------------------------------------------------------


def check_job(job_dir: Path, study: str | None = None, study_sites: list[str] | None = None,
              overrides: dict[tuple[str, str], Any] | None = None) -> list[Problem]:
    """Every problem of the job folder, each once; empty when it would start and run.

    With ``study_sites`` (the sites of ``study``, from the server), ``min_clients`` and the
    sites of ``deploy_map`` are checked against them: a job that could never start is refused
    before it is sent.
    """
    job_dir = Path(job_dir)
    label = job_label(job_dir)
    if not job_dir.is_dir():
        return [_problem(label, "", "not a folder; a job folder holds meta.json and its apps")]
    meta_file = f"{label}/{META_FILE}"
    if not (job_dir / META_FILE).exists():
        return [_problem(label, "", f"no {META_FILE}: a job folder holds meta.json and its apps "
                         "(`atoll job init DIR` writes one)")]
    try:
        meta = read_meta(read_meta_bytes(job_dir / META_FILE), meta_file)
    except SpecError as exc:
        return [_problem(meta_file, i.path, i.message) for i in exc.issues]
    problems: list[Problem] = []
    for app, targets in meta.deploy_map.items():
        problems += _check_app(job_dir / app, f"{label}/{app}", targets, overrides or {})
    if study_sites is not None:
        problems += _check_sites(meta, meta_file, study or "", study_sites)
    return problems


def _check_app(app_dir: Path, label: str, targets: list[str],
               overrides: dict[tuple[str, str], Any]) -> list[Problem]:
    if not app_dir.is_dir():
        return [_problem(label, "", "missing: deploy_map names this app folder")]
    return _check_app_yaml(app_dir, label, targets, overrides) + _compile_all(app_dir, label)


def _check_app_yaml(app_dir: Path, label: str, targets: list[str],
                    overrides: dict[tuple[str, str], Any]) -> list[Problem]:
    source = f"{label}/{APP_FILE}"
    path = app_dir / APP_FILE
    if not path.is_file():
        return [_problem(source, "", f"missing: every app folder needs an {APP_FILE}")]
    try:
        data = yaml.safe_load(path.read_text(encoding="utf-8"))
    except (yaml.YAMLError, UnicodeDecodeError) as exc:
        return [_problem(source, "", f"not valid YAML: {exc}")]
    problems = _unused_overrides(data, overrides, source)
    data = apply_overrides(data, overrides)
    try:
        config = vouch(data) or _models(data, source)
    except AppConfigError as exc:
        problems += [_split(source, e, overrides) for e in exc.errors]
        site = data.get("site") if isinstance(data, dict) else None
        script = site.get("script") if isinstance(site, dict) else None
        if isinstance(script, str) and script.endswith(".py") and not _is_file(app_dir, script):
            problems.append(_problem(source, "site.script", f"{script!r} is not a file in "
                                     f"{label}/"))  # reported with the file's other problems
        return problems
    runs_server = SERVER in targets or ALL_SITES in targets
    runs_sites = any(t != SERVER for t in targets)
    if runs_server and config.server is None:
        problems.append(_problem(source, "server", "missing: the server runs this app, so "
                                 "app.yaml needs server: {workflow, args}"))
    if runs_sites and config.site is None:
        problems.append(_problem(source, "site", "missing: sites run this app, so app.yaml "
                                 "needs site: {script, args}"))
    named: dict[str, str] = {}  # file of the app -> the field that names it
    if runs_sites and config.site is not None:
        named[config.site.script] = "site.script"
    model = config.server.initial_model if runs_server and config.server else None
    if model:
        named[model.partition(":")[0]] = "server.initial_model"
    for relative, field in named.items():
        file = (app_dir / relative).resolve()
        if not file.is_relative_to(app_dir.resolve()):
            problems.append(_problem(source, field, f"{relative!r} resolves outside the app "
                                     "folder"))
        elif not file.is_file():
            problems.append(_problem(source, field, f"{relative!r} is not a file in {label}/"))
    if model and ":" in model:
        problems += _check_function(app_dir, label, model)
    return problems


def _models(data: Any, source: str) -> Any:
    """The app.yaml through the models: its AppConfig, or AppConfigError naming each problem."""
    from atoll.fl.app_config import parse_app_config

    return parse_app_config(data, source)[0]


def _is_file(app_dir: Path, relative: str) -> bool:
    path = (app_dir / relative).resolve()
    return path.is_relative_to(app_dir.resolve()) and path.is_file()


def _unused_overrides(data: Any, overrides: dict[tuple[str, str], Any], source: str
                      ) -> list[Problem]:
    """An override for a section this app does not have would silently do nothing."""
    if not isinstance(data, dict):
        return []
    return [_problem("--set", f"{section}.{key}", f"{source} has no {section.split('.')[0]}: "
                     "section to set it in")
            for section, key in overrides if not isinstance(data.get(section.split(".")[0]),
                                                            dict)]


def _split(source: str, error: str, overrides: dict[tuple[str, str], Any]) -> Problem:
    """One line of an AppConfigError ("server.args.x: unknown key ...") as a Problem; a problem
    of an overridden value names the --set that made it."""
    path, _, message = error.partition(": ")
    for section, key in overrides:
        if path == f"{section}.{key}":
            return _problem("--set", path, message)
    return _problem(source, path, message)


def _check_function(app_dir: Path, label: str, model: str) -> list[Problem]:
    relative, _, function = model.partition(":")
    try:
        tree = ast.parse((app_dir / relative).read_bytes(), filename=relative)
    except (OSError, SyntaxError, ValueError):
        return []  # reported by _compile_all (or as a missing file)
    defined = {node.name for node in tree.body
               if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef)}
    defined |= {t.id for node in tree.body if isinstance(node, ast.Assign)
                for t in node.targets if isinstance(t, ast.Name)}
    defined |= {(a.asname or a.name).split(".")[0] for node in tree.body
                if isinstance(node, ast.Import | ast.ImportFrom) for a in node.names}
    if function in defined:
        return []
    return [_problem(f"{label}/{APP_FILE}", "server.initial_model",
                     f"{relative} defines no function {function!r}")]


def _compile_all(app_dir: Path, label: str) -> list[Problem]:
    """A syntax error in any Python file of the app, named by its line: found now, not when
    a worker imports it."""
    problems = []
    for file in sorted(app_dir.rglob("*.py")):
        if not file.is_file() or any(p.startswith(".") for p in file.relative_to(app_dir).parts):
            continue
        relative = file.relative_to(app_dir).as_posix()
        try:
            compile(file.read_bytes(), relative, "exec", dont_inherit=True)
        except SyntaxError as exc:
            where = f"line {exc.lineno}" if exc.lineno else ""
            problems.append(_problem(f"{label}/{relative}", where,
                                     f"{type(exc).__name__}: {exc.msg}"))
        except ValueError as exc:  # e.g. a NUL byte
            problems.append(_problem(f"{label}/{relative}", "", f"cannot be compiled: {exc}"))
    return problems


def _check_sites(meta: PlainMeta | JobMeta, meta_file: str, study: str, study_sites: list[str]
                 ) -> list[Problem]:
    """What makes a job wait forever in ``study`` (spec/admission.py, as the server's intake)."""
    return [_problem(meta_file, i.path, i.message)
            for i in study_issues(meta, study or None, study_sites)]


def copy_with_overrides(job_dir: Path, dest: Path, overrides: dict[tuple[str, str], Any]) -> Path:
    """A copy of the job folder in ``dest`` whose app.yaml files carry ``overrides``: the job
    that is then signed, submitted or simulated is exactly the one that runs."""
    import shutil

    shutil.copytree(job_dir, dest, symlinks=True)
    for app_yaml in sorted(dest.glob(f"*/{APP_FILE}")):
        data = yaml.safe_load(app_yaml.read_text(encoding="utf-8"))
        app_yaml.write_text(yaml.safe_dump(apply_overrides(data, overrides), sort_keys=False),
                            encoding="utf-8")
    return dest
