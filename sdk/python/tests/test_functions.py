"""User functions from Python: upload a WebAssembly module through the gateway, train a job
through it, and get the built-in function's bits (the module is SGD with the built-in arithmetic)."""

from __future__ import annotations

import os
import subprocess
import threading
import uuid

import numpy as np
import pytest

import fanin
from conftest import CACHE, ROOT


def build_module(pkg: str) -> bytes:
    """A test module of functions/wasmfn/testdata, built with the standard Go toolchain."""
    out = CACHE / (pkg + ".wasm")
    out.parent.mkdir(parents=True, exist_ok=True)
    subprocess.run(
        ["go", "build", "-buildmode=c-shared", "-o", str(out), "./functions/wasmfn/testdata/" + pkg],
        cwd=ROOT, check=True, env={**os.environ, "GOOS": "wasip1", "GOARCH": "wasm"},
    )
    return out.read_bytes()


def refs(gw) -> list[str]:
    """The user functions the gateway lists, as job specs name them."""
    return [f"{m['owner']}/{m['name']}@{m['version']}" for m in gw.functions()["modules"]]


def spec(function: str) -> dict:
    return {
        "id": "fn",
        "ranks": 2,
        "tensors": [{"name": "w", "shape": [3000]}],
        "function": {"name": function, "hyper": {"lr": 0.05}},
        "init": {"kind": "uniform", "seed": 3, "scale": 0.5},
        "shard_size": 4096,  # several shards
    }


def train(dev, created: dict, grads: list[list[np.ndarray]]) -> list[np.ndarray]:
    """Steps the job's two ranks, each in its own thread, and returns the parameters after each step."""
    out = []
    with fanin.connect(dev.nats, created["credentials"]) as c:
        ws = [c.worker(created["spec"]["id"], r) for r in range(2)]
        for step in grads:
            res: list = [None, None]
            errs: list = []

            def run(r: int) -> None:
                try:
                    res[r] = ws[r].step(step[r], timeout=60).copy()
                except Exception as e:  # reported below
                    errs.append(e)

            ts = [threading.Thread(target=run, args=(r,)) for r in range(2)]
            for t in ts:
                t.start()
            for t in ts:
                t.join()
            assert not errs, errs
            assert np.array_equal(res[0], res[1])
            out.append(res[0])
    return out


def test_a_user_function_trains_like_the_builtin(dev):
    sgd_module, other = build_module("sgd"), build_module("sgdloop")
    gw = dev.gateway()
    name = "sgd" + uuid.uuid4().hex[:6]
    rec = gw.push_function(name, "1", sgd_module)
    ref = rec["function"]
    assert ref.endswith("/" + name + "@1")
    assert gw.push_function(name, "1", sgd_module)["function"] == ref  # the same bytes again: accepted
    with pytest.raises(fanin.GatewayError) as e:
        gw.push_function(name, "1", other)  # other bytes under a stored name and version
    assert e.value.code == "function_exists"
    with pytest.raises(fanin.GatewayError) as e:
        gw.push_function("notwasm", "1", b"#!/bin/sh\n")
    assert e.value.code == "bad_module" and e.value.status == 400
    assert ref in refs(gw)

    rng = np.random.default_rng(5)
    grads = [[rng.standard_normal(3000).astype(np.float32) for _ in range(2)] for _ in range(6)]
    user = dev.create(spec(ref))
    builtin = dev.create(spec("sgd"))
    got = train(dev, user, grads)
    want = train(dev, builtin, grads)
    for step, (g, w) in enumerate(zip(got, want), 1):
        assert g.tobytes() == w.tobytes(), f"step {step}: the user function's parameters differ from the built-in's"

    with pytest.raises(fanin.GatewayError) as e:
        gw.delete_function(ref)
    assert e.value.code == "function_in_use"
    gw.delete_job(user["spec"]["id"])
    gw.delete_job(builtin["spec"]["id"])
    gw.delete_function(ref)
    assert ref not in refs(gw)
