"""The server enforces manage_job and download_job for the sites of a job, from the policy each
site announced in its hello (server/site_policies.py): the first site that refuses is named with
its rule; the server part is never a site; a site's last readable policy is remembered after it
disconnects, and a new hello replaces it."""

from __future__ import annotations

from types import SimpleNamespace

from atoll.pki.identity import Identity
from atoll.server.site_policies import SitePolicies

SUBMITTER = Identity("ann@a.org", "a", "admin", "lead")
OTHER_LEAD = Identity("bob@b.org", "b", "admin", "lead")


def policy(download: str) -> dict:
    return {"format_version": "1.0",
            "permissions": {"lead": {"manage_job": "n:submitter", "download_job": download}}}


class Links:
    def __init__(self, **links):
        self.links = links

    def get(self, site):
        return self.links.get(site)


def link(doc, org="a"):
    return SimpleNamespace(hello={"authorization": doc} if doc is not None else {}, org=org)


def record(*sites, study="pathology"):
    return SimpleNamespace(parts={"server": {}, **{s: {} for s in sites}}, study=study,
                           submitter=SUBMITTER.name, submitter_org=SUBMITTER.org)


def test_a_site_that_grants_only_the_submitter_refuses_another_lead():
    policies = SitePolicies(Links(**{"site-1": link(policy("n:submitter"))}))
    why = policies.refusal(OTHER_LEAD, record("site-1"), "download_job")
    assert why is not None
    assert why.startswith("site site-1 refuses (rule permissions.lead.download_job): ")
    assert "bob@b.org" in why
    assert policies.refusal(SUBMITTER, record("site-1"), "download_job") is None


def test_the_first_refusing_site_in_name_order_is_named():
    links = Links(**{"site-a": link(policy("any")), "site-b": link(policy("n:submitter")),
                     "site-c": link(policy("n:submitter"))})
    why = SitePolicies(links).refusal(OTHER_LEAD, record("site-c", "site-a", "site-b"),
                                      "download_job")
    assert why.startswith("site site-b refuses")
    assert SitePolicies(links).refusal(OTHER_LEAD, record("site-a"), "download_job") is None


def test_sites_the_server_has_not_heard_from_and_the_server_part_are_not_consulted():
    links = Links(server=link(policy("none")), **{"site-2": link(None)})
    policies = SitePolicies(links)
    # "server" has a link here, with a refusing policy: it is not a site of the job
    assert policies.refusal(OTHER_LEAD, record("site-1", "site-2"), "download_job") is None


def test_a_policy_is_remembered_after_its_site_disconnects():
    links = Links(**{"site-1": link(policy("n:submitter"))})
    policies = SitePolicies(links)
    assert policies.refusal(OTHER_LEAD, record("site-1"), "download_job") is not None
    del links.links["site-1"]  # the site went away: what it announced still holds
    assert policies.refusal(OTHER_LEAD, record("site-1"), "download_job") is not None


def test_a_new_hello_replaces_the_policy_and_an_unreadable_one_keeps_the_last(caplog):
    links = Links(**{"site-1": link(policy("n:submitter"))})
    policies = SitePolicies(links)
    assert policies.refusal(OTHER_LEAD, record("site-1"), "download_job") is not None
    links.links["site-1"] = link(policy("any"))  # reconnected with a looser policy
    assert policies.refusal(OTHER_LEAD, record("site-1"), "download_job") is None
    links.links["site-1"] = link({"format_version": "9", "permissions": "?"})
    assert policies.refusal(OTHER_LEAD, record("site-1"), "download_job") is None
    assert "site site-1 announced a policy the server cannot read" in caplog.text
    links.links["site-1"] = link(policy("n:submitter"))
    assert policies.refusal(OTHER_LEAD, record("site-1"), "download_job") is not None

