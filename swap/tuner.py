"""Algorithm 2: the efficiency-optimal minibatch k*, its swap plan, and the three training stages
(paper, sections 4 and 6).

Problem (7): minimize ``t_whole(k)`` (eq. 3) subject to eq. (4) (the budget) and constraint (6)
(no compute stall).  Under (6) the iteration time is the stall-free ``t_iter(k)`` of eq. (2) plus
the time outside the layer steps ``O(k) = a + b k`` (:class:`swap.model.IterationOverhead`,
fitted from the profile: gaps between steps, the solver update), and with the saturating
throughput curve of :mod:`swap.model` ``t_whole(k) / (E m) = sum_j t_j(k) / k + a / k + b +
Delta / k`` decreases with k (each step's time per image, ``(FLOPs_j(1) + x_half / k) / P``, does),
so the optimum is the **largest k at which (6) can be met**, which is what the paper's linear
search returns.  Measured step times need not follow that curve: with cuDNN workspaces bounded
by a fixed number of bytes, a convolution changes to a slower algorithm past the k where its
fastest one stops fitting, and its time per image rises with k.  So by default (``objective=
"throughput"``) k* is the stall-free k of the most predicted images/s at or below the largest
stall-free k (step 4 below); ``objective="largest"`` is the paper's choice.  O(k) is added
to every predicted iteration (the decision's ``t_iter``, the throughput compared where no k
meets (6)); Algorithm 1's timeline does not contain it.

Where the profile has host issue times, the predicted iteration is ``max(timeline, H(k)) +
O(k)`` (:meth:`swap.model.ComputeModel.iteration`, :class:`swap.model.HostModel`): the host
cannot issue the steps faster than ``H(k) = A + B k``.  Per image ``A / k + B`` falls with k too,
so the largest k that meets (6) stays the optimum and the search is unchanged; a host floor
changes the predicted time (and images/s) at k*, and the choice among k only where no k meets
(6) or the verification compares plans.  Constraint (6) is checked on the device's timeline
alone: a host-bound iteration leaves the copies more time, not less, so the check stays on the
safe side.

Algorithm 2 here:

1. ``k_max``: the largest k whose naive plan (every feature map offloaded, the layer-wise peak)
   fits the budget: ``swap.plan.max_batch(gmap, "naive", budget)``, exact with the arena layout
   (the paper's closed form is :func:`swap.model.paper_k_max`).
2. The question asked at each k, :meth:`Search.feasible`: does pinning feature maps
   (:func:`swap.planner.choose_pins`, greedy from an empty pinned set) reach a plan where (6) holds
   everywhere (:func:`swap.planner.algorithm1`)?  It depends on k only.  The paper's loop instead
   carries the pinned set from k + 1 to k; starting afresh at every k makes the answer a function
   of k, so that the two search methods below can be compared.
3. ``method="linear"``: the paper's walk, k = k_max, k_max - 1, ... down to the first feasible k.
   ``method="bisect"``: bisection on [1, k_max], valid where feasibility is monotone in k (true
   when it holds at k it holds at every smaller k); it asks O(log k_max) questions instead of up to
   k_max.  Both skip a k when a cheap necessary condition already proves it infeasible
   (:meth:`Search.bound_ok`: even pinning the best feature maps that fit at the step where most of
   them are off the device, the transfers left exceed the iteration time); that never changes the
   answer, only the time to find it.
4. ``objective="throughput"``: the images/s of every k up to the k found are predicted as if
   each were stall-free (eq. 2, the host's floor, O(k) and Delta; :func:`_fastest`), and k*
   is the fastest (the largest within 1 %); feasibility being monotone, it is stall-free too,
   which the search confirms.  With a saturating curve per layer type this is the k found.
5. The executable plan at k* (:func:`swap.planner.make_dynamic_plan`) is replayed op by op
   (:func:`swap.planner.simulate`); if the replay stalls more than ``verify_tol`` of the iteration
   (the arena layout can make a region wait where byte counting did not), or its stall and its
   copies beside the compute together add more than the copy limit to the compute
   (:func:`_replay_ok`), k is lowered until they do not (at most ``verify_steps`` times).
6. If no k meets (6) (the link is too slow for this net even with all the memory pinned), the k of
   ``k_max / 2^i`` with the best predicted images/s, stalls included, is returned with
   ``stall_free = False``.

The learning rate for k* is :func:`swap.lr.scale_lr` (eq. 9).  :func:`train_dynamic` runs the three
stages of section 6 on a Solver: profile, decide, train the rest.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field, replace

import numpy as np

from .arena import align
from .gmap import GMAP, build_gmap, net_batch_size
from .memory import fmt_bytes
from .model import D2H, H2D, TUNER_GRANULARITY, ComputeModel, PCIeModel
from .plan import (RECOMPUTE, BudgetError, _base_intervals, _place_returns, dynamic_recompute,
                   largest_k, make_plan, plan_bytes_at, recompute_candidates)
from .planner import (RULES, DynamicPlan, PinResult, _pairs, _split_uses, _uses, algorithm1,
                      choose_pins, make_dynamic_plan, with_recomputations)

METHODS = ("linear", "bisect")
# what k* maximizes among the stall-free k: the predicted images/s ("throughput"), or the paper's
# largest stall-free k ("largest"; the paper's assumption that it is also the fastest)
OBJECTIVES = ("throughput", "largest")
THROUGHPUT_TIE = 0.01        # a larger k within 1 % of the best predicted images/s is preferred
AUTO = "auto"                # recompute=AUTO: the tuner picks the groups (recompute_sets)
AUTO_MAX = 3                 # ... among the best 1, 2 and 3 of recompute_candidates
FASTEST_GRID = 1024          # at most this many k are predicted when choosing by images/s
FASTEST_STRIDE = 8           # ... every this many where cuDNN's searches price the steps
FASTEST_SEARCHED = 64        # ... and at most about this many there (the stride grows by 8s)
RESIDENT_PLANS = ("none", "resident")   # plans that swap nothing (swap.planner.resident)
# A k is stall-free only if the copies of its plan (filled with pins) add at most this share to
# its compute (PCIeModel.slow_out / slow_in; no effect where the model has them at 0).  Issue 5
# asks `dynamic` within 3 % of `none` at the same k; ResNet-152 at k* 89 and 93 ran 1.030 and
# 1.043 with no stall (H200, session 24), the copies' cost beside the compute (session 25).
# With the copies' cost calibrated (session 31, H200): ResNet-152's k* 86 under a 2 % limit,
# where the model had the copies at 2.0 %, ran 1.027 to 1.038 of `none`; the model prices
# them at about half what they cost, so the limit is 1 % (k* 76, 0.6 % fewer predicted
# images/s).  $MINICAFFE_COPY_SLOWDOWN_LIMIT (a fraction, read at import) overrides it.
ENV_COPY_SLOWDOWN_LIMIT = "MINICAFFE_COPY_SLOWDOWN_LIMIT"


def copy_slowdown_limit(default: float = 0.01) -> float:
    """:data:`COPY_SLOWDOWN_LIMIT`: ``$MINICAFFE_COPY_SLOWDOWN_LIMIT`` where set (a fraction in
    [0, 1), e.g. 0.02), else ``default``."""
    return _env_fraction(ENV_COPY_SLOWDOWN_LIMIT, default)


def _env_fraction(name: str, default: float) -> float:
    """The fraction in [0, 1) the environment variable ``name`` holds, else ``default``
    (ValueError naming the variable on anything else)."""
    import os
    env = os.environ.get(name, "").strip()
    if not env:
        return default
    try:
        v = float(env)
    except ValueError:
        v = -1.0
    if not 0.0 <= v < 1.0:
        raise ValueError(f"${name}={env!r}: expected a fraction in [0, 1), e.g. 0.01 for 1 %")
    return v


COPY_SLOWDOWN_LIMIT = copy_slowdown_limit()

# A k whose plan recomputes (pins alone stall there) is stall-free only if the recomputations
# add at most this share to its steps' compute: with the copies at most COPY_SLOWDOWN_LIMIT,
# the plan stays within issue 5's 3 % of `none`.  VGG-16 on an H200 with the cuDNN workspace
# fit off (session 31): the paper's rule reached 262 recomputing conv1_1, conv2_1 and conv3_1
# (22.2 ms of compute) and ran 1.052 of `none`; conv1_1 alone costs 1.7 % and holds to 220.
# $MINICAFFE_RECOMPUTE_COST_LIMIT (a fraction, read at import) overrides it.
ENV_RECOMPUTE_COST_LIMIT = "MINICAFFE_RECOMPUTE_COST_LIMIT"


def recompute_cost_limit(default: float = 0.02) -> float:
    """:data:`RECOMPUTE_COST_LIMIT`: ``$MINICAFFE_RECOMPUTE_COST_LIMIT`` where set (a fraction
    in [0, 1), e.g. 0.05), else ``default``."""
    return _env_fraction(ENV_RECOMPUTE_COST_LIMIT, default)


RECOMPUTE_COST_LIMIT = recompute_cost_limit()


@dataclass(frozen=True)
class Evaluation:
    """One question of the search: is k feasible?  pruned: answered by the bound alone."""
    k: int
    feasible: bool
    pruned: bool = False
    pinned: int = 0
    rounds: int = 0
    stall: float = 0.0
    t_iter: float = 0.0
    reason: str = ""


class Search:
    """Feasibility of constraint (6) as a function of k, with a cache and a cheap bound.

    gmap: at any k (sizes and FLOPs are rescaled).  times_fn: ``k -> t_j(k)`` (default from
    ``model``).  margin: fraction of the budget kept out of the byte-level search for the
    executable plan's layout (its arena is within about 1% of its peak, see swap.plan): pins and
    prefetch timing are decided under ``budget * (1 - margin)``, the plan is made under
    ``budget``.  scratch: ``k -> bytes`` of the scratch reserve at k (Algorithm 2's M_ws, a
    :class:`swap.profiler.ScratchModel`); at k everything above is asked of ``budget -
    scratch(k)`` (None: no reserve, the whole budget).  recompute: names of forward layers
    whose groups a plan rebuilds in backward (:func:`swap.plan.dynamic_recompute`) at the k
    where pins alone cannot make (6) hold (:meth:`result`: pins alone are asked first).
    test_dynamic: the test nets' per-pass bytes, which the plan laid out at a k leaves room
    for after its resident regions (:func:`swap.planner.make_dynamic_plan`).
    """

    def __init__(self, gmap: GMAP, budget: int, model: ComputeModel | None, pcie: PCIeModel, *,
                 rule: str = "stall", prune: bool = True, times_fn=None, margin: float = 0.01,
                 scratch=None, fill: bool = True, recompute=(),
                 max_slowdown: float | None = COPY_SLOWDOWN_LIMIT,
                 max_recompute: float | None = RECOMPUTE_COST_LIMIT, test_dynamic: int = 0):
        if rule not in RULES:
            raise ValueError(f"unknown pinning rule {rule!r} (known: {', '.join(RULES)})")
        if not 0 <= margin < 1:
            raise ValueError(f"margin must be in [0, 1), got {margin}")
        self.gmap = gmap
        self.plan_budget = int(budget)
        self.budget = int(budget * (1 - margin))
        self.margin = margin
        self.scratch = scratch
        self.test_dynamic = int(test_dynamic)
        self.pcie = pcie
        self.rule = rule
        self.prune = prune
        self.fill = fill
        self.max_slowdown = max_slowdown
        self.max_recompute = max_recompute
        self.times = times_fn if times_fn is not None else model.times_fn(gmap)
        # with steps priced by cuDNN's search, _fastest asks every FASTEST_STRIDE-th k
        self.searched = bool(getattr(model, "searched", ()))
        self.recompute = dynamic_recompute(gmap, recompute)
        self.recompute_layers = tuple(dict.fromkeys(recompute or ()))
        self._pairs = _pairs(self.recompute)
        self._cache: dict = {}
        self._plain: dict = {}          # k -> choose_pins with pins alone (with recompute)
        self.evaluations: list = []
        self._prepare_bound()

    # ---- the necessary condition
    def _prepare_bound(self):
        """Interval structure of the just-in-time naive plan (independent of k) and the
        candidate steps where the bound is taken."""
        g = self.gmap
        n = g.n_steps
        rebuilt = self.recompute.recomputed if self.recompute is not None else frozenset()
        fms = [b for b in g.feature_maps() if b not in rebuilt]
        base, pending = _base_intervals(g, set(fms), recompute=self.recompute)
        ivs = _place_returns(g, base, pending, None, "jit")
        self._iv_bid = np.array([iv[0] for iv in ivs], dtype=np.int64)
        self._iv_start = np.array([iv[1] for iv in ivs], dtype=np.int64)
        self._iv_end = np.array([n - 1 if iv[2] is None else iv[2] for iv in ivs], dtype=np.int64)
        bufs = g.buffers
        self._item = np.array([b.size.item for b in bufs], dtype=np.int64)
        self._scaled = np.array([b.size.scaled for b in bufs], dtype=bool)
        self._cap = np.array([b.size.cap if b.size.cap is not None else -1 for b in bufs],
                             dtype=np.int64)
        # sizes that are neither constant nor linear in k (cuDNN workspaces): asked at each k
        self._per_k = [(b.id, b.size.per_k) for b in bufs if b.size.per_k is not None]
        sw = [p[0] for p in pending]
        last_fwd, first_bwd = _split_uses(g, _uses(self.recompute))
        self._fm = np.array(sw, dtype=np.int64)
        self._gap_lo = np.array([last_fwd[b] + 1 for b in sw], dtype=np.int64)
        self._gap_hi = np.array([first_bwd[b] - 1 for b in sw], dtype=np.int64)
        cover = np.zeros(n + 1)
        for b, lo, hi in zip(sw, self._gap_lo, self._gap_hi):
            if hi >= lo:
                cover[lo] += self._item[b]
                cover[hi + 1] -= self._item[b]
        cover = np.cumsum(cover)[:n]
        cands = {int(np.argmax(cover)) if n else 0, max(g.n_forward - 1, 0),
                 min(g.n_forward, n - 1)}
        self._bound_steps = sorted(c for c in cands if 0 <= c < n)

    def step_times(self, k: int) -> np.ndarray:
        """t_j(k) of every step, with the recomputations added before the steps they serve
        where the plan at k recomputes (:meth:`result`; all of them where k is not asked)."""
        res = self._cache.get(k)
        pairs = res.sketch.recompute if res is not None else self._pairs
        return with_recomputations(self.times(k), pairs)

    def plan_budget_at(self, k: int) -> int:
        """The budget a plan at k may lay out: the budget less the scratch reserve at k."""
        if self.scratch is None:
            return self.plan_budget
        return self.plan_budget - int(self.scratch(k))

    def budget_at(self, k: int) -> int:
        """The budget pins and prefetch timing are decided under at k (less the margin)."""
        if self.scratch is None:
            return self.budget
        return int(self.plan_budget_at(k) * (1 - self.margin))

    def _sizes(self, k: int) -> np.ndarray:
        kk = np.where(self._cap >= 0, np.minimum(k, self._cap), k)
        raw = np.where(self._scaled, self._item * kk, self._item)
        for i, fn in self._per_k:
            raw[i] = fn(k)
        return -(-raw // 512) * 512          # swap.arena.align, vectorized

    def bound_ok(self, k: int) -> tuple[bool, str]:
        """A necessary condition for (6) at k (module doc, step 3); (ok, why not)."""
        g = self.gmap
        n = g.n_steps
        s = self._sizes(k)
        resident = self._iv_start < 0
        setup = int(s[self._iv_bid[resident]].sum())
        delta = np.zeros(n + 1, dtype=np.int64)
        dyn = ~resident
        np.add.at(delta, self._iv_start[dyn], s[self._iv_bid[dyn]])
        np.add.at(delta, self._iv_end[dyn] + 1, -s[self._iv_bid[dyn]])
        jit = setup + np.cumsum(delta[:n])
        budget = self.budget_at(k)
        if int(jit.max(initial=setup)) > budget:
            return False, "eq. (4): even the naive plan does not fit"
        t_avail = float(np.sum(self.step_times(k)))
        fs = s[self._fm].astype(np.float64)
        for c in self._bound_steps:
            in_gap = (self._gap_lo <= c) & (c <= self._gap_hi)
            cap = float(budget - jit[c])
            for direction in (H2D, D2H):
                tt = np.asarray(self.pcie.time(fs, direction), dtype=np.float64)
                total = float(tt.sum())
                # pinning is free (optimistic) for feature maps resident at c anyway; the others
                # compete for cap bytes: a fractional knapsack by time per byte
                free = float(tt[~in_gap].sum())
                ts, bs = tt[in_gap], fs[in_gap]
                order = np.argsort(-(ts / np.maximum(bs, 1.0)), kind="stable")
                cum = np.cumsum(bs[order])
                full = int(np.searchsorted(cum, cap, side="right"))
                removed = float(ts[order][:full].sum())
                if full < len(order):
                    before = float(cum[full - 1]) if full else 0.0
                    removed += ts[order][full] * max(cap - before, 0.0) / max(bs[order][full], 1.0)
                left = total - free - removed
                if left > t_avail * (1 + 1e-9):
                    return False, (f"bound: {left:.3g} s of {direction} transfers cannot hide in "
                                   f"{t_avail:.3g} s of compute")
        return True, ""

    # ---- the question
    def result(self, k: int) -> PinResult | None:
        """choose_pins at k (None when the bound already rules k out)."""
        if k in self._cache:
            return self._cache[k]
        res = None
        if self.prune:
            ok, why = self.bound_ok(k)
            if not ok:
                self._cache[k] = None
                self.evaluations.append(Evaluation(k, False, pruned=True, reason=why))
                return None
        gk = self.gmap.at(k)
        if self.recompute is None:
            res = choose_pins(gk, self.budget_at(k), self.times(k), self.pcie, rule=self.rule)
        else:
            res = self._pins_alone(k)
            if not res.feasible:
                # the recomputation only where pins alone leave a stall: it costs compute
                res = choose_pins(gk, self.budget_at(k), self.times(k), self.pcie,
                                  rule=self.rule, recompute=self.recompute)
        if res.feasible and self.max_recompute is not None and res.sketch.recompute:
            share = self.recompute_share(k, res)
            if share > self.max_recompute:
                res = replace(res, feasible=False, reason=(
                    f"the recomputations add {100 * share:.1f} % to the compute (more than "
                    f"{100 * self.max_recompute:.1f} %)"))
        if res.feasible and self.max_slowdown is not None and self.pcie.slows:
            share = self.copy_share(k, res)
            if share > self.max_slowdown:
                res = replace(res, feasible=False, reason=(
                    f"the copies beside the compute add {100 * share:.1f} % to it (more than "
                    f"{100 * self.max_slowdown:.1f} %)"))
        self._cache[k] = res
        r = res.readiness
        self.evaluations.append(Evaluation(k, res.feasible, False, len(res.pinned), res.rounds,
                                           r.total_stall, r.t_iter, res.reason))
        return res

    def recompute_share(self, k: int, res: PinResult) -> float:
        """What the recomputations of the plan at k add to its steps' compute, as a share of
        it (0 where the plan recomputes nothing)."""
        t = np.asarray(self.times(k), dtype=np.float64)
        total = float(t.sum())
        extra = float(sum(t[f] for _, f in res.sketch.recompute))
        return extra / total if total > 0 else 0.0

    def copy_share(self, k: int, res: PinResult) -> float:
        """What the copies of the plan at k add to its compute, as a share of it
        (:attr:`swap.planner.Readiness.interference`), with the spare memory filled with pins
        as the executable plan fills it (``fill``)."""
        from .planner import sketch, spare_pins
        budget = self.budget_at(k)
        pinned = frozenset(res.pinned)
        if self.fill:
            pinned |= frozenset(spare_pins(res.sketch, budget))
        sk = (res.sketch if pinned == res.pinned else
              sketch(self.gmap.at(k), budget, pinned, recompute=res.recompute))
        r = algorithm1(sk, self.times(k), self.pcie)
        total = float(r.times.sum())
        return r.interference / total if total > 0 else 0.0

    def feasible(self, k: int) -> bool:
        r = self.result(k)
        return r is not None and r.feasible

    def _pins_alone(self, k: int) -> PinResult:
        res = self._plain.get(k)
        if res is None:
            res = choose_pins(self.gmap.at(k), self.budget_at(k), self.times(k), self.pcie,
                              rule=self.rule)
            self._plain[k] = res
        return res

    def pins_alone_up_to(self, ks) -> int:
        """With ``recompute``: the largest of the sorted ``ks`` at which pins alone make (6)
        hold (0 if none), by bisection: feasibility falls with k (as :func:`bisect_search`
        assumes), so the recomputation is needed only above it."""
        lo, hi = -1, len(ks)            # pins alone hold at ks[lo], not at ks[hi]
        while hi - lo > 1:
            mid = (lo + hi) // 2
            if self._pins_alone(int(ks[mid])).feasible:
                lo = mid
            else:
                hi = mid
        return int(ks[lo]) if lo >= 0 else 0


# ------------------------------------------------------------------ searches
def linear_search(search: Search, k_max: int, k_min: int = 1) -> int | None:
    """The paper's walk: the first feasible k from k_max down (None if none)."""
    for k in range(k_max, k_min - 1, -1):
        if search.feasible(k):
            return k
    return None


