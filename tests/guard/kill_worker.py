"""A guarded loop that resumes from its folder: the process the SIGKILL test kills.

``python kill_worker.py FOLDER STEPS``: resumes from the folder's newest valid checkpoint
(if any), trains to STEPS, and prints ``resume <step>`` once and ``step <s>`` after every
guard.step (flushed: the parent kills on these lines). Every step's batch depends only on
the step, so a resumed run sees the data it would have seen.
"""

from __future__ import annotations

import os
import sys
import warnings
from pathlib import Path

os.environ.setdefault("OMP_WAIT_POLICY", "passive")

import torch

sys.path.insert(0, str(Path(__file__).parent))
from guard_helpers import Loop, tiny_model

from collapse_guard.guard import Guard

__all__ = ["CONFIG", "main"]

# a checkpoint every 3 healthy steps, healthy after 2 quiet ones: the durable point
# moves every few steps (the run file with it)
CONFIG = {"checkpoint_every": 3, "healthy_quiet_steps": 2}


def main(folder: str, steps: int) -> None:
    torch.set_num_threads(1)
    warnings.simplefilter("ignore")
    model, opt = tiny_model()
    guard = Guard(model, opt, folder, risk="off", policy=CONFIG)
    start = guard.resume() if guard.ring.newest() is not None else 0
    print(f"resume {start}", flush=True)
    for step in range(start, steps):
        loop = Loop(seed=step)
        guard.step(loop.loss(model))
        opt.zero_grad()
        print(f"step {step}", flush=True)
    guard.close()
    print("done", flush=True)


if __name__ == "__main__":
    main(sys.argv[1], int(sys.argv[2]))
