"""GPU mode of the memory manager: one cudaMalloc of the budget, pinned host memory, three
streams ordered by events.  Skipped where no CUDA device answers."""
import numpy as np
import pytest

from swap.arena import DeviceArena
from swap.runtime import install

pytestmark = pytest.mark.gpu


def gpu_train(make_solver, which, strategy, iters=10, **kw):
    from minicaffe.backend import to_numpy
    s = make_solver(which, mode="GPU")
    ex = install(s, strategy, **kw) if strategy else None
    losses = []
    for _ in range(iters):
        s.step(1)
        losses.append(float(s._losses[-1]))
    return [to_numpy(p.data) for p in s.net.learnable_params], losses, ex


def test_device_arena_is_one_allocation_of_the_budget(cp):
    pool = cp.get_default_memory_pool()
    before = pool.used_bytes()
    budget = 3 << 20
    d = DeviceArena(budget, cp)
    assert isinstance(d.buffer, cp.ndarray) and d.buffer.nbytes == budget
    assert pool.used_bytes() == before              # cudaMalloc outside CuPy's pool
    off = d.allocate(4096)
    v = d.view(off, 4096, np.float32)
    v[...] = 2
    assert float(d.view(off, 4096, np.float32).sum()) == 2048


@pytest.mark.parametrize("which", ["lenet", "resnet"])
def test_gpu_swapping_trains_like_none(make_solver, which):
    ref, ref_losses, ex = gpu_train(make_solver, which, "none")
    assert ex.device.buffer.nbytes == ex.budget
    for strategy in ("naive", "vdnn"):
        params, losses, ex = gpu_train(make_solver, which, strategy)
        assert ex.host.pinned and ex.plan.offloaded
        for a, b in zip(params, ref):
            np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)
        np.testing.assert_allclose(losses, ref_losses, rtol=1e-5)
        assert ex.high_water == ex.plan.arena_bytes <= ex.budget


def test_gpu_naive_with_early_prefetch_and_trace(make_solver, tmp_path):
    import csv
    ref, _, _ = gpu_train(make_solver, "resnet", "naive")
    ex0 = install(make_solver("resnet", mode="GPU"), "naive")
    budget = 3 * ex0.plan.arena_bytes
    path = tmp_path / "trace.csv"
    params, _, ex = gpu_train(make_solver, "resnet", "naive", budget=budget, trace=str(path))
    for a, b in zip(params, ref):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)
    ex.close()
    rows = list(csv.DictReader(open(path)))
    assert len(rows) == 10 * ex.gmap.n_steps
    assert all(float(r["t_end_ms"]) >= float(r["t_start_ms"]) >= 0 for r in rows)
