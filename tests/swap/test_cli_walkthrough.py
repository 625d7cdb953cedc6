"""A user's walk through the memory-budget features of ``minicaffe train`` and ``plan`` on
the CPU: the budgets a too-small budget's error names must work, budget flags are read or
refused by name, Ctrl-C while ``--swap dynamic`` profiles leaves a snapshot, and a resumed
``--swap dynamic`` run keeps the minibatch and learning rate the tuner chose.

The net has a test net, as the bundled solvers do: its buffers take part of the budget
(swap.runtime's arena layout), which is what the first errors left out."""
import os
import re
import signal

import pytest

from minicaffe.cli import main
from minicaffe.proto import caffe_pb2, read_binary

NET = """
name: "walk"
layer { name: "data" type: "DummyData" top: "data" top: "label" include { phase: TRAIN }
  dummy_data_param { shape { dim: 8 dim: 1 dim: 12 dim: 12 } shape { dim: 8 }
    data_filler { type: "gaussian" std: 1 } data_filler { type: "uniform" min: 0 max: 4.99 } } }
layer { name: "data" type: "DummyData" top: "data" top: "label" include { phase: TEST }
  dummy_data_param { shape { dim: 32 dim: 1 dim: 12 dim: 12 } shape { dim: 32 }
    data_filler { type: "gaussian" std: 1 } data_filler { type: "uniform" min: 0 max: 4.99 } } }
layer { name: "conv1" type: "Convolution" bottom: "data" top: "conv1"
  convolution_param { num_output: 4 kernel_size: 3 weight_filler { type: "xavier" } } }
layer { name: "pool1" type: "Pooling" bottom: "conv1" top: "pool1"
  pooling_param { pool: MAX kernel_size: 2 stride: 2 } }
layer { name: "relu1" type: "ReLU" bottom: "pool1" top: "pool1" }
layer { name: "ip1" type: "InnerProduct" bottom: "pool1" top: "ip1"
  inner_product_param { num_output: 5 weight_filler { type: "xavier" } } }
layer { name: "loss" type: "SoftmaxWithLoss" bottom: "ip1" bottom: "label" top: "loss" }
layer { name: "acc" type: "Accuracy" bottom: "ip1" bottom: "label" top: "acc"
  include { phase: TEST } }
"""


@pytest.fixture
def solver_file(tmp_path):
    """A solver file with a test net (test_iter 1), its net beside it, and snapshots under
    ``tmp_path/snap``."""
    net = tmp_path / "net.prototxt"
    net.write_text(NET)
    s = tmp_path / "solver.prototxt"
    s.write_text(f'net: "{net}"\nbase_lr: 0.05\nmomentum: 0.9\nlr_policy: "fixed"\n'
                 'max_iter: 4\ndisplay: 1\ntest_iter: 1\ntest_interval: 1000\n'
                 f'snapshot_prefix: "{tmp_path}/snap/s"\nsolver_mode: CPU\nrandom_seed: 3\n')
    return s


def train(solver_file, *args, capsys):
    rc = main(["train", "--solver", str(solver_file), *args])
    return rc, capsys.readouterr().err


def smallest_budget(err: str) -> int:
    """The bytes of the last "smallest budget that works is X (N bytes)" of an error."""
    found = re.findall(r"smallest budget that works is [^(]*\((\d+) bytes\)", err)
    assert found, err
    return int(found[-1])


def report_bytes(err: str, what: str) -> float:
    """A figure of the final report line, e.g. "arena high-water mark", in bytes."""
    m = re.search(re.escape(what) + r" ([0-9.]+) (B|KiB|MiB|GiB)", err)
    assert m, err
    return float(m.group(1)) * {"B": 1, "KiB": 1 << 10, "MiB": 1 << 20, "GiB": 1 << 30}[m.group(2)]


@pytest.mark.parametrize("strategy", ["none", "naive"])
def test_the_smallest_budget_named_for_a_plan_with_test_nets_works(solver_file, strategy,
                                                                     capsys):
    """--swap none|naive at a budget far too small: the error's smallest budget counts the
    test nets' buffers too, so that budget trains, and a byte less does not."""
    rc, err = train(solver_file, "--swap", strategy, "--budget", "1K", "--max-iter", "2",
                    capsys=capsys)
    assert rc == 1 and "Traceback" not in err
    need = smallest_budget(err)
    rc, err = train(solver_file, "--swap", strategy, "--budget", str(need - 1),
                    "--max-iter", "2", capsys=capsys)
    assert rc == 1 and "too small" in err and smallest_budget(err) == need, err
    rc, err = train(solver_file, "--swap", strategy, "--budget", str(need), "--max-iter", "2",
                    capsys=capsys)
    assert rc == 0, err
    assert report_bytes(err, "arena high-water mark") <= need


