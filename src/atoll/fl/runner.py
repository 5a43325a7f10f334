"""What a job worker runs: the server's workflow or a site's script, as ``app.yaml`` says.

The worker (``python -m atoll.worker``) connects its channel, then calls one of:

- ``run_server_app(channel, app_dir, job_args)``: validates app.yaml, loads the initial model and
  runs the named workflow until it ends; a ``WorkflowError`` says why the job failed.
- ``run_site_app(channel, app_dir, site, datasets, ranks)``: binds the channel into ``atoll.client`` and
  runs the site script in this process with ``runpy`` (``sys.argv`` from app.yaml, working
  directory the app folder, the folder importable). An exception from the script propagates
  with its traceback, for the worker to print to the job's log; ``sys.exit(0)`` is a success.

``job_args`` are job-level settings the workflow may use as defaults (``min_clients`` from
meta.json, the job's ``name``); the runner adds ``job_id`` and app.yaml's ``tracking`` (for the
workflow's ``MetricsLog``); unknown keys are ignored.
"""

from __future__ import annotations

import builtins
import functools
import os
import runpy
import sys
import threading
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

# app_config's models (pydantic) load where they are needed: the server's path, and a site's
# only for an app.yaml its plain check does not vouch for (fl/app_config_plain.py)
from atoll.fl.app_config_plain import (
    APP_FILE,
    AppConfigError,
    PlainApp,
    PlainSite,
    custom_workflow,
    vouch,
)
from atoll.fl.channels import ServerChannel, SiteChannel
from atoll.fl.client_runtime import ClientSession, bind, unbind
from atoll.fl.distributed import Ranks
from atoll.fl.model import Model
from atoll.fl.serde import SerdeError, dtype_name, load_file
from atoll.spec.errors import AtollError

if TYPE_CHECKING:
    from atoll.fl.app_config import AppConfig, SiteSection
    from atoll.fl.privacy.secagg.identity import LocalAuthority
    from atoll.fl.privacy.site_privacy import SitePrivacy


class SiteScriptError(AtollError, RuntimeError):
    """The site script ended with a non-zero exit status."""


def _inside(app_dir: Path, relative: str, field: str) -> Path:
    """The file ``relative`` of the app folder, refusing anything that resolves outside it."""
    root = app_dir.resolve()
    path = (root / relative).resolve()
    source = str(app_dir / APP_FILE)
    if not path.is_relative_to(root):
        raise AppConfigError(source, [f"{field}: {relative!r} resolves outside the app folder"])
    if not path.is_file():
        raise AppConfigError(source, [f"{field}: {relative!r} is not a file in {app_dir}"])
    return path


def forget_modules_of(folder: Path, before: set[str]) -> None:
    """Drop from ``sys.modules`` what was imported since ``before`` from ``folder``: a job's own
    modules (``model``, ``my_workflow``) must not stand in for another job's of the same name
    in a process that runs several (the simulator, tests). A worker runs one job and exits."""
    root = str(Path(folder).resolve())
    for name in set(sys.modules) - before:
        file = getattr(sys.modules.get(name), "__file__", None) or ""
        if os.path.realpath(file).startswith(root + os.sep):
            sys.modules.pop(name, None)


def load_initial_model(app_dir: Path, reference: str) -> Model:
    """The model app.yaml's ``server.initial_model`` names: a .safetensors file of the app, or
    ``FILE.py:FUNCTION``, called with no arguments on the server worker, in the app folder
    (its working directory, and importable), as a site script runs. The function returns a
    Model, or named arrays (numpy, or torch tensors such as a state_dict). An exception it
    raises propagates with its traceback, for the job's log."""
    relative, colon, function = reference.partition(":")
    path = _inside(app_dir, relative, "server.initial_model")
    source = str(app_dir / APP_FILE)
    if not colon:
        try:
            return load_file(path)
        except SerdeError as exc:
            raise AppConfigError(source, [f"server.initial_model: {exc}"]) from None
    saved_cwd, saved_path, saved_modules = os.getcwd(), sys.path[:], set(sys.modules)
    try:
        os.chdir(app_dir)
        sys.path.insert(0, str(path.parent))
        make = runpy.run_path(str(path), run_name="atoll_initial_model").get(function)
        if not callable(make):
            raise AppConfigError(source, [f"server.initial_model: {relative} has no function "
                                          f"{function!r}"])
        made = make()
    finally:
        sys.path[:] = saved_path
        os.chdir(saved_cwd)
        forget_modules_of(app_dir, saved_modules)
    return _as_model(made, reference, source)


