"""fanin: train through fanin's shared aggregation service from Python.

A worker publishes its gradients and receives the parameters after the step: the optimizer runs in
fanin. The package is a thin layer over the Go SDK, built as a C library (libfanin) and loaded with
ctypes, so the protocol has one implementation::

    import fanin, numpy as np

    gw = fanin.Gateway("http://127.0.0.1:8080", token=admin_or_team_token)
    created = gw.create_job({"id": "mlp", "ranks": 1, "tensors": [{"name": "w", "shape": [1000]}],
                             "function": {"name": "adam", "hyper": {"lr": 0.01}}})
    with fanin.connect("nats://127.0.0.1:4222", created["credentials"]) as client:
        w = client.worker("mlp", rank=0)
        params = w.fetch()                 # a numpy float32 vector, the worker's own buffer
        for step in range(100):
            grads = compute_gradients(params)
            params = w.step(grads)         # the same buffer, now at the next step

Parameters arrive as float32 whatever their dtype on the wire: a job with ``"param_dtype": "bf16"``
sends them, after step 0, rounded to bfloat16, and ``params`` holds exactly those values (Worker).

Gradients and parameters cross no copy in Python: the library reads the gradient where it lies
and writes the parameters straight from the network into the worker's buffer. ``bytes_copied``
counts what Python had to copy (a gradient that was not a contiguous float32 array).

See docs/PYTHON.md, and fanin.torch for PyTorch modules.
"""

from __future__ import annotations

import ctypes
import json
import math
import urllib.error
import urllib.parse
import urllib.request
import re
import uuid
from ctypes import POINTER, byref, c_double, c_float, c_int, c_int64, c_uint64, c_void_p
from dataclasses import dataclass
from typing import Any, Callable, Iterable, Mapping, Optional, Sequence, Union

import numpy as np

from . import _lib
from ._lib import lib

__all__ = [
    "FaninError",
    "RejectedError",
    "UnknownJobError",
    "StepTimeout",
    "AlreadyUploadedError",
    "GatewayError",
    "Gateway",
    "Client",
    "Job",
    "Worker",
    "Ranks",
    "Elastic",
    "AppliedOrder",
    "Reference",
    "connect",
    "decode_params",
    "recorded_versions",
]

_FLOATP = POINTER(c_float)

#: How long a call waits by default, in seconds. A blocked call holds the thread (Ctrl-C takes
#: effect when it returns), so nothing waits without limit unless asked to (timeout=None).
DEFAULT_TIMEOUT = 300.0


class FaninError(Exception):
    """An error of fanin or of its client library. ``kind`` is "rejected", "timeout",
    "unknown_job" or "error"."""

    def __init__(self, message: str, kind: str = "error") -> None:
        super().__init__(message)
        self.message = message
        self.kind = kind


class RejectedError(FaninError):
    """fanin refused an input: ``reason`` is the wire's reason code (docs/PROTOCOL.md), e.g.
    "bad_length", "non_finite", "rank_range"; ``shard``, ``rank`` and ``step`` say where, when
    known."""

    def __init__(
        self,
        message: str,
        reason: str,
        shard: Optional[int] = None,
        rank: Optional[int] = None,
        step: Optional[int] = None,
        kind: str = "rejected",
    ) -> None:
        super().__init__(message, kind)
        self.reason = reason
        self.shard = shard
        self.rank = rank
        self.step = step

    def __repr__(self) -> str:
        return f"{type(self).__name__}(reason={self.reason!r}, message={self.message!r})"


class UnknownJobError(RejectedError):
    """No job has this id (it was never created, or was deleted)."""


class AlreadyUploadedError(FaninError):
    """The job's initial parameters were uploaded already (they are written once)."""


class StepTimeout(FaninError, TimeoutError):
    """A call did not complete within its timeout. A step that timed out may be retried with the
    same gradients: nothing is applied twice."""


def _raise(doc: Mapping[str, Any]) -> None:
    kind, msg = doc.get("kind", "error"), doc.get("message", "")
    if kind == "timeout":
        raise StepTimeout(msg, kind)
    if kind == "uploaded":
        raise AlreadyUploadedError(msg, kind)
    if kind in ("rejected", "unknown_job"):
        cls = UnknownJobError if kind == "unknown_job" else RejectedError
        raise cls(msg, doc.get("reason", ""), doc.get("shard"), doc.get("rank"), doc.get("step"), kind)
    raise FaninError(msg, kind)


def _check(status: int, err: c_void_p) -> None:
    if status != 0:
        _raise(_lib.take_error(err))


def _ms(timeout: Optional[float]) -> int:
    if timeout is None:
        return 0
    if not timeout > 0:
        raise ValueError(f"timeout must be > 0 seconds or None, got {timeout!r}")
    return max(1, int(math.ceil(timeout * 1000)))


