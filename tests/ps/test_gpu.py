"""GPU data-parallel runs: PS workers in GPU mode, and the NCCL all-reduce path.

Marked ``gpu`` (skipped without a CUDA device); the NCCL tests need two GPUs.
Each compares with one GPU process at the whole batch; GEMM summation order
differs between batch sizes, hence the looser tolerance than on CPU.

Overlap (ps/overlap.py, on by default): the runs with and without it must give
the same parameters bit for bit (the parameter server sums in rank order; with
two ranks NCCL's sum is one addition per element, whatever the buckets), and a
stream that waits on the hook's event must read the final diffs even when a
long kernel holds the compute stream back.
"""
import shutil
import socket
import tempfile
import time
from pathlib import Path

import numpy as np
import pytest

from ps.copyup import copy_up_mode
from ps_helpers import HDF5_NET, caffemodel_params, logs, write_hdf5, write_solver

pytestmark = pytest.mark.gpu


def gpu_count():
    try:
        import cupy
        return cupy.cuda.runtime.getDeviceCount()
    except Exception:
        return 0


needs_two = pytest.mark.skipif(gpu_count() < 2, reason="needs 2 GPUs")


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def reference(tmp_path, source):
    """One GPU at batch 8 (in this process)."""
    from minicaffe.cli import main
    ref = write_solver(tmp_path, "ref", HDF5_NET, k=8, source=source)
    assert main(["train", "--solver", ref, "--gpu", "0", "--quiet"]) == 0
    return caffemodel_params(tmp_path / "snap" / "ref_iter_10.caffemodel")


def assert_close(got, want):
    for layer in want:
        for a, b in zip(got[layer], want[layer]):
            np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-6)


def ps_run(procs, tmp_path, name, source, extra=(), k=4):
    """2 GPU workers, 2 shards, 10 iterations; rank 0's caffemodel and the workers."""
    solver = write_solver(tmp_path, name, HDF5_NET, k=k, source=source, display=5)
    servers = [procs.server(s, 2, name=f"{name}_shard{s}", timeout=30) for s in range(2)]
    eps = ",".join(p.endpoint for p in servers)
    n = gpu_count()
    workers = [procs.train(f"{name}_w{r}", ["--solver", solver, "--ps", eps, "--rank", str(r),
                                            "--world-size", "2", "--gpu", str(r % n),
                                            "--ps-timeout", "30", *extra]) for r in range(2)]
    assert procs.wait_all(workers + servers, 120) == [0] * 4, logs(*workers, *servers)
    return caffemodel_params(tmp_path / "snap" / f"{name}_iter_10.caffemodel"), workers


def nccl_run(procs, tmp_path, name, source, extra=(), k=4, iter_size=1):
    """2 NCCL ranks on GPUs 0 and 1, 10 iterations; ranks 0's and 1's caffemodels, workers."""
    solver = write_solver(tmp_path, name, HDF5_NET, k=k, source=source, display=5)
    if iter_size > 1:
        with open(solver, "a") as f:
            f.write(f"iter_size: {iter_size}\n")
    ep = f"tcp://127.0.0.1:{free_port()}"
    workers = [procs.train(f"{name}_w{r}", ["--solver", solver, "--comm", "nccl", "--ps", ep,
                                            "--rank", str(r), "--world-size", "2", "--gpu",
                                            str(r), "--ps-timeout", "60", *extra])
               for r in range(2)]
    assert procs.wait_all(workers, 180) == [0, 0], logs(*workers)
    snap = tmp_path / "snap"
    return (caffemodel_params(snap / f"{name}_iter_10.caffemodel"),
            caffemodel_params(snap / f"{name}_rank1_iter_10.caffemodel"), workers)


def assert_equal(got, want):
    assert sorted(got) == sorted(want)
    for layer in want:
        for a, b in zip(got[layer], want[layer]):
            np.testing.assert_array_equal(a, b)


def test_ps_workers_in_gpu_mode(procs, tmp_path):
    source = write_hdf5(tmp_path, rows=32)
    want = reference(tmp_path, source)
    solver = write_solver(tmp_path, "g", HDF5_NET, k=4, source=source, display=5)
    servers = [procs.server(s, 2, name=f"g_shard{s}", timeout=30) for s in range(2)]
    eps = ",".join(p.endpoint for p in servers)
    n = gpu_count()
    workers = [procs.train(f"g_w{r}", ["--solver", solver, "--ps", eps, "--rank", str(r),
                                        "--world-size", "2", "--gpu", str(r % n),
                                        "--ps-timeout", "30"]) for r in range(2)]
    assert procs.wait_all(workers + servers, 120) == [0] * 4, logs(*workers, *servers)
    assert_close(caffemodel_params(tmp_path / "snap" / "g_iter_10.caffemodel"), want)
    assert "computation/communication" in workers[0].log()


