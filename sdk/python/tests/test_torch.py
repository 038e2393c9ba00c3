"""fanin.torch against a real `fanin dev`: a module's parameters after every step are fanin's
reference computed from the gradients it published, with one rank or several per process, with
init from the module's own weights, and with .grad in place (no copy) or replaced (copied)."""

from __future__ import annotations

import numpy as np
import pytest

torch = pytest.importorskip("torch")

import fanin  # noqa: E402
import fanin.torch  # noqa: E402


def mlp(seed: int = 0) -> "torch.nn.Module":
    torch.manual_seed(seed)
    return torch.nn.Sequential(torch.nn.Linear(8, 256), torch.nn.Tanh(), torch.nn.Linear(256, 3))


def flat(model) -> np.ndarray:
    return np.concatenate([p.detach().numpy().reshape(-1) for p in model.parameters()]).astype(np.float32)


def batch(seed: int):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(16, 8, generator=g)
    return x, (x[:, 0] > 0).long() + (x[:, 1] > 0).long()


def test_module_one_rank_bit_identical_in_place(dev):
    model = mlp()
    created = dev.create(fanin.torch.spec(model, id="torch1", ranks=1, function="adam", hyper={"lr": 0.01}, shard_size=4096))
    job_id = created["spec"]["id"]
    init = flat(model)
    with fanin.connect(dev.nats, created["credentials"]) as c:
        fm = fanin.torch.Module(model, c, job_id, rank=0)
        assert flat(model).tobytes() == init.tobytes()  # init upload: the module's own weights
        ref = fanin.Reference(fm.job, init)
        loss_fn = torch.nn.CrossEntropyLoss()
        first_ptr = next(model.parameters()).data_ptr()
        for step in range(1, 6):
            fm.zero_grad()
            x, y = batch(step)
            loss_fn(model(x), y).backward()
            g = np.concatenate([p.grad.numpy().reshape(-1) for p in model.parameters()])
            assert fm.step() == step
            assert flat(model).tobytes() == ref.step([g]).tobytes(), f"step {step} differs"
        assert fm.bytes_copied == 0  # gradients and parameters stayed in fanin's buffers
        assert next(model.parameters()).data_ptr() == first_ptr  # loaded in place

        # .grad set to None (torch 2's default zero_grad) is copied into the buffer, and counted.
        model.zero_grad(set_to_none=True)
        x, y = batch(99)
        loss_fn(model(x), y).backward()
        g = np.concatenate([p.grad.numpy().reshape(-1) for p in model.parameters()])
        fm.step()
        assert flat(model).tobytes() == ref.step([g]).tobytes()
        assert fm.bytes_copied == 4 * fm.job.elements
        fm.close()


def test_module_several_ranks_and_a_late_process(dev):
    model = mlp(1)
    created = dev.create(fanin.torch.spec(model, id="torch3", ranks=3, function="momentum", hyper={"lr": 0.05}))
    job_id = created["spec"]["id"]
    init = flat(model)
    loss_fn = torch.nn.MSELoss()
    with fanin.connect(dev.nats, created["credentials"]) as c:
        with fanin.torch.Module(model, c, job_id, ranks=[0, 1, 2]) as fm:
            ref = fanin.Reference(fm.job, init)
            for step in range(1, 4):
                gs = []
                for r in fm.ranks:
                    with fm.rank(r):
                        x, y = batch(10 * step + r)
                        loss_fn(model(x), torch.nn.functional.one_hot(y, 3).float()).backward()
                    gs.append(np.concatenate([p.grad.numpy().reshape(-1) for p in model.parameters()]))
                fm.step()
                assert flat(model).tobytes() == ref.step(gs).tobytes(), f"step {step} differs"
            assert fm.bytes_copied == 0

    # A restarted process with a freshly made (differently seeded) module joins and loads step 3.
    with fanin.connect(dev.nats, created["credentials"]) as c:
        late = mlp(42)
        fm = fanin.torch.Module(late, c, job_id, ranks=[0, 1, 2])
        assert fm.step_count == 3
        assert flat(late).tobytes() == ref.params.tobytes()
        fm.close()


