"""A model kept on disk (``atoll.fl.stored``, app.yaml ``accumulator: disk``): the same bytes as
in memory, read-only, no file left behind, pages let go once streamed, and FedAvg's global model
on disk between rounds with the same result, bit for bit, as in memory."""

from __future__ import annotations

import hashlib
import os
import subprocess
import sys
import textwrap

import numpy as np
import pytest

from atoll.fl import bfloat16, stored
from atoll.fl.app_config import FedAvgArgs
from atoll.fl.model import Model
from atoll.fl.serde import decode, encode, load_file
from atoll.fl.workflows.fedavg import FedAvgRun

from .helpers import run_workflow


def _model(rng):
    return {
        "emb": bfloat16.from_float32(rng.standard_normal((300, 70)).astype(np.float32)),
        "w": rng.standard_normal((30, 20)).astype(np.float32),
        "h": rng.standard_normal(11).astype(np.float16),
        "n": np.array(7, np.int64),
        "none": np.zeros((0, 4), np.float32),
        "b": np.array([True, False, True]),
    }


def test_a_stored_model_reads_back_as_it_was_and_leaves_no_file(tmp_path):
    params = _model(np.random.default_rng(1))
    kept = stored.store(params, tmp_path)
    assert os.listdir(tmp_path) == []  # unlinked from the start
    assert list(kept) == list(params)
    for name, array in params.items():
        assert kept[name].dtype == array.dtype and kept[name].shape == array.shape
        assert kept[name].tobytes() == array.tobytes(), name
        assert stored.is_stored(kept[name]) or array.size == 0
        with pytest.raises(ValueError, match="read-only"):
            kept[name][...] = 0
    again = decode(encode(Model(params=kept)))  # what a send or a save reads of it
    assert all(again.params[k].tobytes() == params[k].tobytes() for k in params)
    assert all(stored.store(kept, tmp_path)[k] is kept[k] for k in kept)  # no second copy
    assert not stored.is_stored(params["w"]) and not stored.is_stored(kept["w"] + 1)


def test_a_stored_model_of_many_tensors_holds_one_descriptor(tmp_path):
    before = len(os.listdir("/proc/self/fd"))
    kept = stored.store({f"t{i}": np.ones(100, np.float32) for i in range(500)}, tmp_path)
    assert len(os.listdir("/proc/self/fd")) - before <= 1  # one mapping, not one per tensor
    assert float(sum(a.sum() for a in kept.values())) == 500 * 100


def _stored_files() -> int:
    """How many files of the run folder (the working directory) this process maps: the stored
    models, unlinked from the start."""
    folder = os.getcwd() + "/"
    with open("/proc/self/maps") as maps:
        return len({line.split()[4] for line in maps if folder in line})


def _file_pages_mib() -> float:
    with open("/proc/self/status") as status:
        line = next(line for line in status if line.startswith("RssFile:"))
    return int(line.split()[1]) / 1024


def test_sending_a_stored_model_does_not_keep_its_pages_in_memory(tmp_path):
    kept = stored.store({f"t{i}": np.full(8 << 20, i, np.float32) for i in range(4)}, tmp_path)
    before = _file_pages_mib()
    digest = hashlib.sha256()
    for chunk in encode(Model(params=kept)):  # 128 MiB, read as a send or a digest reads it
        digest.update(chunk)
    assert _file_pages_mib() - before < 48  # one 32 MiB tensor's pages at most, then let go
    array = kept["t1"]
    assert float(array[::1024].sum()) > 0  # a plain read maps the pages in...
    stored.release(array)  # ...until the reader lets them go
    assert _file_pages_mib() - before < 16


def test_a_disk_that_cannot_take_the_model_is_named_not_a_traceback(tmp_path):
    code = textwrap.dedent(f"""
        import resource, signal
        import numpy as np
        from atoll.fl import stored
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # a write past the limit fails instead
        resource.setrlimit(resource.RLIMIT_FSIZE, (1 << 20, 1 << 20))
        try:
            stored.store({{"w": np.ones(1 << 20, np.float32)}}, {str(tmp_path)!r})
        except stored.StoreFailed as exc:
            print("REFUSED", exc)
    """)
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert "REFUSED the global model on disk (accumulator: disk, in " in out.stdout
    assert "set accumulator: memory" in out.stdout


def _site(value: float, n: int, kind: str = "full"):
    def handler(topic: str, model: Model) -> Model:
        params = {k: (bfloat16.from_float32(bfloat16.to_float32(v) + value)
                      if bfloat16.is_bf16(v.dtype) else v + np.asarray(value).astype(v.dtype))
                  for k, v in model.params.items()}
        return Model(params=params, num_examples=n, params_type=kind)
    return handler


