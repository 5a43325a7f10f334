"""Generated documents never crash the validators: each passes, or fails with Issues carrying a
path. 1,000+ documents per format; targeted strategies reach deep paths, random JSON the rest."""

from __future__ import annotations

from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from atoll.spec.errors import SpecError
from atoll.spec.launcher_spec import (
    BACKENDS,
    launcher_spec_issues,
    resolve_launcher_spec,
    validate_launcher_spec,
)
from atoll.spec.meta import JobMeta, load_meta
from atoll.spec.resources import Resources, resolve_resources, validate_resource_spec
from atoll.spec.site_config import parse_site_config
from atoll.spec.study_runtime import StudyRuntime, parse_study_runtime

FUZZ = settings(
    max_examples=1000,
    deadline=None,
    database=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)

WORDS = [
    "server",
    "@ALL",
    "@default",
    "default",
    "site-a",
    "university",
    "64Gi",
    "1Gi",
    "0Gi",
    "1:00:00",
    "0",
    "ro",
    "rw",
    "env",
    "/srv/x",
    "../x",
    "a/b",
    "",
    "Pod",
    "PYTHONPATH",
    "ATOLL_X",
    "pvc-1",
    "500m",
    "none",
    "apptainer",
    "docker",
    "slurm",
    "k8s",
    "process",
]
scalars = (
    st.none()
    | st.booleans()
    | st.integers(-3, 10**7)
    | st.floats(allow_nan=False)
    | st.sampled_from(WORDS)
    | st.text(max_size=10)
)


def json_like(keys: list[str]) -> st.SearchStrategy[Any]:
    key = st.sampled_from(keys) | st.text(max_size=6)
    return st.recursive(
        scalars,
        lambda inner: st.lists(inner, max_size=3) | st.dictionaries(key, inner, max_size=3),
        max_leaves=6,
    )


def maybe(strategy: st.SearchStrategy[Any], keys: list[str]) -> st.SearchStrategy[Any]:
    """Mostly the targeted shape, sometimes anything at all."""
    return st.one_of(strategy, strategy, strategy, json_like(keys))


def block(fields: dict[str, st.SearchStrategy[Any]]) -> st.SearchStrategy[dict[str, Any]]:
    extra = st.dictionaries(st.sampled_from(WORDS), scalars, max_size=1)
    return st.builds(
        lambda chosen, e: {**chosen, **e}, st.fixed_dictionaries({}, optional=fields), extra
    )


def well_formed(issue_paths_required: bool, err: SpecError) -> None:
    assert err.issues
    for issue in err.issues:
        assert isinstance(issue.path, str) and issue.message
        assert "errors.pydantic.dev" not in issue.message
        if issue_paths_required:
            assert issue.path


TARGETS = st.sampled_from(["server", "site-a", "university", "default", "@default", "bad name"])
RES_FIELDS = {
    "num_of_gpus": st.integers(-1, 9) | scalars,
    "num_of_cpus": st.integers(-1, 9) | scalars,
    "memory": st.sampled_from(["64Gi", "512Mi", "1Ti", "64G", "0Gi"]) | scalars,
    "quota": scalars,
}
resource_specs = maybe(
    st.dictionaries(TARGETS, maybe(block(RES_FIELDS), list(RES_FIELDS)), max_size=4),
    ["@default", "server"],
)
NATIVE = {
    "image": scalars,
    "shm_size": scalars,
    "cpu_request": st.sampled_from(["2", "500m", 2]) | scalars,
    "memory_request": scalars,
    "ephemeral_storage": scalars,
    "pending_timeout": st.integers(-1, 2000) | scalars,
    "nodes": st.integers(0, 4) | scalars,
    "gpus_per_node": st.integers(0, 8) | scalars,
    "cpus_per_node": st.integers(0, 8),
    "mem_per_node": st.sampled_from(["8Gi", "8G"]),
    "time": st.sampled_from(["1:00:00", "0", "x"]),
    "privileged": scalars,
}
backend_blocks = st.dictionaries(
    st.sampled_from([*BACKENDS, "podman"]), maybe(block(NATIVE), list(NATIVE)), max_size=3
)
launcher_specs = maybe(
    st.dictionaries(TARGETS, maybe(backend_blocks, list(BACKENDS)), max_size=3), ["default"]
)
deploy_maps = maybe(
    st.dictionaries(
        st.sampled_from(["app", "a/b", "..", "srv", ""]),
        st.lists(TARGETS | st.sampled_from(["@ALL", "site-b"]), max_size=3),
        max_size=3,
    ),
    ["app"],
)
metas = maybe(
    block(
        {
            "name": st.sampled_from(["job", ""]) | scalars,
            "deploy_map": deploy_maps,
            "min_clients": st.integers(-1, 3) | scalars,
            "mandatory_clients": st.lists(TARGETS, max_size=2) | scalars,
            "resource_spec": resource_specs,
            "launcher_spec": launcher_specs,
            "study": scalars,
            "submitter": scalars,
        }
    ),
    ["name", "deploy_map"],
)