@needs_two
def test_nccl_two_gpus_match_one_gpu_at_twice_the_batch(procs, tmp_path):
    source = write_hdf5(tmp_path, rows=32)
    want = reference(tmp_path, source)
    solver = write_solver(tmp_path, "n", HDF5_NET, k=4, source=source, display=5)
    ep = f"tcp://127.0.0.1:{free_port()}"
    workers = [procs.train(f"n_w{r}", ["--solver", solver, "--comm", "nccl", "--ps", ep,
                                        "--rank", str(r), "--world-size", "2", "--gpu", str(r),
                                        "--ps-timeout", "60"]) for r in range(2)]
    assert procs.wait_all(workers, 180) == [0, 0], logs(*workers)
    assert_close(caffemodel_params(tmp_path / "snap" / "n_iter_10.caffemodel"), want)
    rank0 = caffemodel_params(tmp_path / "snap" / "n_iter_10.caffemodel")
    rank1 = caffemodel_params(tmp_path / "snap" / "n_rank1_iter_10.caffemodel")
    for layer, blobs in rank1.items():       # the replicas never drift apart
        for a, b in zip(blobs, rank0[layer]):
            np.testing.assert_array_equal(a, b)
    assert "computation/communication" in workers[0].log()


@pytest.mark.parametrize("buckets, copy_up", [([], None), (["--bucket-mb", "0.00005"], None),
                                              (["--bucket-mb", "0.00005"], "update"),
                                              (["--bucket-mb", "0.00005"], "backward")])
def test_ps_gpu_overlap_gives_the_parameters_of_the_path_without_it(procs, tmp_path, buckets,
                                                                    copy_up):
    """Device-to-host copies on the copy stream behind the hook's events, pushes between
    layers, new parameters copied up (ps.copyup: by default during the next forward, from
    the pinned buffers, each layer waiting for its buckets; or at the update; or as they
    come back) (--bucket-mb 0.00005: one blob per bucket): the same parameters as pushing
    after backward, snapshot at iteration 10 included."""
    source = write_hdf5(tmp_path, rows=32)
    extra = buckets + (["--copy-up", copy_up] if copy_up else [])
    on, w_on = ps_run(procs, tmp_path, "on", source, extra)
    assert f"copied into the net: {copy_up_mode(True, copy_up)}" in w_on[0].log()
    off, w_off = ps_run(procs, tmp_path, "off", source, ["--no-overlap"])
    assert ("overlap: 4 bucket(s)" if buckets else "overlap:") in w_on[0].log()
    assert "overlap off" in w_off[0].log()
    assert_equal(on, off)


def test_ps_gpu_cuda_graph_under_a_swap_plan_gives_the_parameters_of_eager(procs, tmp_path):
    """--cuda-graph under a swap plan (swap.graph): each worker's forward and backward, the
    plan's copies and the buckets' device-to-host copies are one graph launch; the round
    thread waits on the buckets' external events.  The same parameters as the eager
    iteration, bit for bit (one blob per bucket, answers copied up at the update)."""
    source = write_hdf5(tmp_path, rows=32)
    common = ["--bucket-mb", "0.00005", "--copy-up", "update", "--swap", "naive",
              "--budget", "256M"]
    on, w_on = ps_run(procs, tmp_path, "gon", source, common + ["--cuda-graph"])
    off, _ = ps_run(procs, tmp_path, "goff", source, common)
    log = w_on[0].log()
    assert "captured under the swap plan" in log and "eagerly" not in log, log[-3000:]
    assert_equal(on, off)


@pytest.mark.parametrize("extra", [["--bucket-mb", "0.00005"],
                                   ["--bucket-mb", "0.00005", "--copy-up", "update"],
                                   ["--bucket-mb", "0.00005", "--copy-up", "backward"],
                                   ["--no-overlap"]])