def bisect_search(search: Search, k_max: int, k_min: int = 1, band: float | None = 0.03,
                  band_min: int = 8) -> int | None:
    """The largest feasible k in [k_min, k_max] by bisection, for feasibility monotone in k.

    The greedy pinning of :func:`swap.planner.choose_pins` is monotone in k except in a narrow
    band at the boundary, where a slightly different lateness sends it down another path (on
    ResNet-34 at 12 GiB: feasible at 298 and 293, not at 294-297).  So once bisection has found a
    boundary (k feasible, k + 1 not), the ``max(band_min, band * k)`` values above it are asked
    too, and again above any feasible one found: the answer is the linear walk's whenever the
    feasible values of the band lie within that distance of each other.  ``band=None``: plain
    bisection.
    """
    if search.feasible(k_max):
        return k_max
    if k_max == k_min or not search.feasible(k_min):
        return None
    lo, hi = k_min, k_max          # feasible(lo), not feasible(hi)
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if search.feasible(mid):
            lo = mid
        else:
            hi = mid
    if band is None:
        return lo
    best = lo
    top = min(k_max - 1, best + max(band_min, int(math.ceil(band * best))))
    k = best + 1
    while k <= top:
        if search.feasible(k):
            best = k
            top = min(k_max - 1, best + max(band_min, int(math.ceil(band * best))))
        k += 1
    return best