@FUZZ
@given(metas.filter(lambda doc: not isinstance(doc, str)))  # a str is a path to load_meta
def test_meta_json_never_crashes(doc):
    try:
        meta = load_meta(doc)
    except SpecError as err:
        well_formed(isinstance(doc, dict), err)
        return
    assert isinstance(meta, JobMeta)
    site = parse_site_config({"launcher": "slurm"})
    for target in meta.expand_targets(["site-a", "university"]):
        assert isinstance(resolve_resources(meta.resource_spec, target), Resources)
        for backend in BACKENDS:
            try:
                assert isinstance(resolve_launcher_spec(meta, target, backend, site), dict)
            except SpecError as err:
                well_formed(True, err)


@FUZZ
@given(resource_specs, TARGETS)
def test_resource_spec_never_crashes(doc, target):
    issues = validate_resource_spec(doc)
    assert all(i.path.startswith("resource_spec") and i.message for i in issues)
    if not issues:
        res = resolve_resources(doc, target)
        assert type(res.num_of_gpus) is int and res.num_of_gpus >= 0
        assert res.num_of_cpus is None or (type(res.num_of_cpus) is int and res.num_of_cpus >= 1)


@FUZZ
@given(launcher_specs, resource_specs)
def test_launcher_spec_never_crashes(doc, resources):
    issues = validate_launcher_spec(doc)
    assert all(i.path.startswith("launcher_spec") and i.message for i in issues)
    if not issues and not validate_resource_spec(resources):
        cross = launcher_spec_issues(doc, resources, ["server", "site-a", "@ALL"])
        assert all(i.path.startswith("launcher_spec.") and i.message for i in cross)


STUDY_FIELDS = {
    "container": maybe(block({"image": st.sampled_from(["img:1", ""]) | scalars}), ["image"]),
    "datasets": st.dictionaries(
        st.sampled_from(["slides", "Bad_Name", "x"]),
        maybe(
            block(
                {
                    "source": st.sampled_from(["/srv/x", "pvc-1", "rel", "/a/../b"]),
                    "mode": st.sampled_from(["ro", "rw", "rx"]),
                }
            ),
            ["source", "mode"],
        ),
        max_size=2,
    ),
    "env": st.dictionaries(
        st.sampled_from(["EPOCHS", "PYTHONPATH", "ATOLL_X", "lower", "DB"]), scalars, max_size=3
    ),
    "secret_env": st.dictionaries(
        st.sampled_from(["DB", "TOKEN", "ATOLL_JOB_TOKEN"]),
        maybe(
            block(
                {
                    "source": st.sampled_from(["env", "db-secret", "Bad"]),
                    "key": st.sampled_from(["password", "DB_PW", "bad key"]),
                }
            ),
            ["source", "key"],
        ),
        max_size=2,
    ),
    "secret_mounts": st.dictionaries(
        st.sampled_from(["db", "Bad"]),
        maybe(
            block(
                {
                    "source": st.sampled_from(["db-secret", "/etc/s"]),
                    "mount_path": st.sampled_from(["/run/s", "rel", "/"]),
                }
            ),
            ["source"],
        ),
        max_size=2,
    ),
    "docker_kwargs": st.dictionaries(
        st.sampled_from(["shm_size", "privileged", "image", "typo"]), scalars, max_size=2
    ),
    "pod_template": st.sampled_from(["pod.yaml", "../pod.yaml", {"kind": "Pod"}, {"kind": 1}])
    | scalars,
    "slurm": maybe(
        block({"sandbox": st.sampled_from(["none", "pyxis", "docker"]), "partition": scalars}),
        ["sandbox"],
    ),
}
runtimes = maybe(
    block(
        {
            "format_version": st.sampled_from([2, 2, 1, "2"]) | scalars,
            "studies": maybe(
                st.dictionaries(
                    st.sampled_from(["pathology", "Bad_Study", "outcomes"]),
                    maybe(block(STUDY_FIELDS), list(STUDY_FIELDS)),
                    max_size=2,
                ),
                ["pathology"],
            ),
        }
    ),
    ["format_version", "studies"],
)


@FUZZ
@given(runtimes, st.sampled_from([*BACKENDS, None]))
def test_study_runtime_never_crashes(doc, launcher):
    try:
        runtime = parse_study_runtime(doc, launcher)
    except SpecError as err:
        well_formed(isinstance(doc, dict), err)
        return
    assert isinstance(runtime, StudyRuntime)
