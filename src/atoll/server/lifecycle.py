"""The job's state machine on the server: each part's states, the server worker's end, the
job's end once every part has ended, abort, cancel, a newer revocation list, and recovery after
a restart (see server/jobs.py for the states and their order).

A site parent that disconnects does not fail its parts at once: they wait up to `rejoin_s`
(site.yaml's supervision.rejoin_s) for it to come back. A site that comes back still running
the job (its link only broke) goes on; one that no longer runs it (its parent restarted) is sent
the job again, and each task its old part took is retried for it (server/relay.py `requeue`).

After a failure, sites are aborted only after a short grace: one about to fail on its own
reports its own reason, not a copy of the server's.
"""

from __future__ import annotations

import json
import logging
import threading
from pathlib import Path
from typing import TYPE_CHECKING, Any

from atoll.base.files import private_dir
from atoll.base.reasons import clip, public
from atoll.launchers.base import Outcome, WorkerExit
from atoll.launchers.job_files import create_job_file
from atoll.server.live_jobs import LiveJob

if TYPE_CHECKING:
    from atoll.parent.worker_endpoint import WorkerTokens
    from atoll.pki.revocation import RevocationList
    from atoll.server.intake import JobQueue
    from atoll.server.jobs import SiteCommands, WorkerHost
    from atoll.server.provenance import ServerProvenance
    from atoll.server.spool import Budget
    from atoll.server.store import JobRecord, Store

log = logging.getLogger("atoll.server.jobs")

CHECKPOINTS = "checkpoint"  # the server worker's (atoll.fl.checkpoint), in its run folder
RESUMES_FILE = "resumes.json"  # in the job's folder: how often a server restart resumed it
END_GRACE_S = 60.0  # how long sites get to wrap up after the workflow completed
FAILED_GRACE_S = 5.0  # ... and after it failed: to report their own reason


