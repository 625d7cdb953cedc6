"""Algorithm 1 (t_ready), constraint (6), and which feature maps to pin (paper, section 3.4).

Given a GMAP at minibatch k, a budget, the compute time of every step (:mod:`swap.model`, eq. 2)
and a PCIe model (eq. 5), this module predicts when each step's inputs are on the device and
decides which feature maps to *pin* (keep on the device, never offload) so that the compute
stream never waits:

    (6)   t_ready[j] <= sum_{r<j} t_r        (ready before layer j-1 finishes)

Two simulations of one iteration, both on three serial streams (compute, swap-out, swap-in):

* :func:`algorithm1` on a :class:`Sketch` (byte level, no layout; fast enough to run thousands of
  times inside the tuner's search).  It is the paper's Algorithm 1 made precise:

  - compute is serial: step j starts at ``sum_{r<j} t_r`` (the stall-free schedule, as the
    paper's Algorithm 1 estimates "the layer j_current that stream_compute is executing"), or,
    with ``propagate=True``, at ``max(end[j-1], t_ready[j])`` (what would really happen);
  - offloads are serial on the swap-out stream, in plan order; the offload of a feature map
    starts once the step of its last forward use has finished (the runtime's event wait);
  - prefetches are serial on the swap-in stream, in plan order (the naive plan's placement:
    each is issued before the earliest step p from which eq. (4) holds until its use).  A
    prefetch issued before step p starts at ``max(swap-in free, end[p-1], its offload done,
    T_mem)``: "a prefetch that finds no memory waits until enough earlier memory is released
    by the compute stream" -- the plan put it at p because the memory it needs is released by
    the steps before p, so it waits for step p-1 (the paper's j_satisfied);
  - eq. (4) in time: the plan counts an offloaded buffer as released right after its last
    forward use, but its bytes are only free when the copy is done.  T_mem is the earliest
    time at which ``usage[step] + bytes of offloads still in flight <= budget``; both a
    prefetch and a step's own allocations wait for it;
  - ``t_ready[j]`` = the latest of the prefetches step j needs and T_mem (0 when it awaits
    nothing); a step *violates* (6) when ``t_ready[j] > sum_{r<j} t_r``.  All violations are
    measured against the same stall-free schedule, so the set Omega can be resolved in one
    round; the two modes agree up to the first violation.

* :func:`simulate` replays an executable :class:`swap.plan.Plan` op by op, with the runtime's
  real dependencies (:mod:`swap.runtime`): a prefetch or allocation waits for the *region* it
  goes into to be released by its previous occupants (a compute release at that step's end, a
  swap-out release when its offload completes), a prefetch for its own offload, a step for the
  prefetches of the buffers it touches (``Plan.needs``).  It gives the predicted start and end of
  every op on every stream (the timeline that ``minicaffe plan --plot`` draws) and the memory in
  use over time, on which eq. (4) is checked (:meth:`Timeline.check_eq4`,
  :meth:`Timeline.check_regions`).

Transfers in the two directions share the link: a transfer that starts while the other copy
stream is busy (as far as already simulated) runs at the both-at-once rate of
:class:`swap.model.PCIeModel`.

Choices where the paper is vague (docs/SWAP.md discusses them):

* **How a stalled prefetch is resolved**: it waits (never reordered, never cancelled); the
  swap-in queue behind it waits too (FIFO, as a CUDA stream).
* **What "the data involved in Omega" is**: for each violating step j, the feature maps whose
  transfers occupy a copy stream during j's lateness window ``[end[j-1], t_ready[j]]`` (and the
  transfers queued before them in the same busy period of that stream), plus the feature maps
  j itself waits for.  Pinning one removes its transfer time from that busy period.
* **Which to pin first** (``rule``):

  - ``"stall"`` (default): the feature maps j waits for, the one whose prefetch ends last (the
    largest stall) first; then the others by transfer time, longest first.
  - ``"ratio"``: by bytes over the compute time of the step before its first backward use,
    largest first: the paper's own example (section 3.1) of an input that cannot hide behind a
    fast BN step.

  In each round, for every violating step in order, pins are added in that order, skipping
  those that do not fit (the just-in-time usage with the pin must stay within the budget: eq. 4),
  until the pinned transfer time covers the step's lateness (pins already chosen in the round
  count when they lie in its window); then the sketch is recomputed.  A k with no candidate that
  fits, or whose total lateness has not decreased for ``patience`` rounds, is infeasible.
* **Spare memory**: the paper pins into ``M_budget - M_peak(k)``; here a pinned feature map holds
  memory only from its first to its last use, and prefetches use whatever is free at each step,
  so pins and prefetches share the budget exactly (eq. 4 over the whole budget).
* **Region holds**: the executable plan's layout is fixed; :func:`make_dynamic_plan` keeps an
  offloaded region reserved until its copy is predicted done (:func:`hold_steps`), so that no
  allocation waits for an offload.
"""
from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field

import numpy as np

from .gmap import GMAP
from .model import D2H, H2D, PCIeModel
from .plan import (ALLOCATE, COMPUTE, OFFLOAD, PREFETCH, RECOMPUTE, RELEASE, SETUP, SWAP_IN,
                   SWAP_OUT,
                   BudgetError, Plan, _base_intervals, _place_returns, _sizes, _usage, arena_need,
                   make_plan)

RULES = ("stall", "ratio")


# ------------------------------------------------------------------- sketch
@dataclass(frozen=True)
class Sketch:
    """The naive plan with a pinned set at one k, at byte level (no layout): what Algorithm 1
    reads.

    sizes[b]: aligned bytes of buffer b.  swapped: offloaded buffer ids, in offload order.
    last_fwd / first_bwd: their last forward and first backward use (step); release_at[b]: the
    step after which its region is released (last_fwd, or later with a ``hold``).
    prefetch_at[b]: the step before which its prefetch is issued.  usage[j]: eq. (4)'s left
    side while step j computes (early prefetches); jit_usage[j]: the same with every prefetch
    just in time, the least the pinned set needs.
    """
    gmap: GMAP
    budget: int | None
    pinned: frozenset
    sizes: tuple
    swapped: tuple
    last_fwd: dict
    first_bwd: dict
    release_at: dict
    prefetch_at: dict
    prefetch_order: tuple
    usage: np.ndarray = field(repr=False)
    jit_usage: np.ndarray = field(repr=False)
    setup: int = 0
    recompute: tuple = ()

    @property
    def k(self) -> int:
        return self.gmap.k

    @property
    def fits(self) -> bool:
        """eq. (4) at step granularity for the just-in-time placement."""
        return self.budget is None or int(self.jit_usage.max(initial=self.setup)) <= self.budget

    def pin_cost(self, b: int) -> tuple[int, int]:
        """Steps ``[lo, hi)`` over which pinning ``b`` adds its bytes to ``jit_usage``."""
        return self.last_fwd[b] + 1, self.first_bwd[b]

    def step_times(self, times) -> np.ndarray:
        """t_j of every step with the recomputations run before it (``recompute``: the
        (step, forward step) pairs of the plan's RECOMPUTE ops)."""
        return with_recomputations(times, self.recompute)


