"""local/authorization.json: FLARE's format is read as operators write it, every mistake is named
by its path, and each decision names the rule that made it."""

from __future__ import annotations

import json

import pytest

from atoll.pki.identity import ROLES as CERT_ROLES
from atoll.spec.authorization import (
    ROLES,
    Actor,
    default_policy,
    ignored_rights,
    load_policy,
    parse_policy,
)
from atoll.spec.errors import SpecError

# NVIDIA FLARE's sample site policy, as shipped in its startup kits (local/authorization.json).
FLARE_SAMPLE = {
    "format_version": "1.0",
    "permissions": {
        "project_admin": "any",
        "org_admin": {"submit_job": "none", "clone_job": "none", "manage_job": "o:submitter",
                      "download_job": "o:submitter", "view": "any", "operate": "o:site",
                      "shell_commands": "o:site", "byoc": "none"},
        "lead": {"submit_job": "any", "clone_job": "n:submitter", "manage_job": "n:submitter",
                 "download_job": "n:submitter", "view": "any", "operate": "o:site",
                 "shell_commands": "o:site", "byoc": "any"},
        "member": {"view": "any"},
    },
}
LEAD_A = Actor("lead@a.org", "org-a", "lead")
LEAD_B = Actor("lead@b.org", "org-b", "lead")


def test_roles_are_the_certificates_roles():
    assert ROLES == CERT_ROLES


def test_flare_sample_is_accepted_and_its_unused_rights_are_listed():
    policy = parse_policy(FLARE_SAMPLE)
    assert not policy.decide("submit_job", "s", Actor("o@a.org", "org-a", "org_admin"),
                             LEAD_A, "org-a").allowed
    assert policy.decide("byoc", "s", LEAD_A, LEAD_A, "org-a").allowed
    assert "permissions.lead.shell_commands" in ignored_rights(policy)


def test_every_problem_is_named_by_its_path():
    doc = {"format_version": "2", "permisions": {}, "permissions": {
        "lead": {"submit_job": "sometimes", "run": "any"}, "boss": "any", "member": 3},
        "code_approval": "maybe", "studies": {"alpha": {"permissions": [], "x": 1}}}
    with pytest.raises(SpecError) as err:
        parse_policy(doc)
    paths = {issue.path for issue in err.value.issues}
    assert paths == {"format_version", "permisions", "permissions.lead.submit_job",
                     "permissions.lead.run", "permissions.boss", "permissions.member",
                     "code_approval", "studies.alpha.permissions", "studies.alpha.x"}
    assert "use any, none, o:site, o:submitter, n:submitter" in str(err.value)


def test_comments_are_keys_starting_with_an_underscore():
    policy = parse_policy({"_comment": ["why"], "format_version": "1.0",
                           "permissions": {"lead": "any"},
                           "studies": {"alpha": {"_why": "x", "code_approval": "required"}}})
    assert policy.approval_required("alpha") and not policy.approval_required("beta")


@pytest.mark.parametrize(("condition", "user", "allowed", "fact"), [
    ("any", LEAD_B, True, "anyone"),
    ("none", LEAD_A, False, "no one"),
    ("o:site", LEAD_A, True, "lead@a.org's org 'org-a' is this site's org 'org-a'"),
    ("o:site", LEAD_B, False, "lead@b.org's org 'org-b' is not this site's org 'org-a'"),
])
def test_conditions_and_the_rule_named(condition, user, allowed, fact):
    policy = parse_policy({"format_version": "1.0",
                           "permissions": {"lead": {"submit_job": condition}}})
    decision = policy.decide("submit_job", "alpha", user, user, "org-a")
    assert decision.allowed is allowed
    assert decision.rule == "permissions.lead.submit_job"
    assert fact in decision.reason and "local/authorization.json" in decision.reason


def test_submitter_conditions_compare_the_user_with_the_submitter():
    policy = parse_policy({"format_version": "1.0", "permissions": {
        "lead": {"manage_job": "n:submitter"}, "org_admin": {"manage_job": "o:submitter"}}})
    org_admin_a = Actor("oa@a.org", "org-a", "org_admin")
    assert policy.decide("manage_job", "s", LEAD_A, LEAD_A, "x").allowed
    assert not policy.decide("manage_job", "s", LEAD_B, LEAD_A, "x").allowed
    assert policy.decide("manage_job", "s", org_admin_a, LEAD_A, "x").allowed
    assert not policy.decide("manage_job", "s", org_admin_a, LEAD_B, "x").allowed


def test_unlisted_roles_and_rights_are_not_granted():
    policy = parse_policy({"format_version": "1.0", "permissions": {"lead": {"view": "any"}}})
    decision = policy.decide("byoc", "s", LEAD_A, LEAD_A, "org-a")
    assert not decision.allowed and decision.rule == "permissions.lead"
    assert "does not grant byoc" in decision.reason
    member = Actor("m@a.org", "org-a", "member")
    assert policy.decide("submit_job", "s", member, member, "org-a").rule == "permissions"


def test_a_study_block_replaces_the_roles_it_names():
    policy = parse_policy({"format_version": "1.0", "permissions": {"lead": "any"},
                           "studies": {"alpha": {"permissions": {"lead": {"submit_job": "none"}}}}})
    decision = policy.decide("submit_job", "alpha", LEAD_A, LEAD_A, "org-a")
    assert not decision.allowed and decision.rule == "studies.alpha.permissions.lead.submit_job"
    decision = policy.decide("submit_job", "beta", LEAD_A, LEAD_A, "org-a")
    assert decision.allowed and decision.rule == "permissions.lead"


def test_no_file_means_the_default_which_keeps_atolls_behaviour(tmp_path):
    policy = load_policy(tmp_path)
    for role in ("project_admin", "org_admin", "lead"):
        user = Actor("u@x.org", "x", role)
        assert all(policy.decide(r, "s", user, user, "y").allowed for r in ("submit_job", "byoc"))
    member = Actor("m@x.org", "x", "member")
    assert not policy.decide("submit_job", "s", member, member, "x").allowed
    assert not policy.approval_required("s")
    assert policy.permissions == default_policy().permissions


def test_a_file_that_is_not_json_says_so(tmp_path):
    (tmp_path / "authorization.json").write_text("{permissions: any}")
    with pytest.raises(SpecError, match=r"(?s)local/authorization.json: 1 problem.*not valid JSON"):
        load_policy(tmp_path)


def test_the_summary_a_site_announces_reads_back_as_a_policy():
    policy = parse_policy({**FLARE_SAMPLE, "studies": {
        "alpha": {"permissions": {"lead": {"download_job": "none", "submit_job": "any"}}}}})
    summary = json.loads(json.dumps(policy.summary()))
    again = parse_policy(summary)
    assert again.permissions["project_admin"] == {"*": "any"}
    assert again.permissions["lead"] == {"manage_job": "n:submitter",
                                         "download_job": "n:submitter"}
    assert not again.decide("download_job", "alpha", LEAD_A, LEAD_A, "x").allowed
