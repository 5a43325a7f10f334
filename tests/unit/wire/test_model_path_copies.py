"""Copies per byte on the model's path, hop by hop (bench/compare/model_path.py runs each hop
with atoll's own code on real files): every hop moves the model through the kernel at most once,
none allocates a whole-model buffer, and the model lands in its final arrays (the site's last
round's, the server's global model's) rather than in new ones."""

from __future__ import annotations

import numpy as np
import pytest

from bench.compare import model_path

MODEL = 32 * 1024 * 1024  # one 32 MiB float32 layer, then a round with two layers
SLACK = 0.01  # frame leads and headers: 11 bytes a MiB, and the JSON header


@pytest.fixture(scope="module")
def hops(tmp_path_factory):
    return model_path.run_path(MODEL, tmp_path_factory.mktemp("path"))


def test_every_hop_that_writes_the_model_writes_it_once_and_reads_nothing(hops):
    writers = [h for h in hops if h.written > MODEL / 2]
    assert [h.name.split(":")[0] for h in writers] == [
        "site worker", "server parent", "server worker", "site parent"]
    for hop in writers:
        assert MODEL <= hop.written <= MODEL * (1 + SLACK), hop.name
        assert hop.read <= MODEL * SLACK, hop.name


def test_a_parent_reads_its_workers_file_once_and_writes_nothing(hops):
    readers = [h for h in hops if h.read > MODEL / 2]
    assert [h.name.split(":")[0] for h in readers] == ["site parent", "server parent"]
    for hop in readers:
        assert MODEL <= hop.read <= MODEL * (1 + SLACK), hop.name
        assert hop.written <= MODEL * SLACK, hop.name


def test_workers_take_their_payloads_through_a_mapping_not_a_read(hops):
    mapped = [h for h in hops if "map the" in h.name]
    assert len(mapped) == 2  # the server worker's fold, the site worker's decode
    for hop in mapped:
        assert hop.read <= MODEL * SLACK and hop.written <= MODEL * SLACK, hop.name


def test_no_hop_allocates_a_whole_model_copy(hops):
    assert len(hops) == 8
    for hop in hops:
        # a frame or a FedAvg block at most (4 MiB = 0.125 of the model), never the model
        assert hop.peak < MODEL * 0.2, (hop.name, hop.peak)


def test_the_model_lands_in_its_final_arrays_at_both_ends(tmp_path, monkeypatch):
    # The site decodes into the arrays its script sent last round, and FedAvg folds the first
    # reply into the global model's own buffers: the buffers that go in are the ones that
    # come out, so no hop made new ones for them.
    seen: dict[str, list[int]] = {"global": [], "site": []}
    round_ = model_path._round

    def watched(nbytes, trained, global_params, *args):
        before = {k: v.__array_interface__["data"][0] for k, v in global_params.items()}
        sent = {k: v.__array_interface__["data"][0] for k, v in trained.items()}
        hops, decoded, averaged = round_(nbytes, trained, global_params, *args)
        seen["global"].append(all(averaged[k].__array_interface__["data"][0] == before[k]
                                  for k in before))
        seen["site"].append(all(decoded[k].__array_interface__["data"][0] == sent[k]
                                for k in sent))
        np.testing.assert_array_equal(decoded["layer0"][:2], averaged["layer0"][:2])
        return hops, decoded, averaged

    monkeypatch.setattr(model_path, "_round", watched)
    model_path.run_path(2 * 1024 * 1024, tmp_path, rounds=2)
    assert seen == {"global": [True, True], "site": [True, True]}