def with_recomputations(times, pairs) -> np.ndarray:
    """``times`` (t_j of every step) with, for each (j, f) of ``pairs``, forward step f's time
    added to step j's: a RECOMPUTE op runs f again on the compute stream just before j."""
    if not len(pairs):
        return np.asarray(times, dtype=np.float64)      # no copy: the common case
    base = np.asarray(times, dtype=np.float64)
    t = base.copy()
    for j, f in pairs:
        t[j] += base[f]
    return t


def _pairs(recompute) -> tuple:
    """(step, forward step) of every recomputation of a RecomputePolicy (or None)."""
    if recompute is None:
        return ()
    return tuple((j, f) for j, steps in recompute.segments for f in steps)


def _uses(recompute) -> dict:
    """{buffer: uses} a RecomputePolicy gives (empty without one)."""
    return recompute.uses if recompute is not None else {}


def sketch(gmap: GMAP, budget: int | None, pinned=frozenset(), hold=None,
           recompute=None) -> Sketch:
    """The :class:`Sketch` of ``naive(pinned)`` (with ``hold``, see
    :func:`swap.plan.plan_dynamic`) at ``gmap.k`` under ``budget``.

    Uses the very interval functions of :mod:`swap.plan`, so the prefetch placement is the one
    the executable plan will have (up to the layout's fragmentation retry).
    :class:`Sketcher` computes the same faster when many pinned sets are tried at one k.
    recompute: a :class:`swap.plan.RecomputePolicy` (:func:`swap.plan.dynamic_recompute`)."""
    pinned = frozenset(pinned)
    sizes = _sizes(gmap)
    swap = set(gmap.feature_maps()) - pinned
    if recompute is not None:
        swap -= recompute.recomputed
    base, pending = _base_intervals(gmap, swap, hold, recompute)
    jit = _place_returns(gmap, base, pending, None, "jit")
    setup, jit_usage = _usage(gmap, jit, sizes)
    early = _place_returns(gmap, base, pending, budget, "early") if budget is not None else jit
    _, usage = _usage(gmap, early, sizes)
    prefetch_at = {iv[0]: iv[1] for iv in early if iv[3] == PREFETCH}
    return _make_sketch(gmap, budget, pinned, sizes, [p[0] for p in pending],
                        {p[0]: p[1] - 1 for p in pending}, prefetch_at, usage, jit_usage, setup,
                        recompute)


def _split_uses(gmap: GMAP, uses) -> tuple[dict, dict]:
    """{buffer: last forward use}, {buffer: first backward use} of the feature maps, with the
    uses a recomputation adds (``uses``: RecomputePolicy.uses)."""
    nf = gmap.n_forward
    last_fwd, first_bwd = {}, {}
    for b in gmap.feature_maps():
        u = uses.get(b, gmap.buffers[b].uses)
        last_fwd[b] = max(x for x in u if x < nf)
        first_bwd[b] = min(x for x in u if x >= nf)
    return last_fwd, first_bwd


def _make_sketch(gmap, budget, pinned, sizes, swapped, release_at, prefetch_at, usage, jit_usage,
                 setup, recompute=None, split=None) -> Sketch:
    lf, fb = split if split is not None else _split_uses(gmap, _uses(recompute))
    swapped = tuple(sorted(swapped, key=lambda b: (lf[b], b)))
    last_fwd = {b: lf[b] for b in swapped}
    first_bwd = {b: fb[b] for b in swapped}
    order = tuple(sorted(prefetch_at, key=lambda b: (prefetch_at[b], first_bwd[b], b)))
    return Sketch(gmap=gmap, budget=budget, pinned=frozenset(pinned), sizes=tuple(sizes),
                  swapped=swapped, last_fwd=last_fwd, first_bwd=first_bwd, release_at=release_at,
                  prefetch_at=prefetch_at, prefetch_order=order,
                  usage=np.asarray(usage, dtype=np.int64),
                  jit_usage=np.asarray(jit_usage, dtype=np.int64), setup=int(setup),
                  recompute=_pairs(recompute))


class Sketcher:
    """:func:`sketch` for many pinned sets at one (gmap, budget): sizes and the intervals of
    everything but the feature maps are computed once; the prefetch placement is the same
    loop as ``swap.plan._place_returns`` (tested equal)."""

    def __init__(self, gmap: GMAP, budget: int | None, recompute=None):
        self.gmap = gmap
        self.budget = budget
        self.recompute = recompute
        n = gmap.n_steps
        sizes = _sizes(gmap)
        self.sizes = sizes
        self.size_arr = np.asarray(sizes, dtype=np.int64)
        rebuilt = recompute.recomputed if recompute is not None else frozenset()
        fms = [b for b in gmap.feature_maps() if sizes[b] and b not in rebuilt]
        self.fms = fms
        base, _ = _base_intervals(gmap, set(), recompute=recompute)
        fmset = set(fms)
        setup, usage = _usage(gmap, [iv for iv in base if iv[0] not in fmset], sizes)
        self.setup = int(setup)
        self.base_usage = np.asarray(usage, dtype=np.int64)
        uses = _uses(recompute)
        self.split = _split_uses(gmap, uses)
        self.first = {b: uses.get(b, gmap.buffers[b].uses)[0] for b in fms}
        self.last = {b: uses.get(b, gmap.buffers[b].uses)[-1] for b in fms}
        self.last_fwd = {b: self.split[0][b] for b in fms}
        self.first_bwd = {b: self.split[1][b] for b in fms}
        self.n = n

    def sketch(self, pinned=frozenset(), hold=None) -> Sketch:
        n, sz = self.n, self.size_arr
        pinned = frozenset(pinned)
        delta = np.zeros(n + 1, dtype=np.int64)
        jit_delta = np.zeros(n + 1, dtype=np.int64)
        pending = []
        release_at = {}
        for b in self.fms:
            s = int(sz[b])
            if b in pinned:
                delta[self.first[b]] += s
                delta[self.last[b] + 1] -= s
                continue
            h = self.last_fwd[b]
            if hold and b in hold:
                h = min(max(int(hold[b]), h), self.first_bwd[b] - 1)
            delta[self.first[b]] += s
            delta[h + 1] -= s
            jit_delta[self.first_bwd[b]] += s
            jit_delta[self.last[b] + 1] -= s
            pending.append((b, h + 1, self.first_bwd[b], self.last[b]))
            release_at[b] = h
        pending.sort(key=lambda p: (p[2], p[0]))
        usage = self.base_usage + np.cumsum(delta[:n])
        jit = usage + np.cumsum(jit_delta[:n])
        budget = self.budget
        prefetch_at = {}
        if budget is None:
            early = jit
            for b, lo, first, last in pending:
                prefetch_at[b] = first
        else:
            early = usage.copy()
            for b, lo, first, last in pending:
                s = int(sz[b])
                p = first
                if lo < first:
                    suffix_max = np.maximum.accumulate(early[lo:first][::-1])[::-1]
                    ok = np.nonzero(suffix_max + s <= budget)[0]
                    if len(ok):
                        p = lo + int(ok[0])
                early[p:last + 1] += s
                prefetch_at[b] = p
        return _make_sketch(self.gmap, budget, pinned, self.sizes, [p[0] for p in pending],
                            release_at, prefetch_at, early, jit, self.setup, self.recompute,
                            self.split)