def test_the_smallest_budget_named_for_swap_dynamic_works(solver_file, capsys):
    """--swap dynamic where not even minibatch 1 fits: the error names the smallest budget
    for minibatch 1 (with the room a test pass takes), which then trains it."""
    rc, err = train(solver_file, "--swap", "dynamic", "--budget", "1K", "--batch", "1",
                    "--max-iter", "2", capsys=capsys)
    assert rc == 1 and "minibatch 1" in err
    need = smallest_budget(err)
    rc, err = train(solver_file, "--swap", "dynamic", "--budget", str(need - 1), "--batch",
                    "1", "--max-iter", "2", capsys=capsys)
    assert rc == 1 and smallest_budget(err) == need, err
    rc, err = train(solver_file, "--swap", "dynamic", "--budget", str(need), "--batch", "1",
                    "--max-iter", "2", capsys=capsys)
    assert rc == 0, err
    assert report_bytes(err, "arena high-water mark") <= need


def test_a_fixed_batch_over_k_max_names_a_budget_above_the_one_given(solver_file, capsys):
    """--swap dynamic --batch k above k_max: the smallest budget named for k is more than
    the budget given (it was less: the plan's part of it), and it trains k."""
    rc, err = train(solver_file, "--swap", "dynamic", "--budget", "1K", "--batch", "1",
                    capsys=capsys)
    budget = smallest_budget(err) + (64 << 10)
    rc, err = train(solver_file, "--swap", "dynamic", "--budget", str(budget), "--batch",
                    "4096", "--max-iter", "2", capsys=capsys)
    assert rc == 1 and "minibatch 4096" in err, err
    need = smallest_budget(err)
    assert need > budget
    m = re.search(r"the largest (?:minibatch )?that fits [^ ]+ [^ ]+ is (\d+)", err)
    assert m, err
    k = int(m.group(1))
    rc, err = train(solver_file, "--swap", "dynamic", "--budget", str(budget), "--batch",
                    str(k), "--max-iter", "2", capsys=capsys)
    assert rc == 0, err


def test_plan_on_a_profile_names_a_budget_that_plans(solver_file, tmp_path, capsys):
    """minicaffe plan --profile P (a train run's, with test nets) at a budget too small for
    minibatch 1: the smallest budget it names plans there."""
    prof = tmp_path / "p.json"
    rc, err = train(solver_file, "--swap", "dynamic", "--budget", "4M", "--batch", "4",
                    "--max-iter", "1", "--save-profile", str(prof), capsys=capsys)
    assert rc == 0, err
    assert main(["plan", "--budget", "1K", "--profile", str(prof)]) == 1
    err = capsys.readouterr().err
    assert "minibatch 1" in err and "Traceback" not in err
    need = smallest_budget(err)
    assert main(["plan", "--budget", str(need - 1), "--profile", str(prof)]) == 1
    assert smallest_budget(capsys.readouterr().err) == need
    assert main(["plan", "--budget", str(need), "--profile", str(prof)]) == 0
    assert "k* = " in capsys.readouterr().out


@pytest.mark.parametrize("text", ["abc", "-1", "0", "4 MB X", "1e6", ""])
def test_a_budget_that_is_no_size_is_refused_naming_the_flag(solver_file, text, capsys):
    rc, err = train(solver_file, "--swap", "naive", "--budget", text, capsys=capsys)
    assert rc == 2, err
    assert "--budget" in err and "Traceback" not in err
    assert "Iteration" not in err          # refused before the net is built and trained


def test_host_budget_and_plan_budget_name_their_flag(solver_file, tmp_path, capsys):
    rc, err = train(solver_file, "--swap", "dynamic", "--budget", "4M", "--host-budget",
                    "lots", capsys=capsys)
    assert rc == 2 and "--host-budget: cannot read 'lots' as a size" in err
    assert main(["plan", "--model", str(tmp_path / "net.prototxt"), "--budget", "x"]) == 2
    assert "--budget: cannot read 'x' as a size" in capsys.readouterr().err
    assert main(["mem", "--model", str(tmp_path / "net.prototxt"), "--budget=-5M"]) == 2
    assert "--budget '-5M': a size must be above 0" in capsys.readouterr().err