def _as_model(made: Any, reference: str, source: str) -> Model:
    def refuse(problem: str) -> AppConfigError:
        return AppConfigError(source, [f"server.initial_model: {reference} {problem}"])

    model = made
    if isinstance(made, Mapping):
        params = dict(made)
        if any(type(v).__module__.startswith("torch") for v in params.values()):
            from atoll.fl.torch_bridge import to_params

            params = to_params(params)
        try:
            model = Model(params={k: np.asarray(v) for k, v in params.items()})
        except (TypeError, ValueError) as exc:
            raise refuse(f"returned what is not a model: {exc}") from None
    if not isinstance(model, Model):
        raise refuse(f"returned a {type(made).__name__}; it must return an atoll Model or a dict "
                     "of arrays named by strings")
    for name, array in model.params.items():
        try:
            dtype_name(array.dtype)
        except SerdeError as exc:
            raise refuse(f"made params[{name!r}]: {exc}") from None
    return model


def run_server_app(channel: ServerChannel, app_dir: Path, job_args: dict[str, Any]) -> None:
    app_dir = Path(app_dir)
    config, args = _server_config(app_dir)
    source = str(app_dir / APP_FILE)
    if config.server is None:
        raise AppConfigError(
            source,
            ["server: missing: the server runs this app, so app.yaml needs server: {workflow, args}"],
        )
    from atoll.fl.workflows import BUILTINS  # the server's alone: site workers skip it
    from atoll.fl.workflows.api import Context

    custom = custom_workflow(config.server.workflow)
    if custom is None:
        workflow_class = BUILTINS[config.server.workflow]
    else:  # the job's own code: it runs here, in the server's confined worker, like a script
        workflow_class = load_workflow_class(app_dir, *custom)
        args = _workflow_args(workflow_class, config.server.args, source)
    initial = None
    if config.server.initial_model:
        initial = load_initial_model(app_dir, config.server.initial_model)
    # The job's settings for the workflow's metrics log: its id and app.yaml's tracking.
    job_args = {"job_id": channel.job_id, **(job_args or {}), "tracking": config.server.tracking}
    if config.privacy is not None:  # the FedAvg family reads it (workflows/fedavg.py)
        if config.server.workflow == "scatter_gather":
            raise AppConfigError(source, [
                "privacy: scatter_gather sends raw payloads, which privacy cannot filter or "
                "aggregate securely; use fedavg, fedprox or fedopt"])
        job_args["privacy"] = config.privacy
    ctx = Context(channel, args, initial, job_args)
    try:
        workflow = workflow_class(ctx)
        resume = job_args.get("resume")
        if isinstance(resume, dict):  # a server restart interrupted this job: go on from its
            _resume(workflow, ctx, resume)  # last checkpoint
        workflow.run()
    finally:
        ctx.close()


def _server_config(app_dir: Path) -> tuple[AppConfig | PlainApp, Any]:
    """The app.yaml the server runs and its workflow's arguments: in plain Python when that
    check vouches for the file and the workflow is built in (no pydantic: ~0.15 CPU-s of the
    server worker, on the path to the first round), else by the models."""
    config = _plain_config(app_dir)
    server = config.server if config is not None else None
    if server is not None and server.args is not None:
        return config, server.args
    from atoll.fl.app_config import load_app_config

    return load_app_config(app_dir)


