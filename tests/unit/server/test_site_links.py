"""A command too large for one control message is refused before it is queued: the site's link,
and every other job of the site with it, stays up; and a large federation's sites are asked for
fewer heartbeats."""

from __future__ import annotations

import asyncio
import time

import pytest

from atoll.server import site_links
from atoll.server.site_links import ControlTooLarge, SiteLink
from atoll.wire.frames import MAX_CONTROL


def test_an_oversized_command_is_refused_and_nothing_is_queued():
    loop = asyncio.new_event_loop()
    try:
        link = SiteLink("site-a", "org-a", {}, loop)
        with pytest.raises(ControlTooLarge, match=r"a dispatch command of [\d,]+ bytes is over "
                                                  r"the 4,194,304-byte limit"):
            link.send("dispatch", {"meta": {"blob": "x" * MAX_CONTROL}})
        link.send("abort", {"job_id": "j", "reason": "fits"})
        loop.run_until_complete(asyncio.sleep(0))  # run what send() handed to the loop
        assert len(link.outbox) == 1
        assert link.outbox.get_nowait().WhichOneof("kind") == "abort"
    finally:
        loop.close()


def test_a_large_federation_asks_for_fewer_heartbeats_and_waits_longer_for_them():
    """Each site connecting is asked for a heartbeat every HEARTBEAT_S until BEATS_PER_S would
    be passed, then less often (at most MAX_HEARTBEAT_S); each link is stale after its own
    STALE_BEATS periods, never before STALE_S."""
    links = site_links.SiteLinks()
    periods = []
    for n in range(2500):
        periods.append(links.heartbeat_period())
        links.attach(SiteLink(f"site-{n}", "org", {}, None, heartbeat_s=periods[-1]))
    assert periods[0] == periods[998] == site_links.HEARTBEAT_S  # 1,000 sites: every 5 s
    assert periods[1999] == 10.0 and periods[-1] == 2500 / site_links.BEATS_PER_S
    # the first thousand connected when few were online: asked again, to a period 12.5 s
    repaced = links.repace()
    assert len(repaced) == 2000 and {link.heartbeat_s for link in repaced} == {12.5}
    assert links.repace() == []  # once: nothing more until the federation grows again
    beats = sum(1 / link.heartbeat_s for link in links.online().values())
    assert beats <= site_links.BEATS_PER_S * site_links.REPACE  # what the server takes a second
    many = site_links.SiteLinks()
    many._links = {f"s{n}": None for n in range(100_000)}  # only their count matters here
    assert many.heartbeat_period() == site_links.MAX_HEARTBEAT_S
    few = site_links.SiteLinks()  # a period is never shortened by a shrinking federation
    few.attach(SiteLink("s", "o", {}, None, heartbeat_s=50.0))
    assert few.repace() == [] and few.get("s").heartbeat_s == 50.0

    now = time.monotonic()
    early, late = links.get("site-0"), links.get("site-2499")
    early.heartbeat_s = site_links.HEARTBEAT_S
    early.last_seen = late.last_seen = now - site_links.STALE_S - 1
    stale = {link.name for link in links.stale()}
    assert "site-0" in stale and "site-2499" not in stale  # 4 x 12.5 s > STALE_S
    late.last_seen = now - site_links.STALE_BEATS * late.heartbeat_s - 1
    assert "site-2499" in {link.name for link in links.stale()}


def test_the_control_streams_read_deadline_leaves_liveness_to_the_stale_check():
    """A site asked for a heartbeat every MAX_HEARTBEAT_S sends nothing for that long: the
    server's read of its stream (wire/guard.py) must wait longer than any link can be stale."""
    assert site_links.CONNECT_QUIET_S > site_links.STALE_BEATS * site_links.MAX_HEARTBEAT_S


def test_a_command_to_many_sites_is_one_shared_message_and_the_offline_are_named():
    """A job's dispatch to 10,000 sites: encoded once, and each stream holds that one message
    (gRPC keeps a stream's last message until its next), not a copy of its own."""
    loop = asyncio.new_event_loop()
    try:
        links = site_links.SiteLinks()
        a, b = SiteLink("a", "o", {}, loop), SiteLink("b", "o", {}, loop)
        links.attach(a)
        links.attach(b)
        assert links.send_all(["a", "gone", "b"], "dispatch", {"job_id": "j"}) == ["gone"]
        loop.run_until_complete(asyncio.sleep(0))
        sent_a, sent_b = a.outbox.get_nowait(), b.outbox.get_nowait()
        assert sent_a is sent_b and sent_a.WhichOneof("kind") == "dispatch"
        with pytest.raises(ControlTooLarge):
            links.send_all(["a", "b"], "dispatch", {"meta": "x" * MAX_CONTROL})
        loop.run_until_complete(asyncio.sleep(0))
        assert len(a.outbox) == len(b.outbox) == 0  # nothing queued for anyone
    finally:
        loop.close()


def test_the_outbox_hands_its_writer_each_command_in_order_and_wakes_it():
    loop = asyncio.new_event_loop()
    try:
        link = SiteLink("a", "o", {}, loop)

        async def writer():
            return [await link.outbox.get() for _ in range(3)]

        task = loop.create_task(writer())
        loop.run_until_complete(asyncio.sleep(0))  # it waits on an empty outbox
        link.send("abort", {"job_id": "1", "reason": "r"})
        link.send("end", {"job_id": "2"})
        link.close()
        got = loop.run_until_complete(asyncio.wait_for(task, 5))
        assert [c.WhichOneof("kind") for c in got[:2]] == ["abort", "end"] and got[2] is None
        assert link.closed.is_set()
    finally:
        loop.close()
