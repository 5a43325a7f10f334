"""A site's ``local/authorization.json``: who may run what at this site, in NVIDIA FLARE's
format (``format_version`` "1.0", ``permissions`` per role) with two atoll extensions.

    {"format_version": "1.0",
     "permissions": {"project_admin": "any",
                     "lead": {"submit_job": "o:site", "byoc": "o:site",
                              "manage_job": "n:submitter", "download_job": "n:submitter"}},
     "code_approval": "none",
     "studies": {"pathology": {"permissions": {...}, "code_approval": "required"}}}

A role's entry is a condition for every right (``"any"``) or a condition per right. A role or a
right that is not listed is not granted (as in FLARE). Conditions are evaluated with the user's
name, org and role from their verified certificate (for a job: the signer's):

- ``any``, ``none``;
- ``o:site``: the user's org is this site's org (from the site's own certificate);
- ``o:submitter``: the user's org is the org of the job's submitter;
- ``n:submitter``: the user is the job's submitter.

Rights: ``submit_job`` (a job of this user may run here) and ``byoc`` (its own code may run
here: every atoll job brings code, so a site checks both before it launches anything);
``manage_job`` and ``download_job`` (aborting and downloading a job that ran here: the server
enforces them on the site's behalf, from the policy the site sends when it connects). FLARE's
``view``, ``clone_job``, ``operate`` and ``shell_commands`` are accepted and have no effect.

Extensions: ``studies.<study>`` replaces the entries of the roles it names for that study's
jobs; ``code_approval: required`` (top level or per study) runs only jobs whose content digest
the operator approved (`atoll site approve`). Keys starting with ``_`` are comments.

No file means DEFAULT_POLICY, which keeps atoll's behaviour from before policies existed. Pure
Python (no pydantic): a parent reads it at start and at every launch.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from atoll.spec.errors import Issue, SpecError

AUTHORIZATION_FILE = "authorization.json"
FORMAT_VERSION = "1.0"
ROLES = ("project_admin", "org_admin", "lead", "member")  # == pki.identity.ROLES (tested)
SITE_RIGHTS = ("submit_job", "byoc")  # checked by the site before it launches a job
SERVER_RIGHTS = ("manage_job", "download_job")  # enforced by the server for the site
NO_EFFECT_RIGHTS = ("view", "clone_job", "operate", "shell_commands")  # FLARE's, accepted
RIGHTS = SITE_RIGHTS + SERVER_RIGHTS + NO_EFFECT_RIGHTS
CONDITIONS = ("any", "none", "o:site", "o:submitter", "n:submitter")
APPROVAL_MODES = ("none", "required")
MAX_BYTES = 1024 * 1024

# What atoll did before sites had policies: every submitting role runs code everywhere; a job
# is managed by its submitter, org admins of the submitter's org and project admins.
DEFAULT_PERMISSIONS: dict[str, Any] = {
    "project_admin": "any",
    "org_admin": {"submit_job": "any", "byoc": "any", "manage_job": "o:submitter",
                  "download_job": "o:submitter"},
    "lead": {"submit_job": "any", "byoc": "any", "manage_job": "n:submitter",
             "download_job": "n:submitter"},
    "member": {},
}


@dataclass(frozen=True)
class Actor:
    name: str
    org: str
    role: str | None


@dataclass(frozen=True)
class Decision:
    allowed: bool
    rule: str  # where the decision came from, e.g. permissions.lead.submit_job
    reason: str  # one sentence: the rule's condition and the facts it was checked against


@dataclass(frozen=True)
class StudyPolicy:
    permissions: dict[str, dict[str, str]] = field(default_factory=dict)
    code_approval: str | None = None


@dataclass(frozen=True)
class Policy:
    permissions: dict[str, dict[str, str]]  # role -> right -> condition ("*" = every right)
    code_approval: str = "none"
    studies: dict[str, StudyPolicy] = field(default_factory=dict)
    source: str = f"local/{AUTHORIZATION_FILE}"

    def approval_required(self, study: str) -> bool:
        block = self.studies.get(study)
        mode = block.code_approval if block and block.code_approval else self.code_approval
        return mode == "required"

    def decide(self, right: str, study: str, user: Actor, submitter: Actor,
               site_org: str) -> Decision:
        role = user.role or ""
        block = self.studies.get(study)
        if block is not None and role in block.permissions:
            entry, where = block.permissions[role], f"studies.{study}.permissions.{role}"
        elif role in self.permissions:
            entry, where = self.permissions[role], f"permissions.{role}"
        else:
            return Decision(False, "permissions", f"{self.source} grants role {role!r} nothing "
                                                  f"(permissions has no entry for it)")
        condition = entry.get("*", entry.get(right))
        rule = where if "*" in entry else f"{where}.{right}"
        if condition is None:
            return Decision(False, where, f"{self.source} {where} does not grant {right}")
        allowed, facts = _holds(condition, user, submitter, site_org)
        verdict = "allows" if allowed else "refuses"
        return Decision(allowed, rule, f"{self.source} {rule} is {condition!r}: {facts}; it "
                                       f"{verdict} {right} to {user.name} (role {role}, org "
                                       f"{user.org})")

    def summary(self) -> dict[str, Any]:
        """The part the server enforces for the site (manage_job, download_job), in this
        file's own format: what the site announces when it connects."""
        def rights(permissions: dict[str, dict[str, str]]) -> dict[str, Any]:
            return {role: entry["*"] if "*" in entry else
                    {r: c for r, c in entry.items() if r in SERVER_RIGHTS}
                    for role, entry in permissions.items()}

        return {"format_version": FORMAT_VERSION, "permissions": rights(self.permissions),
                "studies": {s: {"permissions": rights(b.permissions)}
                            for s, b in self.studies.items() if b.permissions}}


