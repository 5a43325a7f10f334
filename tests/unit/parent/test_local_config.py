"""A parent checks its local/ files in a forked child and keeps plain values (local_config.py)."""

from __future__ import annotations

import json
import os
import time

import pytest

from atoll.parent import local_record
from atoll.parent.forked import _single_threaded, run_forked
from atoll.parent.local_config import load_local_config
from atoll.parent.local_record import RECORD_FILE
from atoll.spec.errors import Issue, SpecError
from atoll.spec.site_config import load_site_config


def _fail(issues):
    raise SpecError(issues, source="site.yaml")


def test_the_result_comes_back_from_a_child():
    pid = run_forked(os.getpid)
    if _single_threaded():  # otherwise the function runs here, by design
        assert pid != os.getpid()
    assert run_forked(sorted, [3, 1, 2]) == [1, 2, 3]


def test_a_spec_error_comes_back_with_every_issue():
    issues = [Issue("capacity.gpus", "must be at least 0"), Issue("bogus", "unknown key")]
    with pytest.raises(SpecError) as err:
        run_forked(_fail, issues)
    assert err.value.issues == issues
    assert err.value.source == "site.yaml"
    assert "2 problems" in str(err.value)


def test_plain_values_at_rest_and_the_model_on_first_use(tmp_path):
    local = tmp_path / "local"
    local.mkdir()
    (local / "site.yaml").write_text(
        "launcher: process\nprocess: {gpu_ids: [0, 1]}\n"
        "capacity: {gpus: 2, memory: 8Gi}\nworker_endpoint: {host: 127.0.0.1, port: 0}\n")
    (local / "study_runtime.yaml").write_text("format_version: 2\nstudies:\n  default: {}\n")
    config = load_local_config(local, study_runtime=True)
    assert config.launcher_name == "process"
    assert config.capacity == {"gpus": 2, "cpus": None, "memory": "8Gi"}
    assert (config.endpoint.dial_host, config.endpoint.port, config.endpoint.uses_tls) == (
        "127.0.0.1", 0, False)
    assert config.site_config == load_site_config(local / "site.yaml")
    assert config.site_config.kit_dir == tmp_path
    assert config.launcher.name == "process"
    assert config.launcher is config.launcher
    config.close()


def test_a_bad_study_runtime_fails_the_start(tmp_path):
    local = tmp_path / "local"
    local.mkdir()
    (local / "site.yaml").write_text("launcher: process\n")
    (local / "study_runtime.yaml").write_text("format_version: 2\nstudies: 7\n")
    config = load_local_config(local, study_runtime=True)  # the check runs meanwhile
    with pytest.raises(SpecError, match="study_runtime.yaml"):
        _ = config.launcher_name  # the first value the parent needs: its start fails here
    assert load_local_config(local, study_runtime=False).launcher_name == "process"


# -- the record of a check that passed (local_record.py) ---------------------------------------

SITE_YAML = ("launcher: process\ncapacity: {gpus: 0, memory: 8Gi}\n"
             "worker_endpoint: {host: 127.0.0.1, port: 0}\n")


def _site_kit(tmp_path):
    local = tmp_path / "local"
    local.mkdir()
    (local / "site.yaml").write_text(SITE_YAML)
    (local / "study_runtime.yaml").write_text("format_version: 2\nstudies:\n  default: {}\n")
    return local, tmp_path / "workspace"


def _forge(workspace, **capacity):
    """Change the values of the record in place, keeping its fingerprint: if a later load
    reports them, it took the record instead of checking."""
    path = workspace / RECORD_FILE
    record = json.loads(path.read_text())
    record["values"]["capacity"].update(capacity)
    path.write_text(json.dumps(record))


