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


def test_solver_flags_replace_the_solver_files_fields(net_file, tmp_path, capsys):
    """`train -solver S --max-iter N ...`: each solver flag given replaces the file's field
    and says so (they were silently ignored with -solver); the file's other fields stay."""
    solver = tmp_path / "solver.prototxt"
    solver.write_text(f'net: "{net_file}"\nbase_lr: 0.01\nmax_iter: 50\nlr_policy: "fixed"\n'
                      f'display: 10\nsnapshot_prefix: "{tmp_path}/s"\nsolver_mode: CPU\n'
                      'random_seed: 1\ntest_iter: 7\ntest_interval: 100\n')
    assert main(["train", "-solver", str(solver), "--max-iter", "3", "--display", "1",
                 "--test-iter", "1", "--test-interval", "2", "--base-lr", "0.02"]) == 0
    err = capsys.readouterr().err
    assert "max_iter: 3 from the command line (the solver file has 50)" in err
    assert "base_lr: 0.02 from the command line (the solver file has 0.01)" in err
    assert "test_iter: 1 from the command line (the solver file has [7])" in err
    assert "Iteration 2, Testing net (#0)" in err and "Iteration 1, lr = 0.02" in err
    assert os.path.exists(f"{tmp_path}/s_iter_3.caffemodel")
    assert not os.path.exists(f"{tmp_path}/s_iter_50.caffemodel")
    # without flags the file's fields stand, and nothing is logged as overridden
    solver.write_text(solver.read_text().replace("max_iter: 50", "max_iter: 2"))
    assert main(["train", "-solver", str(solver)]) == 0
    assert "from the command line" not in capsys.readouterr().err


def test_the_training_log_has_glogs_fields_for_caffes_log_parsers(net_file, tmp_path, capsys):
    """Caffe's tools/extra/parse_log.sh takes values by their field number in glog's line
    (``I1128 23:43:49.437082  7456 solver.cpp:218] ...``: severity and date, time, thread,
    file:line): the test output is field 11, the learning rate field 9; parse_log.py reads
    the date from the first two fields."""
    import re
    solver = tmp_path / "solver.prototxt"
    solver.write_text(f'net: "{net_file}"\nbase_lr: 0.01\nmax_iter: 2\nlr_policy: "fixed"\n'
                      f'display: 1\nsnapshot_prefix: "{tmp_path}/s"\nsolver_mode: CPU\n'
                      'test_iter: 1\ntest_interval: 2\n')
    assert main(["train", "-solver", str(solver)]) == 0
    lines = capsys.readouterr().err.splitlines()
    prefix = re.compile(r"^[IWEF]\d{4} \d\d:\d\d:\d\d\.\d{6} +\d+ [\w.]+:\d+\] ")
    assert lines and all(prefix.match(ln) for ln in lines), lines[:3]
    test_out = [ln.split() for ln in lines if "Test net output #0" in ln]
    lr = [ln.split() for ln in lines if re.search(r"Iteration \d+, lr = ", ln)]
    assert test_out and lr
    assert all(0.0 <= float(f[10]) <= 1.0 for f in test_out)       # awk '{print $11}'
    assert all(float(f[8]) == pytest.approx(0.01) for f in lr)      # awk '{print $9}'
    month, day = int(lines[0][1:3]), int(lines[0].split()[0][3:])
    assert 1 <= month <= 12 and 1 <= day <= 31


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


def test_a_solver_file_given_as_the_net_says_to_pass_it_with_solver(net_file, tmp_path, capsys):
    """`minicaffe train solver.prototxt` (the file meant for --solver, which names its net)
    is a usage error that says so, not a net parser's error on `base_lr`."""
    solver = tmp_path / "solver.prototxt"
    solver.write_text(f'net: "{net_file}"\nbase_lr: 0.01\nlr_policy: "fixed"\nmax_iter: 1\n')
    assert main(["train", str(solver), "--cpu"]) == 2
    err = capsys.readouterr().err
    assert f"{solver} is a solver definition, not a net: train it with --solver {solver}" in err
    assert main(["train", "--solver", str(solver), "--cpu"]) == 0   # as it says


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