# ------------------------------------------------------------------ decision
@dataclass(frozen=True)
class Decision:
    """Algorithm 2's answer: k*, its dynamic plan and predicted timeline, and how it was found."""
    k_star: int
    k_max: int
    k_base: int
    budget: int
    method: str
    rule: str
    stall_free: bool
    dynamic: DynamicPlan = field(repr=False)
    evaluations: tuple = field(default=(), repr=False)
    delta: float = 0.0
    objective: str = "largest"  # what k* maximizes among the stall-free k (OBJECTIVES)
    k_largest: int = 0          # the largest stall-free k the search found (0: not searched;
    #                             under "throughput" its plan is not laid out: the paper's k*
    #                             is tune(objective="largest"), at or below it)
    largest_ips: float = 0.0    # the predicted images/s at k_largest (stall-free, eq. 2 + O)
    scratch: int = 0            # the scratch reserve at k* (Algorithm 2's M_ws), bytes
    overhead: float = 0.0       # O(k*): seconds of the iteration outside the layer steps
    tail: float = 0.0           # the device's own part of O (the solver update)
    host: float = 0.0           # H(k*): the host's seconds to issue the steps (0: no host model)
    recompute: tuple = ()       # the layers whose groups the plan rebuilds in backward
    recompute_tried: tuple = () # --recompute auto: (layers, k*, images/s, stall-free) per set
    test_dynamic: int = 0       # the test nets' per-pass bytes the plan left room for

    @property
    def plan(self):
        return self.dynamic.plan

    @property
    def timeline(self):
        return self.dynamic.timeline

    @property
    def pinned(self) -> frozenset:
        return self.dynamic.plan.pinned

    @property
    def t_iter(self) -> float:
        """Predicted seconds per iteration (:func:`swap.model.iteration_time`): the op-level
        replay (compute and stalls) and the solver update, or the host's issue time H(k*) and
        the time outside the layer steps O(k*) where that is longer."""
        from .model import iteration_time
        return iteration_time(self.timeline.t_iter, self.host, self.overhead, self.tail)

    @property
    def host_bound(self) -> bool:
        """The host's issue time, not the device's, sets the predicted iteration."""
        return bool(self.host) and (self.host + self.overhead
                                    > self.timeline.t_iter + self.tail)

    @property
    def images_per_s(self) -> float:
        return self.k_star / (self.t_iter + self.delta)

    @property
    def peak(self) -> int:
        return self.plan.peak

    def t_whole(self, epochs: float, dataset: int) -> float:
        """eq. (3) at k* with the predicted iteration time."""
        return epochs * dataset / self.k_star * (self.t_iter + self.delta)

    def pinned_names(self) -> list:
        g = self.plan.gmap
        return [g.buffers[b].name for b in sorted(self.pinned)]

    def describe(self, limit: int = 12) -> str:
        """The decision for people (``minicaffe plan``, the training log)."""
        p, tl = self.plan, self.timeline
        g = p.gmap
        fms = g.feature_maps()
        pin_b = sum(align(g.nbytes(b)) for b in self.pinned)
        off_b, pre_b = p.transfer_bytes()
        n_eval = sum(1 for e in self.evaluations if not e.pruned)
        n_pruned = sum(1 for e in self.evaluations if e.pruned)
        lines = [
            f"k* = {self.k_star} (k_max {self.k_max} from the naive plan's layer-wise peak, "
            f"k_base {self.k_base}; {self.method} search, pinning rule {self.rule!r}: "
            f"{n_eval} k evaluated, {n_pruned} ruled out by the bound)"
            + ("" if self.stall_free else "  [no k meets constraint (6): best throughput]"),
        ]
        if self.k_largest and self.k_largest != self.k_star:
            lines.append(
                f"the search's largest stall-free k is {self.k_largest} (predicted "
                f"{self.largest_ips:.1f} images/s); k* = {self.k_star} is the fastest per image")
        lines += [
            f"predicted iteration {1e3 * self.t_iter:.3f} ms (compute {1e3 * tl.t_model:.3f} ms, "
            f"stall {1e3 * tl.total_stall:.3f} ms"
            + (f", copies beside the compute {1e3 * tl.interference:.3f} ms"
               if tl.interference > 0 else "")
            + (f", outside the steps {1e3 * self.overhead:.3f} ms" if self.overhead else "")
            + (f", host issue {1e3 * self.host:.3f} ms"
               + (": host-bound" if self.host_bound else "") if self.host else "")
            + f"), {self.images_per_s:.1f} images/s"
            + (f" with {1e3 * self.delta:.3f} ms between iterations" if self.delta else ""),
            (f"peak memory {fmt_bytes(p.peak)} (eq. 4), arena {fmt_bytes(p.arena_bytes)} of "
             f"budget {fmt_bytes(self.budget)}"
             + (f" less a scratch reserve of {fmt_bytes(self.scratch)}" if self.scratch else "")
             + f", pinned host {fmt_bytes(p.host_bytes)}"),
            (f"feature maps: {len(self.pinned)} of {len(fms)} pinned ({fmt_bytes(pin_b)}), "
             f"{len(p.offloaded)} offloaded ({fmt_bytes(off_b)} out, {fmt_bytes(pre_b)} in per "
             "iteration)") if p.strategy not in RESIDENT_PLANS else
            (f"feature maps: all {len(fms)} resident: nothing to swap at this k, and Caffe's "
             f"plan (every buffer allocated for the whole iteration) fits the budget"
             if p.strategy == "none" else
             f"feature maps: all {len(fms)} resident: nothing to swap at this k; every buffer "
             "is allocated for the whole iteration but the layers' scratch, around its steps "
             "(Caffe's plan, which holds every workspace at once, does not fit the budget)"),
        ]
        if p.lead:
            lines.append(f"prefetch regions laid out {p.lead} step{'s' * (p.lead > 1)} ahead "
                         "of the steps that issue them (the layout without it stalls)")
        if p.recomputed:
            rc = [i for i, op in enumerate(p.ops) if op.kind == RECOMPUTE]
            t_rc = float(sum(tl.op_end[i] - tl.op_start[i] for i in rc))
            lines.append(
                f"recomputed in backward: {', '.join(self.recompute)} "
                f"({fmt_bytes(sum(align(g.nbytes(b)) for b in p.recomputed))} neither kept nor "
                f"offloaded; {len(rc)} forward steps run again, {1e3 * t_rc:.3f} ms of the "
                "compute)")
        if self.recompute_tried:
            lines.append("--recompute auto tried: " + "; ".join(
                f"{', '.join(names) or 'nothing'}: k {k} at {ips:.1f} images/s"
                + ("" if ok else " (stalls)") for names, k, ips, ok in self.recompute_tried))
        names = self.pinned_names() if p.strategy not in RESIDENT_PLANS else ()
        if names:
            shown = ", ".join(names[:limit]) + (f", ... ({len(names) - limit} more)"
                                                if len(names) > limit else "")
            lines.append(f"pinned: {shown}")
        return "\n".join(lines)


def tune(gmap: GMAP, budget: int, model: ComputeModel, pcie: PCIeModel, *,
         method: str = "linear", rule: str = "stall", k_max: int | None = None, k_min: int = 1,
         prune: bool = True, delta: float = 0.0, verify_tol: float = 0.01,
         verify_steps: int = 8, margin: float = 0.01, refits: int = 3, scratch=None,
         times_fn=None, fill: bool = True, objective: str = "throughput",
         tie: float = THROUGHPUT_TIE, recompute=(),
         max_slowdown: float | None = COPY_SLOWDOWN_LIMIT,
         max_recompute: float | None = RECOMPUTE_COST_LIMIT, test_dynamic: int = 0) -> Decision:
    """Algorithm 2 (module doc): the efficiency-optimal minibatch under ``budget`` bytes.

    gmap: the net's GMAP (any k; ``gmap.k0`` is k_base).  model / pcie: the performance model.
    method: "linear" (the paper) or "bisect".  rule: the pinning rule of
    :func:`swap.planner.choose_pins`.  delta: seconds between iterations (eq. 3's Delta,
    parameter synchronization); the time outside the layer steps within an iteration is the
    model's own ``overhead`` (:class:`swap.model.IterationOverhead`), in the decision's t_iter.
    margin: the budget fraction kept for the layout (:class:`Search`); when the executable
    plan at the k found fails its replay (:func:`_replay_ok`: a stall over ``verify_tol``
    of the iteration, or stall and copies over ``max_slowdown``), the search is run
    again below that k with the margin the plan's layout achieved (at least double), up to
    ``refits`` times, then k is lowered one by one (``verify_steps``).
    scratch: ``k -> bytes`` of the scratch reserve at k (:class:`swap.profiler.ScratchModel`):
    k_max and the feasibility at every k are decided under ``budget - scratch(k)`` (Algorithm
    2's M_ws; ``budget`` is then what the plan and the reserve share, the test nets' persistent
    buffers already taken off).  None: the whole budget.
    fill: the plan at the k found gets its spare memory filled with pins
    (:func:`swap.planner.make_dynamic_plan`; the search itself decides feasibility without).
    objective: "throughput" (default): k* is the k of the most predicted images/s among the
    stall-free k at or below the largest one the search found (:func:`_fastest`; the largest k
    within ``tie`` of the best wins); "largest": the paper's k*, the largest stall-free k.
    recompute: names of forward layers whose groups (a layer and its in-place chain) every plan
    rebuilds in backward instead of keeping or offloading what they write
    (:func:`swap.plan.dynamic_recompute`; their forward time counts before the step they are
    rebuilt for).  Default: none.  ``"auto"``: the search runs with none and with the best 1,
    2 and 3 groups of :func:`recompute_sets`, and the decision is :func:`_auto_pick`'s.
    max_slowdown: a k counts as stall-free only if its copies add at most this share to the
    compute beside them (:meth:`Search.copy_share`; the PCIe model's ``slow_out`` /
    ``slow_in``, 0 unless the profile was calibrated); None: no such bound.
    max_recompute: a k whose plan recomputes counts as stall-free only if the recomputations
    add at most this share to its steps' compute (:meth:`Search.recompute_share`); None: no
    such bound.
    test_dynamic: the test nets' per-pass bytes (:class:`Search`): k_max and every plan leave
    room for them after their resident regions.
    Raises :class:`swap.plan.BudgetError` when not even k = 1 fits the budget.
    """
    if _is_auto(recompute):
        kw = dict(method=method, rule=rule, k_max=k_max, k_min=k_min, prune=prune, delta=delta,
                  verify_tol=verify_tol, verify_steps=verify_steps, margin=margin,
                  refits=refits, scratch=scratch, times_fn=times_fn, fill=fill,
                  objective=objective, tie=tie, max_slowdown=max_slowdown,
                  max_recompute=max_recompute, test_dynamic=test_dynamic)
        return _auto_pick([(names, tune(gmap, budget, model, pcie, recompute=names, **kw))
                           for names in recompute_sets(gmap, model, times_fn)], objective, tie)
    if objective not in OBJECTIVES:
        raise ValueError(f"unknown objective {objective!r} (known: {', '.join(OBJECTIVES)})")
    if budget is None:
        raise ValueError("the dynamic strategy needs a budget (bytes)")
    if method not in METHODS:
        raise ValueError(f"unknown search method {method!r} (known: {', '.join(METHODS)})")
    budget = int(budget)
    iteration = _iteration_of(model)
    from .profiler import max_batch_scratch
    km = (max_batch_scratch(gmap, budget, scratch, test_dynamic=test_dynamic)
          if k_max is None else int(k_max))
    if km < 1:
        reserve = scratch(1) if scratch is not None else 0
        arena = plan_bytes_at(gmap, "naive", 1)[0]
        need = plan_bytes_at(gmap, "naive", 1, test_dynamic=test_dynamic)[0] + reserve
        raise BudgetError(
            f"budget {fmt_bytes(budget)} is too small for the dynamic strategy on net "
            f"{gmap.net_name!r}: not even minibatch 1 fits. The naive plan, which offloads "
            f"every feature map (the least a plan takes), needs an arena of {fmt_bytes(arena)} "
            "at minibatch 1"
            + (f", {fmt_bytes(need - reserve)} with room for the test nets' pass "
               f"({fmt_bytes(test_dynamic)}) after its resident buffers" if test_dynamic else "")
            + (f", and the scratch reserve takes {fmt_bytes(reserve)}" if reserve else "")
            + f". The smallest budget that works is {fmt_bytes(need)} ({need} bytes).",
            budget=budget, min_budget=need, max_k=0, strategy="dynamic", k=1)
    k_min = max(1, min(k_min, km))
    find = linear_search if method == "linear" else bisect_search
    evaluations = []
    upper = km
    for attempt in range(refits + 1):
        search = Search(gmap, budget, model, pcie, rule=rule, prune=prune, times_fn=times_fn,
                        margin=margin, scratch=scratch, fill=fill, recompute=recompute,
                        max_slowdown=max_slowdown, max_recompute=max_recompute,
                        test_dynamic=test_dynamic)
        k = find(search, upper, k_min)
        stall_free = k is not None
        if k is None:
            evaluations += search.evaluations
            search.evaluations = []
            k = _best_throughput(search, upper, k_min, delta, iteration)
            break
        largest = (k, _predicted_ips(search, k, delta, iteration))
        if objective == "throughput":
            fastest = _fastest(search, k, k_min, delta, iteration, tie)
            if fastest != k:
                # feasibility is monotone but for a narrow band at the boundary: the search
                # from the fastest k down confirms it (it asks that k first)
                k = find(search, fastest, k_min) or k
        evaluations += search.evaluations
        search.evaluations = []
        dyn = _replay(search, k)
        if dyn is not None and _replay_ok(search, dyn, verify_tol):
            return _decision(dyn, km, gmap, budget, method, rule, True, evaluations, delta,
                             search, model, objective, largest)
        if attempt == refits:
            break
        # The layout could not realize the byte-level timing (large feature maps fragment the
        # arena): search again below k with the margin the executable plan achieved.
        achieved = (1.0 - (dyn.plan.peak / search.plan_budget_at(k)) if dyn is not None
                    else 2 * margin)
        margin = min(max(2 * margin, achieved), 0.5)
        upper = k
    dyn = _verified(search, k, k_min, verify_tol, verify_steps, stall_free, delta, iteration)
    evaluations += search.evaluations
    return _decision(dyn, km, gmap, budget, method, rule, stall_free, evaluations, delta, search,
                     model, objective, largest if stall_free else None)


def _overhead_of(model):
    """``k -> O(k)``, the model's time outside the layer steps (0 without a model or a fit)."""
    if model is None or getattr(model, "overhead", None) is None:
        return lambda k: 0.0
    return model.overhead_at


