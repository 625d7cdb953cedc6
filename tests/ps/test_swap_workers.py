"""Data-parallel workers under the memory planner, end to end on the CPU: `minicaffe train
--ps ... --swap dynamic --profile P --batch k` in real processes against real shards.

A worker must join its peers at the solver's iteration with the weights every rank starts
from, so under --ps the tuner trains nothing before stage 3 (swap.tuner.train_dynamic
``train_before=False``, passed by minicaffe.cli._install_dynamic); on a GPU, session 45's
worker ran its CUDA-graph calibration's 14 iterations first and the shard refused it ("the
workers start at iteration 14, shard 0 at 0").  The calibration runs only on a GPU; the rest
of that path (the saved profile, the fixed batch, the dynamic plan installed in a worker,
the join, the BSP rounds) runs here, and must give the parameters of the same run without
--swap bit for bit: on the CPU a plan moves feature maps between the arena and the host and
changes no arithmetic.
"""
import re
from pathlib import Path

import numpy as np
import pytest

from ps_helpers import caffemodel_params, logs, write_solver
from minicaffe.backend import to_numpy
from minicaffe.solver import Solver
from swap.profiler import Profile

h5py = pytest.importorskip("h5py")

# Three 3x3 convolutions that keep (N, 8, 16, 16): at minibatch 4 their maps (32 KiB each)
# outweigh one layer's working set, so a budget near the naive plan's arena (444 KiB) makes
# the dynamic plan offload some of them (at 1 MiB it keeps all 8 resident).
CONV_NET = """
name: "conv_h5"
layer {{ name: "data" type: "HDF5Data" top: "data" top: "label"
        hdf5_data_param {{ source: "{source}" batch_size: {k} }} }}
layer {{ name: "conv1" type: "Convolution" bottom: "data" top: "conv1"
        convolution_param {{ num_output: 8 kernel_size: 3 pad: 1 weight_filler {{ type: "xavier" }}
                             bias_filler {{ type: "constant" value: 0.1 }} }} }}
layer {{ name: "relu1" type: "ReLU" bottom: "conv1" top: "conv1" }}
layer {{ name: "conv2" type: "Convolution" bottom: "conv1" top: "conv2"
        convolution_param {{ num_output: 8 kernel_size: 3 pad: 1 weight_filler {{ type: "xavier" }}
                             bias_filler {{ type: "constant" value: 0.1 }} }} }}
layer {{ name: "relu2" type: "ReLU" bottom: "conv2" top: "conv2" }}
layer {{ name: "conv3" type: "Convolution" bottom: "conv2" top: "conv3"
        convolution_param {{ num_output: 8 kernel_size: 3 pad: 1 weight_filler {{ type: "xavier" }}
                             bias_filler {{ type: "constant" value: 0.1 }} }} }}
layer {{ name: "relu3" type: "ReLU" bottom: "conv3" top: "conv3" }}
layer {{ name: "pool" type: "Pooling" bottom: "conv3" top: "pool"
        pooling_param {{ pool: MAX kernel_size: 4 stride: 4 }} }}
layer {{ name: "ip" type: "InnerProduct" bottom: "pool" top: "ip"
        inner_product_param {{ num_output: 3 weight_filler {{ type: "xavier" }} }} }}
layer {{ name: "loss" type: "SoftmaxWithLoss" bottom: "ip" bottom: "label" top: "loss" }}
"""
K = 4            # each worker's minibatch (--batch K)
ITERS = 6
BUDGET = "450K"  # above the naive plan's 444 KiB at K, below the 480 KiB that pins every map


def write_images(tmp, rows=2 * K * ITERS, seed=5):
    """An HDF5 source of ``rows`` images (rows, 1, 16, 16) with labels in 0..2."""
    rng = np.random.default_rng(seed)
    path = Path(tmp) / "images.h5"
    with h5py.File(path, "w") as f:
        f["data"] = rng.normal(size=(rows, 1, 16, 16)).astype(np.float32)
        f["label"] = rng.integers(0, 3, size=rows).astype(np.float32)
    lst = Path(tmp) / "images.txt"
    lst.write_text(f"{path}\n")
    return str(lst)


def solver_file(tmp_path, name, source, k=K, max_iter=ITERS):
    return write_solver(tmp_path, name, CONV_NET, k=k, max_iter=max_iter, source=source)


@pytest.fixture
def profiled(tmp_path, capsys):
    """The images and a profile of the net at minibatch K, taken on the CPU by one process
    as a user takes it (`train --swap dynamic --batch K --save-profile P`)."""
    from minicaffe.cli import main
    source = write_images(tmp_path)
    prof = tmp_path / "profile.json"
    solo = solver_file(tmp_path, "solo", source, max_iter=2)
    assert main(["train", "--solver", solo, "--swap", "dynamic", "--budget", BUDGET,
                 "--batch", str(K), "--save-profile", str(prof)]) == 0
    err = capsys.readouterr().err
    assert f"AccUDNN stage 1: profiling minibatches [{K}]" in err, err
    p = Profile.load(prof)
    assert p.mode == "CPU" and p.net == "conv_h5" and p.ks == (K,)
    return source, prof


