"""Study management at run time: create, show, list, enrol or remove sites and users, remove.

Who may do what: project admins manage every study; an org admin sees the studies that include
a site of its org and may enrol or remove its own org's sites and users in them; everybody else
sees only the studies they belong to and changes nothing. Every change is audited.

Authorization comes before existence: a caller who may not make a change is refused in the same
words whether the study, the site or the user exists or not, so answers never tell them which
names exist. Only a project admin, who may see them all, is told what is missing.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from atoll.pki.identity import Identity
from atoll.server.studies import DEFAULT, STUDY_NAME, Denied

if TYPE_CHECKING:
    from atoll.server.store import Store
    from atoll.server.studies import Studies


# A certificate (PEM) -> the identity it proves: issued by the project's CA, valid, not revoked;
# raises ValueError otherwise.
Certified = Callable[[bytes], Identity]


def study_ops(studies: Studies, store: Store, certified: Certified) -> dict[str, Any]:
    return StudyOps(studies, store, certified).table()


class StudyOps:
    """Receives the studies it manages, the store it audits and counts jobs in, and the check
    of a participant's certificate (a user provisioned since, who has not logged in yet)."""

    def __init__(self, studies: Studies, store: Store, certified: Certified):
        self.studies = studies
        self.store = store
        self.certified = certified

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

    def _changeable(self, who: Identity, name: str, member: str, kind: str, what: str) -> None:
        """Refused unless `who` may change `what` of study `name` for `member`: one answer for
        every reason a project admin would not be told more about."""
        refusal = Denied(f"{who.name} ({who.role}) may not change {what} of study {name}: "
                         "project admins may, and org admins for their own org's sites and users "
                         "in the studies they see")
        if who.role not in ("project_admin", "org_admin"):
            raise refusal
        if name == DEFAULT and self.studies.default_open():  # everybody knows it exists
            raise Denied("the default study holds every site and user while the project has no "
                         "named studies; create studies (`atoll study create`) to scope them")
        if who.role == "project_admin":
            if not self.studies.exists(name):
                raise Denied(f"no such study: {name}")
            self._known(member, kind)
            return
        participant = self._find(member, kind)
        if (participant is None or participant["org"] != who.org
                or not self.studies.can_see(who, name)):
            raise refusal

    def _find(self, name: str, kind: str) -> dict[str, str] | None:
        for participant in self.store.participants(kind):
            if participant["name"] == name:
                return participant
        return None

    def _known(self, name: str, kind: str) -> dict[str, str]:
        participant = self._find(name, kind)
        if participant is not None:
            return participant
        noun = "site" if kind == "site" else "user"
        raise ValueError(f"{name!r} is not a provisioned {noun}: the server has not seen it yet; "
                         f"provision it (`atoll provision add-{noun}`) and pass its certificate "
                         f"(`--cert KIT/startup/client.crt`; found by itself in a kit folder "
                         f"next to your own)")

    def _learn(self, who: Identity, member: str, kind: str, cert: Any) -> None:
        """Register ``member`` from its certificate, when the caller sent one and may manage
        that participant: a user or site provisioned since the server started is enrolled
        before it ever connects."""
        if not isinstance(cert, str) or self._find(member, kind) is not None:
            return
        try:
            identity = self.certified(cert.encode("ascii"))
        except (ValueError, UnicodeEncodeError) as exc:
            raise ValueError(f"--cert for {member!r}: {exc}") from None
        if identity.name != member or identity.kind != kind:
            raise ValueError(f"--cert is the {identity.kind} certificate of {identity.name!r}, "
                             f"not of {member!r}")
        if who.role == "project_admin" or (who.role == "org_admin" and identity.org == who.org):
            self.store.upsert_participant(identity.name, kind, identity.org, identity.role or "")

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
        if who.role != "project_admin":
            raise Denied(f"{who.name} ({who.role}) may not create studies; project admins may")
        name = self._name(body)
        if name == DEFAULT:
            raise ValueError("'default' is reserved for a project without named studies; "
                             "choose another name")
        if self.studies.exists(name):
            raise ValueError(f"study {name!r} already exists")
        sites = [self._known(s, "site")["name"] for s in body.get("sites") or []]
        users = [self._known(u, "admin")["name"] for u in body.get("users") or []]
        self.store.add_study(name)
        settled = self.studies.settle_default()
        for site in sites:
            self.store.set_member(name, site, "site", True)
        for user in users:
            self.store.set_member(name, user, "user", True)
        self._audit(who, "study_create", name, f"sites={sites} users={users}")
        if settled:
            self._audit(who, "study_settle_default", DEFAULT, "now an ordinary study, no members")
        out = self._describe(name)
        if settled:
            out["note"] = ("the project has named studies now: study default keeps its jobs and "
                           "has no members; add members back with `atoll study add-user default "
                           "USER` and `atoll study add-site default SITE`")
        return out

    def remove(self, who, study, body):
        name = str(body.get("name", ""))
        is_open = name == DEFAULT and self.studies.default_open()
        if who.role != "project_admin" or is_open:
            raise Denied(f"{who.name} ({who.role}) may not remove study {name}" + (
                ": it is the one study of a project without named studies" if is_open else ""))
        self._visible(who, name)
        jobs = self.store.count_jobs(name)
        if jobs:
            raise Denied(f"study {name} still has {jobs} job(s); delete them first "
                         f"(`atoll job delete JOB_ID --study {name}`), then remove the study")
        self.store.remove_study(name)
        self._audit(who, "study_remove", name)
        return {"removed": name}

    def _member(self, who, body, kind: str, present: bool):
        name = str(body.get("name", ""))
        key = "site" if kind == "site" else "user"
        member = str(body.get(key, ""))
        self._learn(who, member, "site" if kind == "site" else "admin", body.get("cert"))
        self._changeable(who, name, member, "site" if kind == "site" else "admin", f"the {key}s")
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
