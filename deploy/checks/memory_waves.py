"""Does the server's memory come back after a class leaves? (outside CI)

In one process, W waves of N labs (the presets round robin): each lab steps to the end of its
preset (at most 50 steps) and builds the Memory tab's figures for every step, as a session
clicking Step would; then every lab is released the way the idle/disconnected sweeper does it
(``Lab.release`` + ``give_back_memory``). Prints RSS before, and per wave the peak and the RSS
after release. A leak grows wave after wave; the heap's high-water mark does not.

Usage: python deploy/checks/memory_waves.py [--labs 30] [--waves 4]
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

if __package__ in (None, ""):          # python deploy/checks/X.py: make the repo importable
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from deploy.checks.common import rss_mib  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--labs", type=int, default=30)
    ap.add_argument("--waves", type=int, default=4)
    args = ap.parse_args()

    import os
    from app import hosting
    from app.figures.block_tables import block_table_figure
    from app.figures.pool_grid import pool_figure
    from app.scenarios import SCENARIOS
    from app.lab import Lab
    from app.process_memory import give_back_memory
    hosting.apply_torch_threads()                       # as the server does
    pid = os.getpid()
    warm = Lab.create()                                 # the model's weights, loaded once
    warm.step()
    warm.release()
    give_back_memory()
    print(f"RSS before: {rss_mib(pid):.0f} MiB")
    keys = list(SCENARIOS)
    for wave in range(args.waves):
        labs = [Lab.create(keys[i % len(keys)]) for i in range(args.labs)]
        for lab in labs:
            for _ in range(50):
                if not lab.step():
                    break
                for build in (pool_figure, block_table_figure):
                    lab.figures.get(build, lab.current(), lab.decode).to_json()
        peak = rss_mib(pid)
        for lab in labs:
            lab.release()
        del labs, lab
        give_back_memory()
        print(f"wave {wave + 1}: {args.labs} labs, peak {peak:.0f} MiB, "
              f"after release {rss_mib(pid):.0f} MiB", flush=True)


if __name__ == "__main__":
    main()
