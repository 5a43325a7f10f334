"""The accountant's epsilon against Opacus's RDP analysis, called directly here."""

from __future__ import annotations

import pytest
from opacus.accountants.analysis import rdp as opacus_rdp
from opacus.accountants.rdp import RDPAccountant

from atoll.fl.privacy.accounting import BudgetExhausted, Ledger, epsilon


def _independent(noise: float, steps: int, delta: float) -> float:
    orders = RDPAccountant.DEFAULT_ALPHAS
    rdp = opacus_rdp.compute_rdp(q=1.0, noise_multiplier=noise, steps=steps, orders=orders)
    eps, _ = opacus_rdp.get_privacy_spent(orders=orders, rdp=rdp, delta=delta)
    return float(eps)


@pytest.mark.parametrize(("noise", "steps", "delta"), [(1.1, 10, 1e-5), (0.8, 3, 1e-6),
                                                        (2.0, 50, 1e-5)])
def test_epsilon_equals_opacus_rdp_for_the_same_history(noise, steps, delta):
    assert epsilon(noise, steps, delta) == pytest.approx(_independent(noise, steps, delta),
                                                         rel=1e-12)


def test_a_known_configuration_gives_its_known_epsilon():
    # noise multiplier 1.0, 10 full-participation rounds, delta 1e-5: Opacus 1.6 says 19.054
    assert epsilon(1.0, 10, 1e-5) == pytest.approx(19.0536, abs=1e-3)


def test_the_ledger_refuses_the_release_that_would_pass_the_budget():
    ledger = Ledger(noise_multiplier=1.0, delta=1e-5, max_epsilon=epsilon(1.0, 3, 1e-5) + 1e-9,
                    owner="site a")
    spent = [ledger.record() for _ in range(3)]
    assert spent == [pytest.approx(epsilon(1.0, k, 1e-5)) for k in (1, 2, 3)]
    with pytest.raises(BudgetExhausted, match="privacy budget of site a exhausted"):
        ledger.record()
    assert ledger.steps == 3  # nothing recorded for the refused release
