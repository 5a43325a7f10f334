"""A job's status shows its latest events: a site that logs every batch (fl.log_metrics) must
not push the workflow's rounds out of what a watcher sees."""

from __future__ import annotations

from atoll.server.store import PROGRESS_SHOWN, recent_progress


def test_the_workflows_rounds_stay_visible_among_many_site_events():
    events = [{"at": float(i), "source": "server", "event": "round", "round": i + 1}
              for i in range(3)]
    events += [{"at": 10.0 + i, "source": "site-1", "event": "site_metrics"}
               for i in range(500)]
    shown = recent_progress(events)
    assert [e["round"] for e in shown if e["source"] == "server"] == [1, 2, 3]
    assert len(shown) == 3 + PROGRESS_SHOWN
    assert [e["at"] for e in shown] == sorted(e["at"] for e in shown)  # in time order