def _floats(a: np.ndarray) -> Any:
    return a.ctypes.data_as(_FLOATP)


@dataclass(frozen=True)
class Tensor:
    """One tensor of a job: its name, shape, and place in the flattened parameter vector."""

    name: str
    shape: tuple[int, ...]
    offset: int
    size: int


class Job:
    """A job's record: its spec (a dict, as submitted, with defaults filled in) and its layout."""

    def __init__(self, record: Mapping[str, Any]) -> None:
        self.record = dict(record)
        self.spec: dict[str, Any] = self.record["spec"]
        self.id: str = self.spec["id"]
        self.ranks: int = self.spec["ranks"]
        layout = self.record["layout"]
        self.elements: int = layout["elements"]
        self.shards: list[dict[str, Any]] = layout["shards"]
        tensors, off = [], 0
        for t in self.spec["tensors"]:
            shape = tuple(int(d) for d in t["shape"])
            size = int(np.prod(shape, dtype=np.int64)) if shape else 1
            tensors.append(Tensor(t["name"], shape, off, size))
            off += size
        self.tensors: list[Tensor] = tensors

    @property
    def function(self) -> str:
        return self.spec["function"]["name"]

    def __repr__(self) -> str:
        return f"Job({self.id!r}, ranks={self.ranks}, elements={self.elements}, function={self.function!r})"


def _as_grads(grads: Any, n: int, what: str) -> tuple[np.ndarray, int]:
    """The gradient as a contiguous float32 vector of n elements, and the bytes copied to make it
    one (0 when grads already is)."""
    a = np.asarray(grads)
    if a.size != n:
        raise RejectedError(f"{what}: {a.size} gradients, the job has {n} parameters", "bad_length")
    c = np.ascontiguousarray(a.reshape(-1), dtype=np.float32)
    copied = 0 if np.may_share_memory(c, a) else c.nbytes
    return c, copied


_ELEM_SIZE = {"f32": 4, "bf16": 2, "f16": 2}


def decode_params(data: Any, dtype: Optional[str] = "f32", out: Optional[np.ndarray] = None) -> np.ndarray:
    """Decodes the payload of a parameters message (docs/PROTOCOL.md) by its ``Fanin-Dtype``
    header: ``"f32"`` (or None: the header absent), ``"bf16"`` or ``"f16"``, little-endian, into a
    float32 vector (``out`` when given: its size must be the payload's elements). Both 16-bit
    formats are exact subsets of float32: bf16 ``h`` is the float32 whose bits are ``h << 16``, f16
    converts as numpy's ``float16 -> float32``. Workers need none of this (the library decodes what
    it receives); it is for reading a job's parameters stream with a NATS client of your own.
    Raises FaninError for a dtype it does not know or a payload that is not whole elements of it,
    or not ``out.size`` of them."""
    dtype = dtype or "f32"
    es = _ELEM_SIZE.get(dtype)
    if es is None:
        raise FaninError(f"parameters: Fanin-Dtype {dtype!r}, want 'f32', 'bf16' or 'f16'", "bad_dtype")
    b = np.frombuffer(memoryview(data).cast("B"), dtype=np.uint8)
    n = out.size if out is not None else b.size // es
    if b.size != n * es:
        raise FaninError(f"parameters: {b.size} bytes, want {n * es} ({n} {dtype} elements)", "bad_length")
    if out is None:
        out = np.empty(n, dtype=np.float32)
    elif out.dtype != np.float32 or out.ndim != 1 or not out.flags.c_contiguous or not out.flags.writeable:
        raise ValueError("out must be a writable, contiguous float32 vector")
    if dtype == "f32":
        out[:] = b.view("<f4")
    elif dtype == "bf16":
        out.view(np.uint32)[:] = b.view("<u2").astype(np.uint32) << 16
    else:
        out[:] = b.view("<f2")
    return out


class _Closing:
    """A context manager over ``close``, which also runs when the object is collected: the
    library's handle is never left open."""

    def close(self) -> None:
        raise NotImplementedError

    def __enter__(self):  # type: ignore[no-untyped-def]
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def __del__(self) -> None:
        try:
            self.close()
        except Exception:
            pass


