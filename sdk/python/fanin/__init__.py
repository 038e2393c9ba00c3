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
import urllib.request
from ctypes import POINTER, byref, c_double, c_float, c_int64, c_uint64, c_void_p
from dataclasses import dataclass
from typing import Any, Iterable, Mapping, Optional, Sequence, Union

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
    "Reference",
    "connect",
    "decode_params",
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
        if not (
            isinstance(params, np.ndarray)
            and params.dtype == np.float32
            and params.ndim == 1
            and params.flags.c_contiguous
            and params.flags.writeable
        ):
            raise ValueError("params must be a writable, contiguous float32 vector")
        if params.size != job.elements:
            raise ValueError(f"params has {params.size} elements, job {job_id!r} has {job.elements}")
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

    def _do(self, method: str, path: str, body: Any = None) -> Any:
        data = None if body is None else json.dumps(body).encode()
        req = urllib.request.Request(self.url + path, data=data, method=method)
        if data is not None:
            req.add_header("Content-Type", "application/json")
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


def version() -> str:
    """The version of the loaded libfanin."""
    return lib.fanin_version().decode()
