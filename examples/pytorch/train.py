"""Train a PyTorch MLP through fanin with N worker processes, then check the result bit for bit.

    scripts/pyvenv.sh                                          # .venv with fanin's Python package
    go run ./cmd/fanin dev &                                   # fanin on an embedded NATS
    .venv/bin/python examples/pytorch/train.py --workers 4 --steps 200

It waits for fanin's HTTP API (the first `go run` compiles for minutes), and takes the admin token
from --token, $FANIN_TOKEN, or else the one `fanin dev` keeps in its default data directory.

The data set is generated here: 10 classes of Gaussian clusters in 32 dimensions, split into a
training partition per rank and a common test set. Each worker process trains its rank with two
lines of fanin (``fanin.torch.Module`` and ``fm.step()``, where an optimizer's step would be); the
optimizer (Adam) runs in fanin. Rank 0 prints the loss and the test accuracy as it goes.

Every worker logs the gradients it published. At the end the launcher replays them through fanin's
single-process reference (``fanin.Reference``) and checks that every worker's final parameters are
byte-identical to it. It exits 1 if they are not, or if a worker failed.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
import uuid
from pathlib import Path

import numpy as np
import torch

import fanin
import fanin.torch

CLASSES, DIM, HIDDEN = 10, 32, 256


def model() -> torch.nn.Module:
    torch.manual_seed(0)  # every worker builds the same initial weights; rank 0 uploads them
    return torch.nn.Sequential(torch.nn.Linear(DIM, HIDDEN), torch.nn.ReLU(), torch.nn.Linear(HIDDEN, CLASSES))


def data(rank: int, ranks: int, per_rank: int = 2048):
    """This rank's training partition and the common test set (the same for every process)."""
    rng = np.random.default_rng(1234)
    centers = rng.standard_normal((CLASSES, DIM)).astype(np.float32) * 0.45

    def draw(n: int, seed: int):
        r = np.random.default_rng(seed)
        y = r.integers(0, CLASSES, n)
        x = centers[y] + r.standard_normal((n, DIM)).astype(np.float32)
        return torch.from_numpy(x.astype(np.float32)), torch.from_numpy(y)

    return draw(per_rank, 100 + rank), draw(2000, 99)


def worker(args: argparse.Namespace) -> None:
    torch.set_num_threads(1)  # N processes share the cores
    rank, run = args.rank, Path(args.run)
    creds = json.loads((run / "credentials.json").read_text())
    (x, y), (tx, ty) = data(rank, args.workers)
    net = model()
    loss_fn = torch.nn.CrossEntropyLoss()
    with fanin.connect(args.nats, creds) as client:
        fm = fanin.torch.Module(net, client, args.job, rank=rank)  # fanin line 1
        if rank == 0:
            np.save(run / "init.npy", np.concatenate([p.detach().numpy().reshape(-1) for p in net.parameters()]))
        log = np.lib.format.open_memmap(run / f"grads-{rank}.npy", "w+", np.float32, (args.steps, fm.job.elements))
        g = torch.Generator().manual_seed(rank)
        for step in range(args.steps):
            idx = torch.randint(0, len(x), (args.batch,), generator=g)
            fm.zero_grad()
            loss = loss_fn(net(x[idx]), y[idx])
            loss.backward()
            log[step] = np.concatenate([p.grad.numpy().reshape(-1) for p in net.parameters()])
            fm.step()  # fanin line 2: publish the gradients, load the new parameters in place
            if rank == 0 and (step % args.every == 0 or step == args.steps - 1):
                with torch.no_grad():
                    acc = (net(tx).argmax(1) == ty).float().mean().item()
                print(f"step {fm.step_count:4d}  loss {loss.item():.4f}  test accuracy {acc:.3f}", flush=True)
        log.flush()
        np.save(run / f"final-{rank}.npy", np.concatenate([p.detach().numpy().reshape(-1) for p in net.parameters()]))
        fm.close()


def dev_token() -> str | None:
    """The admin token of `fanin dev` with its default data directory (the user cache dir, fanin/dev)."""
    base = os.environ.get("XDG_CACHE_HOME") or Path.home() / ("Library/Caches" if sys.platform == "darwin" else ".cache")
    path = Path(base) / "fanin" / "dev" / "auth" / "admin.token"
    return path.read_text().strip() if path.exists() else None