def test_ps_gpu_shared_memory_gives_the_parameters_of_the_sockets(procs, tmp_path, monkeypatch,
                                                                  extra):
    """--ps-shm on GPU workers: gradients copied down into the registered gradient segments,
    new parameters copied up straight from the shards' registered segments (by default
    during the next forward, without the copy into staging), or at the update, or as they
    come back, or after backward: the same parameters as through the sockets, and no
    segment left behind."""
    # CUDA registers tmpfs mappings only: a directory of this test's own under /dev/shm
    shm = Path(tempfile.mkdtemp(prefix="mcps-test-", dir="/dev/shm"))
    try:
        monkeypatch.setenv("MINICAFFE_PS_SHM_DIR", str(shm))
        source = write_hdf5(tmp_path, rows=32)
        got, w = ps_run(procs, tmp_path, "shm", source, ["--ps-shm", *extra])
        want, _ = ps_run(procs, tmp_path, "sock", source, extra)
        assert_equal(got, want)
        assert list(shm.iterdir()) == []
        assert "computation/communication" in w[0].log()
    finally:
        shutil.rmtree(shm, ignore_errors=True)


@pytest.mark.skipif(gpu_count() < 1, reason="needs a GPU")
def test_a_segment_on_a_disk_file_system_is_refused_with_its_directory(tmp_path, monkeypatch):
    from ps.shm import Segment
    monkeypatch.setenv("MINICAFFE_PS_SHM_DIR", str(tmp_path))
    seg = Segment.create("g0s0", [(1024,)], np.float32)
    try:
        with pytest.raises(RuntimeError) as e:
            seg.register()
    except pytest.fail.Exception:
        pytest.skip(f"{tmp_path} is on a file system whose mappings CUDA registers (tmpfs?)")
    finally:
        seg.close()
    assert "tmpfs such as /dev/shm" in str(e.value) and str(tmp_path) in str(e.value)


# --bucket-mb 0.00005 (52 bytes): one parameter per bucket, all-reduced in place; the
# default (25 MiB): one bucket of the four, packed into the flat buffer.
@needs_two
@pytest.mark.parametrize("buckets", [[], ["--bucket-mb", "0.00005"]])
def test_nccl_overlap_gives_the_parameters_of_the_path_without_it(procs, tmp_path, buckets):
    source = write_hdf5(tmp_path, rows=32)
    on0, on1, w_on = nccl_run(procs, tmp_path, "on", source, buckets)
    off0, off1, w_off = nccl_run(procs, tmp_path, "off", source, ["--no-overlap"])
    want_buckets = "4 bucket(s)" if buckets else "1 bucket(s)"
    assert want_buckets in w_on[0].log() and "overlap off" in w_off[0].log()
    assert_equal(on0, off0)
    assert_equal(on1, on0)              # the replicas never drift apart


@needs_two
def test_nccl_overlap_with_iter_size_matches_one_gpu(procs, tmp_path):
    """2 ranks at batch 2 with iter_size 2: the buckets go in the second pass only, and
    training follows one GPU at batch 8."""
    source = write_hdf5(tmp_path, rows=32)
    want = reference(tmp_path, source)
    got0, got1, _ = nccl_run(procs, tmp_path, "it", source, k=2, iter_size=2)
    assert_close(got0, want)
    assert_equal(got1, got0)


DUMMY_NET = """
name: "events"
layer { name: "data" type: "DummyData" top: "data" top: "target"
  dummy_data_param { shape { dim: 64 dim: 256 } shape { dim: 64 dim: 16 }
    data_filler { type: "gaussian" std: 1 } data_filler { type: "gaussian" std: 1 } } }
layer { name: "ip1" type: "InnerProduct" bottom: "data" top: "ip1"
  inner_product_param { num_output: 256 weight_filler { type: "xavier" } } }
layer { name: "relu" type: "ReLU" bottom: "ip1" top: "ip1" }
layer { name: "ip2" type: "InnerProduct" bottom: "ip1" top: "ip2"
  inner_product_param { num_output: 256 weight_filler { type: "xavier" } } }
layer { name: "ip3" type: "InnerProduct" bottom: "ip2" top: "ip3"
  inner_product_param { num_output: 16 weight_filler { type: "xavier" } } }
layer { name: "loss" type: "EuclideanLoss" bottom: "ip3" bottom: "target" top: "loss" }
"""


