"""atoll site script for the benchmark job (client API): adds 1.0 to every weight in place and
sends the model back (bf16 weights: one ulp up), then drops its reference to it before waiting for the next round.

Every round, the first round included, brings the global model (the server makes it, see make_job.py).
Each round's receive and send times are appended to <mark-dir>/<site>.marks so the runner
measures per-round time the same way for every system. The mark folder is the study's dataset
`marks` where the site maps one (ATOLL_DATASETS: a confined worker sees no other host folder),
with --mark-sub the job's own folder in it; else --mark-dir.
"""

from __future__ import annotations

import argparse
import json
import os
import time

import numpy as np

import atoll.client as fl
from atoll.fl import bfloat16
from atoll.fl.bfloat16 import BF16


def mark(mark_dir: str, site: str, event: str, rnd: int) -> None:
    if mark_dir:
        with open(os.path.join(mark_dir, f"{site}.marks"), "a") as f:
            f.write(f"{event} {rnd} {time.time():.6f}\n")


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--mark-dir", default="")
    parser.add_argument("--mark-sub", default="")
    args = parser.parse_args()
    mark_dir = json.loads(os.environ.get("ATOLL_DATASETS") or "{}").get("marks", args.mark_dir)
    if mark_dir and args.mark_sub:  # the job's own folder in the deployment's marks dataset
        mark_dir = os.path.join(mark_dir, args.mark_sub)
        os.makedirs(mark_dir, exist_ok=True)
    fl.init()
    site = fl.site_name()
    while fl.is_running():
        model = fl.receive()
        if model is None:
            break
        rnd = model.current_round
        mark(mark_dir, site, "recv", rnd)
        params = model.params
        for array in params.values():
            if array.dtype == BF16:  # one ulp up, in place: no float32 copy of a 512 MiB tensor
                np.add(bfloat16.words(array), 1, out=bfloat16.words(array))
            else:
                np.add(array, 1.0, out=array)  # in place: the decoded arrays are ours
        fl.send(fl.Model(params=params, num_examples=1))
        mark(mark_dir, site, "sent", rnd)
        # The next is_running() decodes the next round's model: drop this one first, or a
        # 1 GiB model is held twice while it arrives (`array` too: the loop left it bound to the
        # last tensor, which the next model could then not be decoded into).
        del model, params
        array = None


main()