# ------------------------------------------------ Caffe's command lines (tools/caffe.cpp)
def _log_lines(err):
    """The messages of glog-shaped lines (``I1121 12:00:00.123456  7456 solver.py:218] msg``)."""
    return [ln.split("] ", 1)[1] for ln in err.splitlines() if "] " in ln]


def _parse(argv):
    from minicaffe.cli import _caffe_defaults, _command_first, build_parser
    args = build_parser().parse_args(_command_first(argv))
    _caffe_defaults(args)
    return args


FLAG_VALUES = {"gpu": "1", "solver": "s.prototxt", "model": "m.prototxt", "phase": "TEST",
               "level": "2", "stage": "a,b", "snapshot": "x.solverstate",
               "weights": "w.caffemodel", "iterations": "7", "sigint_effect": "none",
               "sighup_effect": "stop"}


@pytest.mark.parametrize("command", ["train", "test", "time", "device_query"])
@pytest.mark.parametrize("form", ["-f v", "-f=v", "--f v", "--f=v"])
def test_every_caffe_flag_is_accepted_by_every_command(command, form):
    """gflags flags are global: each command takes all of Caffe's flags, in each spelling."""
    argv = [command]
    for name, value in FLAG_VALUES.items():
        flag = ("--" if form.startswith("--") else "-") + name
        argv += [f"{flag}={value}"] if "=" in form else [flag, value]
    args = _parse(argv)
    for name, value in FLAG_VALUES.items():
        assert str(getattr(args, name)) == value, name


@pytest.mark.parametrize("command", ["train", "test", "time", "device_query"])
def test_caffe_defaults(command):
    args = _parse([command])
    assert (args.gpu, args.solver, args.model, args.snapshot, args.weights) == (None,) * 5
    assert (args.level, args.stage, args.iterations) == (0, "", 50)
    assert (args.sigint_effect, args.sighup_effect) == ("stop", "snapshot")
    assert args.phase == {"test": "TEST", "time": "TRAIN"}.get(command)


def test_flags_before_the_command_and_the_last_of_a_repeated_flag(tmp_path, capsys):
    """gflags reads flags anywhere on the line, and a flag given twice keeps the last."""
    assert _parse(["-gpu", "0", "-iterations=3", "time", "-model", "m"]).iterations == 3
    net = tmp_path / "staged.prototxt"
    net.write_text(STAGED)
    assert main(["-iterations", "1", "test", "-model", str(net), "-stage", "deploy",
                 "-stage", "x"]) == 0
    err = capsys.readouterr().err
    assert "Batch 0, loss = " in err and "prob" not in err


def test_flags_a_command_does_not_read_are_ignored(net_file, tmp_path, capsys):
    """`caffe time -weights W` times the filler weights; `caffe train -iterations 5` trains
    max_iter iterations: minicaffe runs the same, with a note per ignored flag."""
    assert main(["time", "-model", str(net_file), "-iterations", "1", "-weights", "nowhere",
                 "-snapshot", "nowhere", "-solver", "nowhere", "-sigint_effect", "none"]) == 0
    lines = _log_lines(capsys.readouterr().err)
    for flag in ("weights", "snapshot", "solver", "sigint_effect"):
        assert f"-{flag} is not used by time: ignored, as Caffe ignores it" in lines
    solver = tmp_path / "solver.prototxt"
    solver.write_text(f'net: "{net_file}"\nbase_lr: 0.01\nmax_iter: 2\nlr_policy: "fixed"\n'
                      f'display: 1\nsnapshot_prefix: "{tmp_path}/s"\nsolver_mode: CPU\n')
    assert main(["train", "-solver", str(solver), "-iterations", "5", "-model", "nowhere",
                 "-phase", "TEST"]) == 0
    err = capsys.readouterr().err
    assert "Iteration 2" in err and "Iteration 5" not in err
    assert "-iterations is not used by train: ignored, as Caffe ignores it" in _log_lines(err)
    assert main(["device_query", "-model", "m", "-iterations", "3"]) == 0