# -------------------------------------------------------------- Algorithm 1
@dataclass(frozen=True)
class Readiness:
    """Algorithm 1's output for one sketch.

    times[j]: t_j.  start/end[j]: compute of step j.  t_ready[j]: when its inputs and workspace
    are ready.  stall[j]: ``max(0, t_ready[j] - end[j-1])``, how long step j waits (with
    ``propagate``) or how late its data is against the stall-free schedule (without).
    offloads / prefetches: ``(buffer, start, end)`` in stream order.  violations: steps that
    break (6).  Where the PCIe model makes copies slow the compute beside them
    (:attr:`swap.model.PCIeModel.slow_out`), ``end[j] - start[j]`` exceeds ``times[j]`` by
    that (:attr:`interference`).
    """
    times: np.ndarray = field(repr=False)
    start: np.ndarray = field(repr=False)
    end: np.ndarray = field(repr=False)
    t_ready: np.ndarray = field(repr=False)
    stall: np.ndarray = field(repr=False)
    offloads: tuple = field(repr=False)
    prefetches: tuple = field(repr=False)
    violations: tuple = ()

    @property
    def feasible(self) -> bool:
        """Constraint (6) holds at every step."""
        return not self.violations

    @property
    def t_iter(self) -> float:
        """Predicted iteration time (stalls included when computed with ``propagate``)."""
        return float(self.end[-1]) if len(self.end) else 0.0

    @property
    def t_model(self) -> float:
        """eq. (2): the stall-free iteration time."""
        return float(self.times.sum())

    @property
    def total_stall(self) -> float:
        return float(self.stall.sum())

    @property
    def interference(self) -> float:
        """Seconds the copies added to the steps beside them (0 where they cost nothing)."""
        return max(0.0, float((self.end - self.start).sum() - self.times.sum()))

    def prefix(self) -> np.ndarray:
        """``sum_{r<j} t_r``: the right side of (6)."""
        return np.concatenate([[0.0], np.cumsum(self.times)[:-1]])


class _InFlight:
    """Offloads issued so far, as (end, bytes) in completion order (the swap-out stream is
    serial): answers "when do the bytes still in flight drop to at most x?"."""

    def __init__(self):
        self.q = deque()
        self.total = 0

    def push(self, end: float, nbytes: int):
        self.q.append((end, nbytes))
        self.total += nbytes

    def drop_until(self, t: float):
        """Forget offloads done by ``t`` (queries come with nondecreasing base times)."""
        q = self.q
        while q and q[0][0] <= t:
            self.total -= q.popleft()[1]

    def wait(self, t: float, allowed: float) -> float:
        """Earliest time >= t at which at most ``allowed`` bytes are in flight (no state
        change: ``t`` may be later than the next query's base time)."""
        left = self.total
        if left <= allowed:
            return t
        for end, nb in self.q:
            left -= nb
            if left <= allowed:
                return max(t, end)
        return t   # unreachable: allowed >= 0


def _spans(copies, at: int, start: float, horizon: float) -> tuple:
    """(index of the first copy of ``copies`` ((..., start, end), in stream order) not done by
    ``start``, the spans of those in flight before ``horizon``, relative to ``start``)."""
    n = len(copies)
    while at < n and copies[at][-1] <= start:
        at += 1
    out = []
    for i in range(at, n):
        a, b = copies[i][-2], copies[i][-1]
        if a >= horizon:
            break
        out.append((a - start, b - start))
    return at, out


def _stretched(pcie: PCIeModel, t: float, start: float, outs, ins, at: list) -> float:
    """Step time ``t`` beside the copies ``outs`` / ``ins`` in flight from ``start``
    (:meth:`swap.model.PCIeModel.stretch`); ``at``: the two streams' first copies not yet done,
    advanced in place."""
    horizon = start + t * (1.0 + pcie.slow_out + pcie.slow_in) + pcie.step_cost
    at[0], so = _spans(outs, at[0], start, horizon)
    at[1], si = _spans(ins, at[1], start, horizon)
    return pcie.stretch(t, so, si)


def algorithm1(sk: Sketch, times, pcie: PCIeModel, *, propagate: bool = False,
               tol: float | None = None) -> Readiness:
    """t_ready of every step of ``sk`` (Algorithm 1, see the module doc) and the violations of
    constraint (6).

    times: t_j of every step (``ComputeModel.step_times(gmap)``), to which the sketch's
    recomputations are added (:meth:`Sketch.step_times`).  propagate: False (the
    paper's Algorithm 1): the compute stream runs stall-free, step j from ``sum_{r<j} t_r``, and
    ``stall[j] = max(0, t_ready[j] - sum_{r<j} t_r)`` is how late step j's data would be (all
    violations are measured against the same stall-free schedule, so they can be resolved
    together).  True: step j starts at ``max(end[j-1], t_ready[j])`` and every later time moves
    with it (the prediction of what would happen, stalls included).  The two agree up to the
    first violation.  tol: seconds of lateness ignored per step (default ``1e-9 * sum(times)``,
    round-off).
    """
    g = sk.gmap
    n = g.n_steps
    t = np.asarray(times, dtype=np.float64)
    if len(t) != n:
        raise ValueError(f"{len(t)} step times for a GMAP of {n} steps")
    t = sk.step_times(t)
    tol = 1e-9 * float(t.sum()) + 1e-15 if tol is None else tol
    sizes = sk.sizes
    budget = sk.budget
    off_after = [[] for _ in range(n)]
    rel_after = [[] for _ in range(n)]
    for b in sk.swapped:
        off_after[sk.last_fwd[b]].append(b)
        rel_after[sk.release_at[b]].append(b)
    pre_before = [[] for _ in range(n)]
    needs = [[] for _ in range(n)]
    for b in sk.prefetch_order:
        pre_before[sk.prefetch_at[b]].append(b)
        needs[sk.first_bwd[b]].append(b)
    start = np.zeros(n)
    end = np.zeros(n)
    ready = np.zeros(n)
    stall = np.zeros(n)
    off_end = {}
    pre_end = {}
    offloads, prefetches = [], []
    inflight = _InFlight()
    si_free = so_free = 0.0
    slows = pcie.slows
    copy_at = [0, 0]
    usage = sk.usage
    prev = 0.0
    violations = []
    for j in range(n):
        allowed = None if budget is None else max(budget - int(usage[j]), 0)
        inflight.drop_until(prev)
        # prefetches issued before step j (plan order), on the serial swap-in stream
        for b in pre_before[j]:
            s = max(si_free, prev, off_end.get(b, 0.0))
            if allowed is not None:
                s = inflight.wait(s, allowed)
            e = s + pcie.seconds(sizes[b], H2D, so_free > s)
            si_free = e
            pre_end[b] = e
            prefetches.append((b, s, e))
        # compute of step j: its prefetches and its allocations (eq. 4 in time)
        r = 0.0
        if allowed is not None:
            w = inflight.wait(prev, allowed)
            if w > prev:            # the allocations wait for offloads to free their bytes
                r = w
        for b in needs[j]:
            r = max(r, pre_end[b])
        ready[j] = r
        start[j] = max(prev, r) if propagate else prev
        stall[j] = max(r - prev, 0.0)
        if stall[j] > tol:
            violations.append(j)
        end[j] = start[j] + (_stretched(pcie, t[j], start[j], offloads, prefetches, copy_at)
                             if slows else t[j])
        prev = end[j]
        # offloads after step j, on the serial swap-out stream
        for b in off_after[j]:
            s = max(so_free, end[j])
            e = s + pcie.seconds(sizes[b], D2H, si_free > s)
            so_free = e
            off_end[b] = e
            offloads.append((b, s, e))
        # the plan counts these bytes free from now on; they really are once copied out
        for b in rel_after[j]:
            inflight.push(off_end[b], sizes[b])
    return Readiness(times=t, start=start, end=end, t_ready=ready, stall=stall,
                     offloads=tuple(offloads), prefetches=tuple(prefetches),
                     violations=tuple(violations))


