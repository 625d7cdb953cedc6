"""The `minicaffe` command: train/test/time/device_query and its error lines."""
import os

import pytest

from minicaffe.cli import main

NET = """
name: "tiny"
layer { name: "data" type: "DummyData" top: "data" top: "label"
        dummy_data_param { shape { dim: 4 dim: 1 dim: 6 dim: 6 } shape { dim: 4 }
                           data_filler { type: "gaussian" std: 1 } data_filler { type: "constant" value: 1 } } }
layer { name: "conv" type: "Convolution" bottom: "data" top: "conv"
        convolution_param { num_output: 3 kernel_size: 3 weight_filler { type: "xavier" } } }
layer { name: "pool" type: "Pooling" bottom: "conv" top: "pool" pooling_param { pool: MAX kernel_size: 2 stride: 2 } }
layer { name: "ip" type: "InnerProduct" bottom: "pool" top: "ip"
        inner_product_param { num_output: 3 weight_filler { type: "xavier" } } }
layer { name: "loss" type: "SoftmaxWithLoss" bottom: "ip" bottom: "label" top: "loss" }
layer { name: "acc" type: "Accuracy" bottom: "ip" bottom: "label" top: "acc" include { phase: TEST } }
"""


@pytest.fixture
def net_file(tmp_path):
    f = tmp_path / "tiny.prototxt"
    f.write_text(NET)
    return f


def test_train_a_net_with_default_solver(net_file, tmp_path, capsys):
    prefix = str(tmp_path / "snap" / "tiny")
    rc = main(["train", str(net_file), "--cpu", "--max-iter", "6", "--display", "2",
               "--snapshot-prefix", prefix, "--random-seed", "3"])
    assert rc == 0
    err = capsys.readouterr().err
    assert "Iteration 2" in err and "loss = " in err and "Optimization Done." in err
    assert os.path.exists(prefix + "_iter_6.caffemodel")
    assert os.path.exists(prefix + "_iter_6.solverstate")


def test_train_solver_resume_and_test(net_file, tmp_path, capsys):
    solver = tmp_path / "solver.prototxt"
    solver.write_text(f'net: "{net_file}"\nbase_lr: 0.01\nmax_iter: 4\nlr_policy: "fixed"\n'
                      f'display: 1\nsnapshot: 2\nsnapshot_prefix: "{tmp_path}/s"\n'
                      'solver_mode: CPU\nrandom_seed: 1\ntest_iter: 2\ntest_interval: 2\n')
    assert main(["train", "-solver", str(solver)]) == 0
    assert main(["train", "--solver", str(solver), "--snapshot",
                 f"{tmp_path}/s_iter_2.solverstate"]) == 0
    err = capsys.readouterr().err
    assert "Restoring previous solver status" in err
    assert "Test net output #0: acc = " in err
    assert main(["test", "--model", str(net_file), "--weights", f"{tmp_path}/s_iter_4.caffemodel",
                 "--iterations", "2"]) == 0
    err = capsys.readouterr().err
    # caffe test's lines: per batch, the mean loss, the means (a loss output with its weight)
    assert "Batch 0, acc = " in err and "Batch 1, loss = " in err and "Loss: " in err
    batch_losses = [float(ln.rsplit("= ", 1)[1]) for ln in err.splitlines()
                    if ", loss = " in ln and "Batch " in ln]
    mean = [ln for ln in err.splitlines() if ln.split("] ", 1)[-1].startswith("loss = ")]
    assert len(batch_losses) == 2 and len(mean) == 1
    assert f"(* 1 = {float(mean[0].split('= ')[1].split(' ')[0]):.6g} loss)" in mean[0]
    loss_line = [ln for ln in err.splitlines() if "Loss: " in ln][0]
    assert abs(float(loss_line.rsplit(" ", 1)[1]) - sum(batch_losses) / 2) < 1e-4


def test_time_reports_each_layer(net_file, capsys):
    assert main(["time", "--model", str(net_file), "--iterations", "2"]) == 0
    err = capsys.readouterr().err
    assert "conv" in err and "forward:" in err and "Average Forward pass" in err