def wait_for_api(url: str, seconds: float) -> None:
    """Waits until fanin's HTTP API answers /healthz: `fanin dev` may still be starting, or compiling."""
    deadline, said = time.time() + seconds, False
    while True:
        try:
            with urllib.request.urlopen(f"{url}/healthz", timeout=5):
                return
        except (urllib.error.URLError, OSError) as e:
            if time.time() > deadline:
                raise SystemExit(f"fanin's HTTP API at {url} did not answer within {seconds:.0f} s ({e}): is `fanin dev` running?")
            if not said:
                print(f"waiting for fanin's HTTP API at {url} (a first `go run ./cmd/fanin dev` compiles for minutes)", flush=True)
                said = True
            time.sleep(1)


def launch(args: argparse.Namespace) -> int:
    wait_for_api(args.http, args.wait)
    token = args.token or os.environ.get("FANIN_TOKEN") or dev_token()
    gw = fanin.Gateway(args.http, token=token)
    job_id = f"pytorch-mlp-{uuid.uuid4().hex[:6]}"
    spec = fanin.torch.spec(model(), id=job_id, ranks=args.workers, function="adam", hyper={"lr": args.lr},
                            shard_size=16 << 10)
    created = gw.create_job(spec)
    run = Path(tempfile.mkdtemp(prefix="fanin-pytorch-"))
    cred_file = run / "credentials.json"
    cred_file.touch(0o600)
    cred_file.write_text(json.dumps(created.get("credentials") or ""))
    print(f"job {job_id}: {created['layout']['elements']} parameters in {len(created['layout']['shards'])} shards, "
          f"{args.workers} worker processes, {args.steps} steps; logs in {run}", flush=True)
    start = time.time()
    procs = [
        subprocess.Popen([sys.executable, __file__, "--rank", str(r), "--run", str(run), "--job", job_id,
                          "--nats", args.nats, "--workers", str(args.workers), "--steps", str(args.steps),
                          "--batch", str(args.batch), "--every", str(args.every)])
        for r in range(args.workers)
    ]
    failed = [r for r, p in enumerate(procs) if p.wait() != 0]
    elapsed = time.time() - start
    if failed:
        print(f"workers {failed} failed", file=sys.stderr)
        return 1
    print(f"{args.steps} steps in {elapsed:.1f} s ({args.steps / elapsed:.1f} steps/s)")

    # The check: fanin's reference, fed the logged gradients, must end where every worker ended.
    with fanin.connect(args.nats, json.loads(cred_file.read_text()) or None) as client:
        job = client.job(job_id)
    ref = fanin.Reference(job, np.load(run / "init.npy"))
    logs = [np.load(run / f"grads-{r}.npy", mmap_mode="r") for r in range(args.workers)]
    for step in range(args.steps):
        want = ref.step([log[step] for log in logs])
    for r in range(args.workers):
        got = np.load(run / f"final-{r}.npy")
        if got.tobytes() != want.tobytes():
            bad = int(np.flatnonzero(got.view(np.uint32) != want.view(np.uint32))[0])
            print(f"rank {r}: final parameters differ from fanin's reference (first at element {bad})", file=sys.stderr)
            return 1
    print(f"final parameters of all {args.workers} workers: bit-identical to fanin's reference ({args.steps} steps, "
          f"{job.elements} parameters)")
    if not args.keep:
        gw.delete_job(job_id)
    return 0


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--nats", default="nats://127.0.0.1:4222", help="fanin's NATS (fanin dev prints it)")
    p.add_argument("--http", default="http://127.0.0.1:8080", help="fanin's HTTP API (fanin dev prints it)")
    p.add_argument("--token", help="an admin or team token (default: $FANIN_TOKEN, else fanin dev's admin token)")
    p.add_argument("--wait", type=float, default=900, help="seconds to wait for fanin's HTTP API to answer")
    p.add_argument("--workers", type=int, default=4, help="worker processes, one rank each")
    p.add_argument("--steps", type=int, default=200)
    p.add_argument("--batch", type=int, default=64)
    p.add_argument("--lr", type=float, default=0.002)
    p.add_argument("--every", type=int, default=20, help="print every this many steps")
    p.add_argument("--keep", action="store_true", help="keep the job when done")
    p.add_argument("--rank", type=int, help=argparse.SUPPRESS)  # a worker process
    p.add_argument("--run", help=argparse.SUPPRESS)
    p.add_argument("--job", help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.rank is not None:
        worker(args)
        return 0
    return launch(args)


if __name__ == "__main__":
    sys.exit(main())
