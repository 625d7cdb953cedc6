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

  Per type or per step, checked on the H200 profiles of 2026-11-21 (``scripts/model_refit.py``,
  docs/results/model_refit.md; :func:`leave_one_out` holds each profiled k out of the fit).
  In the profiled range (1/8 .. 1 of k_max) each step's time is close to a line in k, which
  its own curve (a line in k with a non-negative intercept) follows; the steps of one type
  differ in throughput at the same FLOPs by more than x_half can express (the CAFFE engine
  lowers a convolution in column chunks of bounded size; GEMM shapes differ), so the per-type
  curve misses single steps by tens of per cent (AlexNet at k = 1236: its convolutions by
  -29 to +42 %, conv2's backward, 23 % of the iteration, by -21 %), which cancel to -2.1 % on
  the iteration; per step the iteration is within 0.2 % at every profiled k, held out or not.
  The tuner fits per step (:data:`TUNER_GRANULARITY`, ``swap.tuner.profile_models``'
  default).  The plans it makes were measured on one H200 (2026-11-21, the session-5
  profiles, ``scripts/tuner_table.py --granularity step``): VGG-16 within -0.2 to +0.1 % at
  k* = 216, 108 and 84 (per type: -9.5 to -5.1 %, its convolutions all at one throughput
  while conv1_2's backward runs at half of it); ResNet-34 within +0.7 to +3.0 % at k* = 342,
  171 and 106, with no stall (dynamic / none 0.95 to 1.01); AlexNet within 0.3 % at 881 and
  705 and -6.0 % at k* = 1411, where ``none`` under the executor took 300 ms in the same
  process against 283 ms at 1529 in an earlier one (the plain net trains 1411 images in 223
  ms and 1529 in 239: the minibatch itself is not slow; not explained).  The paper's
  per-type curves stay available (``granularity="type"``, ``--granularity type``).

  ``granularity="segment"`` (the tuner's default since 2026-11-22) keeps each step's curve
  outside the profiled range and, inside it, the segments between the profiled points
  (:func:`fit_segments`): under the CUDNN engine a convolution's time per image jumps where
  cuDNN's fastest algorithm stops fitting the workspace limit, which one curve cannot follow.
  On the H200 runs of 2026-11-22 (CPU re-analysis of each run's own profile against its
  measured points, ``docs/RESULTS.md`` "Session 10"): AlexNet +0.2 / +0.1 / -1.1 % (per step:
  -17 % at all three), ResNet-34 +6.3 / +2.2 / +1.0 % (per step: +20 to +24 %).

  **Chunked convolutions are priced per call.**  Under a bound per image a cuDNN convolution
  cuts a minibatch past its cap into calls of at most a few whole probes of images
  (:func:`minicaffe.cudnn.ops.workspace_chunks`), and such a call costs about the same for
  11 to 16 images: VGG-16 under a 1.5 GiB cap (H200, 2026-11-29, session 38) ran conv2_2's
  forward at 41.2, 68.6, 47.3, 42.2 us per image at k = 16, 33, 65, 130 (one call of 16, three
  of 11, five of 13, nine of 14-15), and every map kept at 92 (six calls of 15-16) ran 1.248
  ms per image where the curves, per image between 65 and 130, gave 1.30 (+5.1 % on the
  iteration).  Where the profile records a convolution's rule (``meta["chunks"]``, the
  profiler's :func:`swap.profiler.chunk_rules_now`), its steps are fitted and predicted per
  call: ``t_j(k) = n_j(k) * t(FLOPs_j(k) / n_j(k))``, with ``n_j(k)`` the rule's calls at k
  (:func:`minicaffe.cudnn.ops.chunk_count`).  A CPU replay of that profile (which predates
  the record) with chunks of at most 16 images for conv1_2 to conv4_3 gives 114.0 ms of
  steps at 92 this way and 119.3 ms per image; every map kept measured 113.7 ms of steps
  (``docs/results/tuner_s38/chunk_replay.py``).

  **cuDNN convolutions are priced by cuDNN's own search** where the profile records it
  (``meta["searched"]``, :func:`swap.profiler.search_times_now`; granularities "step" and
  "segment").  A convolution's time is a step function of its images, not a curve: on the
  H200 (session 39, VGG-16 under a 1.5 GiB cap, every map kept) conv4_2's forward under
  WINOGRAD_NONFUSED took 1.22, 1.27 and 2.00 ms at 33, 48 and 65 images (tiles of 16), and
  conv2_x and conv3_x switched to FFT_TILING at 33 and 65 but not at 48, so the iteration ran
  1561, 1256 and 1411 us per image there.  Segments between profiled points cannot know where
  the steps are; cuDNN's search times every algorithm at the very shape (its chosen one is the
  algorithm that then runs: choices are cached per shape), within a few per cent of the step
  measured in place (conv4_2: 1.23 / 1.28 / 1.97 ms).  So such a step at k is
  ``r(k) * s(k)``: ``s(k)`` the searched seconds of its calls at k (forward; backward: filter
  and, where the net propagates to its bottom, data), ``r(k)`` the measured-to-searched ratio
  at the profiled ks (the bias and the host's gaps; 0.99-1.15), linear between them.  At a k
  the profile did not search, the tuner's model asks the device (:attr:`ComputeModel.probe`,
  a cached search per shape) and keeps the answer in the profile; without a device (a saved
  profile replayed on the CPU), a k it lacks falls back to the curves.

  eq. (2): ``t_iter(k) = sum_j t_j(k)`` (stall-free); eq. (3):
  ``t_whole(k) = E * m / k * (max(t_iter(k), H(k)) + O(k) + Delta)`` with Delta the time
  between iterations (parameter synchronization in distributed mode, 0 on one GPU), O(k) and
  the host's issue time H(k) below (the paper's eq. 3 has neither).

* **Time outside the layer steps** (:class:`IterationOverhead`, not in the paper's eq. 2):
  ``O(k) = a + b * k`` seconds per iteration on the compute stream that no step's time holds:
  the gaps between consecutive steps (launch and host work between layers), the time before
  the first step (clearing the parameter diffs) and after the last backward step (the solver
  update, SGD with momentum over every parameter).  Fitted per profile by least squares over
  the profiled ks from each iteration's ``head + gaps + tail`` (:func:`overhead_samples`).  The
  profiles are taken under the naive plan, where many steps wait for a prefetch: a gap in which
  a transfer ended may be such a wait, so only the other gaps ("clean") are averaged, and the
  mean clean gap counts for every boundary.  Physically O is constant in k (the numbers of
  parameters and of steps do not change with k); the slope b follows a profile that shows
  growth with k, and is clamped at 0.  Profiles without solver-step marks (before
  ``SolverStepSample``) give the gaps and the pass's own head and tail only: the solver update
  is then not in O(k).  The H200 profiles of 2026-11-21 (none has the marks) give 4 to 7 us per
  step boundary, O = 0.2 ms for AlexNet, 1.8 ms for ResNet-34, 2.7 ms for ResNet-50, 5.5 to
  6.2 ms for ResNet-101 (``scripts/model_overhead.py``).

* **The host's issue time** (:class:`HostModel`, not in the paper): per step ``h_j(k) = a_j +
  b_j k`` seconds for the host (Python, kernel launches) to issue step j, fitted to host times
  taken at small k under the plan "none", where no launch waits for the device (method
  "issue"; older profiles: the line below the compute profile's host times, where a launch
  into a full queue waits for the device, which only adds).  The predicted iteration is
  ``max(device + tail, sum_j h_j(k) + O(k))`` (:func:`iteration_time`): the device's steps
  (eq. 2 plus stalls) cannot end before the host has issued them.  It binds at small k, where
  the device's work shrinks and the host's does not (ResNet-152 on the H200 at k = 16).
  Profiles without host times (before ``ComputeSample.host``) give no host model and the
  predictions of before.

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

import dataclasses
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
    knots: tuple = ()

    def flops_per_s(self, x):
        """Throughput at a step of ``x`` FLOPs (eq. 2's ``FLOPS(.)``)."""
        x = np.asarray(x, dtype=np.float64)
        return x / self.time(x)

    def _base(self, x):
        if not math.isfinite(self.peak):
            return np.full_like(x, self.t0)
        return self.t0 + (x + self.x_half) / self.peak

    def time(self, x):
        """Seconds for a step of ``x`` FLOPs (scalar or array); with ``knots`` (granularity
        "segment", :func:`fit_segments`), the segments between them inside their range."""
        x = np.asarray(x, dtype=np.float64)
        out = self._base(x)
        if self.knots:
            kx = np.array([p[0] for p in self.knots], dtype=np.float64)
            kt = np.array([p[1] for p in self.knots], dtype=np.float64)
            b1 = self._base(kx[-1])
            lo = (below_first_knot(x, kx, kt) if len(kx) > 1
                  else out * (kt[0] / self._base(kx[0])))
            hi = out * (kt[-1] / b1) if b1 > 0 else np.full_like(x, kt[-1])
            out = np.where(x < kx[0], lo, np.where(x > kx[-1], hi, np.interp(x, kx, kt)))
        return float(out) if out.ndim == 0 else out

    def saturation(self, fraction: float = 0.9) -> float:
        """FLOPs at which ``fraction`` of the peak is reached (the paper's threshold point)."""
        return fraction / (1.0 - fraction) * self.x_half

    @classmethod
    def constant(cls, seconds: float) -> "ThroughputCurve":
        return cls(peak=math.inf, x_half=0.0, t0=float(seconds))

    def to_dict(self) -> dict:
        d = {"peak": None if not math.isfinite(self.peak) else self.peak,
             "x_half": self.x_half, "t0": self.t0}
        if self.knots:
            d["knots"] = [list(p) for p in self.knots]
        return d

    @classmethod
    def from_dict(cls, d) -> "ThroughputCurve":
        return cls(peak=math.inf if d["peak"] is None else float(d["peak"]),
                   x_half=float(d["x_half"]), t0=float(d.get("t0", 0.0)),
                   knots=tuple((float(a), float(b)) for a, b in d.get("knots", ())))


def below_first_knot(x, kx, kt):
    """Seconds of a step of ``x`` FLOPs below the smallest profiled point (knots ``kx``,
    ``kt``, at least two): the first segment extended, which is the paper's curve
    ``t = x / P + x_half / P`` through the two smallest points, kept between the time per FLOP
    of the smallest point (throughput only rises with x, so a smaller step is never faster
    per FLOP) and that point's time (a smaller step never takes longer).

    Why not the whole-range curve scaled to meet the first point (the rule before session
    26): its x_half is fitted across algorithm changes and overstates the time of small steps.
    Replayed on the 12 measured points below the smallest profiled k that kept every map
    and were neither host-bound nor disturbed (ResNet-50/101/152, sessions 11-26, H200;
    docs/results/tuner_s26/extrapolation.txt), the extended segment missed by 4.2 % on
    average (at most 11.0 %), the scaled curve by 6.1 % (at most 28.6 %), 7 of 12 within 5 % both
    ways; ResNet-101 at 23 in session 26: -3.9 % against +6.1 %."""
    x = np.asarray(x, dtype=np.float64)
    x0, x1, t0, t1 = kx[0], kx[1], kt[0], kt[1]
    line = t0 + (t1 - t0) / (x1 - x0) * (x - x0)
    return np.minimum(t0, np.maximum(line, t0 * x / x0))


class _KnotTable:
    """:meth:`ThroughputCurve.time` of every step with two or more knots at once (the
    searches over k ask for thousands of k, each of a few hundred steps): the knots padded into
    one matrix, the segment of each x found by a count, the rules below and above the knots as
    in :meth:`ThroughputCurve.time`.  Steps with fewer knots are left alone."""

    def __init__(self, curves, t0, xh, peak, finite):
        rows = [j for j, c in enumerate(curves) if len(c.knots) >= 2]
        self.rows = np.array(rows, dtype=np.intp)
        if not rows:
            return
        m = max(len(curves[j].knots) for j in rows)
        kx = np.full((len(rows), m), np.inf)
        kt = np.zeros((len(rows), m))
        n = np.array([len(curves[j].knots) for j in rows], dtype=np.intp)
        for r, j in enumerate(rows):
            kn = np.asarray(curves[j].knots, dtype=np.float64)
            kx[r, :len(kn)], kt[r, :len(kn)] = kn[:, 0], kn[:, 1]
            kt[r, len(kn):] = kn[-1, 1]
        self.kx, self.kt, self.n = kx, kt, n
        ar = np.arange(len(rows))
        self.x_first, self.t_first = kx[:, 0], kt[:, 0]
        self.slope_first = (kt[:, 1] - kt[:, 0]) / (kx[:, 1] - kx[:, 0])
        self.x_last, self.t_last = kx[ar, n - 1], kt[ar, n - 1]
        self.t0, self.xh = t0[self.rows], xh[self.rows]
        self.peak, self.finite = peak[self.rows], finite[self.rows]
        b_last = self._base(self.x_last)
        self.b_last_pos = b_last > 0
        self.hi_scale = np.where(self.b_last_pos, self.t_last / np.where(self.b_last_pos,
                                                                         b_last, 1.0), 0.0)

    def _base(self, x):
        return np.where(self.finite, self.t0 + (x + self.xh) / self.peak, self.t0)

    def apply(self, x_all, out):
        """Write the knotted steps' times at ``x_all`` (FLOPs of every step) into ``out``."""
        if not len(self.rows):
            return
        x = x_all[self.rows]
        base = self._base(x)
        line = self.t_first + self.slope_first * (x - self.x_first)
        lo = np.minimum(self.t_first, np.maximum(line, self.t_first * x / self.x_first))
        hi = np.where(self.b_last_pos, base * self.hi_scale, self.t_last)
        i = np.clip((self.kx <= x[:, None]).sum(axis=1) - 1, 0, self.n - 2)
        ar = np.arange(len(x))
        xa, xb, ta, tb = self.kx[ar, i], self.kx[ar, i + 1], self.kt[ar, i], self.kt[ar, i + 1]
        mid = ta + (tb - ta) * (x - xa) / (xb - xa)
        out[self.rows] = np.where(x < self.x_first, lo, np.where(x > self.x_last, hi, mid))


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

    has_zero = bool(np.any(x == 0))

    def sse_of(h):
        # the array methods, not np.mean / np.sum: the same reductions without their
        # wrappers' overhead (a per-step model calls this some 60 times per curve)
        if h <= 0 and has_zero:
            return math.inf, 0.0
        r = np.log(x + h) - logt
        logp = float(r.sum()) / r.size
        d = r - logp
        return float((d * d).sum()), logp

    decade = math.log(10)
    lo = math.log(max(xpos.min(), 1.0)) - 12 * decade
    hi = math.log(xpos.max()) + 6 * decade
    grid = np.linspace(lo, hi, 200)
    # sse_of at every grid point in one array operation (a per-step model fits ~1,500 curves)
    r = np.log(x[None, :] + np.exp(grid)[:, None]) - logt[None, :]     # (200, samples)
    errs = np.sum((r - r.mean(axis=1, keepdims=True)) ** 2, axis=1)
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


def fit_segments(flops, times) -> ThroughputCurve:
    """The curve of :func:`fit_curve` with knots at the measured FLOPs (granularity
    "segment"): inside the measured range, the time is the line between the two nearest
    measured points (the mean time at each FLOPs); outside, the fitted curve scaled to meet
    the nearest end point.

    Each segment is the paper's curve (``t = x / P + x_half / P``) through its two points
    alone.  Why: under the CUDNN engine a convolution's time per image is not the rising-
    then-saturating curve of one kernel.  cuDNN chooses the fastest algorithm whose workspace
    fits the limit, and those workspaces grow with the minibatch, so past some k a slower
    algorithm runs (H200, 2026-11-22, ResNet-34 at a 768 MiB limit: backward 236 us per image
    at k = 306, 494 at 1226; AlexNet: 104 us per image at k = 146, 192 at 1148 and above).
    One curve through all the points then misses every one of them, by -17 % (AlexNet) and
    +22 % (ResNet-34) at k* in the same runs; segments hold each profiled point exactly.

    A point whose time per FLOP is more than :data:`SPIKE` times that of both neighbours (an
    end point: of its one neighbour) is a disturbance, not a kernel: it is dropped (ResNet-152's
    conv1 forward at k = 99, 650 us per image where k = 49 and 198 took 18 and 14, one sample).
    An algorithm change is a step, which no point exceeds on both sides.
    """
    x = np.asarray(flops, dtype=np.float64).ravel()
    t = np.asarray(times, dtype=np.float64).ravel()
    base = fit_curve(x, t)
    ok = np.isfinite(x) & np.isfinite(t) & (t > 0) & (x > 0)
    xs = np.unique(x[ok])
    if len(xs) < 2:
        return base
    ts = np.array([np.mean(t[ok][x[ok] == v]) for v in xs])
    rate = ts / xs
    keep = np.ones(len(xs), dtype=bool)
    for i in range(len(xs)):
        nb = [rate[j] for j in (i - 1, i + 1) if 0 <= j < len(xs)]
        keep[i] = not all(rate[i] > SPIKE * r for r in nb)
    if keep.sum() < 2:
        return base
    knots = tuple((float(a), float(b)) for a, b in zip(xs[keep], ts[keep]))
    return ThroughputCurve(peak=base.peak, x_half=base.x_half, t0=base.t0, knots=knots)


# fit_segments: a profiled point this many times slower per FLOP than its neighbours is dropped
SPIKE = 1.5


# ------------------------------------------------------- iteration overhead
# a gap in which a transfer ended within this many seconds may be a wait for that transfer
_STALL_TOL = 1e-6


def _iterations_at(profile, k: int) -> list:
    """The compute samples of each measured iteration at k, each sorted by step: samples are
    stored in the order they were recorded, and a new iteration starts where the step index
    does not grow."""
    runs, cur, last = [], [], None
    for c in profile.compute:
        if c.k != k:
            continue
        if last is not None and c.step <= last:
            runs.append(cur)
            cur = []
        cur.append(c)
        last = c.step
    if cur:
        runs.append(cur)
    return [sorted(r, key=lambda c: c.step) for r in runs]


def overhead_samples(profile) -> list:
    """Per profiled k, the time of an iteration outside its layer steps, averaged over the
    measured iterations at k: a list of dicts with

    k; boundaries: steps - 1; clean: the boundaries in whose gap no transfer ended (a gap
    that a transfer ended in may be a wait for it, under the naive plan of the profile);
    gap: the mean clean gap (the smallest gap when none is clean), seconds; gaps: ``gap *
    boundaries``; head: from the pass's start to the first step's start, plus the solver
    step's head where measured; tail: from the last step's end to the pass's end, plus the
    solver step's tail where measured (the solver update); update: whether solver steps were
    measured at k; seconds: ``head + gaps + tail``; compute: the sum of the step times; host:
    the sum of the host's times to issue the steps (None where the profile has none; not in
    O(k): the profile's device waits for prefetches and the host runs ahead, so these times
    only bound the iteration from below where the host cannot run ahead).
    """
    ends_at = {}
    for t in profile.transfers:
        ends_at.setdefault(t.k, []).append(t.start + t.time)
    out = []
    for k in profile.ks:
        runs = [r for r in _iterations_at(profile, k) if r]
        if not runs:
            continue
        ends = np.sort(np.asarray(ends_at.get(k, []), dtype=np.float64))
        iters = [s for kk, s in profile.iterations if kk == k]
        solver = [x for x in profile.solver_steps if x.k == k]
        rows = []
        for i, r in enumerate(runs):
            start = np.array([c.start for c in r], dtype=np.float64)
            end = start + np.array([c.time for c in r], dtype=np.float64)
            gaps = np.maximum(start[1:] - end[:-1], 0.0)
            lo = np.searchsorted(ends, end[:-1] - _STALL_TOL, side="left")
            hi = np.searchsorted(ends, start[1:] + _STALL_TOL, side="right")
            clean = gaps[hi == lo]
            if len(clean):
                gap = float(clean.mean())
            else:               # every gap may be a wait: the smallest is the closest bound
                gap = float(gaps.min()) if len(gaps) else 0.0
            head = float(max(start[0], 0.0)) if len(start) else 0.0
            tail = float(max(iters[i] - end[-1], 0.0)) if i < len(iters) else 0.0
            if i < len(solver):
                head += max(solver[i].head, 0.0)
                tail += max(solver[i].tail, 0.0)
            host = (sum(c.host for c in r) if all(c.host is not None for c in r) else None)
            rows.append((gap, len(gaps), len(clean), head, tail, sum(c.time for c in r),
                         host))
        gap = float(np.mean([x[0] for x in rows]))
        n = rows[0][1]
        head = float(np.mean([x[3] for x in rows]))
        tail = float(np.mean([x[4] for x in rows]))
        hosts = [x[6] for x in rows]
        out.append({"k": k, "boundaries": n, "clean": int(np.mean([x[2] for x in rows])),
                    "gap": gap, "gaps": gap * n, "head": head, "tail": tail,
                    "update": bool(solver), "seconds": head + gap * n + tail,
                    "compute": float(np.mean([x[5] for x in rows])),
                    "host": None if None in hosts else float(np.mean(hosts))})
    return out


@dataclass(frozen=True)
class IterationOverhead:
    """``O(k) = a + b * k``: seconds per iteration outside the layer steps (module doc).

    a: seconds per iteration; b: seconds per image (0 unless the profile shows growth with
    k).  samples: ``((k, seconds), ...)``, what it was fitted to.  The tuner adds O(k) to the
    predicted iteration (the timeline of Algorithm 1 is not changed: transfers are not assumed
    to hide in these gaps, which keeps constraint (6) on the safe side)."""
    a: float = 0.0
    b: float = 0.0
    samples: tuple = ()
    tail: float = 0.0       # seconds of it the device itself spends: the solver update

    def __call__(self, k) -> float:
        return self.a + self.b * float(k)

    @classmethod
    def fit(cls, ks, seconds) -> "IterationOverhead":
        """Least squares ``a + b k`` on the points, with ``a, b >= 0``: a negative slope gives
        the mean as a constant, a negative intercept the line through the origin."""
        k = np.asarray(ks, dtype=np.float64)
        y = np.asarray(seconds, dtype=np.float64)
        samples = tuple((int(a), float(b)) for a, b in zip(k, y))
        if len(k) == 0:
            return cls(samples=samples)
        if len(k) == 1 or np.ptp(k) == 0:
            return cls(a=max(float(y.mean()), 0.0), samples=samples)
        b, a = (float(v) for v in np.polyfit(k, y, 1))
        if b < 0:
            return cls(a=max(float(y.mean()), 0.0), samples=samples)
        if a < 0:
            return cls(a=0.0, b=max(float(k @ y / (k @ k)), 0.0), samples=samples)
        return cls(a=a, b=b, samples=samples)

    @classmethod
    def from_profile(cls, profile) -> "IterationOverhead":
        """Fit to :func:`overhead_samples` of a profile (each profiled k one point)."""
        rows = overhead_samples(profile)
        fit = cls.fit([r["k"] for r in rows], [r["seconds"] for r in rows])
        tail = float(np.mean([r["tail"] for r in rows])) if rows else 0.0
        return dataclasses.replace(fit, tail=tail)

    def to_dict(self) -> dict:
        return {"a": self.a, "b": self.b, "samples": [list(x) for x in self.samples],
                "tail": self.tail}

    @classmethod
    def from_dict(cls, d) -> "IterationOverhead":
        return cls(a=float(d.get("a", 0.0)), b=float(d.get("b", 0.0)),
                   samples=tuple((int(k), float(t)) for k, t in d.get("samples", [])),
                   tail=float(d.get("tail", 0.0)))


# ------------------------------------------------------------- host issue
HOST_METHODS = ("issue", "line", "min")


def _envelope(ks, h) -> tuple:
    """The line ``a + b k`` under every sample ``(ks[i], h[i])`` with ``a, b >= 0`` and the
    largest sum over the samples (equivalently, the least total distance above it: an L1 fit
    from below).  A linear programme in (a, b) whose optimum is a vertex: the line through two
    samples, the horizontal line through the lowest sample, or the line from the origin through
    the sample of least ``h / k``; the candidates are enumerated."""
    k = np.asarray(ks, dtype=np.float64)
    y = np.asarray(h, dtype=np.float64)
    tol = 1e-9 * max(float(np.abs(y).max(initial=0.0)), 1e-300)
    cands = [(float(y.min()), 0.0), (0.0, float(np.min(y / k)))]
    for i in range(len(k)):
        for j in range(i + 1, len(k)):
            if k[j] != k[i]:
                b = float((y[j] - y[i]) / (k[j] - k[i]))
                cands.append((float(y[i] - b * k[i]), b))
    best, best_v = cands[0], -math.inf
    kbar = float(k.mean())
    for a, b in cands:
        if a < -tol or b < 0 or np.any(a + b * k > y + tol):
            continue
        v = a + b * kbar
        if v > best_v:
            best, best_v = (max(a, 0.0), b), v
    return best


@dataclass(frozen=True)
class HostModel:
    """The host's time to issue each step, ``h_j(k) = a_j + b_j k`` seconds (not in the paper).

    CuPy launches are asynchronous: the host (Python, the layer's code, the kernel launches)
    runs ahead of the device, and an iteration takes the device's time only while the host
    keeps ahead.  When the host's own issue time exceeds the device's, the iteration is
    host-bound and the device model (eq. 2 plus stalls) under-predicts it: ResNet-152 on the
    H200 measured 147.8 ms at k = 16 and 152.8 ms at k = 28 under the dynamic plan (2026-11-21)
    where eq. (2) plus stalls and O(k) predicted 94.3 and 134.9 ms.  :meth:`ComputeModel.iteration`
    takes the larger of the device's and the host's bounds (:func:`iteration_time`).

    Samples: :attr:`swap.profiler.ComputeSample.host`, ``perf_counter`` around each step's
    ``forward_layer`` / ``backward_layer``.  They are not the host's own cost under the
    profile's naive plan: its iterations are transfer-bound (ResNet-152: 549 ms per iteration
    at k = 63 for 238 ms of compute), the device lags the host by hundreds of launches, and a
    launch into the full queue blocks until the device retires one, so a step's host time
    holds waits for kernels whose work grows with k; some steps also wait for the device
    themselves (a chunked convolution's column-chunk loop: ``conv1`` forward takes the host as
    long as the device at every profiled k).  Those waits only ever add.  Two estimates
    (``method``):

    * ``"line"`` (default): per step, the line ``a_j + b_j k``, ``a_j, b_j >= 0``, under every
      sample, with the largest sum over them (:func:`_envelope`: an L1 fit from below, not a
      least-squares fit through the samples, since the contamination is one-sided).  ``a_j``
      is the k-independent cost (Python, launches); ``b_j`` holds what grows with k: the
      column-chunk loop's launches (``ceil(k / chunk)``) and the waits, so the line is an
      upper estimate inside the profiled range and, below it, tends to ``a_j``.
    * ``"min"``: per step the smallest sample over the profiled k, as a constant ``a_j``
      (``b_j = 0``): the estimate if the host's cost did not depend on k.

    Checked against the data (``scripts/model_overhead.py``, docs/results/model_overhead.md):
    on the ResNet-152 profile with host times (2026-11-21, k = 63 ... 520) ``"min"`` sums to
    207.6 ms per iteration, more than the whole iterations measured at k = 16 (117.5 ms
    without swapping, 147.8 ms under the dynamic plan): even the profile's smallest k is
    transfer-bound and the minimum is not a floor.  ``"line"`` sums to 107.5 ms at k = 16
    (85.3 ms + 1.39 ms per image), 124.2 ms at k = 28, 164.4 ms at k = 57.

    * ``"issue"`` (the default where the profile has them): from the host samples of
      :func:`swap.profiler.profile_host_issue`, taken at small k (1/16, 1/8 and 1/4 of the
      smallest profiled k) under the plan "none", where the device finishes each step before
      the host has issued the next and no launch waits: a constant, the per-step medians at
      the k whose steps sum to the least.  A line through those k was tried first and
      dropped: its slope, multiplied up to k*, turned one slow stretch of the host into
      1.9 ms per image (ResNet-50 on the H200, 2026-11-22: 33, 53 and 59 ms at k = 4, 8, 16,
      where an earlier run measured 29.6, 29.7 and 31.2), and the least sum is the one least
      disturbed.  The work that does grow with k (one launch per column chunk of a chunked
      convolution) is small beside the device's at the k where it would matter.

    What it does not hold: the host's work between the steps (the executor's offload,
    prefetch, allocate and release ops, the loop over them) is not timed by the profiler, so
    neither a per-step executor cost nor the difference between strategies is modelled: the
    host floor of ``dynamic`` and of ``none`` at the same k is the same (O(k)'s mean gap
    between steps, a device-side time, stands for the host's time between steps).  On the CPU
    the host time is the step itself (NumPy is synchronous): no separate bound, so CPU and
    synthetic profiles get no host model.

    * ``whole`` (with "issue", from profiles of 2026-11-28 on): the host's time for a whole
      iteration at the same small k, timed without the per-step hooks (median per k; the
      least over the k is kept, at ``whole_k``).  It holds what ``H + O`` estimates from two
      parts, the hooked steps and O(k), a device-side time standing for the host's work
      between the steps, and is measured directly.  Where it has it,
      :meth:`ComputeModel.host_at` takes the host's share of an iteration as
      ``whole - O(whole_k)``, so that the host bound ``H + O`` is the measured iteration; the
      per-step ``a_j`` stay for inspection.  Measured on ResNet-152 (CUDNN, H200,
      2026-11-28): at k = 16, host-bound, 78.4 ms against 75.0 predicted from ``whole``
      (-4.4 %) and 77.8 from the hooked steps plus O (-0.8 %) in one process; in another
      process, whose hooked steps at k = 3-9 ran on a slow host (110.9-161.3 ms), the hooked
      model had said 121.9 ms for a measured 72.8 (+67 %).  Both estimates move with the
      host's speed; whichever is used, the least disturbed k is taken.

    a, b: per step (indexed like the profile's steps), seconds and seconds per image;
    method: how they were fitted; ks: the profiled k; whole: seconds of a whole iteration on
    the host without timing hooks (0: not measured), at minibatch whole_k.
    """
    a: tuple
    b: tuple
    method: str = "line"
    ks: tuple = ()
    whole: float = 0.0
    whole_k: int = 0

    def step_times(self, k) -> np.ndarray:
        """``h_j(k)`` of every step."""
        return np.asarray(self.a, dtype=np.float64) + np.asarray(self.b, dtype=np.float64) * k

    @property
    def intercept(self) -> float:
        """``sum_j a_j``: seconds per iteration that do not depend on k."""
        return float(np.sum(self.a))

    @property
    def slope(self) -> float:
        """``sum_j b_j``: seconds per image."""
        return float(np.sum(self.b))

    def __call__(self, k) -> float:
        """``sum_j h_j(k)``: the host's issue time of the steps of one iteration at k."""
        return self.intercept + self.slope * float(k)

    @classmethod
    def fit(cls, samples, method: str = "line", ks=()) -> "HostModel":
        """From ``samples[j] = [(k, seconds), ...]`` per step (class doc for ``method``)."""
        if method == "issue":
            return cls.fit_issue(samples, ks)
        if method not in HOST_METHODS:
            raise ValueError(f"host model method {method!r}: use one of "
                             f"{', '.join(HOST_METHODS)}")
        a, b = [], []
        for j, pts in enumerate(samples):
            if not pts:
                raise ValueError(f"host model: step {j} has no sample")
            k = np.array([p[0] for p in pts], dtype=np.float64)
            h = np.array([p[1] for p in pts], dtype=np.float64)
            if method == "min" or np.ptp(k) == 0:
                aj, bj = float(h.min()), 0.0
            else:
                aj, bj = _envelope(k, h)
            a.append(aj)
            b.append(bj)
        return cls(a=tuple(a), b=tuple(b), method=method, ks=tuple(int(x) for x in ks))

    @classmethod
    def fit_issue(cls, samples, ks=()) -> "HostModel":
        """Method "issue" (class doc) from ``samples[j] = [(k, seconds), ...]`` per step,
        several iterations per k: per k the median of each step over the iterations; the k
        whose steps sum to the least gives every ``a_j``; ``b_j = 0``."""
        if any(not pts for pts in samples):
            j = next(i for i, pts in enumerate(samples) if not pts)
            raise ValueError(f"host model: step {j} has no sample")
        common = set.intersection(*({int(k) for k, _ in pts} for pts in samples))
        if not common:
            raise ValueError("host model: no minibatch has a sample of every step")
        best, best_sum = None, math.inf
        for k in sorted(common):
            med = [float(np.median([h for kk, h in pts if int(kk) == k])) for pts in samples]
            if sum(med) < best_sum:
                best, best_sum = med, sum(med)
        return cls(a=tuple(best), b=(0.0,) * len(best), method="issue",
                   ks=tuple(int(x) for x in ks))

    @classmethod
    def from_profile(cls, profile, method: str = "auto") -> "HostModel | None":
        """Fit to a profile's host times; None where it has none (profiles from before
        ``ComputeSample.host``, a step never sampled) or was taken on the CPU or from a model
        (class doc).  ``method`` "auto": "issue" where the profile has host samples
        (:attr:`swap.profiler.Profile.host_samples`), else "line"."""
        if profile.mode != "GPU" or not profile.compute:
            return None
        own = tuple(getattr(profile, "host_samples", ()) or ())
        if method == "auto":
            method = "issue" if own else "line"
        if method == "issue":
            if not own:
                raise ValueError(f"host model method 'issue': the profile of {profile.net!r} "
                                 f"has no host samples (profile again, or use 'line')")
            samples = [[] for _ in profile.steps]
            for c in own:
                samples[c.step].append((c.k, c.host))
            if any(not s for s in samples):
                return None
            hm = cls.fit_issue(samples, ks=sorted({c.k for c in own}))
            wholes = [(float(x["whole"]), int(x["k"])) for x in
                      (getattr(profile, "meta", None) or {}).get("host_sums", ())
                      if x.get("whole")]
            if wholes:
                whole, whole_k = min(wholes)
                hm = dataclasses.replace(hm, whole=whole, whole_k=whole_k)
            return hm
        if any(c.host is None for c in profile.compute):
            return None
        samples = [[] for _ in profile.steps]
        for c in profile.compute:
            samples[c.step].append((c.k, c.host))
        if any(not s for s in samples):
            return None
        return cls.fit(samples, method, ks=profile.ks)

    def to_dict(self) -> dict:
        return {"method": self.method, "ks": list(self.ks), "a": list(self.a),
                "b": list(self.b), "whole": self.whole, "whole_k": self.whole_k}

    @classmethod
    def from_dict(cls, d) -> "HostModel":
        return cls(a=tuple(float(x) for x in d["a"]), b=tuple(float(x) for x in d["b"]),
                   method=d.get("method", "line"), ks=tuple(int(k) for k in d.get("ks", ())),
                   whole=float(d.get("whole", 0.0)), whole_k=int(d.get("whole_k", 0)))


def iteration_time(device: float, host: float | None, overhead: float,
                   tail: float = 0.0) -> float:
    """One iteration from its parts (:meth:`ComputeModel.iteration`, the tuner's decision):
    ``max(device + tail, host + overhead)``; without a host model (``host`` None or 0)
    ``device + overhead``, the model of before host times were profiled.

    device: the compute stream's time for the steps; host: the host's time to issue them,
    H(k); overhead: O(k), the rest of the iteration as the profile saw it (the head before the
    first step, the gaps between steps, the solver update: ``tail``, the device's own part).

    The two bounds: the device cannot end the iteration before it has run the steps and the
    solver update, and it cannot end it before the host has issued the steps and what lies
    between them.  The profile's head and gaps are host time seen on the device (each profiled
    iteration starts on an idle device; between the steps the device waits for the next
    launch): where the host runs ahead of a busy device they overlap its work and cost
    nothing.  Measured on the H200 (2026-11-22, docs/RESULTS.md, session 8): ResNet-50 at
    k = 107 took 136.5 ms with 136.5 ms of predicted device steps and an O(k) of 5.6 ms
    (``max(device, H) + O(k)`` said +4.1 %, +9.7 % and +13.2 % at k = 107, 53, 35); ResNet-152
    at k = 16, host-bound, took 92.8 ms against H + O = 90.6 ms.  Where host and device take
    turns within one iteration (some steps host-bound, others not) both bounds are low; a per
    step form would need the launch queue's depth."""
    if not host:
        return device + overhead
    return max(device + tail, host + overhead)


# ------------------------------------------------------------ compute model
# a step sheds at most this share of its eager time as a graph launch (ComputeModel.gap)
GAP_SHARE = 0.9
GRANULARITIES = ("type", "step", "segment")
# the tuner's curves (``swap.tuner.profile_models``, ``train_dynamic``, ``minicaffe plan``):
# per step since the H200 plans of 2026-11-21 measured it (module doc), in segments between
# the profiled points since the CUDNN engine's H200 runs of 2026-11-22 (fit_segments)
TUNER_GRANULARITY = "segment"


def _key(step, granularity: str) -> tuple:
    if granularity in ("step", "segment"):
        return ("step", step.name, step.phase)
    return (step.type, step.phase)


@dataclass(frozen=True)
class ComputeModel:
    """Per-step compute time at any minibatch: eq. (1) and (2).

    curves: ``((key, ThroughputCurve), ...)``; keys are ``(type, phase)`` (granularity "type",
    the paper's) or ``("step", layer name, phase)`` (granularity "step"), plus the fallbacks
    ``("*", phase)`` and ``("*", "*")``.  slowdown: a factor >= 1 on every time (the paper's
    "reduce the denominator FLOPS(*) slightly"; 1 by default, since the fitted x_half already
    holds the per-step overhead).  overhead: the time of an iteration outside its steps,
    :class:`IterationOverhead` (None: 0, the paper's model); not part of eq. (2)'s ``t_iter``.
    host: the host's time to issue the steps, :class:`HostModel` (None: the host is assumed
    to keep ahead of the device, the model before host times were profiled);
    :meth:`iteration` combines the three.  gap: seconds taken off every step's time (at most
    :data:`GAP_SHARE` of it), the host's gaps in and between the kernels of an eagerly
    profiled step that a CUDA graph launch does not have (:func:`swap.tuner.graph_model`).
    """
    curves: tuple
    granularity: str = "type"
    slowdown: float = 1.0
    overhead: IterationOverhead | None = None
    host: HostModel | None = None
    gap: float = 0.0        # seconds every step sheds as a CUDA graph launch (graph_model)
    # ((k, gap), ...) by k: the gap per step where it was calibrated at more than one k,
    # linear in k between them and the end value beyond (gap_at; `gap` stands where k is
    # not known)
    gap_points: tuple = ()
    # chunked convolutions' steps, priced per call (module doc): ((layer, phase, limit,
    # bytes per image, multiple, FLOPs per image), ...)
    chunks: tuple = ()
    # cuDNN convolutions' steps priced by cuDNN's own search times (module doc): ((layer,
    # phase, FLOPs per image, ((k, searched seconds), ...), ((k, measured / searched), ...)),
    # ...); probe: ``(layer, phase, k) -> seconds or None``, cuDNN's search at a k the table
    # lacks (swap.profiler.search_probe; not saved)
    searched: tuple = ()
    probe: object = field(default=None, repr=False, compare=False)
    _index: dict = field(default=None, init=False, repr=False, compare=False)
    _chunk_index: dict = field(default=None, init=False, repr=False, compare=False)
    _search_index: dict = field(default=None, init=False, repr=False, compare=False)

    def __post_init__(self):
        object.__setattr__(self, "_index", dict(self.curves))
        object.__setattr__(self, "_chunk_index",
                           {(c[0], c[1]): tuple(c[2:]) for c in self.chunks})
        object.__setattr__(self, "_search_index", {
            (e[0], e[1]): (float(e[2]), {int(k): v for k, v in e[3]},
                           np.array([float(k) for k, _ in e[4]]),
                           np.array([float(r) for _, r in e[4]]))
            for e in self.searched})

    def searched_time(self, key, k: int) -> float | None:
        """Seconds of the step ``key`` = (layer, phase) at minibatch ``k`` priced by cuDNN's
        search (the searched seconds at ``k`` times the measured-to-searched ratio, linear in k
        between the profiled ks, the end ratio beyond them), or None where the step has no such
        pricing or no searched time at ``k`` (asked of :attr:`probe` once, then remembered)."""
        e = self._search_index.get(key) if self._search_index else None
        if e is None or k < 1:
            return None
        _, table, kr, rr = e
        if k not in table:
            table[k] = self.probe(key[0], key[1], k) if self.probe is not None else None
        t = table[k]
        if t is None or not t > 0:
            return None
        return float(np.interp(k, kr, rr)) * float(t)

    def _searched_at_flops(self, step, flops: float) -> float | None:
        e = self._search_index.get((step.name, step.phase)) if self._search_index else None
        if e is None:
            return None
        return self.searched_time((step.name, step.phase), int(round(flops / e[0])))

    def calls(self, step, flops: float) -> int:
        """How many cuDNN calls ``step`` makes at ``flops`` (1 but for a chunked convolution's
        steps: its rule at the minibatch those FLOPs are, ``flops / FLOPs per image``)."""
        rule = self._chunk_index.get((step.name, step.phase)) if self._chunk_index else None
        if rule is None:
            return 1
        from minicaffe.cudnn.ops import chunk_count
        limit, per, multiple, f1 = rule
        return chunk_count(int(round(flops / f1)), limit, per, multiple)

    def curve(self, step) -> ThroughputCurve:
        """The curve of a :class:`swap.gmap.Step` (with the fallbacks of the module doc)."""
        idx = self._index
        for key in (_key(step, self.granularity), (step.type, step.phase), ("*", step.phase),
                    ("*", "*")):
            if key in idx:
                return idx[key]
        raise KeyError(f"the compute model has no curve for {step} (type {step.type}) and no "
                       "fallback")

    def gap_at(self, k: int | None = None) -> float:
        """Seconds each step sheds as a CUDA graph launch at minibatch ``k``: from
        :attr:`gap_points` where there are any (linear in k between the calibrated ks, the
        end values beyond them), else :attr:`gap` (also where ``k`` is None)."""
        if not self.gap_points or k is None:
            return self.gap
        ks, gaps = zip(*self.gap_points)
        return float(np.interp(float(k), ks, gaps))

    def step_time(self, step, flops: float | None = None, k: int | None = None) -> float:
        """t_j: seconds of one step at ``flops`` (default: the step's own at its GMAP's k);
        ``k``: the minibatch those FLOPs are, for a graph gap that depends on it
        (:meth:`gap_at`)."""
        x = step.flops if flops is None else flops
        t = self._searched_at_flops(step, x) if self._search_index else None
        if t is None:
            n = self.calls(step, x)
            t = n * float(self.curve(step).time(x / n))
        t *= self.slowdown
        gap = self.gap_at(k)
        return t - min(gap, GAP_SHARE * t) if gap > 0 else t

    def step_times(self, gmap: GMAP) -> np.ndarray:
        """``t_j(k)`` of every step of ``gmap`` at ``gmap.k`` (eq. 1 is in ``GMAP.at``)."""
        return np.array([self.step_time(s, k=gmap.k) for s in gmap.steps], dtype=np.float64)

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
        table = _KnotTable(curves, t0, xh, safe, finite)
        odd = [(j, c) for j, c in enumerate(curves) if 0 < len(c.knots) < 2]
        k0 = gmap.k
        slow = self.slowdown
        gap_at = self.gap_at
        # the chunked convolutions' steps: their calls at k from their rules (module doc)
        from minicaffe.cudnn.ops import chunk_images
        rules = [(j, self._chunk_index.get((s.name, s.phase))) for j, s in enumerate(gmap.steps)]
        rules = [(j, r) for j, r in rules if r is not None and flops[j] > 0]
        cj = np.array([j for j, _ in rules], dtype=np.int64)
        c_img = np.array([flops[j] / r[3] for j, r in rules], dtype=np.float64)  # images at k0
        c_lim = np.array([r[0] for _, r in rules], dtype=np.float64)
        c_per = np.array([r[1] for _, r in rules], dtype=np.float64)
        c_most = np.array([chunk_images(r[0], r[1], r[2]) for _, r in rules], dtype=np.float64)
        # the steps priced by cuDNN's search: (index, key, images at k0)
        searched = [(j, (s.name, s.phase), flops[j] / self._search_index[(s.name, s.phase)][0])
                    for j, s in enumerate(gmap.steps)
                    if self._search_index and (s.name, s.phase) in self._search_index
                    and flops[j] > 0]

        def times(k: int) -> np.ndarray:
            x = flops * (k / k0)
            n = None
            if len(cj):
                images = np.rint(c_img * (k / k0))        # chunk_count, vectorized
                n = np.where((c_per == 0) | (images * c_per <= c_lim), 1.0,
                             np.ceil(images / c_most))
                x = x.copy()
                x[cj] /= n
            out = t0 + np.where(finite, (x + xh) / safe, 0.0)
            table.apply(x, out)
            for j, c in odd:
                out[j] = c.time(x[j])
            if n is not None:
                out[cj] *= n
            for j, key, img in searched:
                t = self.searched_time(key, int(round(img * (k / k0))))
                if t is not None:
                    out[j] = t
            out = slow * out
            gap = gap_at(k)
            if gap > 0:
                out = out - np.minimum(gap, GAP_SHARE * out)
            return out
        return times

    def t_iter(self, gmap: GMAP, k: int | None = None) -> float:
        """eq. (2): the stall-free iteration time at ``k`` (default ``gmap.k``), the layer
        steps alone (:meth:`overhead_at` is the rest of the iteration)."""
        g = gmap if k is None else gmap.at(k)
        return float(self.step_times(g).sum())

    def overhead_at(self, k: int) -> float:
        """O(k): seconds of an iteration at ``k`` outside its layer steps (0 without a fit)."""
        return 0.0 if self.overhead is None else float(self.overhead(k))

    def host_at(self, k: int) -> float:
        """``sum_j h_j(k)``: the host's seconds to issue the steps at ``k`` (0 without a host
        model); where the host model has a whole iteration timed without hooks
        (:class:`HostModel`, ``whole``), that less O at its k, at least 0."""
        if self.host is None:
            return 0.0
        if self.host.whole > 0.0:
            return max(0.0, self.host.whole - self.overhead_at(self.host.whole_k))
        return float(self.host(k))

    def with_host_whole(self, whole: float) -> "ComputeModel":
        """This model with its host bound's whole iteration timed anew (``whole`` seconds at
        the same minibatch, :func:`swap.profiler.host_whole_now`): the prediction with the
        host as fast as it is now.  The host's speed drifts within a process (ResNet-152 on an
        H200, session 25: 67-96 ms per small iteration while profiling, 117-123 ms minutes
        later)."""
        if self.host is None or self.host.whole <= 0.0:
            raise ValueError("the model has no whole-iteration host bound to time anew")
        return dataclasses.replace(self, host=dataclasses.replace(self.host, whole=float(whole)))

    def iteration(self, device: float, k: int) -> float:
        """The predicted iteration at ``k`` from ``device``, the compute stream's time for the
        steps (eq. 2, or Algorithm 1's timeline with its stalls): :func:`iteration_time` of
        it, the host's issue time ``sum_j h_j(k)``, O(k) and O's device tail."""
        tail = self.overhead.tail if self.overhead is not None else 0.0
        return iteration_time(device, self.host_at(k) if self.host is not None else None,
                              self.overhead_at(k), tail)

    # ---- construction
    @classmethod
    def uniform(cls, curve: ThroughputCurve, slowdown: float = 1.0) -> "ComputeModel":
        """One curve for every layer type (synthetic device models)."""
        return cls(curves=((("*", "*"), curve),), slowdown=slowdown)

    @classmethod
    def from_profile(cls, profile, granularity: str = "type",
                     overhead: bool = True, host: bool | str = True) -> "ComputeModel":
        """Fit the curves of a :class:`swap.profiler.Profile` (per type and phase, or per step)
        and, with ``overhead``, the time outside the steps
        (:meth:`IterationOverhead.from_profile`), and with ``host`` (True: the default method,
        or a method of :class:`HostModel`) the host's issue times where the profile has them
        (:meth:`HostModel.from_profile`)."""
        if granularity not in GRANULARITIES:
            raise ValueError(f"granularity must be one of {', '.join(GRANULARITIES)}, got "
                             f"{granularity!r}")
        groups: dict = {}
        steps = {s.step: s for s in profile.steps}
        slow = copy_slowdown(profile)
        samples = (profile.compute if slow is None else
                   without_copies(profile, slow, copy_step_cost(profile)))
        chunks = chunk_rules_of(profile)
        priced = cls(curves=(), chunks=chunks)      # only its calls() (the rules)
        for c in samples:
            s = steps[c.step]
            n = priced.calls(s, c.flops) if chunks else 1
            for key in (_key(s, granularity), (s.type, s.phase), ("*", s.phase), ("*", "*")):
                groups.setdefault(key, ([], []))
                groups[key][0].append(c.flops / n)
                groups[key][1].append(c.time / n)
        if not groups:
            raise ValueError(f"profile of {profile.net!r} has no compute samples")
        def fit(key, x, t):
            # segments for the steps' own curves; the fallbacks stay curves
            if granularity == "segment" and key[0] == "step":
                return fit_segments(x, t)
            return fit_curve(x, t)
        curves = tuple((key, fit(key, x, t)) for key, (x, t) in sorted(groups.items()))
        hm = None
        if host:
            hm = HostModel.from_profile(profile, "auto" if host is True else host)
        import os
        searched = (searched_of(profile, samples)
                    if granularity != "type" and os.environ.get(ENV_SEARCHED, "1") != "0"
                    else ())
        return cls(curves=curves, granularity=granularity,
                   overhead=IterationOverhead.from_profile(profile) if overhead else None,
                   host=hm, chunks=chunks, searched=searched,
                   probe=getattr(profile, "search_probe", None) if searched else None)

    def to_dict(self) -> dict:
        return {"granularity": self.granularity, "slowdown": self.slowdown,
                "curves": [{"key": list(k), **c.to_dict()} for k, c in self.curves],
                "overhead": None if self.overhead is None else self.overhead.to_dict(),
                "host": None if self.host is None else self.host.to_dict(),
                "gap": self.gap, "gap_points": [list(p) for p in self.gap_points],
                "chunks": [list(c) for c in self.chunks],
                "searched": [[e[0], e[1], e[2],
                              [[k, v] for k, v in sorted(self._search_index[(e[0], e[1])][1]
                                                         .items()) if v is not None],
                              [list(p) for p in e[4]]] for e in self.searched]}

    @classmethod
    def from_dict(cls, d) -> "ComputeModel":
        """The inverse of :meth:`to_dict`; a dict without "overhead" or "host" (written before
        they existed) gives none, the old model."""
        oh = d.get("overhead")
        hm = d.get("host")
        return cls(curves=tuple((tuple(c["key"]), ThroughputCurve.from_dict(c))
                                for c in d["curves"]),
                   granularity=d.get("granularity", "type"), slowdown=d.get("slowdown", 1.0),
                   overhead=None if oh is None else IterationOverhead.from_dict(oh),
                   host=None if hm is None else HostModel.from_dict(hm),
                   gap=float(d.get("gap", 0.0)),
                   gap_points=tuple((int(k), float(g)) for k, g in d.get("gap_points", ())),
                   chunks=tuple(tuple(c) for c in d.get("chunks", ())),
                   searched=tuple((e[0], e[1], float(e[2]),
                                   tuple((int(k), float(v)) for k, v in e[3]),
                                   tuple((int(k), float(r)) for k, r in e[4]))
                                  for e in d.get("searched", ())))


def searched_of(profile, samples=None) -> tuple:
    """:class:`ComputeModel`'s ``searched`` from a profile's ``meta["searched"]`` (``{layer:
    [[k, forward seconds, backward seconds], ...]}``, cuDNN's search times of the algorithms
    its convolutions run at k, :func:`swap.profiler.search_times_now`): one entry per step
    of such a layer with FLOPs and a searched time at some k it was measured at (``samples``,
    default the profile's compute samples), with the measured-to-searched ratio at each
    such k (mean of that k's samples).  () where the profile has no such record."""
    rec = (getattr(profile, "meta", None) or {}).get("searched") or {}
    if not rec:
        return ()
    samples = profile.compute if samples is None else samples
    by_step = {s.step: s for s in profile.steps}
    per_image: dict = {}
    measured: dict = {}
    for c in samples:
        s = by_step.get(c.step)
        if s is None or s.name not in rec or c.flops <= 0 or c.k <= 0:
            continue
        per_image.setdefault((s.name, s.phase), []).append(c.flops / c.k)
        measured.setdefault((s.name, s.phase), {}).setdefault(c.k, []).append(c.time)
    out = []
    for (name, phase), f in sorted(per_image.items()):
        col = 1 if phase == "forward" else 2
        table = {int(row[0]): float(row[col]) for row in rec[name]
                 if len(row) > col and row[col] is not None and row[col] > 0}
        m = {k: float(np.mean(t)) for k, t in measured[(name, phase)].items() if k in table}
        if _searched_wins(m, table):
            ratios = tuple((k, m[k] / table[k]) for k in sorted(m))
            out.append((name, phase, float(np.median(f)), tuple(sorted(table.items())), ratios))
    return tuple(out)


def _searched_wins(measured: dict, searched: dict) -> bool:
    """Whether the search predicts a step's profiled points clearly better than the line
    between their neighbours: each inner profiled k held out and predicted from the two beside
    it, as the ratio between theirs times the search at k, or as the line between their times
    (what the segments do); the search must bring the summed absolute error under
    :data:`SEARCH_MARGIN` of the line's.  False with no inner k.

    Why: the search times each algorithm once, so a small convolution's time carries the
    search's noise (GoogLeNet's 1x1 convolutions on the H200, session 39: 1.8 to 2.9 us per
    image from one k to the next, the step in place steadier), and the ratio passes it on;
    a large one's is exact.  Held out, the search beat the line on 24 of VGG-16's 26
    convolution steps (10.2 against 23.4 ms of error over the inner ks) and on 46 of
    GoogLeNet's 118 (27.6 against 26.4 ms in all).  With every such step searched, GoogLeNet's
    steps at 176, 181, 184, 192 summed 73.0, 72.4, 75.6, 78.6 ms (the search's noise; measured
    back to back: 71.1 at 181, 73.7 at 192).  Under three quarters of the line's error, 21 of
    VGG-16's steps and 25 of GoogLeNet's keep it: the summed steps come within -2.4 to +2.0 %
    of VGG-16's eight measured points and +0.4 to +4.8 % of GoogLeNet's four; under half,
    VGG-16 at 48 is +4.1 %; with no search, +11.2 % (its tiles), and with every win, GoogLeNet
    at 192 is +6.6 % (``docs/results/tuner_s39/margin.txt``, ``margin.py``)."""
    ks = sorted(measured)
    err_line = err_search = 0.0
    for a, b, c in zip(ks, ks[1:], ks[2:]):
        w = (b - a) / (c - a)
        line = measured[a] + w * (measured[c] - measured[a])
        ra, rc = measured[a] / searched[a], measured[c] / searched[c]
        by_search = (ra + w * (rc - ra)) * searched[b]
        err_line += abs(line - measured[b])
        err_search += abs(by_search - measured[b])
    return len(ks) > 2 and err_search < SEARCH_MARGIN * err_line


def chunk_rules_of(profile) -> tuple:
    """:class:`ComputeModel`'s ``chunks`` from a profile's ``meta["chunks"]`` (``{layer:
    [limit, bytes per image, multiple]}``, :func:`swap.profiler.settle_chunk_rules`): one entry
    per step of such a layer with FLOPs, with its FLOPs per image (the median of its samples'
    FLOPs / k).  () for profiles without the record (before session 38, or no chunked layer)."""
    rules = (getattr(profile, "meta", None) or {}).get("chunks") or {}
    if not rules:
        return ()
    per_image: dict = {}
    by_step = {s.step: s for s in profile.steps}
    for c in profile.compute:
        s = by_step.get(c.step)
        if s is not None and s.name in rules and c.flops > 0 and c.k > 0:
            per_image.setdefault((s.name, s.phase), []).append(c.flops / c.k)
    return tuple((name, phase, *map(int, rules[name]), float(np.median(f)))
                 for (name, phase), f in sorted(per_image.items()))


# ------------------------------------------------- the fit against its profile
def restrict_profile(profile, ks):
    """The profile with only the samples at ``ks`` (compute, transfers, iterations, solver
    steps): the fit of a held-out evaluation."""
    import dataclasses
    keep = {int(k) for k in ks}
    missing = keep - set(profile.ks)
    if missing:
        raise ValueError(f"profile of {profile.net!r} has no samples at k = "
                         f"{sorted(missing)}; profiled: {list(profile.ks)}")
    return dataclasses.replace(
        profile, ks=tuple(k for k in profile.ks if k in keep),
        compute=tuple(c for c in profile.compute if c.k in keep),
        transfers=tuple(t for t in profile.transfers if t.k in keep),
        iterations=tuple(x for x in profile.iterations if x[0] in keep),
        solver_steps=tuple(x for x in profile.solver_steps if x.k in keep))


def step_sums(model: ComputeModel, profile, k: int) -> tuple:
    """(measured, predicted) seconds of eq. (2) at a profiled ``k``: the sum over the steps of
    the mean profiled time (several iterations at k are averaged), and the sum of the model's
    step times at the same FLOPs."""
    steps = {s.step: s for s in profile.steps}
    times: dict = {}
    flops: dict = {}
    for c in profile.compute:
        if c.k == k:
            times.setdefault(c.step, []).append(c.time)
            flops[c.step] = c.flops
    if not times:
        raise ValueError(f"profile of {profile.net!r} has no compute samples at k = {k}")
    measured = sum(float(np.mean(v)) for v in times.values())
    predicted = sum(model.step_time(steps[j], flops[j], k=k) for j in times)
    return measured, predicted


def leave_one_out(profile, granularity: str = "type") -> list:
    """Held-out check of the compute model on its own profile: for each profiled k, the curves
    fitted to the other ks (granularity "type" or "step"; no O(k), no host model) predict
    eq. (2) at k.  A list of ``{"k", "measured", "predicted", "error"}`` (seconds; error =
    (predicted - measured) / measured).  The smallest and largest k are extrapolations, the
    others interpolations.  Needs at least two profiled ks."""
    if len(profile.ks) < 2:
        raise ValueError(f"leave_one_out needs two profiled ks, the profile of {profile.net!r} "
                         f"has {list(profile.ks)}")
    out = []
    for k in profile.ks:
        fit = restrict_profile(profile, [x for x in profile.ks if x != k])
        m = ComputeModel.from_profile(fit, granularity=granularity, overhead=False, host=False)
        meas, pred = step_sums(m, profile, k)
        out.append({"k": int(k), "measured": meas, "predicted": pred,
                    "error": (pred - meas) / meas})
    return out


def t_iter(model: ComputeModel, gmap: GMAP, k: int) -> float:
    """eq. (2) at minibatch ``k``."""
    return model.t_iter(gmap, k)


def t_whole(model: ComputeModel, gmap: GMAP, k: int, epochs: float, dataset: int,
            delta: float = 0.0) -> float:
    """eq. (3): ``E * m / k * (max(t_iter(k), H(k)) + O(k) + Delta)``: seconds to train
    ``epochs`` over ``dataset`` images at minibatch ``k``; H(k) the host's issue time of the
    steps (:class:`HostModel`, 0 without one), O(k) the model's time outside the steps, Delta
    seconds between iterations (parameter synchronization)."""
    return epochs * dataset / k * (model.iteration(model.t_iter(gmap, k), k) + delta)


def images_per_second(model: ComputeModel, gmap: GMAP, k: int, delta: float = 0.0) -> float:
    return k / (model.iteration(model.t_iter(gmap, k), k) + delta)


# --------------------------------------------------------------- PCIe model
@dataclass(frozen=True)
class PCIeModel:
    """Transfer time between pinned host memory and the device, eq. (5), and what the copies
    cost the compute beside them.

    h2d, d2h: bytes/s of one direction alone.  both: total bytes/s when both directions copy at
    once (None: no contention, ``h2d + d2h``); each direction then gets its share in proportion
    to its own rate, never more than alone.  latency: seconds per transfer (0: eq. 5 exactly).

    slow_out, slow_in: how much longer compute takes while an offload (device to host) or a
    prefetch (host to device) is in flight beside it, as a fraction (0.05: a step of 1 ms
    entirely beside a prefetch takes 1.05 ms; both at once add).  The copies read or write
    device memory at the link's rate, and the kernels beside them lose that share of it and
    some of their issue rate.  ResNet-152 at 89 on an H200 (session 25, scripts/swap_anatomy.py):
    the dynamic plan's steps computed 5.7 ms longer than the same steps with every map kept,
    all of it on steps beside a copy, and its 3.67 GiB each way took about 70 ms per
    direction: about 2 % out, 6 % in.  Default 0 (the paper's model: copies are free to
    compute).  :meth:`stretch` applies them; the planner's replays use it.

    step_cost: seconds a step takes longer with any copy beside it, whatever its length (the
    events the plan's steps record and wait on around a copy; :func:`copy_step_cost`, 0 unless
    ``$MINICAFFE_COPY_STEP_COST`` asks for it).
    """
    h2d: float
    d2h: float
    both: float | None = None
    latency: float = 0.0
    slow_out: float = 0.0
    slow_in: float = 0.0
    step_cost: float = 0.0

    def __post_init__(self):
        for name in ("h2d", "d2h"):
            v = getattr(self, name)
            if not v > 0:
                raise ValueError(f"PCIe bandwidth {name} must be positive, got {v}")
        for name in ("slow_out", "slow_in"):
            v = getattr(self, name)
            if not 0.0 <= v < 1.0:
                raise ValueError(f"PCIe {name} must be in [0, 1), got {v}")
        if not self.step_cost >= 0.0:
            raise ValueError(f"PCIe step_cost must be at least 0, got {self.step_cost}")

    @property
    def slows(self) -> bool:
        """Whether copies cost the compute beside them anything."""
        return self.slow_out > 0.0 or self.slow_in > 0.0 or self.step_cost > 0.0

    def stretch(self, t: float, out_spans=(), in_spans=()) -> float:
        """Wall seconds of a step of ``t`` seconds alone, given the spans ``(from, to)``
        (seconds from the step's start; sorted, not overlapping within a direction) during
        which offloads and prefetches are in flight.  Beside a copy the step progresses at
        ``1 / (1 + slow)`` of its rate (both directions: ``1 / (1 + slow_out + slow_in)``),
        and a step with any copy in flight during it takes :attr:`step_cost` longer."""
        if t <= 0.0 or not self.slows or (not out_spans and not in_spans):
            return t
        wall = self._stretch_rates(t, out_spans, in_spans)
        if self.step_cost > 0.0 and any(a < wall and b > 0.0
                                        for a, b in (*out_spans, *in_spans)):
            wall += self.step_cost
        return wall

    def _stretch_rates(self, t: float, out_spans, in_spans) -> float:
        """:meth:`stretch` without the step cost."""
        if self.slow_out <= 0.0 and self.slow_in <= 0.0:
            return t
        edges = sorted({x for a, b in (*out_spans, *in_spans) for x in (a, b) if x > 0.0})
        wall, work, at = 0.0, t, 0.0
        for edge in edges:
            mid = 0.5 * (at + edge)
            rate = 1.0
            if any(a <= mid < b for a, b in out_spans):
                rate += self.slow_out
            if any(a <= mid < b for a, b in in_spans):
                rate += self.slow_in
            span = edge - at
            if work * rate <= span:
                return wall + work * rate
            wall += span
            work -= span / rate
            at = edge
        return wall + work

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
        slow = copy_slowdown(profile) or (0.0, 0.0)
        return cls(h2d=fits[H2D][0], d2h=fits[D2H][0], both=both,
                   latency=float(np.mean(lat)) if lat else 0.0,
                   slow_out=slow[0], slow_in=slow[1], step_cost=copy_step_cost(profile))

    def to_dict(self) -> dict:
        return {"h2d": self.h2d, "d2h": self.d2h, "both": self.both, "latency": self.latency,
                "slow_out": self.slow_out, "slow_in": self.slow_in, "step_cost": self.step_cost}

    @classmethod
    def from_dict(cls, d) -> "PCIeModel":
        return cls(h2d=d["h2d"], d2h=d["d2h"], both=d.get("both"), latency=d.get("latency", 0.0),
                   slow_out=d.get("slow_out", 0.0), slow_in=d.get("slow_in", 0.0),
                   step_cost=d.get("step_cost", 0.0))


# "0": cuDNN convolutions priced by the curves alone, not by cuDNN's search (ComputeModel)
ENV_SEARCHED = "MINICAFFE_SEARCH_PRICING"
# a step keeps the search's pricing where its held-out error is under this share of the
# segments' (_searched_wins)
SEARCH_MARGIN = 0.75

# ------------------------------------------------ copies beside compute
ENV_COPY_SLOWDOWN = "MINICAFFE_COPY_SLOWDOWN"   # "OUT,IN" fractions (or "0"): overrides the fit
# "1": the copies' calibration also fits a cost per step beside a copy (copy_fit; off by default)
ENV_COPY_STEP_COST = "MINICAFFE_COPY_STEP_COST"
COPY_SLOWDOWN_CAP = 0.5
# a calibration whose steps without copies sum to more than this times the same steps beside
# the naive plan's copies is disturbed (ResNet-152, session 25: 241.5 against 142.9 ms, one
# step at 95 ms) and is not used
COPY_CALIBRATION_SANE = 1.05
# copy_slowdown leaves out the steps whose naive time is under this many times the host's
# time to issue them (host_bound_steps)
COPY_CALIBRATION_HOST_MARGIN = 2.0
# ... and uses no calibration where the steps left hold less than this share of the naive
# plan's step time (ResNet-34 at 75, session 26: 20 %, and a fit at the cap)
COPY_CALIBRATION_MIN_SHARE = 0.25
# ... and leaves out a step whose excess beside the copies is over what they add at
# COPY_SLOWDOWN_CAP plus this share of its time kept (the steps' noise)
COPY_CALIBRATION_NOISE = 0.03


def nonnegative_fit(delta, *columns) -> np.ndarray:
    """Least squares ``delta = sum_c a_c columns[c]`` with every ``a_c >= 0`` and no intercept
    (a column that would come out negative is dropped and the rest refitted; all-zero columns
    get 0)."""
    d = np.asarray(delta, dtype=np.float64)
    X = np.stack([np.asarray(c, dtype=np.float64) for c in columns], axis=1)
    use = [c for c in range(X.shape[1]) if X[:, c].any()]
    coef = np.zeros(X.shape[1])
    while use:
        sol, *_ = np.linalg.lstsq(X[:, use], d, rcond=None)
        if (sol >= 0).all():
            coef[use] = sol
            break
        use = [c for c, v in zip(use, sol) if v > 0] if (sol > 0).any() else []
    return coef


def _busy(intervals):
    """Sorted starts of the merged busy spans of ``intervals`` ((start, end) pairs) and the
    busy time before each span's start and end: what :func:`_busy_between` needs."""
    iv = sorted((a, b) for a, b in intervals if b > a)
    merged = []
    for a, b in iv:
        if merged and a <= merged[-1][1]:
            merged[-1][1] = max(merged[-1][1], b)
        else:
            merged.append([a, b])
    if not merged:
        return np.zeros(0), np.zeros(0), np.zeros(0)
    m = np.asarray(merged, dtype=np.float64)
    before = np.concatenate([[0.0], np.cumsum(m[:, 1] - m[:, 0])[:-1]])
    return m[:, 0], m[:, 1], before


def _busy_between(busy, start, end) -> np.ndarray:
    """Busy time of ``busy`` (from :func:`_busy`) within each ``[start[i], end[i]]``."""
    starts, ends, before = busy
    if not len(starts):
        return np.zeros(len(start))

    def upto(t):            # busy time in [0, t]
        i = np.searchsorted(starts, t, side="right") - 1
        ok = i >= 0
        ii = np.maximum(i, 0)
        inside = np.clip(t - starts[ii], 0.0, ends[ii] - starts[ii])
        return np.where(ok, before[ii] + inside, 0.0)
    return np.maximum(upto(np.asarray(end, dtype=np.float64))
                      - upto(np.asarray(start, dtype=np.float64)), 0.0)


def _by_iteration(samples, key) -> list:
    """The iteration of each sample at one k: the n-th sample of a key (a step, a transfer's
    buffer and kind) is from the n-th measured iteration (a profile records them in order)."""
    seen: dict = {}
    out = []
    for x in samples:
        kk = key(x)
        out.append(seen.get(kk, 0))
        seen[kk] = out[-1] + 1
    return out


def copy_overlaps(profile, k: int) -> tuple:
    """Per compute sample of the profile at ``k`` (in order), the seconds its step overlapped an
    offload and a prefetch of the same iteration: ``(samples, out_s, in_s)``."""
    comp = [c for c in profile.compute if c.k == k]
    trans = [t for t in profile.transfers if t.k == k]
    ci = _by_iteration(comp, lambda c: c.step)
    ti = _by_iteration(trans, lambda t: (t.kind, t.buffer))
    out_s = np.zeros(len(comp))
    in_s = np.zeros(len(comp))
    for it in set(ci):
        idx = [i for i, x in enumerate(ci) if x == it]
        s = np.array([comp[i].start for i in idx])
        e = s + np.array([comp[i].time for i in idx])
        for kind, dest in (("offload", out_s), ("prefetch", in_s)):
            busy = _busy([(t.start, t.start + t.time) for t, x in zip(trans, ti)
                          if x == it and t.kind == kind])
            dest[idx] = _busy_between(busy, s, e)
    return comp, out_s, in_s


def host_bound_steps(profile, device) -> np.ndarray:
    """Mask of the steps whose ``device`` seconds (one per step of ``profile``) are less than
    :data:`COPY_CALIBRATION_HOST_MARGIN` times the host's time to issue them (the least of
    the profile's host samples for the step; a step without one is not host-bound).

    The least, not the median: the host's own speed moves by a third within a minute on the
    H200 machines (session 28), and a slow stretch during the host profile said nothing of
    the calibration's run.  ResNet-152 (H200, session 29): the host samples at k = 3, 6, 9
    took 76, 131 and 98 ms a whole iteration; with their median 20 % of the naive steps at
    49 passed and the calibration was dropped ("host-bound"), so the model priced the
    copies at zero, k* offloaded 24 % and ran 1.032x `none`, and the curves kept the copies'
    cost (+5.6 % at 45).  With the least, 67 % pass and the fit is 5.2 / 5.6 %, beside
    session 28's 2.9 / 6.2 % from the same rule on a quieter host.

    With every map kept the device has no copy to wait for and catches up with the host, so
    at a small k such a step's kept time is the host's pace, not the device's: GoogLeNet at
    76 (H200, session 26) kept its steps 19.6 % slower than the naive plan, all of it on steps
    under 1.5x their host time (the loss layers' forward 0.57 against 0.06 ms); on the steps
    over 2x the kept ones were 0.9 % faster, as copies beside them predict."""
    device = np.asarray(device, dtype=np.float64)
    by_step: dict = {}
    for h in getattr(profile, "host_samples", ()) or ():
        by_step.setdefault(h.step, []).append(h.time)
    host = np.zeros(len(device))
    for j, ts in by_step.items():
        if 0 <= j < len(host):
            host[j] = float(min(ts))
    return device < COPY_CALIBRATION_HOST_MARGIN * host


def copy_slowdown(profile) -> tuple | None:
    """(slow_out, slow_in) of :class:`PCIeModel` from a profile's copy calibration, or None.

    ``$MINICAFFE_COPY_SLOWDOWN`` ("OUT,IN" fractions, or one number for both) overrides it.
    The calibration (``meta["copy_calibration"]``, :func:`swap.profiler.profile_solver`):
    each step's time at one k with every feature map kept, beside the same step under the
    naive plan at that k.  A step loses ``g = slow / (1 + slow)`` of the time a copy spends
    beside it (:meth:`PCIeModel.stretch`), so ``naive - kept = g_out * beside_out + g_in *
    beside_in`` over the steps, fitted with ``g >= 0`` (:func:`nonnegative_fit`); capped at
    :data:`COPY_SLOWDOWN_CAP`.  Only steps the device sets the pace of enter the fit, the
    ones at least :data:`COPY_CALIBRATION_HOST_MARGIN` times the host's time to issue them
    (:func:`host_bound_steps`; all where the profile has no host samples).  None where the
    calibration is missing, from the CPU, disturbed (those steps sum to more than
    :data:`COPY_CALIBRATION_SANE` times the naive plan's), too host-bound to tell (the steps
    left hold less than :data:`COPY_CALIBRATION_MIN_SHARE` of the naive step time) or
    undetermined (a slowdown fitted at :data:`COPY_SLOWDOWN_CAP`).

    The naive plan at a small k prefetches each map back as soon as its offload is done (the
    budget allows it), so both directions run during the forward pass and the split between
    them is poorly determined; their sum is what the calibration measures best (ResNet-152 at
    49, H200: the forward 12 % slower beside both, the backward unchanged).  The dynamic
    plan's own steps: scripts/swap_anatomy.py."""
    return copy_slowdown_why(profile)[0]


def copy_step_cost(profile) -> float:
    """Seconds a step with any copy beside it takes longer (:attr:`PCIeModel.step_cost`): the
    calibration's fit with a cost per step (:func:`copy_fit`) where ``$MINICAFFE_COPY_STEP_COST``
    is "1" and the slowdowns come from that fit; else 0 (also under
    ``$MINICAFFE_COPY_SLOWDOWN``)."""
    import os
    if not copy_step_cost_on() or os.environ.get(ENV_COPY_SLOWDOWN, "").strip() or \
            profile.mode != "GPU":
        return 0.0
    cal = (getattr(profile, "meta", None) or {}).get("copy_calibration")
    if not cal:
        return 0.0
    fit, _ = copy_fit(profile, cal, True)
    return 0.0 if fit is None else fit[2]


def copy_slowdown_why(profile) -> tuple:
    """``(copy_slowdown(profile), why)``: ``why`` says where the slowdowns come from or why
    there are none: "$MINICAFFE_COPY_SLOWDOWN" (the override), "not a GPU profile",
    "missing", or :func:`copy_slowdown_fit`'s reason ("" with a fit).  The tuner's log says
    it where a GPU profile's copies are priced at zero."""
    import os
    env = os.environ.get(ENV_COPY_SLOWDOWN, "").strip()
    if env:
        try:
            vals = [float(x) for x in env.split(",")]
        except ValueError:
            raise ValueError(f"${ENV_COPY_SLOWDOWN}={env!r}: expected OUT,IN fractions "
                             "(e.g. 0.02,0.06) or one number") from None
        if len(vals) == 1:
            vals = vals * 2
        if len(vals) != 2 or not all(0.0 <= v < 1.0 for v in vals):
            raise ValueError(f"${ENV_COPY_SLOWDOWN}={env!r}: two fractions in [0, 1) expected")
        return (float(vals[0]), float(vals[1])), f"${ENV_COPY_SLOWDOWN}"
    if profile.mode != "GPU":
        return None, "not a GPU profile"
    cal = (getattr(profile, "meta", None) or {}).get("copy_calibration")
    if not cal:
        return None, "missing"
    return copy_slowdown_fit(profile, cal)


def calibration_steps(profile, cal):
    """``(naive, kept, beside_out, beside_in, usable)``, one entry per step of ``profile``: the
    step's seconds at the calibration ``cal``'s k under the naive plan (the mean of its
    samples) and with every map kept, the seconds of offloads and of prefetches beside it
    there, and whether it may enter :func:`copy_slowdown_fit` (sampled both ways, and not
    host-bound: :func:`host_bound_steps`); None where ``cal`` does not match the profile's
    steps or the profile has no naive samples at that k."""
    k = int(cal["k"])
    kept = np.asarray(cal["kept"], dtype=np.float64)
    comp, out_s, in_s = copy_overlaps(profile, k)
    n = len(profile.steps)
    if len(kept) != n or not comp:
        return None
    cnt = np.zeros(n)
    naive = np.zeros(n)
    bo = np.zeros(n)
    bi = np.zeros(n)
    for c, o, i in zip(comp, out_s, in_s):
        cnt[c.step] += 1
        naive[c.step] += c.time
        bo[c.step] += o
        bi[c.step] += i
    ok = (cnt > 0) & np.isfinite(kept)
    cnt = np.maximum(cnt, 1)
    naive, bo, bi = naive / cnt, bo / cnt, bi / cnt
    ok &= ~host_bound_steps(profile, naive)
    return naive, kept, bo, bi, ok


def copy_step_cost_on() -> bool:
    """Whether ``$MINICAFFE_COPY_STEP_COST`` asks for the copies' cost per step ("1"; off by
    default: :func:`copy_step_cost`)."""
    import os
    return os.environ.get(ENV_COPY_STEP_COST, "").strip() == "1"


def copy_slowdown_fit(profile, cal, step_cost: bool | None = None) -> tuple:
    """``((slow_out, slow_in) or None, why)`` from the calibration ``cal`` against ``profile``'s
    naive samples at its k, whatever the profile's mode (:func:`copy_slowdown`'s rules); ``why``
    names the reason for None: "missing", "host-bound", "disturbed" or "undetermined" ("" with
    a fit).  The profiler asks it after a calibration to run a disturbed one again
    (:func:`swap.profiler.profile_solver`).  ``step_cost`` (default
    :func:`copy_step_cost_on`): the slowdowns of the fit with a cost per step
    (:func:`copy_fit`)."""
    fit, why = copy_fit(profile, cal, copy_step_cost_on() if step_cost is None else step_cost)
    return (None if fit is None else fit[:2]), why


def copy_fit(profile, cal, step_cost: bool = False) -> tuple:
    """``((slow_out, slow_in, seconds per step) or None, why)``: :func:`copy_slowdown_fit`, and
    with ``step_cost`` the fit ``naive - kept = c + g_out * beside_out + g_in * beside_in`` over
    the steps with a copy beside them (every ``g`` and ``c`` at least 0), ``c`` the seconds a
    step with any copy beside it takes longer whatever its length; 0 without.

    Why: fitted so, 39 of 45 calibrations on the H200 (sessions 25-40) have ``c`` of 3 to 9 us
    (median 5.5), likely the events the naive plan records and waits on around its copies;
    without it the tiny steps beside a copy enter the slowdowns.  Replayed against 81
    measured points of sessions 32-40, ``c`` taken out of every naive sample with a copy beside
    it brought the mean time error from 3.08 to 2.80 % and ResNet-50 at 36 from +6.7 to
    +4.1 % (``docs/results/tuner_s40/intercept_replay.py``); not yet measured on a GPU, so off
    by default (``$MINICAFFE_COPY_STEP_COST=1``)."""
    steps = calibration_steps(profile, cal)
    if steps is None:
        return None, "missing"
    naive, kept, bo, bi, ok = steps
    if naive[ok].sum() < COPY_CALIBRATION_MIN_SHARE * naive.sum():
        return None, "host-bound"   # too little of the iteration is the device's pace to tell
    if kept[ok].sum() > COPY_CALIBRATION_SANE * naive[ok].sum():
        return None, "disturbed"    # the run without copies was the slower one: not data
    cap = COPY_SLOWDOWN_CAP / (1 + COPY_SLOWDOWN_CAP)
    excess = naive - kept
    # a step slower beside the copies by more than they could add even at the cap (its own
    # disturbance: VGG-16 at 8, session 39, fc7's forward 9.1 ms against 0.05 kept with 40 us
    # of copies beside it) says nothing about the copies: it is left out of the fit
    ok &= excess <= cap * (bo + bi) + COPY_CALIBRATION_NOISE * kept
    if step_cost:
        ok &= (bo + bi) > 0
        g = nonnegative_fit(excess[ok], bo[ok], bi[ok], np.ones(int(ok.sum())))
    else:
        g = np.append(nonnegative_fit(excess[ok], bo[ok], bi[ok]), 0.0)
    if np.any(g[:2] >= cap):
        return None, "undetermined"  # a slowdown at the cap: the data does not determine it
    return (float(g[0] / (1 - g[0])), float(g[1] / (1 - g[1])), float(g[2])), ""


def without_copies(profile, slow, step_cost: float = 0.0) -> tuple:
    """The profile's compute samples with the time the copies beside them added taken out
    (``slow``: (slow_out, slow_in), :func:`copy_slowdown`): what each step takes with no copy
    in flight, as the model predicts `none` and the planner adds the copies of its own plan
    (:meth:`PCIeModel.stretch`).  ``step_cost``: seconds also taken out of every sample with a
    copy beside it (:func:`copy_step_cost`)."""
    so, si = slow
    if so <= 0 and si <= 0 and step_cost <= 0:
        return tuple(profile.compute)
    go, gi = so / (1 + so), si / (1 + si)
    fixed = {}
    for k in sorted({c.k for c in profile.compute}):
        comp, out_s, in_s = copy_overlaps(profile, k)
        for c, o, i in zip(comp, out_s, in_s):
            cost = go * o + gi * i + (step_cost if o + i > 0 else 0.0)
            fixed[id(c)] = dataclasses.replace(c, time=max(c.time - cost, 0.5 * c.time))
    return tuple(fixed.get(id(c), c) for c in profile.compute)


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


__all__ = ["H2D", "D2H", "ThroughputCurve", "fit_curve", "IterationOverhead", "overhead_samples",
           "HostModel", "HOST_METHODS", "ComputeModel", "GRANULARITIES", "TUNER_GRANULARITY",
           "restrict_profile", "step_sums", "leave_one_out", "t_iter", "t_whole",
           "images_per_second", "PCIeModel", "peak_memory", "paper_k_max", "FORWARD", "BACKWARD",
           "ENV_COPY_SLOWDOWN", "copy_slowdown", "copy_slowdown_why", "copy_slowdown_fit",
           "calibration_steps", "copy_fit", "copy_step_cost", "copy_step_cost_on",
           "ENV_COPY_STEP_COST", "copy_overlaps", "without_copies", "nonnegative_fit"]
