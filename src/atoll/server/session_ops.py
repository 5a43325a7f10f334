"""The admin operations on a caller's session: ``login`` (a token scoped to one study, signed
by this server) and ``whoami``. Plain functions, as server/job_ops.py."""

from __future__ import annotations

from dataclasses import dataclass
from functools import partial
from typing import TYPE_CHECKING, Any

from atoll import __version__

if TYPE_CHECKING:
    from atoll.pki.identity import Identity
    from atoll.server.audit import Audit
    from atoll.server.job_ops import Op
    from atoll.server.sessions import SessionSigner
    from atoll.server.studies import Members


@dataclass(frozen=True)
class SessionOps:
    studies: Members
    signer: SessionSigner
    audit: Audit


def ops(deps: SessionOps) -> dict[str, Op]:
    return {"login": partial(login, deps), "whoami": partial(whoami, deps)}


def login(deps: SessionOps, who: Identity, study: str, body: dict[str, Any]) -> Any:
    deps.studies.require_member(who, study)  # a refusal is audited by the caller
    deps.audit.record(who, study, "login", study, "ok")
    return {"token": deps.signer.issue(who.name, study), "study": study,
            "user": who.name, "org": who.org, "role": who.role,
            "server_version": __version__}  # the CLI warns when it does not fit


def whoami(deps: SessionOps, who: Identity, study: str, body: dict[str, Any]) -> Any:
    return {"user": who.name, "org": who.org, "role": who.role, "study": study,
            "studies": deps.studies.visible(who)}
