"""A site's task stream as the server serves it (`Federation.Tasks`, federation_service.py):
pulls and replies of many rounds on one call, against a real relay; a reply the site leaves
unfinished is never delivered half, and may be sent again."""

from __future__ import annotations

import asyncio
import threading

import grpc
import pytest

from atoll.server.relay import JobRelay
from atoll.server.spool import Budget
from atoll.wire import frames
from tests.unit.server.test_site_identifiers import Aborted, SiteCall, _service

SITE = "site-1"


class Live:
    def __init__(self, relay: JobRelay):
        self.relay = relay


class Jobs:
    def __init__(self, relay: JobRelay):
        self.live = Live(relay)

    def running_at(self, job_id, site):
        return self.live if (job_id, site) == ("j1", SITE) else None


class Site:
    """The site's side of one Tasks call: what it sends, fed as the test goes."""

    def __init__(self, service, relay, call=None):
        self.sent: asyncio.Queue[bytes | None] = asyncio.Queue()
        self.handler = service.Tasks(self._requests(), call or SiteCall()).__aiter__()
        self.relay = relay

    async def _requests(self):
        while (raw := await self.sent.get()) is not None:
            yield raw

    def send(self, *heads_or_frames) -> None:
        for item in heads_or_frames:
            self.sent.put_nowait(frames.header(item) if isinstance(item, dict) else item)

    async def read(self) -> bytes:
        return await self.handler.__anext__()


def _relay(tmp_path) -> JobRelay:
    return JobRelay("j1", tmp_path, [SITE], Budget(1 << 20))


def _task(relay: JobRelay, round_: int, data: bytes) -> str:
    writer = threading.Thread(target=relay.add_task,
                              args=([SITE], "train", {"round": round_}, [frames.data(data)]))
    writer.start()
    writer.join(5)
    return relay._queues[SITE][-1]


async def _took_a_task(service, relay: JobRelay) -> tuple[Site, str]:
    """A site that opened its task stream and took a task (whole: its header and data)."""
    site = Site(service, relay)
    task_id = _task(relay, 1, b"t")
    site.send({"job_id": "j1"}, {"pull": 5})
    for _ in range(2):
        await site.read()
    return site, task_id


def test_rounds_of_pulls_and_replies_go_on_one_call(tmp_path):
    relay = _relay(tmp_path)
    service = _service(Jobs(relay))
    more = threading.Event()

    def live_payload():  # a task still arriving when it is sent: no count, closed by {done}
        yield frames.data(b"\x02" * 10)
        more.wait(5)

    async def main():
        site = Site(service, relay)
        site.send({"job_id": "j1"}, {"pull": 5})  # round 0 asks; later replies ask ahead
        for round_ in range(3):
            if round_ < 2:
                task_id = _task(relay, round_, bytes([round_]) * 10)
            else:  # the pull waits already; the task comes while it is read
                threading.Thread(target=relay.add_task, args=(
                    [SITE], "train", {"round": 2}, live_payload())).start()
            head = frames.read_header(await site.read())
            task_id = head["task_id"]
            whole = {"frames": 1} if round_ < 2 else {}
            assert head == {"task_id": task_id, "topic": "train", "headers": {"round": round_},
                            **whole}
            assert await site.read() == frames.data(bytes([round_]) * 10)
            if round_ == 2:
                more.set()
                assert frames.read_header(await site.read()) == {"done": True}
            ahead = {"pull": 5} if round_ < 2 else {}
            site.send({"reply": {"task_id": task_id, "headers": {"round": round_}}},
                      frames.data(b"r" * round_), {"sent": True, **ahead})
            assert frames.read_header(await site.read()) == {"ack": {}}
            reply = relay.next_reply(task_id, 0)
            assert reply is not None and reply.site == SITE
            assert list(reply.spool.read("workflow")) == [frames.data(b"r" * round_)]
        site.send({"pull": 0})
        assert frames.read_header(await site.read()) == {"none": True}
        relay.end()
        site.send({"pull": 5})
        assert frames.read_header(await site.read()) == {"end": True}
        with pytest.raises(StopAsyncIteration):  # the server ends the call after {end}
            await site.read()

    asyncio.run(main())


