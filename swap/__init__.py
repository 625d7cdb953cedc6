"""swap: AccUDNN's memory optimizer for minicaffe (Guo et al., sections 3 and 5).

Static analysis, plans and the runtime memory manager:

* :mod:`swap.gmap`: :func:`build_gmap` -> :class:`GMAP`, the global memory-object access
  pattern of a built Net: 2N steps, the buffers each reads/writes/needs as scratch, their sizes
  as functions of the minibatch k, per-layer FLOPs (eq. 1), the naive allocate / release /
  offload / prefetch pattern.
* :mod:`swap.plan`: immutable :class:`Plan` objects (ordered ops with bytes, stream, step,
  offset and dependencies) for the ``none``, ``naive``, ``vdnn`` and ``recompute``
  (SuperNeurons: swap + recompute) strategies, any set of pinned buffers, eq. (4) per step,
  :func:`min_budget`, :func:`max_batch`, :class:`BudgetError`.
* :mod:`swap.arena`: the budget-sized device arena and the pinned host arena (section 5).
* :mod:`swap.runtime`: :class:`Executor` replays a plan around ``Net.forward_layer`` /
  ``backward_layer`` on three streams with explicit residency states; :func:`install`.
* :mod:`swap.memory`: breakdowns by category, Caffe's footprint, ``minicaffe mem``'s report.

The performance model, the dynamic strategy and the tuner (sections 3.2-3.4 and 4; docs/SWAP.md):

* :mod:`swap.profiler`: per-step compute and per-transfer times inside real training
  iterations at k = 1/8 .. 1 of k_max (:func:`profile_solver`), JSON profiles
  (:class:`Profile`), in-place resizing of a net's minibatch (:func:`set_batch_size`).
* :mod:`swap.model`: the throughput curve ``FLOPS(x) = P x / (x + x_half)`` per layer type
  (eq. 1-2), ``t_iter`` and ``t_whole`` (eq. 2-3), the PCIe model (eq. 5), memory (eq. 4).
* :mod:`swap.planner`: Algorithm 1 (``t_ready``, constraint 6), which feature maps to pin,
  the op-level replay of a plan on three streams (:func:`simulate`), timeline plots.
* :mod:`swap.tuner`: Algorithm 2 (k*, linear walk or bisection), :class:`Decision`, the three
  training stages (:func:`train_dynamic`).
* :mod:`swap.lr`: the learning rate for k* (eq. 9, linear, square root).
"""
from .arena import ALIGN, Arena, DeviceArena, HostArena, align
from .gmap import GMAP, Buffer, Size, Step, build_gmap, net_batch_size
from .memory import breakdown, caffe_breakdown, caffe_max_batch, caffe_total, fmt_bytes, parse_bytes
from .plan import (BudgetError, Op, Plan, RecomputePolicy, STRATEGIES, make_plan, max_batch,
                   min_budget, plan_dynamic, plan_naive, plan_none, plan_recompute, plan_vdnn,
                   recompute_policy)
from .runtime import Executor, Residency, ResidencyError, install
from .lr import DEFAULT_CONVEXITY, LR_RULES, eq9, scale_lr
from .model import ComputeModel, PCIeModel, ThroughputCurve, fit_curve, paper_k_max, t_whole
from .planner import (DynamicPlan, PinResult, Readiness, Sketch, Timeline, algorithm1,
                      choose_pins, make_dynamic_plan, plot_timeline, simulate,
                      sketch)
from .profiler import (PROFILE_FRACTIONS, Profile, profile_ks, profile_solver, set_batch_size,
                       synthetic_profile)
from .tuner import Decision, Search, device_models, plan_at, profile_models, train_dynamic, tune

__all__ = [
    "ALIGN", "Arena", "DeviceArena", "HostArena", "align",
    "GMAP", "Buffer", "Size", "Step", "build_gmap", "net_batch_size",
    "breakdown", "caffe_breakdown", "caffe_max_batch", "caffe_total", "fmt_bytes", "parse_bytes",
    "BudgetError", "Op", "Plan", "RecomputePolicy", "STRATEGIES", "make_plan", "max_batch",
    "min_budget", "plan_dynamic", "plan_naive", "plan_none", "plan_recompute", "plan_vdnn",
    "recompute_policy",
    "Executor", "Residency", "ResidencyError", "install",
    "DEFAULT_CONVEXITY", "LR_RULES", "eq9", "scale_lr",
    "ComputeModel", "PCIeModel", "ThroughputCurve", "fit_curve", "paper_k_max", "t_whole",
    "DynamicPlan", "PinResult", "Readiness", "Sketch", "Timeline", "algorithm1", "choose_pins",
    "make_dynamic_plan", "plot_timeline", "simulate", "sketch",
    "PROFILE_FRACTIONS", "Profile", "profile_ks", "profile_solver", "set_batch_size",
    "synthetic_profile",
    "Decision", "Search", "device_models", "plan_at", "profile_models", "train_dynamic", "tune",
]