@pytest.mark.parametrize("kind", ["full", "diff"])
def test_fedavg_keeps_its_global_model_on_disk_with_the_same_result(tmp_path, monkeypatch, kind):
    rng = np.random.default_rng(2)
    initial = {k: v for k, v in _model(rng).items() if k not in ("none", "b")}
    finals, between = {}, []

    trims, models = [], []
    monkeypatch.setattr("atoll.fl.workflows.fedavg.trim", lambda: trims.append(1))

    def workflow(channel, args, init, job_args):
        run = FedAvgRun(channel, args, init, job_args, "fedavg", None, {})
        original = run.train_round

        def train_round(round_):  # the global model each round starts from
            between.append((args.accumulator, [stored.is_stored(a)
                                                for a in run.global_params.values()]))
            original(round_)

        run.train_round = train_round
        commit = run._commit

        def committed():  # the round's checkpoint: the last round's model file is gone
            models.append(_stored_files())
            commit()

        run._commit = committed
        run.run()

    for accumulator in ("memory", "disk"):
        run_folder = tmp_path / accumulator / "run"
        run_folder.mkdir(parents=True)
        monkeypatch.chdir(run_folder)  # the server worker's run folder: the files go there
        args = FedAvgArgs(num_rounds=3, evaluate_every=0, cross_site_eval="none",
                          accumulator=accumulator)
        model = Model(params={k: v.copy() for k, v in initial.items()})
        # equal weights: the sum does not depend on which reply arrives first
        run_workflow(workflow, args, {"a": _site(0.5, 2, kind), "b": _site(-0.125, 2, kind)},
                     tmp_path / accumulator, model)
        finals[accumulator] = load_file(tmp_path / accumulator / "global_model_final.safetensors")
        assert os.listdir(run_folder) == []  # the sum, the means: unlinked files, all gone
    on_disk = [kept for accumulator, kept in between if accumulator == "disk"]
    assert len(on_disk) == 3 and all(all(kept) for kept in on_disk)
    assert trims == [1]  # the initial model's freed heap given back; the means were never in it
    # no round's model outlives it: nothing (a reference cycle) waits for a collection
    assert models[-3:] == [1, 1, 1]
    for name in initial:
        assert finals["disk"].params[name].tobytes() == finals["memory"].params[name].tobytes()
        assert finals["disk"].params[name].dtype == initial[name].dtype


def test_fedopt_with_its_model_on_disk_gives_the_same_as_in_memory(tmp_path, monkeypatch):
    from atoll.fl.app_config import FedOptArgs
    from atoll.fl.workflows import run_fedopt

    initial = {k: v for k, v in _model(np.random.default_rng(3)).items() if k not in ("none", "b")}
    finals = {}
    for accumulator in ("memory", "disk"):
        monkeypatch.chdir(tmp_path)
        args = FedOptArgs(num_rounds=2, evaluate_every=0, cross_site_eval="none",
                          accumulator=accumulator, server_lr=0.5)
        run_workflow(run_fedopt, args, {"a": _site(0.5, 2), "b": _site(-0.125, 2)},
                     tmp_path / accumulator, Model(params={k: v.copy() for k, v in initial.items()}))
        finals[accumulator] = load_file(tmp_path / accumulator / "global_model_final.safetensors")
    for name in initial:
        assert finals["disk"].params[name].tobytes() == finals["memory"].params[name].tobytes()




def test_trim_gives_the_heap_of_freed_tensors_back(tmp_path):
    # Tensors under glibc's mmap threshold live in its heap; with small live blocks between them
    # (as in a real worker), freeing them leaves the heap resident unless it is trimmed.
    code = textwrap.dedent(f"""
        import sys
        import numpy as np
        from atoll.fl import stored

        def anon():
            with open("/proc/self/status") as status:
                return int(next(l for l in status if l.startswith("RssAnon")).split()[1]) >> 10
        np.empty(8 << 20, np.uint8)  # freed: glibc's mmap threshold rises to 8 MiB
        params, pins = {{}}, []
        for i in range(100):
            params[f"t{{i}}"] = np.ones(4 << 20, np.uint8)
            pins.append(np.ones(4096, np.uint8))
        before = anon()
        kept = stored.store(params, {str(tmp_path)!r})
        del params
        freed = anon()
        stored.trim()
        print(before, freed, anon())
    """)
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    before, freed, trimmed = map(int, out.stdout.split())
    assert before >= 400 and trimmed < before - 300, out.stdout  # 400 MiB given back