@pytest.mark.parametrize("cut", ["ends", "another header"])
def test_a_reply_left_unfinished_is_refused_and_never_delivered(tmp_path, cut):
    relay = _relay(tmp_path)
    service = _service(Jobs(relay))

    async def main():
        site, task_id = await _took_a_task(service, relay)
        site.send({"reply": {"task_id": task_id, "headers": {}}}, frames.data(b"half"))
        site.send(None if cut == "ends" else frames.header({"pull": 1}))
        with pytest.raises(Aborted) as err:
            await site.read()
        return task_id, err.value

    task_id, refused = asyncio.run(main())
    assert refused.code == grpc.StatusCode.FAILED_PRECONDITION
    assert "sent" in refused.details
    assert relay.next_reply(task_id, 0) is None  # nothing half-received reached the workflow
    relay.open_reply(SITE, task_id, {}).abandon()  # and the site may send it again


def test_a_reply_of_known_size_needs_no_end_marker_and_asks_for_the_next_task(tmp_path):
    relay = _relay(tmp_path)
    service = _service(Jobs(relay))
    data = [frames.data(b"a" * 5), frames.data(b"b" * 7)]

    async def main():
        site, first = await _took_a_task(service, relay)
        second = _task(relay, 2, b"u")
        site.send({"reply": {"task_id": first, "headers": {}},
                   "bytes": sum(map(len, data)), "pull": 5}, *data)
        assert frames.read_header(await site.read()) == {"ack": {}}
        head = frames.read_header(await site.read())  # the next task, asked for in the header
        return first, second, head

    first, second, head = asyncio.run(main())
    assert head["task_id"] == second
    reply = relay.next_reply(first, 0)
    assert reply is not None and list(reply.spool.read("workflow")) == data


@pytest.mark.parametrize(("size", "code"), [
    (3, grpc.StatusCode.FAILED_PRECONDITION),  # a frame past its bytes
    (50, grpc.StatusCode.FAILED_PRECONDITION),  # the call ends before its bytes came
    (-1, grpc.StatusCode.INVALID_ARGUMENT), (True, grpc.StatusCode.INVALID_ARGUMENT),
    ("12", grpc.StatusCode.INVALID_ARGUMENT)])
def test_a_reply_whose_bytes_do_not_match_its_data_is_refused_and_never_delivered(
        tmp_path, size, code):
    relay = _relay(tmp_path)
    service = _service(Jobs(relay))

    async def main():
        site, task_id = await _took_a_task(service, relay)
        site.send({"reply": {"task_id": task_id, "headers": {}}, "bytes": size},
                  frames.data(b"0123456789"), None)
        with pytest.raises(Aborted) as err:
            await site.read()
        return task_id, err.value

    task_id, refused = asyncio.run(main())
    assert refused.code == code, refused.details
    assert relay.next_reply(task_id, 0) is None


def test_a_compact_call_takes_a_round_in_one_message_each_way(tmp_path):
    """A site that opens `compact` gets a small complete task inside its header's message, and
    its inline reply's ack with the next task: a round of a small model is one message each
    way. A task larger than INLINE_MAX still goes as data frames."""
    relay = _relay(tmp_path)
    service = _service(Jobs(relay))
    big = b"b" * (frames.INLINE_MAX + 1)

    async def main():
        site = Site(service, relay)
        first = _task(relay, 1, b"t1")
        site.send({"job_id": "j1", "compact": True}, {"pull": 5})
        head, inline = frames.read_message(await site.read())
        assert head == {"task_id": first, "topic": "train", "headers": {"round": 1},
                        "bytes": 2}
        assert bytes(inline) == b"t1"
        second = _task(relay, 2, b"t2")
        site.send(frames.header({"reply": {"task_id": first, "headers": {}}, "bytes": 3,
                                 "pull": 5}, b"r-1"))
        head, inline = frames.read_message(await site.read())
        assert head == {"ack": {}, "task_id": second, "topic": "train",
                        "headers": {"round": 2}, "bytes": 2}
        assert bytes(inline) == b"t2"
        third = _task(relay, 3, big)
        site.send(frames.header({"reply": {"task_id": second, "headers": {}}, "bytes": 0,
                                 "pull": 5}, b""))
        head, inline = frames.read_message(await site.read())
        assert inline is None
        assert head == {"ack": {}, "task_id": third, "topic": "train",
                        "headers": {"round": 3}, "frames": 1}
        assert await site.read() == frames.data(big)
        return first, second

    first, second = asyncio.run(main())
    reply = relay.next_reply(first, 0)
    assert reply is not None and list(reply.spool.read("workflow")) == [frames.data(b"r-1")]
    reply = relay.next_reply(second, 0)
    assert reply is not None and list(reply.spool.read("workflow")) == []