# ------------------------------------------------------------------ pinning
@dataclass(frozen=True)
class PinResult:
    """The outcome of :func:`choose_pins` at one k: feasible (constraint 6 holds), the pinned
    buffer ids, the last sketch and its readiness, the rounds of pinning, and the
    recomputation they were chosen with (a :class:`swap.plan.RecomputePolicy` or None)."""
    feasible: bool
    pinned: frozenset
    sketch: Sketch = field(repr=False)
    readiness: Readiness = field(repr=False)
    rounds: int = 0
    reason: str = ""
    recompute: object = field(default=None, repr=False)

    @property
    def k(self) -> int:
        return self.sketch.k


class _Stream:
    """The transfers of one copy stream in a readiness, for candidate queries: starts and ends
    are nondecreasing (the stream is serial), busy[i] is the first transfer of i's busy period
    (transfers queued back to back)."""

    def __init__(self, transfers, eps: float):
        self.buf = np.array([b for b, _, _ in transfers], dtype=np.int64)
        self.start = np.array([s for _, s, _ in transfers], dtype=np.float64)
        self.end = np.array([e for _, _, e in transfers], dtype=np.float64)
        self.gain = self.end - self.start
        m = len(transfers)
        busy = np.arange(m)
        if m > 1:
            new_period = self.start[1:] > self.end[:-1] + eps
            starts = np.concatenate([[0], np.nonzero(new_period)[0] + 1])
            busy = starts[np.searchsorted(starts, np.arange(m), side="right") - 1]
        self.busy = busy
        self.chosen = np.zeros(m, dtype=bool)
        self._orders: dict = {}

    def window(self, lo: float, hi: float, eps: float) -> tuple[int, int]:
        """Index range [a, b) of the transfers running during [lo, hi], extended back over
        their busy period (empty: a == b)."""
        i0 = int(np.searchsorted(self.end, lo + eps, side="right"))
        i1 = int(np.searchsorted(self.start, hi - eps, side="left"))
        if i0 >= i1:
            return 0, 0
        return int(self.busy[i0]), i1

    def order(self, a: int, key) -> np.ndarray:
        """Indices of busy period starting at a, sorted by ``key`` (cached per period)."""
        o = self._orders.get(a)
        if o is None:
            end = a
            while end < len(self.busy) and self.busy[end] == a:
                end += 1
            idx = np.arange(a, end)
            o = idx[np.lexsort((self.buf[idx], -key[idx]))]
            self._orders[a] = o
        return o


def _pin_round(sk: Sketch, r: Readiness, rule: str, times, budget, eps: float) -> dict:
    """One round of pinning for every violation of ``r`` (module doc): {buffer: gain}."""
    t = sk.step_times(times)
    streams = [_Stream(r.prefetches, eps), _Stream(r.offloads, eps)]
    if rule == "stall":
        keys = [st.gain for st in streams]
    elif rule == "ratio":
        def ratio(bufs):
            out = np.empty(len(bufs))
            for i, b in enumerate(bufs):
                j = sk.first_bwd[int(b)]
                hide = float(t[j - 1]) if j > 0 else 0.0
                out[i] = sk.sizes[int(b)] / max(hide, 1e-12)
            return out
        keys = [ratio(st.buf) for st in streams]
    else:
        raise ValueError(f"unknown pinning rule {rule!r} (known: {', '.join(RULES)})")
    pre_end = {b: e for b, _, e in r.prefetches}
    own_of: dict = {}
    for b in sk.swapped:
        if b in pre_end:
            own_of.setdefault(sk.first_bwd[b], []).append(b)
    pos = [{int(b): i for i, b in enumerate(st.buf)} for st in streams]
    jit = sk.jit_usage.copy()
    chosen: dict = {}
    rejected = set()        # usage only grows within a round: a pin that did not fit never will

    def try_pin(b: int, g: float) -> bool:
        if b in chosen or b in rejected:
            return False
        lo, hi = sk.pin_cost(b)
        if budget is not None and hi > lo and int(jit[lo:hi].max()) + sk.sizes[b] > budget:
            rejected.add(b)
            return False
        if hi > lo:
            jit[lo:hi] += sk.sizes[b]
        chosen[b] = g
        for st, p in zip(streams, pos):
            if b in p:
                st.chosen[p[b]] = True
        return True

    for j in r.violations:
        need = float(r.stall[j])
        lo = float(r.end[j - 1]) if j else 0.0
        hi = max(float(r.start[j]), float(r.t_ready[j]))
        wins = [st.window(lo, hi, eps) for st in streams]
        got = sum(float(st.gain[a:b_][st.chosen[a:b_]].sum()) for st, (a, b_) in zip(streams, wins))
        own = own_of.get(j, [])
        if rule == "stall":         # the feature maps j waits for, latest first
            for b in sorted(own, key=lambda b: (-pre_end[b], b)):
                if got >= need:
                    break
                if b not in chosen and try_pin(b, float(streams[0].gain[pos[0][b]])):
                    got += streams[0].gain[pos[0][b]]
        if got >= need:
            continue
        # then the transfers of the busy periods, by the rule's key
        cands = []
        for si, (st, (a, b_)) in enumerate(zip(streams, wins)):
            if a < b_:
                for i in st.order(a, keys[si]):
                    if i < b_:
                        b = int(st.buf[i])
                        if b not in chosen and b not in rejected:
                            cands.append((-keys[si][i], b, float(st.gain[i])))
        if rule == "ratio":
            for b in own:
                i = pos[0][b]
                cands.append((-keys[0][i], b, float(streams[0].gain[i])))
        cands.sort()
        for _, b, g in cands:
            if got >= need:
                break
            if try_pin(b, g):
                got += g
    return chosen


