"""Memory plans: immutable lists of allocate / release / offload / prefetch operations.

A :class:`Plan` is data (STYLE.md, "plans are data"): made by pure functions of a
:class:`~swap.gmap.GMAP`, a budget and a set of pinned buffers, tested without a GPU, and
replayed by :class:`swap.runtime.Executor`.  Each :class:`Op` names its buffer, its aligned
bytes, its stream, the step it belongs to (issued before or after that step's computation),
its offset in the device arena and the operations and compute step it waits on.

Timeline.  A plan has a setup phase (``step == SETUP``: the resident buffers, allocated once
when the executor starts and never released: parameters, their diffs, solver history, loss
weights, net outputs) and, every iteration, the 2N steps of the GMAP.  Around step j's
computation: PREFETCH and ALLOCATE ops before it, OFFLOAD and RELEASE ops after it.  The bytes
held while step j computes are ``usage[j]``; eq. (4) of the paper,

    sum_q M_allocate[q](k) - sum_q M_release[q](k) <= M_budget   at any time,

is ``max(usage) <= budget``, since allocations only happen before a computation and releases
only after one.

Streams (section 5).  ALLOCATE and the RELEASE of a buffer that was not offloaded belong to the
compute stream (its last reader), OFFLOAD and the RELEASE that follows it to the swap-out
stream, PREFETCH to the swap-in stream.  A device region is handed out again only after the
events of its previous occupant's release (last reader done, offload done): each ALLOCATE and
PREFETCH lists those RELEASE ops in ``after``; a PREFETCH also waits on the OFFLOAD that put its
data on the host.

Layout.  Every allocation gets a fixed offset when the plan is made (the lifetimes are known,
so an offline placement, greedy by size, as llm.c computes its activation offsets up front),
checked by replaying the ops through :class:`swap.arena.Arena`.  The layout does not depend on
the capacity: a plan fits every arena at least ``arena_bytes`` large.  ``arena_bytes`` is at
least ``peak`` (eq. 4 counts bytes; the layout also needs them contiguous) and in practice
within 1% of it.

Strategies:

* ``none``: Caffe.  Everything, scratch included, allocated at setup and resident; with
  ``caffe=True`` also the memory Caffe allocates that minicaffe does not need (prefetched data
  batches, BatchNorm's extra copies: ``caffe`` buffers), so that its size is Caffe's.
* ``naive``: offload every feature map after its last forward use; bring it back for its first
  backward use with a prefetch issued as early as memory allows (the backward steps are walked
  in order, each prefetch at the earliest step from which eq. (4) holds up to its last use);
  diffs live from their first writer to their last reader; scratch around its step.  With no
  budget each prefetch is issued just before the step that needs it (the layer-wise minimum,
  section 3: "the extreme case is to swap all the feature maps out").
* ``vdnn``: vDNN's policy: offload the inputs of convolution layers only, prefetch each one
  layer ahead of the backward step that reads it.
* ``dynamic``: AccUDNN's strategy: ``naive`` with a set of pinned feature maps (never
  offloaded) chosen by :mod:`swap.planner` (Algorithm 1's constraint (6)) at the minibatch
  chosen by :mod:`swap.tuner` (Algorithm 2).  As a plan it is exactly ``naive(pinned)``; with
  no pinned set it is the naive plan under another name.
* ``recompute`` (alias ``superneurons``): SuperNeurons (Wang et al., PPoPP 2018): liveness,
  offloading of convolution outputs, and the outputs of cheap layers dropped after forward and
  recomputed in backward by RECOMPUTE ops (:func:`plan_recompute` states the exact policy).
* Every strategy takes ``pinned``: buffer ids never offloaded (the dynamic strategy of
  Algorithm 2 pins feature maps in the spare memory).
"""
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from .arena import ALIGN, Arena, align
from .gmap import CAFFE, DATA, FORWARD, GMAP, SCRATCH

SETUP = -1
BEFORE, AFTER = 0, 1

ALLOCATE = "allocate"
RELEASE = "release"
OFFLOAD = "offload"
PREFETCH = "prefetch"
RECOMPUTE = "recompute"

COMPUTE = "compute"
SWAP_OUT = "swap_out"
SWAP_IN = "swap_in"
STREAMS = (COMPUTE, SWAP_OUT, SWAP_IN)


@dataclass(frozen=True)
class Op:
    """One memory operation of a plan.

    kind: ALLOCATE, RELEASE, OFFLOAD, PREFETCH or RECOMPUTE.  buffer: id in the GMAP.  nbytes:
    aligned bytes reserved, released or copied.  stream: compute, swap_out or swap_in.  step:
    SETUP or the step it belongs to; when: BEFORE or AFTER that step's computation.  wait_step:
    the compute step whose completion it waits on (-1: none).  after: indices (in ``Plan.ops``)
    of earlier ops whose completion it waits on.  offset: device arena offset of the region.
    host_offset: host arena offset (OFFLOAD, PREFETCH).

    RECOMPUTE runs forward step ``source`` again on the compute stream, before step ``step``
    computes (after that step's ALLOCATE and PREFETCH ops, which hold what it writes and
    reads); ``buffer`` is the first buffer it writes, ``nbytes`` 0 (it allocates nothing
    itself).
    """
    kind: str
    buffer: int
    nbytes: int
    stream: str
    step: int
    when: int
    wait_step: int = -1
    after: tuple = ()
    offset: int = -1
    host_offset: int = -1
    source: int = -1


