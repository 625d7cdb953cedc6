"""swap: AccUDNN's memory optimizer for minicaffe (Guo et al., sections 3 and 5).

Static analysis, plans and the runtime memory manager:

* :mod:`swap.gmap`: :func:`build_gmap` -> :class:`GMAP`, the global memory-object access
  pattern of a built Net: 2N steps, the buffers each reads/writes/needs as scratch, their sizes
  as functions of the minibatch k, per-layer FLOPs (eq. 1), the naive allocate / release /
  offload / prefetch pattern.
* :mod:`swap.plan`: immutable :class:`Plan` objects (ordered ops with bytes, stream, step,
  offset and dependencies) for the ``none``, ``naive`` and ``vdnn`` strategies, any set of
  pinned buffers, eq. (4) per step, :func:`min_budget`, :func:`max_batch`, :class:`BudgetError`.
* :mod:`swap.arena`: the budget-sized device arena and the pinned host arena (section 5).
* :mod:`swap.runtime`: :class:`Executor` replays a plan around ``Net.forward_layer`` /
  ``backward_layer`` on three streams with explicit residency states; :func:`install`.
* :mod:`swap.memory`: breakdowns by category, Caffe's footprint, ``minicaffe mem``'s report.
"""
from .arena import ALIGN, Arena, DeviceArena, HostArena, align
from .gmap import GMAP, Buffer, Size, Step, build_gmap, net_batch_size
from .memory import breakdown, caffe_breakdown, caffe_max_batch, caffe_total, fmt_bytes, parse_bytes
from .plan import (BudgetError, Op, Plan, STRATEGIES, make_plan, max_batch, min_budget,
                   plan_naive, plan_none, plan_vdnn)
from .runtime import Executor, Residency, ResidencyError, install

__all__ = [
    "ALIGN", "Arena", "DeviceArena", "HostArena", "align",
    "GMAP", "Buffer", "Size", "Step", "build_gmap", "net_batch_size",
    "breakdown", "caffe_breakdown", "caffe_max_batch", "caffe_total", "fmt_bytes", "parse_bytes",
    "BudgetError", "Op", "Plan", "STRATEGIES", "make_plan", "max_batch", "min_budget",
    "plan_naive", "plan_none", "plan_vdnn",
    "Executor", "Residency", "ResidencyError", "install",
]
