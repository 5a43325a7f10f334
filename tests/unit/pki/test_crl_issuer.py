"""A revocation list names its issuer: one of another CA is refused naming both, before its
signature is even tried (pki/crl.py)."""

from __future__ import annotations

import datetime as dt

import pytest

from atoll.pki.ca import create_ca
from atoll.pki.crl import Entry, build_crl
from atoll.pki.revocation import CRLError, verify


def test_a_list_issued_by_another_ca_is_refused_naming_both(tmp_path):
    ours, theirs = create_ca("pathology-consortium"), create_ca("another-project")
    ca_file = tmp_path / "rootCA.pem"
    ca_file.write_bytes(ours.cert_pem())
    entry = Entry(7, dt.datetime.now(dt.UTC), "unspecified")
    with pytest.raises(CRLError, match="the revocation list was issued by .*another-project.*, "
                                       "not by this project's CA .*pathology-consortium"):
        verify(build_crl(theirs, [entry], 1).decode(), ca_file)
    assert 7 in verify(build_crl(ours, [entry], 1).decode(), ca_file).entries