@dataclass(frozen=True)
class Plan:
    """An executable memory plan for one GMAP (one net at one minibatch).

    usage[j]: bytes held while step j computes (eq. 4's left side).  setup_bytes: the resident
    part.  arena_bytes: extent of the layout, the smallest device arena that runs the plan.
    host_bytes: pinned host memory for the offloaded buffers.  offloaded: ids of the buffers it
    swaps out.  recomputed: ids of the buffers it drops after forward and rebuilds by RECOMPUTE
    ops.  needs[j]: indices of the PREFETCH ops that step j's computation (or a RECOMPUTE op
    before it) waits on.  lead: the steps each prefetch's region was laid out ahead of its
    own (:func:`_layout`; 0: none).
    """
    strategy: str
    gmap: GMAP
    budget: int | None
    ops: tuple
    usage: tuple
    setup_bytes: int
    arena_bytes: int
    host_bytes: int
    pinned: frozenset = frozenset()
    offloaded: frozenset = frozenset()
    needs: tuple = field(default=(), repr=False)
    recomputed: frozenset = frozenset()
    lead: int = 0

    @property
    def k(self) -> int:
        return self.gmap.k

    @property
    def peak(self) -> int:
        """max over steps of allocated minus released bytes (eq. 4)."""
        return max(self.usage, default=self.setup_bytes)

    @property
    def peak_step(self) -> int:
        return int(np.argmax(self.usage)) if self.usage else SETUP

    @property
    def min_budget(self) -> int:
        """The smallest budget this plan runs in: its layout's extent."""
        return self.arena_bytes

    def ops_at(self, step: int, when: int = BEFORE) -> tuple:
        return tuple(op for op in self.ops if op.step == step and op.when == when)

    def resident_at(self, step: int) -> tuple:
        """Ids of the buffers on the device while ``step`` computes."""
        held = set()
        for op in self.ops:
            if (op.step, op.when) > (step, BEFORE):
                break
            if op.kind in (ALLOCATE, PREFETCH):
                held.add(op.buffer)
            elif op.kind == RELEASE:
                held.discard(op.buffer)
        return tuple(sorted(held))

    def check(self, budget: int | None = None) -> int:
        """Replay the ops' accounting; raise if eq. (4) fails at any op; return the peak."""
        budget = self.budget if budget is None else budget
        held = 0
        peak = 0
        for i, op in enumerate(self.ops):
            if op.kind in (ALLOCATE, PREFETCH):
                held += op.nbytes
                peak = max(peak, held)
                if budget is not None and held > budget:
                    raise AssertionError(
                        f"eq. (4) violated by op {i} ({op.kind} "
                        f"{self.gmap.buffers[op.buffer].name} at step {op.step}): {held} bytes "
                        f"held > budget {budget}")
            elif op.kind == RELEASE:
                held -= op.nbytes
        return peak

    def recomputations(self) -> tuple:
        """(step, forward step) of every RECOMPUTE op, in order."""
        return tuple((op.step, op.source) for op in self.ops if op.kind == RECOMPUTE)

    def transfer_bytes(self) -> tuple[int, int]:
        """(offloaded, prefetched) bytes per iteration."""
        off = sum(op.nbytes for op in self.ops if op.kind == OFFLOAD)
        pre = sum(op.nbytes for op in self.ops if op.kind == PREFETCH)
        return off, pre

    def describe(self) -> str:
        """The plan, one line per op (for people and debugging)."""
        g = self.gmap
        lines = [f"plan {self.strategy!r} for {g.net_name!r} at k={g.k}: peak {self.peak} bytes "
                 f"at step {self.peak_step}, arena {self.arena_bytes}, host {self.host_bytes}"]
        for i, op in enumerate(self.ops):
            where = "setup" if op.step == SETUP else (
                f"{'before' if op.when == BEFORE else 'after '} {g.steps[op.step]}")
            if op.kind == RECOMPUTE:
                lines.append(f"{i:5d} {where:<40} {op.kind:<8} {op.stream:<8} "
                             f"{g.steps[op.source]}")
                continue
            lines.append(f"{i:5d} {where:<40} {op.kind:<8} {op.stream:<8} "
                         f"{g.buffers[op.buffer].name:<40} {op.nbytes:>12} @{op.offset}"
                         + (f" waits {list(op.after)}" if op.after else ""))
        return "\n".join(lines)


class BudgetError(ValueError):
    """A budget too small for a strategy; says the smallest budget that works and the
    largest minibatch that fits (both also attributes)."""

    def __init__(self, message, *, budget=None, min_budget=None, max_k=None, strategy=None, k=None):
        super().__init__(message)
        self.budget = budget
        self.min_budget = min_budget
        self.max_k = max_k
        self.strategy = strategy
        self.k = k

    def given(self, budget: int, plan_budget: int) -> "BudgetError":
        """This error (raised on ``plan_budget``, what a plan got) as the user's ``budget``
        sees it: what the scratch reserve and the test nets took first, and the smallest
        budget that works with them; itself where they took nothing."""
        from .memory import fmt_bytes
        extra = int(budget) - int(plan_budget)
        if not extra:
            return self
        need = (self.min_budget or 0) + extra
        return BudgetError(
            f"budget {fmt_bytes(budget)} less {fmt_bytes(extra)} for the scratch reserve and "
            f"the test nets leaves {fmt_bytes(plan_budget)} for the plan: {self} With the "
            f"scratch reserve and the test nets, the smallest budget that works is "
            f"{fmt_bytes(need)} ({need} bytes).",
            budget=budget, min_budget=need, max_k=self.max_k, strategy=self.strategy,
            k=self.k)


# ------------------------------------------------------------- intervals
# A residency interval: (buffer, start, end, how, offload)
#   start: SETUP or the step before whose computation it is allocated / prefetched
#   end: the step after whose computation it is released (None: never, resident)
#   how: ALLOCATE or PREFETCH;  offload: False, True (offloaded after ``end``, before the
#   release) or ``(s,)`` (offloaded after step s < end; its region is held until ``end``: the
#   dynamic strategy's ``hold``, so that no allocation waits for the copy to finish)


def _sizes(gmap: GMAP) -> list[int]:
    return [align(b.nbytes(gmap.k)) for b in gmap.buffers]


def _base_intervals(gmap: GMAP, swap: set, hold=None, recompute=None) -> tuple[list, list]:
    """Intervals of everything but the returns of swapped buffers, and the swapped buffers'
    (buffer, lo, first backward use, last use) still to be placed.

    hold: optional {buffer: step}: keep an offloaded buffer's region until after that step
    (at least its last forward use, at most the step before its first backward use).
    recompute: optional :class:`RecomputePolicy`: its buffers are held over their forward uses
    and again from the step before which they are rebuilt to their last use (never swapped),
    and every buffer a recomputation touches has the uses it gives (``RecomputePolicy.uses``).
    """
    sizes = _sizes(gmap)
    nf = gmap.n_forward
    uses_of = recompute.uses if recompute is not None else {}
    rebuilt = recompute.recomputed if recompute is not None else frozenset()
    out, pending = [], []
    for b in gmap.buffers:
        if sizes[b.id] == 0 or b.kind == CAFFE:
            continue
        if b.persistent:
            out.append((b.id, SETUP, None, ALLOCATE, False))
            continue
        uses = uses_of.get(b.id, b.uses)
        if not uses:
            continue
        if b.kind == SCRATCH:
            out.extend((b.id, s, s, ALLOCATE, False) for s in uses)
            continue
        fwd = [u for u in uses if u < nf]
        back = [u for u in uses if u >= nf]
        if b.id in rebuilt:
            out.append((b.id, fwd[0], fwd[-1], ALLOCATE, False))
            if back:
                out.append((b.id, back[0], back[-1], ALLOCATE, False))
        elif b.id in swap and fwd and back:
            last_fwd = fwd[-1]
            h = last_fwd
            if hold and b.id in hold:
                h = min(max(int(hold[b.id]), last_fwd), back[0] - 1)
            out.append((b.id, uses[0], h, ALLOCATE, True if h == last_fwd else (last_fwd,)))
            pending.append((b.id, h + 1, back[0], uses[-1]))
        else:
            out.append((b.id, uses[0], uses[-1], ALLOCATE, False))
    pending.sort(key=lambda p: (p[2], p[0]))
    return out, pending


def _usage(gmap: GMAP, intervals, sizes) -> tuple[int, np.ndarray]:
    """(setup bytes, bytes held during each step) of a set of intervals."""
    n = gmap.n_steps
    delta = np.zeros(n + 1, dtype=np.int64)
    setup = 0
    for bid, start, end, _, _ in intervals:
        s = sizes[bid]
        if start == SETUP:
            setup += s
            continue
        delta[start] += s
        delta[(n - 1 if end is None else end) + 1] -= s
    return setup, setup + np.cumsum(delta[:n])


