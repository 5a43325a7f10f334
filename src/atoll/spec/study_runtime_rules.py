"""Rules of ``study_runtime.yaml`` that span fields, checked on the raw document (so that they
join the field errors of ``spec.study_runtime``): study names, a name in both ``env`` and
``secret_env``, two secret mounts at one ``mount_path``."""

from __future__ import annotations

from typing import Any

from atoll.spec.errors import Issue, join_path
from atoll.spec.names import check_label, is_label


def cross_issues(data: dict[str, Any]) -> list[Issue]:
    """Rules spanning fields, checked on the raw document so they join the field errors."""
    issues: list[Issue] = []
    studies = data.get("studies")
    if not isinstance(studies, dict):
        return issues
    for study, entry in studies.items():
        if not is_label(study):
            try:
                check_label(str(study))
            except ValueError as err:
                issues.append(Issue(join_path("studies", str(study)), str(err)))
        if not isinstance(entry, dict):
            continue
        env, secret_env = entry.get("env"), entry.get("secret_env")
        if isinstance(env, dict) and isinstance(secret_env, dict):
            for name in env.keys() & secret_env.keys():
                issues.append(
                    Issue(
                        join_path("studies", study, "secret_env", name),
                        (f"{name} is also in env; keep it in one of env or secret_env"),
                    )
                )
        mounts = entry.get("secret_mounts")
        if isinstance(mounts, dict):
            seen: dict[str, str] = {}
            for name, mount in mounts.items():
                path = mount.get("mount_path") if isinstance(mount, dict) else None
                if isinstance(path, str) and path.rstrip("/") in seen:
                    issues.append(
                        Issue(
                            join_path("studies", study, "secret_mounts", name, "mount_path"),
                            f"same mount_path as {seen[path.rstrip('/')]!r}; pick another",
                        )
                    )
                elif isinstance(path, str):
                    seen[path.rstrip("/")] = name
    return issues
