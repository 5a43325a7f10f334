"""Bring what you know from NVIDIA FLARE: its Client API (``flare_client``) for training
scripts, and the translation of a FLARE job folder into an atoll job (``flare_job``, behind
``atoll job import-flare``). The job layer: it imports ``atoll.client`` and ``atoll.fl``, never a
parent, the worker, the wire or the CLI (import-linter checks it)."""