def _holds(condition: str, user: Actor, submitter: Actor, site_org: str) -> tuple[bool, str]:
    if condition == "any":
        return True, "anyone"
    if condition == "none":
        return False, "no one"
    if condition == "o:site":
        return user.org == site_org, (f"{user.name}'s org {user.org!r} "
                                      f"{'is' if user.org == site_org else 'is not'} this "
                                      f"site's org {site_org!r}")
    if condition == "o:submitter":
        same = user.org == submitter.org
        return same, (f"{user.name}'s org {user.org!r} {'is' if same else 'is not'} the org of "
                      f"the job's submitter {submitter.name} ({submitter.org!r})")
    same = user.name == submitter.name  # n:submitter
    return same, (f"{user.name} {'is' if same else 'is not'} the job's submitter "
                  f"{submitter.name}")


DEFAULT_POLICY_DOC: dict[str, Any] = {
    "format_version": FORMAT_VERSION,
    "permissions": DEFAULT_PERMISSIONS,
    "code_approval": "none",
}


def default_policy() -> Policy:
    return parse_policy(DEFAULT_POLICY_DOC, "the default policy")


def load_policy(local_dir: Path) -> Policy:
    """``local_dir``/authorization.json, or the default policy when there is none."""
    path = Path(local_dir) / AUTHORIZATION_FILE
    label = f"local/{AUTHORIZATION_FILE}"
    try:
        with open(path, "rb") as fh:
            raw = fh.read(MAX_BYTES + 1)
    except FileNotFoundError:
        return default_policy()
    except OSError as exc:
        raise SpecError([Issue("", f"cannot read it: {exc.strerror}")], label) from None
    if len(raw) > MAX_BYTES:
        raise SpecError([Issue("", f"is over {MAX_BYTES:,} bytes")], label)
    try:
        doc = json.loads(raw.decode("utf-8"))
    except (UnicodeDecodeError, ValueError, RecursionError) as exc:
        raise SpecError([Issue("", f"is not valid JSON: {exc}")], label) from None
    return parse_policy(doc, label)