@pytest.mark.skipif(gpu_count() < 1, reason="needs a GPU")
@pytest.mark.parametrize("wait", [True, False])
def test_a_stream_waiting_on_the_hook_event_reads_the_final_diffs(wait):
    """A 4096^3 GEMM chain queued before every forward holds the compute stream back; a
    side stream that waits on the event copies the final diffs, one that does not (the
    control) reads stale ones."""
    import cupy
    from minicaffe.proto import caffe_pb2, parse_text
    from minicaffe.solver import Solver
    from ps.overlap import GradientOverlap
    p = caffe_pb2.SolverParameter()
    p.net_param.CopyFrom(parse_text(DUMMY_NET, caffe_pb2.NetParameter))
    p.base_lr, p.lr_policy, p.momentum, p.iter_size, p.random_seed = 0.01, "fixed", 0.9, 2, 1
    solver = Solver(p, mode="GPU", verbose=False)
    params = solver.net.learnable_params
    side = cupy.cuda.Stream(non_blocking=True)
    big = cupy.ones((4096, 4096), dtype=cupy.float32)
    snaps, mismatches = {}, []

    class Delay:
        def on_start(self, s):          # after clear_param_diffs, before forward: on compute
            for _ in range(10):
                big @ big

    def on_ready(g, event):
        if wait:
            side.wait_event(event)
        with side:
            snaps[g] = params[g].diff.copy()

    overlap = GradientOverlap(solver.net, [[i] for i in range(len(params))], 2, on_ready,
                              gpu=True)

    def apply_update(display=False):
        overlap.flush()
        cupy.cuda.Device().synchronize()
        mismatches.append(sum(not bool((snaps[g] == params[g].diff).all())
                              for g in range(len(params))))
        snaps.clear()
        overlap.reset()
        type(solver).apply_update(solver, display)

    solver.callbacks.append(Delay())
    solver.apply_update = apply_update
    solver.step(3)
    if wait:
        assert mismatches == [0, 0, 0]
    else:
        assert sum(mismatches) > 0, "the control read the final diffs: the delay is too short"


@needs_two
@pytest.mark.parametrize("extra", [[], ["--no-overlap"]])
def test_nccl_dead_rank_is_named(procs, tmp_path, extra):
    source = write_hdf5(tmp_path, rows=32)
    solver = write_solver(tmp_path, "d", HDF5_NET, k=4, source=source, max_iter=10_000_000)
    ep = f"tcp://127.0.0.1:{free_port()}"
    workers = [procs.train(f"d_w{r}", ["--solver", solver, "--comm", "nccl", "--ps", ep,
                                        "--rank", str(r), "--world-size", "2", "--gpu", str(r),
                                        "--ps-timeout", "5", *extra]) for r in range(2)]
    deadline = time.monotonic() + 120
    while "communicator of 2 rank(s) ready" not in workers[1].log():
        assert time.monotonic() < deadline and workers[1].popen.poll() is None, logs(*workers)
        time.sleep(0.1)
    time.sleep(1.0)
    t0 = time.monotonic()
    workers[1].popen.kill()
    assert procs.wait_all([workers[0]], 20) == [1], logs(*workers)
    assert time.monotonic() - t0 < 12
    log = workers[0].log()
    assert "rank(s) 1" in log or "did not complete" in log, log


@pytest.mark.skipif(gpu_count() < 1, reason="needs a GPU")
def test_driver_copies_move_the_bytes_both_ways_on_their_stream():
    """ps.copyup.DriverCopies (cuMemcpyAsync with the GIL held): host to device and back,
    ordered on the given stream, from a thread that binds the context first; arrays of
    another size or layout are left to the caller."""
    import threading

    import cupy
    import cupyx
    from ps.copyup import driver_copies
    drv = driver_copies(env={})
    assert drv is not None
    src = cupyx.empty_pinned((1000, 37), np.float32)
    src[...] = np.random.RandomState(0).randn(1000, 37)
    dev = cupy.zeros((1000, 37), np.float32)
    back = cupyx.empty_pinned((1000, 37), np.float32)
    stream = cupy.cuda.Stream(non_blocking=True)
    errors = []

    def up():
        try:
            drv.bind()
            assert drv.up(dev, src, stream.ptr)
            with stream:
                dev[...] *= 2            # after the copy, on the same stream
            assert drv.down(back, dev, stream.ptr)
        except BaseException as e:   # reported to the test thread
            errors.append(e)

    t = threading.Thread(target=up)
    t.start()
    t.join()
    assert not errors, errors
    stream.synchronize()
    np.testing.assert_array_equal(back, 2 * src)
    assert not drv.up(dev[:, :10], src[:, :10], stream.ptr)      # not contiguous
    assert not drv.down(back[:10], dev, stream.ptr)              # another size
