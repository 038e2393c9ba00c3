"""Elastic workers against a real `fanin dev`: worker processes that join, leave and are killed
with SIGKILL while a job of 4 logical ranks trains, and every step's parameters, whichever worker
returned them, are those of fanin's reference on 4 fixed ranks, bit for bit; and one worker in
this process for the API: its ranks, on_assign, a gradient function that fails, bad gradients."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

import fanin
from elastic_worker import gradient, sha

WORKER = Path(__file__).with_name("elastic_worker.py")


def job_spec(ranks: int, **extra) -> dict:
    return {
        "id": "elastic",
        "ranks": ranks,
        "tensors": [{"name": "w", "shape": [1000, 3]}],
        "function": {"name": "adam", "hyper": {"lr": 0.01}},
        "init": {"kind": "uniform", "seed": 5, "scale": 0.5},
        "shard_size": 4096,  # 3 shards
        **extra,
    }


def initial(client: fanin.Client, job_id: str) -> np.ndarray:
    """The job's parameters of step 0 (read before any worker steps)."""
    with client.worker(job_id, 0) as w:
        p = w.fetch(timeout=30).copy()
        assert w.step_count == 0
        return p


def reference_shas(job: fanin.Job, init: np.ndarray, steps: int) -> dict[int, str]:
    ref = fanin.Reference(job, init)
    out = {0: sha(init)}
    for t in range(1, steps + 1):
        out[t] = sha(ref.step([gradient(r, t, ref.params) for r in range(job.ranks)]))
    return out


def read_log(path: Path) -> list[dict]:
    if not path.exists():
        return []
    lines = path.read_text().splitlines()
    return [json.loads(line) for line in lines if line.endswith("}")]  # a killed worker's last line may be cut


def wait_for(what: str, cond, procs: dict, timeout: float = 120.0) -> None:
    deadline = time.time() + timeout
    while not cond():
        for name, p in procs.items():
            if p.poll() not in (None, 0, -9):
                raise AssertionError(f"worker {name} exited with {p.returncode} while waiting for {what}")
        if time.time() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.05)


def test_elastic_processes_leave_die_and_join(dev, tmp_path):
    """4 logical ranks on worker processes a, b, c; b leaves after step 8; d joins at step 12;
    c is killed (SIGKILL) once d holds ranks and c is at step 20 or later; a and d go on for 12
    steps more. Every step's parameters any worker returned are the reference's of 4 fixed ranks,
    and so are the job's final ones."""
    created = dev.create(job_spec(4))
    job_id = created["spec"]["id"]
    creds = tmp_path / "creds.json"
    creds.write_text(json.dumps(created.get("credentials")))
    with fanin.connect(dev.nats, created["credentials"]) as c:
        job = c.job(job_id)
        init = initial(c, job_id)
    pkg = os.path.dirname(os.path.dirname(fanin.__file__))
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [pkg, os.environ.get("PYTHONPATH")])))
    logs = {n: tmp_path / f"{n}.jsonl" for n in "abcd"}
    procs: dict[str, subprocess.Popen] = {}
    stop = tmp_path / "stop"

    def start(name: str, until: int, join_on: str = "") -> None:
        procs[name] = subprocess.Popen(
            [sys.executable, str(WORKER), "--nats", dev.nats, "--creds", str(creds), "--job", job_id, "--id", name,
             "--until", str(until), "--stop", str(stop), "--log", str(logs[name]), "--ready", str(tmp_path / f"{name}.ready"),
             "--joined", str(tmp_path / f"{name}.joined"), "--go", str(tmp_path / "go"),
             "--join-on", join_on and str(tmp_path / join_on)],
            env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
        )

    def at(name: str) -> int:
        lines = read_log(logs[name])
        return lines[-1]["step"] if lines else -1

    def held(name: str) -> bool:
        return any(line["ranks"] for line in read_log(logs[name]))

    try:
        start("a", 10_000)  # until the stop file's step
        start("b", 8)
        start("c", 10_000)  # until killed
        start("d", 10_000, join_on="d.go")  # started now (a process is slow to start), joins at step 12
        wait_for("a, b and c to join and d to start",
                 lambda: all((tmp_path / f"{n}.joined").exists() for n in "abc") and (tmp_path / "d.ready").exists(), procs)
        (tmp_path / "go").touch()
        wait_for("step 12", lambda: max(at("a"), at("c")) >= 12, procs)
        (tmp_path / "d.go").touch()
        wait_for("d to hold ranks and c to reach step 20", lambda: held("d") and at("c") >= 20, procs)
        procs["c"].kill()
        killed_at = at("c")
        last = max(at("a"), at("d")) + 12
        (tmp_path / "stop.tmp").write_text(str(last))
        (tmp_path / "stop.tmp").rename(stop)
        for name in "abd":
            out, _ = procs[name].communicate(timeout=180)
            assert procs[name].returncode == 0, f"worker {name} failed:\n{out}"
        procs["c"].wait(10)
        assert procs["c"].returncode == -9
    finally:
        for p in procs.values():
            if p.poll() is None:
                p.kill()
                p.wait()

    lines = {n: read_log(logs[n]) for n in "abcd"}
    with fanin.connect(dev.nats, created["credentials"]) as c:
        with c.worker(job_id, 0) as w:
            final = w.fetch(timeout=30).copy()
            final_step = w.step_count
    want = reference_shas(job, init, final_step)
    for name, ls in lines.items():
        for line in ls:
            assert line["sha"] == want[line["step"]], f"worker {name}: step {line['step']} differs from the reference"
    assert sha(final) == want[final_step], "the job's final parameters differ from the reference"
    assert final_step >= last and lines["a"][-1]["step"] >= last and lines["d"][-1]["step"] >= last
    assert any(line["ranks"] for line in lines["b"]), "b held no rank before it left"
    assert 8 <= lines["b"][-1]["step"] < killed_at, "b did not leave first"
    assert killed_at >= 20
    # After c's death a and d held all 4 ranks between them.
    assert set(lines["a"][-1]["ranks"]) | set(lines["d"][-1]["ranks"]) == {0, 1, 2, 3}
    assert lines["d"][-1]["computed"] > 0


