"""What a site states in its launch entry (site/provenance.py): the image and the digest its
launcher reports, dataset names and modes, never a dataset's source; and the benchmark-only
switch that turns the record off; a dataset's published fingerprint, the site's own statement,
checked where study_runtime.yaml is read."""

from __future__ import annotations

import pytest

from atoll.pki.provenance import BENCHMARK_OFF, switched_off
from atoll.site.provenance import launch_body
from atoll.spec.errors import SpecError
from atoll.spec.study_runtime import parse_study_runtime

RUNTIME = {"format_version": 2, "studies": {"s": {
    "datasets": {"scans": {"source": "/srv/secret/scans", "mode": "ro"}}}}}


def test_the_default_image_and_its_engine_digest_are_stated_never_a_dataset_source():
    entry = parse_study_runtime(RUNTIME, "docker").entry("s")
    body = launch_body("docker", entry, {"image": "site/default:1", "image_id": "sha256:ab",
                                         "workdir": "/srv/site/jobs/x"}, "9.9")
    assert body == {"launcher": "docker", "atoll_version": "9.9", "image": "site/default:1",
                    "image_id": "sha256:ab", "datasets": [{"name": "scans", "mode": "ro"}]}
    assert "/srv" not in repr(body)


def test_a_study_image_is_stated_over_the_launchers_default():
    runtime = {"format_version": 2, "studies": {"s": {"container": {"image": "study/img:2"}}}}
    entry = parse_study_runtime(runtime, "docker").entry("s")
    body = launch_body("docker", entry, {"image": "site/default:1"}, "9.9")
    assert body["image"] == "study/img:2"


def test_the_record_is_off_only_with_the_benchmark_switch_set_to_1():
    assert switched_off({BENCHMARK_OFF: "1"})
    assert not switched_off({}) and not switched_off({BENCHMARK_OFF: "0"})


def test_a_datasets_published_fingerprint_is_stated_beside_its_name_and_mode():
    runtime = {"format_version": 2, "studies": {"s": {"datasets": {
        "scans": {"source": "/srv/secret/scans", "mode": "ro", "fingerprint": "sha256:" + "c" * 64},
        "notes": {"source": "/srv/secret/notes", "mode": "rw"}}}}}
    entry = parse_study_runtime(runtime, "process").entry("s")
    body = launch_body("process", entry, {}, "9.9")
    assert body["datasets"] == [{"name": "notes", "mode": "rw"},  # none published: none stated
                                {"name": "scans", "mode": "ro",
                                 "fingerprint": "sha256:" + "c" * 64}]
    assert "/srv" not in repr(body)


@pytest.mark.parametrize("bad", ["", " sha256:ab", "line\nbreak", "tab\there", "é-accent",
                                 "x" * 201, 42])
def test_a_fingerprint_is_a_short_printable_string(bad):
    runtime = {"format_version": 2, "studies": {"s": {"datasets": {
        "scans": {"source": "/srv/scans", "mode": "ro", "fingerprint": bad}}}}}
    with pytest.raises(SpecError) as err:
        parse_study_runtime(runtime, "process")
    assert "studies.s.datasets.scans.fingerprint" in str(err.value)