def _tail_of(model) -> float:
    """The device's own part of O(k), the solver update (0 without a model or O(k))."""
    oh = getattr(model, "overhead", None) if model is not None else None
    return 0.0 if oh is None else float(oh.tail)


def _host_of(model):
    """``k -> H(k)``, the host's issue time of the steps (0 without a model or host times)."""
    if model is None or getattr(model, "host", None) is None:
        return lambda k: 0.0
    return model.host_at


def _iteration_of(model):
    """``(device seconds, k) -> predicted iteration``: :meth:`ComputeModel.iteration`, or the
    device's time alone without a model."""
    if model is None:
        return lambda t, k: t
    return model.iteration


def _images_per_s(k: int, device: float, delta: float, iteration) -> float:
    """Predicted images/s at k from the device's seconds for the steps: ``iteration(device, k)``
    (the host's issue time and the time outside the steps) plus Delta per iteration."""
    return k / (iteration(device, k) + delta)


def _predicted_ips(search: Search, k: int, delta: float, iteration) -> float:
    """Predicted images/s of a stall-free plan at k: the steps' time (eq. 2), with the
    recomputations where the plan at k needs them (asked first)."""
    if getattr(search, "recompute", None) is not None:
        search.result(k)
    return _images_per_s(k, float(np.sum(search.step_times(k))), delta, iteration)


