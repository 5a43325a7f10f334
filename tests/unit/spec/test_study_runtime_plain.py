"""study_runtime.yaml's plain values stand for what the models accepted, and only for those very
bytes: each entry reads as the models' StudyEntry reads, any other shape is left to the
models, a record of another shape is refused, and a dataset that now lends the site kit (a link
changed since) sends the file back to the models, which refuse it."""

from __future__ import annotations

import json

import pytest

from atoll.spec.errors import SpecError
from atoll.spec.study_runtime import load_study_runtime
from atoll.spec.study_runtime_plain import (
    ABSENT,
    RUNTIME_FILE,
    PlainStudyRuntime,
    admitted,
    file_digest,
    plain_runtime,
)

COMMON = [
    "format_version: 2\nstudies: {}\n",
    "format_version: 2\nstudies:\n  alpha: {}\n",
    "format_version: 2\nstudies:\n  alpha:\n    env: {LOG_LEVEL: debug, A: '1'}\n",
    "format_version: 2\nstudies:\n  alpha:\n    datasets:\n      slides: {source: DATA/slides, "
    "mode: ro}\n      out: {source: DATA/out, mode: rw, fingerprint: 'sha256:ab'}\n"
    "  beta:\n    datasets:\n      x: {source: DATA/x, mode: ro}\n    env: {K: v}\n",
]
OTHER = [
    "format_version: 2\nstudies:\n  alpha:\n    secret_env: {TOKEN: {source: env, key: T}}\n",
    "format_version: 2\nstudies:\n  alpha:\n    env: {}\n    secret_env: {}\n",
    "format_version: 2\nstudies:\n  alpha:\n    statistics: {min_count: 5}\n",
]


def _site(tmp_path, text: str):
    local = tmp_path / "kit" / "local"
    local.mkdir(parents=True, exist_ok=True)
    data = tmp_path / "data"
    for name in ("slides", "out", "x"):
        (data / name).mkdir(parents=True, exist_ok=True)
    (local / RUNTIME_FILE).write_text(text.replace("DATA", str(data)))
    return local


def _reads(entry) -> dict:
    return {"datasets": {n: (d.source, d.mode, d.fingerprint) for n, d in entry.datasets.items()},
            "env": dict(entry.env), "secret_env": dict(entry.secret_env),
            "secret_mounts": dict(entry.secret_mounts), "docker_kwargs": entry.docker_kwargs,
            "container": entry.container, "pod_template": entry.pod_template,
            "slurm": entry.slurm, "statistics": entry.statistics}


@pytest.mark.parametrize("text", COMMON)
def test_each_entry_reads_as_the_models_entry(tmp_path, text):
    local = _site(tmp_path, text)
    runtime = load_study_runtime(local, "process")
    plain = plain_runtime(runtime, "process", file_digest(local, RUNTIME_FILE))
    assert plain is not None and set(plain.studies) == set(runtime.studies)
    for name, entry in runtime.studies.items():
        assert _reads(plain.entry(name)) == _reads(entry)
    assert plain.entry("nobody") is None and runtime.entry("nobody") is None
    # what a record keeps comes back the same
    assert PlainStudyRuntime.from_values(json.loads(json.dumps(plain.values()))) == plain
    assert admitted(plain, local) == plain


@pytest.mark.parametrize("text", OTHER)
def test_any_other_shape_is_the_models(tmp_path, text):
    local = _site(tmp_path, text)
    runtime = load_study_runtime(local, "process")
    assert plain_runtime(runtime, "process", file_digest(local, RUNTIME_FILE)) is None


def test_other_launchers_are_the_models(tmp_path):
    local = _site(tmp_path, COMMON[1])
    assert plain_runtime(load_study_runtime(local, "docker"), "docker", "d") is None


def test_no_file_is_no_study(tmp_path):
    local = tmp_path / "local"
    local.mkdir()
    plain = plain_runtime(load_study_runtime(local, "process"), "process",
                          file_digest(local, RUNTIME_FILE))
    assert plain is not None and plain.digest == ABSENT and plain.studies == {}
    assert admitted(plain, local) == plain
    (local / RUNTIME_FILE).write_text(COMMON[1])
    assert admitted(plain, local) is None


def test_other_bytes_are_the_models(tmp_path):
    local = _site(tmp_path, COMMON[3])
    plain = plain_runtime(load_study_runtime(local, "process"), "process",
                          file_digest(local, RUNTIME_FILE))
    (local / RUNTIME_FILE).write_text((local / RUNTIME_FILE).read_text() + "# edited\n")
    assert admitted(plain, local) is None
    (local / RUNTIME_FILE).unlink()
    assert admitted(plain, local) is None


def test_a_dataset_turned_into_a_link_to_the_kit_is_the_models_to_refuse(tmp_path):
    local = _site(tmp_path, COMMON[3])
    plain = plain_runtime(load_study_runtime(local, "process"), "process",
                          file_digest(local, RUNTIME_FILE))
    assert admitted(plain, local) == plain
    slides = tmp_path / "data" / "slides"
    slides.rmdir()
    slides.symlink_to(tmp_path / "kit")  # the same bytes, a dataset now lending the kit
    assert admitted(plain, local) is None
    with pytest.raises(SpecError, match="kit"):
        load_study_runtime(local, "process")


@pytest.mark.parametrize("mutate", [
    lambda d: d.update(digest=3), lambda d: d.pop("digest"), lambda d: d.update(extra=1),
    lambda d: d["studies"]["alpha"].update(secret_env={}),
    lambda d: d["studies"]["alpha"]["datasets"]["slides"].__setitem__(1, "rx"),
    lambda d: d["studies"]["alpha"]["datasets"]["slides"].pop(),
    lambda d: d["studies"]["alpha"]["datasets"]["slides"].__setitem__(0, 5),
    lambda d: d["studies"]["alpha"]["env"].update(K=3),
    lambda d: d["studies"]["alpha"].pop("env"),
    lambda d: d.update(studies=[]),
])
def test_a_record_of_another_shape_gives_no_runtime(tmp_path, mutate):
    local = _site(tmp_path, COMMON[3])
    plain = plain_runtime(load_study_runtime(local, "process"), "process",
                          file_digest(local, RUNTIME_FILE))
    doc = json.loads(json.dumps(plain.values()))
    mutate(doc)
    assert PlainStudyRuntime.from_values(doc) is None
