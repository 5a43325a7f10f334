"""What atoll says when bwrap cannot make a sandbox: the host setting that restricts user
namespaces, with its fix (docs/operations.md, User namespaces)."""

from __future__ import annotations

import sys

import pytest

from atoll.launchers.process_sandbox import (
    SandboxHost,
    SandboxUnavailable,
    check_sandbox,
    userns_restrictions,
)


def _sysctl(tmp_path, **values):
    for name, value in values.items():
        path = tmp_path / name.replace("__", "/")
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(f"{value}\n")
    return tmp_path


def test_ubuntus_apparmor_restriction_is_named_with_the_bwrap_to_allow(tmp_path):
    sysctl = _sysctl(tmp_path, kernel__apparmor_restrict_unprivileged_userns=1,
                     kernel__unprivileged_userns_clone=1, user__max_user_namespaces=63000)
    found = userns_restrictions("/opt/atoll/bwrap", sysctl)
    assert len(found) == 1
    assert "kernel.apparmor_restrict_unprivileged_userns = 1" in found[0]
    assert "allow `userns` for /opt/atoll/bwrap in an AppArmor profile" in found[0]


def test_each_known_restriction_is_found_and_an_open_host_has_none(tmp_path):
    closed = _sysctl(tmp_path / "closed", kernel__unprivileged_userns_clone=0,
                     user__max_user_namespaces=0)
    assert [f.split(" (")[1].split(")")[0] for f in userns_restrictions("bwrap", closed)] == [
        "kernel.unprivileged_userns_clone = 0", "user.max_user_namespaces = 0"]
    opened = _sysctl(tmp_path / "open", kernel__apparmor_restrict_unprivileged_userns=0,
                     user__max_user_namespaces=15000)
    assert userns_restrictions("bwrap", opened) == []
    assert userns_restrictions("bwrap", tmp_path / "absent") == []


def test_a_bwrap_that_fails_is_quoted_with_the_opt_out(tmp_path):
    # a stand-in for a bwrap refused by the kernel (this host's own settings cannot be changed
    # by a test): it fails as bwrap does there
    fake = tmp_path / "bwrap"
    fake.write_text("#!/bin/sh\necho 'bwrap: setting up uid map: Permission denied' >&2\nexit 1\n")
    fake.chmod(0o755)
    host = SandboxHost(str(fake), (("/usr", ""),), ())
    with pytest.raises(SandboxUnavailable) as err:
        check_sandbox(host, sys.executable)
    text = str(err.value)
    assert "could not make a sandbox here: bwrap: setting up uid map: Permission denied" in text
    assert "`process: {sandbox: none}`" in text