def _resume(workflow: Any, ctx: Any, resume: dict[str, Any]) -> None:
    """Restore the workflow from its checkpoint, or fail saying why it cannot resume."""
    from atoll.fl.workflows.rounds import WorkflowError

    if not workflow.resumable():
        raise WorkflowError(
            f"the server restarted while the job ran, and its workflow "
            f"{type(workflow).__name__} keeps no checkpoint (it defines no state() and "
            "restore(), docs/federated-learning.md): resubmit the job")
    expected = resume.get("round")
    state = ctx.resume(expected if isinstance(expected, int) else None)
    if state is not None:
        workflow.restore(state)


def load_workflow_class(app_dir: Path, relative: str, name: str) -> type:
    """The ``Workflow`` subclass ``name`` of the app folder's ``relative`` file, loaded as a site
    script is (working directory the app folder, the folder importable)."""
    from atoll.fl.workflows.api import Workflow

    path = _inside(app_dir, relative, "server.workflow")
    saved_cwd, saved_path = os.getcwd(), sys.path[:]
    try:
        os.chdir(app_dir)
        sys.path.insert(0, str(path.parent))
        found = runpy.run_path(str(path), run_name="atoll_workflow").get(name)
    finally:
        sys.path[:] = saved_path
        os.chdir(saved_cwd)
    if not (isinstance(found, type) and issubclass(found, Workflow)):
        problem = (
            f"has no class {name!r}"
            if found is None
            else f"defines {name!r}, but it is not a subclass of atoll.workflow.Workflow"
        )
        raise AppConfigError(str(app_dir / APP_FILE), [f"server.workflow: {relative} {problem}"])
    return found


def _workflow_args(workflow_class: type, raw: dict[str, Any], source: str) -> Any:
    """``server.args`` validated with the class's ``Args`` model, or the plain dict."""
    from pydantic import ValidationError

    model = getattr(workflow_class, "Args", None)
    if model is None:
        return dict(raw)
    try:
        return model.model_validate(raw)
    except ValidationError as exc:
        errors = [
            f"server.args.{'.'.join(str(p) for p in e['loc'])}: {e['msg']}" for e in exc.errors()
        ]
        raise AppConfigError(source, errors) from None


def _site_config(app_dir: Path) -> AppConfig | PlainApp:
    """The app.yaml a site runs, checked whole: in plain Python when that check vouches for it,
    else by the models (which accept it or raise, naming each problem)."""
    config = _plain_config(app_dir)
    if config is None:
        from atoll.fl.app_config import load_app_config

        config, _ = load_app_config(app_dir)
    if config.site is None:
        raise AppConfigError(
            str(app_dir / APP_FILE),
            ["site: missing: sites run this app, so app.yaml needs site: {script, args}"],
        )
    return config


def _plain_config(app_dir: Path) -> PlainApp | None:
    import yaml

    try:
        data = yaml.safe_load((app_dir / APP_FILE).read_text())
    except (OSError, UnicodeDecodeError, yaml.YAMLError):
        return None  # the models' loader says what is wrong
    return vouch(data)


def _site_section(app_dir: Path) -> SiteSection | PlainSite:
    section = _site_config(app_dir).site
    assert section is not None
    return section


def _site_privacy(config: AppConfig | PlainApp, site: str, job_id: str,
                  secagg_credential: str | None) -> SitePrivacy | None:
    """The site's side of app.yaml's privacy section, checked against the site's own policy
    (handed over by its parent); None when neither asks for anything. ``secagg_credential``:
    the site-certified key its parent made for this worker (atoll.pki.worker_credential);
    "simulated" in the simulator, whose sites share one throwaway CA."""
    from atoll.spec.worker_env import (
        PRIVACY_POLICY as POLICY_ENV,  # imports nothing: spec.privacy is pydantic
    )

    if config.privacy is None and not os.environ.get(POLICY_ENV):
        return None  # nothing asked: the privacy machinery (and cryptography) stays unloaded
    from atoll.fl.privacy.secagg.identity import SiteIdentity
    from atoll.fl.privacy.site_privacy import SitePrivacy, policy_from_env
    from atoll.spec.privacy import PrivacySettings

    policy = policy_from_env()
    if config.privacy is None and policy is None:
        return None
    identity = None
    if config.privacy is not None and config.privacy.secure_aggregation is not None:
        if secagg_credential == "simulated":
            identity = _simulated_authority().identity(site, job_id)
        elif secagg_credential:
            identity = SiteIdentity.from_secret(site, job_id, secagg_credential)
    return SitePrivacy(config.privacy or PrivacySettings(), policy, site, job_id,
                       identity=identity)


