"""ssp and asp jobs from Python against a real `fanin dev`, as the Go SDK's tests check them
(sdk/sync_test.go): an ssp job with a slow worker runs ahead on stale parameters within the bound,
which ``Worker.versions`` shows, and ends bit-identical to the reference recomputing every gradient
from the versions recorded; an asp job ends bit-identical to the reference applying the same
gradients, one by one, in the order fanin applied them (``Client.watch_applied``)."""

from __future__ import annotations

import threading
import time

import numpy as np

import fanin
from elastic_worker import gradient


def job_spec(ranks: int, sync: str, **extra) -> dict:
    return {
        "id": sync,
        "ranks": ranks,
        "tensors": [{"name": "w", "shape": [1000, 3]}],
        "function": {"name": "adam", "hyper": {"lr": 0.01}},
        "init": {"kind": "uniform", "seed": 9, "scale": 0.5},
        "shard_size": 4096,  # 3 shards
        "sync": sync,
        **extra,
    }


def train(nats: str, creds, job_id: str, ranks: int, steps: int, slow: int, pause: float = 0.015):
    """Every rank in a thread of its own, on a connection of its own, for steps steps of
    ``gradient``; rank slow pauses after each step. Returns {(rank, step): versions used}."""
    used: dict[tuple[int, int], list[int]] = {}
    errs: list[BaseException] = []
    lock = threading.Lock()

    def run(r: int) -> None:
        try:
            with fanin.connect(nats, creds) as c, c.worker(job_id, r) as w:
                params = w.fetch(timeout=60)
                for t in range(1, steps + 1):
                    v = w.versions()
                    params = w.step(gradient(r, t, params), timeout=60)
                    assert w.own_step == t, f"rank {r}: own step {w.own_step} after step {t}"
                    with lock:
                        used[(r, t)] = v
                    if r == slow:
                        time.sleep(pause)
        except BaseException as e:  # reported below
            errs.append(e)

    ts = [threading.Thread(target=run, args=(r,)) for r in range(ranks)]
    for t in ts:
        t.start()
    for t in ts:
        t.join()
    assert not errs, errs
    return used


def final(client: fanin.Client, job_id: str, version: int) -> np.ndarray:
    """The job's parameters once every shard is at version."""
    with client.worker(job_id, 0) as w:
        deadline = time.time() + 30
        while True:
            p = w.fetch(timeout=30)
            if w.versions() == [version] * len(w.job.shards):
                return p.copy()
            assert time.time() < deadline, f"shards at versions {w.versions()}, want {version}"
            time.sleep(0.05)


def initial(client: fanin.Client, job_id: str) -> np.ndarray:
    with client.worker(job_id, 0) as w:
        p = w.fetch(timeout=30).copy()
        assert w.versions() == [0] * len(w.job.shards)
        return p


def test_ssp_slow_worker_bounded_staleness(dev):
    s, ranks, steps = 2, 3, 30
    created = dev.create(job_spec(ranks, "ssp", staleness=s))
    job_id = created["spec"]["id"]
    with fanin.connect(dev.nats, created["credentials"]) as c:
        job = c.job(job_id)
        init = initial(c, job_id)
        used = train(dev.nats, created["credentials"], job_id, ranks, steps, slow=2)
        got = final(c, job_id, steps)

    stale = 0
    for (r, t), v in used.items():
        assert min(v) >= t - 1 - s, f"rank {r} step {t} computed from versions {v}: beyond the bound"
        stale += min(v) < t - 1
    assert stale > 0, "no gradient was computed from stale parameters: the run did not exercise ssp"

    # The reference: each step the rank-order sum of every rank's gradient, each recomputed from
    # the parameters it was computed from, shard by shard at the versions recorded.
    ref = fanin.Reference(job, init)
    history = [init.copy()]
    frm = np.empty_like(init)
    for t in range(1, steps + 1):
        grads = []
        for r in range(ranks):
            for i, sh in enumerate(job.shards):
                off, n = sh["off"], sh["len"]
                frm[off : off + n] = history[used[(r, t)][i]][off : off + n]
            grads.append(gradient(r, t, frm))
        history.append(ref.step(grads).copy())
    assert got.tobytes() == history[-1].tobytes(), "the ssp run differs from the reference replayed from the versions"


def test_asp_matches_the_applied_order(dev):
    ranks, steps = 2, 20
    created = dev.create(job_spec(ranks, "asp"))
    job_id = created["spec"]["id"]
    with fanin.connect(dev.nats, created["credentials"]) as c:
        job = c.job(job_id)
        init = initial(c, job_id)
        with c.watch_applied(job_id) as order:
            used = train(dev.nats, created["credentials"], job_id, ranks, steps, slow=1)
            got = final(c, job_id, ranks * steps)
            applied = order.read()

    # Every shard applied each gradient once, one at a time: versions 1..ranks*steps.
    assert sorted(applied) == list(range(len(job.shards)))
    for i in applied:
        assert sorted(applied[i]) == list(range(1, ranks * steps + 1)), f"shard {i}: versions {sorted(applied[i])}"
        assert sorted(applied[i].values()) == sorted(used), f"shard {i} did not apply every gradient once"

    ref = fanin.Reference(job, init)
    interleaved = False
    for i in range(len(job.shards)):
        hist = [init.copy()]  # the whole vector per version: shard i's slice is what counts
        prev = None
        for v in range(1, ranks * steps + 1):
            r, t = applied[i][v]
            interleaved |= prev is not None and r != prev
            prev = r
            g = gradient(r, t, hist[used[(r, t)][i]])  # elementwise: shard i needs its own version only
            hist.append(ref.apply_rank(i, g).copy())
    assert got.tobytes() == ref.params.tobytes(), "the asp run differs from the reference in the applied order"
    if not interleaved:
        print("the two ranks' updates did not interleave on any shard")