def test_a_passed_check_is_recorded_and_stands_for_the_next(tmp_path):
    local, workspace = _site_kit(tmp_path)
    assert load_local_config(local, True, workspace).capacity["memory"] == "8Gi"
    assert (workspace / RECORD_FILE).is_file()
    _forge(workspace, memory="99Gi")
    config = load_local_config(local, True, workspace)
    assert config.capacity["memory"] == "99Gi"  # from the record: no check this time
    # The model comes from the bytes that were fingerprinted, not from a later edit.
    (local / "site.yaml").write_text("launcher: process\ncapacity: {gpus: 5}\n")
    assert config.site_config.capacity.memory == "8Gi"
    assert config.site_config.kit_dir == tmp_path


@pytest.mark.parametrize("edit", ["site.yaml", "study_runtime.yaml", "new file", "atoll upgrade"])
def test_any_change_means_a_full_check(tmp_path, edit, monkeypatch):
    local, workspace = _site_kit(tmp_path)
    load_local_config(local, True, workspace).launcher_name  # noqa: B018 - waits for the check
    _forge(workspace, memory="99Gi")
    if edit == "site.yaml":
        (local / "site.yaml").write_text(SITE_YAML + "# a comment\n")
    elif edit == "study_runtime.yaml":
        (local / "study_runtime.yaml").write_text("format_version: 2\nstudies: 7\n")
    elif edit == "new file":
        (local / "templates").mkdir()
        (local / "templates" / "pod.yaml").write_text("kind: Pod\n")
    else:
        monkeypatch.setattr(local_record, "__version__", "99.0")
    config = load_local_config(local, True, workspace)
    if edit == "study_runtime.yaml":
        with pytest.raises(SpecError, match="study_runtime.yaml"):
            _ = config.capacity
        return
    assert config.capacity["memory"] == "8Gi"  # checked again, not the forged record


@pytest.mark.parametrize("record", ["not json", "[]", '{"fingerprint": "x"}', "WRONG_SHAPE"])
def test_a_bad_record_is_ignored(tmp_path, record):
    local, workspace = _site_kit(tmp_path)
    load_local_config(local, True, workspace).launcher_name  # noqa: B018 - waits for the check
    if record == "WRONG_SHAPE":
        doc = json.loads((workspace / RECORD_FILE).read_text())
        doc["values"]["endpoint"] = {"host": "h"}
        record = json.dumps(doc)
    (workspace / RECORD_FILE).write_text(record)
    config = load_local_config(local, True, workspace)
    assert config.capacity["memory"] == "8Gi"
    assert config.endpoint.port == 0


def test_a_failed_check_leaves_no_record(tmp_path):
    local, workspace = _site_kit(tmp_path)
    (local / "site.yaml").write_text("launcher: process\ncapacity: {gpus: -1}\n")
    with pytest.raises(SpecError, match="capacity.gpus"):
        _ = load_local_config(local, True, workspace).launcher_name
    assert not (workspace / RECORD_FILE).exists()


def test_a_local_federation_starts_on_the_records_provision_wrote(tmp_path):
    """`atoll poc up` hands its parents kits whose local/ provision recorded as checked: an
    edit of local/ after provisioning (as poc up once made to study_runtime.yaml) would make
    every site parent check it with pydantic before it is ready."""
    from atoll.cli.poc import provision_poc

    found = provision_poc(2, tmp_path)
    for name in ("server", "site-1", "site-2"):
        workspace = found[name] / "workspace"
        _forge(workspace, memory="77Gi")
        config = load_local_config(found[name] / "local", name != "server", workspace)
        assert config.capacity["memory"] == "77Gi", f"{name} checked local/ again"


def test_the_sandbox_is_probed_before_the_first_job_and_the_launcher_takes_it(tmp_path,
                                                                             monkeypatch):
    """The probe of the process sandbox (~50 ms) runs with the check (in its forked child) or
    beside a record (SandboxProbe), and the launcher is made with its answer."""
    from atoll.launchers import process as process_mod

    local, workspace = _site_kit(tmp_path)
    probes = []
    for attempt in ("checked", "recorded"):
        config = load_local_config(local, True, workspace)
        monkeypatch.setattr(process_mod, "probe_host", lambda *a: probes.append(a))
        launcher = config.launcher
        assert launcher._sandbox_host is not None, attempt
        assert launcher.sandbox_host() is launcher._sandbox_host and probes == [], attempt
        monkeypatch.undo()
        config.close()