def choose_pins(gmap: GMAP, budget: int | None, times, pcie: PCIeModel, *,
                rule: str = "stall", pinned=frozenset(), patience: int = 3,
                tol: float | None = None, recompute=None) -> PinResult:
    """Pin feature maps until constraint (6) holds at ``gmap.k`` under ``budget`` (module doc).

    Each round runs :func:`algorithm1` (the paper's: against the stall-free schedule) and pins,
    for every violating step in order (the paper's Omega), candidates until their transfer time
    covers the step's lateness (pins already chosen in its window count).  Deterministic: a
    function of (gmap, budget, times, pcie, rule, initial pins) only, so the tuner's linear walk
    and bisection ask the same question at every k.  recompute: a
    :class:`swap.plan.RecomputePolicy` whose buffers are rebuilt in backward (never pinned or
    offloaded; their forward time is added before the steps they are rebuilt for).
    """
    if rule not in RULES:
        raise ValueError(f"unknown pinning rule {rule!r} (known: {', '.join(RULES)})")
    t = np.asarray(times, dtype=np.float64)
    eps = 1e-12 * max(float(t.sum()), 1e-30)
    pinned = set(pinned)
    best_total = float("inf")
    stuck = 0
    rounds = 0
    sketcher = Sketcher(gmap, budget, recompute)
    while True:
        sk = sketcher.sketch(pinned)
        if not sk.fits:
            r = algorithm1(sk, t, pcie, tol=tol)
            return PinResult(False, frozenset(pinned), sk, r, rounds,
                             "eq. (4): the just-in-time plan does not fit the budget", recompute)
        r = algorithm1(sk, t, pcie, tol=tol)
        if r.feasible:
            return PinResult(True, frozenset(pinned), sk, r, rounds, recompute=recompute)
        total = r.total_stall
        if total < best_total * (1 - 1e-9):
            best_total, stuck = total, 0
        else:
            stuck += 1
            if stuck >= patience:
                return PinResult(False, frozenset(pinned), sk, r, rounds,
                                 f"pinning stopped reducing the stall ({total:.3g} s)", recompute)
        chosen = _pin_round(sk, r, rule, t, budget, eps)
        if not chosen:
            j0 = r.violations[0]
            return PinResult(False, frozenset(pinned), sk, r, rounds,
                             f"{gmap.steps[j0]} waits {float(r.stall[j0]):.3g} s and no feature "
                             "map involved fits in the spare memory", recompute)
        pinned.update(chosen)
        rounds += 1


# ------------------------------------------------------ replay of a real plan
@dataclass(frozen=True)
class Timeline:
    """The predicted timeline of one iteration of an executable plan (:func:`simulate`).

    step_start/step_end[j]: compute of step j.  t_ready[j]: when step j's prefetches and
    allocations are ready.  op_start/op_end[i]: of ``plan.ops[i]`` (allocations and releases are
    instants; setup ops at 0).
    """
    plan: Plan = field(repr=False)
    times: np.ndarray = field(repr=False)
    step_start: np.ndarray = field(repr=False)
    step_end: np.ndarray = field(repr=False)
    t_ready: np.ndarray = field(repr=False)
    op_start: np.ndarray = field(repr=False)
    op_end: np.ndarray = field(repr=False)
    # seconds ops started later than their stream allowed because their region was still in
    # use (a prefetch after the link was free, an allocation after the previous step): the
    # only way the layout (the offsets) enters the timeline; 0 means no other layout of the
    # same ops at the same steps can do better
    region_wait: float = 0.0

    @property
    def stall(self) -> np.ndarray:
        prev = np.concatenate([[0.0], self.step_end[:-1]])
        return self.step_start - prev

    @property
    def total_stall(self) -> float:
        return float(self.stall.sum())

    @property
    def interference(self) -> float:
        """Seconds the copies added to the steps beside them (:attr:`Readiness.interference`)."""
        return max(0.0, float((self.step_end - self.step_start).sum() - self.times.sum()))

    @property
    def t_iter(self) -> float:
        """Predicted iteration time on the device: until the last op of any stream is done (in
        practice the compute stream's last step: every copy of the iteration is awaited by some
        step).  The tuner's prediction adds the host's issue floor and O(k)
        (:meth:`swap.model.ComputeModel.iteration`); this timeline assumes the host keeps
        ahead."""
        return float(max(self.step_end[-1], self.op_end.max(initial=0.0)))

    @property
    def t_model(self) -> float:
        return float(self.times.sum())

    def violations(self, tol: float | None = None) -> tuple:
        """Steps that wait for their data (break constraint 6)."""
        tol = 1e-9 * self.t_model + 1e-15 if tol is None else tol
        return tuple(int(j) for j in np.nonzero(self.stall > tol)[0])

    def feasible(self, tol: float | None = None) -> bool:
        return not self.violations(tol)

    # ---- eq. (4) in time
    def memory_events(self) -> list:
        """(time, +bytes | -bytes) of every per-iteration allocation, prefetch and release."""
        ev = []
        for i, op in enumerate(self.plan.ops):
            if op.step == SETUP:
                continue
            if op.kind in (ALLOCATE, PREFETCH):
                ev.append((float(self.op_start[i]), 1, op.nbytes))
            elif op.kind == RELEASE:
                ev.append((float(self.op_end[i]), 0, -op.nbytes))
        ev.sort()          # at equal times releases (0) before allocations (1)
        return [(t, nb) for t, _, nb in ev]

    def memory_curve(self) -> tuple[np.ndarray, np.ndarray]:
        """(times, bytes in use just after each event), setup bytes included."""
        ev = self.memory_events()
        times = np.array([0.0] + [t for t, _ in ev])
        held = self.plan.setup_bytes + np.concatenate([[0], np.cumsum([nb for _, nb in ev])])
        return times, held

    def peak_in_time(self) -> int:
        return int(self.memory_curve()[1].max())

    def check_eq4(self, budget: int | None = None) -> int:
        """Raise if allocated minus released bytes exceed the budget at any time; return the
        peak."""
        budget = self.plan.budget if budget is None else budget
        peak = self.peak_in_time()
        if budget is not None and peak > budget:
            raise AssertionError(f"eq. (4) violated in time: {peak} bytes in use > budget "
                                 f"{budget}")
        return peak

    def check_regions(self):
        """Raise if two buffers occupy overlapping arena bytes at overlapping times."""
        occ = []     # (offset, end offset, t_from, t_to, op index)
        open_ = {}
        for i, op in enumerate(self.plan.ops):
            if op.step == SETUP:
                continue
            if op.kind in (ALLOCATE, PREFETCH):
                open_[op.buffer] = (op.offset, op.offset + op.nbytes, float(self.op_start[i]), i)
            elif op.kind == RELEASE:
                o, e, t0, i0 = open_.pop(op.buffer)
                occ.append((o, e, t0, float(self.op_end[i]), i0))
        occ.sort()
        for a in range(len(occ)):
            oa, ea, sa, ta, ia = occ[a]
            for b in range(a + 1, len(occ)):
                ob, eb, sb, tb, ib = occ[b]
                if ob >= ea:
                    break
                if sa < tb and sb < ta:
                    g = self.plan.gmap
                    raise AssertionError(
                        f"ops {ia} and {ib} ({g.buffers[self.plan.ops[ia].buffer].name}, "
                        f"{g.buffers[self.plan.ops[ib].buffer].name}) share arena bytes "
                        f"[{max(oa, ob)}, {min(ea, eb)}) during [{max(sa, sb):.6g}, "
                        f"{min(ta, tb):.6g}] s")

    def rows(self) -> list:
        """(stream, label, start, end) of every step and transfer, for plots and tables."""
        g = self.plan.gmap
        out = [(COMPUTE, f"{s.phase[:3]} {s.name}", float(a), float(b))
               for s, a, b in zip(g.steps, self.step_start, self.step_end)]
        for i, op in enumerate(self.plan.ops):
            if op.kind in (OFFLOAD, PREFETCH):
                out.append((op.stream, g.buffers[op.buffer].name, float(self.op_start[i]),
                            float(self.op_end[i])))
        return out


