"""A command too large for one control message is refused before it is queued: the site's link,
and every other job of the site with it, stays up."""

from __future__ import annotations

import asyncio

import pytest

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
        assert link.outbox.qsize() == 1
        assert link.outbox.get_nowait().WhichOneof("kind") == "abort"
    finally:
        loop.close()
