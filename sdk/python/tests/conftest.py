"""Fixtures: a real `fanin dev` (embedded NATS, gateway, autoscaler, runtimes) per test session.

The fanin binary is built from the repository (or taken from FANIN_BIN); the package is imported
as installed (pip install ./sdk/python) or, when run from the source tree, with FANIN_LIB pointing
at a libfanin.so built by this file.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[3]
CACHE = Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "fanin" / "pytest"


def _go_build(out: Path, *args: str) -> None:
    out.parent.mkdir(parents=True, exist_ok=True)
    subprocess.run(["go", "build", "-o", str(out), *args], cwd=ROOT, check=True)


try:
    import fanin  # noqa: F401  (installed, or FANIN_LIB set)
except ImportError:
    lib = CACHE / "libfanin.so"
    _go_build(lib, "-buildmode=c-shared", "./sdk/libfanin")
    os.environ["FANIN_LIB"] = str(lib)
    sys.path.insert(0, str(ROOT / "sdk" / "python"))


class Dev:
    """A running `fanin dev`: its NATS and HTTP addresses and admin token."""

    def __init__(self, nats: str, http: str, token: str, proc: subprocess.Popen, log: Path) -> None:
        self.nats, self.http, self.token, self.proc, self.log = nats, http, token, proc, log

    def gateway(self):
        import fanin

        return fanin.Gateway(self.http, token=self.token)

    def create(self, spec: dict) -> dict:
        """Creates a job (id made unique) and returns the gateway's answer."""
        spec = dict(spec, id=f"{spec['id']}-{uuid.uuid4().hex[:6]}")
        return self.gateway().create_job(spec)


@pytest.fixture(scope="session")
def dev():
    binary = os.environ.get("FANIN_BIN")
    if not binary:
        binary = str(CACHE / "fanin")
        _go_build(Path(binary), "./cmd/fanin")
    tmp = Path(tempfile.mkdtemp(prefix="fanin-pytest-"))
    log = tmp / "dev.log"
    out = open(log, "w")
    proc = subprocess.Popen(
        [binary, "dev", "--http", "127.0.0.1:0", "--nats-port", "-1", "--data-dir", str(tmp / "data"), "--runtimes", "2"],
        stdout=out,
        stderr=subprocess.STDOUT,
    )
    nats = http = None
    deadline = time.time() + 60
    while time.time() < deadline and not (nats and http):
        if proc.poll() is not None:
            raise RuntimeError(f"fanin dev exited: {log.read_text()}")
        text = log.read_text()
        m1 = re.search(r"NATS\s+(nats://\S+)", text)
        m2 = re.search(r"HTTP API\s+(http://\S+)", text)
        nats, http = m1 and m1.group(1), m2 and m2.group(1)
        time.sleep(0.1)
    if not (nats and http):
        proc.kill()
        raise RuntimeError(f"fanin dev did not start in 60 s: {log.read_text()}")
    token = (tmp / "data" / "auth" / "admin.token").read_text().strip()
    d = Dev(nats, http, token, proc, log)
    yield d
    proc.terminate()
    try:
        proc.wait(20)
    except subprocess.TimeoutExpired:
        proc.kill()
    out.close()
