"""What a site sends the server names jobs by ids of their grammar (wire/bodies.py, parsed by
server/federation_service.py)."""

from __future__ import annotations

import json

import pytest

from atoll.wire.bodies import Hello, JobState
from atoll.wire.bodies import job_ids as _job_ids

BAD = ["../x", "a/b", "x\n", "", "a\0b", 7, None, "x" * 65]


@pytest.mark.parametrize("job_id", BAD)
def test_a_hello_or_heartbeat_listing_a_crafted_job_id_is_refused(job_id):
    with pytest.raises(ValueError, match="running_jobs"):
        Hello.parse(json.dumps({"running_jobs": ["ok", job_id]}))
    with pytest.raises(ValueError, match="running_jobs"):
        _job_ids([job_id], "heartbeat")


def test_running_jobs_are_bounded():
    with pytest.raises(ValueError, match="at most 10,000"):
        _job_ids(["j"] * 10_001, "hello")
    assert _job_ids(["0123456789abcdef0123456789abcdef", "j1"], "hello") == [
        "0123456789abcdef0123456789abcdef", "j1"]


@pytest.mark.parametrize("job_id", BAD)
def test_a_job_state_of_a_crafted_job_id_is_refused(job_id):
    with pytest.raises(ValueError, match="job_state's job_id"):
        JobState.parse(json.dumps({"job_id": job_id, "state": "RUNNING"}))


@pytest.mark.parametrize("state", [None, "", "x" * 65, 3])
def test_a_job_state_without_a_state_name_is_refused(state):
    with pytest.raises(ValueError, match="state name"):
        JobState.parse(json.dumps({"job_id": "j1", "state": state}))


# -- the handlers themselves: an id out of its grammar is refused before any lookup --------------
class Aborted(Exception):
    def __init__(self, code, details):
        super().__init__(details)
        self.code, self.details = code, details


class SiteCall:
    """What a handler reads of a call from site-1: its verified subject (the revocation list is
    not loaded in this process, so no certificate is refused), and an abort that ends it."""

    def auth_context(self):
        return {"x509_pem_cert": [b"unused"], "x509_subject": [b"OU=site,O=org,CN=site-1"]}

    async def abort(self, code, details):
        raise Aborted(code, details)


class Jobs:
    """The server's jobs as the handler sees them: every lookup is recorded, none is running."""

    def __init__(self):
        self.asked = []

    def running_at(self, job_id, site):
        self.asked.append((job_id, site))


def _service(jobs):
    from atoll.server.federation_service import FederationService

    return FederationService(store=None, jobs=jobs, studies=None, links=None, revocations=None,
                             wake=lambda: None, stopping=lambda: False)


async def _frames(*raw):
    for item in raw:
        yield item


def _refusal(call) -> Aborted:
    import asyncio

    with pytest.raises(Aborted) as err:
        asyncio.run(call)
    return err.value


@pytest.mark.parametrize("field", ["job_id", "task_id"])
@pytest.mark.parametrize("bad", ["../x", "a/b", "x" * 65, 7])
def test_a_reply_naming_a_crafted_job_or_task_id_is_refused_before_any_lookup(field, bad):
    import grpc

    from atoll.wire import frames

    jobs = Jobs()
    head = {"job_id": "j1", "task_id": "t1", "headers": {}, field: bad}
    refused = _refusal(_service(jobs).PushReply(_frames(frames.header(head)), SiteCall()))
    assert refused.code == grpc.StatusCode.INVALID_ARGUMENT, refused.details
    assert field in refused.details
    assert jobs.asked == []
    # the control: ids of their grammar reach the lookup (here: no such job running)
    ok = _refusal(_service(jobs).PushReply(_frames(frames.header(
        {"job_id": "j1", "task_id": "t1", "headers": {}})), SiteCall()))
    assert ok.code == grpc.StatusCode.NOT_FOUND and jobs.asked == [("j1", "site-1")]


@pytest.mark.parametrize("bad", ["../x", "a/b", "x" * 65, None])
def test_a_report_naming_a_crafted_job_id_is_refused_before_any_lookup(bad):
    import grpc

    from atoll.wire import messages as msg

    jobs = Jobs()
    body = json.dumps({"job_id": bad, "event": {"kind": "progress"}})
    refused = _refusal(_service(jobs).Report(msg.Json(body=body), SiteCall()))
    assert refused.code == grpc.StatusCode.INVALID_ARGUMENT, refused.details
    assert "job_id" in refused.details and jobs.asked == []
    body = json.dumps({"job_id": "j1", "event": {"kind": "progress"}})
    ok = _refusal(_service(jobs).Report(msg.Json(body=body), SiteCall()))
    assert ok.code == grpc.StatusCode.NOT_FOUND and jobs.asked == [("j1", "site-1")]


# -- the same on a site's task stream (Federation.Tasks) -----------------------------------------
async def _drain(handler) -> list[bytes]:
    return [raw async for raw in handler]


@pytest.mark.parametrize("bad", ["../x", "a/b", "x" * 65, 7, None])
def test_a_task_stream_for_a_crafted_job_id_is_refused_before_any_lookup(bad):
    import grpc

    from atoll.wire import frames

    jobs = Jobs()
    opened = frames.header({"job_id": bad})
    pull = frames.header({"pull": 1})
    refused = _refusal(_drain(_service(jobs).Tasks(_frames(opened, pull), SiteCall())))
    assert refused.code == grpc.StatusCode.INVALID_ARGUMENT and "job_id" in refused.details
    assert jobs.asked == []
    # the control: a job id of its grammar is looked up, and a job not running here ends
    sent = __import__("asyncio").run(_drain(_service(jobs).Tasks(
        _frames(frames.header({"job_id": "j1"}), pull), SiteCall())))
    assert [frames.read_header(raw) for raw in sent] == [{"end": True}]
    assert jobs.asked == [("j1", "site-1")]


@pytest.mark.parametrize("reply", [{"task_id": "../t"}, {"task_id": 7},
                                   {"task_id": "t1", "headers": [1]}])
def test_a_reply_on_a_task_stream_out_of_its_grammar_is_refused_before_any_lookup(reply):
    import grpc

    from atoll.wire import frames

    jobs = Jobs()
    sent = _frames(frames.header({"job_id": "j1"}), frames.header({"reply": reply}),
                   frames.data(b"x"), frames.header({"sent": True}))
    refused = _refusal(_drain(_service(jobs).Tasks(sent, SiteCall())))
    assert refused.code == grpc.StatusCode.INVALID_ARGUMENT, refused.details
    assert jobs.asked == []


@pytest.mark.parametrize("op", [{}, {"reply": "t1"}, {"push": 1}])
def test_a_task_stream_operation_that_is_neither_pull_nor_reply_is_refused(op):
    import grpc

    from atoll.wire import frames

    sent = _frames(frames.header({"job_id": "j1"}), frames.header(op))
    refused = _refusal(_drain(_service(Jobs()).Tasks(sent, SiteCall())))
    assert refused.code == grpc.StatusCode.INVALID_ARGUMENT
    assert "pull" in refused.details and "reply" in refused.details
