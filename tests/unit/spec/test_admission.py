"""spec/admission.py: the one place every hop asks whether a job may run (the CLI's validate,
the server's intake and scheduler, the site's admission and the launch request)."""

from __future__ import annotations

from atoll.spec.admission import asked_at, capacity_issues, fits, reachable_sites, study_issues
from atoll.spec.meta import load_meta
from atoll.spec.resources import Resources


def _meta(**extra):
    return load_meta({"name": "j", "deploy_map": {"app": ["server", "site-a", "site-c"]},
                      **extra})


def test_study_rules_name_each_field_once():
    meta = _meta(mandatory_clients=["site-c"], min_clients=2)
    issues = {i.path: i.message for i in study_issues(meta, "s", ["site-a", "site-b"])}
    assert issues == {
        "deploy_map.app[2]": "site 'site-c' is not enrolled in study 's' (its sites: site-a, "
                             "site-b)",
        "mandatory_clients[0]": "site 'site-c' is not enrolled in study 's' (its sites: site-a, "
                                "site-b); the job could never start",
        "min_clients": "2, but the job can reach only 1 site(s) of study 's' (site-a); it could "
                       "never start: write at most 1, or add sites"}
    assert study_issues(meta, "s", ["site-a", "site-b", "site-c"]) == []
    assert reachable_sites(load_meta({"name": "j", "deploy_map": {"app": ["@ALL"]}}),
                           ["site-a", "site-b"]) == ["site-a", "site-b"]


def test_what_a_job_asks_is_read_for_the_sites_launcher():
    meta = _meta(resource_spec={"site-a": {"num_of_cpus": 2}},
                 launcher_spec={"site-a": {"slurm": {"nodes": 2}}})
    assert asked_at(meta, "site-a", "process").cpus_counted == 2
    slurm = asked_at(meta, "site-a", "slurm")
    assert (slurm.nodes, slurm.cpus_counted) == (2, 4)  # per node, counted over both


def test_fits_counts_what_running_jobs_hold():
    cap = {"gpus": 2, "cpus": 8, "memory": "1Gi"}
    one_gpu = Resources(num_of_gpus=1, num_of_cpus=1)
    assert fits(cap, [one_gpu], one_gpu) is None
    assert fits(cap, [one_gpu, one_gpu], one_gpu) == "1 GPU(s) asked, 0 free"
    assert fits(cap, [], Resources(num_of_cpus=9)) == "9 CPU(s) asked, 8 free"
    assert fits(cap, [Resources(num_of_cpus=1, memory="512Mi")],
                Resources(num_of_cpus=1, memory="768Mi")) == "768Mi memory asked, 512Mi free"
    assert fits({}, [one_gpu] * 5, Resources(num_of_gpus=9)) is None  # no capacity: no limit


def test_capacity_issues_list_everything_beyond_the_whole_site():
    asked = Resources(num_of_gpus=3, num_of_cpus=4, memory="2Gi")
    issues = capacity_issues(asked, {"gpus": 2, "cpus": 2, "memory": "1Gi"})
    assert [(i.path, i.message) for i in issues] == [
        ("resource_spec.num_of_gpus", "asks 3 GPU(s); this site has 2 (capacity.gpus in "
                                      "local/site.yaml)"),
        ("resource_spec.num_of_cpus", "asks 4 CPU(s); this site has 2"),
        ("resource_spec.memory", "asks 2Gi; this site has 1Gi")]
    assert capacity_issues(asked, {"gpus": None, "cpus": None, "memory": None}) == []
