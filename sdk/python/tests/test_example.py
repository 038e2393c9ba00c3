"""The PyTorch example (examples/pytorch/train.py) runs a few steps against `fanin dev` with worker
processes: its accuracy rises and its final parameters are fanin's reference, bit for bit."""

from __future__ import annotations

import os
import re
import subprocess
import sys

import pytest

from conftest import ROOT

pytest.importorskip("torch")


def test_pytorch_example(dev):
    import fanin

    pkg = os.path.dirname(os.path.dirname(fanin.__file__))  # importable by the worker processes too
    env = dict(os.environ, FANIN_TOKEN=dev.token, PYTHONPATH=os.pathsep.join(filter(None, [pkg, os.environ.get("PYTHONPATH")])))
    out = subprocess.run(
        [sys.executable, str(ROOT / "examples" / "pytorch" / "train.py"), "--nats", dev.nats, "--http", dev.http,
         "--workers", "3", "--steps", "40", "--every", "13"],
        env=env, capture_output=True, text=True, timeout=300,
    )
    assert out.returncode == 0, out.stdout + out.stderr
    acc = [float(a) for a in re.findall(r"test accuracy (\d\.\d+)", out.stdout)]
    assert len(acc) >= 3, out.stdout
    assert acc[-1] > acc[0] + 0.2, f"accuracy did not rise: {acc}"
    assert "bit-identical to fanin's reference (40 steps" in out.stdout, out.stdout


def test_pytorch_elastic_example(dev):
    """examples/pytorch/elastic.py: worker processes leave, join and are killed with SIGKILL, and
    every step's parameters are the reference's of fixed ranks."""
    import fanin

    pkg = os.path.dirname(os.path.dirname(fanin.__file__))
    env = dict(os.environ, FANIN_TOKEN=dev.token, PYTHONPATH=os.pathsep.join(filter(None, [pkg, os.environ.get("PYTHONPATH")])))
    out = subprocess.run(
        [sys.executable, str(ROOT / "examples" / "pytorch" / "elastic.py"), "--nats", dev.nats, "--http", dev.http,
         "--ranks", "4", "--steps", "40", "--every", "10"],
        env=env, capture_output=True, text=True, timeout=300,
    )
    assert out.returncode == 0, out.stdout + out.stderr
    assert "worker d joins" in out.stdout and "is killed with SIGKILL" in out.stdout, out.stdout
    assert re.search(r"worker b left after step \d+, c was killed after step \d+", out.stdout), out.stdout
    m = re.search(r"(\d+) step results of 4 workers and the final parameters: bit-identical to fanin's reference of 4 "
                  r"fixed ranks \((\d+) steps", out.stdout)
    assert m and int(m.group(2)) >= 40, out.stdout
    assert int(m.group(1)) >= 40, out.stdout  # every worker's every step was checked, at least one per step
