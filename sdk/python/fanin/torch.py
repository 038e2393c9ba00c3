"""Train a PyTorch module through fanin with two added lines.

fanin runs the optimizer in the service: a worker's step is "publish gradients, load the new
parameters". Wrap the module once, and call ``step()`` where an optimizer's step would be::

    import fanin, fanin.torch

    model = Net()
    fm = fanin.torch.Module(model, client, "mnist", rank=rank)     # 1: attach (loads the job's parameters)
    for x, y in batches:
        fm.zero_grad()
        loss_fn(model(x), y).backward()
        fm.step()                                                   # 2: publish .grad, load new params in place

The module's trainable ``named_parameters()`` are the job's tensors, in order, with their shapes
(``spec`` writes a job spec from a module). The wrapper moves every parameter and its gradient into
one flat float32 buffer each and makes the parameters and ``.grad`` views of it, so a step copies
nothing in Python: the library publishes the gradient where backward accumulated it and writes the
new parameters straight into the module's weights.

- Gradients stay in place as long as ``.grad`` is zeroed in place: use ``fm.zero_grad()`` (or
  ``model.zero_grad(set_to_none=False)``). A ``.grad`` that is None or was replaced is copied into
  the buffer at ``step`` (counted in ``bytes_copied``).
- Several logical ranks in one process: ``Module(model, client, job, ranks=[0, 1])``, then per rank
  ``with fm.rank(r): loss(...).backward()`` (each rank's backward accumulates into that rank's own
  gradient buffer), then one ``fm.step()`` that publishes every rank at once.
- A job with ``param_dtype="bf16"`` (``spec(model, ..., param_dtype="bf16")``) loads, after step 0,
  its parameters rounded to bfloat16 into the module's float32 weights: exactly
  ``w.to(torch.bfloat16).float()`` of fanin's float32 parameters, whose optimizer state stays
  float32. Half the bytes on the wire; the module itself stays float32.
- CUDA tensors: fanin's buffers live in host memory. Each step copies every gradient from the
  device into the reused host buffer, and the new parameters back to the device (two copies the
  hardware forces, counted in ``bytes_copied``); the host buffers are pinned when CUDA is
  available, so the copies run at full PCIe speed.
"""

from __future__ import annotations

import contextlib
from typing import Any, Iterator, Optional, Sequence

import numpy as np
import torch

import fanin

__all__ = ["Module", "Elastic", "spec", "decode_params"]


def _trainable(module: torch.nn.Module) -> list[tuple[str, torch.nn.Parameter]]:
    return [(n, p) for n, p in module.named_parameters() if p.requires_grad]


def spec(
    module: torch.nn.Module,
    id: str,
    ranks: int,
    function: str = "adam",
    hyper: Optional[dict[str, float]] = None,
    init: str = "upload",
    **extra: Any,
) -> dict[str, Any]:
    """A job spec for ``module``: its trainable parameters as tensors, in order. ``init="upload"``
    (the default) starts the job from the module's own weights (``Module`` uploads them); other
    kinds ("zeros", "uniform", "normal") let fanin draw them. ``extra`` adds spec fields
    (shard_size, storage, replicas, ...). ``shard_size`` is in bytes of float32 (an int, or a
    string such as "256KiB"): 4 KiB to 8 MiB and a multiple of 4, default 1 MiB; the gateway
    refuses others (``invalid_spec``), and sizes giving more than 1,048,576 shards (4,096 with
    ``init="upload"``: pick larger shards for a large module)."""
    tensors = [{"name": n, "shape": list(p.shape)} for n, p in _trainable(module)]
    if not tensors:
        raise ValueError("the module has no trainable parameters")
    s: dict[str, Any] = {
        "id": id,
        "ranks": ranks,
        "tensors": tensors,
        "function": {"name": function, "hyper": dict(hyper or {})},
        "init": {"kind": init},
    }
    s.update(extra)
    return s