def _place_returns(gmap: GMAP, intervals, pending, budget, policy) -> list:
    """Add the PREFETCH intervals of swapped buffers.

    policy "early": as early as eq. (4) allows under ``budget`` (naive); "jit": just before the
    first backward use; "ahead": one step before it (vDNN).  Never before the offload is done.
    """
    sizes = _sizes(gmap)
    out = list(intervals)
    if policy == "early" and budget is not None:
        setup, usage = _usage(gmap, out, sizes)
        usage = usage.copy()
        for bid, lo, first, last in pending:
            s = sizes[bid]
            p = first
            if lo < first:
                # earliest p in [lo, first) with max(usage[p:first]) + s <= budget: the
                # suffix maxima of usage[lo:first] grow as p moves earlier.
                suffix_max = np.maximum.accumulate(usage[lo:first][::-1])[::-1]
                ok = np.nonzero(suffix_max + s <= budget)[0]
                if len(ok):
                    p = lo + int(ok[0])
            usage[p:last + 1] += s
            out.append((bid, p, last, PREFETCH, False))
        return out
    for bid, lo, first, last in pending:
        p = first if policy in ("jit", "early") else max(lo, first - 1)
        out.append((bid, p, last, PREFETCH, False))
    return out


# The orders :func:`_layout` places the intervals in, first to last: the first whose extent fits
# the budget is kept (without a budget: the smallest extent).  Greedy by size is TensorFlow
# Lite's; by area (bytes x steps) puts the long-lived large regions low first, which VGG-16's
# plans at k = 221 under a 1.5 GiB workspace cap needed (recomputing nothing: 12.09 GiB greedy
# by size, 11.79 by area, against an eq. (4) peak of 11.71; recomputing conv1_1 and conv2_1:
# 12.80 against 11.65, fitted exactly); by lifetime and by start are further fallbacks.
LAYOUT_ORDERS = ("size", "area", "lifetime", "start")


def _layout_order(name, intervals, sizes, n_steps, dynamic):
    def span(i):
        start, end = intervals[i][1], intervals[i][2]
        return (n_steps - 1 if end is None else end) - start + 1

    def size(i):
        return sizes[intervals[i][0]]

    keys = {"size": lambda i: (-size(i), intervals[i][1], intervals[i][0]),
            "area": lambda i: (-size(i) * span(i), intervals[i][1], intervals[i][0]),
            "lifetime": lambda i: (-span(i), -size(i), intervals[i][0]),
            "start": lambda i: (intervals[i][1], -size(i), intervals[i][0])}
    return sorted(dynamic, key=keys[name])


def _place_in_order(order, intervals, sizes, n_steps, lead, base, offsets) -> int:
    """Give each interval of ``order`` the lowest offset at or above ``base`` that is free over
    its whole lifetime (``offsets`` filled in); returns the layout's extent."""
    m = len(order)
    p_start = np.empty(m, dtype=np.int64)
    p_end = np.empty(m, dtype=np.int64)
    p_off = np.empty(m, dtype=np.int64)
    p_size = np.empty(m, dtype=np.int64)
    placed, extent = 0, base
    for i in order:
        bid, start, end, how, _ = intervals[i]
        end = n_steps - 1 if end is None else end
        if lead and how == PREFETCH:
            start = max(0, start - lead)
        size = sizes[bid]
        pos = base
        if placed:
            hit = np.nonzero((p_start[:placed] <= end) & (p_end[:placed] >= start))[0]
            if len(hit):
                order_hit = np.argsort(p_off[hit], kind="stable")
                for o, z in zip(p_off[hit][order_hit].tolist(), p_size[hit][order_hit].tolist()):
                    if o >= pos + size:
                        break
                    pos = max(pos, o + z)
        offsets[i] = pos
        extent = max(extent, pos + size)
        p_start[placed], p_end[placed], p_off[placed], p_size[placed] = start, end, pos, size
        placed += 1
    return extent


def _layout(intervals, sizes, n_steps, lead: int = 0, fit: int | None = None,
            orders=None) -> list[int]:
    """Offsets of the intervals: resident ones packed at the bottom, then the others each at
    the lowest offset free over its whole lifetime, greedy by size (largest first).

    fit: the arena's bytes.  Where greedy by size needs more, the other orders (``orders``,
    default :data:`LAYOUT_ORDERS`) are tried in turn and the first that fits is kept (else the
    one of the smallest extent); without ``fit``, every order is tried and the smallest extent
    kept, so that a plan made without a budget names the smallest budget that runs it.  Greedy
    by size stays first wherever it fits: the plans' timings (region waits) are made on it.

    lead: a prefetch's region is placed as if it began ``lead`` steps before the step that
    issues it, so that it does not share memory with what those steps release: the copy can
    then start before them instead of after the last of them (the region is still only
    allocated at its own step; eq. (4)'s usage does not change, the arena may grow).

    The allocations and lifetimes are known in advance, so this offline placement (as in
    TensorFlow Lite's "greedy by size" planner) wastes far less to fragmentation than an
    online allocator replaying the same sequence; the executor's arena then only checks it.
    """
    offsets = [0] * len(intervals)
    base = 0
    dynamic = []
    for i, (bid, start, end, _, _) in enumerate(intervals):
        if start == SETUP:
            offsets[i] = base
            base += sizes[bid]
        else:
            dynamic.append(i)
    # no layout is smaller than the most bytes live at one step: once an order reaches that,
    # or where even that exceeds ``fit``, the other orders cannot do better
    live = np.zeros(n_steps + 1, dtype=np.int64)
    for i in dynamic:
        bid, start, end, how, _ = intervals[i]
        if lead and how == PREFETCH:
            start = max(0, start - lead)
        live[start] += sizes[bid]
        live[(n_steps - 1 if end is None else end) + 1] -= sizes[bid]
    floor = base + (int(np.cumsum(live[:n_steps]).max()) if n_steps else 0)
    best, best_extent = None, None
    for name in (LAYOUT_ORDERS if orders is None else orders):
        trial = list(offsets)
        extent = _place_in_order(_layout_order(name, intervals, sizes, n_steps, dynamic),
                                 intervals, sizes, n_steps, lead, base, trial)
        if best is None or extent < best_extent:
            best, best_extent = trial, extent
        if best_extent <= floor or (fit is not None and (best_extent <= fit or floor > fit)):
            break
    return best