def data_parallel(procs, name, solver, shards, iters, extra=()):
    """``shards`` shards and 2 `minicaffe train --ps` workers; both ranks' parameters at
    iteration ``iters`` (the solver's last), the workers and the shards."""
    servers = [procs.server(s, 2, name=f"{name}_shard{s}") for s in range(shards)]
    eps = ",".join(p.endpoint for p in servers)
    workers = [procs.train(f"{name}_w{r}", ["--solver", solver, "--ps", eps, "--rank", str(r),
                                            "--world-size", "2", "--comm", "ps",
                                            "--ps-timeout", "10", *extra])
               for r in range(2)]
    codes = procs.wait_all(workers + servers, 60)
    assert codes == [0] * len(codes), logs(*workers, *servers)
    snap = Path(solver).parent / "snap"
    return (caffemodel_params(snap / f"{name}_iter_{iters}.caffemodel"),
            caffemodel_params(snap / f"{name}_rank1_iter_{iters}.caffemodel"), workers, servers)


def swap_flags(prof):
    return ["--swap", "dynamic", "--budget", BUDGET, "--profile", str(prof), "--batch", str(K)]


def assert_dynamic_workers_joined_at_0(workers, servers, prof, iters):
    """Each worker loaded the profile (profiled nothing), installed a dynamic plan that
    offloads, trained from iteration 0 and joined there; each shard took both ranks at
    iteration 0 and served to ``iters``."""
    for w in workers:
        log = w.log()
        assert f"loaded from {prof}" in log and "Profiled minibatch" not in log, log
        offloaded = re.search(r"AccUDNN decision: feature maps: \d+ of 8 pinned .*, (\d+) "
                              r"offloaded", log)
        assert offloaded and int(offloaded.group(1)) > 0, log      # the plan swaps maps
        assert (f"AccUDNN stage 3: training from iteration 0 at minibatch {K} under the "
                "dynamic plan") in log, log
        assert re.search(r"joined [12] shard\(s\) at iteration 0 ", log), log
        assert "swap 'dynamic': budget" in log, log                # the executor's report
    for s in servers:
        log = s.log()
        for r in range(2):
            assert re.search(rf"rank {r} joined \[\w+\] at iteration 0 ", log), log
        assert re.search(r"all 2 rank\(s\) joined; .* from iteration 0$", log, re.M), log
        assert f"Optimization Done (iteration {iters})" in log, log


def assert_same_parameters(got, want):
    assert sorted(got) == sorted(want) == ["conv1", "conv2", "conv3", "ip"]
    for layer in want:
        for a, b in zip(got[layer], want[layer]):
            np.testing.assert_array_equal(a, b, err_msg=layer)


def test_dynamic_workers_join_at_iteration_0_and_train_as_without_swap(procs, tmp_path,
                                                                        profiled):
    """Two shards, two workers at the net's own minibatch K under the profile's dynamic plan:
    the parameters of the same data-parallel run without --swap, bit for bit, on both
    ranks."""
    source, prof = profiled
    solver = solver_file(tmp_path, "dyn", source)
    got0, got1, workers, servers = data_parallel(procs, "dyn", solver, 2, ITERS,
                                                 swap_flags(prof))
    assert_dynamic_workers_joined_at_0(workers, servers, prof, ITERS)
    want0, want1, plain, _ = data_parallel(procs, "plain",
                                           solver_file(tmp_path, "plain", source), 2, ITERS)
    assert "AccUDNN" not in plain[0].log()
    assert_same_parameters(got0, want0)
    assert_same_parameters(got1, want1)
    init = Solver(solver, verbose=False).net.params     # the weights every rank starts from
    for layer in want0:                                  # and the rounds moved them all
        for a, b in zip(got0[layer], init[layer]):
            assert not np.array_equal(a, to_numpy(b.data)), layer


def test_dynamic_workers_at_a_batch_over_the_nets_train_as_that_batch(procs, tmp_path,
                                                                      profiled):
    """One shard, two workers of the net at K/2 told --batch K (--lr-rule linear): each
    tuner resizes its net to K, doubles the rate and halves the schedule (6 iterations at
    K/2 -> 3 at K, the step at 4 -> 2); the shard takes that schedule from the workers'
    INIT.  The parameters of the net at K with that schedule without --swap, bit for bit
    (each rank reads its slice of K rows of the resized data layer)."""
    source, prof = profiled
    solver = solver_file(tmp_path, "half", source, k=K // 2)
    got0, got1, workers, servers = data_parallel(procs, "half", solver, 1, ITERS // 2,
                                                 [*swap_flags(prof), "--lr-rule", "linear"])
    assert_dynamic_workers_joined_at_0(workers, servers, prof, ITERS // 2)
    assert (f"learning rate 0.05 at k_base {K // 2} -> 0.1 at k* {K} (rule linear); training "
            f"to iteration {ITERS // 2}") in workers[0].log()
    plain = solver_file(tmp_path, "plainK", source, max_iter=ITERS // 2)
    text = Path(plain).read_text()
    assert "base_lr: 0.05\n" in text and "stepsize: 4\n" in text
    Path(plain).write_text(text.replace("base_lr: 0.05\n", "base_lr: 0.1\n")
                           .replace("stepsize: 4\n", "stepsize: 2\n"))
    want0, want1, _, _ = data_parallel(procs, "plainK", plain, 1, ITERS // 2)
    assert_same_parameters(got0, want0)
    assert_same_parameters(got1, want1)
