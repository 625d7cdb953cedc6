"""Small training runs for tests: an SGD solver over a net, and a few steps of it, plainly
or under a swap strategy, returning what a bit-for-bit comparison needs."""
from __future__ import annotations

from ..backend import to_numpy
from ..proto import caffe_pb2


def sgd_solver(net_param, *, seed: int = 3, mode: str = "CPU", base_lr: float = 0.05,
               momentum: float = 0.9, weight_decay: float = 1e-3, max_iter: int = 20):
    """A quiet SGD solver with a fixed learning rate over ``net_param`` (a NetParameter)."""
    from ..solver import Solver
    p = caffe_pb2.SolverParameter()
    p.net_param.CopyFrom(net_param)
    p.base_lr = base_lr
    p.momentum = momentum
    p.weight_decay = weight_decay
    p.lr_policy = "fixed"
    p.max_iter = max_iter
    p.display = 0
    p.random_seed = seed
    p.solver_mode = (caffe_pb2.SolverParameter.GPU if mode == "GPU"
                     else caffe_pb2.SolverParameter.CPU)
    return Solver(p, mode=mode, verbose=False)


def train_steps(solver, iters: int, strategy: str | None = None, budget=None,
                lowering: str | None = None, poison: bool = True, **install_options):
    """``iters`` steps of ``solver``: under ``strategy`` (swap.runtime.install, every fresh
    or released arena region poisoned with NaN unless ``poison`` is False), or plainly with
    the convolutions' ``lowering`` ("caffe" or "chunked"; None: as built).  Returns
    (params, history, losses, executor): host copies of the learnable parameters and the
    solver's history, the loss of every step, and the executor (None without a strategy)."""
    from swap.runtime import install, set_lowering
    ex = None
    if strategy:
        ex = install(solver, strategy, budget, poison=poison, lowering=lowering,
                     **install_options)
    elif lowering:
        set_lowering(solver.net, lowering)
        solver.net.reshape()
    losses = []
    for _ in range(iters):
        solver.step(1)
        losses.append(float(solver._losses[-1]))
    params = [to_numpy(p.data).copy() for p in solver.net.learnable_params]
    history = [to_numpy(h).copy() for h in solver.rule.state_blobs()]
    return params, history, losses, ex