def _assemble(strategy, gmap: GMAP, intervals, budget, pinned, offloaded, *, uses=None,
              recompute=None, recomputed=frozenset(), lead: int = 0, orders=None) -> Plan:
    """Ops in timeline order, with offsets (best fit, :func:`_layout` with ``lead`` and
    ``orders``, fitted to ``budget``), dependencies and host regions.

    uses: {buffer: steps} replacing ``Buffer.uses`` where recomputations read or write a buffer
    (the step a prefetch serves is its buffer's next use).  recompute: {step: forward steps}
    run again, in that order, before the step computes (RECOMPUTE ops, after its allocations).
    """
    sizes = _sizes(gmap)
    uses = uses or {}
    recompute = recompute or {}
    n = gmap.n_steps
    intervals = list(intervals)
    layout = _layout(intervals, sizes, n, lead, budget, orders)
    by_start = {}
    by_end = {}
    by_off = {}             # step -> intervals offloaded after it
    for i, iv in enumerate(intervals):
        iv = iv + (layout[i],)
        by_start.setdefault(iv[1], []).append(iv)
        if iv[2] is not None:
            by_end.setdefault(iv[2], []).append(iv)
        if iv[4]:
            by_off.setdefault(iv[2] if iv[4] is True else iv[4][0], []).append(iv)

    # host regions: one per offloaded buffer, for the whole iteration (allocated once)
    host_off, host_total = {}, 0
    for bid in sorted(offloaded):
        host_off[bid] = host_total
        host_total += sizes[bid]

    arena = Arena(sum(sizes) * 2 + ALIGN)       # wide enough: it only checks the layout
    ops: list[Op] = []
    offset_of = {}          # buffer -> current device offset
    tomb = []               # (start, end, release op, wait step): regions freed this iteration
    last_offload = {}       # buffer -> index of its OFFLOAD op
    needs = [[] for _ in range(n)]

    def region_deps(off, size):
        deps, wait, keep = [], -1, []
        for (a, b, oi, ws) in tomb:
            if a < off + size and off < b:
                deps.append(oi)
                wait = max(wait, ws)
                if a < off:
                    keep.append((a, off, oi, ws))
                if off + size < b:
                    keep.append((off + size, b, oi, ws))
            else:
                keep.append((a, b, oi, ws))
        tomb[:] = keep
        return tuple(sorted(deps)), wait

    def place(iv, step, when):
        bid, start, end, how, _, off = iv
        size = sizes[bid]
        arena.allocate(size, off)       # checks the region is free
        offset_of[bid] = off
        deps, wait = region_deps(off, size)
        if how == PREFETCH:
            deps = tuple(sorted(set(deps) | {last_offload[bid]}))
            # the step that waits on it: the first use at or after the prefetch
            first = next(u for u in uses.get(bid, gmap.buffers[bid].uses) if u >= start)
            needs[first].append(len(ops))
            ops.append(Op(PREFETCH, bid, size, SWAP_IN, step, when, wait, deps, off,
                          host_off[bid]))
        else:
            ops.append(Op(ALLOCATE, bid, size, COMPUTE, step, when, wait, deps, off))

    def order(ivs):
        # prefetches first (they take longest), then by offset
        return sorted(ivs, key=lambda iv: (iv[3] != PREFETCH, iv[5], iv[0]))

    for iv in order(by_start.get(SETUP, [])):
        place(iv, SETUP, BEFORE)
    for j in range(n):
        for iv in order(by_start.get(j, [])):
            place(iv, j, BEFORE)
        for f in recompute.get(j, ()):
            writes = gmap.steps[f].writes
            ops.append(Op(RECOMPUTE, writes[0] if writes else -1, 0, COMPUTE, j, BEFORE,
                          source=f))
        ending = sorted(by_end.get(j, []), key=lambda iv: iv[0])
        for iv in sorted(by_off.get(j, []), key=lambda iv: iv[0]):
            if iv[4]:
                bid = iv[0]
                last_offload[bid] = len(ops)
                ops.append(Op(OFFLOAD, bid, sizes[bid], SWAP_OUT, j, AFTER, j, (),
                              offset_of[bid], host_off[bid]))
        for iv in ending:
            bid = iv[0]
            off = offset_of.pop(bid)
            arena.free(off)
            if iv[4]:
                op = Op(RELEASE, bid, sizes[bid], SWAP_OUT, j, AFTER, j, (last_offload[bid],), off)
            else:
                op = Op(RELEASE, bid, sizes[bid], COMPUTE, j, AFTER, j, (), off)
            tomb.append((off, off + sizes[bid], len(ops), j))
            ops.append(op)
    setup, usage = _usage(gmap, intervals, sizes)
    return Plan(strategy=strategy, gmap=gmap, budget=budget, ops=tuple(ops),
                usage=tuple(int(u) for u in usage), setup_bytes=int(setup),
                arena_bytes=int(arena.high_water), host_bytes=int(host_total),
                pinned=frozenset(pinned), offloaded=frozenset(offloaded),
                needs=tuple(tuple(x) for x in needs), recomputed=frozenset(recomputed),
                lead=int(lead))


def _fits(plan: Plan, budget) -> bool:
    return budget is None or plan.arena_bytes <= budget


def _fail(strategy, gmap, budget, pinned, plan):
    raise _budget_error(strategy, gmap, budget, pinned, plan)


# ------------------------------------------------------------ strategies
def plan_none(gmap: GMAP, budget: int | None = None, pinned=frozenset(), *,
              caffe: bool = True) -> Plan:
    """Caffe: every buffer allocated at setup and resident (CAFFE_FACTS, "Memory that Caffe
    allocates"); ``caffe`` adds the reservations for what Caffe holds beyond minicaffe."""
    sizes = _sizes(gmap)
    intervals = [(b.id, SETUP, None, ALLOCATE, False) for b in gmap.buffers
                 if sizes[b.id] and (caffe or b.kind != CAFFE)]
    plan = _assemble("none", gmap, intervals, budget, pinned, frozenset())
    if not _fits(plan, budget):
        _fail("none", gmap, budget, pinned, plan)
    return plan


def plan_resident(gmap: GMAP, budget: int | None = None, pinned=frozenset()) -> Plan:
    """Every buffer held for the whole iteration, as in Caffe's plan (:func:`plan_none`,
    without Caffe's own reservations), but each layer's scratch (a cuDNN workspace, the
    layer's temporaries) only around the steps that use it, as the swap plans hold it.

    The dynamic plan at a k where nothing needs to be offloaded but Caffe's plan, which holds
    every convolution's workspace at once, does not fit the budget
    (:func:`swap.planner.resident`): ResNet-152 at k = 16 under 12 GiB on the H200 (CUDNN),
    where `none` needed 17.8 GB with its workspaces.  Only the scratch is allocated and
    released between the steps, instead of every feature map and diff, which costs the host
    time where the host bounds the iteration."""
    sizes = _sizes(gmap)
    intervals = []
    for b in gmap.buffers:
        if not sizes[b.id] or b.kind == CAFFE:
            continue
        if b.kind == SCRATCH and not b.persistent:
            intervals.extend((b.id, s, s, ALLOCATE, False) for s in b.uses)
        else:
            intervals.append((b.id, SETUP, None, ALLOCATE, False))
    plan = _assemble("resident", gmap, intervals, budget, pinned, frozenset())
    if not _fits(plan, budget):
        _fail("resident", gmap, budget, pinned, plan)
    return plan