def test_beside_a_record_the_probe_waits_out_the_start_then_runs_unasked(tmp_path,
                                                                         monkeypatch):
    """Its interpreters do not compete with the parent's own start: nothing runs before
    PROBE_AFTER_S; then it runs with no job asking, and the launcher takes its answer."""
    from atoll.parent import local_config

    local, workspace = _site_kit(tmp_path)
    load_local_config(local, True, workspace).launcher_name  # noqa: B018 - the record
    monkeypatch.setattr(local_config, "PROBE_AFTER_S", 3600.0)
    config = load_local_config(local, True, workspace)
    time.sleep(0.3)
    assert config._probing._thread is None  # not at the start
    assert config.launcher._sandbox_host is not None  # a launch that comes first runs it
    config.close()
    monkeypatch.setattr(local_config, "PROBE_AFTER_S", 0.05)
    config = load_local_config(local, True, workspace)
    assert config._probing._done.wait(60)  # on its timer, unasked
    host = config._probing.result()
    assert config.launcher._sandbox_host is host
    config.close()


def test_a_host_without_a_sandbox_fails_the_start_naming_the_opt_out(tmp_path):
    local = tmp_path / "local"
    local.mkdir()
    (local / "site.yaml").write_text("launcher: process\nprocess: {bwrap: /bin/false}\n")
    config = load_local_config(local, study_runtime=False)
    with pytest.raises(SpecError) as err:
        config.launcher_name  # noqa: B018 - the first value waits for the check
    assert err.value.issues[0].path == "process.sandbox"
    assert "`process: {sandbox: none}`" in err.value.issues[0].message


def test_the_probe_beside_a_record_takes_its_settings_from_the_record(tmp_path):
    """Beside a record, the sandbox's probe does not parse site.yaml again (that would import
    pydantic into the probe's child at every start): process.python and process.bwrap come from
    the record. A forged bwrap in the record is the one the probe runs."""
    local, workspace = _site_kit(tmp_path)
    load_local_config(local, True, workspace).launcher_name  # noqa: B018 - waits for the check
    path = workspace / RECORD_FILE
    record = json.loads(path.read_text())
    assert record["values"]["sandbox"] == {"python": None, "bwrap": None}
    record["values"]["sandbox"]["bwrap"] = "/bin/false"
    path.write_text(json.dumps(record))
    config = load_local_config(local, True, workspace)
    with pytest.raises(SpecError) as err:
        _ = config.launcher
    assert err.value.issues[0].path == "process.sandbox"
    assert "/bin/false" in err.value.issues[0].message


def test_the_servers_tls_record_size_comes_from_site_yaml_checked_or_recorded(tmp_path):
    local, workspace = tmp_path / "local", tmp_path / "workspace"
    local.mkdir()
    (local / "site.yaml").write_text("launcher: process\n")
    assert load_local_config(local, False, workspace).tls_record_bytes == 16384  # gRPC's
    (local / "site.yaml").write_text("launcher: process\nlinks: {tls_record_bytes: 4096}\n")
    assert load_local_config(local, False, workspace).tls_record_bytes == 4096  # checked
    assert load_local_config(local, False, workspace).tls_record_bytes == 4096  # recorded
    for bad in (512, 65536, "big"):
        (local / "site.yaml").write_text(f"launcher: process\nlinks: {{tls_record_bytes: {bad}}}\n")
        with pytest.raises(SpecError, match="links.tls_record_bytes"):
            _ = load_local_config(local, False, workspace).tls_record_bytes