def parse_policy(doc: Any, label: str = f"local/{AUTHORIZATION_FILE}") -> Policy:
    """A validated policy; SpecError lists every problem with its path."""
    issues: list[Issue] = []
    if not isinstance(doc, dict):
        raise SpecError([Issue("", "must be a JSON object with format_version and "
                                   "permissions")], label)
    known = {"format_version", "permissions", "code_approval", "studies"}
    for key in doc:
        if key not in known and not str(key).startswith("_"):
            issues.append(Issue(str(key), f"unknown key; use {', '.join(sorted(known))} (keys "
                                          "starting with '_' are comments)"))
    if doc.get("format_version") != FORMAT_VERSION:
        issues.append(Issue("format_version", f"must be {FORMAT_VERSION!r} (FLARE's format), "
                                              f"not {doc.get('format_version')!r}"))
    if "permissions" not in doc:
        issues.append(Issue("permissions", "is required: the rights of each role"))
    permissions = _permissions(doc.get("permissions", {}), "permissions", issues)
    approval = _approval(doc.get("code_approval", "none"), "code_approval", issues) or "none"
    studies: dict[str, StudyPolicy] = {}
    raw_studies = doc.get("studies", {})
    if not isinstance(raw_studies, dict):
        issues.append(Issue("studies", "must be an object: study name -> its block"))
        raw_studies = {}
    for study, block in raw_studies.items():
        where = f"studies.{study}"
        if not isinstance(block, dict):
            issues.append(Issue(where, "must be an object with permissions and/or "
                                       "code_approval"))
            continue
        for key in block:
            if key not in ("permissions", "code_approval") and not str(key).startswith("_"):
                issues.append(Issue(f"{where}.{key}", "unknown key; use permissions or "
                                                      "code_approval"))
        studies[study] = StudyPolicy(
            _permissions(block.get("permissions", {}), f"{where}.permissions", issues),
            _approval(block["code_approval"], f"{where}.code_approval", issues)
            if "code_approval" in block else None)
    if issues:
        raise SpecError(issues, label)
    return Policy(permissions, approval, studies, label)


def _permissions(raw: Any, where: str, issues: list[Issue]) -> dict[str, dict[str, str]]:
    if not isinstance(raw, dict):
        issues.append(Issue(where, "must be an object: role -> condition, or role -> "
                                   "{right: condition}"))
        return {}
    out: dict[str, dict[str, str]] = {}
    for role, entry in raw.items():
        at = f"{where}.{role}"
        if role not in ROLES:
            issues.append(Issue(at, f"{role!r} is not a role; use {', '.join(ROLES)}"))
            continue
        if isinstance(entry, str):
            if _condition(entry, at, issues):
                out[role] = {"*": entry}
            continue
        if not isinstance(entry, dict):
            issues.append(Issue(at, "must be a condition or an object {right: condition}"))
            continue
        rights: dict[str, str] = {}
        for right, condition in entry.items():
            if right not in RIGHTS:
                issues.append(Issue(f"{at}.{right}", f"{right!r} is not a right; use "
                                                     f"{', '.join(RIGHTS)}"))
            elif _condition(condition, f"{at}.{right}", issues):
                rights[right] = condition
        out[role] = rights
    return out


def _condition(value: Any, at: str, issues: list[Issue]) -> bool:
    if value in CONDITIONS:
        return True
    issues.append(Issue(at, f"{value!r} is not a condition; use {', '.join(CONDITIONS)}"))
    return False


def _approval(value: Any, at: str, issues: list[Issue]) -> str | None:
    if value in APPROVAL_MODES:
        return value
    issues.append(Issue(at, f"{value!r} is not a mode; use 'none' or 'required' (run only jobs "
                            "approved with `atoll site approve`)"))
    return None


def ignored_rights(policy: Policy) -> list[str]:
    """Paths of rights that have no effect in atoll (FLARE's view, clone_job, ...)."""
    found = []
    blocks = [("permissions", policy.permissions)] + [
        (f"studies.{s}.permissions", b.permissions) for s, b in policy.studies.items()]
    for where, permissions in blocks:
        for role, entry in permissions.items():
            found += [f"{where}.{role}.{r}" for r in entry if r in NO_EFFECT_RIGHTS]
    return found