def test_elastic_ssp_worker_killed(dev, tmp_path):
    """An ssp job (s = 2) of 3 logical ranks on 3 elastic worker processes, c the slowest; b is
    killed (SIGKILL) at its own step 15 or later. Its ranks move, their new owner catches up the
    steps they miss, and a and c, which could run only 2 steps ahead of them, go on to step 40.
    The result is the reference recomputing every stored gradient from the version its worker
    recorded (Client.elastic's record, read by fanin.recorded_versions), bit for bit."""
    s, last = 2, 40
    created = dev.create(job_spec(3, sync="ssp", staleness=s))
    job_id = created["spec"]["id"]
    creds = tmp_path / "creds.json"
    creds.write_text(json.dumps(created.get("credentials")))
    with fanin.connect(dev.nats, created["credentials"]) as c:
        job = c.job(job_id)
        init = initial(c, job_id)
    pkg = os.path.dirname(os.path.dirname(fanin.__file__))
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [pkg, os.environ.get("PYTHONPATH")])))
    logs = {n: tmp_path / f"{n}.jsonl" for n in "abc"}
    records = [tmp_path / f"{n}.record" for n in "abc"]
    procs: dict[str, subprocess.Popen] = {}
    for name, record in zip("abc", records):
        procs[name] = subprocess.Popen(
            [sys.executable, str(WORKER), "--nats", dev.nats, "--creds", str(creds), "--job", job_id, "--id", name,
             "--until", str(last if name != "b" else 10_000), "--log", str(logs[name]), "--record", str(record),
             "--joined", str(tmp_path / f"{name}.joined"), "--go", str(tmp_path / "go"),
             "--compute", "0.02" if name == "c" else "0.005"],
            env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
        )

    def own(name: str) -> int:
        lines = read_log(logs[name])
        return lines[-1]["own"] if lines else -1

    try:
        wait_for("a, b and c to join", lambda: all((tmp_path / f"{n}.joined").exists() for n in "abc"), procs)
        (tmp_path / "go").touch()
        wait_for("b to hold ranks at step 15", lambda: own("b") >= 15 and read_log(logs["b"])[-1]["ranks"], procs)
        procs["b"].kill()
        for name in "ac":
            out, _ = procs[name].communicate(timeout=180)
            assert procs[name].returncode == 0, f"worker {name} failed:\n{out}"
        procs["b"].wait(10)
    finally:
        for p in procs.values():
            if p.poll() is None:
                p.kill()
                p.wait()
    assert own("a") >= last and own("c") >= last

    with fanin.connect(dev.nats, created["credentials"]) as c, c.worker(job_id, 0) as w:
        deadline = time.time() + 30
        while True:
            got = w.fetch(timeout=30).copy()
            if min(w.versions()) >= last:
                break
            assert time.time() < deadline, f"shards at versions {w.versions()}, want {last}"
            time.sleep(0.05)
        top = max(w.versions())

    version = fanin.recorded_versions(records)
    ref = fanin.Reference(job, init)
    history = [init.copy()]
    frm = np.empty_like(init)
    stale = 0
    for t in range(1, top + 1):
        grads = []
        for r in range(3):
            for i, sh in enumerate(job.shards):
                v = version.get((r, t, i))
                assert v is not None, f"no version recorded for rank {r} step {t} shard {i}"
                assert t - 1 - s <= v <= t - 1, f"rank {r} step {t} shard {i}: version {v}, beyond the bound"
                stale += v < t - 1
                frm[sh["off"] : sh["off"] + sh["len"]] = history[v][sh["off"] : sh["off"] + sh["len"]]
            grads.append(gradient(r, t, frm))
        history.append(ref.step(grads).copy())
    assert stale > 0, "no gradient was computed from stale parameters: the run did not exercise ssp"
    assert got.tobytes() == history[last].tobytes(), "the ssp run with a worker killed differs from the replay"


