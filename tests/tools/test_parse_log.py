"""parse_log (Caffe's tools/extra/parse_log.py) on a minicaffe training log made here and
on an excerpt of a Caffe log as Caffe prints it."""
import csv
import re

import pytest

from minicaffe.cli import main as minicaffe_main
from minicaffe.tools.parse_log import main, parse_log

NET = """
name: "tiny"
layer { name: "data" type: "DummyData" top: "data" top: "label"
        dummy_data_param { shape { dim: 4 dim: 5 } shape { dim: 4 }
                           data_filler { type: "gaussian" std: 1 }
                           data_filler { type: "constant" value: 1 } } }
layer { name: "ip" type: "InnerProduct" bottom: "data" top: "ip"
        inner_product_param { num_output: 3 weight_filler { type: "xavier" } } }
layer { name: "loss" type: "SoftmaxWithLoss" bottom: "ip" bottom: "label" top: "loss" }
layer { name: "acc" type: "Accuracy" bottom: "ip" bottom: "label" top: "acc"
        include { phase: TEST } }
"""

# An excerpt of a BVLC Caffe log (LeNet on MNIST), as Caffe prints it, with: a line that
# is not glog's after the first iteration (skipped), a run over New Year (the year goes up
# where the month goes down), values in exponent notation.
CAFFE_LOG = """\
I1231 23:59:58.470789  3155 caffe.cpp:218] Using GPUs 0
I1231 23:59:58.731487  3155 solver.cpp:317] Solving LeNet
I1231 23:59:58.731495  3155 solver.cpp:318] Learning Rate Policy: inv
I1231 23:59:58.732223  3155 solver.cpp:385] Iteration 0, Testing net (#0)
I1231 23:59:59.106451  3155 solver.cpp:454]     Test net output #0: accuracy = 0.0785
I1231 23:59:59.106490  3155 solver.cpp:454]     Test net output #1: loss = 2.33889 (* 1 = 2.33889 loss)
I1231 23:59:59.125149  3155 solver.cpp:218] Iteration 0 (-8.0787e-27 iter/s, 1.39382s/100 iters), loss = 2.31869
I1231 23:59:59.125192  3155 solver.cpp:237]     Train net output #0: loss = 2.31869 (* 1 = 2.31869 loss)
I1231 23:59:59.125216  3155 sgd_solver.cpp:105] Iteration 0, lr = 0.01
Stopped at a breakpoint; resuming
I0101 00:00:00.848232  3155 solver.cpp:218] Iteration 100 (58.0343 iter/s, 1.72312s/100 iters), loss = 0.213413
I0101 00:00:00.848273  3155 solver.cpp:237]     Train net output #0: loss = 0.213413 (* 1 = 0.213413 loss)
I0101 00:00:00.848281  3155 sgd_solver.cpp:105] Iteration 100, lr = 0.00992565
I0101 00:00:02.570105  3155 solver.cpp:218] Iteration 200 (58.0603 iter/s, 1.72235s/100 iters), loss = 8.5e-05
I0101 00:00:02.570147  3155 solver.cpp:237]     Train net output #0: loss = 8.5e-05 (* 1 = 8.5e-05 loss)
I0101 00:00:02.570154  3155 sgd_solver.cpp:105] Iteration 200, lr = 1e-05
I0101 00:00:02.731024  3155 solver.cpp:385] Iteration 250, Testing net (#0)
I0101 00:00:03.907183  3155 solver.cpp:454]     Test net output #0: accuracy = 0.9724
I0101 00:00:03.907219  3155 solver.cpp:454]     Test net output #1: loss = 0.0873307 (* 1 = 0.0873307 loss)
I0101 00:00:04.292111  3155 solver.cpp:218] Iteration 300 (58.1 iter/s, 1.72s/100 iters), loss = 0.15
I0101 00:00:04.292150  3155 solver.cpp:237]     Train net output #0: loss = 0.15 (* 1 = 0.15 loss)
I0101 00:00:04.292158  3155 sgd_solver.cpp:105] Iteration 300, lr = 0.00978075
I0101 00:00:04.300001  3155 solver.cpp:385] Iteration 300, Testing net (#0)
I0101 00:00:04.500002  3155 solver.cpp:454]     Test net output #0: accuracy = 0.98
"""


def read_csv(path, delimiter=","):
    with open(path, newline="") as f:
        return list(csv.reader(f, delimiter=delimiter))


