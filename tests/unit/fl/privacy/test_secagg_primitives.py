"""The masking primitives: the mask is AES-256-CTR's keystream, no two mask streams share
keystream, masks cancel exactly, and the fixed-point encoding round-trips a weighted sum within
its stated step, in words as wide as the model's own (or refuses, naming the key to change)."""

from __future__ import annotations

import math

import numpy as np
import pytest
from cryptography.hazmat.primitives.ciphers import Cipher, algorithms, modes

from atoll.fl.privacy.secagg import crypto, masking
from atoll.fl.privacy.secagg.client import add_masks
from atoll.spec.errors import SpecError
from atoll.spec.privacy import parse_privacy


def _keystream(seed: bytes, counter: bytes, size: int) -> bytes:
    return Cipher(algorithms.AES(seed), modes.CTR(counter)).encryptor().update(bytes(size))


def test_a_mask_is_the_aes_ctr_keystream_of_its_seed_from_its_streams_counter_block():
    seed = bytes(range(32))
    assert crypto.counter_block(5) == (5 << 64).to_bytes(16, "big")
    keystream = _keystream(seed, crypto.counter_block(5), 8 * 300_001)  # > one add_mask block
    np.testing.assert_array_equal(crypto.expand(seed, 5, (300_001,)),
                                  np.frombuffer(keystream, np.uint64))
    np.testing.assert_array_equal(crypto.expand(seed, 5, (600_002,), np.uint32),
                                  np.frombuffer(keystream, np.uint32))
    with pytest.raises(ValueError, match="mask stream"):
        crypto.counter_block(2**64)


def test_no_two_mask_streams_of_one_seed_share_a_keystream_block():
    # every parameter of a model is masked with the same seed, one stream each: a block shared
    # by two streams would let the server subtract two masked parameters and cancel the mask
    seed = crypto.new_seed()
    blocks: dict[bytes, int] = {}
    for stream in range(4):
        mask = crypto.expand(seed, stream, (2 * 4096,)).tobytes()  # 4096 AES blocks
        for i in range(0, len(mask), 16):
            other = blocks.setdefault(mask[i:i + 16], stream)
            assert other == stream, f"streams {other} and {stream} share a keystream block"
    assert len(blocks) == 4 * 4096
    # a stream number as the whole initial counter block (the old layout) fails this check:
    # stream 1 would be stream 0 one block on
    old = [_keystream(seed, s.to_bytes(16, "big"), 64) for s in (0, 1)]
    assert old[0][16:32] == old[1][:16]


def test_pairwise_masks_cancel_and_the_weighted_sum_decodes_within_the_step():
    a = {"w": np.array([0.5, -1.25, 3.0], np.float32)}
    b = {"w": np.array([-0.5, 2.0, 1e-3], np.float32)}
    pair = crypto.new_seed()
    ea, eb = masking.encode(a, 2, 2), masking.encode(b, 3, 2)
    assert ea["w"].dtype == np.uint32 and ea["w"].nbytes == a["w"].nbytes  # the model's width
    add_masks(ea, [(pair, 1)])
    add_masks(eb, [(pair, -1)])
    assert not np.array_equal(ea["w"], masking.encode(a, 2, 2)["w"])  # masked
    total = {k: ea[k] + eb[k] for k in ea}
    weighted, weight = masking.decode(total)
    assert weight == 5
    step = masking.Ring().step(32)
    assert step == 2.0**-15
    plain = 2 * a["w"].astype(np.float64) + 3 * b["w"]
    np.testing.assert_allclose(weighted["w"], plain, rtol=2**-23, atol=2 * step / 2)


@pytest.mark.parametrize(("dtype", "word_bits", "bits"), [
    (np.float32, 32, 32), (np.float16, 32, 32), (np.float64, 32, 64), (np.int64, 32, 64),
    (np.float32, 64, 64)])
def test_words_are_the_variables_width_unless_word_bits_is_64(dtype, word_bits, bits):
    ring = masking.Ring(word_bits=word_bits)
    words = masking.encode({"w": np.ones(3, dtype)}, 1, 2, ring)["w"]
    assert words.dtype == np.dtype(f"u{bits // 8}")


