"""scripts/launch_ps.py: shards and CPU workers on this node, and --resume auto."""
import subprocess
import sys

import numpy as np

from ps_helpers import ROOT, caffemodel_params, env, write_solver

# Random data drawn from the host RNG, which every worker's snapshot restores.
DUMMY_NET = """
name: "tiny_dummy"
layer {{ name: "data" type: "DummyData" top: "data" top: "target"
        dummy_data_param {{ shape {{ dim: {k} dim: 4 }} shape {{ dim: {k} dim: 2 }}
                            data_filler {{ type: "gaussian" std: 1 }}
                            data_filler {{ type: "uniform" min: -1 max: 1 }} }} }}
layer {{ name: "ip1" type: "InnerProduct" bottom: "data" top: "ip1"
        inner_product_param {{ num_output: 6 weight_filler {{ type: "xavier" }} }} }}
layer {{ name: "relu" type: "ReLU" bottom: "ip1" top: "ip1" }}
layer {{ name: "ip2" type: "InnerProduct" bottom: "ip1" top: "ip2"
        inner_product_param {{ num_output: 2 weight_filler {{ type: "xavier" }} }} }}
layer {{ name: "loss" type: "EuclideanLoss" bottom: "ip2" bottom: "target" top: "loss" }}
"""


def launch(*args, timeout=60):
    cmd = [sys.executable, str(ROOT / "scripts" / "launch_ps.py"), *args]
    return subprocess.run(cmd, cwd=ROOT, env=env(), capture_output=True, text=True,
                          timeout=timeout)


def test_launch_then_resume_auto_reproduces_the_run(tmp_path):
    solver = write_solver(tmp_path, "d", DUMMY_NET, k=4, max_iter=10, snapshot=5)
    base = ["--solver", solver, "--shards", "2", "--cpu-workers", "2", "--timeout", "10",
            "--log-dir", str(tmp_path / "logs")]
    r = launch(*base)
    assert r.returncode == 0, r.stdout + r.stderr
    for name in ("[shard0]", "[shard1]", "[rank0]", "[rank1]"):
        assert name in r.stdout
    snap = tmp_path / "snap"
    first = caffemodel_params(snap / "d_iter_10.caffemodel")
    for f in snap.glob("*_iter_10.*"):
        f.unlink()
    r = launch(*base, "--resume", "auto")
    assert r.returncode == 0, r.stdout + r.stderr
    assert "resuming every local process from iteration 5" in r.stdout
    again = caffemodel_params(snap / "d_iter_10.caffemodel")
    for layer in first:
        for a, b in zip(first[layer], again[layer]):
            np.testing.assert_array_equal(a, b)
    assert (tmp_path / "logs" / "shard1.log").read_text().count("restored") == 1


def test_launch_prints_the_other_nodes_commands(tmp_path):
    solver = write_solver(tmp_path, "p", DUMMY_NET, k=4)
    r = launch("--solver", solver, "--shards", "2", "--cpu-workers", "2", "--nodes", "3",
               "--bind", "0.0.0.0", "--advertise", "node0", "--port-base", "7000", "--dry-run")
    assert r.returncode == 0, r.stderr
    out = r.stdout
    assert "--bind tcp://0.0.0.0:7000" in out and "--world-size 6" in out
    assert "# on node 2:" in out and "--rank 5 --world-size 6" in out
    assert "--ps tcp://node0:7000,tcp://node0:7001" in out
    r = launch("--solver", solver, "--cpu-workers", "2", "--nodes", "2", "--dry-run")
    assert r.returncode != 0 and "loopback" in r.stderr


def test_flags_after_a_double_dash_go_to_every_workers_train(tmp_path):
    """`launch_ps.py ... -- --max-iter 3 --swap naive`: each local rank's command and the
    commands printed for the other nodes end with those flags; the launcher's own options
    before the `--` stay its own."""
    solver = write_solver(tmp_path, "f", DUMMY_NET, k=4)
    r = launch("--solver", solver, "--cpu-workers", "2", "--nodes", "2", "--bind", "0.0.0.0",
               "--advertise", "node0", "--port-base", "7100", "--dry-run", "--",
               "--max-iter", "3", "--swap", "naive")
    assert r.returncode == 0, r.stderr
    workers = [line for line in r.stdout.splitlines() if " train " in line]
    assert len(workers) == 4, r.stdout          # two here, two printed for node 1
    assert all("--max-iter 3 --swap naive" in line for line in workers), r.stdout
    assert "--rank 3 --world-size 4" in r.stdout