def test_parse_log_of_a_minicaffe_training_run(tmp_path, capsys):
    net = tmp_path / "net.prototxt"
    net.write_text(NET)
    solver = tmp_path / "solver.prototxt"
    solver.write_text(f'net: "{net}"\nbase_lr: 0.1\nlr_policy: "step"\ngamma: 0.5\n'
                      'stepsize: 2\nmax_iter: 6\ndisplay: 2\ntest_iter: 2\ntest_interval: 3\n'
                      'snapshot_after_train: false\nrandom_seed: 1\nsolver_mode: CPU\n')
    capsys.readouterr()
    assert minicaffe_main(["train", "--solver", str(solver)]) == 0
    log = tmp_path / "train.log"
    log.write_text(capsys.readouterr().err)
    text = log.read_text()
    train_loss = [float(v) for v in re.findall(r"Train net output #0: loss = (\S+)", text)]
    test_acc = [float(v) for v in re.findall(r"Test net output #0: acc = (\S+)", text)]

    train, test = parse_log(log)
    assert [list(r) for r in train[:1] + test[:1]] == [
        ["NumIters", "Seconds", "LearningRate", "loss"],
        ["NumIters", "Seconds", "LearningRate", "acc", "loss"]]
    assert [r["NumIters"] for r in train] == [0.0, 2.0, 4.0]
    assert [r["loss"] for r in train] == train_loss
    # the rate of the previous display (lr is logged after the outputs); the first row
    # takes the second's
    assert [r["LearningRate"] for r in train] == [0.1, 0.1, 0.05]
    assert [r["NumIters"] for r in test] == [0.0, 3.0, 6.0]
    assert [r["acc"] for r in test] == test_acc
    assert [r["LearningRate"] for r in test] == [0.05, 0.05, 0.025]
    seconds = [r["Seconds"] for r in train]
    assert 0 <= seconds[0] <= seconds[1] <= seconds[2] < 60

    assert main([str(log), str(tmp_path), "--verbose"]) == 0
    assert capsys.readouterr().out.splitlines() == [f"Wrote {log}.train", f"Wrote {log}.test"]
    rows = read_csv(f"{log}.test")
    assert rows[0] == ["NumIters", "Seconds", "LearningRate", "acc", "loss"]
    assert [float(v) for v in rows[2]] == list(test[1].values())
    assert open(f"{log}.train", newline="").read().count("\r\n") == 4  # csv's excel dialect


def test_parse_log_of_a_caffe_log(tmp_path, capsys):
    log = tmp_path / "caffe.INFO"
    log.write_text(CAFFE_LOG)
    assert main([str(log), str(tmp_path), "--delimiter", ";"]) == 0
    # each row: the time of its first output line since 'Solving' (over New Year), and the
    # last 'lr = ' before it
    assert capsys.readouterr().out == ""
    train = read_csv(tmp_path / "caffe.INFO.train", ";")
    assert train == [["NumIters", "Seconds", "LearningRate", "loss"],
                     ["0.0", "0.393705", "0.01", "2.31869"],
                     ["100.0", "2.116786", "0.01", "0.213413"],
                     ["200.0", "3.83866", "0.00992565", "8.5e-05"],
                     ["300.0", "5.560663", "1e-05", "0.15"]]
    # the test at 300 is cut short (no loss): dropped, as Caffe's script drops it
    test = read_csv(tmp_path / "caffe.INFO.test", ";")
    assert test == [["NumIters", "Seconds", "LearningRate", "accuracy", "loss"],
                    ["0.0", "0.374964", "1e-05", "0.0785", "2.33889"],
                    ["250.0", "5.175696", "1e-05", "0.9724", "0.0873307"]]


def test_parse_log_keeps_a_single_row_and_skips_empty_tables(tmp_path, capsys):
    """One test and no train outputs: Caffe's script writes the first row only when a
    second iteration's begin, so it writes nothing; here the one row is written, and the
    empty table is not (--verbose says so)."""
    log = tmp_path / "one.log"
    log.write_text("\n".join(CAFFE_LOG.splitlines()[1:6]) + "\n")
    assert main([str(log), str(tmp_path), "--verbose"]) == 0
    assert capsys.readouterr().out.splitlines() == [
        f"Not writing {log}.train; no lines to write", f"Wrote {log}.test"]
    assert read_csv(f"{log}.test") == [["NumIters", "Seconds", "LearningRate", "accuracy",
                                        "loss"], ["0.0", "0.374964", "nan", "0.0785",
                                                  "2.33889"]]


def test_parse_log_errors(tmp_path, capsys):
    log = tmp_path / "x.log"
    log.write_text("I0101 00:00:00.000000  1 solver.cpp:1] Iteration 0, lr = 0.1\n")
    assert main([str(log), str(tmp_path)]) == 1
    assert "no 'Solving' line" in capsys.readouterr().err
    assert main([str(tmp_path / "missing.log"), str(tmp_path)]) == 1
    with pytest.raises(SystemExit):
        main([str(log)])