class NamedCall(SiteCall):
    def __init__(self, name: str):
        self.name = name

    def auth_context(self):
        return {"x509_pem_cert": [b"unused"],
                "x509_subject": [f"OU=site,O=org,CN={self.name}".encode()]}


class AnyOf(Jobs):
    def __init__(self, relay: JobRelay, sites: list[str]):
        super().__init__(relay)
        self.sites = sites

    def running_at(self, job_id, site):
        return self.live if job_id == "j1" and site in self.sites else None


def test_the_sites_of_a_round_are_sent_one_message_not_a_copy_each(tmp_path):
    """gRPC holds a stream's last message until its next: while 10,000 sites train, the server
    holds one round's task once, not once a site. A site whose message differs (here: no ack
    before it) gets its own."""
    sites = ["site-1", "site-2", "late"]
    relay = JobRelay("j1", tmp_path, sites, Budget(1 << 20))
    service = _service(AnyOf(relay, sites))

    def task(round_: int) -> str:
        writer = threading.Thread(target=relay.add_task,
                                  args=(sites, "train", {"round": round_}, [frames.data(b"t")]))
        writer.start()
        writer.join(5)
        return relay._queues["site-1"][-1]

    async def main():
        early = [Site(service, relay, NamedCall(name)) for name in sites[:2]]
        first = task(1)
        for site in early:
            site.send({"job_id": "j1", "compact": True}, {"pull": 5})
        one, two = [await site.read() for site in early]
        assert one is two and frames.read_message(one)[0]["task_id"] == first
        second = task(2)
        for site in early:
            site.send(frames.header({"reply": {"task_id": first, "headers": {}}, "bytes": 1,
                                     "pull": 5}, b"r"))
        acked, also = [await site.read() for site in early]
        assert acked is also
        assert frames.read_message(acked)[0] == {"ack": {}, "task_id": second,
                                                 "topic": "train", "headers": {"round": 2},
                                                 "bytes": 1}
        late = Site(service, relay, NamedCall("late"))  # round 1, as the others got it
        late.send({"job_id": "j1", "compact": True}, {"pull": 5})
        assert await late.read() is one
        late.send({"pull": 5})  # round 2 with no reply, so no ack, before it
        alone = await late.read()
        assert frames.read_message(alone)[0] == {"task_id": second, "topic": "train",
                                                 "headers": {"round": 2}, "bytes": 1}

    asyncio.run(main())


def test_a_call_not_opened_compact_gets_no_payload_inline(tmp_path):
    relay = _relay(tmp_path)
    service = _service(Jobs(relay))

    async def main():
        site, task_id = await _took_a_task(service, relay)  # its header, then a data frame
        site.send(frames.header({"reply": {"task_id": task_id, "headers": {}}, "bytes": 1,
                                 "pull": 5}, b"r"))
        assert frames.read_header(await site.read()) == {"ack": {}}  # on its own
        return task_id

    task_id = asyncio.run(main())
    reply = relay.next_reply(task_id, 0)
    assert reply is not None and list(reply.spool.read("workflow")) == [frames.data(b"r")]


@pytest.mark.parametrize("message", [
    frames.header({"reply": {"task_id": "t1", "headers": {}}, "bytes": 5, "pull": 5}, b"r"),
    frames.header({"reply": {"task_id": "t1", "headers": {}}, "pull": 5}, b"r"),
    frames.header({"pull": 5}, b"r"),  # only a reply carries a payload
    frames.header({"reply": {"task_id": "t1", "headers": {}}}) + b"\x1a\x05r",  # cut short
], ids=["bytes differ", "bytes missing", "on a pull", "cut short"])
def test_an_inline_reply_out_of_its_shape_is_refused_and_never_delivered(tmp_path, message):
    relay = _relay(tmp_path)
    service = _service(Jobs(relay))

    async def main():
        site, task_id = await _took_a_task(service, relay)
        site.send(message)
        with pytest.raises(Aborted) as err:
            await site.read()
        return task_id, err.value

    task_id, refused = asyncio.run(main())
    assert refused.code == grpc.StatusCode.INVALID_ARGUMENT, refused.details
    assert relay.next_reply(task_id, 0) is None
