"""Every bad upload gets a clear refusal from a real server: INVALID_ARGUMENT naming the entry or
field, none of the server's paths in it, an audit entry, and nothing left in its workspace.

One test per case reported against intake (issue #20), then the cases around them.
"""

from __future__ import annotations

import io
import json
import warnings
import zipfile

import grpc
import pytest

from atoll.wire import messages as msg
from tests.integration.federation.conftest import ADMIN, USERS
from tests.integration.federation.harness import Federation
from tests.integration.federation.zips import job_zip, patch, signed, submit, zip_bytes


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    """A server alone (its site never starts: an accepted job would just wait)."""
    fed = Federation.provisioned(tmp_path_factory.mktemp("intake"), ["site-1"], USERS)
    fed.start_server()
    yield fed
    fed.stop_all()


@pytest.fixture(scope="module")
def session(server):
    with server.session(ADMIN) as s:
        yield s


def _refusals(session) -> list[dict]:
    entries = session.call("audit", limit=100_000)["entries"]
    return [e for e in entries if e["action"] == "submit" and e["outcome"] == "refused"]


def refused(server, session, data: bytes, expected: str, head: dict | None = None) -> str:
    """Submit; check the refusal and everything around it; the details."""
    workspace = server.workspace("server")
    jobs_before = sorted((workspace / "jobs").iterdir())
    audited = len(_refusals(session))
    code, details = submit(session, data, head)
    assert code == grpc.StatusCode.INVALID_ARGUMENT, (code, details)
    assert expected in details, details
    for path in (workspace, workspace.resolve(), server.root):
        assert str(path) not in details
    assert not list((workspace / "tmp").iterdir()), "an upload left files behind"
    assert sorted((workspace / "jobs").iterdir()) == jobs_before
    entries = _refusals(session)
    assert len(entries) == audited + 1 and entries[-1]["user"] == ADMIN
    return details


# -- the cases of the issue ------------------------------------------------------------------------

def test_an_entry_named_dot(server, session):
    refused(server, session, job_zip(extra={".": b"x"}), "entry '.' names the folder itself")


def test_a_file_and_a_folder_with_the_same_name(server, session):
    data = job_zip(extra={"app/data": b"x", "app/data/x.csv": b"1"})
    refused(server, session, data, "entry 'app/data' is both a file and a folder")


def test_2100_nested_folders(server, session):
    deep = "/".join(["d"] * 2100) + "/x.py"
    details = refused(server, session, job_zip(extra={deep: b"x"}), "is 2101 folders deep")
    assert "the limit is 32" in details and len(details) < 500


def test_meta_json_as_a_folder(server, session):
    data = zip_bytes({"meta.json/": None, "meta.json/x": b"{}", "app/app.yaml": b""})
    refused(server, session, data, "meta.json is a folder; it must be a file")


def test_meta_json_nested_200000_levels_deep(server, session):
    doc = b'{"name": "deep", "launcher_spec": ' + b"[" * 200_000 + b"]" * 200_000 + b"}"
    refused(server, session, job_zip(raw_meta=doc), "nests deeper than 32 levels")


def test_meta_nested_deeper_than_the_limit_names_its_key(server, session):
    nested: dict = {}
    for _ in range(40):
        nested = {"x": nested}
    meta = {"name": "deep", "deploy_map": {"app": ["server"]}, "resource_spec": nested}
    refused(server, session, job_zip(meta), "resource_spec: nests deeper than 32 levels")


@pytest.mark.parametrize("declared", [10, 10_000], ids=["smaller", "larger"])
def test_a_falsely_declared_size(server, session, declared):
    data = patch(job_zip(extra={"app/train.py": b"print('hello')\n" * 100}), "app/train.py",
                 file_size=declared)
    refused(server, session, data, "entry 'app/train.py' is damaged")


def test_a_request_body_that_is_a_list(server, session):
    for body in ("[]", '{"op": ["list_jobs"]}', "[" * 100_000):
        with pytest.raises(grpc.RpcError) as err:
            session.stub.Call(msg.Json(body=body), metadata=session._metadata(), timeout=30)
        assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT, body[:20]
        assert "JSON" in err.value.details()


