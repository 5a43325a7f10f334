"""Shamir sharing of 32-byte secrets: any threshold of shares rebuilds it, fewer do not."""

from __future__ import annotations

import itertools
import os

import pytest

from atoll.fl.privacy.secagg import shamir


def test_any_threshold_subset_rebuilds_the_secret():
    secret = os.urandom(32)
    shares = shamir.split(secret, [1, 2, 3, 4, 5], 3)
    for subset in itertools.combinations(shares.items(), 3):
        assert shamir.combine(subset) == secret
    assert shamir.combine(shares.items()) == secret


def test_fewer_shares_than_the_threshold_do_not_give_the_secret():
    secret = os.urandom(32)
    shares = shamir.split(secret, [1, 2, 3], 3)
    two = list(shares.items())[:2]
    try:
        assert shamir.combine(two) != secret
    except ValueError:
        pass  # out of range: detected as not a secret


def test_bad_arguments_are_refused():
    with pytest.raises(ValueError, match="threshold"):
        shamir.split(os.urandom(32), [1, 2], 3)
    with pytest.raises(ValueError, match="32 bytes"):
        shamir.split(b"short", [1, 2], 2)