def test_elastic_worker_api(dev):
    created = dev.create(job_spec(3))
    job_id = created["spec"]["id"]
    with fanin.connect(dev.nats, created["credentials"]) as c:
        job = c.job(job_id)
        init = initial(c, job_id)
        ref = fanin.Reference(job, init)

        with pytest.raises(ValueError, match="worker id"):
            c.elastic(job_id, worker_id="no spaces")
        buf = np.zeros(job.elements, np.float32)
        assigned: list[list[int]] = []
        calls: list[tuple[int, int]] = []
        e = c.elastic(job_id, worker_id="solo", on_assign=assigned.append, params=buf)

        def good(rank: int, step: int, params: np.ndarray) -> np.ndarray:
            assert assigned, "a gradient was asked for before on_assign named the worker's ranks"
            calls.append((rank, step))
            return gradient(rank, step, params)

        # A gradient function that fails abandons the step; the step runs again, whole.
        def failing(rank: int, step: int, params: np.ndarray) -> np.ndarray:
            if calls:
                raise RuntimeError("the data loader broke")
            return good(rank, step, params)

        with pytest.raises(RuntimeError, match="data loader"):
            e.step(failing, timeout=60)
        calls.clear()
        out = e.step(good, timeout=60)
        assert out is buf and e.params is buf
        assert e.step_count == 1 and e.own_step == 1
        assert out.tobytes() == ref.step([gradient(r, 1, ref.params) for r in range(3)]).tobytes()
        assert assigned == [[0, 1, 2]] and e.ranks == [0, 1, 2] and e.epoch >= 1
        assert sorted(calls) == [(0, 1), (1, 1), (2, 1)]
        assert e.versions() == [1] * len(job.shards)

        # A gradient of the wrong length is refused with its reason; a None is a TypeError.
        with pytest.raises(fanin.RejectedError) as err:
            e.step(lambda r, t, p: np.zeros(7, np.float32), timeout=60)
        assert err.value.reason == "bad_length"
        with pytest.raises(TypeError, match="returned None"):
            e.step(lambda r, t, p: None, timeout=60)
        out = e.step(good, timeout=60)
        assert e.step_count == 2
        assert out.tobytes() == ref.step([gradient(r, 2, ref.params) for r in range(3)]).tobytes()

        e.leave()
        with pytest.raises(fanin.FaninError, match="closed"):
            e.step(good)
        e.close()  # a no-op once left

        asp = dev.create(job_spec(2, sync="asp"))
        with fanin.connect(dev.nats, asp["credentials"]) as ca:
            with pytest.raises(fanin.FaninError, match="asp"):
                ca.elastic(asp["spec"]["id"])
