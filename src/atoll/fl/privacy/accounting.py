"""The privacy budget: epsilon at a given delta, from Opacus's RDP accountant.

Client-level DP-FedAvg releases one Gaussian mechanism per round for each site (its clipped,
noised update; every site takes part in every round, so the sampling rate is 1). Composed
over rounds with Renyi DP (Mironov 2017) and converted to (epsilon, delta) by Opacus's
``get_privacy_spent``: the same numbers Opacus's ``RDPAccountant`` gives for that history.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from atoll.spec.errors import AtollError


class BudgetExhausted(AtollError, RuntimeError):
    """Sending one more update would pass a privacy budget; the message names whose."""


def epsilon(noise_multiplier: float, steps: int, delta: float, sample_rate: float = 1.0) -> float:
    """Epsilon after ``steps`` Gaussian releases of ``noise_multiplier`` at ``delta``."""
    if steps <= 0:
        return 0.0
    from opacus.accountants import RDPAccountant

    accountant = RDPAccountant()
    accountant.history = [(noise_multiplier, sample_rate, steps)]
    return float(accountant.get_epsilon(delta=delta))


@dataclass
class Ledger:
    """What one site (or the server, for the job) has released so far, and its budget."""

    noise_multiplier: float
    delta: float
    max_epsilon: float | None = None
    owner: str = "the job"  # for the message: "site hospital-1 (local/privacy.yaml budget)"
    steps: int = 0
    spent: list[float] = field(default_factory=list)  # epsilon after each release

    def next_epsilon(self) -> float:
        return epsilon(self.noise_multiplier, self.steps + 1, self.delta)

    def check_next(self) -> float:
        """Epsilon after one more release; BudgetExhausted if that passes the budget."""
        value = self.next_epsilon()
        if self.max_epsilon is not None and value > self.max_epsilon:
            raise BudgetExhausted(
                f"privacy budget of {self.owner} exhausted: after {self.steps} update(s) epsilon "
                f"is {self.current:.3f}, one more would make it {value:.3f} > {self.max_epsilon} "
                f"(delta {self.delta}, noise multiplier {self.noise_multiplier})")
        return value

    def record(self) -> float:
        value = self.check_next()
        self.steps += 1
        self.spent.append(value)
        return value

    @property
    def current(self) -> float:
        return self.spent[-1] if self.spent else 0.0
