"""Generated uploads thrown at a live server through the real Admin API, with a real user's
certificate: each must be refused clearly (or accepted: then it waits for a site that never
comes), with no server path in the answer and nothing left in the server's workspace, and the
server must keep answering another caller.

`make test` runs 1,000 cases; `make fuzz` 10,000 (ATOLL_FUZZ_EXAMPLES sets the number).
"""

from __future__ import annotations

import json
import os

import grpc
import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from atoll.wire import messages as msg
from tests.fuzz.intake_cases import RANDOM_JSON, uploads
from tests.integration.federation.harness import Federation
from tests.integration.federation.zips import job_zip, signed, submit

EXAMPLES = int(os.environ.get("ATOLL_FUZZ_EXAMPLES", "1000"))
FUZZ = settings(max_examples=EXAMPLES, deadline=None, database=None,
                suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large,
                                       HealthCheck.large_base_example])
LEAD, OTHER = "lead@fuzz.org", "other@fuzz.org"
USERS = [{"name": LEAD, "org": "fuzz", "role": "project_admin"},
         {"name": OTHER, "org": "fuzz", "role": "member"}]
# What a hostile upload must never cause: a crash answered as such, a dead or hung server.
BROKEN = {grpc.StatusCode.UNKNOWN, grpc.StatusCode.INTERNAL, grpc.StatusCode.UNAVAILABLE,
          grpc.StatusCode.DEADLINE_EXCEEDED, grpc.StatusCode.CANCELLED}


@pytest.fixture(scope="module")
def fed(tmp_path_factory):
    fed = Federation.provisioned(tmp_path_factory.mktemp("fuzz"), ["site-1"], USERS)
    fed.start_server()
    yield fed
    fed.stop_all()


@pytest.fixture(scope="module")
def sessions(fed):
    with fed.session(LEAD) as lead, fed.session(OTHER) as other:
        yield lead, other


def _refused(session) -> int:
    entries = session.call("audit", limit=10**6)["entries"]
    return sum(e["action"] == "submit" and e["outcome"] == "refused" for e in entries)


def _check_answer(fed, code: grpc.StatusCode, details: str) -> None:
    assert code not in BROKEN, (code, details)
    if code != grpc.StatusCode.OK:
        assert details.strip(), code
    for path in {fed.root, fed.root.resolve(), fed.workspace("server")}:
        assert str(path) not in details, details


# pytest's 300 s per test is for a sample; `make fuzz` runs ten times as many cases.
@pytest.mark.timeout(max(300, EXAMPLES))
def test_generated_uploads_are_refused_clearly(fed, sessions):
    lead, other = sessions
    tmp = fed.workspace("server") / "tmp"
    seen: dict[grpc.StatusCode, int] = {}
    audited = _refused(lead)
    accepted: list[str] = []

    @FUZZ
    @given(data=uploads())
    @example(data=job_zip())  # a job intake takes: the accepted path is always walked
    def case(data: bytes) -> None:
        code, details = submit(lead, signed(data, lead))  # past the signature: to intake
        seen[code] = seen.get(code, 0) + 1
        _check_answer(fed, code, details)
        if code == grpc.StatusCode.OK:  # accepted: stopped before anything could start it
            job_id = json.loads(details)["job_id"]
            lead.abort(job_id)
            accepted.append(job_id)
        assert not list(tmp.iterdir()), f"left behind: {sorted(tmp.iterdir())}"
        assert other.whoami()["user"] == OTHER  # another caller is still served

    case()
    # Every refusal is in the audit log, each once.
    assert _refused(lead) - audited == seen.get(grpc.StatusCode.INVALID_ARGUMENT, 0)
    assert seen.get(grpc.StatusCode.INVALID_ARGUMENT, 0) > EXAMPLES // 2, seen
    # What was accepted is exactly what the store holds, each job stopped as asked; nothing
    # refused was stored.
    assert accepted, f"no generated upload was accepted: {seen}"
    jobs = {job["job_id"]: job for job in lead.list_jobs()}
    assert sorted(jobs) == sorted(accepted)
    for job_id in accepted:
        assert lead.status(job_id)["state"] == "FINISHED:ABORTED", lead.status(job_id)


def test_generated_request_bodies_are_refused_clearly(fed, sessions):
    """Admin calls with generated bodies, as a member (who can change nothing of note)."""
    _, other = sessions
    ops = st.sampled_from(["list_jobs", "job_status", "job_logs", "whoami", "list_sites",
                           "audit", "nope", ""])
    bodies = st.one_of(
        RANDOM_JSON.map(json.dumps),
        st.builds(lambda op, rest: json.dumps({"op": op, **rest}), ops,
                  st.dictionaries(st.sampled_from(["job_id", "since", "wait_s", "study",
                                                   "limit", "only_study"]),
                                  RANDOM_JSON, max_size=3)),
        st.text(max_size=20),
        st.sampled_from(["[" * 100_000, '{"op":' * 50_000]),
    )

    @settings(FUZZ, max_examples=max(EXAMPLES // 5, 50))
    @given(body=bodies)
    def case(body: str) -> None:
        try:
            other.stub.Call(msg.Json(body=body), metadata=other._metadata(), timeout=30)
        except grpc.RpcError as exc:
            _check_answer(fed, exc.code(), exc.details() or "")

    case()
