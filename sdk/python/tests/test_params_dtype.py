"""Parameters in the dtype of their message (Fanin-Dtype): numpy and torch workers against a fake
runtime (tests/fakeruntime: an embedded NATS server with one job, publishing the parameters this
test gives it, encoded in the dtype it names, or malformed), and a param_dtype bf16 job on a real
`fanin dev`."""

from __future__ import annotations

import json
import shutil
import subprocess
import tempfile
import threading
from pathlib import Path

import numpy as np
import pytest

import fanin

from conftest import CACHE, _go_build

N = 3000


def bf16_round(v: np.ndarray) -> np.ndarray:
    """v rounded to bfloat16 (to nearest, ties to even) and back to float32, in numpy alone."""
    u = v.astype(np.float32).view(np.uint32).astype(np.uint64)
    h = ((u + 0x7FFF + ((u >> 16) & 1)) >> 16).astype(np.uint16)
    return (h.astype(np.uint32) << 16).view(np.float32)


def rounded(v: np.ndarray, dtype: str) -> np.ndarray:
    if dtype == "bf16":
        return bf16_round(v)
    if dtype == "f16":
        return v.astype(np.float16).astype(np.float32)
    return v.astype(np.float32)


def same(a: np.ndarray, b: np.ndarray) -> bool:
    return a.astype(np.float32).tobytes() == b.astype(np.float32).tobytes()


class Fake:
    """The fake runtime: its NATS URL, and ``serve`` to publish the parameters after a step once
    the gradients of that step are in."""

    def __init__(self, binary: Path, spec: dict) -> None:
        self.spec = spec
        self.dir = Path(tempfile.mkdtemp(prefix="fanin-fake-"))
        self.proc = subprocess.Popen(
            [str(binary), json.dumps(spec)], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
        )
        self.url = self.proc.stdout.readline().strip()
        if not self.url.startswith("nats://"):
            self.proc.kill()
            raise RuntimeError(f"fakeruntime did not start: {self.url!r}")

    def serve(self, step: int, dtype: str, params: np.ndarray, bad: tuple = ()) -> None:
        path = self.dir / f"p{step}.bin"
        path.write_bytes(params.astype("<f4").tobytes())
        line = " ".join(["serve", str(step), dtype, str(path), *map(str, bad)])
        self.proc.stdin.write(line + "\n")
        self.proc.stdin.flush()
        answer = self.proc.stdout.readline().strip()
        assert answer == "ok", answer

    def close(self) -> None:
        self.proc.stdin.close()
        try:
            self.proc.wait(20)
        except subprocess.TimeoutExpired:
            self.proc.kill()
        shutil.rmtree(self.dir, ignore_errors=True)


@pytest.fixture(scope="module")
def fakeruntime() -> Path:
    binary = CACHE / "fakeruntime"
    _go_build(binary, "./sdk/python/tests/fakeruntime")
    return binary