class Worker(_Closing):
    """One logical rank of a job. ``params`` is the worker's parameter buffer (a float32 vector of
    every parameter, in layout order): ``fetch`` and ``step`` write the parameters into it and
    return it. A worker is used by one thread at a time (a second call at once is refused).

    Each parameters message is decoded by its ``Fanin-Dtype`` (as ``decode_params`` does): f32 as
    is, bf16 and f16 exactly. A job created with ``"param_dtype": "bf16"`` sends, after step 0, its
    float32 parameters rounded to bf16 (to nearest, ties to even; half the bytes): ``params`` then
    holds exactly those rounded values (``Reference``'s parameters rounded to bf16, as
    ``torch.Tensor.to(torch.bfloat16)`` rounds) while the optimizer keeps float32; at step 0 it
    holds the initial parameters in float32. A parameters message the worker cannot read (an
    unknown dtype, a payload that is not the shard in its dtype) is never taken: ``step`` and
    ``fetch`` raise FaninError naming the shard and what is wrong, and that shard of ``params``
    keeps its values."""

    def __init__(self, client: "Client", job: Job, rank: int, handle: int, params: np.ndarray) -> None:
        self._client = client
        self.job = job
        self.rank = rank
        self.params = params
        self._h = handle
        self.step_count = -1  #: the step of the parameters in ``params``; -1 before any
        self.bytes_copied = 0  #: bytes of gradients Python copied (not contiguous float32)

    def fetch(self, timeout: Optional[float] = DEFAULT_TIMEOUT) -> np.ndarray:
        """Reads the current parameters of every shard, all of one step, into ``params``: how a
        worker that joins late or restarts catches up. Waits for a job's initial parameters."""
        step, err = c_int64(), c_void_p()
        _check(lib.fanin_params(self._handle(), _ms(timeout), byref(step), byref(err)), err)
        self.step_count = step.value
        return self.params

    def step(self, grads: Any, timeout: Optional[float] = DEFAULT_TIMEOUT) -> np.ndarray:
        """Publishes this rank's gradient of the whole model (any array of ``job.elements``
        values; float32 and contiguous to avoid a copy) for the next step, and returns the
        parameters after it, in ``params``. Raises RejectedError with the reason when fanin refuses
        the gradient; the step may then be retried with corrected gradients. If a step raises,
        ``params`` may be partly at the next step: retry the step, or call fetch."""
        g, copied = _as_grads(grads, self.job.elements, f"rank {self.rank}")
        self.bytes_copied += copied
        step, err = c_int64(), c_void_p()
        _check(lib.fanin_step(self._handle(), _floats(g), g.size, _ms(timeout), byref(step), byref(err)), err)
        self.step_count = step.value
        return self.params

    def versions(self) -> list[int]:
        """Per shard (in layout order), the step of the parameters in ``params``. In a bsp job
        every shard is at ``step_count``; in an ssp or asp job ``step`` returns each shard's
        newest parameters as they arrived, so versions may differ from shard to shard, and
        ``step_count`` is the oldest of them. In an ssp job with staleness s, after the worker's
        step t (``own_step``) every version is t-s or newer."""
        return self._versions()[0]

    @property
    def own_step(self) -> int:
        """The last step this worker published: ``step_count`` in a bsp job; in an ssp or asp
        job its own step, which its parameters may lag."""
        return self._versions()[1]

    def _versions(self) -> tuple[list[int], int]:
        n = len(self.job.shards)
        vs, own, err = (c_int64 * n)(), c_int64(), c_void_p()
        _check(lib.fanin_worker_versions(self._handle(), vs, n, byref(own), byref(err)), err)
        return list(vs), own.value

    def _handle(self) -> int:
        if not self._h:
            raise FaninError(f"worker of rank {self.rank} is closed")
        return self._h

    def close(self) -> None:
        """Leaves the job (the job goes on; another worker may take the rank)."""
        if self._h:
            lib.fanin_worker_close(self._h)
            self._h = 0

    def __repr__(self) -> str:
        return f"Worker(job={self.job.id!r}, rank={self.rank}, step={self.step_count})"


class Ranks:
    """Several logical ranks of one job in this process, stepped together: ``step`` publishes every
    rank's gradient at once (each rank in its own goroutine of the library, no Python thread) and
    waits for all their parameters."""

    def __init__(self, workers: Sequence[Worker]) -> None:
        if not workers:
            raise ValueError("Ranks needs at least one worker")
        self.workers = list(workers)
        self.job = workers[0].job

    @property
    def ranks(self) -> list[int]:
        return [w.rank for w in self.workers]

    @property
    def bytes_copied(self) -> int:
        return sum(w.bytes_copied for w in self.workers)

    def fetch(self, timeout: Optional[float] = DEFAULT_TIMEOUT) -> list[np.ndarray]:
        """Fetches the current parameters into every rank's buffer."""
        return [w.fetch(timeout) for w in self.workers]

    def step(self, grads: Sequence[Any], timeout: Optional[float] = DEFAULT_TIMEOUT) -> list[np.ndarray]:
        """Steps every rank: grads[i] is the gradient of rank ``ranks[i]``. Returns each rank's
        parameters (its buffer). Raises the first rank's error, after every rank's step ended."""
        k = len(self.workers)
        if len(grads) != k:
            raise ValueError(f"{len(grads)} gradients for {k} ranks")
        gs = []
        for w, g in zip(self.workers, grads):
            a, copied = _as_grads(g, self.job.elements, f"rank {w.rank}")
            w.bytes_copied += copied
            gs.append(a)
        hs = (c_uint64 * k)(*[w._handle() for w in self.workers])
        ps = (_FLOATP * k)(*[_floats(a) for a in gs])
        step, err = c_int64(), c_void_p()
        status = lib.fanin_step_many(hs, ps, k, self.job.elements, _ms(timeout), byref(step), byref(err))
        _check(status, err)
        for w in self.workers:
            w.step_count = step.value
        return [w.params for w in self.workers]

    def close(self) -> None:
        for w in self.workers:
            w.close()

    def __enter__(self) -> "Ranks":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()