@pytest.mark.parametrize("ring", [masking.Ring(), masking.Ring(1000.0, 32),
                                  masking.Ring(word_bits=64), masking.Ring(2.0**40, 64)])
def test_the_sum_at_each_sites_full_share_is_exact_within_the_step(ring):
    sites, rng = 3, np.random.default_rng(5)
    bits = 32 if ring.word_bits == 32 else 64
    dtype = np.float32 if bits == 32 else np.float64
    weights = [1, 7, 2]
    updates = []
    for w in weights:  # each site's largest entry at its share, max_sum / sites, both signs
        x = rng.uniform(-1, 1, 1000) * (ring.max_sum / sites / w) * 0.999
        x[:2] = [ring.max_sum / sites / w * 0.999, -ring.max_sum / sites / w * 0.999]
        updates.append({"w": x.astype(dtype)})
    seeds = [crypto.new_seed() for _ in weights]
    total = None
    for i, (w, update) in enumerate(zip(weights, updates, strict=True)):
        words = masking.encode(update, w, sites, ring)
        add_masks(words, [(seeds[i], 1)])
        total = words if total is None else {k: total[k] + words[k] for k in words}
    assert total is not None
    add_masks(total, [(seed, -1) for seed in seeds])
    mean, _ = masking.decode({k: v.copy() for k, v in total.items()}, ring, mean=True)
    weighted, weight = masking.decode(total, ring)
    assert weight == sum(weights)
    np.testing.assert_allclose(mean["w"], weighted["w"] / weight, rtol=2**-22)
    plain = sum(w * u["w"].astype(np.float64) for w, u in zip(weights, updates, strict=True))
    # each site rounds to the nearest step (a float64 product first: exact for float32), the
    # sum is then a float32 (or a float64)
    magnitude = sum(w * np.abs(u["w"].astype(np.float64))
                    for w, u in zip(weights, updates, strict=True))
    tolerance = sites * ring.step(bits) / 2 + magnitude * (2**-23 if bits == 32 else 2**-50)
    assert np.all(np.abs(weighted["w"] - plain) <= tolerance)


def test_an_update_past_its_share_of_max_sum_is_refused_naming_the_key():
    ring = masking.Ring()
    share = ring.max_sum / 2
    masking.encode({"w": np.array([share * 0.999], np.float32)}, 1, 2, ring)  # fits
    with pytest.raises(masking.EncodingError, match="privacy.secure_aggregation.max_sum"):
        masking.encode({"w": np.array([share], np.float32)}, 1, 2, ring)
    with pytest.raises(masking.EncodingError, match="clip the update"):
        masking.encode({"w": np.array([-share / 9], np.float32)}, 10, 2, ring)  # x num_examples
    with pytest.raises(masking.EncodingError, match="max_sum"):
        masking.encode({"w": np.array([1e12], np.float32)}, 1, 2, masking.Ring(word_bits=64))


@pytest.mark.parametrize("bad", [math.nan, math.inf, -math.inf])
def test_a_non_finite_update_is_refused(bad):
    with pytest.raises(masking.EncodingError, match="NaN or infinite"):
        masking.encode({"w": np.array([0.5, bad], np.float32)}, 1, 2)


def test_the_ring_keys_are_validated_in_app_yaml():
    settings = parse_privacy({"secure_aggregation": {"max_sum": 1000, "word_bits": 64}}, "a")
    assert masking.Ring.of(settings.secure_aggregation) == masking.Ring(1000.0, 64)
    assert masking.Ring.of(parse_privacy({"secure_aggregation": {}}, "a").secure_aggregation) \
        == masking.Ring()
    with pytest.raises(SpecError, match="word_bits: 64"):  # 2**24 leaves 7 fraction bits
        parse_privacy({"secure_aggregation": {"max_sum": 2**24}}, "app.yaml")
    parse_privacy({"secure_aggregation": {"max_sum": 2**24, "word_bits": 64}}, "app.yaml")
    for bad in ({"max_sum": 0}, {"max_sum": -1}, {"max_sum": math.inf}, {"word_bits": 16}):
        with pytest.raises(SpecError, match="max_sum|word_bits"):
            parse_privacy({"secure_aggregation": bad}, "app.yaml")