def _fastest(search: Search, k_hi: int, k_min: int, delta: float, iteration,
             tie: float = THROUGHPUT_TIE) -> int:
    """The k in [k_min, k_hi] of the most predicted images/s when every such k runs without a
    stall (:func:`_predicted_ips`); the largest k within ``tie`` of the best.

    The paper takes the largest stall-free k, assuming time per image falls with k (a
    saturating throughput curve).  Under a fixed cuDNN workspace bound it need not: past the
    minibatch where a convolution's fastest algorithm no longer fits, that step runs a slower
    one (VGG-16 at 12 GiB, session 10: 363 images/s at k = 197, 569 at 92).  The step curves
    that see this (``granularity="segment"``) make the choice here.  At most
    :data:`FASTEST_GRID` k are predicted (every k below that, else an even grid with k_hi).

    Where the model prices convolutions by cuDNN's search (``ComputeModel.searched``), each k
    it has not searched costs a search of every convolution's shapes (about half a second for
    VGG-16 on the H200, session 39: every k up to 245 took 113 s), so only the multiples of
    :data:`FASTEST_STRIDE` (of a multiple of it, for at most :data:`FASTEST_SEARCHED` ks: AlexNet's
    range runs to about 2000) and k_hi are asked.  The steps those searches see are tiles of
    images (WINOGRAD_NONFUSED: 16), whose best k per image are multiples of the tile.
    """
    n = k_hi - k_min + 1
    if n <= 1:
        return k_hi
    if getattr(search, "searched", False) and n > FASTEST_STRIDE:
        # a multiple of FASTEST_STRIDE, wide enough for at most FASTEST_SEARCHED ks
        stride = FASTEST_STRIDE * -(-n // (FASTEST_STRIDE * FASTEST_SEARCHED))
        ks = sorted({*range(-(-k_min // stride) * stride, k_hi + 1, stride), k_hi})
    else:
        ks = (range(k_min, k_hi + 1) if n <= FASTEST_GRID else
              sorted(set(np.linspace(k_min, k_hi, FASTEST_GRID).round().astype(int).tolist())))
    if getattr(search, "recompute", None) is None:
        ips = {int(k): _predicted_ips(search, int(k), delta, iteration) for k in ks}
    else:
        # where pins alone hold, nothing is recomputed: a bisection, not every k asked
        ks = [int(k) for k in ks]
        alone = search.pins_alone_up_to(ks)
        ips = {k: _images_per_s(k, float(np.sum(search.times(k) if k <= alone else
                                                with_recomputations(search.times(k),
                                                                    search._pairs))),
                                delta, iteration) for k in ks}
    best = max(ips.values())
    return max(k for k, v in ips.items() if v >= (1.0 - tie) * best)


def _decision(dyn, km, gmap, budget, method, rule, stall_free, evaluations, delta,
              search, model, objective="largest", largest=None) -> Decision:
    return Decision(k_star=dyn.k, k_max=km, k_base=gmap.k0, budget=budget, method=method,
                    rule=rule, stall_free=stall_free, dynamic=dyn,
                    evaluations=tuple(evaluations), delta=delta, objective=objective,
                    k_largest=largest[0] if largest else 0,
                    largest_ips=largest[1] if largest else 0.0,
                    scratch=search.plan_budget - search.plan_budget_at(dyn.k),
                    overhead=float(_overhead_of(model)(dyn.k)), tail=_tail_of(model),
                    host=float(_host_of(model)(dyn.k)),
                    recompute=search.recompute_layers if dyn.plan.recomputed else (),
                    test_dynamic=search.test_dynamic)


def _replay(search: Search, k: int) -> DynamicPlan | None:
    """The executable plan at k and its replay (None when its layout exceeds the budget)."""
    res = search.result(k)
    try:
        return make_dynamic_plan(search.gmap.at(k), search.plan_budget_at(k), search.times(k),
                                 search.pcie, rule=search.rule, pins=res, fill=search.fill,
                                 test_dynamic=search.test_dynamic)
    except BudgetError:
        return None


def plan_at(gmap: GMAP, k: int, budget: int, model: ComputeModel, pcie: PCIeModel, *,
            rule: str = "stall", delta: float = 0.0, scratch=None, fill: bool = True,
            recompute=(), test_dynamic: int = 0) -> Decision:
    """The dynamic plan at a fixed k (``--batch k``): only the swaps are planned (under
    ``budget - scratch(k)``, as :func:`tune`); ``fill``: spare memory filled with pins
    (:func:`swap.planner.make_dynamic_plan`); ``recompute``: as :func:`tune` (``"auto"``:
    the fewest of :func:`recompute_sets` whose plan at k has no stall, else the fastest);
    ``test_dynamic``: as :func:`tune`."""
    if _is_auto(recompute):
        tried, refused = [], None
        for names in recompute_sets(gmap, model):
            try:        # a set whose plan does not fit k is left out; the others still count
                tried.append((names, plan_at(gmap, k, budget, model, pcie, rule=rule,
                                             delta=delta, scratch=scratch, fill=fill,
                                             recompute=names, test_dynamic=test_dynamic)))
            except BudgetError as e:
                refused = refused or e
        if not tried:
            raise refused
        return _auto_pick(tried, "throughput", 0.0, fewest_stall_free=True)
    from .profiler import max_batch_scratch
    search = Search(gmap, int(budget), model, pcie, rule=rule, prune=False, scratch=scratch,
                    fill=fill, recompute=recompute, max_slowdown=None, max_recompute=None,
                    test_dynamic=test_dynamic)
    res = search.result(int(k))
    dyn = make_dynamic_plan(gmap.at(k), search.plan_budget_at(int(k)), search.times(k), pcie,
                            rule=rule, pins=res, fill=fill, test_dynamic=test_dynamic)
    km = max_batch_scratch(gmap, int(budget), scratch, test_dynamic=test_dynamic)
    return Decision(k_star=int(k), k_max=km, k_base=gmap.k0, budget=int(budget), method="fixed",
                    rule=rule, stall_free=dyn.feasible, dynamic=dyn,
                    evaluations=tuple(search.evaluations), delta=delta,
                    scratch=search.plan_budget - search.plan_budget_at(int(k)),
                    overhead=float(_overhead_of(model)(int(k))), tail=_tail_of(model),
                    host=float(_host_of(model)(int(k))),
                    recompute=search.recompute_layers if dyn.plan.recomputed else (),
                    test_dynamic=search.test_dynamic)


def _is_auto(recompute) -> bool:
    return isinstance(recompute, str) and recompute.strip().lower() == AUTO


def recompute_sets(gmap: GMAP, model: ComputeModel | None, times_fn=None,
                   most: int = AUTO_MAX) -> list:
    """What ``--recompute auto`` tries: nothing, then the best 1, 2, ... ``most`` groups of
    :func:`swap.plan.recompute_candidates` (bytes freed per second of forward run again, with
    the model's step times at ``gmap.k``), each as a tuple of layer names."""
    times = None
    if times_fn is not None:
        times = times_fn(gmap.k)
    elif model is not None:
        times = model.times_fn(gmap)(gmap.k)
    names = [c[0] for c in recompute_candidates(gmap, times)][:most]
    return [tuple(names[:n]) for n in range(len(names) + 1)]


def _auto_pick(tried: list, objective: str, tie: float,
               fewest_stall_free: bool = False) -> Decision:
    """The decision ``--recompute auto`` keeps among ``tried``, ``(layers, decision)`` per set
    of :func:`recompute_sets`, fewest layers first: among the stall-free decisions (all of
    them where none is), the largest k* (objective "largest") or the most predicted images/s
    (within ``tie``), the fewest layers on a tie; with ``fewest_stall_free`` (a fixed k) the
    first stall-free one.  It records what each set gave (``Decision.recompute_tried``; a set
    whose plan at its k* needs no recomputation gives the plan of pins alone there)."""
    decisions = [d for _, d in tried]
    record = tuple((tuple(names), d.k_star, d.images_per_s, d.stall_free) for names, d in tried)
    ok = [d for d in decisions if d.stall_free] or decisions
    if fewest_stall_free and any(d.stall_free for d in decisions):
        best = ok[0]
    elif objective == "largest":
        top = max(d.k_star for d in ok)
        best = next(d for d in ok if d.k_star == top)
    else:
        top = max(d.images_per_s for d in ok)
        best = next(d for d in ok if d.images_per_s >= (1.0 - tie) * top)
    return replace(best, recompute_tried=record)


def _best_throughput(search: Search, k_max: int, k_min: int, delta: float,
                     iteration=lambda t, k: t) -> int:
    """No k meets (6): the k among k_max / 2^i with the best predicted images/s (stalls, the
    host's issue time and the time outside the steps included: ``iteration(t, k)``)."""
    best, best_k = -1.0, k_min
    k = k_max
    while True:
        res = search.result(k)
        if res is None:           # pruned: evaluate anyway, stalls included
            res = choose_pins(search.gmap.at(k), search.budget_at(k), search.times(k),
                              search.pcie, rule=search.rule, recompute=search.recompute)
        # predicted with the stalls (Algorithm 1 with the waits propagated)
        t = algorithm1(res.sketch, search.times(k), search.pcie, propagate=True).t_iter
        ips = _images_per_s(k, t, delta, iteration)
        if ips > best:
            best, best_k = ips, k
        if k <= k_min:
            return best_k
        k = max(k_min, k // 2)


def _replay_ok(search: Search, dyn: DynamicPlan, tol: float) -> bool:
    """Whether the replay of the executable plan keeps the no-stall promise: its stall is at
    most ``tol`` of its compute and, under a copy limit (``search.max_slowdown``), its stall
    and its copies beside the compute together add at most that limit to the compute.

    A stall the replay predicts puts a prefetch on the critical path, where every error in a
    copy's predicted time lands on the iteration whole; so it counts against the same limit
    as the copies' slowdown.  GoogLeNet on an H200 (session 32): the plan at 496 predicted
    1.6 ms of stall and 0.9 ms of copies (1.3 % of its compute) and measured 1.037 of
    ``none``; the plan at 472, with no stall predicted, measured 1.006."""
    tl = dyn.timeline
    if tl.total_stall > tol * tl.t_model:
        return False
    limit = search.max_slowdown
    return limit is None or tl.total_stall + tl.interference <= limit * tl.t_model


def _verified(search: Search, k: int, k_min: int, tol: float, steps: int, stall_free: bool,
              delta: float, iteration=lambda t, k: t) -> DynamicPlan:
    """Build the executable plan at k and replay it; lower k while the replay stalls more than
    ``tol`` of the iteration or the layout does not fit (at most ``steps`` plans once one has
    been built)."""
    tried = []
    attempts = 0
    kk = k
    while kk >= k_min and (attempts <= steps or not tried):
        res = search.result(kk)
        if stall_free and (res is None or not res.feasible):
            kk -= 1
            continue
        if res is None:
            res = choose_pins(search.gmap.at(kk), search.budget_at(kk), search.times(kk),
                              search.pcie, rule=search.rule, recompute=search.recompute)
        attempts += 1
        try:
            dyn = make_dynamic_plan(search.gmap.at(kk), search.plan_budget_at(kk),
                                    search.times(kk), search.pcie, rule=search.rule, pins=res,
                                    fill=search.fill, test_dynamic=search.test_dynamic)
        except BudgetError:             # the layout needs more than the budget: lower k
            kk -= 1
            continue
        if not stall_free or _replay_ok(search, dyn, tol):
            return dyn
        tried.append(dyn)
        kk -= 1
    if not tried:
        raise RuntimeError(f"no plan could be made at or below k = {k}")
    return max(tried, key=lambda d: _images_per_s(d.k, d.timeline.t_iter, delta, iteration))


# ------------------------------------------------------------ device models
# The synthetic device of ``minicaffe plan`` without --profile: the lent H200 as DESIGN.md measures
# it (CuPy float32 GEMM about 51 TFLOP/s; pinned copies about 55 GB/s each way, 101 GB/s both at
# once), with x_half = 5e8 FLOPs, i.e. 10 us of fixed cost per step (CuPy launches ~10 us each).
DEFAULT_DEVICE = {"peak_flops": 50e12, "x_half": 5e8, "h2d": 55e9, "d2h": 55e9, "both": 101e9,
                  "latency": 0.0}


def device_models(peak_flops: float = DEFAULT_DEVICE["peak_flops"],
                  x_half: float = DEFAULT_DEVICE["x_half"], h2d: float = DEFAULT_DEVICE["h2d"],
                  d2h: float | None = None, both: float | None = DEFAULT_DEVICE["both"],
                  latency: float = 0.0) -> tuple[ComputeModel, PCIeModel]:
    """A compute and a PCIe model from nominal figures (one throughput curve for every layer)."""
    from .model import ThroughputCurve
    return (ComputeModel.uniform(ThroughputCurve(peak=peak_flops, x_half=x_half)),
            PCIeModel(h2d=h2d, d2h=h2d if d2h is None else d2h, both=both, latency=latency))


def profile_models(profile, gmap: GMAP | None = None,
                   granularity: str = TUNER_GRANULARITY) -> tuple[ComputeModel, PCIeModel]:
    """The fitted models of a profile (checked against ``gmap`` when given); curves per step
    by default (:data:`swap.model.TUNER_GRANULARITY`), per layer type as the paper with
    ``granularity="type"``."""
    if gmap is not None:
        profile.check_net(gmap)
    return (ComputeModel.from_profile(profile, granularity=granularity),
            PCIeModel.from_profile(profile))


# ------------------------------------------------------ iterations as CUDA graph launches
GRAPH_WARMUP = 2        # iterations before the timed ones (the first launches capture)
GRAPH_ITERATIONS = 5    # timed iterations of the calibration (their median)


@dataclass(frozen=True)
class GraphCalibration:
    """What :func:`calibrate_graph` measured: at minibatch ``k`` under a plan that keeps
    every feature map, the median iteration (``measured`` seconds, the iterations launched
    as CUDA graphs) against the profile's eager step times there (``steps``) and the solver
    update (``tail``); ``gap``: the seconds each step sheds so that the steps and the update
    make the measured iteration (:func:`graph_gap`)."""
    k: int
    measured: float
    steps: float
    tail: float
    gap: float
    launches: int
    iterations: int     # training iterations the calibration ran (they count as training)
    # ((k, gap), ...) by k: every calibrated k (this one and a smaller one, see
    # calibrate_graph), for ComputeModel.gap_points
    points: tuple = ()


def graph_model(model: ComputeModel, gap: float, tail: float | None = None,
                points=()) -> ComputeModel:
    """The compute model of iterations that run as CUDA graph launches: every step time less
    ``gap`` seconds (:func:`calibrate_graph`'s; at most :data:`swap.model.GAP_SHARE` of it), or
    less the gap at its k where ``points`` ((k, gap), ...) were calibrated at several k
    (:meth:`swap.model.ComputeModel.gap_at`), no host bound (the host issues one launch per
    iteration, not the steps), and the solver update (``tail``, default the model's own) the
    only time outside the steps (the eager gaps between steps are gone too)."""
    import dataclasses

    from .model import IterationOverhead
    tail = _tail_of(model) if tail is None else float(tail)
    points = tuple(sorted((int(k), float(g)) for k, g in points))
    return dataclasses.replace(model, gap=float(gap), gap_points=points, host=None,
                               overhead=IterationOverhead(a=tail, b=0.0, tail=tail))


def graph_gap(times, target: float) -> float:
    """The gap ``g`` (seconds per step) with ``sum_j (t_j - min(g, GAP_SHARE t_j)) = target``
    for eager step times ``times`` (0 where the target is not below their sum; the largest
    gap, every step at its floor, where it is below what the floors allow)."""
    from .model import GAP_SHARE
    t = np.asarray(times, dtype=np.float64)
    total = float(t.sum())
    if not len(t) or target >= total:
        return 0.0

    def shed(g):
        return float(np.minimum(g, GAP_SHARE * t).sum())
    lo, hi = 0.0, float(GAP_SHARE * t.max())
    if total - shed(hi) >= target:
        return hi
    for _ in range(60):
        mid = 0.5 * (lo + hi)
        lo, hi = (mid, hi) if total - shed(mid) > target else (lo, mid)
    return 0.5 * (lo + hi)


# the second graph calibration runs at the first's k divided by this (calibrate_graph)
GRAPH_SMALL_K = 4


def largest_copy_free_k(gmap: GMAP, plan_budget: int, scratch=None, *, k_max: int) -> int:
    """The largest k <= ``k_max`` at which every feature map fits on the device together
    (the naive plan with every feature map pinned, within ``plan_budget - scratch(k)``), so
    that an iteration there offloads nothing and is compute alone; 0 where even k = 1 does not.

    Not Caffe's plan ``"none"``, which also keeps every convolution's own cuDNN workspace for
    the whole iteration: ResNet-101's saved GMAP (H200, 2026-11-29) needs 13.1 GiB for it at
    k = 1 (8.2 GiB of them the per-layer workspaces), so under that rule no k was calibrated
    in 12 GiB, where its dynamic plans keep every map up to k = 98."""
    from .plan import plan_bytes_at
    pinned = frozenset(gmap.feature_maps())

    def fits(k):
        reserve = 0 if scratch is None else scratch(k)
        return plan_bytes_at(gmap, "naive", k, pinned)[0] <= plan_budget - reserve
    return largest_k(fits, int(k_max))


def _time_as_graph(solver, dec: Decision, budget: int, plan_budget: int, scratch, model, pcie,
                   warmup: int, iterations: int, say) -> tuple:
    """Install ``dec`` with the iteration as a CUDA graph, train ``warmup`` iterations, then
    ``iterations`` each waited for: ``(executor, median seconds)`` (the executor says whether
    the iterations were captured)."""
    import statistics
    import time
    reserve = 0 if scratch is None else scratch(dec.k_star)
    ex = install_decision(solver, dec, budget, int(plan_budget) - reserve,
                          scratch=None if scratch is None else reserve, model=model, pcie=pcie,
                          log=say)
    ex.use_graph()
    xp = solver.net.xp

    def sync():
        if xp is not np:          # pragma: no cover - GPU machine only
            xp.cuda.runtime.deviceSynchronize()
    for _ in range(int(warmup)):
        solver.step(1)
    times = []
    for _ in range(int(iterations)):
        sync()
        t0 = time.perf_counter()
        solver.step(1)
        sync()
        times.append(time.perf_counter() - t0)
    return ex, (statistics.median(times) if times else float("nan"))


def calibrate_graph(solver, gmap: GMAP, model: ComputeModel, pcie: PCIeModel, plan_budget: int,
                    budget: int, *, k_max: int, scratch=None, warmup: int = GRAPH_WARMUP,
                    iterations: int = GRAPH_ITERATIONS, log=None) -> tuple:
    """How fast the iteration runs as a CUDA graph, against the eager profile's step times.

    The profile times each step eagerly, with the host issuing its kernels; launched as one
    graph (``--cuda-graph``, :mod:`swap.graph`) the same steps run without the host's gaps
    within and between them, and the host's issue time no longer bounds the iteration.
    Measured on the H200 (2026-11-28, ResNet-152 in 12 GiB, every map kept): 45.4, 61.8,
    119.0 and 223.5 ms of steps as graphs at k = 9, 16, 41 and 83 against 61.9, 77.3, 132.5
    and 235.3 ms of eager profiled steps: 12 to 16.5 ms less at every k, about the same
    per step, while a factor fitted at one k is 0.73 there and 0.95 at another.
    The eager model's plan at 92 ran 9.6 % slower than ``none`` as a graph, with its copies
    timed for the slower eager forward (with this calibration the plans at 83 and 85 still
    ran 1.6 and 5.2 % slower: the captured copies cost compute time of their own, which no
    profile holds yet).

    So before deciding, this trains ``warmup + iterations`` real iterations as graph
    launches at the largest k, at most ``k_max``, that keeps every feature map on the device
    (:func:`largest_copy_free_k`; smaller where the dynamic plan there still offloads), and
    again at a quarter of it (:data:`GRAPH_SMALL_K`), and takes at each the gap per step that
    makes the profile's steps there, plus the solver update, the median measured iteration
    (:func:`graph_gap`); the model's gap is linear in k between the two, the end values
    beyond (:func:`graph_model`, :meth:`swap.model.ComputeModel.gap_at`).  One gap does not
    hold across k: ResNet-152 on the H200 (2026-11-29, one gap of 8.07 us calibrated at
    k = 9) ran 56.6, 100.6 and 183.7 ms as graphs at 16, 35 and 71 where that model said
    59.7, 95.7 and 171.0: the eager steps shed about 10 us each at 16, 4.6 at 35 and none
    at 71 (a graph there ran as long as the eager iteration).  Returns ``(calibration or
    None, runs)``, runs the ``((k, iterations), ...)`` it trained (they count as training):
    None where no k keeps every map or the first k's iterations are not captured (the reason
    is logged; the eager model stands); where only the second k's are not, the first k's gap
    stands alone."""
    def say(msg):
        if log is not None:
            log(msg)
    k = largest_copy_free_k(gmap, int(plan_budget), scratch, k_max=int(k_max))
    if k < 1:
        say("cuda_graph calibration: no minibatch keeps every feature map within the budget; "
            "the eager model stands")
        return None, ()
    dec = plan_at(gmap, k, plan_budget, model, pcie, scratch=scratch)
    while dec.plan.host_bytes and k > 1:      # the dynamic plan laid it out otherwise
        k = max(1, k * 9 // 10)
        dec = plan_at(gmap, k, plan_budget, model, pcie, scratch=scratch)
    tail = _tail_of(model)
    runs, points, first = [], [], None
    small = k // GRAPH_SMALL_K
    for kc in (k, small) if small >= 1 else (k,):
        dc = dec if kc == k else plan_at(gmap, kc, plan_budget, model, pcie, scratch=scratch)
        ex, measured = _time_as_graph(solver, dc, budget, plan_budget, scratch, model, pcie,
                                      warmup, iterations, say)
        runs.append((kc, int(warmup) + int(iterations)))
        if not ex.graph_captured:
            say(f"cuda_graph calibration at k = {kc}: the iteration is not captured "
                f"({ex.graph_refused or 'no launch yet'})"
                + ("; the eager model stands" if first is None else "; one gap stands"))
            if first is None:
                return None, tuple(runs)
            break
        eager = model.times_fn(gmap)(kc)
        gap = graph_gap(eager, measured - tail)
        points.append((kc, gap))
        say(f"cuda_graph calibration at k = {kc} (every feature map kept): "
            f"{1e3 * measured:.1f} ms per iteration as graph launches against "
            f"{1e3 * float(np.sum(eager)):.1f} ms of eager profiled steps + {1e3 * tail:.1f} ms "
            f"update: every step {1e6 * gap:.2f} us shorter")
        if first is None:
            first = (kc, measured, float(np.sum(eager)), gap, ex.graph_launches)
    kc, measured, steps, gap, launches = first
    cal = GraphCalibration(k=kc, measured=measured, steps=steps, tail=tail, gap=gap,
                           launches=launches, iterations=sum(n for _, n in runs),
                           points=tuple(sorted(points)))
    if len(points) > 1:
        say("cuda_graph model: the gap per step linear in k between "
            + " and ".join(f"{1e6 * g:.2f} us at k = {q}" for q, g in cal.points)
            + ", the end values beyond; no host bound")
    return cal, tuple(runs)


def _graph_calibrates(solver) -> bool:
    """Whether :func:`train_dynamic` calibrates its model on graph launches: ``--cuda-graph``
    on the GPU."""
    return bool(getattr(solver, "cuda_graph", False)) and solver.net.mode == "GPU"


class _Untrained:
    """A block of iterations that leaves no trace on ``solver``'s training
    (:func:`train_dynamic` ``train_before=False``): on leaving it, the train net's layer blobs
    (weights, biases, BatchNorm's statistics), the update rule's state, the iteration and
    step counts, the loss average, the RNGs and the data layers' positions are as they were
    on entering.  A worker of the parameter server or of NCCL joins its peers at the
    solver's iteration with the weights every rank starts from; the graph calibration's
    iterations (:func:`calibrate_graph`) must not move either.  The copies are kept on the
    host, outside the device's budget (:meth:`minicaffe.solver.Solver.training_state`)."""

    def __init__(self, solver):
        self.solver = solver

    def __enter__(self):
        self.state = self.solver.training_state()
        return self

    def __exit__(self, *exc):
        self.solver.restore_training_state(self.state)
        return False


# ------------------------------------------------------ three training stages
@dataclass(frozen=True)
class TrainingDecision:
    """What :func:`train_dynamic` decided: the tuner's decision and the learning rate."""
    decision: Decision
    base_lr: float
    lr: float
    lr_rule: str
    convexity: float
    max_iter: int
    profile: object = field(default=None, repr=False)
    plan_budget: int | None = None      # what the plans and the scratch reserve share (bytes)
    scratch: object = field(default=None, repr=False)    # the ScratchModel S(k), or None
    host_budget: int | None = None
    model: object = field(default=None, repr=False)      # the ComputeModel the decision used
    graph: GraphCalibration | None = None                # under --cuda-graph: its calibration
    # the GMAP the decision was made on (the net at k_base).  A GMAP built at another k can
    # predict a little differently: a loss layer's FLOPs count its one-element top, the same
    # at every k, where GMAP.at scales every step's FLOPs with k.
    gmap: GMAP | None = field(default=None, repr=False)


def _schedule_of(param) -> dict:
    """The solver fields that set the learning rate at an iteration (JSON-ready)."""
    return {"base_lr": float(param.base_lr), "gamma": float(param.gamma),
            "stepsize": int(param.stepsize), "stepvalue": [int(v) for v in param.stepvalue]}


def _set_schedule(param, fields: dict):
    """Put back what :func:`_schedule_of` read (the fields it has)."""
    for name in ("base_lr", "gamma", "stepsize"):
        if name in fields:
            setattr(param, name, fields[name])
    if "stepvalue" in fields:
        del param.stepvalue[:]
        param.stepvalue.extend(fields["stepvalue"])


def _rescale_schedule(param, start_iter: int, images_done: int, k_base: int, k_star: int) -> int:
    """Keep the epochs (images) of the solver's schedule: the iterations left at k_base become
    ``ceil(images left / k*)`` at k*; iteration-based lr steps move accordingly, and so does a
    per-iteration decay (gamma of ``inv`` and ``sigmoid`` times k*/k_base, of ``exp`` to the
    power k*/k_base), so that the learning rate follows the same curve per epoch.  Returns the
    new max_iter."""
    images_total = param.max_iter * k_base
    left = max(images_total - images_done, 0)
    new_max = start_iter + int(math.ceil(left / k_star))
    q = k_base / k_star
    if param.lr_policy in ("inv", "sigmoid"):
        param.gamma = param.gamma / q
    elif param.lr_policy == "exp":
        param.gamma = param.gamma ** (1.0 / q)
    if param.stepsize:
        param.stepsize = max(1, int(round(param.stepsize * q)))
    if len(param.stepvalue):
        vals = [max(1, int(round(v * q))) for v in param.stepvalue]
        del param.stepvalue[:]
        param.stepvalue.extend(vals)
    param.max_iter = new_max
    return new_max


def _no_copy_cost_words(profile) -> str:
    """Why a GPU profile's model prices the copies beside the compute at zero (the log of
    stage 2): the tuner's copy limit then rules out no k (session 29's ResNet-152 run: its
    calibration dropped as host-bound, k* 90 offloaded 24 % and ran 1.032x `none`)."""
    from .model import copy_slowdown_why
    _, why = copy_slowdown_why(profile)
    if why.startswith("$"):
        why = f"{why} sets it to zero"
    elif why == "missing":
        why = "the profile has no copy calibration"
    else:
        why = (f"the copy calibration at minibatch {profile.meta['copy_calibration']['k']} "
               f"gives no fit ({why})")
    return (f"the copies are priced at zero beside the compute: {why}; the "
            f"{100 * COPY_SLOWDOWN_LIMIT:.1f} % copy limit rules out no k")


def train_dynamic(solver, budget: int, *, auto_batch: bool = True, batch: int | None = None,
                  lr_rule: str = "eq9", convexity: float | None = None,
                  method: str = "linear", rule: str = "stall", profile=None,
                  save_profile: str | None = None, warmup: int = 1, iterations: int = 1,
                  granularity: str = TUNER_GRANULARITY, keep_epochs: bool = True,
                  delta: float = 0.0,
                  trace: str | None = None, log=None, scratch="auto", host_budget="auto",
                  fill: bool = True, objective: str = "throughput", scratch_extra: int = 0,
                  profile_pinned: bool | None = None, recompute=(),
                  max_batch: int | None = None, train_before: bool = True):
    """The three stages of section 6 on ``solver``: profile, decide, install the plan.

    1. **Profile** (unless ``profile`` is given, a Profile or a JSON path): real training
       iterations under the naive plan at k = 1/8 .. 1 of k_max (``auto_batch``) or at the
       fixed ``batch`` (:func:`swap.profiler.profile_solver`); at the fractions too where the
       fixed ``batch`` lies over the k_max of the scratch reserve's first estimate, and it is
       judged against the k_max of the measured transients.
    2. **Decide**: fit the model (:mod:`swap.model`), run Algorithm 2 (``auto_batch``) or plan the
       swaps at ``batch`` (:func:`plan_at`), scale the learning rate (:mod:`swap.lr`, only when k
       changes), rescale the iteration schedule to keep the epochs (``keep_epochs``).
    3. Resize the net to k*, install the dynamic plan with an Executor; the caller trains the
       rest with ``solver.solve()``.

    Returns ``(executor, TrainingDecision)``.  budget: bytes (required).  objective: what k*
    maximizes among the stall-free k (:func:`tune`).  recompute: names of forward layers whose
    groups the plan rebuilds in backward (:func:`tune`; the profile runs without).
    max_batch: with ``auto_batch``, k* is at most this (``train --max-batch``); the profile
    still spans k_max.  A k* over :data:`LARGE_BATCH_RATIO` times k_base is logged with a
    warning: eq. (9) then takes the rate towards 1 / c, and the run makes that many times
    fewer updates.

    scratch: the scratch reserve M_ws of Algorithm 2 (CuPy's transient allocations must fit in
    it, inside the budget): a :class:`swap.profiler.ScratchModel`, None (no reserve: the whole
    budget is planned, as before the arena allocator), or "auto": a model in GPU mode (first
    the estimate from the declared scratch, then the transients the profiling dry runs
    measure, fitted as a + b k; at least ``$MINICAFFE_SCRATCH``), None in CPU mode.
    scratch_extra: bytes the "auto" model adds at every k for what the training loop itself
    allocates through CuPy (:class:`swap.profiler.ScratchModel` ``extra``).
    host_budget: pinned host bytes the plans may offload to (k_max is bounded by it too, see
    :func:`swap.profiler.max_batch_scratch`); "auto": :func:`swap.profiler.default_host_budget`
    in GPU mode, None (no bound) in CPU mode.  With a
    model, k_max, every profiled plan, the search and the final plan get ``budget - test nets'
    persistent buffers - S(k)``, and the executor a reserve of S(k*).
    train_before: whether iterations before stage 3 train (the paper's profiling iterations
    do).  False for a worker that joins its peers at the solver's iteration (``--ps``): the
    profile must then be given, and the graph calibration's iterations are put back
    (:class:`_Untrained`).
    profile_pinned: profile the ks below the largest with every feature map pinned where they
    fit (:func:`swap.profiler.profile_solver` ``fit_none``); None: ``$MINICAFFE_PROFILE_PINNED``
    (1: on), off by default.  Measured on the H200 (session 13) it brought GoogLeNet's
    "none" at 180 from +7.8 to +3.6 % and kept ResNet-50 and -152 within 5 %, but ResNet-101's
    first profiled k (59) ran 20 % slower pinned than under the naive plan (without copies
    to wait for, the host's first iterations after the install fell behind the device within
    steps), and the model missed 62 and 23 by +10 and +29 %.
    """
    import os

    from .lr import DEFAULT_CONVEXITY, scale_lr
    from .profiler import (
        PROFILE_FRACTIONS,
        Profile,
        ScratchModel,
        default_host_budget,
        max_batch_scratch,
        profile_ks,
        profile_solver,
    )
    from .runtime import budget_for_plan, default_scratch, test_dynamic_bytes

    def say(msg):
        if log is not None:
            log(msg)

    if budget is None:
        raise ValueError("--swap dynamic needs --budget")
    if not train_before and profile is None:
        raise ValueError("train_before=False: profiling trains its iterations; give a saved "
                         "profile")
    budget = int(budget)
    convexity = DEFAULT_CONVEXITY if convexity is None else convexity
    net = solver.net
    if getattr(net, "executor", None) is not None:
        net.executor.close()
    from .runtime import set_lowering
    # what the naive and dynamic plans run with: the convolutions' lowering, and cuDNN
    # workspaces bounded by the budget's share, so that g0, the profile and the final plan
    # choose the same algorithms at every k (swap.runtime.set_lowering)
    set_lowering(net, "chunked", budget)
    net.reshape()
    k_base = net_batch_size(net)
    g0 = build_gmap(net, solver_type=solver.type)
    if recompute and not _is_auto(recompute):
        dynamic_recompute(g0, recompute)    # a name it refuses, before the profiling
    if isinstance(scratch, str):
        if scratch != "auto":
            raise ValueError(f"scratch: a ScratchModel, None or 'auto', not {scratch!r}")
        scratch = (ScratchModel.from_gmap(g0, floor=default_scratch() or 0,
                                          extra=scratch_extra)
                   if net.mode == "GPU" else None)
    if isinstance(host_budget, str):
        if host_budget != "auto":
            raise ValueError(f"host_budget: bytes, None or 'auto', not {host_budget!r}")
        host_budget = default_host_budget() if net.mode == "GPU" else None
    # what the plan and the scratch reserve share: the budget less the test nets' buffers
    base = budget_for_plan(solver, budget, scratch=0, gmap=g0)
    # and what a test pass takes between iterations, after the plan's resident regions
    t_dyn = test_dynamic_bytes(solver, gmap=g0)

    def reserve_at(k):
        return 0 if scratch is None else scratch(k)

    def reserve_words(k):
        if scratch is None:
            return ""
        return (f", scratch reserve {fmt_bytes(scratch(k))} at k = {k} "
                f"({scratch.describe()})")

    def need_at(k: int) -> int:
        """The smallest budget that trains minibatch k in stage 1: the naive plan's arena (it
        offloads every feature map, the least a plan at k takes) with room for a test pass,
        the test nets' persistent buffers and the scratch reserve at k."""
        return (plan_bytes_at(g0, "naive", k, test_dynamic=t_dyn)[0] + (budget - base)
                + reserve_at(k))

    def what_it_takes(k: int) -> str:
        """What ``need_at(k)`` is made of, in words."""
        words = [f"its arena needs {fmt_bytes(plan_bytes_at(g0, 'naive', k)[0])}"]
        if t_dyn:
            words[0] += (f", {fmt_bytes(plan_bytes_at(g0, 'naive', k, test_dynamic=t_dyn)[0])}"
                         f" with room for the test nets' pass ({fmt_bytes(t_dyn)}) after its "
                         "resident buffers")
        if budget > base:
            words.append(f"the test nets keep {fmt_bytes(budget - base)}")
        if reserve_at(k):
            words.append(f"the scratch reserve takes {fmt_bytes(reserve_at(k))}")
        return ("stage 1 profiles under the naive plan, which offloads every feature map (the "
                f"least a plan takes): at minibatch {k} " + "; ".join(words))

    k_max = max_batch_scratch(g0, base, scratch, host_budget=host_budget, test_dynamic=t_dyn)
    if k_max < 1:
        left = base - reserve_at(1)
        head = (f"budget {fmt_bytes(budget)} less {fmt_bytes(budget - left)} for the scratch "
                f"reserve and the test nets leaves {fmt_bytes(left)} for the plan: "
                if budget > left else f"budget {fmt_bytes(budget)}: ")
        need = need_at(1)
        msg = (f"{head}not even minibatch 1 of net {g0.net_name!r} fits under --swap dynamic: "
               f"{what_it_takes(1)}. The smallest budget that works is {fmt_bytes(need)} "
               f"({need} bytes) for minibatch 1")
        k_want = batch if batch is not None else (None if auto_batch else k_base)
        if k_want is not None and k_want != 1:
            need = need_at(k_want)
            msg += f", {fmt_bytes(need)} ({need} bytes) for minibatch {k_want}"
        raise BudgetError(msg + ".", budget=budget, min_budget=need, max_k=0,
                          strategy="dynamic", k=k_want or 1)

    # the minibatch trained without --auto-batch: --batch k, else the net's own
    fixed = batch if batch is not None else (None if auto_batch else k_base)

    def batch_fits():
        if fixed is not None and fixed > k_max:
            need = need_at(fixed)
            hint = (" (--auto-batch picks one that fits, --batch k sets one)" if batch is None
                    else "")
            if need <= budget and host_budget is not None:
                raise BudgetError(
                    f"minibatch {fixed} of net {g0.net_name!r} would offload more than the "
                    f"pinned host memory allows ({fmt_bytes(host_budget)}, --host-budget); "
                    f"the largest minibatch that fits is {k_max}{hint}", budget=budget,
                    max_k=k_max, strategy="dynamic", k=fixed)
            raise BudgetError(
                f"minibatch {fixed} of net {g0.net_name!r} does not fit budget "
                f"{fmt_bytes(budget)} under --swap dynamic: {what_it_takes(fixed)}. The "
                f"smallest budget that works is {fmt_bytes(need)} ({need} bytes) for minibatch "
                f"{fixed}; the largest minibatch that fits {fmt_bytes(budget)} is {k_max}"
                f"{hint}.", budget=budget, min_budget=need, max_k=k_max, strategy="dynamic",
                k=fixed)

    # A fixed batch over k_max while the reserve is still the estimate from the declared
    # scratch (cuDNN's workspaces at their bound, far above what runs: VGG-16 at 12 GiB, 4.0
    # GiB at 100, 64.5 MiB once measured, H200, session 29) is judged against the k_max the
    # measured transients give: a given profile's, or else those of a profile taken as
    # --auto-batch takes it, at fractions of that k_max (a given profile was refused
    # before its transients were read: VGG-16 at 200, session 30).
    measure_first = (batch is not None and batch > k_max and scratch is not None
                     and not scratch.measured)
    if not measure_first and (batch is not None or scratch is None or scratch.measured):
        batch_fits()    # (the net's own k is not judged on a GPU reserve's first estimate)
    # A run resumed from a snapshot of a decided run (Solver.swap_decision, restored with the
    # state): its iterations since the decision ran at that k*, not at k_base, and its
    # profiling iterations go on at the decided rate; the file's schedule comes back below,
    # before the learning rate for this k* is scaled from it.
    resumed = getattr(solver, "swap_decision", None)
    file_schedule = _schedule_of(solver.param)
    if resumed:
        images = (int(resumed["images"])
                  + (solver.iter - int(resumed["iter"])) * int(resumed["k"]))
        _set_schedule(solver.param, resumed.get("schedule", {"base_lr": resumed["lr"]}))
        say(f"AccUDNN stage 1: resumed at iteration {solver.iter}, {images} images into a run "
            f"decided at k* {resumed['k']} with learning rate {resumed['lr']:g}: the profiling "
            "iterations go on at that rate")
    else:
        images = solver.iter * k_base      # images trained so far (at k_base)
    # ---- stage 1: dynamic information
    if profile is None:
        ks = profile_ks(k_max) if auto_batch or measure_first else (batch or k_base,)
        if measure_first:
            say(f"AccUDNN stage 1: minibatch {batch} is over k_max {k_max} with the scratch "
                "reserve estimated from the declared scratch: profiling fractions of k_max "
                "to measure it")
        if profile_pinned is None:
            profile_pinned = os.environ.get("MINICAFFE_PROFILE_PINNED", "0") == "1"
        say(f"AccUDNN stage 1: profiling minibatches {list(ks)} under the naive plan "
            + ("(below the largest, with every feature map pinned where they fit) "
               if profile_pinned else "")
            + f"(k_max {k_max} at budget {fmt_bytes(budget)}{reserve_words(k_max)}"
            + (f"; pinned host memory at most {fmt_bytes(host_budget)}" if host_budget else "")
            + ")")
        it0 = solver.iter
        profile = profile_solver(solver, budget, ks, warmup=warmup, iterations=iterations,
                                 log=say, scratch=scratch, plan_budget=base,
                                 fractions=(PROFILE_FRACTIONS if auto_batch or measure_first
                                            else None),
                                 host_budget=host_budget, fit_none=profile_pinned)
        side_runs = profile.meta.get("host_runs", []) + profile.meta.get("copy_runs", [])
        images += sum(k * n for k, n in side_runs)
        it0 += sum(n for _, n in side_runs)
        # every profiled k's iterations (the fractions', retries', and a low k's)
        images += sum(k * n for k, n in profile.meta["runs"])
        assert solver.iter - it0 == sum(n for _, n in profile.meta["runs"])
        if scratch is not None:
            k_max = int(profile.meta.get("k_max", k_max))
        profile = with_gmap(profile, g0, k_max, solver.type, budget - base, host_budget, t_dyn)
        if save_profile:
            profile.save(save_profile)
            say(f"Profile saved to {save_profile}")
    elif not isinstance(profile, Profile):
        path = profile
        profile = Profile.load(path)
        say(f"AccUDNN stage 1: profile of {profile.net!r} on {profile.device} loaded from {path}")
        if net.mode == "GPU" and profile.mode == "GPU":
            from .profiler import cudnn_api_now
            was, now = profile.meta.get("cudnn_api", "legacy"), cudnn_api_now()
            if was != now:
                say(f"AccUDNN stage 1: WARNING: the profile was measured with cuDNN's {was} "
                    f"API and this run calls the {now} API (--cudnn-api): its convolutions "
                    "run other engines, so the predicted times are the other API's")
        if not profile.host_samples and net.mode == "GPU" and profile.mode == "GPU":
            # a profile from before the host's own issue time: take it now (a few seconds)
            import dataclasses
            from .profiler import host_issue_ks, profile_host_issue
            samples, runs, meta = profile_host_issue(
                solver, budget, host_issue_ks(min(profile.ks)), scratch=scratch, log=say)
            images += sum(k * n for k, n in runs)
            profile = dataclasses.replace(profile, host_samples=tuple(samples),
                                          meta={**profile.meta, **meta, "host_runs": runs})
    if net.mode == "GPU" and profile.mode == "GPU" and profile.meta.get("searched"):
        # cuDNN's search at the ks the decision asks about (swap.model: priced by the search)
        import dataclasses
        from .profiler import device_name, search_probe
        if profile.device == device_name(net):
            profile = dataclasses.replace(profile, search_probe=search_probe(net, profile.meta))
    if scratch is not None and profile.mode == net.mode and profile.meta.get("transients"):
        for k, peak in profile.meta["transients"]:
            scratch.add(k, peak)
        k_max = max_batch_scratch(g0, base, scratch, host_budget=host_budget,
                                  test_dynamic=t_dyn)
    if measure_first:
        batch_fits()
    # ---- stage 2: decision
    model, pcie = profile_models(profile, g0, granularity)
    say(f"AccUDNN stage 2: PCIe model h2d {pcie.h2d / 1e9:.2f} GB/s, d2h {pcie.d2h / 1e9:.2f} "
        f"GB/s, latency {1e6 * pcie.latency:.1f} us")
    if pcie.slows:
        cal = profile.meta.get("copy_calibration") or {}
        src = (f"calibrated at minibatch {cal['k']}, every feature map kept against the naive "
               "plan" if cal else "given")
        per_step = (f", and a step with a copy beside it {1e6 * pcie.step_cost:.1f} us"
                    if pcie.step_cost > 0 else "")
        say(f"AccUDNN stage 2: compute beside a copy takes {100 * pcie.slow_out:.1f} % longer "
            f"(offload), {100 * pcie.slow_in:.1f} % (prefetch){per_step} ({src}); a k is "
            f"stall-free only if its copies add at most {100 * COPY_SLOWDOWN_LIMIT:.1f} % to "
            "its compute")
    elif profile.mode == "GPU":
        say("AccUDNN stage 2: " + _no_copy_cost_words(profile))
    if recompute and auto_batch and RECOMPUTE_COST_LIMIT is not None:
        say(f"AccUDNN stage 2: a k whose plan recomputes is stall-free only if its "
            f"recomputations add at most {100 * RECOMPUTE_COST_LIMIT:.1f} % to its compute")
    if model.overhead is not None:
        oh = model.overhead
        say(f"AccUDNN stage 2: time outside the layer steps {1e3 * oh.a:.3f} ms + "
            f"{1e6 * oh.b:.3f} us x k per iteration"
            + ("" if profile.solver_steps else " (gaps between steps only: the profile has no "
               "solver-step marks)"))
    if model.host is not None:
        hm = model.host
        if hm.whole > 0.0:
            say(f"AccUDNN stage 2: a whole iteration takes the host {1e3 * hm.whole:.3f} ms at "
                f"minibatch {hm.whole_k} without timing hooks (a floor under the predicted "
                f"iteration; the steps with hooks: {1e3 * hm.intercept:.3f} ms)")
        else:
            say(f"AccUDNN stage 2: host issue time of the steps {1e3 * hm.intercept:.3f} ms + "
                f"{1e6 * hm.slope:.3f} us x k per iteration (a floor under the predicted "
                f"iteration: {1e3 * hm(k_max):.1f} ms at k_max {k_max})")
    if scratch is not None:
        say(f"AccUDNN stage 2: k_max {k_max}{reserve_words(k_max)}")
    calibration = None
    if _graph_calibrates(solver):
        # the iterations will run as CUDA graph launches: time such iterations at two k and
        # scale the eager profile's steps to them
        it0 = solver.iter
        if train_before:
            calibration, runs = calibrate_graph(solver, g0, model, pcie, base, budget,
                                                k_max=k_max, scratch=scratch, log=say)
            images += sum(k * n for k, n in runs)     # at each calibrated k in turn
            assert solver.iter - it0 == sum(n for _, n in runs)
        else:
            with _Untrained(solver):
                calibration, runs = calibrate_graph(solver, g0, model, pcie, base, budget,
                                                    k_max=k_max, scratch=scratch, log=say)
            say(f"cuda_graph calibration: its {sum(n for _, n in runs)} iteration(s) did not "
                f"train (weights, solver state and iteration {solver.iter} put back)")
    eager_model = model
    if calibration is not None:
        model = graph_model(model, calibration.gap, calibration.tail, calibration.points)

    cap = k_max if max_batch is None else max(1, min(k_max, int(max_batch)))
    if auto_batch and cap < k_max:
        say(f"AccUDNN stage 2: k* searched up to --max-batch {cap} (k_max {k_max})")

    def decide(m):
        """The decision on ``m``: Algorithm 2 up to ``cap``, or the plan at the fixed k."""
        if auto_batch:
            d = tune(g0, base, m, pcie, method=method, rule=rule, k_max=cap, delta=delta,
                     scratch=scratch, fill=fill, objective=objective, recompute=recompute,
                     test_dynamic=t_dyn)
            return replace(d, k_max=k_max)
        return plan_at(g0, batch or k_base, base, m, pcie, rule=rule, delta=delta,
                       scratch=scratch, fill=fill, recompute=recompute, test_dynamic=t_dyn)
    dec = decide(model)
    if calibration is not None:
        # the graph's steps are shorter, so its copies have less compute to hide behind: where
        # the eager iteration's plan is predicted clearly faster, the run goes eagerly
        eager = decide(eager_model)
        go_eager, words = graph_or_eager(dec, eager)
        say(words)
        if go_eager:
            solver.cuda_graph = False
            dec, model, calibration = eager, eager_model, None
    # the plan is installed on the net built at k* before the learning rate is set: where the
    # decided plan does not fit that net, install_decision may lower k*
    ex = install_decision(solver, dec, budget, base - reserve_at(dec.k_star),
                          scratch=None if scratch is None else reserve_at(dec.k_star),
                          trace=trace, model=model, pcie=pcie, log=say,
                          lower_k=auto_batch)
    dec = ex.decision
    k_star = dec.k_star
    probe = profile.search_probe
    if probe is not None and getattr(probe, "ks", None):
        say(f"AccUDNN stage 2: cuDNN searched the convolutions at {len(probe.ks)} more "
            f"minibatches for the model ({probe.seconds:.1f} s)")
        if save_profile:
            profile.save(save_profile)      # with the searches the decision added
    _set_schedule(solver.param, file_schedule)
    base_lr = float(solver.param.base_lr)
    lr = base_lr if k_star == k_base else scale_lr(base_lr, k_star, k_base, lr_rule, convexity)
    solver.param.base_lr = lr
    max_iter = solver.param.max_iter
    if keep_epochs and k_star != k_base:
        max_iter = _rescale_schedule(solver.param, solver.iter, images, k_base, k_star)
    for line in dec.describe().splitlines():
        say("AccUDNN decision: " + line)
    say(f"AccUDNN decision: learning rate {base_lr:g} at k_base {k_base} -> {lr:g} at k* "
        f"{k_star} (rule {lr_rule}" + (f", convexity {convexity:g}" if lr_rule == "eq9" else "")
        + f"); training to iteration {max_iter}"
        + (" (same number of images)" if keep_epochs and k_star != k_base else ""))
    if k_star > LARGE_BATCH_RATIO * k_base:
        say(f"AccUDNN decision: WARNING: k* is {k_star / k_base:.1f} times k_base: the run makes "
            f"that many times fewer updates at learning rate {lr:g}. Without a warm-up, training "
            f"this far beyond the base minibatch may not converge in the same epochs; "
            f"--max-batch caps k*, --lr-rule sets the rate")
    # what a snapshot keeps, for a resumed run to go on with (minicaffe.cli, Solver)
    solver.swap_decision = {"k": int(k_star), "k_base": int(k_base), "lr": float(lr),
                            "base_lr": base_lr, "lr_rule": lr_rule,
                            "convexity": float(convexity), "iter": int(solver.iter),
                            "images": int(images), "schedule": _schedule_of(solver.param)}
    # ---- stage 3: train the rest under the plan
    strategy = ex.plan.strategy
    say(f"AccUDNN stage 3: training from iteration {solver.iter} at minibatch {k_star} under the "
        + ("dynamic plan" if strategy == "dynamic" else
           f"plan {strategy!r} (nothing to swap at this k)")
        + (f" with a scratch reserve of {fmt_bytes(reserve_at(k_star))}"
           if scratch is not None else ""))
    return ex, TrainingDecision(decision=dec, base_lr=base_lr, lr=lr, lr_rule=lr_rule,
                                convexity=convexity, max_iter=max_iter, profile=profile,
                                plan_budget=base, scratch=scratch, host_budget=host_budget,
                                model=model, graph=calibration, gmap=g0)


def with_gmap(profile, gmap: GMAP, k_max: int, solver_type: str, test_net_bytes: int,
              host_budget: int | None = None, test_dynamic: int = 0):
    """``profile`` with the GMAP the tuner decides on (``meta["gmap"]``,
    :func:`swap.gmap.gmap_to_dict`, its per-k sizes sampled up to ``k_max`` and at the
    profiled ks), the bytes the test nets take from the budget (``meta["test_net_bytes"]``)
    and take while a test pass runs (``meta["test_dynamic_bytes"]``), and the pinned host memory that bounds k_max (``meta["host_budget"]``, None: unbounded),
    so that ``minicaffe plan`` on another machine plans what this one would
    (``--layout device``)."""
    import dataclasses
    from .gmap import gmap_to_dict, sample_ks
    ks = sample_ks(k_max, extra=tuple(profile.ks) + (gmap.k,))
    return dataclasses.replace(profile, meta={
        **profile.meta, "gmap": gmap_to_dict(gmap, ks, solver_type=solver_type),
        "test_net_bytes": int(test_net_bytes), "test_dynamic_bytes": int(test_dynamic),
        "host_budget": None if host_budget is None else int(host_budget)})


def graph_or_eager(graph: Decision, eager: Decision) -> tuple:
    """``(go eagerly, the log line)`` for a ``--cuda-graph`` run, given the decision on the
    graph-calibrated model and the one on the eager model: eagerly where the eager decision
    is predicted more than :data:`GRAPH_KEEP_MARGIN` faster (the graph's shorter steps hide
    fewer copies, so at a tight budget its plan may stall where the eager one does not)."""
    def at(d):
        return (f"{d.images_per_s:.1f} images/s at k = {d.k_star}"
                + ("" if d.stall_free else ", stalling"))
    if eager.images_per_s > (1 + GRAPH_KEEP_MARGIN) * graph.images_per_s:
        return True, (f"cuda_graph: WARNING: the eager iterations are predicted faster than "
                      f"graph launches ({at(eager)} against {at(graph)}): training eagerly")
    return False, f"cuda_graph: graph launches predicted at {at(graph)}, eagerly {at(eager)}"


# --cuda-graph is dropped where the eager iteration's decision is predicted this much faster
# than the graph's (train_dynamic): on two H200s (session 45) a parameter-server worker's graph
# plan for ResNet-152 at 85 was predicted at 266 ms (a 62 ms stall: the graph's shorter steps
# hide fewer copies) and ran 276.5; the eager plan was predicted at 226 and ran 214
GRAPH_KEEP_MARGIN = 0.02
MAX_LIVE_RETRIES = 16   # minibatches install_decision tries below k* on the live net
# a k* over this many times k_base is logged with a warning (train_dynamic): the digits solver
# at --budget 64M took k* = 2515 = 39 k_base once, eq. (9) gave 0.326 and nothing trained
LARGE_BATCH_RATIO = 8


def install_decision(solver, dec: Decision, budget: int, plan_budget: int, *,
                     scratch: int | None = None, trace: str | None = None,
                     model: ComputeModel | None = None, pcie: PCIeModel | None = None,
                     log=None, lower_k: bool = True):
    """Resize the solver's net to the decision's k and run it under the decided dynamic plan
    (its pins, region holds and recomputations, laid out within ``plan_budget``) in an arena
    of ``budget`` with a scratch reserve of ``scratch`` bytes; returns the Executor
    (``net.executor``), whose ``decision`` is the Decision it runs.

    The decision was made on the profile's GMAP; the net built here at k* searches its cuDNN
    algorithms at k* itself, and a workspace may come out larger than the profile's samples
    said (VGG-16 at 183 under a 1.5 GiB workspace cap, H200, session 33: the decided pins
    needed 12.06 GiB of an 11.94 GiB plan budget).  Where the decided plan does not fit the
    net as built, and ``model`` and ``pcie`` are given, the plan at k* is decided again on
    this GMAP (:func:`plan_at`: the pins chosen for the sizes found here), and that is logged
    and installed.  Where not even the plan that offloads every feature map fits at k*
    (VGG-16 at 183 again: the largest k that fits the live net was 180), k goes down to the
    largest the BudgetError names, the net is built there, and so on
    (:data:`MAX_LIVE_RETRIES` times at most); the executor's ``decision`` then has the
    smaller k*.  Without the models, or with ``lower_k`` False (a minibatch the user fixed,
    ``--batch k``) where k would have to go down, the BudgetError stands."""
    from .profiler import set_batch_size
    from .runtime import Executor, set_lowering
    net = solver.net
    if getattr(net, "executor", None) is not None:
        net.executor.close()
    set_lowering(net, "chunked", budget)   # as profiled and planned (train_dynamic)

    def built_at(k: int) -> GMAP:
        set_batch_size(net, k)
        net.reshape()
        return build_gmap(net, solver_type=solver.type)

    g = built_at(dec.k_star)
    try:
        plan = decided_plan(g, dec, plan_budget)
    except BudgetError as e:
        if model is None or pcie is None:
            raise
        say = log if log is not None else (lambda msg: None)
        say(f"AccUDNN: the decided plan at k* = {dec.k_star} does not fit the net as built "
            f"here ({e}); deciding the plan at {dec.k_star} again on this net's sizes")
        dec = _decided_on_live(g, dec, plan_budget, model, pcie, built_at,
                               say if lower_k else None)
        plan = dec.plan
    ex = Executor(net, plan, budget=budget, solver=solver, trace=trace, scratch=scratch)
    ex.decision = dec
    net.executor = ex
    return ex


def _decided_on_live(g: GMAP, dec: Decision, plan_budget: int, model, pcie, built_at,
                     lowering) -> Decision:
    """install_decision's fallback: ``dec`` with the plan decided again (:func:`plan_at`) on
    ``g``, the live net's GMAP at k*; where not even the all-offload plan fits there, at the
    largest smaller k the BudgetError names, the net built there by ``built_at(k)`` (at most
    :data:`MAX_LIVE_RETRIES` times).  ``lowering``: a log for each lower k, or None where k
    must not go down (the BudgetError then stands).  The search's findings stand (k_max,
    k_base, its evaluations); the plan, and k* where it went down, are new."""
    k = tried = dec.k_star
    for _ in range(MAX_LIVE_RETRIES):
        tried = k
        try:
            again = plan_at(g, k, plan_budget, model, pcie, rule=dec.rule, delta=dec.delta,
                            recompute=dec.recompute, test_dynamic=dec.test_dynamic)
            return replace(dec, k_star=k, dynamic=again.dynamic, stall_free=again.stall_free,
                           recompute=again.recompute, overhead=again.overhead,
                           host=again.host)
        except BudgetError as e:
            lower = k - 1 if e.max_k is None else min(k - 1, int(e.max_k))
            if lower < 1 or lowering is None:
                raise
            lowering(f"AccUDNN: not even the plan that offloads every feature map fits at {k} "
                     f"on this net ({e}); trying minibatch {lower}")
            k = lower
            g = built_at(k)
    raise BudgetError(f"no minibatch from {dec.k_star} down to {tried} fits "
                      f"{fmt_bytes(plan_budget)} on the net as built here", budget=plan_budget)


def decided_plan(g: GMAP, dec: Decision, plan_budget: int):
    """The decision's plan made again on ``g``, the net at k* built where it runs: its pins,
    region holds, recomputations and prefetch lead (:attr:`swap.plan.Plan.lead`), laid out
    within ``plan_budget``; the holds, then the lead, are dropped if the layout does not fit."""
    names = set(dec.pinned_names())
    pinned = frozenset(b.id for b in g.buffers if b.name in names)
    if dec.plan.strategy in RESIDENT_PLANS:  # nothing to swap (planner.resident)
        return make_plan(g, dec.plan.strategy, plan_budget, pinned)
    hold = _hold_by_name(dec, g)
    rec = dynamic_recompute(g, dec.recompute, pinned)
    lead = dec.plan.lead
    tries = [dict(hold=hold, lead=lead)] if hold else []
    tries += [dict(lead=lead)] if lead else []
    for options in tries:
        # a layout that exceeds the budget either raises (not even its just-in-time timing
        # fits) or comes back larger than the budget: either way, the next options
        try:
            plan = make_plan(g, "dynamic", plan_budget, pinned, recompute=rec, **options)
        except BudgetError:
            continue
        if plan.arena_bytes <= plan_budget:
            return plan
    return make_plan(g, "dynamic", plan_budget, pinned, recompute=rec)


def _hold_by_name(dec: Decision, g: GMAP) -> dict:
    """The decided plan's region holds (release step of each offloaded buffer), by name."""
    p = dec.plan
    src = p.gmap
    rel = {}
    off = {}
    from .plan import OFFLOAD, RELEASE, SWAP_OUT
    for op in p.ops:
        if op.kind == OFFLOAD:
            off[op.buffer] = op.step
        elif op.kind == RELEASE and op.stream == SWAP_OUT:
            rel[op.buffer] = op.step
    by_name = {src.buffers[b].name: s for b, s in rel.items() if s > off.get(b, s)}
    return {b.id: by_name[b.name] for b in g.buffers if b.name in by_name}


__all__ = ["METHODS", "Evaluation", "Search", "linear_search", "bisect_search", "Decision",
           "tune", "plan_at", "DEFAULT_DEVICE", "device_models", "profile_models",
           "TrainingDecision", "train_dynamic", "install_decision", "decided_plan", "with_gmap",
           "ENV_COPY_SLOWDOWN_LIMIT",
           "copy_slowdown_limit", "COPY_SLOWDOWN_LIMIT",
           "ENV_RECOMPUTE_COST_LIMIT", "recompute_cost_limit", "RECOMPUTE_COST_LIMIT"]
