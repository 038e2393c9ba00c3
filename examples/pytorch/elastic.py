"""Train a PyTorch MLP on elastic workers that leave, die and join, and check it bit for bit.

    scripts/pyvenv.sh                                          # .venv with fanin's Python package
    go run ./cmd/fanin dev &                                   # fanin on an embedded NATS
    .venv/bin/python examples/pytorch/elastic.py --ranks 4 --steps 100

As train.py, it waits for fanin's HTTP API and takes the admin token from --token, $FANIN_TOKEN,
or else the one `fanin dev` keeps in its default data directory.

The job has a fixed number of logical ranks (``--ranks``); the worker processes that compute them
come and go, and fanin assigns the ranks to whichever are alive. The launcher starts three worker
processes (a, b, c) and lets them train once all three have joined; b leaves gracefully at a
fifth of the steps, d joins at two fifths, and c is killed with SIGKILL at three fifths, once d
holds ranks: c's ranks move to the others once fanin has missed its beats (about 3 s). (d's
process is started with the others and joins on a sign: a Python process importing torch takes
seconds to start on a busy machine, while the job trains on.) The run ends at ``--steps``, or a
fifth of that after the kill if it came late. Worker a prints the loss and test accuracy.

Each worker trains with ``fanin.torch.Elastic``: ``step(loss)`` calls ``loss(rank, step)`` for
every rank the worker holds, with the module at the parameters that rank's gradient is computed
from. The loss of rank r at step t uses r's data partition and a batch drawn by a generator seeded
with (r, t): nothing else. So whichever worker computes a rank, the bytes are the same, and the
result cannot depend on who held which rank when.

At the end the launcher runs fanin's single-process reference (``fanin.Reference``) on the same
ranks as if they had never moved (each step: every rank's gradient from the reference's own
parameters) and checks that the parameters every worker returned after every step, and the job's
final ones, are byte-identical to it. It exits 1 if they are not, or if a worker failed.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path

import numpy as np
import torch

import fanin
import fanin.torch
from train import dev_token, wait_for_api  # train.py, beside this file

CLASSES, DIM, HIDDEN = 10, 32, 64


def model() -> torch.nn.Module:
    torch.manual_seed(0)  # every worker builds the same initial weights; the first upload wins
    return torch.nn.Sequential(torch.nn.Linear(DIM, HIDDEN), torch.nn.ReLU(), torch.nn.Linear(HIDDEN, CLASSES))


def centers() -> np.ndarray:
    return np.random.default_rng(1234).standard_normal((CLASSES, DIM)).astype(np.float32) * 0.45


def draw(n: int, seed: int):
    r = np.random.default_rng(seed)
    y = r.integers(0, CLASSES, n)
    x = centers()[y] + r.standard_normal((n, DIM)).astype(np.float32)
    return torch.from_numpy(x.astype(np.float32)), torch.from_numpy(y)


class Loss:
    """The loss of rank r's batch t: a function of r, t and the module's weights only."""

    def __init__(self, net: torch.nn.Module, batch: int, per_rank: int = 1024) -> None:
        self.net, self.batch, self.per_rank = net, batch, per_rank
        self.parts: dict[int, tuple[torch.Tensor, torch.Tensor]] = {}  # rank -> its data partition
        self.fn = torch.nn.CrossEntropyLoss()

    def __call__(self, rank: int, step: int) -> torch.Tensor:
        if rank not in self.parts:
            self.parts[rank] = draw(self.per_rank, 100 + rank)
        x, y = self.parts[rank]
        g = torch.Generator().manual_seed(rank * 1_000_003 + step)
        idx = torch.randint(0, len(x), (self.batch,), generator=g)
        return self.fn(self.net(x[idx]), y[idx])


def sha(a: np.ndarray) -> str:
    return hashlib.sha256(a.tobytes()).hexdigest()


def flat(net: torch.nn.Module) -> np.ndarray:
    return np.concatenate([p.detach().numpy().reshape(-1) for p in net.parameters()]).astype(np.float32)


def wait_file(path: Path) -> None:
    while not path.exists():
        time.sleep(0.02)


def worker(args: argparse.Namespace) -> None:
    torch.set_num_threads(1)  # several processes share the cores; and one thread, one order of sums
    run = Path(args.run)
    creds = json.loads((run / "credentials.json").read_text()) or None
    net = model()
    loss = Loss(net, args.batch)
    tx, ty = draw(2000, 99)
    (run / f"{args.id}.ready").touch()
    if args.join_on:  # a worker that joins later: the process is ready, the worker joins on a sign
        wait_file(run / args.join_on)
    with fanin.connect(args.nats, creds) as client, open(run / f"{args.id}.jsonl", "a") as log:
        fm = fanin.torch.Elastic(net, client, args.job, worker_id=args.id)
        (run / f"{args.id}.joined").touch()
        wait_file(run / "go")  # the first workers start training together
        while True:
            stop = run / "stop"  # the last step, once the launcher has decided it
            if fm.step_count >= args.until or (stop.exists() and fm.step_count >= int(stop.read_text() or 1 << 62)):
                break
            fm.step(loss)
            log.write(json.dumps({"step": fm.step_count, "ranks": fm.ranks, "sha": sha(flat(net))}) + "\n")
            log.flush()
            if args.id == "a" and fm.step_count % args.every == 0:
                with torch.no_grad():
                    acc = (net(tx).argmax(1) == ty).float().mean().item()
                mean = np.mean(list(fm.losses.values())) if fm.losses else float("nan")
                print(f"step {fm.step_count:4d}  worker a holds ranks {fm.ranks}  loss {mean:.4f}  "
                      f"test accuracy {acc:.3f}", flush=True)
        fm.leave()


def reference(job: fanin.Job, steps: int, batch: int) -> dict[int, np.ndarray]:
    """fanin's reference on fixed ranks: every step, every rank's gradient from its own parameters."""
    torch.set_num_threads(1)
    net = model()
    ref = fanin.Reference(job, flat(net))
    loss = Loss(net, batch)
    out = {0: ref.params.copy()}
    for t in range(1, steps + 1):
        grads = []
        for r in range(job.ranks):
            with torch.no_grad():
                for tensor, p in zip(job.tensors, net.parameters()):
                    p.copy_(torch.from_numpy(ref.params[tensor.offset : tensor.offset + tensor.size]).view(tensor.shape))
            net.zero_grad()
            loss(r, t).backward()
            grads.append(np.concatenate([p.grad.numpy().reshape(-1) for p in net.parameters()]))
        out[t] = ref.step(grads).copy()
    return out


def launch(args: argparse.Namespace) -> int:
    wait_for_api(args.http, args.wait)
    token = args.token or os.environ.get("FANIN_TOKEN") or dev_token()
    gw = fanin.Gateway(args.http, token=token)
    job_id = f"pytorch-elastic-{uuid.uuid4().hex[:6]}"
    spec = fanin.torch.spec(model(), id=job_id, ranks=args.ranks, function="adam", hyper={"lr": args.lr},
                            shard_size=8 << 10)
    created = gw.create_job(spec)
    run = Path(tempfile.mkdtemp(prefix="fanin-elastic-"))
    cred_file = run / "credentials.json"
    cred_file.touch(0o600)
    cred_file.write_text(json.dumps(created.get("credentials") or ""))
    leave_at, join_at, kill_at = args.steps // 5, 2 * args.steps // 5, 3 * args.steps // 5
    print(f"job {job_id}: {created['layout']['elements']} parameters, {args.ranks} logical ranks, {args.steps} "
          f"steps; workers a, b, c; b leaves after step {leave_at}, d joins at {join_at}, c is killed at {kill_at}; "
          f"logs in {run}", flush=True)

    procs: dict[str, subprocess.Popen] = {}

    def start(name: str, until: int, join_on: str = "") -> None:
        procs[name] = subprocess.Popen([
            sys.executable, __file__, "--id", name, "--run", str(run), "--job", job_id, "--nats", args.nats,
            "--until", str(until), "--batch", str(args.batch), "--every", str(args.every), "--join-on", join_on,
        ])

    def lines(name: str) -> list[dict]:
        path = run / f"{name}.jsonl"
        text = path.read_text() if path.exists() else ""
        return [json.loads(line) for line in text.splitlines() if line.endswith("}")]

    def step() -> int:
        return max((ls[-1]["step"] for ls in map(lines, procs) if ls), default=-1)

    def wait_step(t: int, also=lambda: True) -> bool:
        """Waits until a worker has reached step t and also() holds; False if a worker failed,
        or all ended."""
        while step() < t or not also():
            codes = [p.poll() for p in procs.values()]
            if any(c not in (None, 0) for c in codes) or all(c is not None for c in codes):
                return False
            time.sleep(0.02)
        return True

    killed: set[str] = set()
    start_time = time.time()
    failed: list[str] = []
    try:
        start("a", 1 << 62)  # until the stop file's step
        start("b", leave_at)
        start("c", 1 << 62)  # until killed
        start("d", 1 << 62, join_on="d.go")  # the process starts now (it takes seconds), the worker joins later
        while not all((run / f"{n}.joined").exists() for n in "abc") or not (run / "d.ready").exists():
            if any(p.poll() is not None for p in procs.values()):
                raise SystemExit(f"a worker exited before it joined: {[n for n, p in procs.items() if p.poll() is not None]}")
            time.sleep(0.02)
        (run / "go").touch()
        ok = wait_step(join_at)
        if ok:
            print(f"-- step {step()}: worker d joins", flush=True)
            (run / "d.go").touch()
            # c dies at kill_at, once d holds ranks (on a busy machine that may take a while).
            ok = wait_step(kill_at, lambda: any(line["ranks"] for line in lines("d")))
        if ok:
            held = lines("c")[-1]["ranks"] if lines("c") else []
            print(f"-- step {step()}: worker c (ranks {held}) is killed with SIGKILL", flush=True)
            procs["c"].send_signal(signal.SIGKILL)
            killed.add("c")
            last = max(args.steps, step() + args.steps // 5)  # a while after c's death, whenever that was
            (run / "stop.tmp").write_text(str(last))
            (run / "stop.tmp").rename(run / "stop")
        failed = [n for n, p in procs.items() if p.wait() != 0 and n not in killed]
    finally:
        for p in procs.values():
            if p.poll() is None:
                p.kill()
    elapsed = time.time() - start_time
    if failed or not ok:
        print(f"workers {failed} failed, or never got so far", file=sys.stderr)
        return 1
    print(f"{step()} steps in {elapsed:.1f} s; worker b left after step {lines('b')[-1]['step']}, "
          f"c was killed after step {lines('c')[-1]['step']}")

    with fanin.connect(args.nats, json.loads(cred_file.read_text()) or None) as client:
        job = client.job(job_id)
        with client.worker(job_id, 0) as w:
            final = w.fetch().copy()
            final_step = w.step_count
    want = reference(job, final_step, args.batch)
    checked = 0
    for name in procs:
        for line in lines(name):
            if line["sha"] != sha(want[line["step"]]):
                print(f"worker {name}: the parameters after step {line['step']} differ from fanin's reference",
                      file=sys.stderr)
                return 1
            checked += 1
    if final.tobytes() != want[final_step].tobytes():
        print(f"the job's final parameters (step {final_step}) differ from fanin's reference", file=sys.stderr)
        return 1
    print(f"{checked} step results of 4 workers and the final parameters: bit-identical to fanin's reference of "
          f"{args.ranks} fixed ranks ({final_step} steps, {job.elements} parameters)")
    if not args.keep:
        gw.delete_job(job_id)
    return 0


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--nats", default="nats://127.0.0.1:4222", help="fanin's NATS (fanin dev prints it)")
    p.add_argument("--http", default="http://127.0.0.1:8080", help="fanin's HTTP API (fanin dev prints it)")
    p.add_argument("--token", help="an admin or team token (default: $FANIN_TOKEN, else fanin dev's admin token)")
    p.add_argument("--wait", type=float, default=900, help="seconds to wait for fanin's HTTP API to answer")
    p.add_argument("--ranks", type=int, default=4, help="logical ranks of the job")
    p.add_argument("--steps", type=int, default=100)
    p.add_argument("--batch", type=int, default=64)
    p.add_argument("--lr", type=float, default=0.002)
    p.add_argument("--every", type=int, default=10, help="worker a prints every this many steps")
    p.add_argument("--keep", action="store_true", help="keep the job when done")
    p.add_argument("--id", help=argparse.SUPPRESS)  # a worker process
    p.add_argument("--run", help=argparse.SUPPRESS)
    p.add_argument("--job", help=argparse.SUPPRESS)
    p.add_argument("--until", type=int, help=argparse.SUPPRESS)
    p.add_argument("--join-on", help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.id is not None:
        worker(args)
        return 0
    return launch(args)


if __name__ == "__main__":
    sys.exit(main())
