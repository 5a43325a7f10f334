"""The study registry: which sites and users belong to which study, and who may see what.

`default` is the implicit study of every site and every user (jobs submitted without a study);
it cannot be created or removed. Other studies are seeded from project.yaml at the server's first
start and changed at run time by project admins (and org admins within their org).
"""

from __future__ import annotations

import re
from typing import Any

from atoll.pki.identity import Identity
from atoll.server.store import JobStore

DEFAULT = "default"
STUDY_NAME = re.compile(r"^[a-z0-9](?:[a-z0-9_-]{0,61}[a-z0-9])?$")
SUBMIT_ROLES = ("project_admin", "org_admin", "lead")


class Denied(Exception):
    """The caller may not do this; the message says why."""


class NoSuchStudy(Denied):
    pass


class Studies:
    def __init__(self, store: JobStore):
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

    # -- membership ---------------------------------------------------------------------------
    def exists(self, study: str) -> bool:
        return study == DEFAULT or study in self.store.studies()

    def sites(self, study: str) -> list[str]:
        if study == DEFAULT:
            return [p["name"] for p in self.store.participants("site")]
        return self.store.members(study, "site")

    def users(self, study: str) -> list[str]:
        if study == DEFAULT:
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
        if study == DEFAULT or who.role == "project_admin":
            return True
        if who.name in self.users(study):
            return True
        if who.role == "org_admin":
            return any(self.org_of(site) == who.org for site in self.sites(study))
        return False

    def require_member(self, who: Identity, study: str) -> None:
        if not self.can_see(who, study):
            # Same words for "absent" and "not yours": a study's existence is not leaked.
            raise Denied(f"{who.name} is not a member of study {study!r}; ask a project admin "
                         f"to add you (`atoll study add-user {study} {who.name}`)")

    def visible(self, who: Identity) -> list[str]:
        return [s for s in [DEFAULT, *self.store.studies()] if self.can_see(who, s)]

    def remember_site(self, name: str, org: str) -> None:
        """A site with a valid certificate that was added after provisioning."""
        self.store.upsert_participant(name, "site", org)

    def remember_user(self, who: Identity) -> None:
        self.store.upsert_participant(who.name, "admin", who.org, who.role or "")