@pytest.fixture
def fake(fakeruntime, request):
    spec = {
        "id": "pyfake",
        "ranks": 1,
        "tensors": [{"name": "w", "shape": [N // 3, 3]}],
        "function": {"name": "sum"},
        "init": {"kind": "uniform", "seed": 3, "scale": 0.5},
        "shard_size": 4096,  # 3 shards of 1000
        "param_dtype": "bf16",
        **getattr(request, "param", {}),
    }
    f = Fake(fakeruntime, spec)
    yield f
    f.close()


def step_while_serving(step_fn, fake: Fake, step: int, dtype: str, params: np.ndarray, bad: tuple = ()):
    """Runs step_fn in a thread while the fake runtime serves the parameters after step; returns
    its result or raises its exception."""
    out: list = []

    def run() -> None:
        try:
            out.append(step_fn())
        except Exception as e:  # raised below
            out.append(e)

    t = threading.Thread(target=run)
    t.start()
    fake.serve(step, dtype, params, bad)
    t.join(120)
    assert out, "the step did not return"
    if isinstance(out[0], Exception):
        raise out[0]
    return out[0]


def next_params(rng: np.random.Generator, p: np.ndarray) -> np.ndarray:
    # Values no 16-bit format holds exactly, so that a missing or wrong decode shows.
    return (p + rng.standard_normal(p.size).astype(np.float32) * np.float32(0.37) + np.float32(1e-3)).astype(np.float32)


def test_numpy_worker_takes_each_dtype_exactly(fake):
    rng = np.random.default_rng(5)
    with fanin.connect(fake.url) as c:
        job = c.job("pyfake")
        w = c.worker(job.id, 0)
        p = w.fetch().copy()  # step 0: f32
        assert w.step_count == 0
        grads = np.zeros(job.elements, dtype=np.float32)
        for step, dtype in enumerate(["bf16", "f16", "f32", "bf16"], start=1):
            want = next_params(rng, p)
            got = step_while_serving(lambda: w.step(grads, timeout=60), fake, step, dtype, want)
            assert got is w.params and w.step_count == step
            assert same(got, rounded(want, dtype)), f"step {step}: not exactly the {dtype} parameters"
            if dtype != "f32":
                assert not same(got, want)  # the values were rounded: the test checks a decode
            p = got.copy()
        # A worker that joins now reads the same from the stream.
        late = c.worker(job.id, 0)
        assert same(late.fetch(), p) and late.step_count == 4


@pytest.mark.parametrize(
    "header,nbytes,says",
    [
        ("f8", lambda n: 4 * n, 'Fanin-Dtype "f8"'),
        ("bf16", lambda n: 4 * n, "bytes, want"),  # f32's length
        ("bf16", lambda n: 2 * n - 2, "bytes, want"),  # one element short
        ("f32", lambda n: 4 * n + 1, "bytes, want"),
    ],
    ids=["unknown-dtype", "bf16-of-f32-length", "bf16-short", "f32-odd"],
)
def test_numpy_worker_refuses_unreadable_params(fake, header, nbytes, says):
    rng = np.random.default_rng(6)
    with fanin.connect(fake.url) as c:
        job = c.job("pyfake")
        shard1 = job.shards[1]
        assert len(job.shards) == 3
        w = c.worker(job.id, 0)
        p0 = w.fetch().copy()
        want = next_params(rng, p0)
        grads = np.zeros(job.elements, dtype=np.float32)
        with pytest.raises(fanin.FaninError) as e:
            step_while_serving(lambda: w.step(grads, timeout=60), fake, 1, "bf16", want, (1, header, nbytes(shard1["len"])))
        assert "shard 1" in str(e.value) and says in str(e.value), str(e.value)
        off, n = shard1["off"], shard1["len"]
        assert same(w.params[off : off + n], p0[off : off + n])  # never taken
        with pytest.raises(fanin.FaninError) as e:
            w.fetch(timeout=30)
        assert says in str(e.value)


def test_torch_module_takes_bf16_params(fake):
    torch = pytest.importorskip("torch")
    import fanin.torch as ftorch

    rng = np.random.default_rng(7)
    model = torch.nn.Module()
    model.w = torch.nn.Parameter(torch.zeros(N // 3, 3))
    with fanin.connect(fake.url) as c:
        fm = ftorch.Module(model, c, "pyfake", rank=0)
        p = model.w.detach().numpy().reshape(-1).copy()  # step 0, f32
        for step in (1, 2):
            want = next_params(rng, p)
            fm.zero_grad()
            assert step_while_serving(fm.step, fake, step, "bf16", want) == step
            got = model.w.detach().numpy().reshape(-1)
            assert same(got, rounded(want, "bf16"))
            # what torch's own bfloat16 gives
            assert same(got, torch.from_numpy(want).to(torch.bfloat16).to(torch.float32).numpy())
            p = got.copy()


def test_decode_params():
    v = np.array([1.0, -2.5, 3.14159, 65504.0, 1e-8, -0.0], dtype=np.float32)
    assert same(fanin.decode_params(v.tobytes()), v)
    assert same(fanin.decode_params(v.tobytes(), None), v)
    h16 = v.astype(np.float16)
    assert same(fanin.decode_params(h16.tobytes(), "f16"), h16.astype(np.float32))
    b = (v.view(np.uint32) >> 16).astype(np.uint16)  # truncated: exact bf16 values
    assert same(fanin.decode_params(b.tobytes(), "bf16"), (b.astype(np.uint32) << 16).view(np.float32))
    out = np.empty(6, dtype=np.float32)
    assert fanin.decode_params(b.tobytes(), "bf16", out=out) is out
    with pytest.raises(fanin.FaninError, match="Fanin-Dtype 'f8'"):
        fanin.decode_params(b.tobytes(), "f8")
    with pytest.raises(fanin.FaninError, match="11 bytes, want 10"):
        fanin.decode_params(b.tobytes()[:11], "bf16")
    with pytest.raises(fanin.FaninError, match="12 bytes, want 10"):
        fanin.decode_params(b.tobytes(), "bf16", out=np.empty(5, dtype=np.float32))
    torch = pytest.importorskip("torch")
    import fanin.torch as ftorch

    t = ftorch.decode_params(b.tobytes(), "bf16")
    assert t.dtype == torch.float32 and same(t.numpy(), (b.astype(np.uint32) << 16).view(np.float32))


def test_bf16_job_on_fanin_dev(dev):
    """A param_dtype bf16 job on fanin's runtimes: the workers receive f32 at step 0, then exactly
    fanin's reference rounded to bf16 (the reference keeps f32 master parameters)."""
    spec = {
        "id": "pybf16",
        "ranks": 2,
        "tensors": [{"name": "w", "shape": [N // 3, 3]}],
        "function": {"name": "adam", "hyper": {"lr": 0.01}},
        "init": {"kind": "uniform", "seed": 7, "scale": 0.5},
        "shard_size": 4096,
        "param_dtype": "bf16",
    }
    created = dev.create(spec)
    with fanin.connect(dev.nats, created["credentials"]) as c:
        job = c.job(created["spec"]["id"])
        ranks = c.ranks(job.id, [0, 1])
        init = ranks.fetch()[0].copy()
        ref = fanin.Reference(job, init)
        rng = np.random.default_rng(8)
        params = init
        for step in range(1, 5):
            gs = [(params * np.float32(0.5) + rng.standard_normal(job.elements).astype(np.float32) * np.float32(0.01)).astype(np.float32) for _ in range(2)]
            out = ranks.step(gs, timeout=60)
            want = bf16_round(ref.step(gs))
            for r in range(2):
                assert same(out[r], want), f"step {step}: rank {r} is not the reference rounded to bf16"
            assert not same(want, ref.params)
            params = out[0].copy()
        ranks.close()
        ref.close()