@pytest.mark.parametrize("spelling", ["4M", "4MiB", "4096K", "4096KiB", "0.00390625G",
                                      "4194304", "4 MB", "4mb"])
def test_every_budget_spelling_reads_the_same(solver_file, spelling, capsys):
    """The spellings parse_bytes documents (binary units; B, iB and GB alike)."""
    rc, err = train(solver_file, "--swap", "naive", "--budget", spelling, "--max-iter", "1",
                    capsys=capsys)
    assert rc == 0, err
    assert "budget 4.00 MiB, arena high-water mark" in err


def test_a_size_split_in_two_words_is_named(solver_file, capsys):
    """``--budget 4 MB`` unquoted: the unit lands on the positional net argument."""
    rc, err = train(solver_file, "--swap", "naive", "--budget", "4", "MB", capsys=capsys)
    assert rc == 2
    assert "--budget 4 MB" in err and "4M" in err


def test_ctrl_c_while_swap_dynamic_profiles_snapshots_and_stops(solver_file, tmp_path,
                                                                 monkeypatch, capsys):
    """SIGINT during stage 1 (profiling iterations, which train): as during training, the
    run stops after the iteration with a snapshot that loads (README: Ctrl-C stops after the
    running iteration with a snapshot)."""
    import swap.profiler as profiler
    real = profiler._recorded_steps
    sent = []

    def interrupted(inst, solver, warmup, iterations):
        sent.append(solver.iter)
        if len(sent) == 2:                  # at the second profiled minibatch
            signal.raise_signal(signal.SIGINT)
        return real(inst, solver, warmup, iterations)

    monkeypatch.setattr(profiler, "_recorded_steps", interrupted)
    rc, err = train(solver_file, "--swap", "dynamic", "--budget", "4M", "--auto-batch",
                    "--max-iter", "200", capsys=capsys)
    assert len(sent) == 2 and rc == 0, err
    assert "SIGINT" in err and "Optimization stopped early." in err
    m = re.search(r"Snapshotting solver state to binary proto file (\S+)", err)
    assert m, err
    state = read_binary(m.group(1), caffe_pb2.SolverState)
    assert 0 < state.iter < 200
    monkeypatch.setattr(profiler, "_recorded_steps", real)
    rc, err = train(solver_file, "--snapshot", m.group(1), "--max-iter", str(state.iter + 1),
                    capsys=capsys)
    assert rc == 0 and "Optimization Done." in err, err


def lr_lines(err):
    return [float(x) for x in re.findall(r"Iteration \d+, lr = ([0-9.e-]+)", err)]


def test_a_resumed_swap_dynamic_run_keeps_the_tuners_batch_and_rate(solver_file, tmp_path,
                                                                      capsys):
    """Trained under --swap dynamic --batch 4 (the net's is 8): the tuner scaled the rate.
    Resumed under --swap dynamic without --batch, the run goes on at 4 with that rate; resumed
    without --swap, it says that it trains at the net's 8 and the file's rate."""
    rc, err = train(solver_file, "--swap", "dynamic", "--budget", "4M", "--batch", "4",
                    "--lr-rule", "linear", "--max-iter", "4", capsys=capsys)
    assert rc == 0, err
    assert "-> 0.025 at k* 4 (rule linear)" in err
    states = sorted((tmp_path / "snap").glob("*.solverstate"))
    assert len(states) == 1
    state = str(states[0])
    # resumed without --batch or --lr-rule: the snapshot's k* and rule; iterations 2..7 ran
    # at 4, so 32 of --max-iter 16's 128 images are done: 2 profiled + 22 more at 4
    rc, err = train(solver_file, "--swap", "dynamic", "--budget", "4M", "--snapshot", state,
                    "--max-iter", "16", capsys=capsys)
    assert rc == 0, err
    assert "going on at minibatch 4" in err and "k* = 4 " in err, err
    assert "-> 0.025 at k* 4 (rule linear)" in err and "training to iteration 32" in err, err
    assert set(lr_lines(err)) == {0.025}, err
    rc, err = train(solver_file, "--snapshot", state, "--max-iter", "16", capsys=capsys)
    assert rc == 0, err
    assert ("trained under --swap dynamic at minibatch 4 with learning rate 0.025" in err
            and "this run trains at the net's minibatch 8 with base_lr 0.05" in err), err
    assert set(lr_lines(err)) == {0.05}, err