def _check_layout(job: fanin.Job, params: list[tuple[str, torch.nn.Parameter]]) -> None:
    """Checks that a module's trainable parameters are the job's tensors: names, order, shapes,
    float32, one device."""
    names = [n for n, _ in params]
    want = [t.name for t in job.tensors]
    if names != want:
        raise ValueError(f"the module's trainable parameters {names} are not job {job.id!r}'s tensors {want}")
    for t, (n, p) in zip(job.tensors, params):
        if tuple(p.shape) != t.shape:
            raise ValueError(f"parameter {n!r} has shape {tuple(p.shape)}, the job's tensor has {t.shape}")
        if p.dtype != torch.float32:
            raise ValueError(f"parameter {n!r} is {p.dtype}; fanin aggregates float32 (module.float())")
        if p.device != params[0][1].device:
            raise ValueError(f"parameter {n!r} is on {p.device}, not with the others on {params[0][1].device}")


class Module:
    """A ``torch.nn.Module`` attached to a fanin job as one or several logical ranks.

    ``client`` is the connection of every rank, or one connection per rank (for large models,
    several connections carry more than one). On creation it checks that the module's trainable parameters are the job's tensors (names,
    order, shapes), uploads the module's weights if the job starts from an upload (from the
    process holding rank 0), and loads the job's current parameters into the module: a worker that
    joins late or restarts continues where the job is.
    """

    def __init__(
        self,
        module: torch.nn.Module,
        client: "fanin.Client | Sequence[fanin.Client]",
        job_id: str,
        rank: Optional[int] = None,
        ranks: Optional[Sequence[int]] = None,
        weight: Optional[float] = None,
        timeout: Optional[float] = fanin.DEFAULT_TIMEOUT,
    ) -> None:
        if (rank is None) == (ranks is None):
            raise ValueError("give rank or ranks, one of them")
        self.module = module
        self.ranks: list[int] = [rank] if rank is not None else list(ranks or [])
        if not self.ranks:
            raise ValueError("ranks is empty")
        if len(set(self.ranks)) != len(self.ranks):
            raise ValueError(f"ranks repeat: {self.ranks}")
        self.timeout = timeout
        clients = [client] * len(self.ranks) if isinstance(client, fanin.Client) else list(client)
        if len(clients) != len(self.ranks):
            raise ValueError(f"{len(clients)} clients for {len(self.ranks)} ranks")
        client = clients[0]
        self.job = client.job(job_id)
        self._params = _trainable(module)
        self._check_layout()
        first = self._params[0][1]
        self.device = first.device
        self._cuda = self.device.type != "cpu"
        self.bytes_copied = 0  #: bytes Python copied: replaced .grad tensors, device <-> host

        n = self.job.elements
        pin = self._cuda and torch.cuda.is_available()
        # The flat buffers: rank i's gradient in self._grads[i]; the parameters in self._flat
        # (the module's own weights on CPU; the host side of them on CUDA).
        self._flat = torch.empty(n, dtype=torch.float32, pin_memory=pin)
        self._grads = [torch.zeros(n, dtype=torch.float32, pin_memory=pin) for _ in self.ranks]
        with torch.no_grad():
            for t, (_, p) in zip(self.job.tensors, self._params):
                self._flat[t.offset : t.offset + t.size].copy_(p.detach().reshape(-1))
        if not self._cuda:
            for t, (_, p) in zip(self.job.tensors, self._params):
                p.data = self._flat[t.offset : t.offset + t.size].view(t.shape)
        self._current = 0  # the rank whose gradient buffer .grad points into
        self._point_grads(0)

        if self.job.spec.get("init", {}).get("kind") == "upload" and 0 in self.ranks:
            try:
                client.upload(job_id, self._flat.numpy())
            except fanin.AlreadyUploadedError:
                pass  # stored already (a restarted worker): load() takes the stored ones
        # Rank 0 of this process writes the module's weights; the other ranks' copies of the same
        # parameters land in buffers of their own.
        bufs = [self._flat.numpy()] + [np.empty(n, dtype=np.float32) for _ in self.ranks[1:]]
        workers = []
        try:
            for r, buf, c in zip(self.ranks, bufs, clients):
                workers.append(c.worker(job_id, r, weight=weight, params=buf))
        except BaseException:
            for w in workers:
                w.close()
            raise
        self._workers = fanin.Ranks(workers)
        self.load()

    def _check_layout(self) -> None:
        _check_layout(self.job, self._params)

    @property
    def step_count(self) -> int:
        """The step of the module's parameters (0: initial)."""
        return self._workers.workers[0].step_count

    def _point_grads(self, i: int) -> None:
        """Makes every parameter's .grad a view of rank i's gradient buffer (on CPU)."""
        self._current = i
        if self._cuda:
            return
        g = self._grads[i]
        for t, (_, p) in zip(self.job.tensors, self._params):
            p.grad = g[t.offset : t.offset + t.size].view(t.shape)

    def _gather(self, i: int) -> None:
        """Brings the gradient of the last backward into rank i's buffer where it is not there
        already (a .grad set to None or replaced; CUDA)."""
        g = self._grads[i]
        for t, (_, p) in zip(self.job.tensors, self._params):
            view = g[t.offset : t.offset + t.size]
            if p.grad is None:
                view.zero_()
            elif self._cuda or p.grad.data_ptr() != view.data_ptr():
                view.copy_(p.grad.detach().reshape(-1))
                self.bytes_copied += 4 * t.size

    def zero_grad(self) -> None:
        """Zeroes the gradients in place (one memset per rank), keeping them in fanin's buffer."""
        for g in self._grads:
            g.zero_()
        if self._cuda:
            self.module.zero_grad(set_to_none=False)
        else:
            self._point_grads(self._current)

    @contextlib.contextmanager
    def rank(self, r: int) -> Iterator[None]:
        """Within the block, backward accumulates into rank r's gradient, zeroed on entry."""
        i = self.ranks.index(r)
        self._grads[i].zero_()
        if self._cuda:
            self.module.zero_grad(set_to_none=False)
        self._point_grads(i)
        yield
        self._gather(i)

    def step(self) -> int:
        """Publishes every rank's gradient and loads the parameters after the step into the module,
        in place. Returns the new step. With one rank, the gradient is what backward left in
        .grad; with several, what each ``rank(r)`` block left. If it raises, the gradients are
        untouched and the step may be retried (nothing is applied twice)."""
        if len(self.ranks) == 1:
            self._gather(0)
        grads = [g.numpy() for g in self._grads]
        if len(grads) == 1:
            self._workers.workers[0].step(grads[0], self.timeout)
        else:
            self._workers.step(grads, self.timeout)
        self._to_device()
        return self.step_count

    def load(self) -> int:
        """Loads the job's current parameters into the module (as a late worker does); returns
        their step."""
        self._workers.fetch(self.timeout)
        self._to_device()
        return self.step_count

    def _to_device(self) -> None:
        if not self._cuda:
            return
        with torch.no_grad():
            for t, (_, p) in zip(self.job.tensors, self._params):
                p.copy_(self._flat[t.offset : t.offset + t.size].view(t.shape), non_blocking=False)
                self.bytes_copied += 4 * t.size

    def close(self) -> None:
        """Leaves the job; the module keeps its parameters."""
        self._workers.close()

    def __enter__(self) -> "Module":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"fanin.torch.Module(job={self.job.id!r}, ranks={self.ranks}, step={self.step_count})"