def test_caffe_checks_name_what_is_wrong(net_file, capsys):
    """tools/caffe.cpp's CHECKs, with Caffe's words; exit status 2 (Caffe aborts)."""
    cases = [(["train"], "Need a solver definition to train."),
             (["train", "-solver", "s", "-weights", "w", "-snapshot", "x"],
              "Give a snapshot to resume training or weights to finetune but not both."),
             (["test", "-weights", "w"], "Need a model definition to score."),
             (["time", "-iterations", "1"], "Need a model definition to time."),
             (["time", "-model", str(net_file), "-gpu", "zero"], "-gpu 'zero'"),
             (["train", "-solver", "s", "-gpu", "0,1"], "-gpu 0,1 names 2 GPUs")]
    for argv, words in cases:
        assert main(argv) == 2, argv
        assert words in capsys.readouterr().err, argv
    for argv, words in ((["time", "-model", str(net_file), "-phase", "train"], "-phase"),
                        (["train", "-solver", "s", "-sigint_effect", "quit"], "sigint_effect"),
                        (["trian", "-solver", "s"], "'trian'")):
        with pytest.raises(SystemExit) as e:
            main(argv)
        assert e.value.code == 2
        err = capsys.readouterr().err
        assert words in err, argv
    assert "train" in err and "device_query" in err     # the known commands


def test_gpu_flags_without_a_gpu(net_file, capsys):
    from minicaffe.backend import gpu_available
    if gpu_available():
        pytest.skip("checks the message on a machine without a CUDA device")
    for argv in (["time", "-model", str(net_file), "-gpu", "0"],
                 ["test", "-model", str(net_file), "-gpu", "all"],
                 ["device_query", "-gpu", "0"]):
        assert main(argv) == 1
        err = capsys.readouterr().err
        assert f"-gpu {argv[-1]}: " in err and "Traceback" not in err
    with pytest.raises(SystemExit):                      # one or the other
        main(["time", "-model", str(net_file), "-gpu", "0", "--cpu"])


def test_time_prints_caffes_lines(net_file, capsys):
    import re
    assert main(["time", "-model", str(net_file), "-iterations", "3"]) == 0
    lines = _log_lines(capsys.readouterr().err)
    num = r"[0-9.e+-]+"
    assert lines[:7] == ["Use CPU.", "Performing Forward", lines[2], "Performing Backward",
                         "*** Benchmark begins ***", "Testing for 3 iterations.", lines[6]]
    assert re.fullmatch(f"Initial loss: {num}", lines[2])
    for j in range(3):
        assert re.fullmatch(f"Iteration: {j + 1} forward-backward time: {num} ms.",
                            lines[6 + j])
    assert lines[9] == "Average time per layer: "
    names = ["data", "conv", "pool", "ip", "loss"]        # the TRAIN net's layers
    for i, name in enumerate(names):
        assert re.fullmatch(f"{name:>10}\tforward: {num} ms.", lines[10 + 2 * i])
        assert re.fullmatch(f"{name:>10}\tbackward: {num} ms.", lines[11 + 2 * i])
    tail = lines[10 + 2 * len(names):]
    for line, what in zip(tail, ["Average Forward pass", "Average Backward pass",
                                 "Average Forward-Backward", "Total Time"]):
        assert re.fullmatch(f"{what}: {num} ms.", line)
    assert tail[-1] == "*** Benchmark ends ***"


LOSS_WEIGHTED = NET.replace('top: "loss" }', 'top: "loss" loss_weight: 2 }')