# Events of fanin_elastic_next (sdk/libfanin/elastic.go).
_EVENT_DONE, _EVENT_GRADIENT, _EVENT_ASSIGNED = 0, 1, 2

_WORKER_ID = re.compile(r"^[a-zA-Z0-9][a-zA-Z0-9_-]{0,63}$")

#: A gradient function of an elastic worker: ``grad_fn(rank, step, params)`` returns rank's
#: gradient (``job.elements`` values) for step, computed from params, the parameters after step-1.
GradFn = Callable[[int, int, np.ndarray], Any]


class Elastic(_Closing):
    """A physical worker of a job whose logical ranks fanin assigns (the Go SDK's
    ``Client.Elastic``): it beats to fanin's autoscaler, holds the ranks of the newest assignment,
    and ``step`` computes their gradients with a function of yours. Workers join
    (``Client.elastic``), leave (``leave``) or die at any time: a dead worker's ranks move to the
    others within a few seconds of its last beat, a departed one's at once.

    ``step(grad_fn)`` calls ``grad_fn(rank, step, params)`` for every rank the worker holds, and
    again while it waits for the step for ranks it gains meanwhile (those of a worker that died or
    left). ``grad_fn`` must depend on nothing but its arguments (the rank's data partition, its
    batch number ``step``, and the parameters): then whichever worker computes a rank's gradient,
    and however often, the bytes are the same, and a job trained on workers that come and go ends
    bit-identical to the same job on a fixed set of ranks (``Reference``).

    ``params`` receives the parameters after each step (the returned array; the library writes
    it while a step runs, so read it between steps); ``grad_fn``'s ``params`` is another buffer,
    the parameters the gradient is computed from: read it during the call only. ``ranks`` are the ranks held now, ``on_assign(ranks)`` is called (in the thread of
    ``step``) whenever they change, before a gradient is computed with them. A worker holding no
    ranks (standing by, or not assigned yet) follows the steps. Used by one thread at a time;
    ``ranks``, ``epoch`` and ``versions`` may be read from any.

    The library computes nothing in Python's place and never calls into Python: ``step`` asks it
    for the step's next event and answers it, so ``grad_fn`` runs in your thread, with the GIL,
    as any Python code. Each gradient is copied once into the library's buffer (it must outlive
    the call that hands it over), and the parameters once per step into ``grad_fn``'s buffer."""

    def __init__(
        self,
        client: "Client",
        job: Job,
        worker_id: str,
        handle: int,
        params: np.ndarray,
        prev: np.ndarray,
        on_assign: Optional[Callable[[list[int]], Any]],
    ) -> None:
        self._client = client
        self.job = job
        self.id = worker_id
        self.params = params
        self._prev = prev
        self._on_assign = on_assign
        self._h = handle
        self.step_count = -1  #: the step of the parameters in ``params``; -1 before any
        self.own_step = -1  #: the last step this worker published (ssp: ahead of step_count)
        self.bytes_copied = 0  #: bytes of gradients Python copied (not contiguous float32)
        self.computed = 0  #: gradients this worker computed and handed over

    def _handle(self) -> int:
        if not self._h:
            raise FaninError(f"elastic worker {self.id} is closed")
        return self._h

    def _ranks(self) -> tuple[list[int], int]:
        k = self.job.ranks
        buf, n, epoch, err = (c_int * k)(), c_int(), c_uint64(), c_void_p()
        _check(lib.fanin_elastic_ranks(self._handle(), buf, k, byref(n), byref(epoch), byref(err)), err)
        return list(buf[: n.value]), epoch.value

    @property
    def ranks(self) -> list[int]:
        """The logical ranks the worker holds now (sorted; empty before its first assignment)."""
        return self._ranks()[0]

    @property
    def epoch(self) -> int:
        """The epoch of the assignment the worker follows (0 before the first)."""
        return self._ranks()[1]

    def versions(self) -> list[int]:
        """Per shard, the step of the parameters in ``params`` (see Worker.versions)."""
        n = len(self.job.shards)
        vs, err = (c_int64 * n)(), c_void_p()
        _check(lib.fanin_elastic_versions(self._handle(), vs, n, byref(err)), err)
        return list(vs)

    def step(self, grad_fn: GradFn, timeout: Optional[float] = DEFAULT_TIMEOUT) -> np.ndarray:
        """Runs the next step: computes with ``grad_fn`` the gradient of every rank the worker
        holds (and of ranks it gains while it waits), publishes them, and returns the parameters
        after the step, in ``params``. ``timeout`` bounds the whole step. If ``grad_fn`` or
        ``on_assign`` raises, the step is abandoned and the exception raised; a step that raised
        may be run again (nothing is applied twice)."""
        h = self._handle()
        ms = _ms(timeout)
        ev, rank, step, own, err = c_int(), c_int(), c_int64(), c_int64(), c_void_p()
        try:
            while True:
                status = lib.fanin_elastic_next(h, ms, byref(ev), byref(rank), byref(step), byref(own), byref(err))
                _check(status, err)  # an error ends the step in the library
                if ev.value == _EVENT_DONE:
                    self.step_count, self.own_step = step.value, own.value
                    return self.params
                if ev.value == _EVENT_ASSIGNED:
                    if self._on_assign is not None:
                        self._on_assign(self.ranks)
                    continue
                r, t = rank.value, step.value
                g = grad_fn(r, t, self._prev)
                if g is None:
                    raise TypeError(f"grad_fn returned None for rank {r}, step {t}: it must return the gradient")
                a, copied = _as_grads(g, self.job.elements, f"rank {r} step {t}")
                self.bytes_copied += copied
                _check(lib.fanin_elastic_grad(h, _floats(a), a.size, byref(err)), err)
                self.computed += 1
        except BaseException:
            lib.fanin_elastic_abort(h)  # ends the step, if it is still open
            raise

    def leave(self, timeout: Optional[float] = 10.0) -> None:
        """Leaves the job gracefully: the worker's ranks move to the others at once. Call it
        between steps; the worker is closed after it."""
        h = self._handle()
        self._h = 0
        err = c_void_p()
        _check(lib.fanin_elastic_leave(h, _ms(timeout), byref(err)), err)

    def close(self) -> None:
        """Leaves the job (as ``leave``, waiting up to 2 s, raising nothing)."""
        if self._h:
            lib.fanin_elastic_close(self._h)
            self._h = 0

    def __repr__(self) -> str:
        return f"Elastic(job={self.job.id!r}, id={self.id!r}, step={self.step_count})"


