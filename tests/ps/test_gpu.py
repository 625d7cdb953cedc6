"""GPU data-parallel runs: PS workers in GPU mode, and the NCCL all-reduce path.

Marked ``gpu`` (skipped without a CUDA device); the NCCL tests need two GPUs.
Each compares with one GPU process at the whole batch; GEMM summation order
differs between batch sizes, hence the looser tolerance than on CPU.
"""
import socket
import time

import numpy as np
import pytest

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


@needs_two
def test_nccl_dead_rank_is_named(procs, tmp_path):
    source = write_hdf5(tmp_path, rows=32)
    solver = write_solver(tmp_path, "d", HDF5_NET, k=4, source=source, max_iter=10_000_000)
    ep = f"tcp://127.0.0.1:{free_port()}"
    workers = [procs.train(f"d_w{r}", ["--solver", solver, "--comm", "nccl", "--ps", ep,
                                        "--rank", str(r), "--world-size", "2", "--gpu", str(r),
                                        "--ps-timeout", "5"]) for r in range(2)]
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
