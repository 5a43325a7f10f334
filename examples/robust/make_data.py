"""Five clinics for the robust aggregation example: scikit-learn's digits, a quarter held out as
a shared test split, the rest dealt at random (IID) to five clinics, a fifth of each kept for
validation.

    python examples/robust/make_data.py OUT_DIR   # OUT_DIR/clinic-<n>/{train,val,test}.npz
"""

import sys
from pathlib import Path

import numpy as np

SITES = tuple(f"clinic-{n}" for n in range(1, 6))


def write_clinics(out_dir, seed: int = 0) -> dict[str, Path]:
    from atoll.demo.data import load_digits

    x, y = load_digits()
    order = np.random.default_rng(seed).permutation(len(x))
    n_test = len(x) // 4
    test, rest = order[:n_test], order[n_test:]
    folders = {}
    for site, mine in zip(SITES, np.array_split(rest, len(SITES)), strict=True):
        n_val = len(mine) // 5
        folder = Path(out_dir) / site
        folder.mkdir(parents=True, exist_ok=True)
        np.savez(folder / "train.npz", x=x[mine[n_val:]], y=y[mine[n_val:]])
        np.savez(folder / "val.npz", x=x[mine[:n_val]], y=y[mine[:n_val]])
        np.savez(folder / "test.npz", x=x[test], y=y[test])
        folders[site] = folder
    return folders


if __name__ == "__main__":
    for site, folder in write_clinics(sys.argv[1]).items():
        print(f"{site}: {folder}")
