"""The masking primitives: the mask is AES-256-CTR's keystream, masks cancel exactly, and the
fixed-point encoding round-trips a weighted sum."""

from __future__ import annotations

import numpy as np
import pytest
from cryptography.hazmat.primitives.ciphers import Cipher, algorithms, modes

from atoll.fl.privacy.secagg import crypto, masking
from atoll.fl.privacy.secagg.client import add_masks


def test_a_mask_is_the_aes_ctr_keystream_of_its_seed_and_stream():
    seed = bytes(range(32))
    keystream = Cipher(algorithms.AES(seed), modes.CTR((5).to_bytes(16, "big"))).encryptor() \
        .update(bytes(8 * 300_001))  # more than one of add_mask's blocks
    np.testing.assert_array_equal(crypto.expand(seed, 5, (300_001,)),
                                  np.frombuffer(keystream, np.uint64))


def test_pairwise_masks_cancel_in_the_sum_and_the_weighted_sum_decodes():
    a = {"w": np.array([0.5, -1.25, 3.0], np.float32)}
    b = {"w": np.array([-0.5, 2.0, 1e-3], np.float32)}
    pair = crypto.new_seed()
    ea, eb = masking.encode(a, 2, 2), masking.encode(b, 3, 2)
    add_masks(ea, [(pair, 1)])
    add_masks(eb, [(pair, -1)])
    assert not np.array_equal(ea["w"], masking.encode(a, 2, 2)["w"])  # masked
    total = {k: ea[k] + eb[k] for k in ea}
    weighted, weight = masking.decode(total)
    assert weight == 5
    np.testing.assert_allclose(weighted["w"], 2 * a["w"] + 3 * b["w"], atol=2 ** -23)


def test_an_update_too_large_to_sum_exactly_is_refused_with_what_to_do():
    with pytest.raises(masking.EncodingError, match="clip the update"):
        masking.encode({"w": np.array([1e12], np.float32)}, 1, 2)
