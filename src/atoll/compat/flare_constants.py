"""FLARE's small constant modules that Client API scripts import, with FLARE's values.

``atoll job import-flare`` points ``nvflare.app_common.np.constants`` here. The values must
be FLARE's: a NumPy job's initial model travels under ``NPConstants.NUMPY_KEY``, the key
FLARE's NumPy persistor uses (import-flare writes the initial model under that key).
"""

from __future__ import annotations

__all__ = ["NPConstants"]


class NPConstants:
    NUMPY_KEY = "numpy_key"
