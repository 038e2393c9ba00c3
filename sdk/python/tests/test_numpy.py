"""numpy workers against a real `fanin dev`: bit-identical to fanin's reference, rejections as
exceptions with their reason, a late worker, several ranks in one process, no copies."""

from __future__ import annotations

import threading
import tracemalloc

import numpy as np
import pytest

import fanin


def job_spec(ranks: int, elements: int = 3000, function: str = "adam", **extra) -> dict:
    return {
        "id": "np",
        "ranks": ranks,
        "tensors": [{"name": "w", "shape": [elements // 3, 3]}],
        "function": {"name": function, "hyper": {"lr": 0.01}},
        "init": {"kind": "uniform", "seed": 7, "scale": 0.5},
        "shard_size": 4096,  # several shards
        **extra,
    }


def grads_for(rng: np.random.Generator, ranks: int, n: int) -> list[np.ndarray]:
    return [rng.standard_normal(n).astype(np.float32) for _ in range(ranks)]


def test_workers_in_threads_are_bit_identical(dev):
    created = dev.create(job_spec(2))
    with fanin.connect(dev.nats, created["credentials"]) as c:
        job = c.job(created["spec"]["id"])
        assert job.elements == 3000 and len(job.shards) > 1
        ws = [c.worker(job.id, r) for r in range(2)]
        init = ws[0].fetch().copy()
        assert ws[0].step_count == 0
        ref = fanin.Reference(job, init)
        rng = np.random.default_rng(1)
        for step in range(1, 11):
            gs = grads_for(rng, 2, job.elements)
            out: list = [None, None]
            errs: list = []

            def run(r: int) -> None:
                try:
                    out[r] = ws[r].step(gs[r], timeout=60)
                except Exception as e:  # reported below
                    errs.append(e)

            ts = [threading.Thread(target=run, args=(r,)) for r in range(2)]
            for t in ts:
                t.start()
            for t in ts:
                t.join()
            assert not errs, errs
            want = ref.step(gs)
            for r in range(2):
                assert out[r] is ws[r].params  # the worker's own buffer, no new array
                assert out[r].tobytes() == want.tobytes(), f"rank {r} step {step} differs from the reference"
                assert ws[r].step_count == step
        assert sum(w.bytes_copied for w in ws) == 0


def test_rejections_are_exceptions_with_reasons(dev):
    created = dev.create(job_spec(1))
    job_id = created["spec"]["id"]
    with fanin.connect(dev.nats, created["credentials"]) as c:
        with pytest.raises(fanin.RejectedError) as e:
            c.worker(job_id, 3)
        assert e.value.reason == "rank_out_of_range"

        with pytest.raises(fanin.RejectedError) as e:  # a job's credentials reach that job only
            c.worker("no-such-job", 0)
        assert e.value.reason == "forbidden"

        w = c.worker(job_id, 0)
        w.fetch()
        with pytest.raises(fanin.RejectedError) as e:
            w.step(np.zeros(10, np.float32))
        assert e.value.reason == "bad_length"

        bad = np.zeros(w.job.elements, np.float32)
        bad[2500] = np.inf
        with pytest.raises(fanin.RejectedError) as e:
            w.step(bad, timeout=30)
        assert e.value.reason == "non_finite"
        assert e.value.rank == 0 and e.value.step == 1 and e.value.shard is not None
        # The same step, corrected, passes: nothing was applied.
        params = w.step(np.ones(w.job.elements, np.float32), timeout=30)
        assert w.step_count == 1 and np.isfinite(params).all()

        w.close()
        with pytest.raises(fanin.FaninError, match="closed"):
            w.step(np.ones(w.job.elements, np.float32))

    gw = dev.gateway()
    with pytest.raises(fanin.GatewayError) as ge:
        gw.create_job({"id": "bad", "ranks": 0, "tensors": [], "function": {"name": "adam"}})
    assert ge.value.status == 400 and ge.value.detail

    # A job's credentials reach its own job only.
    other = dev.create(job_spec(1))
    with fanin.connect(dev.nats, created["credentials"]) as c:
        with pytest.raises(fanin.RejectedError) as e:
            c.worker(other["spec"]["id"], 0, timeout=10)
        assert e.value.reason == "forbidden"


def test_late_worker_catches_up(dev):
    created = dev.create(job_spec(1, function="sgd"))
    job_id = created["spec"]["id"]
    rng = np.random.default_rng(2)
    with fanin.connect(dev.nats, created["credentials"]) as c:
        w = c.worker(job_id, 0)
        ref = fanin.Reference(w.job, w.fetch().copy())
        for _ in range(3):
            g = grads_for(rng, 1, w.job.elements)
            w.step(g[0])
            ref.step(g)
        w.close()
    # A new process (here: a new connection and worker) takes the rank over where it was.
    with fanin.connect(dev.nats, created["credentials"]) as c:
        late = c.worker(job_id, 0)
        params = late.fetch()
        assert late.step_count == 3
        assert params.tobytes() == ref.params.tobytes()
        g = grads_for(rng, 1, late.job.elements)
        assert late.step(g[0]).tobytes() == ref.step(g).tobytes()
        assert late.step_count == 4


def test_several_ranks_in_one_process_without_copies(dev):
    ranks = 4
    created = dev.create(job_spec(ranks, elements=3 * 200_000))  # 2.4 MB of parameters, many shards
    job_id = created["spec"]["id"]
    rng = np.random.default_rng(3)
    with fanin.connect(dev.nats, created["credentials"]) as c:
        with c.ranks(job_id, range(ranks)) as rs:
            init = rs.fetch()[0].copy()
            ref = fanin.Reference(rs.job, init)
            gs = grads_for(rng, ranks, rs.job.elements)
            want = ref.step(gs).copy()
            tracemalloc.start()
            out = rs.step(gs)
            _, peak = tracemalloc.get_traced_memory()
            tracemalloc.stop()
            for r, p in enumerate(out):
                assert p is rs.workers[r].params
                assert p.tobytes() == want.tobytes(), f"rank {r} differs"
            # Not a copy of a gradient or of the parameters was made in Python (one is 2.4 MB).
            assert peak < 100_000, f"Python allocated {peak} bytes during a step"
            assert rs.bytes_copied == 0

            # A float64 gradient must be converted: that copy is counted.
            g64 = [g.astype(np.float64) for g in grads_for(rng, ranks, rs.job.elements)]
            rs.step(g64)
            assert rs.bytes_copied == ranks * 4 * rs.job.elements
            assert rs.workers[0].step_count == 2


def test_upload_init(dev):
    spec = job_spec(1)
    spec["init"] = {"kind": "upload"}
    created = dev.create(spec)
    job_id = created["spec"]["id"]
    mine = np.linspace(-1, 1, 3000, dtype=np.float32)
    with fanin.connect(dev.nats, created["credentials"]) as c:
        c.upload(job_id, mine)
        c.upload(job_id, mine)  # the same, again: a no-op
        w = c.worker(job_id, 0)
        assert w.fetch(timeout=30).tobytes() == mine.tobytes()


def _round_bf16(g: np.ndarray) -> np.ndarray:
    """g rounded to bfloat16 and back, by torch when it is installed, else by the bits."""
    try:
        import torch

        return torch.from_numpy(g.copy()).to(torch.bfloat16).to(torch.float32).numpy()
    except ImportError:
        b = g.view(np.uint32).astype(np.uint64)
        return ((b + 0x7FFF + ((b >> 16) & 1)) & 0xFFFF0000).astype(np.uint32).view(np.float32)


def test_16bit_gradients_are_bit_identical(dev):
    """Rank 0 publishes f16, rank 1 bf16: the parameters are the reference's for the gradients as
    numpy (float16) and torch (bfloat16) round them; and not the float32 gradients' reference."""
    created = dev.create(job_spec(2))
    with fanin.connect(dev.nats, created["credentials"]) as c:
        job = c.job(created["spec"]["id"])
        with pytest.raises(ValueError):
            c.worker(job.id, 0, grad_dtype="fp16")
        ws = [c.worker(job.id, 0, grad_dtype="f16"), c.worker(job.id, 1, grad_dtype="bf16")]
        init = ws[0].fetch().copy()
        ref, ref32 = fanin.Reference(job, init), fanin.Reference(job, init)
        rng = np.random.default_rng(16)
        for step in range(1, 6):
            gs = [g * np.float32(1e-3) for g in grads_for(rng, 2, job.elements)]
            out: list = [None, None]
            ts = [threading.Thread(target=lambda r=r: out.__setitem__(r, ws[r].step(gs[r], timeout=60))) for r in range(2)]
            for t in ts:
                t.start()
            for t in ts:
                t.join()
            want = ref.step([gs[0].astype(np.float16).astype(np.float32), _round_bf16(gs[1])])
            not_want = ref32.step(gs)
            for r in range(2):
                assert out[r] is not None, f"rank {r} step {step} failed"
                assert out[r].tobytes() == want.tobytes(), f"rank {r} step {step} differs from the reference"
            assert want.tobytes() != not_want.tobytes()