def test_the_cpu_report_says_when_the_transients_outgrow_the_reserve(solver_file, capsys):
    """On the CPU the dry run measures NumPy's temporaries, which no allocator puts in the
    scratch reserve: where they outgrow it, the report says that they lie outside the arena
    and what a GPU would need, not a 'smallest budget with them' above the budget it ran in."""
    rc, err = train(solver_file, "--swap", "naive", "--budget", "1K", capsys=capsys)
    need = smallest_budget(err)
    rc, err = train(solver_file, "--swap", "naive", "--budget", str(need), "--max-iter", "2",
                    capsys=capsys)
    assert rc == 0, err
    report = err.strip().splitlines()[-1]
    assert "scratch reserve 0 B" in report and "transients measured" in report, report
    assert "outside the arena on the CPU" in report and "a GPU would need" in report, report
    assert "smallest budget with them" not in report


@pytest.mark.parametrize("flag", ["--save-profile", "--memory-trace"])
def test_an_output_file_that_cannot_be_written_is_named_before_profiling(solver_file, flag,
                                                                         capsys):
    """Not after the profiling iterations (minutes on a large net), and by its flag, not as
    the temporary file it would have been written through."""
    rc, err = train(solver_file, "--swap", "dynamic", "--budget", "4M", "--auto-batch",
                    flag, "/nonexistent/dir/out.file", capsys=capsys)
    assert rc == 1 and f"{flag} /nonexistent/dir/out.file" in err, err
    assert "Profiled" not in err and ".tmp" not in err


def test_plan_checks_its_plot_file_before_planning(tmp_path, capsys):
    net = tmp_path / "net.prototxt"
    net.write_text(NET)
    assert main(["plan", "--model", str(net), "--budget", "4M", "--plot", "t.txt"]) == 2
    out = capsys.readouterr()
    assert "--plot t.txt" in out.err and "png" in out.err and "k* =" not in out.out
    assert main(["plan", "--model", str(net), "--budget", "4M", "--plot",
                 "/nonexistent/dir/t.png"]) == 1
    out = capsys.readouterr()
    assert "--plot /nonexistent/dir/t.png" in out.err and "k* =" not in out.out
    assert main(["plan", "--model", str(net), "--budget", "4M", "--plot",
                 str(tmp_path / "t.png"), "--trace", str(tmp_path / "none.csv")]) == 1
    out = capsys.readouterr()
    assert "--trace " in out.err and "k* =" not in out.out


def test_plan_on_another_nets_profile_points_to_what_works(solver_file, tmp_path, capsys):
    """The hint for a profile of another net: '--layout gpu' alone fails too (the profile's
    steps are checked against the net), so the error says how to get a profile of this
    net."""
    prof = tmp_path / "p.json"
    rc, err = train(solver_file, "--swap", "dynamic", "--budget", "4M", "--batch", "4",
                    "--max-iter", "1", "--save-profile", str(prof), capsys=capsys)
    assert rc == 0, err
    other = tmp_path / "other.prototxt"
    other.write_text(NET.replace('name: "walk"', 'name: "other"').replace(
        'layer { name: "relu1" type: "ReLU" bottom: "pool1" top: "pool1" }', ""))
    assert main(["plan", "--model", str(other), "--budget", "4M", "--profile", str(prof)]) == 2
    err = capsys.readouterr().err
    assert "net 'walk'" in err and "net 'other'" in err and "--save-profile" in err
    assert main(["plan", "--model", str(other), "--budget", "4M", "--profile", str(prof),
                 "--layout", "gpu"]) == 1
    assert "does not match net 'other'" in capsys.readouterr().err


def test_plan_on_another_solver_types_profile_says_why(solver_file, tmp_path, capsys):
    """A profile's GMAP holds its solver type's history: with another --solver-type and no
    --model the error says so and names both ways out (it named a `--layout cpu` the user
    had not given); with --model the net built here is planned."""
    prof = tmp_path / "p.json"
    rc, err = train(solver_file, "--swap", "dynamic", "--budget", "4M", "--batch", "4",
                    "--max-iter", "1", "--save-profile", str(prof), capsys=capsys)
    assert rc == 0, err
    assert main(["plan", "--budget", "4M", "--profile", str(prof), "--solver-type",
                 "Adam"]) == 2
    err = capsys.readouterr().err
    assert "solver type 'SGD', not 'Adam': give --solver-type SGD, or --model" in err
    assert "--layout cpu sizes" not in err
    net = tmp_path / "walk.prototxt"
    net.write_text(NET)
    assert main(["plan", "--model", str(net), "--budget", "4M", "--profile", str(prof),
                 "--solver-type", "Adam"]) == 0
    assert "(cpu layout)" in capsys.readouterr().out