def simulate(plan: Plan, times, pcie: PCIeModel) -> Timeline:
    """Replay ``plan`` with the runtime's dependencies (module doc); return its :class:`Timeline`.
    """
    g = plan.gmap
    n = g.n_steps
    t = np.asarray(times, dtype=np.float64)
    if len(t) != n:
        raise ValueError(f"{len(t)} step times for a plan of {n} steps")
    base_t = t
    t = with_recomputations(t, plan.recomputations())
    ops = plan.ops
    m = len(ops)
    before = [[] for _ in range(n)]
    after = [[] for _ in range(n)]
    for i, op in enumerate(ops):
        if op.step != SETUP:
            (before if op.when == 0 else after)[op.step].append(i)
    op_start = np.zeros(m)
    op_end = np.zeros(m)
    step_start = np.zeros(n)
    step_end = np.zeros(n)
    ready = np.zeros(n)
    si_free = so_free = 0.0
    slows = pcie.slows
    outs, ins, copy_at = [], [], [0, 0]     # copies in stream order: (start, end)

    def free_time(d: int) -> float:
        """When the region released by op d may be reused (the runtime's ``_free_event``)."""
        od = ops[d]
        if od.kind == OFFLOAD:
            return op_end[d]
        if od.stream == SWAP_OUT:
            return op_end[od.after[0]]
        return step_end[od.wait_step]

    prev = 0.0
    region_wait = 0.0
    for j in range(n):
        r = 0.0
        for i in before[j]:
            op = ops[i]
            if op.kind == ALLOCATE:
                # compute waits only on regions freed by the swap-out stream
                w = max((free_time(d) for d in op.after if ops[d].stream != COMPUTE),
                        default=0.0)
                r = max(r, w)
                op_start[i] = op_end[i] = max(prev, w)
                region_wait += max(0.0, w - prev)
            elif op.kind == PREFETCH:
                w = max((free_time(d) for d in op.after), default=0.0)
                region_wait += max(0.0, w - si_free)
                s = max(si_free, w)
                e = s + pcie.seconds(op.nbytes, H2D, so_free > s)
                op_start[i], op_end[i] = s, e
                si_free = e
                if slows:
                    ins.append((s, e))
            elif op.kind != RECOMPUTE:
                raise ValueError(f"op {i}: {op.kind} before a step")
        for i in plan.needs[j]:
            r = max(r, op_end[i])
        ready[j] = r
        step_start[j] = max(prev, r)
        step_end[j] = step_start[j] + (
            _stretched(pcie, t[j], step_start[j], outs, ins, copy_at) if slows else t[j])
        prev = step_end[j]
        at = step_start[j]
        for i in before[j]:         # recomputations run first, within the step's time
            if ops[i].kind == RECOMPUTE:
                op_start[i] = at
                at = op_end[i] = at + base_t[ops[i].source]
        for i in after[j]:
            op = ops[i]
            if op.kind == OFFLOAD:
                s = max(so_free, step_end[op.wait_step])
                e = s + pcie.seconds(op.nbytes, D2H, si_free > s)
                op_start[i], op_end[i] = s, e
                so_free = e
                if slows:
                    outs.append((s, e))
            elif op.kind == RELEASE:
                at = op_end[op.after[0]] if op.stream == SWAP_OUT else step_end[j]
                op_start[i] = op_end[i] = at
            else:
                raise ValueError(f"op {i}: {op.kind} after a step")
    return Timeline(plan=plan, times=t, step_start=step_start, step_end=step_end, t_ready=ready,
                    op_start=op_start, op_end=op_end, region_wait=float(region_wait))


def hold_steps(sk: Sketch, r: Readiness) -> dict:
    """{buffer: step}: for each offloaded buffer, the step during which its offload is predicted
    to complete (``min h >= last forward use with end[h] >= offload end``), capped before its
    first backward use: how long :func:`swap.plan.plan_dynamic` keeps its region reserved."""
    ends = r.end
    out = {}
    for b, _, e in r.offloads:
        h = int(np.searchsorted(ends, e - 1e-15, side="left"))
        h = min(max(h, sk.last_fwd[b]), sk.first_bwd[b] - 1)
        if h > sk.last_fwd[b]:
            out[b] = h
    return out


# ------------------------------------------------------------ the decision
@dataclass(frozen=True)
class DynamicPlan:
    """A dynamic plan at one k: the executable plan, its predicted timeline and the pinning."""
    plan: Plan
    timeline: Timeline
    pins: PinResult

    @property
    def k(self) -> int:
        return self.plan.k

    @property
    def feasible(self) -> bool:
        return self.pins.feasible and self.timeline.feasible()


FILL_MARGIN = 0.02      # of the budget, kept free of fill pins for the layout and early prefetches


def spare_pins(sk: Sketch, budget: int | None, margin: float = FILL_MARGIN) -> list:
    """The offloaded feature maps of ``sk`` that the spare memory can hold as well: the
    smallest first, each while the just-in-time usage with it stays within ``budget * (1 -
    margin)`` over the steps it would have been away (eq. 4); all of them without a budget.

    Once constraint (6) holds, an offload buys nothing but memory, and a plan at a k below
    the largest has memory to spare.  Each offload costs two copies on the link and their
    issue on the host (an offload, a prefetch, their waits and events: about 10 us of Python
    and driver time each, which adds to the iteration where the host, not the device, is the
    bottleneck: small k, deep nets).  Smallest first removes the most transfers per byte of
    spare memory."""
    cand = sorted(sk.swapped, key=lambda b: (sk.sizes[b], b))
    if budget is None:
        return cand
    cap = int(budget * (1 - margin))
    jit = sk.jit_usage.copy()
    out = []
    for b in cand:
        lo, hi = sk.pin_cost(b)
        if hi > lo:
            if int(jit[lo:hi].max()) + sk.sizes[b] > cap:
                continue
            jit[lo:hi] += sk.sizes[b]
        out.append(b)
    return out


PREFETCH_LEADS = (1, 2, 4)   # steps a prefetch's region is laid out ahead (swap.plan._layout)


