"""The Python side of `fanin bench --only python`: N ranks of a job in this process, stepped in BSP
lockstep with the bench's gradients (the same values as the Go side's), printing the Go side's
report (lab/bench/workers.go) as JSON. Not part of the API.

    python3 -m fanin._bench --mode numpy|torch --nats URL --creds FILE --job ID --ranks 8 --warmup 2 --steps 10
"""

from __future__ import annotations

import argparse
import hashlib
import json
import time

import numpy as np

import fanin

_PHI = np.uint64(0x9E3779B97F4A7C15)


def fill_gradient(n: int, rank: int) -> np.ndarray:
    """The bench's gradient of a rank: lab/bench/util.go's fillGradient, bit for bit."""
    with np.errstate(over="ignore"):
        z = np.uint64(rank + 1) * _PHI + (np.arange(1, n + 1, dtype=np.uint64) * _PHI)
        x = (z ^ (z >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
        x = (x ^ (x >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
        x ^= x >> np.uint64(31)
    v = x.astype(np.uint32).view(np.int32).astype(np.float32)
    return (v / np.float32(2147483647)) * np.float32(1e-3)


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--mode", choices=["numpy", "torch"], default="numpy")
    p.add_argument("--nats", required=True)
    p.add_argument("--creds", default="")
    p.add_argument("--job", required=True)
    p.add_argument("--ranks", type=int, default=8)
    p.add_argument("--warmup", type=int, default=2)
    p.add_argument("--steps", type=int, default=10)
    a = p.parse_args()
    creds = json.load(open(a.creds)) if a.creds else None
    clients = [fanin.connect(a.nats, creds) for _ in range(a.ranks)]  # one connection per rank, as the Go side
    job = clients[0].job(a.job)
    grads = [fill_gradient(job.elements, r) for r in range(a.ranks)]

    if a.mode == "numpy":
        ranks = fanin.Ranks([c.worker(a.job, r) for r, c in enumerate(clients)])

        def step() -> None:
            ranks.step(grads)

        def copied() -> int:
            return ranks.bytes_copied

        def params() -> np.ndarray:
            return ranks.workers[0].params
    else:
        import torch

        import fanin.torch as fanin_torch

        torch.set_num_threads(1)

        class Flat(torch.nn.Module):
            def __init__(self) -> None:
                super().__init__()
                t = job.tensors[0]
                self.register_parameter(t.name, torch.nn.Parameter(torch.zeros(t.shape)))

        module = Flat()
        fm = fanin_torch.Module(module, clients, a.job, ranks=list(range(a.ranks)))
        for g, buf in zip(grads, fm._grads):  # what backward would leave in each rank's buffer
            buf.numpy()[:] = g

        def step() -> None:
            fm.step()

        def copied() -> int:
            return fm.bytes_copied

        def params() -> np.ndarray:
            return next(module.parameters()).detach().numpy()

    for _ in range(a.warmup):
        step()
    c0 = copied()
    took = []
    start = time.perf_counter()
    for _ in range(a.steps):
        t0 = time.perf_counter()
        step()
        took.append(time.perf_counter() - t0)
    elapsed = time.perf_counter() - start
    took.sort()
    print(json.dumps({
        "steps_per_sec": a.steps / elapsed,
        "p50_ms": took[len(took) // 2] * 1000,
        "sha256": hashlib.sha256(np.ascontiguousarray(params()).tobytes()).hexdigest(),
        "bytes_copied": (copied() - c0) // a.steps,
        "elements": job.elements,
        "mode": a.mode,
    }))


if __name__ == "__main__":
    main()
