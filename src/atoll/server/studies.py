"""The study registry: which sites and users belong to which study, and who may see what.

Studies are seeded from project.yaml at the server's first start and changed at run time by
project admins (and org admins within their org).

`default` is the one study of a project without named studies: while the registry holds no
study, `default` holds every site and user, including those added later. It never crosses
study boundaries: once a named study exists (in project.yaml or created at run time) nobody is
in `default` implicitly. If jobs were run in it, it stays as an ordinary study with no members
(its jobs keep their records; a project admin adds members or leaves it be); otherwise it is
gone. `settle_default` makes that so at every start (the migration of a workspace from before)
and whenever a study is created.
"""

from __future__ import annotations

import re
from typing import Any, Protocol

from atoll.pki.identity import Identity
from atoll.server.store import Store
from atoll.spec.errors import EXIT_INVALID, AtollError

DEFAULT = "default"
STUDY_NAME = re.compile(r"^[a-z0-9](?:[a-z0-9_-]{0,61}[a-z0-9])?$")
SUBMIT_ROLES = ("project_admin", "org_admin", "lead")


class Denied(AtollError):
    """The caller may not do this; the message says why."""

    exit_code = EXIT_INVALID


class NoSuchStudy(Denied):
    pass


class StudySites(Protocol):
    """The sites enrolled in a study (what the scheduler and intake ask of Studies)."""

    def sites(self, study: str) -> list[str]: ...


class Members(StudySites, Protocol):
    """Who is in which study (what the admin service and the signature check ask of Studies)."""

    def require_member(self, who: Identity, study: str) -> None: ...

    def remember_user(self, who: Identity) -> None: ...

    def visible(self, who: Identity) -> list[str]: ...


class Studies:
    def __init__(self, store: Store):
        self.store = store

    def seed(self, project: dict[str, Any]) -> None:
        """Load participants and studies from the provisioned project (first start only)."""
        for site in project.get("sites", []):
            self.store.upsert_participant(site["name"], "site", site.get("org", ""))
        for user in project.get("users", []):
            self.store.upsert_participant(user["name"], "admin", user.get("org", ""),
                                          user.get("role", ""))
        for name, study in (project.get("studies") or {}).items():
            if self.store.add_study(name):
                for site in study.get("sites", []):
                    self.store.set_member(name, site, "site", True)
                for user in study.get("admins", []):
                    self.store.set_member(name, user, "user", True)

    def default_open(self) -> bool:
        """`default` holds everyone: the registry has no study at all."""
        return not self.store.studies()

    def settle_default(self) -> bool:
        """Keep `default`, with no members, where named studies exist and it has jobs; True
        when it was made an ordinary study now."""
        if self.default_open() or DEFAULT in self.store.studies():
            return False
        return bool(self.store.count_jobs(DEFAULT)) and self.store.add_study(DEFAULT)

    def _everyone(self, study: str) -> bool:
        return study == DEFAULT and self.default_open()

    # -- membership ---------------------------------------------------------------------------
    def exists(self, study: str) -> bool:
        return self._everyone(study) or study in self.store.studies()

    def sites(self, study: str) -> list[str]:
        if self._everyone(study):
            return [p["name"] for p in self.store.participants("site")]
        return self.store.members(study, "site")

    def users(self, study: str) -> list[str]:
        if self._everyone(study):
            return [p["name"] for p in self.store.participants("admin")]
        return self.store.members(study, "user")

    def org_of(self, name: str) -> str:
        for participant in self.store.participants():
            if participant["name"] == name:
                return participant["org"]
        return ""

    def can_see(self, who: Identity, study: str) -> bool:
        if not self.exists(study):
            return False
        if self._everyone(study) or who.role == "project_admin":
            return True
        if who.name in self.users(study):
            return True
        if who.role == "org_admin":
            return any(self.org_of(site) == who.org for site in self.sites(study))
        return False

    def require_member(self, who: Identity, study: str) -> None:
        if study == DEFAULT and not self.exists(DEFAULT):
            # Every session without a study asks for `default`: say how to choose one.
            yours = ", ".join(self.visible(who)) or "none yet (ask a project admin to add you)"
            raise Denied(f"this federation has named studies and no default study; choose "
                         f"yours with `atoll login --study NAME` (or --study NAME for one "
                         f"command); your studies: {yours}")
        if who.role == "project_admin" and not self.exists(study):
            # A project admin sees every study: "absent" leaks nothing to them.
            raise NoSuchStudy(f"no such study: {study}; studies: "
                              f"{', '.join(self.visible(who)) or 'none'} (`atoll study create "
                              f"{study}` makes it)")
        if not self.can_see(who, study):
            # Same words for "absent" and "not yours": a study's existence is not leaked.
            raise Denied(f"{who.name} is not a member of study {study!r}; ask a project admin "
                         f"to add you (`atoll study add-user {study} {who.name}`)")

    def visible(self, who: Identity) -> list[str]:
        named = self.store.studies()
        return [s for s in (named or [DEFAULT]) if self.can_see(who, s)]

    def remember_site(self, name: str, org: str) -> None:
        """A site with a valid certificate that was added after provisioning."""
        self.store.upsert_participant(name, "site", org)

    def remember_user(self, who: Identity) -> None:
        self.store.upsert_participant(who.name, "admin", who.org, who.role or "")