def _executable(gmap, budget, times, pcie, pins, recompute=None) -> DynamicPlan:
    """The executable plan of ``pins``: with region holds where they fit, else without; where
    the replay of both stalls, also with each prefetch's region laid out clear of what the
    steps before it release (``lead`` of :data:`PREFETCH_LEADS`, :func:`swap.plan._layout`).
    The first stall-free one is kept, else the one that stalls least (the earlier on a tie).

    Why the lead: the layout places a prefetch's region where it is free from the step that
    issues the prefetch, often over a workspace or a gradient that the step before releases,
    and the copy then waits for that release.  VGG-16 on call v's profile (H200, session 31) at
    216 with conv1_1 recomputed: pool3's prefetch shared conv4_2's workspace, started when
    conv4_2's backward ended, and conv4_1's backward waited 3.0 ms for it, where counting bytes
    had found room for it earlier."""
    best = None

    def made(**options):
        """The dynamic plan with ``options``, or None where its layout exceeds the budget."""
        try:
            plan = make_plan(gmap, "dynamic", budget, pins.pinned, recompute=recompute,
                             **options)
        except BudgetError:
            return None
        return plan if budget is None or plan.arena_bytes <= budget else None

    waited = {}     # layout options -> whether the replay had an op wait on a region

    def stall_free(plan, key=None) -> bool:
        """Replay ``plan``, keep it if it stalls least so far; whether it does not stall."""
        nonlocal best
        if plan is None:
            return False
        cand = DynamicPlan(plan=plan, timeline=simulate(plan, times, pcie), pins=pins)
        waited[key] = cand.timeline.region_wait > 0.0
        if best is None or cand.timeline.total_stall < best.timeline.total_stall:
            best = cand
        return cand.timeline.feasible()

    hold = hold_steps(pins.sketch, pins.readiness)
    if hold and stall_free(made(hold=hold), "hold"):
        return best
    # without holds: the naive plan's BudgetError (not even it fits) goes to the caller
    plain = make_plan(gmap, "dynamic", budget, pins.pinned, recompute=recompute)
    if stall_free(plain, "plain") or not plain.offloaded:
        return best
    # A lead only moves regions, and a region moves the timeline only where an op waited on
    # it; a replay with no such wait is already as early as any layout of its ops can make it
    for lead in PREFETCH_LEADS:
        if hold and waited.get("hold") and stall_free(made(hold=hold, lead=lead)):
            return best
        if waited.get("plain") and stall_free(made(lead=lead)):
            return best
    return best


def make_dynamic_plan(gmap: GMAP, budget: int | None, times, pcie: PCIeModel, *,
                      rule: str = "stall", pins: PinResult | None = None,
                      fill: bool = True, recompute=None, test_dynamic: int = 0) -> DynamicPlan:
    """Choose the pinned set at ``gmap.k`` (:func:`choose_pins`), make the executable
    ``dynamic`` plan with it and replay it (:func:`simulate`).

    The plan keeps each offloaded region reserved until its offload is predicted done
    (:func:`hold_steps`) when that fits the budget, so that the fixed layout never makes an
    allocation wait for a copy; of the plans with and without that hold, the one whose replay
    stalls least is kept (the hold one on a tie).

    fill (default): the spare memory is then filled with more pins (:func:`spare_pins`: the
    smallest offloaded feature maps first), so that nothing is offloaded that the budget could
    keep.  The filled plan is kept when its layout fits the budget and its replay stalls no
    more than the unfilled one's (plus 0.1 % of the compute); otherwise the fill is halved
    (keeping the smallest), three times at most, before the unfilled plan is kept.  This is
    not the paper's rule (it pins only what constraint (6) needs); measured on the H200 in
    docs/RESULTS.md (ResNet-152 at small k, where the executor's host work on the transfers
    made ``dynamic`` 1.3x slower than ``none``).

    With the fill, a plan that offloads nothing gives way to Caffe's plan (:func:`resident`,
    strategy "none") where that fits the budget: every buffer stays where it is for the whole
    iteration, with no allocation or release between the steps.

    pins: a :class:`PinResult` already computed for this gmap and times (before the fill); the
    plan then recomputes what they were chosen with.  recompute (without ``pins``): a
    :class:`swap.plan.RecomputePolicy`, the groups the plan rebuilds in backward
    (:func:`swap.plan.dynamic_recompute`).
    test_dynamic: the test nets' per-pass bytes; a filled or resident plan is kept only
    where its resident regions leave room for them (:func:`swap.plan.arena_need`; a test pass
    runs between iterations, over the per-iteration regions).
    Raises :class:`swap.plan.BudgetError` when not even the naive plan fits the budget."""
    times = np.asarray(times, dtype=np.float64)
    if pins is None:
        pins = choose_pins(gmap, budget, times, pcie, rule=rule, recompute=recompute)
    recompute = pins.recompute
    base = _executable(gmap, budget, times, pcie, pins, recompute)
    if not fill:
        return base
    return resident(gmap, budget, times, pcie,
                    _filled(gmap, budget, times, pcie, pins, base, recompute, test_dynamic),
                    test_dynamic)


def resident(gmap: GMAP, budget: int | None, times, pcie: PCIeModel,
             dyn: DynamicPlan, test_dynamic: int = 0) -> DynamicPlan:
    """``dyn``, or Caffe's plan ("none": every buffer allocated once, for the whole iteration)
    where ``dyn`` offloads nothing and that plan's layout fits ``budget``.

    A dynamic plan that offloads nothing still allocates and releases the buffers that are
    live for part of the iteration (the diffs, the layers' scratch) at the steps the GMAP
    says, which saves memory and costs host time: ResNet-152 at k = 16 (2141 allocations and
    as many releases per iteration) spent 0.8 to 3.1 ms more of the executor's host time per
    iteration than under "none" in two runs on the H200 (2026-11-21,
    docs/results/executor_s7), which adds to the iteration where the host is the bottleneck.
    When the budget holds everything at once, the memory is not needed.  The pins are kept
    (every feature map is pinned).

    Where Caffe's plan does not fit because it holds every convolution's workspace at once
    (ResNet-152 at 16 under 12 GiB with the CUDNN engine: 17.8 GB), the plan that holds every
    buffer but the layers' scratch for the whole iteration (:func:`swap.plan.plan_resident`)
    is the next choice: only the scratch is then allocated and released between the steps.

    With test nets (``test_dynamic``: their per-pass bytes) either plan must also leave room
    for a test pass after its resident regions (:func:`swap.plan.arena_need`): in these plans
    every feature map is resident, so a test pass cannot reuse them (the digits solver at a
    4 MiB budget: "resident" 3.9 MiB, its test pass 2.4 MiB more)."""
    if budget is None or dyn.plan.offloaded:
        return dyn
    for strategy in ("none", "resident"):
        try:
            plan = make_plan(gmap, strategy, budget, dyn.plan.pinned)
        except BudgetError:
            continue
        if arena_need(plan, test_dynamic) <= budget:
            return DynamicPlan(plan=plan, timeline=simulate(plan, times, pcie), pins=dyn.pins)
    return dyn


