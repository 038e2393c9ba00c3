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
