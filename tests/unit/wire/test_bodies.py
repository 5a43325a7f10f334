"""Each wire body's parser (wire/bodies.py) refuses what its consumer must never meet, naming the
body and the field; and takes what a well-behaved peer sends."""

from __future__ import annotations

import json

import pytest

from atoll.wire.bodies import (
    MAX_WORKER_BODY,
    AdminCall,
    BodyError,
    Heartbeat,
    Hello,
    JobState,
    SiteReport,
    WorkerNote,
)

PARSERS = [Hello, Heartbeat, JobState, SiteReport, AdminCall, WorkerNote]


@pytest.mark.parametrize("body", PARSERS)
@pytest.mark.parametrize("text", ["{", "[1]", '"x"', "3", "[" * 100_000])
def test_every_body_is_a_json_object(body, text):
    with pytest.raises(BodyError, match="not JSON|JSON object|are taken"):
        body.parse(text)


@pytest.mark.parametrize("capacity,field", [
    ([1], "capacity must"), ({"gpus": -1}, "capacity.gpus"), ({"gpus": True}, "capacity.gpus"),
    ({"cpus": 1.5}, "capacity.cpus"), ({"cpus": "4"}, "capacity.cpus"),
    ({"memory": "lots"}, "capacity.memory"), ({"memory": 7}, "capacity.memory")])
def test_a_hello_capacity_the_scheduler_cannot_compare_is_refused(capacity, field):
    with pytest.raises(BodyError, match=field):
        Hello.parse(json.dumps({"capacity": capacity}))


def test_a_hello_launcher_must_be_a_name():
    with pytest.raises(BodyError, match="launcher"):
        Hello.parse('{"launcher": ["process"]}')


def test_a_well_formed_hello_keeps_its_fields_and_document():
    doc = {"running_jobs": ["j1"], "capacity": {"gpus": 2, "cpus": 8, "memory": "64Gi"},
           "launcher": "docker", "version": "1.2.3", "authorization": {"x": 1}}
    hello = Hello.parse(json.dumps(doc))
    assert (hello.running_jobs, hello.capacity, hello.launcher, hello.version) == (
        ["j1"], doc["capacity"], "docker", "1.2.3")
    assert hello.doc == doc
    assert Hello.parse("").running_jobs == [] and Hello.parse("").capacity == {}


def test_a_heartbeat_lists_job_ids():
    assert Heartbeat.parse('{"running_jobs": ["a", "b"]}').running_jobs == ["a", "b"]
    with pytest.raises(BodyError, match="heartbeat's running_jobs"):
        Heartbeat.parse('{"running_jobs": "a"}')


def test_a_report_names_a_job_and_an_event_object():
    report = SiteReport.parse('{"job_id": "j1", "event": {"round": 1}}')
    assert (report.job_id, report.event) == ("j1", {"round": 1})
    with pytest.raises(BodyError, match="event must be a JSON object"):
        SiteReport.parse('{"job_id": "j1", "event": [1]}')
    with pytest.raises(ValueError, match="job_id"):
        SiteReport.parse('{"job_id": "../j1", "event": {}}')


@pytest.mark.parametrize("text", ['{"op": 3}', '{"op": ["list_jobs"]}', '[]'])
def test_an_admin_call_names_its_operation_by_text(text):
    with pytest.raises(BodyError, match='such as {"op": "list_jobs"}'):
        AdminCall.parse(text)
    assert AdminCall.parse('{"op": "list_jobs", "limit": 3}') == AdminCall(
        "list_jobs", {"op": "list_jobs", "limit": 3})
    assert AdminCall.parse("").op == ""


def test_a_worker_note_is_bounded():
    text = json.dumps({"note": "x" * MAX_WORKER_BODY})
    with pytest.raises(BodyError, match=f"at most {MAX_WORKER_BODY} are taken"):
        WorkerNote.parse(text)
    assert WorkerNote.parse('{"ok": true}').doc == {"ok": True}
