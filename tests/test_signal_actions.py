"""Caffe's solver actions (Solver::GetRequestedAction, tools/caffe.cpp's -sigint_effect and
-sighup_effect): a snapshot asked for is written after the iteration, a stop ends training
after it with the final snapshot and no final test, requests during a test are taken per
batch; ``minicaffe train`` turns SIGINT (stop) and SIGHUP (snapshot) into them."""
import os
import signal
import subprocess
import sys
import time

import pytest

from minicaffe.cli import SignalActions
from minicaffe.proto import caffe_pb2, parse_text
from minicaffe.solver import Solver

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

NET = """
name: "signals"
layer { name: "data" type: "DummyData" top: "data" top: "label"
        dummy_data_param { shape { dim: 4 dim: 6 } shape { dim: 4 }
                           data_filler { type: "gaussian" std: 1 }
                           data_filler { type: "constant" value: 1 } } }
layer { name: "ip" type: "InnerProduct" bottom: "data" top: "ip"
        inner_product_param { num_output: 3 weight_filler { type: "gaussian" std: 0.3 } } }
layer { name: "loss" type: "SoftmaxWithLoss" bottom: "ip" bottom: "label" top: "loss" }
"""


def solver(prefix, max_iter=20, **extra):
    p = caffe_pb2.SolverParameter(base_lr=0.01, lr_policy="fixed", max_iter=max_iter,
                                  display=0, snapshot_prefix=str(prefix), random_seed=1,
                                  **extra)
    p.net_param.CopyFrom(parse_text(NET, caffe_pb2.NetParameter))
    return Solver(p, mode="CPU", verbose=False)


def script(**at):
    """An action function: ``at[i]`` at its i-th call (0-based), "none" otherwise."""
    calls = []

    def fn():
        calls.append(len(calls))
        return at.get(f"c{len(calls) - 1}", "none")
    return fn, calls


def snapshots(tmp_path):
    return sorted(f for f in os.listdir(tmp_path) if f.endswith(".solverstate"))


def test_stop_ends_after_the_iteration_with_the_final_snapshot(tmp_path):
    s = solver(tmp_path / "s", snapshot=4)
    s.action_function, calls = script(c2="snapshot", c6="stop")
    tested = []
    s.test_all = lambda: tested.append(s.iter)
    s.solve()
    # asked after iterations 1..7: a snapshot at 3, the periodic one at 4, stop at 7
    assert s.iter == 7 and len(calls) == 7 and s.requested_early_exit
    assert snapshots(tmp_path) == ["s_iter_3.solverstate", "s_iter_4.solverstate",
                                   "s_iter_7.solverstate"]
    assert tested == []                  # no final test after a stop


def test_without_snapshot_after_train_a_stop_writes_nothing_more(tmp_path):
    s = solver(tmp_path / "s", snapshot_after_train=False)
    s.action_function, _ = script(c1="stop")
    s.solve()
    assert s.iter == 2 and snapshots(tmp_path) == []


def test_requests_while_testing_are_taken_per_batch(tmp_path):
    s = solver(tmp_path / "s", max_iter=10, test_interval=5, test_initialization=False)
    s.param.test_iter.append(3)
    s.param.test_net_param.add().CopyFrom(parse_text(NET, caffe_pb2.NetParameter))
    s = Solver(s.param, mode="CPU", verbose=False)
    batches = []
    s.test_nets[0].forward_from_to = lambda *a, **k: batches.append(s.iter) or 0.0
    # calls 0-4: after iterations 1-5; the test at 5 asks before each batch: snapshot, then stop
    s.action_function, _ = script(c5="snapshot", c7="stop")
    s.solve()
    assert batches == [5]                # one batch, then the stop; the test reports nothing
    assert s.iter == 5 and s.requested_early_exit
    assert snapshots(tmp_path) == ["s_iter_5.solverstate"]   # the asked one (the final: same)


def test_a_bad_action_is_refused(tmp_path):
    s = solver(tmp_path / "s")
    s.action_function = lambda: "pause"
    with pytest.raises(ValueError, match="'pause'"):
        s.step(1)


def test_signal_actions_sighup_first_and_second_ctrl_c_interrupts():
    a = SignalActions("stop", "snapshot")
    assert a() == "none"
    a._got(signal.SIGINT, None)
    a._got(signal.SIGHUP, None)
    assert [a(), a(), a()] == ["snapshot", "stop", "none"]
    a._got(signal.SIGINT, None)
    with pytest.raises(KeyboardInterrupt):
        a._got(signal.SIGINT, None)
    quiet = SignalActions("none", "none")
    quiet._got(signal.SIGHUP, None)
    assert quiet() == "none"


@pytest.mark.skipif(not hasattr(signal, "SIGHUP"), reason="POSIX signals")
def test_minicaffe_train_snapshots_on_sighup_and_stops_on_sigint(tmp_path):
    net = tmp_path / "net.prototxt"
    net.write_text(NET)
    prefix = tmp_path / "run"
    cmd = [sys.executable, "-m", "minicaffe", "train", str(net), "--cpu", "--max-iter",
           "1000000", "--display", "0", "--snapshot-prefix", str(prefix)]
    proc = subprocess.Popen(cmd, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            text=True)
    try:
        deadline = time.monotonic() + 60
        line = ""
        while "Solving" not in line and time.monotonic() < deadline:
            line = proc.stdout.readline()
        time.sleep(0.5)
        proc.send_signal(signal.SIGHUP)
        while not [f for f in os.listdir(tmp_path) if f.endswith(".solverstate")]:
            assert time.monotonic() < deadline and proc.poll() is None
            time.sleep(0.05)
        proc.send_signal(signal.SIGINT)
        out, _ = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 0, out
    assert "Optimization stopped early." in out and "SIGINT: stop after this iteration" in out
    states = sorted((int(f.split("_iter_")[1].split(".")[0]), f)
                    for f in os.listdir(tmp_path) if f.endswith(".solverstate"))
    assert len(states) == 2 and states[0][0] < states[1][0] < 1000000
    for _, f in states:
        assert os.path.exists(tmp_path / f.replace(".solverstate", ".caffemodel"))
