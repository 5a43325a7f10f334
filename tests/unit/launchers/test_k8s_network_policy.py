"""Each Kubernetes job has its own NetworkPolicy (issue 32, item 6): its Pods reach each other
and their parent's worker port, nothing else, and only its own Pods reach them."""

from __future__ import annotations

from typing import Any

import pytest

from atoll.launchers.base import LaunchError
from atoll.launchers.kubernetes_render import render, render_network_policy
from tests.golden import assert_golden
from tests.unit.launchers.test_k8s_render import JOB_ID, request_for

OWN = {"matchLabels": {"atoll.dev/job-id": JOB_ID, "atoll.dev/site": "hospital-a",
                       "atoll.dev/role": "site"}}
POD_NETWORK = {"namespace": "fl-jobs"}  # a real cluster: pods have their own network


def policy(parent: str = "10.244.1.7:7001", **k8s: Any) -> dict[str, Any]:
    return render_network_policy(request_for(k8s={**POD_NETWORK, **k8s}, parent=parent))


def test_the_policy_golden() -> None:
    assert_golden("k8s/network_policy_parent_ip", policy())


def test_only_the_jobs_own_pods_and_the_parents_port() -> None:
    spec = policy()["spec"]
    assert spec["podSelector"] == OWN
    assert spec["policyTypes"] == ["Ingress", "Egress"]  # both closed but for what is listed
    assert spec["ingress"] == [{"from": [{"podSelector": OWN}]}]
    assert spec["egress"] == [
        {"to": [{"podSelector": OWN}]},
        {"to": [{"ipBlock": {"cidr": "10.244.1.7/32"}}],
         "ports": [{"protocol": "TCP", "port": 7001}]},
    ]


def test_the_pod_is_selected_by_its_policy() -> None:
    rendered = render(request_for(k8s=POD_NETWORK, parent="10.244.1.7:7001"))
    labels = rendered["pod"]["metadata"]["labels"]
    selector = rendered["network_policy"]["spec"]["podSelector"]["matchLabels"]
    assert selector.items() <= labels.items()
    assert rendered["network_policy"]["metadata"]["namespace"] == "fl-jobs"


def test_another_jobs_pods_are_not_selected() -> None:
    mine = policy()["spec"]["podSelector"]["matchLabels"]
    other = render_network_policy(request_for(k8s=POD_NETWORK, parent="10.244.1.7:7001",
                                              site="university"))
    assert other["spec"]["podSelector"]["matchLabels"] != mine


def test_a_parent_pod_by_labels_and_its_name_through_dns() -> None:
    spec = policy("atoll-site.fl.svc:7001", parent_pod_labels={"app": "atoll-site"},
                  parent_namespace="fl")["spec"]
    parent = {"podSelector": {"matchLabels": {"app": "atoll-site"}},
              "namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "fl"}}}
    assert spec["egress"][1] == {"to": [parent], "ports": [{"protocol": "TCP", "port": 7001}]}
    dns = spec["egress"][2]
    assert [p["port"] for p in dns["ports"]] == [53, 53]
    assert dns["to"][0]["podSelector"] == {"matchLabels": {"k8s-app": "kube-dns"}}


def test_an_ipv6_parent_is_one_address() -> None:
    assert policy("[fd00::7]:7001")["spec"]["egress"][1]["to"] == [
        {"ipBlock": {"cidr": "fd00::7/128"}}]


def test_a_parent_by_name_without_its_labels_is_refused() -> None:
    with pytest.raises(LaunchError, match="k8s.parent_pod_labels"):
        policy("atoll-site.fl.svc:7001")
