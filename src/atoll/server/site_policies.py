"""What the sites of a job allow a user to do with it at the server: ``manage_job`` (abort) and
``download_job``, from each site's ``local/authorization.json`` (spec/authorization.py).

These actions happen at the server, so the server enforces them for the sites: each site
announces the rules in its hello when it connects, and the server remembers the last rules of
every site it has seen since it started. A site the server has not heard from since its start
is not consulted. The site's own enforcement is of what runs on its hardware (``submit_job``,
``byoc``: site/job_acceptance.py); a server that ignores these rules is a compromised server, which
can serve results it holds anyway.
"""

from __future__ import annotations

import logging
import threading
from typing import Any

from atoll.pki.identity import Identity
from atoll.spec.authorization import Actor, Policy, parse_policy
from atoll.spec.errors import SpecError

log = logging.getLogger("atoll.server.site_policies")


class SitePolicies:
    def __init__(self, links):
        self.links = links
        self._lock = threading.Lock()
        # site -> (the hello it came with, its policy, the site's org)
        self._known: dict[str, tuple[dict[str, Any], Policy, str]] = {}

    def _policy(self, site: str) -> tuple[Policy, str] | None:
        link = self.links.get(site)
        with self._lock:
            known = self._known.get(site)
        doc: Any = link.hello.get("authorization") if link is not None else None
        if doc is not None and (known is None or known[0] is not link.hello):
            try:
                known = (link.hello, parse_policy(doc, f"{site}'s local/authorization.json"),
                         link.org)
            except SpecError as exc:
                log.warning("site %s announced a policy the server cannot read: %s", site, exc)
            else:
                with self._lock:
                    self._known[site] = known
        return (known[1], known[2]) if known is not None else None

    def refusal(self, who: Identity, record, right: str) -> str | None:
        """Why a site of ``record`` (a JobRecord) refuses ``right`` to ``who``; None when none
        does."""
        user = Actor(who.name, who.org, who.role)
        submitter = Actor(record.submitter, record.submitter_org, None)
        for site in sorted(p for p in record.parts if p != "server"):
            found = self._policy(site)
            if found is None:
                continue
            policy, org = found
            decision = policy.decide(right, record.study, user, submitter, org)
            if not decision.allowed:
                return f"site {site} refuses (rule {decision.rule}): {decision.reason}"
        return None
