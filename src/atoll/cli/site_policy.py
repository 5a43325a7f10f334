"""A site's policy from the command line: ``atoll site approve``, and the policy parts of
``atoll site validate`` and ``atoll site render`` (cli/site_render.py).

    atoll site approve SITE_DIR JOB_DIR [--format json|text]

records the content digest of JOB_DIR (every file of the job, meta.json included: the digest
its submitter's signature covers) in SITE_DIR's ``local/approved_jobs.json``. A site whose
``local/authorization.json`` sets ``code_approval: required`` runs only approved digests.
Exit codes: 0 approved (or approved already), 2 the job folder or the site's files are invalid.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import click

from atoll.cli.common import Problem, error_problems, fail, printable, render_error

_dir = click.Path(exists=True, file_okay=False, path_type=Path)
POLICY_FILE = "local/authorization.json"


def load_site_policy(site_dir: Path) -> tuple[Any, list[Problem]]:
    """SITE_DIR's policy (the default one when it has no file) and its problems."""
    from atoll.spec.authorization import load_policy
    from atoll.spec.errors import SpecError

    try:
        return load_policy(site_dir / "local"), []
    except SpecError as err:
        return None, error_problems(err, POLICY_FILE)


def load_privacy_policy(site_dir: Path) -> tuple[Any, list[Problem]]:
    """SITE_DIR's local/privacy.yaml (None when absent) and its problems."""
    from atoll.spec.errors import SpecError
    from atoll.spec.privacy import POLICY_FILE as PRIVACY_FILE
    from atoll.spec.privacy import load_site_policy as load_privacy

    try:
        return load_privacy(site_dir / "local"), []
    except SpecError as err:
        return None, error_problems(err, f"local/{PRIVACY_FILE}")


def privacy_line(policy: Any) -> str:
    if policy is None:
        return "local/privacy.yaml: absent, no privacy requirement"
    need = policy.require
    rules = [f"{k} {v}" for k, v in need.model_dump().items() if v not in (None, [], False)]
    if policy.budget is not None:
        rules.append(f"budget epsilon {policy.budget.epsilon} at delta {policy.budget.delta}")
    if policy.secure_aggregation is not None:
        rules.append("secure aggregation with at least "
                     f"{policy.secure_aggregation.min_participants} sites")
    return f"local/privacy.yaml: ok; requires {', '.join(rules) or 'nothing'}"


def policy_report(site_dir: Path, policy: Any) -> dict[str, Any]:
    """What validate says about a valid policy."""
    from atoll.spec.authorization import AUTHORIZATION_FILE, ignored_rights

    studies = {s: "required" for s in policy.studies if policy.approval_required(s)}
    return {"file": (site_dir / "local" / AUTHORIZATION_FILE).exists(),
            "code_approval": policy.code_approval, "code_approval_studies": studies,
            "no_effect": ignored_rights(policy)}


def policy_lines(report: dict[str, Any]) -> list[str]:
    where = POLICY_FILE if report["file"] else f"{POLICY_FILE}: absent, atoll's default policy"
    lines = [f"{where}: ok; code approval: {report['code_approval']}"
             + "".join(f", study {s}: required" for s in report["code_approval_studies"])]
    if report["no_effect"]:
        lines.append(f"  no effect in atoll (FLARE rights): {', '.join(report['no_effect'])}")
    return lines


def site_org(site_dir: Path) -> str:
    """The org in SITE_DIR's certificate, or '' for a folder that holds only local/."""
    from atoll.pki.kit import KitError, load_kit

    try:
        return load_kit(site_dir).org
    except (KitError, OSError, ValueError):
        return ""


def job_decision(site_dir: Path, policy: Any, job_dir: Path, study: str, user: Any,
                 org: str) -> tuple[dict[str, Any], list[Problem]]:
    """Would this site run JOB_DIR submitted by ``user`` in ``study``: (what render reports,
    the refusals as problems)."""
    from atoll.pki.job_signature import SignatureError, content_digest, manifest_of_tree
    from atoll.site.approvals import ApprovalsError, is_approved
    from atoll.spec.authorization import SITE_RIGHTS

    rules, problems = [], []
    for right in SITE_RIGHTS:
        decision = policy.decide(right, study, user, user, org)
        rules.append({"right": right, "allowed": decision.allowed, "rule": decision.rule,
                      "reason": decision.reason})
        if not decision.allowed:
            hint = "" if org else (" (SITE_DIR holds no certificate, so this site's org is "
                                   "unknown: pass the site's kit folder)")
            problems.append({"file": POLICY_FILE, "path": decision.rule,
                             "message": f"refused: {decision.reason}{hint}"})
    out: dict[str, Any] = {"user": user.name, "org": user.org, "role": user.role,
                           "rules": rules, "code_approval": policy.approval_required(study)}
    if out["code_approval"]:
        try:
            digest = content_digest(manifest_of_tree(job_dir))
            out["digest"], out["approved"] = digest, is_approved(site_dir / "local", digest)
        except (SignatureError, ApprovalsError, OSError) as err:
            problems += error_problems(err)
            return out, problems
        if not out["approved"]:
            problems.append({"file": "local/approved_jobs.json", "path": "", "message": (
                f"job content {digest} is not approved; after review, approve it with "
                f"`atoll site approve {site_dir} {job_dir}`")})
    out["allowed"] = not problems
    return out, problems


@click.command("approve")
@click.argument("site_dir", type=_dir)
@click.argument("job_dir", type=_dir)
@click.option("--format", "fmt", type=click.Choice(["json", "text"]), default="text",
              show_default=True, help="json keeps stdout machine-readable.")
def approve_command(site_dir: Path, job_dir: Path, fmt: str) -> None:
    """Approve the code of JOB_DIR at SITE_DIR: record its content digest in local/.

    Review the whole folder first: the digest covers every file and meta.json, so a job
    submitted with exactly this content runs here, and any change needs a new approval."""
    from atoll.pki.job_signature import SignatureError, content_digest, manifest_of_tree
    from atoll.site.approvals import ApprovalsError, approve
    from atoll.spec.errors import SpecError
    from atoll.spec.meta import load_meta

    if not (site_dir / "local").is_dir():
        fail(f"{site_dir} has no local/ folder; pass a site's kit folder")
    try:
        name = load_meta(job_dir).name
        digest = content_digest(manifest_of_tree(job_dir))
        added = approve(site_dir / "local", digest, name)
    except (SpecError, SignatureError, ApprovalsError) as err:
        render_error(err)
    except OSError as err:
        fail(f"cannot read {job_dir} or write {site_dir}/local: {err.strerror}")
    policy, problems = load_site_policy(site_dir)
    required = policy is not None and (policy.code_approval == "required" or any(
        policy.approval_required(s) for s in policy.studies))
    if fmt == "json":
        click.echo(json.dumps({"digest": digest, "name": name, "added": added,
                               "approval_required": required}))
        return
    state = "approved" if added else "already approved"
    click.echo(f"{state}: job {printable(name)!r}, content {digest}")
    if problems:
        click.echo(f"note: {POLICY_FILE} is invalid; `atoll site validate {site_dir}`", err=True)
    elif not required:
        click.echo(f"note: {POLICY_FILE} does not set code_approval: required, so this site "
                   "runs every job its policy permits, approved or not", err=True)