class Lifecycle:
    """The state machine, part of the job manager (server/jobs.py composes it)."""

    store: Store
    links: SiteCommands
    host: WorkerHost
    tokens: WorkerTokens
    queue: JobQueue
    workspace: Path
    jobs_dir: Path
    live: dict[str, LiveJob]
    provenance: ServerProvenance | None
    relay_budget: Budget
    max_resumes: int  # restarts.max_resumes in the server's local/site.yaml
    _lock: threading.RLock
    rejoin_s: float = 300.0  # how long a site's parts wait for a disconnected site parent
    stopping: bool = False  # the parent stops: a server worker's end is not the job's

    # (`_revoked(tree, held)`, the signer check, is server/jobs.py's: see JobManager)

    def _server_ended(self, live: LiveJob, exit: WorkerExit) -> None:
        if self.stopping and not (exit.outcome is Outcome.COMPLETED and live.report
                                  and live.report[0]):
            # this parent stops (an upgrade, `atoll server stop`): the job stays RUNNING in the
            # store and the next start resumes it from its checkpoint (`recover`)
            log.info("job %s: its server worker stopped with the server parent", live.id)
            return
        if live.aborting:
            state, reason = "ABORTED", live.aborting
        elif exit.outcome is Outcome.COMPLETED and live.report and live.report[0]:
            state, reason = "COMPLETED", ""
        else:
            state = "FAILED"
            reason = (live.report[1] if live.report and live.report[1] else exit.reason)
        reason = self._public(live, reason)
        live.server_state, live.server_reason = state, reason
        self.store.set_part_state(live.id, "server", f"FINISHED:{state}", reason)
        live.relay.end()
        # After a failure, sites are aborted only after a short grace: one about to fail on
        # its own reports its own reason, not a copy of the server's.
        if state == "ABORTED":
            self.links.send_all(self._unfinished_sites(live), "abort",
                                {"job_id": live.id, "reason": reason})
        elif state == "COMPLETED":
            self.links.send_all(self._unfinished_sites(live), "end", {"job_id": live.id})
        if state != "ABORTED" and self._unfinished_sites(live):
            grace = END_GRACE_S if state == "COMPLETED" else FAILED_GRACE_S
            why = (f"did not finish within {grace:.0f} s of the workflow's end"
                   if state == "COMPLETED" else "stopped: the job failed on the server")
            timer = threading.Timer(grace, self._end_stragglers, args=(live, why))
            timer.daemon = True
            timer.start()
        self._maybe_finish(live)

    def _public(self, live: LiveJob, reason: str) -> str:
        """A reason as users see it: paths relative to the job, none of the server's own."""
        run = live.folder / "run" / "server"
        return public(reason, [run, live.folder / "job", live.folder], self.workspace)

    def _end_stragglers(self, live: LiveJob, reason: str) -> None:
        for site in self._unfinished_sites(live):
            self.links.send(site, "abort", {"job_id": live.id, "reason": reason})

    # -- the parts' states -----------------------------------------------------------------------
    def part_running(self, live: LiveJob, part: str, reason: str = "") -> None:
        """A part (the server's, at its worker's registration, or a site's) is RUNNING; the job
        is RUNNING with its first. The one place either becomes RUNNING."""
        self.store.set_part_state(live.id, part, "RUNNING", reason)
        if live.record.state == "DISPATCHED":
            live.record.state = "RUNNING"
            self.store.set_job_state(live.id, "RUNNING")

    def site_state(self, site: str, body: dict[str, Any]) -> None:
        job_id, state = str(body.get("job_id")), str(body.get("state"))
        reason = clip(str(body.get("reason", "")))  # a careless site's reason stays bounded
        live = self.live.get(job_id)
        if live is None or site not in live.members or site in live.site_states:
            return
        if state == "PROVENANCE":  # the site's signed entries, not a state of its part
            if self.provenance is not None:
                self.provenance.site_items(job_id, site, body)
            return
        if body.get("log_tail"):
            self._keep_tail(live, site, str(body["log_tail"]))
        if state == "RESTARTING":  # the site replaces its part's worker (a stall)
            live.relay.requeue(site, f"{site}'s part restarted: {reason}")
            self.store.set_part_state(job_id, site, "STARTING", reason)
            return
        if state == "RUNNING":
            self.part_running(live, site, reason)
        else:
            self.store.set_part_state(job_id, site, state, reason)
        if state.startswith("FINISHED:"):
            live.site_states[site] = (state, reason)
            if state != "FINISHED:COMPLETED" or not live.relay.ended:
                # its reason is its own part's; the workflow's names the site and its state
                live.relay.drop_site(site, f"{site} dropped out ({state.removeprefix('FINISHED:')})")
            self._maybe_finish(live)

    @staticmethod
    def _keep_tail(live: LiveJob, site: str, tail: str) -> None:
        """A site's log tail, 0600 in the job's folder; never written through a link there."""
        private_dir(live.folder / "logs")
        try:
            with create_job_file(live.folder, f"logs/{site}.log") as out:
                out.write(tail.encode("utf-8", "replace"))
        except OSError as exc:
            log.warning("job %s: the log tail of %s was not kept: %s", live.id, site, exc)

    def site_offline(self, site: str) -> None:
        """The site's link closed: each of its parts waits up to rejoin_s for it to return."""
        for live in list(self.live.values()):
            if site not in live.members or site in live.site_states or site in live.away:
                continue
            if self.rejoin_s <= 0:
                self._site_gone(live, site, "site parent disconnected")
                continue
            timer = threading.Timer(self.rejoin_s, self._rejoin_overdue, args=(live, site))
            timer.daemon = True
            live.away[site] = timer
            self._part_reason(live, site, f"site parent disconnected; waiting up to "
                                          f"{self.rejoin_s:g} s for it to come back")
            timer.start()

    def parts_at(self, site: str) -> list[str]:
        """The running jobs whose part at ``site`` has not ended."""
        return [live.id for live in list(self.live.values())
                if site in live.members and site not in live.site_states]

    def site_back(self, site: str, running: list[str], known: list[str]) -> None:
        """The site connected again, running ``running``. Of the jobs whose part there had not
        ended before it connected (``known``), one it no longer runs (its parent restarted) is
        sent to it again, and the tasks its old part took are retried for it."""
        from atoll.server.dispatch import dispatch_body

        for job_id in known:
            live = self.live.get(job_id)
            if live is None or site in live.site_states:
                continue
            timer = live.away.pop(site, None)
            if timer is not None:
                timer.cancel()
            if job_id in running:  # its worker lives on: only the link broke
                self._part_reason(live, site, "site parent reconnected")
                continue
            reason = f"{site}'s site parent restarted; its part starts again"
            live.relay.requeue(site, reason)
            self.store.set_part_state(job_id, site, "DISPATCHED", reason)
            log.warning("job %s: %s", job_id, reason)
            self.links.send(site, "dispatch", dispatch_body(live.record))

    def _part_reason(self, live: LiveJob, site: str, reason: str) -> None:
        record = self.store.get_job(live.id)
        part = record.parts.get(site) if record is not None else None
        if part is not None and not part["state"].startswith("FINISHED"):
            self.store.set_part_state(live.id, site, part["state"], reason)

    def _rejoin_overdue(self, live: LiveJob, site: str) -> None:
        with self._lock:
            if live.away.pop(site, None) is None:
                return
        at = live.relay.round_of(site)
        self._site_gone(live, site, f"{site}'s site parent was disconnected for more than "
                                    f"{self.rejoin_s:g} s"
                                    + (f" during round {at}" if at is not None else ""))

    def _site_gone(self, live: LiveJob, site: str, reason: str) -> None:
        self.site_state(site, {"job_id": live.id, "state": "FINISHED:FAILED", "reason": reason})

    def _unfinished_sites(self, live: LiveJob) -> list[str]:
        return [s for s in live.sites if s not in live.site_states]

    def _maybe_finish(self, live: LiveJob) -> None:
        with self._lock:
            # a count, not _unfinished_sites: this runs at every site's end (n² at 10,000)
            if live.server_state is None or len(live.site_states) < len(live.members):
                return
            if self.live.pop(live.id, None) is None:
                return
        failed = [f"{s}: {r or st}" for s, (st, r) in live.site_states.items()
                  if st != "FINISHED:COMPLETED"]
        reason = live.server_reason
        if live.server_state == "COMPLETED" and failed:
            reason = "sites that dropped out: " + "; ".join(failed)
        if self.provenance is not None:  # before the state: a download then has job.final
            self.provenance.finished(live.id, live.server_state, reason)
        self.store.set_job_state(live.id, f"FINISHED:{live.server_state}", reason)
        self.tokens.revoke(live.id)
        live.relay.close()
        import shutil  # with the first job, not at rest: it loads bz2 and lzma

        shutil.rmtree(live.relay.folder, ignore_errors=True)
        # the workflow's checkpoint (a model's size) is of no use once the job has ended;
        # rmtree never follows a link the job could have put there
        shutil.rmtree(live.folder / "run" / "server" / CHECKPOINTS, ignore_errors=True)
        from atoll.wire.checkpoint_home import HELD

        (live.folder / HELD).unlink(missing_ok=True)  # ... or the one a Pod sent home
        self.queue.wake()  # what the job held at its sites is free
        log.info("job %s finished: %s %s", live.id, live.server_state, reason)

    # -- abort ----------------------------------------------------------------------------------
    def _cancel(self, job_id: str, reason: str) -> None:
        """A job that never left the queue ends ABORTED, each of its parts with the reason."""
        record = self.store.get_job(job_id)
        if record is not None and record.state == "SUBMITTED":
            for part in record.parts:
                self.store.set_part_state(job_id, part, "FINISHED:ABORTED", reason)
            self.store.set_job_state(job_id, "FINISHED:ABORTED", reason)

    def abort(self, job_id: str, reason: str) -> None:
        with self._lock:
            live = self.live.get(job_id)
            if live is None:
                self._cancel(job_id, reason)
                return
        if live.aborting:
            return
        live.aborting = reason
        live.relay.end()
        self._abort_sites(live, reason)
        if live.handle is not None:  # in the background: the admin's call returns at once
            threading.Thread(target=self.host.launcher.cancel, args=(live.handle,),
                             name=f"cancel-{job_id[:8]}", daemon=True).start()

    def _abort_sites(self, live: LiveJob, reason: str) -> None:
        for site in self._unfinished_sites(live):
            if not self.links.send(site, "abort", {"job_id": live.id, "reason": reason}):
                self.site_state(site, {"job_id": live.id, "state": "FINISHED:ABORTED",
                                       "reason": f"{reason} (site offline)"})

    def signers_revoked(self, held: RevocationList) -> list[str]:
        """A newer revocation list is in force: cancel every waiting job and abort every
        running one whose signer it revokes, each with the reason; the ids of those jobs."""
        ended = []
        with self._lock:  # no dispatch between the two lists (see `dispatch`)
            for record in self.store.list_jobs(states=["SUBMITTED"]):
                why = self._revoked(self.jobs_dir / record.id / "job", held)
                if why is not None:
                    self._cancel(record.id, f"cancelled: {why}")
                    ended.append(record.id)
            running = list(self.live.values())
        for live in running:
            why = self._revoked(live.folder / "job", held)
            if why is not None:
                self.abort(live.id, f"aborted: {why}")
                ended.append(live.id)
        for job_id in ended:
            log.warning("job %s ended: its submitter's certificate is revoked", job_id)
        return ended

    def recover(self) -> None:
        """After a restart: each job that was running goes on from its last checkpoint with a
        new server worker (a bounded number of times, `max_resumes`); its sites' workers wait
        out the server's absence and take its tasks again once their site reconnects."""
        for record in self.store.list_jobs(states=["DISPATCHED", "RUNNING"]):
            why = self._resume(record)
            if why is None:
                continue
            for part, info in record.parts.items():
                if not info["state"].startswith("FINISHED"):
                    self.store.set_part_state(record.id, part, "FINISHED:FAILED", why)
            if self.provenance is not None:  # the same chain, continued from its file
                self.provenance.finished(record.id, "FAILED", why)
            self.store.set_job_state(record.id, "FINISHED:FAILED", why)
            log.warning("job %s failed: %s", record.id, why)

    def _resume(self, record: JobRecord) -> str | None:
        """Make the job live again and start its server worker; why it cannot be, or None."""
        import shutil

        from atoll.base.files import write_atomic
        from atoll.server.relay import JobRelay
        from atoll.spec.meta import load_meta

        folder = self.jobs_dir / record.id
        count_file = folder / RESUMES_FILE  # the parent's own file: no job can write it
        try:
            resumes = int(json.loads(count_file.read_text())["resumes"])
        except FileNotFoundError:
            resumes = 0
        except (OSError, ValueError, KeyError, TypeError):
            return "the server restarted while the job ran, and its resume count is unreadable"
        if resumes >= self.max_resumes:
            return (f"the server restarted while the job ran, after {resumes} resume(s) "
                    f"already (restarts.max_resumes is {self.max_resumes}); resubmit it")
        if record.parts.get("server", {}).get("state", "").startswith("FINISHED"):
            return "the server restarted while the job's sites were finishing; resubmit it"
        try:
            meta = load_meta(record.meta)
        except Exception as exc:  # noqa: BLE001 - the stored meta was valid at intake
            return f"the server restarted and the job's meta no longer reads: {exc}"
        round_ = self._committed_round(record.id)
        write_atomic(count_file, json.dumps({"resumes": resumes + 1}))
        sites = [p for p, info in record.parts.items() if p != "server"]
        shutil.rmtree(folder / "relay", ignore_errors=True)  # the interrupted run's traffic
        relay = JobRelay(record.id, folder / "relay", sites, self.relay_budget,
                         attempt=resumes + 1)
        live = LiveJob(record, meta, sites, relay, folder, resumes=resumes + 1,
                       resume_round=round_)
        for site, info in record.parts.items():  # sites that ended before stay ended
            if site != "server" and info["state"].startswith("FINISHED"):
                live.site_states[site] = (info["state"], info.get("reason", ""))
                relay.drop_site(site, f"{site} dropped out ({info['state'].removeprefix('FINISHED:')})")
        self.live[record.id] = live
        note = live.resume_note
        self.store.set_part_state(record.id, "server", "DISPATCHED", note)
        self.store.add_event(record.id, "server", {"event": "resumed", "round": round_ + 1,
                                                   "attempt": resumes + 1, "text": note})
        log.info("job %s %s (resume %d of at most %d)", record.id, note, resumes + 1,
                 self.max_resumes)
        return None  # its server worker starts with the worker endpoint: `launch_resumed`

    def launch_resumed(self) -> None:
        """Start the server workers of the jobs `recover` resumed (the parent's worker endpoint
        is up now)."""
        for live in list(self.live.values()):
            if live.resumes and live.handle is None:
                threading.Thread(target=self._run_server_worker, args=(live,),
                                 name=f"server-worker-{live.id[:8]}", daemon=True).start()

    def _committed_round(self, job_id: str) -> int:
        """The round of the last checkpoint the server worker reported committed (0: none)."""
        rounds = [e.get("round") for e in self.store.events(job_id)
                  if e.get("event") == "checkpoint" and e.get("source") == "server"]
        rounds = [r for r in rounds if isinstance(r, int) and not isinstance(r, bool)]
        return max(rounds, default=0)

    def stop_all(self) -> None:
        """The parent stops: its server workers stop too, and their jobs stay as they were in
        the store, for the next start to resume."""
        self.stopping = True
        for live in list(self.live.values()):
            if live.handle is not None:
                self.host.launcher.cancel(live.handle)
