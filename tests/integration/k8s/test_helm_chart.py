"""deploy/helm/atoll rendered by a real Helm (PyPI helm-sdkpy) and installed into the real API server.

helm-sdkpy is a test-only requirement (tests/requirements-helm.txt): it carries Helm's own Go
library. Helm's rendered site.yaml and study_runtime.yaml must pass atoll's own validators, and
the chart's Role must grant exactly what deploy/k8s/rbac.yaml grants.
"""

from __future__ import annotations

from typing import Any

import yaml
from kubernetes import client

from atoll.spec.site_config import parse_site_config
from atoll.spec.study_runtime import parse_study_runtime
from tests.integration.k8s.conftest import REPO, SESSION_ID, SESSION_LABEL, Cluster
from tests.integration.k8s.helm_support import CHART, run

RBAC_FILE = REPO / "deploy" / "k8s" / "rbac.yaml"
STUDIES = {
    "pathology": {
        "container": {"image": "registry.example.com/pathology-trainer:1.0"},
        "datasets": {"slides": {"source": "pathology-data-pvc", "mode": "ro"}},
        "secret_env": {"DB_USER": {"source": "pathology-db", "key": "username"}},
    }
}


def values(role: str) -> dict[str, Any]:
    return {
        "role": role,
        "kitSecret": f"{role}-kit",
        "image": {"pullPolicy": "Never"},
        # No Pod of these releases can run (no such image, no kit Secret): no uninstall hook.
        "cleanupOnUninstall": False,
        "extraLabels": {SESSION_LABEL: SESSION_ID},
        "config": {
            "site": {"launcher": "k8s", "k8s": {"pending_timeout": 300}},
            "studyRuntime": {"format_version": 2, "studies": STUDIES},
        },
    }


def test_chart_lints(helm: Any, cluster: Cluster) -> None:
    config = helm.Configuration(namespace=cluster.namespace, kubeconfig=cluster.kubeconfig)
    result = run(helm.Lint(config).run(str(CHART)))
    assert not result.get("Errors"), result
    # Severity 1 is Helm's INFO (e.g. "icon is recommended"); nothing worse is allowed.
    assert all(m["Severity"] <= 1 for m in result["Messages"]), result


def test_site_and_server_install_into_the_api_server(helm: Any, cluster: Cluster) -> None:
    ns = cluster.namespace
    config = helm.Configuration(namespace=ns, kubeconfig=cluster.kubeconfig)
    apps = client.AppsV1Api(cluster.api.api_client)
    rbac = client.RbacAuthorizationV1Api(cluster.api.api_client)
    site_release, server_release = f"s{SESSION_ID}", f"h{SESSION_ID}"
    try:
        site = run(
            helm.Install(config).run(
                site_release, str(CHART), values=values("site"), wait=False, timeout=60
            )
        )
        server = run(
            helm.Install(config).run(
                server_release, str(CHART), values=values("server"), wait=False, timeout=60
            )
        )
        assert site["info"]["status"] == server["info"]["status"] == "deployed"
        manifests = [d for d in yaml.safe_load_all(site["manifest"]) if d]
        kinds = sorted(d["kind"] for d in manifests)
        assert kinds == ["ConfigMap", "Deployment", "NetworkPolicy", "Role", "RoleBinding",
                         "ServiceAccount"]

        # What Helm rendered is what atoll reads: the site's files validate with atoll's models.
        local = cluster.api.read_namespaced_config_map(f"{site_release}-site-local", ns).data
        site_yaml = yaml.safe_load(local["site.yaml"].replace("__POD_IP__", "10.1.2.3"))
        site_config = parse_site_config(site_yaml)
        assert site_config.settings.in_cluster and site_config.settings.namespace == ns
        assert site_config.worker_endpoint.host == "10.1.2.3"
        assert site_config.settings.pending_timeout == 300
        runtime = parse_study_runtime(yaml.safe_load(local["study_runtime.yaml"]), "k8s")
        assert runtime.entry("pathology").datasets["slides"].mode == "ro"

        deployment = apps.read_namespaced_deployment(f"{site_release}-site", ns)
        pod_spec = deployment.spec.template.spec
        assert pod_spec.service_account_name == f"{site_release}-site"
        startup = next(v for v in pod_spec.volumes if v.name == "startup")
        assert startup.secret.secret_name == "site-kit"
        assert deployment.spec.strategy.type == "Recreate"

        role = rbac.read_namespaced_role(f"{site_release}-site-launcher", ns)
        shipped = next(d for d in yaml.safe_load_all(RBAC_FILE.read_text()) if d["kind"] == "Role")
        assert [client.ApiClient().sanitize_for_serialization(r) for r in role.rules] == [
            {"apiGroups": r["apiGroups"], "resources": r["resources"], "verbs": r["verbs"]}
            for r in shipped["rules"]
        ]
        binding = rbac.read_namespaced_role_binding(f"{site_release}-site-launcher", ns)
        assert [(s.kind, s.name, s.namespace) for s in binding.subjects] == [
            ("ServiceAccount", f"{site_release}-site", ns)
        ]

        service = cluster.api.read_namespaced_service(f"{server_release}-server", ns)
        assert [(p.name, p.port) for p in service.spec.ports] == [("grpc", 8443)]
    finally:
        for release in (site_release, server_release):
            try:
                run(helm.Uninstall(config).run(release, wait=False, timeout=60))
            except helm.HelmError:
                pass  # never installed
    selector = f"app.kubernetes.io/instance={site_release}"
    assert not apps.list_namespaced_deployment(ns, label_selector=selector).items