def plan_naive(gmap: GMAP, budget: int | None = None, pinned=frozenset(), *,
               strategy: str = "naive", hold=None, recompute=None, lead: int = 0) -> Plan:
    """Offload every feature map but the pinned ones; prefetch as early as memory allows.

    hold: {buffer: step} keeps offloaded regions reserved until after that step (dynamic).
    recompute: a :class:`RecomputePolicy` (dynamic): its buffers are dropped after forward and
    rebuilt by RECOMPUTE ops instead of being offloaded or kept.  lead: prefetch regions are
    placed clear of what the ``lead`` steps before them release (:func:`_layout`)."""
    rebuilt = recompute.recomputed if recompute is not None else frozenset()
    swap = set(gmap.feature_maps()) - set(pinned) - rebuilt
    base, pending = _base_intervals(gmap, swap, hold, recompute)

    # Greedy by size only, as long as the just-in-time plan fits that way: the timings below
    # are then those of the plans before session 34 (other orders can put a prefetch over a
    # region released later, GoogLeNet's k* fell from 510 to 505 on them).  Where it does
    # not fit, every order of :data:`LAYOUT_ORDERS` (VGG-16 at 221 under a 1.5 GiB workspace
    # cap); without a budget, the smallest extent of them all (:func:`min_budget`).
    orders = [("size",) if budget is not None else None]

    def assemble(intervals):
        if recompute is None:
            return _assemble(strategy, gmap, intervals, budget, pinned, swap, lead=lead,
                             orders=orders[0])
        return _assemble(strategy, gmap, intervals, budget, pinned, swap, uses=recompute.uses,
                         recompute=recompute.schedule(), recomputed=rebuilt, lead=lead,
                         orders=orders[0])

    returns = _place_returns(gmap, base, pending, None, "jit")
    jit = assemble(returns)
    if not _fits(jit, budget):
        orders[0] = None
        jit = assemble(returns)
    if not _fits(jit, budget):
        # the error's smallest budget and largest k are those of this recompute policy: the
        # plain plan's (what it named before) could need less than this one or more
        raise _PlanBudgetError(strategy, gmap, budget, pinned, jit,
                               recompute=recompute)
    if budget is None:
        return jit
    # Timing by eq. (4) under the budget; if best fit then needs more than the budget
    # (fragmentation), retry with the timing budget lowered by the excess, down to the
    # just-in-time plan, which fits.
    eff = budget
    for _ in range(8):
        plan = assemble(_place_returns(gmap, base, pending, eff, "early"))
        if plan.arena_bytes <= budget:
            return plan
        eff -= plan.arena_bytes - budget + ALIGN
        if eff < jit.peak:
            break
    if strategy == "dynamic":
        # The dynamic plan's timing matters more than the naive one's: rather than prefetching
        # everything just in time, bisect the timing budget between the just-in-time usage and
        # the budget for the largest one whose layout fits.
        lo, hi, best = 0, eff, None
        for _ in range(10):
            mid = (lo + hi) // 2
            plan = assemble(_place_returns(gmap, base, pending, mid, "early"))
            if plan.arena_bytes <= budget:
                lo, best = mid, plan
            else:
                hi = mid
            if hi - lo <= max(budget >> 12, ALIGN):
                break
        if best is not None:
            return best
    return jit


def plan_vdnn(gmap: GMAP, budget: int | None = None, pinned=frozenset()) -> Plan:
    """vDNN: offload convolution inputs only; prefetch one layer ahead of their use."""
    conv_inputs = set()
    for s in gmap.steps:
        if s.phase == FORWARD and s.type == "Convolution":
            conv_inputs |= {bid for bid in s.reads if gmap.buffers[bid].kind == DATA}
    swap = (set(gmap.feature_maps()) & conv_inputs) - set(pinned)
    base, pending = _base_intervals(gmap, swap)
    plan = _assemble("vdnn", gmap, _place_returns(gmap, base, pending, None, "ahead"), budget,
                     pinned, swap)
    if not _fits(plan, budget):
        _fail("vdnn", gmap, budget, pinned, plan)
    return plan


@dataclass(frozen=True)
class RecomputePolicy:
    """What :func:`plan_recompute` does with every feature map of a GMAP.

    segments: per recomputed group, ``(step j, forward steps)``: the steps run again, in that
    order, just before backward step j; in the order they run.  recomputed: the buffers they
    rebuild (dropped after their last forward use).  offloaded: the checkpoints sent to the
    host (convolution groups' feature maps).  uses: {buffer: steps} for every buffer a
    recomputation touches: its GMAP uses plus the steps before which it is recomputed or read
    by a recomputation.
    """
    segments: tuple
    recomputed: frozenset
    offloaded: frozenset
    uses: dict = field(repr=False)

    def schedule(self) -> dict:
        """{step j: forward steps run again before j, in order}."""
        out: dict = {}
        for j, steps in self.segments:
            out.setdefault(j, []).extend(steps)
        return {j: tuple(v) for j, v in out.items()}


@dataclass(frozen=True)
class _Groups:
    """The forward steps of a GMAP in groups that are rebuilt or kept as a whole.

    groups: tuples of forward steps writing a common buffer (an in-place chain, a Split or
    Flatten with the layer whose top it aliases), ordered by first step.  written[g]: the
    buffers group g writes; owner: buffer -> the group writing it; inputs[g]: what g's steps
    read besides its own and persistent buffers; writers: buffer -> forward steps writing it.
    """
    groups: tuple
    written: tuple
    owner: dict
    inputs: tuple
    writers: dict


def _forward_groups(gmap: GMAP) -> _Groups:
    bufs = gmap.buffers
    nf = gmap.n_forward
    fwd = gmap.steps[:nf]
    parent = list(range(nf))        # union-find over the writers of each buffer

    def root(x):
        while parent[x] != x:
            parent[x] = parent[parent[x]]
            x = parent[x]
        return x

    writers: dict = {}                  # buffer -> forward steps writing it, in order
    for st in fwd:
        for b in st.writes:
            writers.setdefault(b, []).append(st.index)
    for ws in writers.values():
        for w in ws[1:]:
            parent[root(w)] = root(ws[0])
    members: dict = {}
    for st in fwd:
        members.setdefault(root(st.index), []).append(st.index)
    groups = tuple(sorted(tuple(v) for v in members.values()))         # by first step
    written = tuple(frozenset(b for j in g for b in fwd[j].writes) for g in groups)
    owner = {b: gi for gi, w in enumerate(written) for b in w}
    inputs = tuple(frozenset(b for j in g for b in fwd[j].reads
                             if b not in written[gi] and not bufs[b].persistent)
                   for gi, g in enumerate(groups))
    return _Groups(groups, written, owner, inputs, writers)


def _rebuildable(gmap: GMAP, G: _Groups, gi: int, pinned) -> str:
    """Why group ``gi`` may not be recomputed ('' when it may): rules (2) and (3) of
    :func:`plan_recompute`."""
    bufs = gmap.buffers
    if any(bufs[b].persistent or b in pinned for b in G.written[gi]):
        return "it writes a parameter, a persistent or a pinned buffer"            # (2)
    if any(max(G.writers.get(c, [-1])) >= G.groups[gi][0] for c in G.inputs[gi]):
        return "a later layer overwrites what it reads"                            # (3)
    return ""


def _policy(gmap: GMAP, G: _Groups, chosen, offloaded) -> RecomputePolicy:
    """The :class:`RecomputePolicy` that rebuilds the groups ``chosen``: rule (5) of
    :func:`plan_recompute` (when), the order, and the uses it adds."""
    bufs = gmap.buffers
    fwd = gmap.steps[:gmap.n_forward]
    fm = set(gmap.feature_maps())
    # The first backward step needing the group or a recomputed group it feeds.  A group that
    # reads another's buffers starts after all their writers (rule 3), so by decreasing first
    # step every group comes after the groups that read it.
    readers: dict = {gi: set() for gi in chosen}
    for gi in chosen:
        for c in G.inputs[gi]:
            if G.owner.get(c) in chosen:
                readers[G.owner[c]].add(gi)
    at: dict = {}
    for gi in sorted(chosen, key=lambda x: -G.groups[x][0]):
        js = [bufs[b].backward_uses[0] for b in G.written[gi] if b in fm]
        js += [at[r] for r in readers[gi] if r in at]
        if js:
            at[gi] = min(js)

    order = sorted(at, key=lambda gi: G.groups[gi][0])     # a group after those it reads
    segments = tuple((at[gi], G.groups[gi]) for gi in order)
    extra: dict = {}
    for j, g in segments:
        for f in g:
            for b in fwd[f].touches:
                extra.setdefault(b, set()).add(j)
    uses = {b: tuple(sorted(set(bufs[b].uses) | js)) for b, js in extra.items()}
    recomputed = frozenset(b for gi in at for b in G.written[gi])
    return RecomputePolicy(segments=segments, recomputed=recomputed,
                           offloaded=frozenset(offloaded), uses=uses)


