"""ctypes bindings of libfanin, the Go SDK built as a C library (sdk/libfanin).

The library is found next to this file (where ``pip install`` builds it), or at the path in the
``FANIN_LIB`` environment variable.
"""

from __future__ import annotations

import ctypes
import json
import os
from ctypes import POINTER, c_char_p, c_double, c_float, c_int, c_int64, c_uint64, c_void_p
from pathlib import Path
from typing import Any, Optional

_FLOATP = POINTER(c_float)
_ERR = POINTER(c_void_p)  # char** that the library fills with a malloc'd JSON document


def _path() -> str:
    env = os.environ.get("FANIN_LIB")
    if env:
        return env
    here = Path(__file__).with_name("libfanin.so")
    if here.exists():
        return str(here)
    raise ImportError(
        "fanin: libfanin.so is missing next to the package and FANIN_LIB is not set; "
        "from the repository, `scripts/pyvenv.sh` makes a venv with it (needs Go; or, inside a venv of "
        "yours, `pip install --no-build-isolation ./sdk/python`), or build it with "
        "`go build -buildmode=c-shared -o libfanin.so ./sdk/libfanin` and set FANIN_LIB"
    )


def _load() -> ctypes.CDLL:
    lib = ctypes.CDLL(_path())  # CDLL: the GIL is released during every call
    sig = {
        "fanin_free": (None, [c_void_p]),
        "fanin_version": (c_char_p, []),
        "fanin_connect": (c_int, [c_char_p, c_char_p, c_int64, POINTER(c_uint64), _ERR]),
        "fanin_client_close": (None, [c_uint64]),
        "fanin_job": (c_int, [c_uint64, c_char_p, c_int64, POINTER(c_void_p), _ERR]),
        "fanin_upload": (c_int, [c_uint64, c_char_p, _FLOATP, c_int64, c_int64, _ERR]),
        "fanin_worker": (
            c_int,
            [c_uint64, c_char_p, c_int, c_double, _FLOATP, c_int64, c_int64, POINTER(c_uint64), _ERR],
        ),
        "fanin_worker_dtype": (
            c_int,
            [c_uint64, c_char_p, c_int, c_double, c_char_p, _FLOATP, c_int64, c_int64, POINTER(c_uint64), _ERR],
        ),
        "fanin_worker_close": (None, [c_uint64]),
        "fanin_params": (c_int, [c_uint64, c_int64, POINTER(c_int64), _ERR]),
        "fanin_step": (c_int, [c_uint64, _FLOATP, c_int64, c_int64, POINTER(c_int64), _ERR]),
        "fanin_step_many": (
            c_int,
            [POINTER(c_uint64), POINTER(_FLOATP), c_int, c_int64, c_int64, POINTER(c_int64), _ERR],
        ),
        "fanin_reference": (c_int, [c_char_p, _FLOATP, c_int64, POINTER(c_uint64), _ERR]),
        "fanin_reference_step": (
            c_int,
            [c_uint64, POINTER(_FLOATP), c_int, c_int64, POINTER(c_double), _FLOATP, _ERR],
        ),
        "fanin_reference_apply": (c_int, [c_uint64, c_int, _FLOATP, c_int64, c_double, _FLOATP, _ERR]),
        "fanin_reference_close": (None, [c_uint64]),
        "fanin_worker_versions": (c_int, [c_uint64, POINTER(c_int64), c_int, POINTER(c_int64), _ERR]),
        "fanin_elastic": (
            c_int,
            [c_uint64, c_char_p, c_char_p, c_char_p, _FLOATP, _FLOATP, c_int64, c_int, c_char_p, c_int64, POINTER(c_uint64), _ERR],
        ),
        "fanin_elastic_next": (
            c_int,
            [c_uint64, c_int64, POINTER(c_int), POINTER(c_int), POINTER(c_int64), POINTER(c_int64), _ERR],
        ),
        "fanin_elastic_grad": (c_int, [c_uint64, _FLOATP, c_int64, _ERR]),
        "fanin_elastic_abort": (None, [c_uint64]),
        "fanin_elastic_ranks": (c_int, [c_uint64, POINTER(c_int), c_int, POINTER(c_int), POINTER(c_uint64), _ERR]),
        "fanin_elastic_versions": (c_int, [c_uint64, POINTER(c_int64), c_int, _ERR]),
        "fanin_elastic_leave": (c_int, [c_uint64, c_int64, _ERR]),
        "fanin_elastic_close": (None, [c_uint64]),
        "fanin_recorded_versions": (c_int, [c_char_p, c_int64, POINTER(c_void_p), _ERR]),
        "fanin_applied_watch": (c_int, [c_uint64, c_char_p, POINTER(c_uint64), _ERR]),
        "fanin_applied_read": (c_int, [c_uint64, POINTER(c_void_p), _ERR]),
        "fanin_applied_close": (None, [c_uint64]),
    }
    for name, (res, args) in sig.items():
        fn = getattr(lib, name)
        fn.restype, fn.argtypes = res, args
    return lib


lib = _load()


def take_string(p: c_void_p) -> str:
    """Returns the library's malloc'd string at p and frees it."""
    try:
        return ctypes.string_at(p).decode()
    finally:
        lib.fanin_free(p)


def take_error(p: c_void_p) -> dict[str, Any]:
    """Decodes and frees an error document of the library."""
    if not p:
        return {"kind": "error", "message": "libfanin failed without saying why"}
    return json.loads(take_string(p))


def cstr(s: Optional[str]) -> Optional[bytes]:
    return None if s is None else s.encode()
