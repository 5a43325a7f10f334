"""The dashboard's listening socket: each connection it accepts sends at once (TCP_NODELAY).
Without it every small answer, headers then body, waited on the browser's delayed ACK (~40 ms
a file, most of a first page load)."""

from __future__ import annotations

import asyncio
import socket

from atoll.dashboard.serve import bind


def test_each_accepted_connection_has_tcp_nodelay():
    sock = bind("127.0.0.1", 0)

    async def accepted_nodelay() -> int:
        loop = asyncio.get_running_loop()
        seen = loop.create_future()

        def on_connect(reader, writer):
            raw = writer.get_extra_info("socket")
            seen.set_result(raw.getsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY))
            writer.close()

        server = await asyncio.start_server(on_connect, sock=sock)
        _, writer = await asyncio.open_connection(*sock.getsockname()[:2])
        try:
            return await asyncio.wait_for(seen, 30)
        finally:
            writer.close()
            server.close()
            await server.wait_closed()

    assert asyncio.run(accepted_nodelay()) != 0