def test_test_prints_caffes_lines(tmp_path, capsys):
    """Per batch each output element, 'Loss:' (the weighted loss), then each output's mean
    with '(* w = w*mean loss)' where its loss weight is not 0."""
    net = tmp_path / "w2.prototxt"
    net.write_text(LOSS_WEIGHTED)
    assert main(["test", "-model", str(net), "-iterations", "2"]) == 0
    lines = _log_lines(capsys.readouterr().err)
    assert lines[0] == "Use CPU." and lines[1].startswith("no -weights: ")
    assert "Need model weights to score." in lines[1]
    assert lines[2] == "Running for 2 iterations."
    batches = [ln.split(", ", 1) for ln in lines[3:7]]
    assert [b[0] for b in batches] == ["Batch 0", "Batch 0", "Batch 1", "Batch 1"]
    # Net::Init leaves the unconsumed blobs as outputs in a std::set: by name
    assert [b[1].split(" = ")[0] for b in batches] == ["acc", "loss", "acc", "loss"]
    acc = [float(batches[i][1].split(" = ")[1]) for i in (0, 2)]
    loss = [float(batches[i][1].split(" = ")[1]) for i in (1, 3)]
    assert lines[7].startswith("Loss: ")
    assert abs(float(lines[7][6:]) - 2 * sum(loss) / 2) < 1e-4   # Forward's loss is weighted
    assert lines[8] == f"acc = {sum(acc) / 2:g}"                 # weight 0: no '(* ...)'
    mean = sum(loss) / 2
    head, extra = lines[9].split(" (* ")
    assert abs(float(head.split(" = ")[1]) - mean) < 1e-5 and head.startswith("loss = ")
    assert extra.startswith("2 = ") and extra.endswith(" loss)")
    assert abs(float(extra[4:-6]) - 2 * mean) < 1e-4
    assert len(lines) == 10


def test_device_query_prints_caffes_fields():
    from minicaffe.cli import device_query_lines
    props = dict(name=b"Fake GPU", major=9, minor=0, totalGlobalMem=1 << 30,
                 sharedMemPerBlock=49152, regsPerBlock=65536, warpSize=32, memPitch=2147483647,
                 maxThreadsPerBlock=1024, maxThreadsDim=(1024, 1024, 64),
                 maxGridSize=(2147483647, 65535, 65535), clockRate=1980000,
                 totalConstMem=65536, textureAlignment=512, deviceOverlap=1,
                 multiProcessorCount=132, kernelExecTimeoutEnabled=0)
    lines = device_query_lines(3, props)
    assert lines[0] == "Device id:                     3"
    assert lines[3] == "Name:                          Fake GPU"
    assert "Maximum dimension of block:    1024, 1024, 64" in lines
    assert "Concurrent copy and execution: Yes" in lines
    assert lines[-1] == "Kernel execution timeout:      No"
    assert all(ln[:31].rstrip().endswith(":") and ln[31] != " " for ln in lines)
    del props["deviceOverlap"]                     # CuPy has it from CUDA 9.2 on
    assert "Concurrent copy and execution: n/a" in device_query_lines(0, props)


def test_train_runs_a_solver_without_solver_mode_on_the_cpu(net_file, tmp_path, monkeypatch,
                                                            capsys):
    """tools/caffe.cpp train() takes the GPU from the solver file only where the file sets
    solver_mode: GPU (has_solver_mode()); a file that leaves it out trains on the CPU, though
    the field's default is GPU.  Seen here on a machine that claims a GPU: such a file
    must not try it."""
    import minicaffe.solver
    monkeypatch.setattr(minicaffe.solver, "gpu_available", lambda: True)
    solver = tmp_path / "solver.prototxt"
    solver.write_text(f'net: "{net_file}"\nbase_lr: 0.01\nmax_iter: 1\nlr_policy: "fixed"\n'
                      f'display: 1\nsnapshot_prefix: "{tmp_path}/s"\n')
    assert main(["train", "-solver", str(solver)]) == 0, capsys.readouterr().err
    assert "Using CPU mode" in capsys.readouterr().err


TEST_ONLY_PARAMS = NET + """
layer { name: "ip_test" type: "InnerProduct" bottom: "ip" top: "ip_test"
        inner_product_param { num_output: 2 weight_filler { type: "gaussian" std: 1 } }
        include { phase: TEST } }
"""


