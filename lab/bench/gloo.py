"""One rank of the gloo baseline of `fanin bench` (lab/bench/gloo.go runs N of these).

What PyTorch's DistributedDataParallel does with a model's gradients on CPU, on the bench's bytes:
copy the gradient into its bucket, divide it by the world size, all-reduce the bucket with gloo,
and take an SGD step (p -= lr * mean gradient). One thread per process (torch.set_num_threads(1)),
as a training job on a shared machine runs it.

Modes: "throughput" runs warmup steps, then times steps back to back (steps/s, as fanin's
e2e scenarios do); "latency" puts a barrier before every step and times each step alone, from
the barrier to the new parameters. It prints one JSON object on stdout. With --hold it prints
"ready" after the warm-up and waits for a line on stdin before the timed steps (the cluster
scenario reads the links' counters in between).
"""

import argparse
import hashlib
import json
import sys
import time

import numpy as np
import torch
import torch.distributed as dist


_PHI = np.uint64(0x9E3779B97F4A7C15)


def fill_gradient(n, rank):
    """The bench's gradient of a rank, bit for bit (lab/bench/util.go's fillGradient), made
    a million elements at a time to bound the temporaries of eight processes doing it at once."""
    out = np.empty(n, dtype=np.float32)
    step = 1 << 20
    with np.errstate(over="ignore"):
        base = np.uint64(rank + 1) * _PHI
        for lo in range(0, n, step):
            hi = min(n, lo + step)
            z = base + np.arange(lo + 1, hi + 1, dtype=np.uint64) * _PHI
            x = (z ^ (z >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
            x = (x ^ (x >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
            x ^= x >> np.uint64(31)
            v = x.astype(np.uint32).view(np.int32).astype(np.float32)
            out[lo:hi] = (v / np.float32(2147483647)) * np.float32(1e-3)
    return out


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--rank", type=int, required=True)
    ap.add_argument("--world", type=int, required=True)
    ap.add_argument("--port", type=int, required=True)
    ap.add_argument("--master", default="127.0.0.1", help="address of rank 0's rendezvous")
    ap.add_argument("--hold", action="store_true")
    ap.add_argument("--elements", type=int, required=True)
    ap.add_argument("--lr", type=float, required=True)
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument("--steps", type=int, default=10)
    ap.add_argument("--mode", choices=["throughput", "latency"], default="throughput")
    a = ap.parse_args()

    torch.set_num_threads(1)
    n = a.elements
    grad = torch.from_numpy(fill_gradient(n, a.rank))
    params = torch.zeros(n, dtype=torch.float32)
    bucket = torch.empty(n, dtype=torch.float32)

    dist.init_process_group("gloo", init_method=f"tcp://{a.master}:{a.port}", rank=a.rank, world_size=a.world)

    def step():
        bucket.copy_(grad)
        bucket.div_(a.world)
        dist.all_reduce(bucket)
        params.add_(bucket, alpha=-a.lr)

    for _ in range(a.warmup):
        step()
    if a.hold:
        print("ready", flush=True)
        if not sys.stdin.readline():
            sys.exit("held after the warm-up: stdin ended without a line to go on")
    took = []
    dist.barrier()
    start = time.perf_counter()
    for _ in range(a.steps):
        if a.mode == "latency":
            dist.barrier()
            t0 = time.perf_counter()
            step()
            took.append(time.perf_counter() - t0)
        else:
            step()
    elapsed = time.perf_counter() - start
    dist.barrier()
    total = a.warmup + a.steps
    # A few parameters for the bench to check against the expected -total*lr*mean(gradients).
    idx = [i * (n - 1) // 15 for i in range(16)] if n >= 16 else list(range(n))
    out = {
        "rank": a.rank,
        "steps": a.steps,
        "elapsed_s": elapsed,
        "step_ms": [t * 1e3 for t in took],
        "sha256": hashlib.sha256(params.numpy().tobytes()).hexdigest(),
        "sample_index": idx,
        "sample": [float(params[i]) for i in idx],
        "total_steps": total,
        "torch": torch.__version__,
    }
    dist.destroy_process_group()
    json.dump(out, sys.stdout)
    sys.stdout.write("\n")


if __name__ == "__main__":
    main()