def test_a_detached_parents_log_rotation_needs_no_model_of_site_yaml(tmp_path):
    """`poc up` and `--detach` rotate the parent's log from its start: site.yaml's ``logs``
    come checked or recorded, never by parsing site.yaml in the parent (pydantic) as it
    starts."""
    local, workspace = _site_kit(tmp_path)
    with open(local / "site.yaml", "a") as f:
        f.write("logs: {max_size: 2Mi, keep: 3}\n")
    checked = load_local_config(local, True, workspace)
    assert checked.log_rotation == (2 << 20, 3)
    assert checked._site_config is None
    recorded = load_local_config(local, True, workspace)
    assert recorded._checked().site_yaml is not None  # from the record this time
    assert recorded.log_rotation == (2 << 20, 3)
    assert recorded._site_config is None
    path = workspace / RECORD_FILE
    doc = json.loads(path.read_text())
    for bad in ([0, 3], [1024, True], "big", None):  # a record of another shape: checked again
        doc["values"]["log_rotation"] = bad
        path.write_text(json.dumps(doc))
        config = load_local_config(local, True, workspace)
        assert config._checked().site_yaml is None and config.log_rotation == (2 << 20, 3)


def test_the_process_launcher_comes_from_the_checks_values_not_a_site_config(tmp_path):
    """Checked or recorded, site.yaml's process: block comes as plain values: the launcher is
    made, and a server worker's request built, with no SiteConfig parsed (no model)."""
    local, workspace = _site_kit(tmp_path)
    with open(local / "site.yaml", "a") as f:
        f.write("process: {python: /usr/bin/python3, network: {allow: ['127.0.0.1:5000']}}\n")
    for source in ("checked", "recorded"):
        config = load_local_config(local, True, workspace)
        assert (config._checked().site_yaml is not None) == (source == "recorded")
        launcher = config.launcher
        assert launcher._python == "/usr/bin/python3"
        assert launcher._destinations == [("127.0.0.1", 5000, "127.0.0.1")]
        assert config._site_config is None, source
        config.close()
    # what the record holds is what the launcher takes
    path = workspace / RECORD_FILE
    doc = json.loads(path.read_text())
    doc["values"]["process"]["python"] = "/opt/forged/python"
    path.write_text(json.dumps(doc))
    config = load_local_config(local, True, workspace)
    assert config.launcher._python == "/opt/forged/python"
    config.close()
    for bad in ({"python": 3}, None, "x"):  # of another shape: site.yaml is checked again
        doc["values"]["process"] = bad
        path.write_text(json.dumps(doc))
        config = load_local_config(local, True, workspace)
        assert config._checked().site_yaml is None
        assert config.launcher._python == "/usr/bin/python3"
        config.close()


def test_another_launcher_is_made_from_the_site_config(tmp_path):
    local = tmp_path / "local"
    local.mkdir()
    (local / "site.yaml").write_text("launcher: docker\n")
    config = load_local_config(local, False, tmp_path / "workspace")
    assert config.process_options is None
    assert config._checked().process is None
    assert config.site_config.launcher == "docker"


def test_study_runtime_comes_as_plain_values_checked_or_recorded(tmp_path):
    local, workspace = _site_kit(tmp_path)
    (local / "study_runtime.yaml").write_text(
        "format_version: 2\nstudies:\n  default: {env: {A: b}}\n")
    for source in ("checked", "recorded"):
        config = load_local_config(local, True, workspace)
        assert (config._checked().site_yaml is not None) == (source == "recorded")
        plain = config.plain_study_runtime
        assert plain is not None and plain.entry("default").env == {"A": "b"}, source
    doc = json.loads((workspace / RECORD_FILE).read_text())
    doc["values"]["study_runtime"] = {"digest": "x"}  # another shape: checked again
    (workspace / RECORD_FILE).write_text(json.dumps(doc))
    config = load_local_config(local, True, workspace)
    assert config._checked().site_yaml is None
    assert config.plain_study_runtime.entry("default").env == {"A": "b"}


def test_an_unconfined_site_reads_study_runtime_through_the_models(tmp_path):
    local, workspace = _site_kit(tmp_path)
    with open(local / "site.yaml", "a") as f:
        f.write("process: {sandbox: none}\n")
    config = load_local_config(local, True, workspace)
    assert config.unconfined and config.plain_study_runtime is None
    recorded = load_local_config(local, True, workspace)
    assert recorded._checked().site_yaml is not None and recorded.plain_study_runtime is None
