"""The gradient the elastic and sync-mode tests train with, and an elastic worker process.

``gradient(rank, step, params)`` is a pseudo-gradient that depends on the parameters as a real
model's would, and on nothing but its arguments: the tests' workers and their references compute
the same bytes from the same parameters. It is elementwise, so one shard's slice of it needs that
shard's parameters only (the asp replay relies on it).

Run as a script, it is one elastic worker process: it joins the job, steps until ``--until`` (or
until killed), writing after every step a JSON line {"step", "sha", "ranks", "epoch", "computed"}
to ``--log``, then leaves.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import sys
import time

import numpy as np


def gradient(rank: int, step: int, params: np.ndarray) -> np.ndarray:
    noise = np.random.default_rng([step, rank]).standard_normal(params.size, dtype=np.float32)
    return np.float32(0.5) * params + np.float32(0.01) * noise


def sha(a: np.ndarray) -> str:
    return hashlib.sha256(a.tobytes()).hexdigest()


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--nats", required=True)
    p.add_argument("--creds", required=True, help="a file with the job's credentials (JSON)")
    p.add_argument("--job", required=True)
    p.add_argument("--id", required=True)
    p.add_argument("--until", type=int, required=True, help="leave after this step")
    p.add_argument("--log", required=True)
    p.add_argument("--compute", type=float, default=0.01, help="seconds of 'compute' per gradient")
    args = p.parse_args()

    import fanin

    def grad(rank: int, step: int, params: np.ndarray) -> np.ndarray:
        time.sleep(args.compute)  # membership changes land between steps, as with a real model
        return gradient(rank, step, params)

    with open(args.creds) as f:
        creds = json.load(f) or None
    with fanin.connect(args.nats, creds) as client, open(args.log, "a") as log:
        e = client.elastic(args.job, worker_id=args.id)
        while e.step_count < args.until:
            params = e.step(grad, timeout=120)
            ranks, epoch = e.ranks, e.epoch
            log.write(json.dumps({"step": e.step_count, "sha": sha(params), "ranks": ranks, "epoch": epoch,
                                  "computed": e.computed}) + "\n")
            log.flush()
        e.leave()
    return 0


if __name__ == "__main__":
    sys.exit(main())