class AppliedOrder(_Closing):
    """Which gradient made each version of each shard of an asp job, recorded from the
    parameters' pushes (``Client.watch_applied``; docs/PROTOCOL.md, "asp"): in an asp job every
    gradient is applied on its own, in the order the gradient stream stored them, and this record
    with the versions each gradient was computed from (``Worker.versions``) is all that
    ``Reference.apply_rank`` needs to replay the run bit for bit. Start it before the job's first
    gradient and keep it until the last parameters arrived."""

    def __init__(self, job_id: str, handle: int) -> None:
        self.job_id = job_id
        self._h = handle

    def read(self) -> dict[int, dict[int, tuple[int, int]]]:
        """The record so far: shard -> version -> (rank, step) of the gradient that made it.
        Raises FaninError if a version was pushed twice naming two gradients."""
        if not self._h:
            raise FaninError(f"applied-order record of job {self.job_id!r} is closed")
        out, err = c_void_p(), c_void_p()
        _check(lib.fanin_applied_read(self._h, byref(out), byref(err)), err)
        doc = json.loads(_lib.take_string(out))
        if doc["conflicts"]:
            raise FaninError(f"job {self.job_id!r}: " + "; ".join(doc["conflicts"]))
        rec: dict[int, dict[int, tuple[int, int]]] = {}
        for shard, versions in doc["shards"].items():
            rec[int(shard)] = {}
            for v, g in versions.items():
                r, t = g.split(".")
                rec[int(shard)][int(v)] = (int(r), int(t))
        return rec

    def close(self) -> None:
        if self._h:
            lib.fanin_applied_close(self._h)
            self._h = 0


def recorded_versions(records: Iterable[Any]) -> dict[tuple[int, int, int], int]:
    """Reads the records of every elastic worker of a job (the files given to ``Client.elastic``
    as ``record``, as paths) and returns, per (rank, step, shard index), the version of that
    shard's parameters the stored gradient was computed from: in an ssp job, with the gradient
    function, all a replay of the run needs (the Go SDK's ``RecordedVersions``: a worker killed
    between its publish and the acknowledgement leaves an intent that counts; a duplicate
    another worker stored first does not). A line cut short by the death of its worker is
    skipped."""
    parts = []
    for r in records:
        with open(r, "rb") as f:
            data = f.read()
        parts.append(data if data.endswith(b"\n") or not data else data + b"\n")
    data = b"".join(parts)
    out, err = c_void_p(), c_void_p()
    _check(lib.fanin_recorded_versions(data, len(data), byref(out), byref(err)), err)
    return {(r, t, s): v for r, t, s, v in json.loads(_lib.take_string(out))}