def _filled(gmap, budget, times, pcie, pins, base, recompute=None,
            test_dynamic: int = 0) -> DynamicPlan:
    """make_dynamic_plan's fill (its doc): ``base`` with more pins, or ``base``."""
    if not pins.sketch.swapped:
        return base
    extra = spare_pins(pins.sketch, budget)
    tol = 1e-3 * base.timeline.t_model
    sketcher = None
    for _ in range(4):
        if not extra:
            break
        pinned = frozenset(pins.pinned) | frozenset(extra)
        if sketcher is None:
            sketcher = Sketcher(gmap, budget, recompute)
        sk = sketcher.sketch(pinned)
        r = algorithm1(sk, times, pcie)
        filled = PinResult(pins.feasible and r.feasible, pinned, sk, r, pins.rounds,
                           pins.reason, recompute)
        try:
            cand = _executable(gmap, budget, times, pcie, filled, recompute)
        except BudgetError:
            cand = None
        if (cand is not None
                and (budget is None or arena_need(cand.plan, test_dynamic) <= budget)
                and cand.timeline.total_stall <= base.timeline.total_stall + tol):
            return cand
        extra = extra[:len(extra) // 2]
    return base


# ------------------------------------------------------------------- plots
def read_trace(path) -> dict:
    """The last complete iteration of a ``--memory-trace`` CSV (swap.runtime.MemoryTrace):
    per step its start and end (seconds from the iteration's first step), phase, layer, bytes
    offloaded and prefetched, bytes in use, and ``ready``: when the step was past its waits
    (prefetches, regions still being offloaded); its start where the trace predates that
    column."""
    import csv
    with open(path, newline="") as f:
        rows = list(csv.DictReader(f))
    if not rows:
        raise ValueError(f"{path}: empty memory trace")
    need = {"iteration", "step", "t_start_ms", "t_end_ms", "in_use"}
    if not need <= set(rows[0]):
        raise ValueError(f"{path}: not a --memory-trace CSV (columns {sorted(need)} expected)")
    by_it: dict = {}
    for r in rows:
        by_it.setdefault(int(r["iteration"]), []).append(r)
    n = max(len(v) for v in by_it.values())
    it = max(i for i, v in by_it.items() if len(v) == n)
    rs = sorted(by_it[it], key=lambda r: int(r["step"]))
    t0 = float(rs[0]["t_start_ms"])
    return {
        "iteration": it,
        "step": [int(r["step"]) for r in rs],
        "layer": [r.get("layer", "") for r in rs],
        "phase": [r.get("phase", "") for r in rs],
        "start": np.array([(float(r["t_start_ms"]) - t0) / 1e3 for r in rs]),
        "end": np.array([(float(r["t_end_ms"]) - t0) / 1e3 for r in rs]),
        "ready": np.array([(float(r.get("t_ready_ms") or r["t_start_ms"]) - t0) / 1e3
                           for r in rs]),
        "offloaded": np.array([int(r.get("offloaded", 0) or 0) for r in rs]),
        "prefetched": np.array([int(r.get("prefetched", 0) or 0) for r in rs]),
        "in_use": np.array([int(r["in_use"]) for r in rs]),
    }


_STREAM_ROWS = {COMPUTE: 2, SWAP_OUT: 1, SWAP_IN: 0}


def plot_timeline(timeline: Timeline, path, *, trace=None, title: str | None = None,
                  budget: int | None = None):
    """Draw the predicted timeline of the three streams and the memory in use over time
    (eq. 4 against the budget); with ``trace`` (a ``--memory-trace`` CSV or
    :func:`read_trace`'s dict) the observed iteration beside it.  Needs matplotlib."""
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError as e:      # pragma: no cover - depends on the environment
        raise RuntimeError("--plot needs matplotlib: pip install matplotlib") from e
    if trace is not None and not isinstance(trace, dict):
        trace = read_trace(trace)
    plan = timeline.plan
    g = plan.gmap
    budget = plan.budget if budget is None else budget
    cols = 2 if trace is not None else 1
    fig, axes = plt.subplots(2, cols, figsize=(9 * cols, 6), squeeze=False,
                             gridspec_kw={"height_ratios": [2, 1]})
    fwd, bwd, out_c, in_c, stall_c = "#4c72b0", "#55a868", "#c44e52", "#8172b2", "#dd8452"

    def gantt(ax, bars, scale):
        for row, start, width, color in bars:
            ax.broken_barh([(start * scale, max(width * scale, 1e-9))], (row - 0.4, 0.8),
                           facecolors=color, edgecolors="none")
        ax.set_yticks([0, 1, 2], ["swap-in", "swap-out", "compute"])
        ax.set_xlabel("ms")

    ms = 1e3
    peak = max(float(timeline.memory_curve()[1].max()), float(budget or 0))
    unit, div = next((u, d) for u, d in (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10), ("B", 1))
                     if peak >= d or d == 1)
    bars = []
    for s, a, b in zip(g.steps, timeline.step_start, timeline.step_end):
        bars.append((2, a, b - a, fwd if s.phase == "forward" else bwd))
    for j in timeline.violations():
        prev = timeline.step_end[j - 1] if j else 0.0
        bars.append((2, prev, timeline.step_start[j] - prev, stall_c))
    for i, op in enumerate(plan.ops):
        if op.kind in (OFFLOAD, PREFETCH):
            bars.append((_STREAM_ROWS[op.stream], timeline.op_start[i],
                         timeline.op_end[i] - timeline.op_start[i],
                         out_c if op.kind == OFFLOAD else in_c))
    ax = axes[0][0]
    gantt(ax, bars, ms)
    ax.set_title(title or f"predicted: {g.net_name} k={g.k} ({plan.strategy}), "
                 f"{timeline.t_iter * ms:.2f} ms, stall {timeline.total_stall * ms:.2f} ms")
    t, held = timeline.memory_curve()
    ax = axes[1][0]
    ax.step(t * ms, held / div, where="post", color="#333333", label="in use (eq. 4)")
    if budget is not None:
        ax.axhline(budget / div, color=out_c, linestyle="--", label="budget")
    ax.set_xlabel("ms")
    ax.set_ylabel(unit)
    ax.legend(loc="upper right", fontsize="small")
    if trace is not None:
        obs = []
        for ph, a, b, off, pre in zip(trace["phase"], trace["start"], trace["end"],
                                      trace["offloaded"], trace["prefetched"]):
            obs.append((2, a, b - a, fwd if ph == "forward" else bwd))
            if off:
                obs.append((1, a, b - a, out_c))
            if pre:
                obs.append((0, a, b - a, in_c))
        ax = axes[0][1]
        gantt(ax, obs, ms)
        ax.set_title(f"observed (--memory-trace, iteration {trace['iteration']}; copies shown "
                     "per step)")
        ax = axes[1][1]
        ax.step(trace["end"] * ms, trace["in_use"] / div, where="post", color="#333333",
                label="in use")
        if budget is not None:
            ax.axhline(budget / div, color=out_c, linestyle="--", label="budget")
        ax.set_xlabel("ms")
        ax.set_ylabel(unit)
        ax.legend(loc="upper right", fontsize="small")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


__all__ = ["RULES", "Sketch", "sketch", "Sketcher", "Readiness", "algorithm1", "PinResult",
           "choose_pins", "Timeline", "simulate", "hold_steps", "DynamicPlan", "make_dynamic_plan", "spare_pins",
           "resident",
           "read_trace", "plot_timeline"]