def test_module_must_match_the_job(dev):
    model = mlp()
    created = dev.create(fanin.torch.spec(model, id="torchbad", ranks=1))
    other = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.Tanh(), torch.nn.Linear(16, 3))
    with fanin.connect(dev.nats, created["credentials"]) as c:
        with pytest.raises(ValueError, match="has shape"):
            fanin.torch.Module(other, c, created["spec"]["id"], rank=0)
        with pytest.raises(ValueError, match="float32"):
            fanin.torch.Module(mlp().double(), c, created["spec"]["id"], rank=0)


def test_elastic_module_two_workers_bit_identical(dev):
    """Two elastic workers of a 3-rank job in this process, each with its own copy of the module:
    the ranks are split between them, w1 leaves after it computed some of them in two steps, and w0
    computes every rank from then on. Each step's parameters are the reference's, whose gradients
    a third copy of the module recomputes from the reference's own parameters."""
    import threading

    model = mlp(3)
    created = dev.create(fanin.torch.spec(model, id="torchel", ranks=3, function="adam", hyper={"lr": 0.01}, shard_size=4096))
    job_id = created["spec"]["id"]
    init = flat(model)
    loss_fn = torch.nn.CrossEntropyLoss()

    def loss_of(net):
        def loss(rank: int, step: int):
            x, y = batch(1000 * rank + step)  # rank's batch number step: nothing else
            return loss_fn(net(x), y)

        return loss

    with fanin.connect(dev.nats, created["credentials"]) as c:
        nets = [mlp(3), mlp(3)]
        els = [fanin.torch.Elastic(net, c, job_id, worker_id=f"w{i}") for i, net in enumerate(nets)]
        job = els[0].job
        seen: list[list[tuple[int, list[int], np.ndarray]]] = [[], []]
        errs: list[BaseException] = []
        left = threading.Event()

        def run(i: int) -> None:
            try:
                while True:
                    els[i].step(loss_of(nets[i]))
                    seen[i].append((els[i].step_count, sorted(els[i].losses), flat(nets[i])))
                    if i == 1 and sum(1 for _, rs, _ in seen[1] if rs and len(rs) < 3) >= 2:
                        break  # w1 computed ranks beside w0 in two steps: it leaves
                    if i == 0 and left.is_set() and els[0].step_count >= seen[1][-1][0] + 4:
                        break
                    assert els[i].step_count < 200, f"w{i}: still at it after 200 steps"
                els[i].leave()
                if i == 1:
                    left.set()
            except BaseException as e:  # reported below
                errs.append(e)
                left.set()

        ts = [threading.Thread(target=run, args=(i,)) for i in range(2)]
        for t in ts:
            t.start()
        for t in ts:
            t.join()
        assert not errs, errs

    last = seen[0][-1][0]
    ref = fanin.Reference(job, init)
    check = mlp(3)
    want = {}
    for step in range(1, last + 1):
        gs = []
        for r in range(3):
            with torch.no_grad():
                for t, p in zip(job.tensors, check.parameters()):
                    p.copy_(torch.from_numpy(ref.params[t.offset : t.offset + t.size]).view(t.shape))
            check.zero_grad()
            loss_of(check)(r, step).backward()
            gs.append(flat_grad(check))
        want[step] = ref.step(gs).copy()
    for i in range(2):
        for step, _, params in seen[i]:
            assert params.tobytes() == want[step].tobytes(), f"worker w{i}: step {step} differs from the reference"
    assert seen[0][-1][1] == [0, 1, 2], "w0 did not compute every rank once alone"
    assert any(rs and len(rs) < 3 for _, rs, _ in seen[1]), "w1 never held ranks"
    assert els[0].bytes_copied == 0


def flat_grad(model) -> np.ndarray:
    return np.concatenate([p.grad.numpy().reshape(-1) for p in model.parameters()]).astype(np.float32)