class Elastic:
    """A ``torch.nn.Module`` trained by an elastic worker (``fanin.Elastic``): fanin assigns the
    logical ranks this process computes, and they change as workers join, leave or die.

    ``step(loss_fn)`` calls ``loss_fn(rank, step)`` for every rank the worker holds (and for
    ranks it gains while it waits), with the module's weights at the parameters that rank's
    gradient is computed from; ``loss_fn`` returns the loss of the rank's batch ``step``, and the
    wrapper runs backward and publishes the gradient. The batch must depend on nothing but the
    rank and the step (the rank's data partition, batch number ``step``: a generator seeded with
    both, say): then whichever worker computes a rank, the bytes are the same, and the job ends
    bit-identical to the same job on fixed ranks. After ``step`` the module holds the parameters
    after the step. ``losses`` maps each rank computed in the last step to its loss.

    Like ``Module``, the module's weights and ``.grad`` become views of flat buffers that the
    library reads and writes (the weights are the buffer the library writes a gradient's
    parameters into); a ``.grad`` that ``loss_fn`` replaced or set to None is copied, and counted
    in ``bytes_copied``. With ``init="upload"`` (``spec``'s default) every worker offers its
    module's weights, and the first upload is the job's: build the module with a fixed seed.
    CPU modules only."""

    def __init__(
        self,
        module: torch.nn.Module,
        client: fanin.Client,
        job_id: str,
        worker_id: Optional[str] = None,
        on_assign: Any = None,
        timeout: Optional[float] = fanin.DEFAULT_TIMEOUT,
    ) -> None:
        self.module = module
        self.timeout = timeout
        self.job = client.job(job_id)
        self._params = _trainable(module)
        _check_layout(self.job, self._params)
        if self._params[0][1].device.type != "cpu":
            raise ValueError(f"fanin.torch.Elastic trains CPU modules; this one is on {self._params[0][1].device}")
        self.bytes_copied = 0  #: bytes Python copied (replaced or None .grad tensors)
        self.losses: dict[int, float] = {}  #: rank -> loss, for the ranks computed in the last step
        n = self.job.elements
        weights = np.empty(n, dtype=np.float32)
        with torch.no_grad():
            for t, (_, p) in zip(self.job.tensors, self._params):
                weights[t.offset : t.offset + t.size] = p.detach().reshape(-1).numpy()
        if self.job.spec.get("init", {}).get("kind") == "upload":
            try:
                client.upload(job_id, weights)
            except fanin.AlreadyUploadedError:
                pass  # another worker's (the same weights, with the same seed) came first
        self.elastic = client.elastic(job_id, worker_id=worker_id, on_assign=on_assign, timeout=timeout)
        # The module's weights are the elastic worker's buffer of the parameters a gradient is
        # computed from: the library writes them there before it asks for a rank's gradient.
        self._flat = torch.from_numpy(self.elastic._prev)
        self._flat.copy_(torch.from_numpy(weights))
        for t, (_, p) in zip(self.job.tensors, self._params):
            p.data = self._flat[t.offset : t.offset + t.size].view(t.shape)
        self._grad = torch.zeros(n, dtype=torch.float32)
        self._point_grads()

    def _point_grads(self) -> None:
        for t, (_, p) in zip(self.job.tensors, self._params):
            p.grad = self._grad[t.offset : t.offset + t.size].view(t.shape)

    def _gradient(self, loss_fn: Any, rank: int, step: int) -> np.ndarray:
        self._grad.zero_()
        self._point_grads()
        loss = loss_fn(rank, step)
        loss.backward()
        for t, (_, p) in zip(self.job.tensors, self._params):
            view = self._grad[t.offset : t.offset + t.size]
            if p.grad is None:
                view.zero_()
            elif p.grad.data_ptr() != view.data_ptr():
                view.copy_(p.grad.detach().reshape(-1))
                self.bytes_copied += 4 * t.size
        self.losses[rank] = float(loss.detach())
        return self._grad.numpy()

    def step(self, loss_fn: Any) -> int:
        """Runs the next step (see the class) and returns its step. If ``loss_fn`` raises, the
        step is abandoned and the exception raised; the step may be run again."""
        self.losses = {}
        self.elastic.step(lambda rank, step, _params: self._gradient(loss_fn, rank, step), self.timeout)
        with torch.no_grad():
            self._flat.copy_(torch.from_numpy(self.elastic.params))
        return self.step_count

    @property
    def step_count(self) -> int:
        """The step of the module's parameters (0: initial; -1 before the first step)."""
        return self.elastic.step_count

    @property
    def ranks(self) -> list[int]:
        """The logical ranks this worker holds now."""
        return self.elastic.ranks

    def leave(self, timeout: Optional[float] = 10.0) -> None:
        """Leaves the job gracefully (its ranks move to the others at once); the module keeps
        its parameters."""
        self.elastic.leave(timeout)

    def close(self) -> None:
        self.elastic.close()

    def __enter__(self) -> "Elastic":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"fanin.torch.Elastic(job={self.job.id!r}, id={self.elastic.id!r}, step={self.step_count})"


def decode_params(data: Any, dtype: Optional[str] = "f32") -> torch.Tensor:
    """``fanin.decode_params`` as a float32 CPU tensor (sharing the decoded array's memory): the
    payload of a parameters message decoded by its ``Fanin-Dtype`` (f32, bf16, f16)."""
    return torch.from_numpy(fanin.decode_params(data, dtype))