def test_bad_prototxt_is_one_clear_line(tmp_path, capsys):
    bad = tmp_path / "bad.prototxt"
    bad.write_text('name: "x"\nlayer {\n  name: "a"\n  tpye: "ReLU"\n}\n')
    assert main(["time", "--model", str(bad)]) == 1
    err = capsys.readouterr().err
    assert f"{bad}:4:" in err and "Traceback" not in err


def test_missing_solver_file(capsys):
    assert main(["train", "--solver", "/nonexistent/solver.prototxt"]) == 1
    assert "/nonexistent/solver.prototxt" in capsys.readouterr().err


def test_weights_and_snapshot_are_exclusive(net_file, capsys):
    assert main(["train", str(net_file), "--weights", "a", "--snapshot", "b"]) == 2
    assert "not both" in capsys.readouterr().err


def test_finetune_shape_mismatch_names_layer(net_file, tmp_path, capsys):
    prefix = str(tmp_path / "m")
    assert main(["train", str(net_file), "--cpu", "--max-iter", "1", "--snapshot-prefix", prefix]) == 0
    other = tmp_path / "other.prototxt"
    other.write_text(NET.replace("num_output: 3 kernel_size", "num_output: 4 kernel_size"))
    rc = main(["train", str(other), "--cpu", "--max-iter", "1", "--weights",
               prefix + "_iter_1.caffemodel", "--snapshot-prefix", prefix + "2"])
    assert rc == 1
    assert "layer 'conv'" in capsys.readouterr().err


def test_device_query_without_gpu(capsys):
    from minicaffe.backend import gpu_available
    assert main(["device_query"]) == 0
    out = capsys.readouterr().out
    assert ("No CUDA device" in out) != gpu_available()


STAGED = """
name: "staged"
layer { name: "data" type: "DummyData" top: "data" top: "label"
        dummy_data_param { shape { dim: 4 dim: 5 } shape { dim: 4 }
                           data_filler { type: "gaussian" std: 1 }
                           data_filler { type: "constant" value: 1 } } }
layer { name: "ip" type: "InnerProduct" bottom: "data" top: "ip"
        inner_product_param { num_output: 3 weight_filler { type: "xavier" } } }
layer { name: "loss" type: "SoftmaxWithLoss" bottom: "ip" bottom: "label" top: "loss"
        exclude { stage: "deploy" } }
layer { name: "prob" type: "Softmax" bottom: "ip" top: "prob" include { stage: "deploy" } }
layer { name: "deep" type: "Softmax" bottom: "ip" top: "deep" include { min_level: 2 } }
"""


def test_level_and_stage_choose_the_layers_as_caffe_flags(tmp_path, capsys):
    """tools/caffe.cpp: -stage (comma-separated) and -level build the net's NetState; train
    sets them on the solver's train_state (-level replacing the file's)."""
    net = tmp_path / "staged.prototxt"
    net.write_text(STAGED)
    assert main(["test", "--model", str(net), "--iterations", "1", "--stage", "deploy,x",
                 "-level", "2"]) == 0
    err = capsys.readouterr().err
    assert "Batch 0, prob = " in err and "Batch 0, deep = " in err and "loss = " not in err
    assert main(["test", "--model", str(net), "--iterations", "1"]) == 0
    err = capsys.readouterr().err
    assert "Batch 0, loss = " in err and "prob" not in err and "deep" not in err
    solver = tmp_path / "solver.prototxt"
    solver.write_text(f'net: "{net}"\nbase_lr: 0.01\nmax_iter: 1\nlr_policy: "fixed"\n'
                      f'display: 1\nsnapshot_prefix: "{tmp_path}/s"\nsolver_mode: CPU\n'
                      'train_state { level: 2 }\n')
    assert main(["train", "--solver", str(solver)]) == 0      # -level 0 replaces the file's 2
    assert "deep" not in capsys.readouterr().err
    assert main(["train", "--solver", str(solver), "--level", "3"]) == 0
    assert "Train net output #1: deep" in capsys.readouterr().err
    assert main(["time", "--model", str(net), "--iterations", "1", "--stage", "deploy"]) == 0
    assert "prob" in capsys.readouterr().err