@pytest.mark.parametrize("with_solver_file", [True, False])
def test_weights_reach_the_test_nets_own_layers(tmp_path, monkeypatch, with_solver_file):
    """tools/caffe.cpp train -weights: each model is copied into the train net and into every
    test net (CopyTrainedLayersFrom), so a layer only the TEST net has takes its weights too;
    `train NET -weights W` (a default solver) as `train -solver S -weights W`."""
    import numpy as np
    from minicaffe.net import TEST, Net
    from minicaffe.solver import Solver
    net = tmp_path / "t.prototxt"
    net.write_text(TEST_ONLY_PARAMS)
    model = Net(str(net), TEST, mode="CPU")
    for blob in model.params["ip_test"]:
        blob.data[...] = 0.25
    model.save(str(tmp_path / "w.caffemodel"))
    seen = {}
    solve = Solver.solve

    def keep(self, resume_file=None):
        seen["ip_test"] = [np.array(b.data) for b in self.test_nets[0].params["ip_test"]]
        return solve(self, resume_file)
    monkeypatch.setattr(Solver, "solve", keep)
    common = ["-weights", str(tmp_path / "w.caffemodel"), "--max-iter", "1"]
    if with_solver_file:
        solver = tmp_path / "solver.prototxt"
        solver.write_text(f'net: "{net}"\nbase_lr: 0.01\nlr_policy: "fixed"\nsolver_mode: CPU\n'
                          f'snapshot_prefix: "{tmp_path}/s"\ntest_iter: 1\ntest_interval: 5\n')
        argv = ["train", "-solver", str(solver)] + common
    else:
        argv = ["train", str(net), "--cpu", "--test-iter", "1", "--test-interval", "5",
                "--snapshot-prefix", str(tmp_path / "s")] + common
    assert main(argv) == 0
    assert all(np.all(v == 0.25) for v in seen["ip_test"])


def test_time_says_which_relu_layers_run_in_their_convolution(tmp_path, capsys, monkeypatch):
    """Convolution + in-place ReLU pairs: `time` says why the ReLU's forward reads about 0,
    and with MINICAFFE_FUSE_CONV_RELU=0 it times them apart (no such line)."""
    f = tmp_path / "relu.prototxt"
    f.write_text(NET.replace('layer { name: "pool"',
                             'layer { name: "relu" type: "ReLU" bottom: "conv" top: "conv" }\n'
                             'layer { name: "pool"', 1))
    assert 'name: "relu"' in f.read_text()
    assert main(["time", "-model", str(f), "-iterations", "1"]) == 0
    lines = _log_lines(capsys.readouterr().err)
    said = [ln for ln in lines if "run in their Convolution's forward" in ln]
    assert said == ["1 ReLU layers run in their Convolution's forward (Convolution + in-place "
                    "ReLU pairs: relu); MINICAFFE_FUSE_CONV_RELU=0 times them apart"], lines
    monkeypatch.setenv("MINICAFFE_FUSE_CONV_RELU", "0")
    assert main(["time", "-model", str(f), "-iterations", "1"]) == 0
    assert not any("Convolution's forward" in ln for ln in _log_lines(capsys.readouterr().err))


def test_cudnn_api_flag_sets_what_the_convolutions_read(net_file, capsys, monkeypatch):
    """--cudnn-api sets $MINICAFFE_CUDNN_API, which each cuDNN convolution reads as it binds
    (and child processes inherit); a name outside legacy/graph is refused by argparse."""
    from minicaffe.cudnn import backend_api
    monkeypatch.delenv(backend_api.ENV_API, raising=False)
    assert main(["time", "--model", str(net_file), "--iterations", "1", "--cpu",
                 "--cudnn-api", "graph"]) == 0
    assert os.environ[backend_api.ENV_API] == "graph" and backend_api.api_choice() == "graph"
    monkeypatch.delenv(backend_api.ENV_API, raising=False)
    with pytest.raises(SystemExit):
        main(["time", "--model", str(net_file), "--cudnn-api", "v8"])
    assert "invalid choice" in capsys.readouterr().err
