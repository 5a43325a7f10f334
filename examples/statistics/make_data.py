"""Synthetic cohorts for the statistics example: one CSV per hospital, each its own population.

    python examples/statistics/make_data.py OUT_DIR   # OUT_DIR/<site>/cohort.csv

Columns: patient_id, age, bmi, systolic_bp, length_of_stay (days), sex. A few cells are empty
(missing values are skipped). Each site maps OUT_DIR/<site> as the study dataset ``cohort``.
"""

import csv
import sys
from pathlib import Path

import numpy as np

SITES = {  # site -> (records, mean age, mean bmi)
    "hospital-1": (400, 62.0, 27.5),
    "hospital-2": (250, 48.0, 25.0),
    "hospital-3": (120, 70.0, 29.0),
}
COLUMNS = ["patient_id", "age", "bmi", "systolic_bp", "length_of_stay", "sex"]


def write_cohorts(out_dir, seed: int = 0) -> dict[str, Path]:
    rng = np.random.default_rng(seed)
    folders = {}
    for site, (n, age, bmi) in SITES.items():
        ages = np.clip(rng.normal(age, 12, n), 18, 99).round()
        bmis = rng.normal(bmi, 4, n).round(1)
        bp = (100 + 0.5 * ages + rng.normal(0, 12, n)).round()
        stay = rng.gamma(2.0, 2.5, n).round(1)
        folder = Path(out_dir) / site
        folder.mkdir(parents=True, exist_ok=True)
        with open(folder / "cohort.csv", "w", newline="") as out:
            writer = csv.writer(out)
            writer.writerow(COLUMNS)
            for i in range(n):
                row = [f"{site}-{i}", ages[i], bmis[i], bp[i], stay[i], rng.choice(["F", "M"])]
                if rng.random() < 0.03:
                    row[3] = ""  # a missing blood pressure
                writer.writerow(row)
        folders[site] = folder
    return folders


if __name__ == "__main__":
    for site, folder in write_cohorts(sys.argv[1]).items():
        print(f"{site}: {folder / 'cohort.csv'}")