def test_launch_with_shared_memory_trains_as_through_the_sockets(tmp_path):
    """One node: the local workers run --ps-shm unless --no-shm; the same parameters both
    ways."""
    shm = tmp_path / "shm"
    shm.mkdir()
    e = env()
    e["MINICAFFE_PS_SHM_DIR"] = str(shm)
    got, solvers = {}, {}
    for name, extra in (("plain", ["--no-shm"]), ("shm", [])):
        solver = solvers[name] = write_solver(tmp_path, name, DUMMY_NET, k=4, max_iter=6)
        cmd = [sys.executable, str(ROOT / "scripts" / "launch_ps.py"), "--solver", solver,
               "--shards", "2", "--cpu-workers", "2", "--timeout", "10",
               "--log-dir", str(tmp_path / f"{name}_logs"), *extra]
        r = subprocess.run(cmd, cwd=ROOT, env=e, capture_output=True, text=True, timeout=60)
        assert r.returncode == 0, r.stdout + r.stderr
        got[name] = caffemodel_params(tmp_path / "snap" / f"{name}_iter_6.caffemodel")
        assert ("through shared memory (--ps-shm" in r.stdout) == (name == "shm")
    assert "shared memory: parameters in" in (tmp_path / "shm_logs" / "shard0.log").read_text()
    assert "shared memory" not in (tmp_path / "plain_logs" / "shard0.log").read_text()
    for layer in got["plain"]:
        for a, b in zip(got["plain"][layer], got["shm"][layer]):
            np.testing.assert_array_equal(a, b)
    assert list(shm.iterdir()) == []
    r = launch("--solver", solvers["plain"], "--cpu-workers", "2",
               "--nodes", "2", "--bind", "0.0.0.0", "--shm", "--dry-run")
    assert r.returncode != 0 and "one node" in r.stderr
    # the default: on one node without link emulation only
    dry = ["--solver", solvers["plain"], "--cpu-workers", "2", "--dry-run"]
    r = subprocess.run([sys.executable, str(ROOT / "scripts" / "launch_ps.py"), *dry], cwd=ROOT,
                       env=e, capture_output=True, text=True, timeout=60)
    workers = [ln for ln in r.stdout.splitlines() if "minicaffe train" in ln]
    assert r.returncode == 0 and len(workers) == 2, r.stdout + r.stderr
    assert all(ln.endswith(" --ps-shm") for ln in workers), r.stdout
    for other in (["--link-latency-ms", "1"], ["--nodes", "2", "--bind", "0.0.0.0"]):
        r = subprocess.run([sys.executable, str(ROOT / "scripts" / "launch_ps.py"), *dry, *other],
                           cwd=ROOT, env=e, capture_output=True, text=True, timeout=60)
        assert r.returncode == 0 and "--ps-shm" not in r.stdout, r.stdout + r.stderr


def test_a_worker_that_fails_before_joining_ends_the_run_within_seconds(tmp_path):
    """Workers that cannot start (here: a missing -weights file, standing for any failure
    before the join) tell no shard; the launcher stops the shards soon after (SIGTERM after
    its 5 s grace), not after the shards' --timeout for the join (60 s here, 80 s of waiting
    before), and exits with a worker's status."""
    import time
    solver = write_solver(tmp_path, "f", DUMMY_NET, k=4, max_iter=10)
    t0 = time.monotonic()
    r = launch("--solver", solver, "--shards", "1", "--cpu-workers", "2", "--timeout", "60",
               "--", "--weights", str(tmp_path / "missing.caffemodel"), timeout=120)
    took = time.monotonic() - t0
    assert r.returncode != 0
    assert "[launcher] rank0 failed" in r.stdout or "[launcher] rank1 failed" in r.stdout
    assert "missing.caffemodel" in r.stdout + r.stderr
    assert took < 40, f"the launcher took {took:.0f} s (shards' join timeout 60 s)"
