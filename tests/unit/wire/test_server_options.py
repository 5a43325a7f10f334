"""The server's gRPC options take the calls of 10,000 sites starting a job at once: gRPC's own
backlog shedding (1,000 unmatched calls by default, by random early detection) refused about
half of 3,000 sites' fetches as CANCELLED and failed the job (bench/scale.py)."""

from __future__ import annotations

from atoll.wire.aio_server import SERVER_OPTIONS


def test_the_backlog_of_calls_not_yet_taken_holds_every_site_of_a_large_federation():
    options = dict(SERVER_OPTIONS)
    soft = options["grpc.server.max_pending_requests"]
    hard = options["grpc.server.max_pending_requests_hard_limit"]
    assert soft >= 10_000 * 2  # each site's fetch and its first task poll
    assert hard > soft
    # and such a call waits for the loop longer than gRPC's 30 s before it is cancelled
    assert options["grpc.server_max_unrequested_time_in_server"] >= 120
