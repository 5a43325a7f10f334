"""Example-level DP-SGD for PyTorch site scripts, through Opacus (a maintained library).

```python
from atoll.fl.privacy.dp_sgd import make_private

net, optimizer, loader = make_private(net, optimizer, loader)   # once, before the loop
```

The noise multiplier and the per-example gradient bound come from the job's app.yaml
(``privacy.dp_sgd``), which the site checks against its policy like every privacy setting.
One Opacus ``PrivacyEngine`` (RDP accountant) serves the worker's whole job, so epsilon counts
every step of every round; each train reply carries it as the metric ``dp_sgd_epsilon``, and a
site whose ``local/privacy.yaml`` sets ``budget.epsilon`` refuses to send an update trained
past it.
"""

from __future__ import annotations

from typing import Any

from atoll.fl.client_runtime import ClientError, current


def make_private(module: Any, optimizer: Any, data_loader: Any, **opacus_options: Any) -> Any:
    """Opacus's ``PrivacyEngine.make_private`` with the job's ``privacy.dp_sgd`` settings;
    returns what it returns (module, optimizer, data loader). Extra keyword arguments go to
    Opacus (``poisson_sampling``, ``clipping``...)."""
    privacy = current().privacy
    settings = privacy.settings.dp_sgd if privacy is not None else None
    if privacy is None or settings is None:
        raise ClientError("make_private() needs privacy.dp_sgd in app.yaml "
                          "(noise_multiplier, max_grad_norm): the site checks and accounts it")
    for name in ("noise_multiplier", "max_grad_norm"):
        if name in opacus_options:
            raise ClientError(f"make_private(): {name} comes from app.yaml privacy.dp_sgd")
    return privacy.dp_sgd_engine().make_private(
        module=module, optimizer=optimizer, data_loader=data_loader,
        noise_multiplier=settings.noise_multiplier, max_grad_norm=settings.max_grad_norm,
        **opacus_options)