_AUTHORITY_LOCK = threading.Lock()


def _simulated_authority() -> LocalAuthority:
    # The simulator's sites call this from their threads at once: functools.cache alone let
    # two of them make an authority each, and a site certified by the other one was refused.
    with _AUTHORITY_LOCK:
        return _one_authority()


@functools.cache
def _one_authority() -> LocalAuthority:
    from atoll.fl.privacy.secagg.identity import LocalAuthority

    return LocalAuthority()


def run_site_app(
    channel: SiteChannel,
    app_dir: Path,
    site: str,
    datasets: dict[str, str],
    statistics_rules: dict[str, Any] | None = None,
    ranks: Ranks | None = None,
    secagg_credential: str | None = None,
) -> None:
    app_dir = Path(app_dir)
    config = _site_config(app_dir)
    section = config.site
    assert section is not None
    script = _inside(app_dir, section.script, "site.script")
    from atoll.fl.tracking import site_streamer

    privacy = _site_privacy(config, site, channel.job_id, secagg_credential)

    # Rank 0 alone streams: the other ranks of a distributed site train the same model.
    tracking = site_streamer(site, channel.job_id) if ranks is None or ranks.leader else None
    bind(ClientSession(channel, site, datasets, section.config, statistics_rules, ranks, tracking,
                        privacy))
    saved_argv, saved_cwd, saved_path = sys.argv[:], os.getcwd(), sys.path[:]
    try:
        sys.argv = [str(script), *section.args]
        os.chdir(app_dir)
        sys.path.insert(0, str(script.parent))
        runpy.run_path(str(script), run_name="__main__")
    except SystemExit as exc:
        _check_exit(exc, script)
    finally:
        sys.argv, sys.path[:] = saved_argv, saved_path
        os.chdir(saved_cwd)
        unbind()
        if tracking is not None:
            tracking.close(failed=sys.exc_info()[0] is not None)


def run_site_app_in_thread(
    channel: SiteChannel,
    app_dir: Path,
    site: str,
    datasets: dict[str, str],
    statistics_rules: dict[str, Any] | None = None,
) -> None:
    """The simulator's variant: several sites share one process, one thread each.

    The client session is bound to the calling thread only; ``sys.argv``, the working directory
    and ``sys.path`` are process-wide, so the simulator sets them once for all sites. The script
    runs as ``__main__`` without replacing ``sys.modules['__main__']`` (runpy would, and threads
    would race on it).
    """
    app_dir = Path(app_dir)
    config = _site_config(app_dir)
    section = config.site
    assert section is not None
    script = _inside(app_dir, section.script, "site.script")
    privacy = _site_privacy(config, site, channel.job_id, "simulated")
    bind(ClientSession(channel, site, datasets, section.config, statistics_rules,
                       privacy=privacy), thread_only=True)
    try:
        code = compile(script.read_bytes(), str(script), "exec")
        namespace = {
            "__name__": "__main__",
            "__file__": str(script),
            "__builtins__": builtins,
            "__package__": None,
            "__spec__": None,
            "__loader__": None,
        }
        exec(code, namespace)
    except SystemExit as exc:
        _check_exit(exc, script)
    finally:
        unbind(thread_only=True)


def site_argv(app_dir: Path) -> list[str]:
    """``sys.argv`` the site script of ``app_dir`` expects."""
    section = _site_section(Path(app_dir))
    return [str(_inside(Path(app_dir), section.script, "site.script")), *section.args]


def _check_exit(exc: SystemExit, script: Path) -> None:
    if exc.code in (None, 0):
        return
    raise SiteScriptError(f"{script.name} exited with status {exc.code!r}") from exc