def _check_buffer(params: Any, job: Job) -> None:
    if not (
        isinstance(params, np.ndarray)
        and params.dtype == np.float32
        and params.ndim == 1
        and params.flags.c_contiguous
        and params.flags.writeable
    ):
        raise ValueError("params must be a writable, contiguous float32 vector")
    if params.size != job.elements:
        raise ValueError(f"params has {params.size} elements, job {job.id!r} has {job.elements}")


Credentials = Union[Mapping[str, Any], str, None]


class Client(_Closing):
    """A connection to fanin's data plane (NATS). ``credentials`` are the job's NATS credentials
    as the gateway returns them (the ``credentials`` of a created job, or of
    Gateway.credentials), as a dict or its JSON; None for a fanin without authentication.
    Safe to share between threads."""

    def __init__(self, url: str, credentials: Credentials = None, timeout: Optional[float] = 30.0) -> None:
        creds = credentials if isinstance(credentials, str) or credentials is None else json.dumps(dict(credentials))
        h, err = c_uint64(), c_void_p()
        _check(lib.fanin_connect(url.encode(), _lib.cstr(creds), _ms(timeout), byref(h), byref(err)), err)
        self._h = h.value
        self.url = url

    def _handle(self) -> int:
        if not self._h:
            raise FaninError("client is closed")
        return self._h

    def job(self, job_id: str, timeout: Optional[float] = 30.0) -> Job:
        """Reads a job's record. Raises UnknownJobError if there is no such job."""
        out, err = c_void_p(), c_void_p()
        _check(lib.fanin_job(self._handle(), job_id.encode(), _ms(timeout), byref(out), byref(err)), err)
        return Job(json.loads(_lib.take_string(out)))

    def upload(self, job_id: str, params: Any, timeout: Optional[float] = 60.0) -> None:
        """Uploads the initial parameters of a job created with ``init: {kind: upload}``: every
        parameter, flattened in tensor order. Uploading the same values again soon after is a
        no-op; otherwise a second upload raises AlreadyUploadedError."""
        job = self.job(job_id, timeout)
        p, _ = _as_grads(params, job.elements, "upload")
        err = c_void_p()
        _check(lib.fanin_upload(self._handle(), job_id.encode(), _floats(p), p.size, _ms(timeout), byref(err)), err)

    def worker(
        self,
        job_id: str,
        rank: int,
        weight: Optional[float] = None,
        params: Optional[np.ndarray] = None,
        timeout: Optional[float] = 30.0,
        grad_dtype: str = "f32",
    ) -> Worker:
        """Joins job ``job_id`` as ``rank``. ``weight`` is the rank's weight for weighted functions
        (fedavg). ``params`` is the buffer that receives the parameters (a writable contiguous
        float32 vector of the job's size, kept alive by the worker); by default a new one.
        ``grad_dtype`` "bf16" or "f16" publishes the gradients as 16-bit floats (half the bytes):
        ``step`` still takes float32, rounded to nearest even as numpy's ``astype(np.float16)``
        and torch's ``to(torch.bfloat16)`` do; the result is the reference's for the rounded
        gradients (docs/PROTOCOL.md, "16-bit gradients")."""
        job = self.job(job_id, timeout)
        if params is None:
            params = np.zeros(job.elements, dtype=np.float32)
        _check_buffer(params, job)
        if weight is not None and not weight > 0:
            raise ValueError(f"weight must be > 0, got {weight!r}")
        if grad_dtype not in ("f32", "bf16", "f16"):
            raise ValueError(f"grad_dtype must be 'f32', 'bf16' or 'f16', got {grad_dtype!r}")
        h, err = c_uint64(), c_void_p()
        if grad_dtype == "f32":
            status = lib.fanin_worker(
                self._handle(), job_id.encode(), rank, c_double(weight or 0.0), _floats(params), params.size,
                _ms(timeout), byref(h), byref(err),
            )
        else:
            status = lib.fanin_worker_dtype(
                self._handle(), job_id.encode(), rank, c_double(weight or 0.0), grad_dtype.encode(),
                _floats(params), params.size, _ms(timeout), byref(h), byref(err),
            )
        _check(status, err)
        return Worker(self, job, rank, h.value, params)

    def ranks(
        self,
        job_id: str,
        ranks: Iterable[int],
        weights: Optional[Sequence[float]] = None,
        grad_dtype: str = "f32",
    ) -> Ranks:
        """Joins a job as several logical ranks at once (see Ranks); ``grad_dtype`` as in worker."""
        rs = list(ranks)
        ws = list(weights) if weights is not None else [None] * len(rs)
        if len(ws) != len(rs):
            raise ValueError(f"{len(ws)} weights for {len(rs)} ranks")
        workers: list[Worker] = []
        try:
            for r, w in zip(rs, ws):
                workers.append(self.worker(job_id, r, weight=w, grad_dtype=grad_dtype))
        except BaseException:
            for w in workers:
                w.close()
            raise
        return Ranks(workers)

    def elastic(
        self,
        job_id: str,
        worker_id: Optional[str] = None,
        on_assign: Optional[Callable[[list[int]], Any]] = None,
        params: Optional[np.ndarray] = None,
        grad_dtype: str = "f32",
        record: Optional[str] = None,
        timeout: Optional[float] = 30.0,
    ) -> Elastic:
        """Joins job ``job_id`` (bsp or ssp) as an elastic worker (see Elastic) and starts
        beating; its ranks come with the first assignment that names it. ``worker_id`` names it
        (1-64 of a-z, A-Z, 0-9, '_' and '-'; default a random one). ``on_assign(ranks)`` is
        called whenever its ranks change. ``params`` is the buffer that receives the parameters
        (as in ``worker``); ``grad_dtype`` as in ``worker``. ``record`` is a file to which the
        worker appends its record of every gradient message it publishes (JSON lines: intended
        before the publish, then stored or duplicate), each line written before the call that
        made it returns, so that it survives the process: in an ssp job, ``recorded_versions``
        of every worker's record is what a replay needs. An asp job has nothing to assign (it
        never waits for a rank): it raises FaninError; use ``worker``."""
        job = self.job(job_id, timeout)
        if worker_id is None:
            worker_id = str(uuid.uuid4())
        if not _WORKER_ID.match(worker_id):
            raise ValueError(f"worker id {worker_id!r}: use 1-64 of a-z, A-Z, 0-9, '_' and '-'")
        if params is None:
            params = np.zeros(job.elements, dtype=np.float32)
        _check_buffer(params, job)
        if grad_dtype not in ("f32", "bf16", "f16"):
            raise ValueError(f"grad_dtype must be 'f32', 'bf16' or 'f16', got {grad_dtype!r}")
        if on_assign is not None and not callable(on_assign):
            raise TypeError("on_assign must be callable")
        prev = np.zeros(job.elements, dtype=np.float32)
        h, err = c_uint64(), c_void_p()
        status = lib.fanin_elastic(
            self._handle(), job_id.encode(), worker_id.encode(), grad_dtype.encode(), _floats(params), _floats(prev),
            params.size, 1 if on_assign is not None else 0, _lib.cstr(record), _ms(timeout), byref(h), byref(err),
        )
        _check(status, err)
        return Elastic(self, job, worker_id, h.value, params, prev, on_assign)

    def watch_applied(self, job_id: str) -> AppliedOrder:
        """Starts recording the applied order of an asp job (see AppliedOrder)."""
        h, err = c_uint64(), c_void_p()
        _check(lib.fanin_applied_watch(self._handle(), job_id.encode(), byref(h), byref(err)), err)
        return AppliedOrder(job_id, h.value)

    def close(self) -> None:
        """Closes the connection (its workers stop working)."""
        if self._h:
            lib.fanin_client_close(self._h)
            self._h = 0


