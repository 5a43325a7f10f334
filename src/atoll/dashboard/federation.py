"""The dashboard's side of the federation: the server's answers for the pages, and the live
loops behind their server-sent events.

Every call goes through the user's ``admin.Session`` (their kit, their study), the same calls
the CLI makes: ``job status --wait``'s long poll (``since``/``wait_s``: the server answers as
soon as the job changes), ``job logs --follow``'s logs and events, ``site list``'s sites. The
server scopes each answer; nothing is filtered here. A call that cannot reach the server makes
the loop say ``disconnected`` and retry every half second until it answers again
(``reconnected``): a server restart is survived without reloading the page.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

from atoll.admin.errors import AtollError, ConnectionFailed, NotFound, Refused
from atoll.admin.session import TERMINAL, Session

PAGE_SIZE = 50
RETRY_S = 0.5
OVERVIEW_S = 1.0  # how often the overview asks again (sites' heartbeats, new jobs)
WAIT_S = 2.0  # a job's long poll: at once on a change, after 2 s for a log that grew


class Federation:
    """One user's view: their session and the study it is scoped to (None: the session's)."""

    def __init__(self, session: Session, study: str | None = None):
        self.session = session
        self.study = study
        self._me: dict[str, Any] | None = None
        self._early: tuple[int, float, asyncio.Task] | None = None  # start_overview's

    def me(self) -> dict[str, Any]:
        """Who the kit is (its certificate's name, org and role) and the study: fixed for this
        process, so asked of the server once, not on every page load."""
        if self._me is None:
            who = self.session.whoami()
            self._me = {k: who.get(k) for k in ("user", "role", "org", "study", "name")
                        if who.get(k) is not None} | ({"study": self.study} if self.study else {})
        return self._me

    def sites(self) -> dict[str, Any]:
        return self.session.sites(self.study)

    def jobs(self, page: int) -> dict[str, Any]:
        answer = self.session.call("list_jobs", study=self.study, offset=page * PAGE_SIZE,
                                   limit=PAGE_SIZE)
        return {**answer, "page": page, "page_size": PAGE_SIZE}

    async def overview(self, page: int) -> dict[str, Any]:
        """The sites and one page of jobs, asked at once (a page's first load waits on both)."""
        sites, jobs = await asyncio.gather(asyncio.to_thread(self.sites),
                                           asyncio.to_thread(self.jobs, page))
        return {"sites": sites, "jobs": jobs}

    def start_overview(self, page: int) -> None:
        """Ask for a page's first overview now (its HTML is on its way): the page's stream
        takes the answer if it comes for the same page within OVERVIEW_S."""
        task = asyncio.ensure_future(self.overview(page))
        task.add_done_callback(lambda t: t.cancelled() or t.exception())  # one never taken
        self._early = (page, time.monotonic(), task)

    def _take_early(self, page: int) -> asyncio.Task | None:
        early, self._early = self._early, None
        if early is None or early[0] != page or time.monotonic() - early[1] > OVERVIEW_S:
            return None
        return early[2]

    def status(self, job_id: str, since: int | None = None, wait_s: float = 0.0):
        return self.session.status(job_id, self.study, since=since, wait_s=wait_s)

    def logs(self, job_id: str) -> dict[str, Any]:
        return self.session.logs(job_id, self.study)

    def abort(self, job_id: str) -> dict[str, Any]:
        return self.session.abort(job_id, self.study)

    def results(self, job_id: str, archive: Path) -> Path:
        return self.session.download_archive(job_id, archive, self.study)

    # -- live ----------------------------------------------------------------------------------
    async def overview_events(self, page: int) -> AsyncIterator[dict[str, Any]]:
        """The sites and one page of jobs whenever they change; the link's state when it does."""
        last, down, early = None, False, self._take_early(page)
        while True:
            answer, early = early or self.overview(page), None
            try:
                now = await answer
            except ConnectionFailed as exc:
                if not down:
                    down = True
                    yield {"type": "disconnected", "message": str(exc)}
                await asyncio.sleep(RETRY_S)
                continue
            except AtollError as exc:  # e.g. an expired session: said, then tried again
                yield {"type": "error", "message": str(exc)}
                last = None
                await asyncio.sleep(RETRY_S * 4)
                continue
            if down:
                down = False
                yield {"type": "reconnected"}
            text = json.dumps(now, sort_keys=True)
            if text != last:
                last = text
                yield {"type": "overview", **now}
            await asyncio.sleep(OVERVIEW_S)

    async def job_events(self, job_id: str) -> AsyncIterator[dict[str, Any]]:
        """The job's status, its new events, what its logs added and each part's state changes
        (the server's record, with its times), on every change, until it ends (then ``end``);
        ``error`` if the server will not show it (no such job)."""
        status: dict[str, Any] | None = None
        shown_at, shown_logs, down, first = -1.0, {}, False, True
        while True:
            try:
                if status is None:  # first, or after a reconnect (the store's version restarted)
                    status = await asyncio.to_thread(self.status, job_id)
                else:
                    status = await asyncio.to_thread(self.status, job_id, status["version"],
                                                     WAIT_S)
                logs = await asyncio.to_thread(self.logs, job_id)
            except ConnectionFailed as exc:
                status = None
                if not down:
                    down = True
                    yield {"type": "disconnected", "message": str(exc)}
                await asyncio.sleep(RETRY_S)
                continue
            except (NotFound, Refused) as exc:
                yield {"type": "error", "message": str(exc)}
                return
            except AtollError as exc:  # e.g. an expired session: said, then tried again
                yield {"type": "error", "message": str(exc), "retry": True}
                status = None
                await asyncio.sleep(RETRY_S * 4)
                continue
            if down:
                down = False
                yield {"type": "reconnected"}
            events = [e for e in logs["events"] if _at(e) > shown_at]
            if events:
                shown_at = max(_at(e) for e in events)
            added = {}
            for name, body in logs["logs"].items():
                new = added_text(shown_logs.get(name, ""), body)
                if new:
                    added[name] = new
                shown_logs[name] = body
            # the first one holds whole logs: the page replaces what it had with them
            # the parts' history is short (a few changes each): sent whole, the page redraws it
            yield {"type": "job", "status": status, "events": events, "logs": added,
                   "history": logs.get("part_history", []), "first": first}
            first = False
            if status["state"] in TERMINAL:
                yield {"type": "end", "state": status["state"]}
                return


def _at(event: dict[str, Any]) -> float:
    at = event.get("at", 0.0)
    return float(at) if isinstance(at, int | float) else 0.0


def added_text(before: str, now: str) -> str:
    """What ``now`` (a log's tail) adds to ``before``, as `job logs --follow` shows it: the
    tail moves on, so the overlap is found by the end of what was shown; nothing in common (the
    log grew past the tail): all of ``now``."""
    if now.startswith(before):
        return now[len(before):]
    anchor = before[-512:]
    at = now.find(anchor) if anchor else -1
    return now[at + len(anchor):] if at >= 0 else now
