"""Privacy for federated learning: filters on tasks and replies, differential privacy with its
accounting, and secure aggregation (the server learns only the sum of the sites' updates).

The settings and a site's required policy are data (``atoll.spec.privacy``); this package
applies them: ``filters`` (pure functions on an update), ``accounting`` (epsilon through
Opacus's RDP accountant), ``site_privacy`` (what a site worker does to what it receives and
sends), ``server_privacy`` (the server's DP step and budget), ``secagg/`` (the protocol),
``dp_sgd`` (example-level DP-SGD with Opacus, for site scripts). docs/privacy.md is the guide.
"""