@pytest.mark.parametrize("budget", ["4M", "300K"])
def test_stage_3_names_the_plan_the_report_names(solver_file, budget, capsys):
    """Where nothing needs swapping, --swap dynamic runs Caffe's plan 'none' (or every
    buffer resident): the stage 3 line said 'the dynamic plan' and the report 'none'."""
    rc, err = train(solver_file, "--swap", "dynamic", "--budget", budget, "--max-iter", "2",
                    capsys=capsys)
    assert rc == 0, err
    stage3 = [ln for ln in err.splitlines() if "AccUDNN stage 3" in ln][0]
    strategy = re.search(r"swap '(\w+)': budget", err).group(1)
    assert (f"plan {strategy!r}" in stage3 if strategy != "dynamic"
            else "the dynamic plan" in stage3), (stage3, strategy)


def test_swap_dynamic_at_the_nets_own_batch_over_k_max_fails_before_profiling(solver_file,
                                                                              tmp_path, capsys):
    """Without --batch or --auto-batch the run trains the net's own minibatch (512 here):
    over k_max it fails as --batch 512 does, before any profiling iteration, not after
    profiling a smaller k that it then does not train."""
    net = tmp_path / "net.prototxt"
    net.write_text(NET.replace("shape { dim: 8 dim: 1", "shape { dim: 512 dim: 1").replace(
        "shape { dim: 8 }", "shape { dim: 512 }"))
    rc, err = train(solver_file, "--swap", "dynamic", "--budget", "1K", "--batch", "512",
                    capsys=capsys)
    need = int(re.search(r"\((\d+) bytes\) for minibatch 512", err).group(1))
    budget = need - 1                           # minibatch 1 fits, 512 does not
    rc, err = train(solver_file, "--swap", "dynamic", "--budget", str(budget),
                    "--max-iter", "2", capsys=capsys)
    assert rc == 1 and "minibatch 512" in err and "--auto-batch" in err, err
    assert "Profiled" not in err and "Iteration 0" not in err
    assert smallest_budget(err) == need
    rc, err = train(solver_file, "--swap", "dynamic", "--budget", str(need), "--max-iter",
                    "2", capsys=capsys)
    assert rc == 0 and "k* = 512 " in err, err


def test_a_recompute_layer_that_is_not_there_is_refused_before_profiling(solver_file, capsys):
    rc, err = train(solver_file, "--swap", "dynamic", "--budget", "4M", "--auto-batch",
                    "--recompute", "conv9", capsys=capsys)
    assert rc == 1 and "no layer 'conv9'" in err, err
    assert "Profiled" not in err and "Iteration 0" not in err


def test_a_missing_profile_is_named_by_its_flag(tmp_path, capsys):
    """train and plan: --profile naming no file is a usage error that names the flag, before
    anything is built."""
    from minicaffe.cli import main
    missing = str(tmp_path / "nope.json")
    assert main(["train", "--solver", str(tmp_path / "s.prototxt"), "--swap", "dynamic",
                 "--budget", "4M", "--profile", missing]) == 2
    assert f"--profile {missing}: no such file" in capsys.readouterr().err
    assert main(["plan", "--model", str(tmp_path / "m.prototxt"), "--budget", "4M",
                 "--profile", missing]) == 2
    assert f"--profile {missing}: no such file" in capsys.readouterr().err


def test_plan_names_the_file_matplotlib_wrote(tmp_path, capsys):
    """--plot without an extension: matplotlib adds its default format's, and the line says
    the file it wrote, not the name given."""
    pytest.importorskip("matplotlib")
    net = tmp_path / "net.prototxt"
    net.write_text(NET)
    out = tmp_path / "timeline"
    assert main(["plan", "--model", str(net), "--budget", "4M", "--plot", str(out)]) == 0
    import matplotlib
    drawn = f"{out}.{matplotlib.rcParams['savefig.format']}"
    assert f"timeline drawn to {drawn}\n" in capsys.readouterr().out
    assert os.path.isfile(drawn)
