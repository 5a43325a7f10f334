"""Study management at run time: create, show, list, enrol or remove sites and users, remove.

Who may do what: project admins manage every study; an org admin sees the studies that include
a site of its org and may enrol or remove its own org's sites and users in them; everybody else
sees only the studies they belong to and changes nothing. Every change is audited.
"""

from __future__ import annotations

from typing import Any

from atoll.pki.identity import Identity
from atoll.server.studies import DEFAULT, STUDY_NAME, Denied


def study_ops(parent) -> dict[str, Any]:
    return StudyOps(parent).table()


class StudyOps:
    def __init__(self, parent):
        self.parent = parent
        self.studies = parent.studies
        self.store = parent.store

    def table(self) -> dict[str, Any]:
        return {
            "study_list": self.list, "study_show": self.show, "study_create": self.create,
            "study_remove": self.remove, "study_add_site": self.add_site,
            "study_remove_site": self.remove_site, "study_add_user": self.add_user,
            "study_remove_user": self.remove_user,
        }

    # -- helpers ----------------------------------------------------------------------------------
    def _name(self, body: dict[str, Any]) -> str:
        name = str(body.get("name", ""))
        if not STUDY_NAME.match(name):
            raise ValueError(f"study name {name!r} is invalid: lowercase letters, digits, '-' and "
                             "'_', starting and ending with a letter or digit, at most 63 chars")
        return name

    def _visible(self, who: Identity, name: str) -> None:
        if not self.studies.can_see(who, name):
            raise Denied(f"no such study: {name}")

    def _changeable(self, who: Identity, name: str, member_org: str, what: str) -> None:
        self._visible(who, name)
        if name == DEFAULT:
            raise Denied("the default study holds every site and user; it cannot be changed")
        if who.role == "project_admin":
            return
        if who.role == "org_admin" and member_org == who.org:
            return
        raise Denied(f"{who.name} ({who.role}) may not change {what} of study {name}: project "
                     "admins may, and org admins for their own org's sites and users")

    def _known(self, name: str, kind: str) -> dict[str, str]:
        for participant in self.store.participants(kind):
            if participant["name"] == name:
                return participant
        noun = "site" if kind == "site" else "user"
        raise ValueError(f"{name!r} is not a provisioned {noun}; provision it first "
                         f"(`atoll provision add-{noun}`)")

    def _audit(self, who: Identity, action: str, target: str, detail: str = "") -> None:
        self.store.audit(who.name, who.org, who.role or "", target.split(":")[0], action, target,
                         "ok", detail)

    def _describe(self, name: str) -> dict[str, Any]:
        return {"name": name, "sites": self.studies.sites(name),
                "users": self.studies.users(name), "jobs": self.store.count_jobs(name)}

    # -- operations -----------------------------------------------------------------------------
    def list(self, who, study, body):
        return {"studies": [self._describe(s) for s in self.studies.visible(who)]}

    def show(self, who, study, body):
        name = str(body.get("name", ""))
        self._visible(who, name)
        return self._describe(name)

    def create(self, who, study, body):
        name = self._name(body)
        if who.role != "project_admin":
            raise Denied(f"{who.name} ({who.role}) may not create studies; project admins may")
        if name == DEFAULT or self.studies.exists(name):
            raise ValueError(f"study {name!r} already exists")
        sites = [self._known(s, "site")["name"] for s in body.get("sites") or []]
        users = [self._known(u, "admin")["name"] for u in body.get("users") or []]
        self.store.add_study(name)
        for site in sites:
            self.store.set_member(name, site, "site", True)
        for user in users:
            self.store.set_member(name, user, "user", True)
        self._audit(who, "study_create", name, f"sites={sites} users={users}")
        return self._describe(name)

    def remove(self, who, study, body):
        name = str(body.get("name", ""))
        self._visible(who, name)
        if who.role != "project_admin" or name == DEFAULT:
            raise Denied(f"{who.name} ({who.role}) may not remove study {name}"
                         + ("" if name != DEFAULT else ": the default study always exists"))
        jobs = self.store.count_jobs(name)
        if jobs:
            raise Denied(f"study {name} still has {jobs} job(s); a study with jobs keeps their "
                         "records and cannot be removed")
        self.store.remove_study(name)
        self._audit(who, "study_remove", name)
        return {"removed": name}

    def _member(self, who, body, kind: str, present: bool):
        name = str(body.get("name", ""))
        key = "site" if kind == "site" else "user"
        member = str(body.get(key, ""))
        participant = self._known(member, "site" if kind == "site" else "admin")
        self._changeable(who, name, participant["org"], f"the {key}s")
        self.store.set_member(name, member, kind, present)
        self._audit(who, f"study_{'add' if present else 'remove'}_{key}", name, member)
        return self._describe(name)

    def add_site(self, who, study, body):
        return self._member(who, body, "site", True)

    def remove_site(self, who, study, body):
        return self._member(who, body, "site", False)

    def add_user(self, who, study, body):
        return self._member(who, body, "user", True)

    def remove_user(self, who, study, body):
        return self._member(who, body, "user", False)
