"""A site's state reports survive a reconnect (site/connection.py): the events of a call that
ended stop taking reports, so a refusal sent just after the server came back (a revoked
user's job dispatched at once) reaches the new call instead of the dead one."""

from __future__ import annotations

import json
import threading

from atoll.site import connection
from atoll.site.connection import ServerLink


def test_a_report_queued_after_a_reconnect_goes_out_on_the_new_call():
    link = ServerLink(channel=None, stub=None, hello=lambda: {"running_jobs": []},
                      on_command=lambda kind, body: None)
    link._generation = 1
    old = link._events(1)
    next(old)  # its hello; gRPC's thread then waits in the outbox for the next report
    taken = []
    waiting = threading.Thread(target=lambda: taken.extend(old), daemon=True)
    waiting.start()

    # the call breaks (as run() does then), and the next one starts
    link._generation += 1
    link._outbox.put(connection._WAKE)
    waiting.join(timeout=30)
    assert not waiting.is_alive() and taken == []  # the old events stopped, taking nothing
    link._generation += 1
    new = link._events(link._generation)
    next(new)
    link.send_state("f" * 32, "FINISHED:FAILED", "site-1 refused the job: revoked")
    report = json.loads(next(new).job_state)
    assert report["state"] == "FINISHED:FAILED" and report["job_id"] == "f" * 32


def test_a_report_the_old_call_took_is_handed_on_not_lost():
    link = ServerLink(channel=None, stub=None, hello=lambda: {"running_jobs": []},
                      on_command=lambda kind, body: None)
    link._generation = 1
    old = link._events(1)
    next(old)
    taken = []
    waiting = threading.Thread(target=lambda: taken.extend(old), daemon=True)
    waiting.start()  # in the outbox when its call ends...
    link._generation = 2
    link.send_state("a" * 32, "FINISHED:FAILED", "refused")  # ...and takes the next report
    waiting.join(timeout=30)
    assert not waiting.is_alive() and taken == []  # not yielded into the call that ended
    new = link._events(2)
    next(new)
    replayed = [json.loads(next(new).job_state) for _ in range(2)]  # final states replay too
    assert [r["job_id"] for r in replayed] == ["a" * 32] * 2
