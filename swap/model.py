"""The performance model of AccUDNN (paper, section 3.3): pure functions on profiles.

Three submodels, each fitted from a :class:`swap.profiler.Profile` (measured, or synthetic):

* **GPU computation** (eq. 1-3).  A step's FLOPs scale linearly with the minibatch (eq. 1:
  ``FLOPs_j(k) = k / k_base * FLOPs_j(k_base)``, which :meth:`swap.gmap.GMAP.at` applies).  Its
  time is ``FLOPs / FLOPS(FLOPs)``, where ``FLOPS(.)`` is a per-layer-type throughput curve that
  "grows gradually ... [then] remains unchanged when FLOPs exceeds the value of the threshold
  point" (section 3.3.1).  We choose the saturating form

      FLOPS(x) = P * x / (x + x_half)                                   (curve)

  with P the saturated throughput (FLOP/s) and x_half the FLOPs at which half of P is reached.
  It has the shape the paper describes (rises from 0, tends to P) and a plain physical reading:
  the time ``t(x) = x / FLOPS(x) = x / P + x_half / P`` is a fixed cost per step (kernel launches,
  Python dispatch: x_half / P) plus the work at peak speed.  That fixed cost is also the
  "unmodeled overhead of schedule and startup of kernel" for which the paper "reduce[s] the
  denominator FLOPS(*) slightly" (section 6.2.1): here it is part of the fit instead of a fudge.
  Steps with no FLOPs (Split, Flatten, Data) take t(0) = x_half / P of their type; a type whose
  steps all have 0 FLOPs gets a constant time (``t0``, the median measured).

  Fit (:func:`fit_curve`): least squares on ``log FLOPS`` (equivalently on log time: relative
  errors, so the many small layers count as much as the few large ones).  For a given x_half
  the best log P is a mean in closed form; x_half is found by a grid over 13 decades plus a
  golden-section refinement of the one-dimensional residual.

  Curves are keyed by ``(layer type, phase)``: a type's forward and backward kernels differ
  (a convolution's backward is two GEMMs with other shapes), so they get separate curves;
  ``granularity="step"`` fits one curve per step instead (5 samples each, one per profiled k)
  for when a type mixes very different kernels (1x1 and 7x7 convolutions).  Unseen types
  fall back to the curve pooled over all steps of the same phase, then over all steps.

  eq. (2): ``t_iter(k) = sum_j t_j(k)`` (stall-free); eq. (3):
  ``t_whole(k) = E * m / k * (t_iter(k) + Delta)`` with Delta the time between iterations
  (parameter synchronization in distributed mode, 0 on one GPU).

* **GPU memory** (eq. 4): allocated minus released bytes never exceed the budget.  It is
  :class:`swap.plan.Plan`'s ``usage`` per step (checked by ``Plan.check``) and, in time, the
  memory curve of :func:`swap.planner.simulate`.  :func:`peak_memory` and :func:`paper_k_max`
  (Algorithm 2's closed form for k_max) are here for reference; the tuner uses the exact
  ``swap.plan.max_batch`` of the naive plan.

* **PCIe** (eq. 5): ``t = (k / k_base) * T(k_base) / Bandwidth_avail``.  The available bandwidth
  is measured per direction (host-to-device for prefetches, device-to-host for offloads) and
  both at once (two copy engines share the link: on the H200 about 55 GB/s each alone, 101 GB/s
  together).  :class:`PCIeModel` also carries a per-transfer latency (fitted; 0 gives eq. 5
  exactly), which matters for the many small feature maps of deep nets.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np

from .gmap import BACKWARD, FORWARD, GMAP

H2D = "h2d"      # host to device: prefetch
D2H = "d2h"      # device to host: offload


# ------------------------------------------------------------------ curves
@dataclass(frozen=True)
class ThroughputCurve:
    """``FLOPS(x) = peak * x / (x + x_half)``; a step of x FLOPs takes ``t0 + (x + x_half) / peak``.

    peak: saturated throughput in FLOP/s (``inf`` for a constant-time type).  x_half: FLOPs at
    half of the peak.  t0: extra constant seconds per step (used alone for types with no FLOPs).
    """
    peak: float
    x_half: float = 0.0
    t0: float = 0.0

    def flops_per_s(self, x):
        """Throughput at a step of ``x`` FLOPs (eq. 2's ``FLOPS(.)``)."""
        x = np.asarray(x, dtype=np.float64)
        return x / self.time(x)

    def time(self, x):
        """Seconds for a step of ``x`` FLOPs (scalar or array)."""
        x = np.asarray(x, dtype=np.float64)
        if not math.isfinite(self.peak):
            out = np.full_like(x, self.t0)
        else:
            out = self.t0 + (x + self.x_half) / self.peak
        return float(out) if out.ndim == 0 else out

    def saturation(self, fraction: float = 0.9) -> float:
        """FLOPs at which ``fraction`` of the peak is reached (the paper's threshold point)."""
        return fraction / (1.0 - fraction) * self.x_half

    @classmethod
    def constant(cls, seconds: float) -> "ThroughputCurve":
        return cls(peak=math.inf, x_half=0.0, t0=float(seconds))

    def to_dict(self) -> dict:
        return {"peak": None if not math.isfinite(self.peak) else self.peak,
                "x_half": self.x_half, "t0": self.t0}

    @classmethod
    def from_dict(cls, d) -> "ThroughputCurve":
        return cls(peak=math.inf if d["peak"] is None else float(d["peak"]),
                   x_half=float(d["x_half"]), t0=float(d.get("t0", 0.0)))


def _golden(f, a: float, b: float, iters: int = 60) -> float:
    """Minimum of a unimodal f on [a, b] by golden-section search."""
    g = (math.sqrt(5) - 1) / 2
    c, d = b - g * (b - a), a + g * (b - a)
    fc, fd = f(c), f(d)
    for _ in range(iters):
        if fc < fd:
            b, d, fd = d, c, fc
            c = b - g * (b - a)
            fc = f(c)
        else:
            a, c, fc = c, d, fd
            d = a + g * (b - a)
            fd = f(d)
    return (a + b) / 2


def fit_curve(flops, times) -> ThroughputCurve:
    """Fit ``FLOPS(x) = P x / (x + x_half)`` to (FLOPs, seconds) samples in log space.

    Residual of sample i: ``log(x_i + x_half) - log P - log t_i`` (= the error of log FLOPS).
    For fixed x_half the optimal ``log P`` is the mean of ``log(x_i + x_half) - log t_i``;
    x_half minimizes the remaining sum of squares (grid over log x_half, then golden section).
    Samples with zero FLOPs constrain x_half / P directly.  All-zero samples give a constant.
    """
    x = np.asarray(flops, dtype=np.float64).ravel()
    t = np.asarray(times, dtype=np.float64).ravel()
    ok = np.isfinite(x) & np.isfinite(t) & (t > 0) & (x >= 0)
    x, t = x[ok], t[ok]
    if len(t) == 0:
        raise ValueError("fit_curve needs at least one sample with a positive time")
    if not np.any(x > 0):
        return ThroughputCurve.constant(float(np.median(t)))
    logt = np.log(t)
    xpos = x[x > 0]

    def sse_of(h):
        if h <= 0 and np.any(x == 0):
            return math.inf, 0.0
        r = np.log(x + h) - logt
        logp = float(np.mean(r))
        return float(np.sum((r - logp) ** 2)), logp

    decade = math.log(10)
    lo = math.log(max(xpos.min(), 1.0)) - 12 * decade
    hi = math.log(xpos.max()) + 6 * decade
    grid = np.linspace(lo, hi, 200)
    errs = [sse_of(math.exp(u))[0] for u in grid]
    best = int(np.argmin(errs))
    # h = 0 (pure peak throughput) is a candidate too when no sample has zero FLOPs
    e0 = sse_of(0.0)[0]
    a = grid[max(best - 1, 0)]
    b = grid[min(best + 1, len(grid) - 1)]
    u = _golden(lambda v: sse_of(math.exp(v))[0], a, b)
    h = math.exp(u)
    e, logp = sse_of(h)
    if e0 <= e:
        h = 0.0
        e, logp = sse_of(0.0)
    return ThroughputCurve(peak=math.exp(logp), x_half=h)


# ------------------------------------------------------------ compute model
def _key(step, granularity: str) -> tuple:
    if granularity == "step":
        return ("step", step.name, step.phase)
    return (step.type, step.phase)


@dataclass(frozen=True)
class ComputeModel:
    """Per-step compute time at any minibatch: eq. (1) and (2).

    curves: ``((key, ThroughputCurve), ...)``; keys are ``(type, phase)`` (granularity "type",
    the paper's) or ``("step", layer name, phase)`` (granularity "step"), plus the fallbacks
    ``("*", phase)`` and ``("*", "*")``.  slowdown: a factor >= 1 on every time (the paper's
    "reduce the denominator FLOPS(*) slightly"; 1 by default, since the fitted x_half already
    holds the per-step overhead).
    """
    curves: tuple
    granularity: str = "type"
    slowdown: float = 1.0
    _index: dict = field(default=None, init=False, repr=False, compare=False)

    def __post_init__(self):
        object.__setattr__(self, "_index", dict(self.curves))

    def curve(self, step) -> ThroughputCurve:
        """The curve of a :class:`swap.gmap.Step` (with the fallbacks of the module doc)."""
        idx = self._index
        for key in (_key(step, self.granularity), (step.type, step.phase), ("*", step.phase),
                    ("*", "*")):
            if key in idx:
                return idx[key]
        raise KeyError(f"the compute model has no curve for {step} (type {step.type}) and no "
                       "fallback")

    def step_time(self, step, flops: float | None = None) -> float:
        """t_j: seconds of one step at ``flops`` (default: the step's own at its GMAP's k)."""
        x = step.flops if flops is None else flops
        return float(self.curve(step).time(x)) * self.slowdown

    def step_times(self, gmap: GMAP) -> np.ndarray:
        """``t_j(k)`` of every step of ``gmap`` at ``gmap.k`` (eq. 1 is in ``GMAP.at``)."""
        return np.array([self.step_time(s) for s in gmap.steps], dtype=np.float64)

    def times_fn(self, gmap: GMAP):
        """A function ``k -> t_j(k)`` for every step of ``gmap`` (vectorized eq. 1-2, for
        searches over k): FLOPs scale as ``k / gmap.k``."""
        curves = [self.curve(s) for s in gmap.steps]
        flops = np.array([s.flops for s in gmap.steps], dtype=np.float64)
        peak = np.array([c.peak for c in curves], dtype=np.float64)
        xh = np.array([c.x_half for c in curves], dtype=np.float64)
        t0 = np.array([c.t0 for c in curves], dtype=np.float64)
        finite = np.isfinite(peak)
        safe = np.where(finite, peak, 1.0)
        k0 = gmap.k
        slow = self.slowdown

        def times(k: int) -> np.ndarray:
            x = flops * (k / k0)
            return slow * (t0 + np.where(finite, (x + xh) / safe, 0.0))
        return times

    def t_iter(self, gmap: GMAP, k: int | None = None) -> float:
        """eq. (2): the stall-free iteration time at ``k`` (default ``gmap.k``)."""
        g = gmap if k is None else gmap.at(k)
        return float(self.step_times(g).sum())

    # ---- construction
    @classmethod
    def uniform(cls, curve: ThroughputCurve, slowdown: float = 1.0) -> "ComputeModel":
        """One curve for every layer type (synthetic device models)."""
        return cls(curves=((("*", "*"), curve),), slowdown=slowdown)

    @classmethod
    def from_profile(cls, profile, granularity: str = "type") -> "ComputeModel":
        """Fit the curves of a :class:`swap.profiler.Profile` (per type and phase, or per step)."""
        if granularity not in ("type", "step"):
            raise ValueError(f"granularity must be 'type' or 'step', got {granularity!r}")
        groups: dict = {}
        steps = {s.step: s for s in profile.steps}
        for c in profile.compute:
            s = steps[c.step]
            for key in (_key(s, granularity), (s.type, s.phase), ("*", s.phase), ("*", "*")):
                groups.setdefault(key, ([], []))
                groups[key][0].append(c.flops)
                groups[key][1].append(c.time)
        if not groups:
            raise ValueError(f"profile of {profile.net!r} has no compute samples")
        curves = tuple((key, fit_curve(x, t)) for key, (x, t) in sorted(groups.items()))
        return cls(curves=curves, granularity=granularity)

    def to_dict(self) -> dict:
        return {"granularity": self.granularity, "slowdown": self.slowdown,
                "curves": [{"key": list(k), **c.to_dict()} for k, c in self.curves]}

    @classmethod
    def from_dict(cls, d) -> "ComputeModel":
        return cls(curves=tuple((tuple(c["key"]), ThroughputCurve.from_dict(c))
                                for c in d["curves"]),
                   granularity=d.get("granularity", "type"), slowdown=d.get("slowdown", 1.0))


def t_iter(model: ComputeModel, gmap: GMAP, k: int) -> float:
    """eq. (2) at minibatch ``k``."""
    return model.t_iter(gmap, k)


def t_whole(model: ComputeModel, gmap: GMAP, k: int, epochs: float, dataset: int,
            delta: float = 0.0) -> float:
    """eq. (3): ``E * m / k * (t_iter(k) + Delta)``: seconds to train ``epochs`` over ``dataset``
    images at minibatch ``k``, Delta seconds between iterations (parameter synchronization)."""
    return epochs * dataset / k * (model.t_iter(gmap, k) + delta)


def images_per_second(model: ComputeModel, gmap: GMAP, k: int, delta: float = 0.0) -> float:
    return k / (model.t_iter(gmap, k) + delta)


# --------------------------------------------------------------- PCIe model
@dataclass(frozen=True)
class PCIeModel:
    """Transfer time between pinned host memory and the device, eq. (5).

    h2d, d2h: bytes/s of one direction alone.  both: total bytes/s when both directions copy at
    once (None: no contention, ``h2d + d2h``); each direction then gets its share in proportion
    to its own rate, never more than alone.  latency: seconds per transfer (0: eq. 5 exactly).
    """
    h2d: float
    d2h: float
    both: float | None = None
    latency: float = 0.0

    def __post_init__(self):
        for name in ("h2d", "d2h"):
            v = getattr(self, name)
            if not v > 0:
                raise ValueError(f"PCIe bandwidth {name} must be positive, got {v}")

    def bandwidth(self, direction: str, concurrent: bool = False) -> float:
        bw = self.h2d if direction == H2D else self.d2h
        if concurrent and self.both is not None:
            bw = min(bw, self.both * bw / (self.h2d + self.d2h))
        return bw

    def time(self, nbytes, direction: str, concurrent: bool = False):
        """Seconds to copy ``nbytes`` in ``direction`` ("h2d" prefetch, "d2h" offload)."""
        if direction not in (H2D, D2H):
            raise ValueError(f"direction must be 'h2d' or 'd2h', got {direction!r}")
        return self.latency + np.asarray(nbytes, dtype=np.float64) / self.bandwidth(direction,
                                                                                   concurrent)

    def seconds(self, nbytes: int, direction: str, concurrent: bool = False) -> float:
        """:meth:`time` for one transfer, as a Python float (the simulators' hot path)."""
        return self.latency + nbytes / self.bandwidth(direction, concurrent)

    def eq5(self, bytes_at_base: float, k: int, k_base: int, direction: str) -> float:
        """eq. (5) as the paper writes it: ``(k / k_base) * T(k_base) / Bandwidth_avail``."""
        return float(self.time(k / k_base * bytes_at_base, direction))

    @classmethod
    def from_profile(cls, profile, fit_latency: bool = True) -> "PCIeModel":
        """Bandwidths from a profile's transfers (the paper: "averaging a group of actual
        transfer rates").

        Per direction, transfers that did not overlap a transfer the other way: a least-squares
        fit of ``t = latency + bytes / bandwidth`` with relative residuals; if the fitted latency
        is negative (or ``fit_latency`` is false), latency 0 and the byte-weighted mean rate
        ``sum(bytes) / sum(t)``.  Both-at-once: the profile's bandwidth measurement if any, else
        the sum of the median rates of overlapping transfers in each direction, else None.
        """
        fits = {}
        lat = []
        conc = {H2D: [], D2H: []}
        for direction, kind in ((H2D, "prefetch"), (D2H, "offload")):
            alone = [(t.nbytes, t.time) for t in profile.transfers
                     if t.kind == kind and not t.concurrent and t.time > 0 and t.nbytes > 0]
            conc[direction] = [t.nbytes / t.time for t in profile.transfers
                               if t.kind == kind and t.concurrent and t.time > 0]
            bw_meas = (profile.bandwidth or {}).get(direction)
            if not alone:
                if bw_meas:
                    fits[direction] = (float(bw_meas), 0.0)
                    continue
                raise ValueError(f"profile of {profile.net!r} has no {kind} samples to measure "
                                 f"the {direction} bandwidth")
            b = np.array([a[0] for a in alone], dtype=np.float64)
            t = np.array([a[1] for a in alone], dtype=np.float64)
            a0, inv = 0.0, float(t.sum() / b.sum())
            if fit_latency and len(alone) >= 3 and np.ptp(b) > 0:
                # minimize sum(((a + c b - t) / t)^2): weighted linear least squares
                w = 1.0 / t
                A = np.stack([w, b * w], axis=1)
                sol, *_ = np.linalg.lstsq(A, np.ones_like(t), rcond=None)
                if sol[0] >= 0 and sol[1] > 0:
                    a0, inv = float(sol[0]), float(sol[1])
            fits[direction] = (1.0 / inv, a0)
            lat.append(a0)
        both = (profile.bandwidth or {}).get("both")
        if both is None and conc[H2D] and conc[D2H]:
            both = float(np.median(conc[H2D]) + np.median(conc[D2H]))
        return cls(h2d=fits[H2D][0], d2h=fits[D2H][0], both=both,
                   latency=float(np.mean(lat)) if lat else 0.0)

    def to_dict(self) -> dict:
        return {"h2d": self.h2d, "d2h": self.d2h, "both": self.both, "latency": self.latency}

    @classmethod
    def from_dict(cls, d) -> "PCIeModel":
        return cls(h2d=d["h2d"], d2h=d["d2h"], both=d.get("both"), latency=d.get("latency", 0.0))


# ---------------------------------------------------------- memory, eq. (4)
def peak_memory(gmap: GMAP, k: int, strategy: str = "naive", budget: int | None = None,
                pinned=frozenset()) -> int:
    """Peak of allocated minus released bytes (eq. 4's left side) of ``strategy`` at ``k``."""
    from .plan import make_plan
    return make_plan(gmap.at(k), strategy, budget, pinned).peak


def paper_k_max(gmap: GMAP, budget: int) -> int:
    """Algorithm 2's first line, ``k_max = k_base * (M_budget - M_others - M_para - M_ws) /
    sum M_FM(k_base)`` at the peak step of the layer-wise (naive, just-in-time) plan.

    The bytes resident at the peak step split into what does not scale with k (parameters,
    their diffs and history, constants: ``M_para + M_others``, plus capped workspace) and what
    scales (feature maps, diffs, workspace per image).  The exact answer, with the plan's
    layout and a peak step that may move with k, is ``swap.plan.max_batch(gmap, "naive",
    budget)``, which the tuner uses; this closed form is within a few percent of it.
    """
    from .arena import align
    from .plan import make_plan
    plan = make_plan(gmap, "naive", None)
    j = plan.peak_step
    held = plan.resident_at(j)
    g1, g2 = gmap.at(1), gmap.at(2)
    const = sum(align(g1.nbytes(b)) for b in held)
    per = sum(align(g2.nbytes(b)) for b in held) - const
    fixed = const - per
    if per <= 0:
        return 0
    return max(0, int((budget - fixed) // per))


__all__ = ["H2D", "D2H", "ThroughputCurve", "fit_curve", "ComputeModel", "t_iter", "t_whole",
           "images_per_second", "PCIeModel", "peak_memory", "paper_k_max", "FORWARD", "BACKWARD"]
