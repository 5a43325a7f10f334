"""The engine under ``Context.gather`` (``workflows/api.py``): take each reply as it arrives,
account for the rest.

A site either answers with a model, answers with an error (``Reply.error``: it dropped out, its
worker died), sends something unusable (rejected, with the reason), or does not answer within
the round's timeout. ``gather`` hands each answer to the caller's callback as soon as its header
is read (a ``ModelStream``: read it whole, or fold it in block by block), so a workflow never
holds more than one site's result, and returns who failed and why. ``require``
turns a shortfall below ``min_clients`` into a ``WorkflowError`` that names every failed site.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from atoll.fl.aggregation import AggregateCorrupted, ResultRejected
from atoll.fl.channels import ServerChannel
from atoll.fl.serde import ModelStream, SerdeError, open_model
from atoll.spec.errors import AtollError

log = logging.getLogger(__name__)


class WorkflowError(AtollError, RuntimeError):
    """The workflow cannot go on; the message names the round, the sites and what happened."""


@dataclass
class Outcome:
    """Who answered one task, who did not, and why."""

    ok: list[str] = field(default_factory=list)
    dropped: dict[str, str] = field(default_factory=dict)  # Reply.error: the site is gone
    rejected: dict[str, str] = field(default_factory=dict)  # answered, but unusable
    late: dict[str, str] = field(default_factory=dict)  # no answer within the timeout

    @property
    def failed(self) -> dict[str, str]:
        return {**self.dropped, **self.rejected, **self.late}


MAX_RETRIES = 3  # times one site is sent one task again after its part restarted


def gather(
    channel: ServerChannel,
    task_id: str,
    targets: Sequence[str],
    timeout: float | None,
    on_result: Callable[[str, ModelStream], None],
    min_clients: int = 0,
    resend: Callable[[str], str] | None = None,
) -> Outcome:
    """Open each reply and hand it to ``on_result`` as it arrives.

    ``on_result`` may raise ``ResultRejected`` (or ``SerdeError`` from reading the stream) to
    refuse a result; the site is then counted as failed with that reason. ``AggregateCorrupted``
    becomes a ``WorkflowError`` naming the site; any other exception (a bug) propagates.
    Once so many sites failed that ``min_clients`` is out of reach, the round stops waiting:
    a stalled site must not hold up a round that has failed already.

    A site whose part restarted mid-task (``Reply.retry``) is sent the task again through
    ``resend(site)`` (a new task id, whose reply is waited for in turn), at most MAX_RETRIES
    times; without ``resend`` it counts as dropped out.
    """
    import time

    outcome = Outcome()
    pending = set(targets)
    deadline = None if timeout is None else time.monotonic() + timeout
    tries: dict[str, int] = {}
    work = [(task_id, set(targets))]
    while work:
        current, expected = work.pop(0)
        left = None if deadline is None else max(deadline - time.monotonic(), 0.0)
        for reply in channel.replies(current, timeout=left):
            site = reply.site
            if site not in pending or site not in expected:
                log.warning(
                    "ignoring an unexpected or repeated reply from %s to task %s", site, current
                )
                continue
            if reply.retry and resend is not None and tries.get(site, 0) < MAX_RETRIES:
                tries[site] = tries.get(site, 0) + 1
                log.warning("%s: %s; sending it task %s again", site, reply.error, current)
                work.append((resend(site), {site}))
                continue
            pending.discard(site)
            _take(outcome, site, reply, on_result)
            if len(outcome.ok) + len(pending) < min_clients:
                for other in sorted(pending):  # the round has failed already: stop waiting
                    outcome.late[other] = (
                        "not waited for: the round could no longer reach min_clients"
                    )
                return outcome
    for site in sorted(pending):
        outcome.late[site] = (
            f"no reply within round_timeout={timeout}s"
            if timeout
            else "no reply before the channel closed"
        )
    return outcome


def _take(outcome: Outcome, site: str, reply, on_result) -> None:
    """Count one site's reply into the outcome: a result, a drop-out or a rejection."""
    if reply.error is not None:
        outcome.dropped[site] = reply.error
        return
    try:
        stream = open_model(reply.chunks if reply.chunks is not None else iter(()))
        on_result(site, stream)
    except SerdeError as exc:
        outcome.rejected[site] = f"sent an unreadable model: {exc}"
        return
    except ResultRejected as exc:
        outcome.rejected[site] = str(exc)
        return
    except AggregateCorrupted as exc:
        raise WorkflowError(f"{site}: {exc}") from None
    outcome.ok.append(site)


def describe(failed: dict[str, str]) -> str:
    return "; ".join(f"{site}: {reason}" for site, reason in sorted(failed.items()))


def require(outcome: Outcome, min_clients: int, what: str) -> None:
    """Fail when fewer than ``min_clients`` sites answered usefully."""
    if len(outcome.ok) >= min_clients:
        return
    raise WorkflowError(
        f"{what}: {len(outcome.ok)} site(s) returned a usable result, min_clients is "
        f"{min_clients}. Failed: {describe(outcome.failed) or 'none'}"
    )


def resolve_min_clients(
    requested: int | None, job_args: dict[str, Any], sites: Sequence[str]
) -> int:
    """The workflow's min_clients, else the job's (meta.json), else every site; at most the sites."""
    value = requested
    if value is None:
        job_value = job_args.get("min_clients")
        value = job_value if isinstance(job_value, int) and job_value >= 1 else len(sites)
    if value > len(sites):
        raise WorkflowError(
            f"min_clients is {value} but the job has only {len(sites)} site(s): {', '.join(sites)}; "
            "lower min_clients in app.yaml (server.args) or meta.json"
        )
    return value