def recompute_policy(gmap: GMAP, pinned=frozenset()) -> RecomputePolicy:
    """The recompute strategy's decisions for ``gmap`` (the rules in :func:`plan_recompute`).

    Depends on the net's structure only, not on the minibatch: the same at every k.
    """
    fwd = gmap.steps[:gmap.n_forward]
    fm = set(gmap.feature_maps())
    pinned = set(pinned)
    G = _forward_groups(gmap)
    groups, written, owner, inputs = G.groups, G.written, G.owner, G.inputs

    # ---- checkpoints: the feature maps of convolution groups go to the host
    offloaded = frozenset(b for gi, g in enumerate(groups)
                          if any(fwd[j].type == "Convolution" for j in g)
                          for b in written[gi] if b in fm and b not in pinned)

    # ---- candidates: rules (1)-(3), then (4) to a fixed point
    cand = {gi for gi, g in enumerate(groups)
            if all(fwd[j].recomputable for j in g)                                  # (1)
            and not _rebuildable(gmap, G, gi, pinned)}                              # (2), (3)
    changed = True
    while changed:                                                                  # (4)
        changed = False
        for gi in sorted(cand):
            if not all(c in fm or owner.get(c) in cand for c in inputs[gi]):
                cand.discard(gi)
                changed = True
    return _policy(gmap, G, cand, offloaded)


# Forward layers that are not cheap (not RECOMPUTABLE_TYPES) but give the same result when run
# again with the same bottoms and parameters, and have no other effect: the dynamic plan may
# recompute them where the user asks (dynamic_recompute).  cuDNN's forward algorithms are
# deterministic, unlike some of its backward ones.
DETERMINISTIC_TYPES = frozenset({"Convolution", "Deconvolution", "InnerProduct"})


def dynamic_recompute(gmap: GMAP, layers, pinned=frozenset()) -> RecomputePolicy | None:
    """The forward groups of ``layers`` (names), to be recomputed in backward by the dynamic
    plan instead of kept or offloaded (None when ``layers`` is empty).

    The group of a layer is its in-place chain (conv1_1 and its ReLU: naming either names
    both).  Each group is run again once, before the first backward step that reads what it
    writes (or before a chosen group that reads it), from its inputs, which the plan then
    brings back (kept or prefetched) for that step: VGG-16's conv1_1 is rebuilt from the data
    before conv1_2's backward.  Its buffers hold memory over their forward uses and from that
    step to their last use, and they cost no transfer; the step's compute grows by the
    group's forward time (:func:`swap.planner.with_recomputations`).

    Raises ValueError naming the layer where it is not in the net's forward pass, where one
    of its group's layers could give another result when run again (Dropout, STOCHASTIC
    pooling, BatchNorm, whose Scale the dynamic plan may run fused: not supported here, use
    ``--swap recompute``), or where rules (2) and (3) of :func:`plan_recompute` fail.
    """
    names = [x for x in dict.fromkeys(layers or ()) if x]
    if not names:
        return None
    fwd = gmap.steps[:gmap.n_forward]
    G = _forward_groups(gmap)
    group_of = {j: gi for gi, g in enumerate(G.groups) for j in g}
    fm = set(gmap.feature_maps())
    chosen = set()
    for name in names:
        steps = [st.index for st in fwd if st.name == name]
        if not steps:
            known = ", ".join(st.name for st in fwd[:8])
            raise ValueError(f"recompute: net {gmap.net_name!r} has no layer {name!r} in its "
                             f"forward pass (its first layers: {known}, ...)")
        gi = group_of[steps[0]]
        why = _group_refusal(gmap, G, gi, set(pinned), fm)
        if why:
            raise ValueError(f"recompute {name!r}: {why}")
        chosen.add(gi)
    return _policy(gmap, G, chosen, frozenset())


def _group_refusal(gmap: GMAP, G: _Groups, gi: int, pinned, fm) -> str:
    """Why the dynamic plan may not recompute forward group ``gi`` ('' when it may)."""
    fwd = gmap.steps[:gmap.n_forward]
    for j in G.groups[gi]:
        st = fwd[j]
        if st.type == "BatchNorm" or not (st.recomputable or st.type in DETERMINISTIC_TYPES):
            return (f"layer {st.name!r} ({st.type}) of its group "
                    f"({', '.join(fwd[x].name for x in G.groups[gi])}) cannot be recomputed "
                    "by the dynamic plan: its forward is not a pure function of its bottoms "
                    "and parameters here (BatchNorm: use --swap recompute)")
    why = _rebuildable(gmap, G, gi, pinned)
    if why:
        return f"its group cannot be recomputed: {why}"
    if not G.written[gi] & fm:
        return ("its group writes no feature map that backward reads, so there is nothing to "
                "rebuild")
    return ""


def recompute_candidates(gmap: GMAP, times=None, pinned=frozenset()) -> list:
    """The forward groups :func:`dynamic_recompute` accepts that can free memory, best first,
    for ``--recompute auto``: ``(layer name, bytes, seconds)`` per group, named by its first
    layer.  bytes: what recomputing it frees between forward and backward at ``gmap.k``, the
    feature maps it writes that backward reads less what it reads (its inputs must be back,
    kept or prefetched, when it runs again, even those backward itself does not read).
    seconds: its forward time (``times``: t_j of every step at ``gmap.k``; None: the FLOPs
    stand in for time).

    Groups that free nothing are left out: a convolution whose input is as large as its
    output (VGG-16's conv1_2 from conv1_1), a pooling layer (its input is larger), an
    Eltwise sum (two inputs that its backward would not need).  The rest are ranked by bytes
    per second of recomputation: VGG-16's conv1_1 first (its 64-channel full-resolution map,
    rebuilt from the image).  A group whose forward takes no time ranks by its bytes alone,
    before the others."""
    fwd = gmap.steps[:gmap.n_forward]
    G = _forward_groups(gmap)
    fm = set(gmap.feature_maps())
    pinned = set(pinned)
    out = []
    for gi, g in enumerate(G.groups):
        if _group_refusal(gmap, G, gi, pinned, fm):
            continue
        freed = (sum(align(gmap.nbytes(b)) for b in G.written[gi] & fm)
                 - sum(align(gmap.nbytes(b)) for b in G.inputs[gi]))
        if freed <= 0:
            continue
        cost = float(sum((times[j] if times is not None else fwd[j].flops) for j in g))
        out.append((fwd[g[0]].name, int(freed), cost))
    return sorted(out, key=lambda c: (c[2] > 0, -(c[1] / c[2]) if c[2] > 0 else -c[1]))


