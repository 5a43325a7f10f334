"""FLARE client script (Client API): adds 1.0 to every weight and sends the model back.

Each round's receive and send times are appended to <mark-dir>/<site>.marks so the runner
measures per-round time the same way for every system.
"""

from __future__ import annotations

import argparse
import os
import time

import nvflare.client as flare


def mark(mark_dir: str, site: str, event: str, rnd: int) -> None:
    if mark_dir:
        with open(os.path.join(mark_dir, f"{site}.marks"), "a") as f:
            f.write(f"{event} {rnd} {time.time():.6f}\n")


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--mark-dir", default="")
    args = parser.parse_args()
    flare.init()
    site = flare.get_site_name()
    while flare.is_running():
        model = flare.receive()
        if model is None:
            break
        mark(args.mark_dir, site, "recv", model.current_round)
        params = {k: v + 1.0 for k, v in model.params.items()}
        flare.send(flare.FLModel(params=params, meta={"NUM_STEPS_CURRENT_ROUND": 1}))
        mark(args.mark_dir, site, "sent", model.current_round)


if __name__ == "__main__":
    main()