def connect(url: str, credentials: Credentials = None, timeout: Optional[float] = 30.0) -> Client:
    """Connects to fanin's NATS at ``url`` (see Client)."""
    return Client(url, credentials, timeout)


class Reference(_Closing):
    """fanin's single-process reference of a job (the Go ``functions.Reference``): what every
    deployment reproduces bit for bit. Feed it the gradients a run logged to check the run::

        ref = fanin.Reference(job, init)
        for step_grads in logged:           # one gradient per rank
            expected = ref.step(step_grads)
    """

    def __init__(self, job: Job, init: Any) -> None:
        p, _ = _as_grads(init, job.elements, "reference init")
        h, err = c_uint64(), c_void_p()
        _check(lib.fanin_reference(json.dumps(job.record).encode(), _floats(p), p.size, byref(h), byref(err)), err)
        self._h = h.value
        self.job = job
        self.params = p.copy()

    def step(self, grads: Sequence[Any], weights: Optional[Sequence[float]] = None) -> np.ndarray:
        """Applies one step of every rank's gradient (grads[r] for rank r) and returns the
        parameters after it."""
        k = len(grads)
        gs = [_as_grads(g, self.job.elements, "reference")[0] for g in grads]
        ps = (_FLOATP * k)(*[_floats(a) for a in gs])
        wp = None if weights is None else (c_double * k)(*weights)
        err = c_void_p()
        _check(lib.fanin_reference_step(self._h, ps, k, self.job.elements, wp, _floats(self.params), byref(err)), err)
        return self.params

    def apply_rank(self, shard: int, grad: Any, weight: Optional[float] = None) -> np.ndarray:
        """Applies one rank's gradient (of the whole model: only the shard's slice is read) to
        one shard on its own, as an asp job's runtime does: the shard's update count is its own
        step. ``shard`` is the shard's index in ``job.shards``; ``weight`` the rank's weight for
        weighted functions. Returns the parameters after it."""
        if not 0 <= shard < len(self.job.shards):
            raise ValueError(f"no shard {shard}: job {self.job.id!r} has {len(self.job.shards)}")
        g, _ = _as_grads(grad, self.job.elements, "reference")
        err = c_void_p()
        status = lib.fanin_reference_apply(
            self._h, shard, _floats(g), g.size, c_double(weight or 1.0), _floats(self.params), byref(err)
        )
        _check(status, err)
        return self.params

    def close(self) -> None:
        if self._h:
            lib.fanin_reference_close(self._h)
            self._h = 0


