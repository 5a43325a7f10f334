"""FedAvg with its sum on disk (app.yaml ``accumulator: disk``): the same mean, bit for bit, as
the sum in memory, for every dtype and both kinds of result, and nothing left in the folder."""

from __future__ import annotations

import os

import numpy as np
import pytest

from atoll.fl import bfloat16, stored
from atoll.fl.aggregation import AggregateCorrupted, WeightedMean
from atoll.fl.model import Model
from atoll.fl.serde import encode, open_model


def _global(rng):
    return {
        "emb": bfloat16.from_float32(rng.standard_normal((700, 300)).astype(np.float32)),
        "w": rng.standard_normal((300, 200)).astype(np.float32),
        "h": rng.standard_normal(1000).astype(np.float16),
        "d": rng.standard_normal(5),  # float64
        "n": np.array(7, np.int64),
        "s": np.array(1.5, np.float32),
    }


def _result(rng, like):
    out = {}
    for name, a in like.items():
        if bfloat16.is_bf16(a.dtype):
            out[name] = bfloat16.from_float32(rng.standard_normal(a.shape).astype(np.float32))
        elif a.dtype.kind == "i":
            out[name] = rng.integers(0, 100, a.shape).astype(a.dtype)
        else:
            out[name] = rng.standard_normal(a.shape).astype(a.dtype)
    return out


@pytest.mark.parametrize("streamed", [True, False])
@pytest.mark.parametrize("kinds", [("full", "full", "full"), ("diff", "full", "diff")])
def test_the_spilled_sum_gives_the_same_mean_bit_for_bit(tmp_path, streamed, kinds):
    rng = np.random.default_rng(4)
    reference = _global(rng)
    results = [(_result(rng, reference), n, kind) for n, kind in zip((3, 3, 8), kinds,
                                                                      strict=True)]
    means = []
    for spill, reuse in ((None, False), (tmp_path, False), (tmp_path, True)):
        mean = WeightedMean({k: v.copy() for k, v in reference.items()}, spill=spill,
                            reuse_reference=reuse)
        if reuse:  # the global model went to disk and left memory; diffs read it back
            assert all(stored.is_stored(a) for a in mean.reference.values())
        for params, n, kind in results:
            model = Model(params={k: v.copy() for k, v in params.items()}, num_examples=n,
                          params_type=kind)
            if streamed:
                mean.add_stream(open_model(encode(model, chunk_size=5003)), block_bytes=70_001)
            else:
                mean.add(model)
        if spill is not None:
            assert len(os.listdir(tmp_path)) == 0  # unlinked from the start
        means.append(mean.result())
        if spill is not None:  # the mean was written to disk, not made in memory
            assert all(stored.is_stored(a) for a in means[-1].values())
    memory = means[0]
    for disk in means[1:]:
        assert list(memory) == list(disk)
        for name in memory:
            assert memory[name].dtype == disk[name].dtype == reference[name].dtype
            assert memory[name].tobytes() == disk[name].tobytes(), name


def test_a_result_cut_short_breaks_the_spilled_mean(tmp_path):
    mean = WeightedMean(spill=tmp_path)
    payload = b"".join(bytes(c) for c in encode(Model(params={"w": np.ones(100_000, np.float32)},
                                                      num_examples=1)))
    with pytest.raises(AggregateCorrupted, match="broke off"):
        mean.add_stream(open_model([payload[: len(payload) // 2]]))


def test_a_disk_that_cannot_take_the_sum_is_named_not_a_traceback(tmp_path):
    """A full disk, here a file size limit (EFBIG, as ENOSPC would be): the round's mean is lost
    with a message that says where and what to do."""
    import subprocess
    import sys
    import textwrap

    code = textwrap.dedent(f"""
        import resource, signal
        import numpy as np
        from atoll.fl.aggregation import AggregateCorrupted, WeightedMean
        from atoll.fl.model import Model
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # a write past the limit fails instead
        resource.setrlimit(resource.RLIMIT_FSIZE, (1 << 20, 1 << 20))
        mean = WeightedMean(spill={str(tmp_path)!r})
        try:
            mean.add(Model(params={{"w": np.ones(1 << 20, np.float32)}}, num_examples=1))
        except AggregateCorrupted as exc:
            print("REFUSED", exc)
    """)
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert "REFUSED the round's sum on disk (accumulator: disk, in " in out.stdout
    assert "set accumulator: memory" in out.stdout
