"""`minicaffe mem` and `minicaffe train --swap/--budget/--memory-trace`."""
import csv

import pytest

from minicaffe.cli import main
from minicaffe.net import TRAIN, Net
from swap.gmap import build_gmap
from swap.memory import caffe_max_batch, fmt_bytes, parse_bytes
from swap.plan import max_batch, min_budget


def test_parse_and_format_bytes():
    assert parse_bytes("12G") == parse_bytes("12GiB") == parse_bytes("12 GB") == 12 << 30
    assert parse_bytes("1.5M") == 3 << 19
    assert parse_bytes("4096") == 4096 and parse_bytes(10) == 10
    with pytest.raises(ValueError, match="cannot read '12X' as a size"):
        parse_bytes("12X")
    assert fmt_bytes(12 << 30) == "12.00 GiB" and fmt_bytes(100) == "100 B"


def test_mem_prints_breakdown_and_max_batch(net_file, capsys):
    f = net_file("resnet", 4)
    assert main(["mem", "--model", str(f), "--batch", "16", "--budget", "2M"]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[0].startswith("net 'resnet_like': minibatch 16")
    head = out[1].split()
    for col in ("params", "history", "feature", "maps", "diffs", "workspace", "peak", "arena"):
        assert col in head
    assert "2.00 MiB" in out[1]
    rows = {line.split()[0]: line for line in out[2:7]}
    assert list(rows) == ["caffe", "none", "naive", "vdnn", "recompute"]
    g = build_gmap(Net(str(f), TRAIN, mode="CPU")).at(16)
    for s in ("naive", "vdnn", "none", "recompute"):
        gs = g.caffe_lowering() if s == "none" else g      # none: Caffe's one-image im2col
        assert rows[s].split()[-1] == str(max_batch(gs, s, 2 << 20))
        assert fmt_bytes(min_budget(gs, s)) in rows[s]
    assert rows["caffe"].split()[-1] == str(caffe_max_batch(g, 2 << 20))
    assert int(rows["naive"].split()[-1]) > int(rows["vdnn"].split()[-1]) > \
        int(rows["none"].split()[-1])
    assert min_budget(g.caffe_lowering(), "none") < min_budget(g, "none")
    # "peak at": the step's layer and its whole phase (it read "bac conv2" before)
    from swap.plan import make_plan
    plan = make_plan(g, "naive", None)
    step = g.steps[plan.peak_step]
    assert f"{step.name} ({step.phase})" in rows["naive"]


def test_mem_without_budget_and_bad_arguments(net_file, capsys):
    f = net_file("lenet", 4)
    assert main(["mem", "--model", str(f), "--strategies", "naive"]) == 0
    out = capsys.readouterr().out
    assert "naive" in out and "max k" not in out and "vdnn" not in out
    assert main(["mem", "--model", str(f), "--strategies", "checkpoint"]) == 2
    assert "unknown strategy 'checkpoint'" in capsys.readouterr().err
    assert main(["mem", "--model", str(f), "--budget", "lots"]) == 2     # usage: the flag's
    assert "--budget: cannot read 'lots' as a size" in capsys.readouterr().err


def test_train_with_swap_budget_and_trace(net_file, tmp_path, capsys):
    f = net_file("resnet", 4)
    trace = tmp_path / "trace.csv"
    rc = main(["train", str(f), "--cpu", "--max-iter", "4", "--display", "2", "--random-seed",
               "3", "--swap", "naive", "--budget", "1M", "--memory-trace", str(trace)])
    assert rc == 0
    err = capsys.readouterr().err
    assert "Memory plan 'naive'" in err and "Optimization Done." in err
    assert "arena high-water mark" in err and "budget 1.00 MiB" in err
    rows = list(csv.DictReader(open(trace)))
    g = build_gmap(Net(str(f), TRAIN, mode="CPU"))
    # 4 training iterations, plus the forward-only pass of the last display
    assert len(rows) == 4 * g.n_steps + g.n_forward
    assert max(int(r["in_use"]) for r in rows) <= 1 << 20


def test_train_with_too_small_budget_fails_before_training(net_file, capsys):
    f = net_file("resnet", 4)
    rc = main(["train", str(f), "--cpu", "--max-iter", "4", "--swap", "none", "--budget", "200K"])
    assert rc == 1
    err = capsys.readouterr().err
    assert "minicaffe train: error: budget 200.00 KiB is too small for swap strategy 'none'" in err
    assert "The smallest budget that works is" in err
    # one image of im2col per convolution (Caffe), so minibatch 2 still fits
    assert "the largest minibatch that fits 200.00 KiB is 2." in err
    assert "Iteration" not in err and "Traceback" not in err


def test_budget_needs_swap(net_file, capsys):
    assert main(["train", str(net_file("lenet")), "--cpu", "--budget", "1G"]) == 2
    assert "--budget and --memory-trace need --swap" in capsys.readouterr().err