class GatewayError(FaninError):
    """An error answer of the gateway's HTTP API: ``status``, and ``code`` (for a refused input,
    the reason code, as in RejectedError)."""

    def __init__(self, status: int, code: str, detail: str) -> None:
        super().__init__(f"gateway: {status} {code}: {detail}", "gateway")
        self.status, self.code, self.detail = status, code, detail
        self.reason = code


class Gateway:
    """The part of fanin's HTTP API (docs/API.md) a training script needs: create a job, get its
    workers' credentials, read its status, delete it."""

    def __init__(self, url: str, token: Optional[str] = None, timeout: float = 30.0) -> None:
        self.url = url.rstrip("/")
        self.token = token
        self.timeout = timeout

    def _do(self, method: str, path: str, body: Any = None, content_type: str = "application/json") -> Any:
        if isinstance(body, (bytes, bytearray, memoryview)):
            data: Optional[bytes] = bytes(body)
        else:
            data = None if body is None else json.dumps(body).encode()
        req = urllib.request.Request(self.url + path, data=data, method=method)
        if data is not None:
            req.add_header("Content-Type", content_type)
        if self.token:
            req.add_header("Authorization", "Bearer " + self.token)
        try:
            with urllib.request.urlopen(req, timeout=self.timeout) as resp:
                raw = resp.read()
        except urllib.error.HTTPError as e:
            raw = e.read()
            try:
                doc = json.loads(raw)
            except ValueError:
                doc = {"code": "http_" + str(e.code), "detail": raw.decode(errors="replace")}
            raise GatewayError(e.code, doc.get("code", ""), doc.get("detail", "")) from None
        return json.loads(raw) if raw else None

    def create_job(self, spec: Mapping[str, Any]) -> dict[str, Any]:
        """Creates a job. The answer has the record ("spec", "layout"), the job's "token", and its
        workers' NATS "credentials" (for connect), shown this once."""
        return self._do("POST", "/v1/jobs", dict(spec))

    def job(self, job_id: str) -> dict[str, Any]:
        """A job's record and status."""
        return self._do("GET", "/v1/jobs/" + job_id)

    def credentials(self, job_id: str) -> dict[str, Any]:
        """Another set of NATS credentials for the job's workers."""
        return self._do("POST", f"/v1/jobs/{job_id}/credentials")

    def rejects(self, job_id: str) -> dict[str, Any]:
        """The job's rejection counts by reason, and its latest rejections."""
        return self._do("GET", f"/v1/jobs/{job_id}/rejects")

    def delete_job(self, job_id: str) -> None:
        """Drains and deletes a job with its streams, state and credentials."""
        self._do("DELETE", "/v1/jobs/" + job_id)

    def push_function(self, name: str, version: str, module: bytes, owner: Optional[str] = None) -> dict[str, Any]:
        """Uploads a user function, a WebAssembly module (docs/FUNCTIONS.md), as
        <owner>/<name>@<version>: the token's team by default (the admin may name another owner).
        The answer is its record; "function" is what a job spec names. The same bytes again are
        accepted; other bytes under a stored name and version are refused (function_exists)."""
        q = urllib.parse.urlencode({k: v for k, v in (("name", name), ("version", version), ("owner", owner)) if v})
        return self._do("POST", "/v1/functions?" + q, module, content_type="application/wasm")

    def functions(self) -> dict[str, Any]:
        """The built-in functions and the user functions ("modules") the token reaches."""
        return self._do("GET", "/v1/functions")

    def delete_function(self, ref: str) -> None:
        """Deletes a user function named owner/name@version; refused (function_in_use) while a job
        names it."""
        self._do("DELETE", "/v1/functions/" + ref)


def version() -> str:
    """The version of the loaded libfanin."""
    return lib.fanin_version().decode()
