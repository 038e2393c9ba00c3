"""Direct gradients from Python against a real `fanin dev`: a bsp job with ``gradients: direct``
(no gradient stream: each gradient goes to the runtime as a core NATS request, and the worker keeps
it until the next step's parameters are in, docs/PROTOCOL.md "Direct gradients") trains through the
same Go worker as a stored job, and ends bit-identical to the reference, in float32 and with bf16
gradients (the reference then takes the gradients rounded as the worker sends them)."""

from __future__ import annotations

import numpy as np
import pytest

import fanin
from elastic_worker import gradient
from test_params_dtype import bf16_round


def direct_spec(ranks: int) -> dict:
    return {
        "id": "direct",
        "ranks": ranks,
        "tensors": [{"name": "w", "shape": [1000, 3]}, {"name": "b", "shape": [7]}],
        "function": {"name": "adam", "hyper": {"lr": 0.01}},
        "init": {"kind": "uniform", "seed": 5, "scale": 0.5},
        "shard_size": 4096,  # 4 shards: 3 of w, and b
        "gradients": "direct",
    }


@pytest.mark.parametrize("grad_dtype", ["f32", "bf16"])
def test_direct_job_matches_the_reference(dev, grad_dtype):
    ranks, steps = 3, 15
    created = dev.create(direct_spec(ranks))
    assert created["spec"].get("gradients") == "direct", created["spec"]
    job_id = created["spec"]["id"]
    with fanin.connect(dev.nats, created["credentials"]) as c:
        job = c.job(job_id)
        with c.ranks(job_id, range(ranks), grad_dtype=grad_dtype) as rs:
            params = rs.fetch(timeout=30)
            init = params[0].copy()
            ref = fanin.Reference(job, init)
            for t in range(1, steps + 1):
                grads = [gradient(r, t, params[r]) for r in range(ranks)]
                params = rs.step(grads, timeout=60)
                sent = grads if grad_dtype == "f32" else [bf16_round(g) for g in grads]
                want = ref.step(sent)
                for r in range(ranks):
                    assert params[r].tobytes() == want.tobytes(), f"rank {r} differs from the reference at step {t}"
    assert not np.array_equal(want, init), "the parameters never moved"
