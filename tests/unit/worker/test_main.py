"""`python -m atoll.worker` (worker/__main__.py): its credentials come through a real pipe, read
once and closed, and its exit codes say what went wrong, against a real parent endpoint."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from atoll.launchers.process_group import credentials_pipe
from atoll.parent.worker_endpoint import BackendError, WorkerTokens, start_worker_endpoint
from atoll.worker.__main__ import EXIT_CONFIG, EXIT_FAILED, EXIT_REFUSED, _credentials


def _closed(fd: int) -> bool:
    try:
        os.fstat(fd)
    except OSError:
        return True
    return False


def test_credentials_come_from_the_launchers_pipe_once(monkeypatch):
    fd = credentials_pipe({"ATOLL_JOB_TOKEN": "tok-1", "DB_PASSWORD": "pw é"})
    monkeypatch.setenv("ATOLL_CREDENTIALS_FD", str(fd))
    assert _credentials() == {"ATOLL_JOB_TOKEN": "tok-1", "DB_PASSWORD": "pw é"}
    assert "ATOLL_CREDENTIALS_FD" not in os.environ  # job code never learns the descriptor
    assert _closed(fd)
    assert _credentials() == {}  # a second call finds nothing


def test_a_pipe_larger_than_one_read_is_read_to_its_end(monkeypatch):
    value = "v" * 300_000  # several reads of 64 KiB; the writer blocks until they happen
    read_end, write_end = os.pipe()

    def write() -> None:
        with os.fdopen(write_end, "wb") as pipe:
            pipe.write(json.dumps({"ATOLL_JOB_TOKEN": value, "N": 7}).encode())

    writer = threading.Thread(target=write)
    writer.start()
    monkeypatch.setenv("ATOLL_CREDENTIALS_FD", str(read_end))
    assert _credentials() == {"ATOLL_JOB_TOKEN": value, "N": "7"}  # values become text
    writer.join()
    assert _closed(read_end)


def test_an_empty_pipe_and_no_pipe_give_nothing(monkeypatch):
    read_end, write_end = os.pipe()
    os.close(write_end)
    monkeypatch.setenv("ATOLL_CREDENTIALS_FD", str(read_end))
    assert _credentials() == {}
    assert _closed(read_end)
    assert "ATOLL_CREDENTIALS_FD" not in os.environ
    assert _credentials() == {}


# -- the worker as a process, against a parent endpoint in this process -----------------------


class _Parent:
    """A parent that registers workers and has no app to give (the worker then fails)."""

    def __init__(self) -> None:
        self.finished: list[tuple[str, bool, str]] = []

    def on_register(self, job_id):
        return {}

    def app_zip(self, job_id):
        raise BackendError(f"no app for job {job_id} here")

    def finish(self, job_id, ok, error):
        self.finished.append((job_id, ok, error))


@pytest.fixture
def parent() -> Iterator[tuple[_Parent, WorkerTokens, str]]:
    backend, tokens = _Parent(), WorkerTokens()
    endpoint = start_worker_endpoint(tokens, backend, "127.0.0.1", 0)
    yield backend, tokens, endpoint.address
    endpoint.stop(0)


def _worker(env: dict[str, str], cwd: Path, pass_fds: tuple[int, ...] = ()):
    base = {k: os.environ[k] for k in ("PATH", "HOME", "LANG") if k in os.environ}
    return subprocess.run([sys.executable, "-m", "atoll.worker"], env={**base, **env}, cwd=cwd,
                          pass_fds=pass_fds, capture_output=True, text=True, timeout=120)


def test_a_worker_without_its_environment_is_a_configuration_error(tmp_path):
    done = _worker({}, tmp_path)
    assert done.returncode == EXIT_CONFIG
    assert "ATOLL_JOB_ID is not set; workers are started by a parent" in done.stderr


def test_a_refused_token_exits_3(parent, tmp_path):
    _, tokens, address = parent
    tokens.issue("job-1")
    env = {"ATOLL_JOB_ID": "job-1", "ATOLL_ROLE": "site", "ATOLL_PARENT": address,
           "ATOLL_JOB_TOKEN": "not-the-token", "ATOLL_WORKDIR": str(tmp_path)}
    done = _worker(env, tmp_path)
    assert done.returncode == EXIT_REFUSED
    assert "parent refused registration: job token refused" in done.stderr


def test_the_token_in_the_pipe_registers_and_a_failure_reaches_the_parent(parent, tmp_path):
    backend, tokens, address = parent
    token = tokens.issue("job-2")
    fd = credentials_pipe({"ATOLL_JOB_TOKEN": token})
    env = {"ATOLL_JOB_ID": "job-2", "ATOLL_ROLE": "site", "ATOLL_SITE": "site-1",
           "ATOLL_PARENT": address, "ATOLL_WORKDIR": str(tmp_path),
           "ATOLL_CREDENTIALS_FD": str(fd)}
    try:
        done = _worker(env, tmp_path, pass_fds=(fd,))
    finally:
        os.close(fd)
    assert "job job-2 role site registered with" in done.stdout, done.stderr
    assert done.returncode == EXIT_FAILED
    [(job_id, ok, error)] = backend.finished  # the worker said so itself, before it left
    assert (job_id, ok) == ("job-2", False)
    assert "no app for job job-2 here" in error and "no app for job job-2 here" in done.stderr
    assert tokens.exchange("job-2", token) is None  # spent by the worker


def test_a_rank_other_than_0_never_registers_nor_reads_credentials(parent, tmp_path):
    """Rank 1 must leave the job token unspent for rank 0 and never read the pipe."""
    _, tokens, address = parent
    token = tokens.issue("job-3")
    fd = credentials_pipe({"ATOLL_JOB_TOKEN": token})
    env = {"ATOLL_JOB_ID": "job-3", "ATOLL_ROLE": "site", "ATOLL_SITE": "site-1",
           "ATOLL_PARENT": address, "ATOLL_WORKDIR": str(tmp_path), "ATOLL_JOB_TOKEN": token,
           "ATOLL_CREDENTIALS_FD": str(fd), "RANK": "1", "WORLD_SIZE": "2"}
    try:
        done = _worker(env, tmp_path, pass_fds=(fd,))
        assert os.read(fd, 100).startswith(b'{"ATOLL_JOB_TOKEN"')  # still unread
    finally:
        os.close(fd)
    assert done.returncode == EXIT_CONFIG  # no app here: the nodes must share the workspace
    assert "rank 1 finds no app in" in done.stderr
    assert "registered" not in done.stdout
    assert tokens.exchange("job-3", token) is not None  # unspent: rank 0's to use


def test_the_worker_started_for_several_processes_becomes_rank_0_with_one_gpu():
    from atoll.worker.local_ranks import become_rank_zero, starts_local_ranks

    env = {"LOCAL_WORLD_SIZE": "2", "WORLD_SIZE": "2", "MASTER_ADDR": "127.0.0.1",
           "CUDA_VISIBLE_DEVICES": "7,9"}
    assert starts_local_ranks(env)
    assert become_rank_zero(env) == ["7", "9"]
    assert (env["RANK"], env["LOCAL_RANK"], env["CUDA_VISIBLE_DEVICES"]) == ("0", "0", "7")
    assert env["MASTER_PORT"].isdigit()
    assert not starts_local_ranks(env)  # a rank already: it starts no others


@pytest.mark.parametrize(("study_sets", "seen"), [(None, "4"), ("28", "28")])
def test_idle_blas_threads_sleep_unless_the_study_says_otherwise(tmp_path, study_sets, seen):
    """OpenBLAS reads its thread timeout when numpy is first imported: the worker sets it
    before anything of it can load numpy, and a study's own value (its env) stays."""
    probe = ("import os, sys; import atoll.worker.__main__; "
             "print(os.environ.get('OPENBLAS_THREAD_TIMEOUT'), 'numpy' in sys.modules)")
    base = {k: os.environ[k] for k in ("PATH", "HOME", "LANG") if k in os.environ}
    env = {**base, **({"OPENBLAS_THREAD_TIMEOUT": study_sets} if study_sets else {})}
    done = subprocess.run([sys.executable, "-c", probe], env=env, cwd=tmp_path,
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == [seen, "False"]