def test_a_submit_header_naming_a_study_that_is_not_a_string(server, session):
    code, details = submit(session, job_zip(), head={"study": ["default"]})
    assert code == grpc.StatusCode.INVALID_ARGUMENT and "study must be" in details


# -- around them --------------------------------------------------------------------------------

def test_an_entry_given_twice(server, session):
    buffer = io.BytesIO()
    with warnings.catch_warnings(), zipfile.ZipFile(buffer, "w") as zf:
        warnings.simplefilter("ignore")  # zipfile warns of the duplicate it writes
        for name in ("meta.json", "app/a.py", "app/a.py"):
            zf.writestr(name, b"{}")
    refused(server, session, buffer.getvalue(), "entry 'app/a.py' appears twice")


def test_meta_json_that_is_not_utf8(server, session):
    refused(server, session, job_zip(raw_meta=b'{"name": "\xff\xfe"}'),
            "is not UTF-8 text (byte 10)")


@pytest.mark.parametrize("doc", [b"[]", b"42", b'"meta"', b"null"])
def test_meta_json_that_is_not_an_object(server, session, doc):
    refused(server, session, job_zip(raw_meta=doc), "must be a JSON object")


def test_meta_json_with_a_lone_surrogate(server, session):
    refused(server, session, job_zip(raw_meta=b'{"name": "\\ud800", "deploy_map": {}}'),
            "name: holds a lone surrogate")


def test_an_entry_name_marked_utf8_that_is_not(server, session):
    data = patch(job_zip(extra={"app/ab.py": b"x"}), "app/ab.py", flags=0x800,
                 new_name=b"app/\xff\xfe.py")
    refused(server, session, data, "marked UTF-8 but is not")


def test_an_entry_name_with_a_control_character(server, session):
    refused(server, session, job_zip(extra={"app/\x1b[2J.py": b"x"}), "control character")


def test_an_encrypted_entry(server, session):
    data = patch(job_zip(extra={"app/a.py": b"x"}), "app/a.py", flags=0x1)
    refused(server, session, data, "entry 'app/a.py' is encrypted")


def test_an_entry_of_patched_data(server, session):
    """Flag bit 5, which zipfile cannot read (found by `make fuzz`: it answered UNKNOWN)."""
    data = patch(job_zip(extra={"app/a.py": b"x"}), "app/a.py", flags=0x20)
    refused(server, session, data, "entry 'app/a.py' holds patched data")


def test_a_zip_version_the_server_cannot_read(server, session):
    """A central record asking for zip version 6.4 (found by `make fuzz`: it answered UNKNOWN)."""
    data = bytearray(job_zip(extra={"app/a.py": b"x"}))
    central = data.index(b"PK\x01\x02")
    data[central + 6:central + 8] = (64).to_bytes(2, "little")  # version needed to extract
    refused(server, session, bytes(data), "zip file version 6.4")


def test_a_name_too_long_for_the_file_system(server, session):
    refused(server, session, job_zip(extra={"app/" + "n" * 300: b"x"}), "has a name too long")


def test_more_entries_than_the_limit(server, session):
    many = {f"app/{i}": b"" for i in range(10_001)}
    refused(server, session, job_zip(extra=many), "the limit is 10000")


def test_an_upload_that_is_not_a_zip(server, session):
    refused(server, session, b"PK\x03\x04 not a zip at all", "not a zip archive")


def test_an_error_listing_thousands_of_problems_stays_short(server, session):
    targets = [f"bad name {i}" for i in range(5000)]
    meta = {"name": "many", "deploy_map": {"app": ["server", *targets]}}
    details = refused(server, session, job_zip(meta), "and 4,980 more problems")
    assert len(details.encode()) < 4000


def test_the_server_still_takes_a_good_job(server, session):
    code, body = submit(session, signed(job_zip(), session))
    assert code == grpc.StatusCode.OK, body
    assert json.loads(body)["state"] == "SUBMITTED"  # site-1 never comes: it waits
