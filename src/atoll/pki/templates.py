"""Commented ``local/`` files written into new kits, for the site operator to edit.

They are starting points that already work with the process launcher; every other setting is
shown commented out, with where it applies.
"""

from __future__ import annotations

import yaml

_SITE_HEADER = """\
# local/site.yaml: how this {who} runs atoll's job workers. Owned by its operator and read
# when the parent starts. The participant's name comes from its certificate, not from here.
"""

_SITE_BODY = """\
# launcher: exactly one of process, docker, k8s, slurm (the job never chooses it).
launcher: process

# Settings of the chosen launcher go in a block named like it (only that one), for example:
# process: {{gpu_ids: [0, 1], cpu_ids: [0, 1, 2, 3]}}
#   Process workers run in a sandbox (bubblewrap) that shows them their own job and nothing
#   else; `process: {{sandbox: none}}` opts out, for hosts without user namespaces only
#   (docs/security.md). Each worker has a network of its own: it reaches its parent, its
#   job's other ranks and what you allow, e.g. your MLflow server:
#   `process: {{network: {{allow: [mlflow.example.org:5000]}}}}`; `network: host` opts out.
# docker: {{network: atoll, default_image: registry.example.org/atoll-worker:1.0}}
# k8s: {{namespace: atoll-jobs, default_image: registry.example.org/atoll-worker:1.0}}
# slurm: {{partition: gpu, account: fl, qos: normal, sandbox: none, pending_timeout: 600}}

# What this {who} offers to atoll's jobs in total; a job waits while it is used up.
# capacity: {{gpus: 8, cpus: 64, memory: 512Gi}}

# Where the parent listens for its own workers; a Slurm compute node or a pod must reach it.
# Default: 127.0.0.1 on a free port, right for the process and docker launchers.
# worker_endpoint: {{host: 127.0.0.1, port: 0}}
"""

_RUNTIME_HEADER = """\
# local/study_runtime.yaml: what each study's jobs may use at this site. Owned by the site
# operator and re-read at every launch; a job of a study not listed here is refused.
# Datasets are mounted at /data/<study>/<dataset> (a process launcher with `sandbox: none`
# passes the host paths in ATOLL_DATASETS instead). Secrets are references only: never write a
# secret value here.
format_version: 2
"""

_STUDY_EXAMPLE = """\
    # source: a host path (process, docker, slurm) or a PVC name (k8s); mode ro or rw.
    datasets: {{}}  # e.g. {{slides: {{source: /srv/data/{study}/slides, mode: ro}}}}
    env: {{}}  # e.g. {{LOG_LEVEL: info}}
    # A variable of the site parent's environment (k8s: {{source: SECRET_NAME, key: KEY}}):
    # secret_env: {{DB_PASSWORD: {{source: env, key: {env}_DB_PASSWORD}}}}
    # The worker image (docker, k8s, slurm with a container sandbox):
    # container: {{image: registry.example.org/{study}-trainer:1.0}}
    # What federated statistics may reveal here (default min_count 10, no noise):
    # statistics: {{min_count: 10, noise: 0.0}}
"""

_NO_STUDY = """\
studies: {}
# This site is in no study yet. When a project admin enrols it (`atoll study add-site`), map
# the study here, for example:
# studies:
#   pathology:
#     datasets: {slides: {source: /srv/data/pathology/slides, mode: ro}}
"""


def site_yaml(who: str = "site") -> str:
    """``who`` is "site" or "server" (the server runs its workflow workers the same way)."""
    return _SITE_HEADER.format(who=who) + "\n" + _SITE_BODY.format(who=who)


def _yaml_key(name: str) -> str:
    # A study named "yes", "null" or "123" must stay a string key.
    return name if yaml.safe_load(name) == name else f'"{name}"'


_DEFAULT_STUDY = """\
  # default: the one study of a project that defines no named studies (every site and user
  # is in it). A project with named studies has no default study: remove this entry then.
  default: {}
"""


def study_runtime_yaml(studies: list[str], default_study: bool = True) -> str:
    """``default_study``: map the `default` study, which exists only in a project without
    named studies (server/studies.py)."""
    default = _DEFAULT_STUDY if default_study else ""
    if not studies:
        if not default:
            return _RUNTIME_HEADER + _NO_STUDY
        return _RUNTIME_HEADER + "studies:\n" + default + _NO_STUDY.replace("studies: {}\n", "")
    blocks = []
    for study in studies:
        env = study.upper().replace("-", "_")
        env = f"STUDY_{env}" if env[0].isdigit() else env  # keep the example a valid name
        blocks.append(f"  {_yaml_key(study)}:\n" + _STUDY_EXAMPLE.format(study=study, env=env))
    return _RUNTIME_HEADER + "studies:\n" + default + "\n".join(blocks)


def authorization_json() -> str:
    """A site's ``local/authorization.json``: the default policy, written out so that the
    operator sees and edits it (spec/authorization.py; docs/site-config.md)."""
    import json

    from atoll.spec.authorization import DEFAULT_POLICY_DOC

    doc = {"_comment": [
        "Who may run jobs at this site, in NVIDIA FLARE's authorization.json format. This is "
        "atoll's default: every role that may submit runs its code here. Conditions: any, none, "
        "o:site (the user's org is this site's), o:submitter, n:submitter. Set code_approval to "
        "required to run only jobs approved with `atoll site approve`. Per-study rules go in "
        "studies.<study>. See docs/site-config.md."], **DEFAULT_POLICY_DOC}
    return json.dumps(doc, indent=2) + "\n"
