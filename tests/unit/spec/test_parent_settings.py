"""site.yaml's supervision block (spec/parent_settings.py): defaults, bounds, and a heartbeat
that must come more often than a stall is declared."""

from __future__ import annotations

from atoll.spec.parent_settings import Supervision
from atoll.spec.site_config import parse_site_config

from .helpers import by_path, issues_of


def test_supervision_defaults_and_a_set_block():
    assert parse_site_config({"launcher": "process"}).supervision == Supervision(
        heartbeat_s=10, stall_s=120, progress_s=21600, rejoin_s=300)
    cfg = parse_site_config({"launcher": "process",
                             "supervision": {"heartbeat_s": 0.5, "stall_s": 4, "rejoin_s": 0,
                                             "progress_s": 3}})
    assert (cfg.supervision.heartbeat_s, cfg.supervision.stall_s, cfg.supervision.rejoin_s,
            cfg.supervision.progress_s) == (0.5, 4, 0, 3)
    assert all(f.description for f in Supervision.model_fields.values())


def test_a_heartbeat_slower_than_the_stall_and_bad_bounds_are_refused():
    issues = by_path(issues_of(parse_site_config, {
        "launcher": "process", "supervision": {"heartbeat_s": 30, "stall_s": 20}}))
    assert "must be below stall_s" in " ".join(issues.values()), issues
    issues = by_path(issues_of(parse_site_config, {
        "launcher": "process", "supervision": {"stall_s": 0, "rejoin_s": -1, "progress_s": 0}}))
    assert set(issues) >= {"supervision.stall_s", "supervision.rejoin_s",
                           "supervision.progress_s"}, issues