def plan_recompute(gmap: GMAP, budget: int | None = None, pinned=frozenset()) -> Plan:
    """SuperNeurons' swap + recompute (Wang et al., PPoPP 2018) on this GMAP.

    **Groups.**  Forward steps that write a common buffer form one group: an in-place chain
    (a convolution and the BatchNorm, Scale and ReLU running in place on its top), a Split or
    Flatten and the layer whose top it aliases.  A group is rebuilt or kept as a whole: one
    in-place layer cannot be re-run from its own overwritten input.

    **Checkpoints, offloaded.**  The feature maps of a group with a Convolution (its top, as
    the in-place layers left it, and what they save: BatchNorm's ``x_norm`` and ``std``,
    Scale's bottom copy) are offloaded after their last forward use and prefetched one step
    ahead of their first backward use, recomputations included: SuperNeurons' tensor pool
    offloads convolution outputs, and these cannot be recomputed without the convolution.
    Every other feature map that is not recomputed stays on the device from its first use to
    its last (liveness; so do Dropout's masks and inner-product outputs).

    **Recomputed.**  A group is recomputed when
    (1) every step is recomputable (``Step.recomputable``: ReLU, Pooling but STOCHASTIC, LRN,
        BatchNorm, Scale, Eltwise, Concat ...; not Dropout, whose mask would be drawn anew);
    (2) it writes nothing persistent and nothing pinned;
    (3) its inputs (what its steps read besides its own and persistent buffers) are written
        only before its first step, so that they still hold in backward what it read;
    (4) cost-aware: each input comes back in backward anyway (a feature map: kept, or an
        offloaded checkpoint) or is recomputed itself: a recomputation never brings a buffer
        to the device for itself alone (an AlexNet LRN after an in-place ReLU, the pooling
        after it, VGG's poolings are recomputed; LeNet's pooling of a convolution output that
        backward does not read, or a ResNet Eltwise whose residual branch is read by nobody
        in backward, are kept);
    (5) something needs it: a backward step reads one of its buffers, or a recomputed group
        reads them.
    Its buffers are released after their last forward use.  Before the first backward step j
    that reads any of them or before which a group reading them is recomputed, j's ALLOCATE
    ops take everything its steps write and their scratch, then RECOMPUTE ops run its steps
    again in forward order on the compute stream (after j's prefetches of its checkpoints:
    the step waits on them).  Speed-centric, in SuperNeurons' terms: each group once per
    iteration, the rebuilt buffers kept until their last use; groups recomputed before the
    same step run in forward order, so a segment (AlexNet's LRN then pooling) is rebuilt from
    its checkpoint in one go.

    **Memory (eq. 4).**  usage[j] holds the rebuilt segment from step j on, with its scratch
    through step j (a little more than the recomputation needs: allocations happen only
    before a step computes, releases only after), and a checkpoint from its prefetch on; the
    peak of a segment is the segment plus step j's own buffers.  The plan does not depend on
    the budget: under a budget below its arena it fails with :class:`BudgetError`.
    """
    pol = recompute_policy(gmap, pinned)
    out, pending = _base_intervals(gmap, set(pol.offloaded), recompute=pol)
    plan = _assemble("recompute", gmap, _place_returns(gmap, out, pending, None, "ahead"),
                     budget, pinned, pol.offloaded, uses=pol.uses, recompute=pol.schedule(),
                     recomputed=pol.recomputed)
    if not _fits(plan, budget):
        _fail("recompute", gmap, budget, pinned, plan)
    return plan


# --- dynamic strategy (swap/planner, swap/tuner) (begin)
def plan_dynamic(gmap: GMAP, budget: int | None = None, pinned=frozenset(), *,
                 hold=None, recompute=None, lead: int = 0) -> Plan:
    """AccUDNN's dynamic strategy: ``naive`` with the feature maps in ``pinned`` kept on the
    device (never offloaded).  The pinned set comes from :func:`swap.planner.choose_pins`
    (constraint (6)) and the minibatch from :func:`swap.tuner.tune` (Algorithm 2); this
    function only turns that decision into an executable plan.

    hold: optional {buffer: step}: an offloaded buffer's region stays reserved until after
    that step (the step during which its offload is predicted to complete), so that the fixed
    layout never hands the region to an allocation that would then wait for the copy.

    recompute: optional :class:`RecomputePolicy` from :func:`dynamic_recompute`: the forward
    groups it names are run again in backward instead of keeping or offloading what they
    write (the buffers then are neither pinned nor offloaded).

    lead: each prefetch's region is laid out clear of what the ``lead`` steps before it
    release, so that its copy need not wait for them (:func:`_layout`)."""
    return plan_naive(gmap, budget, pinned, strategy="dynamic", hold=hold, recompute=recompute,
                      lead=lead)
# --- dynamic strategy (end)


STRATEGIES = {"none": plan_none, "naive": plan_naive, "vdnn": plan_vdnn,
              "dynamic": plan_dynamic, "recompute": plan_recompute, "resident": plan_resident,
              "superneurons": plan_recompute}       # the same strategy under its paper's name


def make_plan(gmap: GMAP, strategy: str, budget: int | None = None,
              pinned=frozenset(), **options) -> Plan:
    """The plan of ``strategy`` for ``gmap`` under ``budget`` (bytes; None: unbounded).

    Raises :class:`BudgetError` when the budget is too small, naming the smallest budget that
    works and the largest minibatch that fits it.  ``options`` go to the strategy (``hold``
    for ``dynamic``).
    """
    fn = STRATEGIES.get(strategy)
    if fn is None:
        raise ValueError(f"unknown swap strategy {strategy!r} (known: {', '.join(STRATEGIES)})")
    return fn(gmap, budget, frozenset(pinned), **options)


# ------------------------------------------------------------- searches
def min_budget(gmap: GMAP, strategy: str, pinned=frozenset()) -> int:
    """The smallest budget (bytes) under which ``strategy`` runs ``gmap``."""
    return make_plan(gmap, strategy, None, pinned).arena_bytes


def resident_extent(plan: Plan) -> int:
    """The end of the plan's resident regions (allocated at ``SETUP``, kept for the whole
    run): where the test nets' per-pass buffers start while a test pass runs, between two
    training iterations, when every per-iteration region is free."""
    return max((op.offset + op.nbytes for op in plan.ops if op.step == SETUP), default=0)


def arena_need(plan: Plan, test_dynamic: int = 0) -> int:
    """The arena bytes ``plan`` needs with test nets whose forward passes take
    ``test_dynamic`` bytes at most (their per-pass buffers, :class:`swap.runtime.TestNetMemory`):
    its own extent, or its resident regions and a test pass after them, whichever ends
    later.  A plan that keeps every buffer resident (Caffe's ``none``, ``resident``) has no
    per-iteration room for a test pass to reuse."""
    if not test_dynamic:
        return align(plan.arena_bytes)
    return align(max(plan.arena_bytes, resident_extent(plan) + int(test_dynamic)))


