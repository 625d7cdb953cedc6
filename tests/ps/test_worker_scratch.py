"""The scratch reserve of a data-parallel worker under --swap dynamic: with --comm nccl the
plan leaves room for the all-reduce buffers (ps.cli.worker_device_bytes), passed by
`minicaffe train` to the tuner (swap.tuner.train_dynamic(scratch_extra=))."""
import argparse
from types import SimpleNamespace

import numpy as np

from ps.cli import worker_device_bytes


def _solver(*sizes):
    params = [SimpleNamespace(nbytes=4 * n) for n in sizes]
    return SimpleNamespace(net=SimpleNamespace(learnable_params=params))


def test_nccl_workers_reserve_twice_their_parameters():
    s = _solver(1000, 24, 7)
    assert worker_device_bytes(SimpleNamespace(ps="tcp://127.0.0.1:5555", comm="nccl"), s) \
        == 2 * 4 * 1031
    assert worker_device_bytes(SimpleNamespace(ps="tcp://127.0.0.1:5555", comm="ps"), s) == 0
    assert worker_device_bytes(SimpleNamespace(ps=None, comm="ps"), s) == 0


def test_train_passes_the_extra_to_the_tuner(monkeypatch):
    import minicaffe.cli as cli
    import swap.tuner as tuner
    seen = {}

    def fake_train_dynamic(solver, budget, **kw):
        seen.update(kw, budget=budget)
        return "executor", None
    monkeypatch.setattr(tuner, "train_dynamic", fake_train_dynamic)
    blob = SimpleNamespace(nbytes=np.dtype(np.float32).itemsize * 250)
    solver = SimpleNamespace(net=SimpleNamespace(learnable_params=[blob]))
    args = argparse.Namespace(
        auto_batch=False, batch=8, ps="tcp://127.0.0.1:5555", comm="nccl", profile="p.json",
        snapshot=None, lr_rule=None, convexity=None, search="bisect", pin_rule="stall",
        granularity="segment", save_profile=None, memory_trace=None, fill=True,
        k_objective="throughput", host_budget=None, recompute=None)
    assert cli._install_dynamic(args, solver, 1 << 30) == "executor"
    assert seen["scratch_extra"] == 2000 and seen["budget"] == 1 << 30
    args.comm = "ps"
    cli._install_dynamic(args, solver, 1 << 30)
    assert seen["scratch_extra"] == 0
