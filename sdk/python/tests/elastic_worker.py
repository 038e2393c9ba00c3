"""The gradient the elastic and sync-mode tests train with, and an elastic worker process.

``gradient(rank, step, params)`` is a pseudo-gradient that depends on the parameters as a real
model's would, and on nothing but its arguments: the tests' workers and their references compute
the same bytes from the same parameters. It is elementwise, so one shard's slice of it needs that
shard's parameters only (the asp replay relies on it).

Run as a script, it is one elastic worker process: it touches ``--ready`` once started (Python
with numpy takes a while to start on a busy machine), waits for the file ``--join-on`` if given,
joins the job, touches ``--joined``, waits for ``--go`` if given, then steps until ``--until`` or
the step written in the file ``--stop`` (or until killed; its own step, in an ssp job), writing
after every step a JSON line {"step", "own", "sha", "ranks", "epoch", "computed"} to ``--log``,
and leaves. ``--record`` keeps its record of its gradient messages (``fanin.recorded_versions``).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
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
    p.add_argument("--stop", help="a file: leave after the step it holds, once it exists")
    p.add_argument("--log", required=True)
    p.add_argument("--ready", help="a file to touch once the process has started")
    p.add_argument("--join-on", help="a file to wait for before joining")
    p.add_argument("--joined", help="a file to touch once joined")
    p.add_argument("--go", help="a file to wait for before the first step")
    p.add_argument("--record", help="the worker's record of its gradient messages (ssp replays)")
    p.add_argument("--compute", type=float, default=0.01, help="seconds of 'compute' per gradient")
    args = p.parse_args()

    import fanin

    def grad(rank: int, step: int, params: np.ndarray) -> np.ndarray:
        time.sleep(args.compute)  # membership changes land between steps, as with a real model
        return gradient(rank, step, params)

    def wait(path: str) -> None:
        while path and not os.path.exists(path):
            time.sleep(0.01)

    def until() -> int:
        if args.stop and os.path.exists(args.stop):
            with open(args.stop) as f:
                return min(args.until, int(f.read()))
        return args.until

    with open(args.creds) as f:
        creds = json.load(f) or None
    if args.ready:
        open(args.ready, "w").close()
    wait(args.join_on)
    with fanin.connect(args.nats, creds) as client, open(args.log, "a") as log:
        e = client.elastic(args.job, worker_id=args.id, record=args.record)
        if args.joined:
            open(args.joined, "w").close()
        wait(args.go)
        while e.own_step < until():  # own_step: the step_count of a bsp job, an ssp job's own step
            params = e.step(grad, timeout=120)
            ranks, epoch = e.ranks, e.epoch
            log.write(json.dumps({"step": e.step_count, "own": e.own_step, "sha": sha(params), "ranks": ranks,
                                  "epoch": epoch, "computed": e.computed}) + "\n")
            log.flush()
        e.leave()
    return 0


if __name__ == "__main__":
    sys.exit(main())