def plan_bytes_at(gmap: GMAP, strategy: str, k: int, pinned=frozenset(),
                  test_dynamic: int = 0, recompute=None) -> tuple:
    """(arena bytes, host bytes) of ``strategy``'s unbounded plan of ``gmap.at(k)``: what the
    searches over k ask of each k.  test_dynamic: the arena bytes are
    :func:`arena_need`'s, with test passes of that many bytes.  recompute: the dynamic plan's
    :class:`RecomputePolicy` (its buffer ids and steps do not depend on k), or None.

    Remembered on ``gmap`` itself (a frozen value, so the answers cannot change; only the
    integers are kept, and they go with it): the profiler searches k_max again each time its
    scratch model moves, over much the same k of the same GMAP, and each answer is a whole
    plan.  Three quarters of the tuner tests' time went there.  A plan with a recompute
    policy is made afresh (the policy holds a dict: no memo key)."""
    if recompute is not None:
        plan = make_plan(gmap.at(k), strategy, None, pinned, recompute=recompute)
        hit = (int(plan.arena_bytes), int(plan.host_bytes), int(resident_extent(plan)))
    else:
        memo = gmap.__dict__.setdefault("_plan_bytes", {})
        key = (strategy, frozenset(pinned), int(k))
        hit = memo.get(key)
        if hit is None:
            plan = make_plan(gmap.at(k), strategy, None, pinned)
            hit = memo[key] = (int(plan.arena_bytes), int(plan.host_bytes),
                               int(resident_extent(plan)))
    if test_dynamic:
        return align(max(hit[0], hit[2] + int(test_dynamic))), hit[1]
    return hit[:2]


def largest_k(fits, k_limit: int = 1 << 20) -> int:
    """The largest k <= k_limit with ``fits(k)``, for a ``fits`` that holds up to some k and
    fails beyond it (0 if not even k = 1 fits): doubling, then bisection."""
    if k_limit < 1 or not fits(1):
        return 0
    lo, hi = 1, 2
    while hi <= k_limit and fits(hi):
        lo, hi = hi, hi * 2
    if hi > k_limit:             # every power of two up to k_limit fits: try k_limit itself
        if lo == k_limit or fits(k_limit):
            return k_limit
        hi = k_limit
    while hi - lo > 1:           # fits(lo), not fits(hi)
        mid = (lo + hi) // 2
        if fits(mid):
            lo = mid
        else:
            hi = mid
    return lo


def max_batch(gmap: GMAP, strategy: str, budget: int, pinned=frozenset(),
              k_limit: int = 1 << 20, test_dynamic: int = 0, recompute=None) -> int:
    """The largest minibatch k whose plan fits ``budget`` (0 if not even k = 1 does), with
    test passes of ``test_dynamic`` bytes (:func:`arena_need`) and the dynamic plan's
    ``recompute`` policy (None: none).

    Sizes are linear in k (section 3), so the smallest budget grows with k: bisection on k.
    """
    return largest_k(lambda k: plan_bytes_at(gmap, strategy, k, pinned, test_dynamic,
                                             recompute)[0] <= budget, k_limit)


def _budget_error(strategy, gmap, budget, pinned, plan) -> BudgetError:
    return _PlanBudgetError(strategy, gmap, budget, pinned, plan)


def plan_budget_error(gmap: GMAP, strategy: str, budget: int, plan: Plan | None = None,
                      pinned=frozenset(), test_dynamic: int = 0) -> BudgetError:
    """The :class:`BudgetError` of ``strategy`` on ``gmap`` under ``budget`` with test passes
    of ``test_dynamic`` bytes (:func:`arena_need`): where the plan alone fits the budget but
    not with the room a test pass takes after its resident buffers, or where ``plan`` (made
    without a budget when None) does not fit.  Its smallest budget and largest minibatch
    count that room too, so that the budget it names works."""
    if plan is None:
        plan = make_plan(gmap, strategy, None, pinned)
    return _PlanBudgetError(strategy, gmap, budget, pinned, plan, test_dynamic)


class _PlanBudgetError(BudgetError):
    """The :class:`BudgetError` of a plan that does not fit: its smallest budget and the largest
    minibatch that fits (a plan and a search of plans) are worked out when first read, with the
    message.  The searches over k catch most such errors unread: three of the tuner's tests
    spent a third of their time on the messages of the k they probed (session 34).
    ``test_dynamic``: the test nets' per-pass bytes, which the arena holds after the plan's
    resident buffers (:func:`arena_need`); both figures leave room for them."""

    _UNSET = object()

    def __init__(self, strategy, gmap, budget, pinned, plan, test_dynamic: int = 0, *,
                 recompute=None):
        ValueError.__init__(self)
        self.budget, self.strategy, self.k = budget, strategy, gmap.k
        self._of = (gmap, pinned, plan)
        self.test_dynamic = int(test_dynamic)
        self.recompute = recompute          # the dynamic plan's RecomputePolicy, or None
        self._need = self._kmax = self._msg = self._UNSET

    def with_test_pass(self, test_dynamic: int) -> "_PlanBudgetError":
        """This error with test passes of ``test_dynamic`` bytes (its figures recomputed)."""
        gmap, pinned, plan = self._of
        return _PlanBudgetError(self.strategy, gmap, self.budget, pinned, plan, test_dynamic,
                                recompute=self.recompute)

    @property
    def min_budget(self):
        if self._need is self._UNSET:
            gmap, pinned, _ = self._of
            self._need = plan_bytes_at(gmap, self.strategy, gmap.k, pinned, self.test_dynamic,
                                       self.recompute)[0]
        return self._need

    @property
    def max_k(self):
        if self._kmax is self._UNSET:
            gmap, pinned, _ = self._of
            self._kmax = max_batch(gmap, self.strategy, self.budget, pinned,
                                   test_dynamic=self.test_dynamic, recompute=self.recompute)
        return self._kmax

    def __str__(self):
        if self._msg is self._UNSET:
            from .memory import fmt_bytes
            gmap, _, plan = self._of
            budget, need, kmax = self.budget, self.min_budget, self.max_k
            j = plan.peak_step
            at = "setup" if j == SETUP else str(gmap.steps[j])
            test = ""
            if self.test_dynamic:
                test = (f", {fmt_bytes(arena_need(plan, self.test_dynamic))} with room for "
                        f"the test nets' pass ({fmt_bytes(self.test_dynamic)}) after its "
                        "resident buffers")
            msg = (f"budget {fmt_bytes(budget)} is too small for swap strategy "
                   f"{self.strategy!r} on net {gmap.net_name!r} at minibatch {gmap.k}: its peak "
                   f"is {fmt_bytes(plan.peak)} at {at} (eq. 4), and its arena needs "
                   f"{fmt_bytes(plan.arena_bytes)}{test}. The smallest budget that works is "
                   f"{fmt_bytes(need)} ({need} bytes), laid out with no region holds and no "
                   f"prefetch lead{', with its recomputations' if self.recompute else ''}; ")
            if kmax:
                msg += f"the largest minibatch that fits {fmt_bytes(budget)} is {kmax}."
            else:
                msg += f"not even minibatch 1 fits {fmt_bytes(budget)}."
            self._msg = msg
            self.args = (msg,)
        return self._msg

    def __repr__(self):
        return f"BudgetError({str(self)!r})"

    def __reduce__(self):             # pickled (another process) as the plain error it reads as
        return (_plain_budget_error, (str(self), self.budget, self.min_budget, self.max_k,
                                      self.strategy, self.k))


_PlanBudgetError.__name__ = _PlanBudgetError.__qualname__ = "BudgetError"   # as it reads


def _plain_budget_error(message, budget, need, kmax, strategy, k) -> BudgetError:
    return BudgetError(message, budget=budget, min_budget=need, max_k=kmax, strategy=strategy,
                       k=k)
