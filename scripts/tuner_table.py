#!/usr/bin/env python3
"""Issue 5 on the GPU: Table 1 at a 12 GB budget, the model's errors, no stall, and the peers.

For each network (a child process per network, on its own GPU when ``--gpus`` names several):

1. **Caffe mode.**  The largest minibatch ``none`` trains within the budget: the plan with
   Caffe's one-image im2col (its memory is Caffe's allocation), plus the CuPy temporaries a dry
   run measures, verified by training at it; its iteration time.  ``k_caffe`` is Caffe's own
   accounting (``minicaffe mem``'s caffe row) for comparison.
2. **AccUDNN.**  ``swap.tuner.train_dynamic`` from the paper's batch: profile (real training
   iterations), Algorithm 2, the plan at k*; the tuner's run time (profiling, then the decision
   alone, timed again on the same profile).
3. **Model error.**  At k* and two other k (k_none and k*/2): the dynamic plan from the same
   model, the predicted iteration time and memory against the measured ones (CUDA events
   around each iteration, median; the executor's peak bytes in use, the arena's high-water mark
   and the scratch reserve's high-water mark).
4. **No stall.**  At each of those k where ``none`` fits the device's whole memory, ``none``
   with the same (chunked) convolution lowering, so that the ratio is the cost of swapping.
5. **ResNet-152 at batch 32**: the smallest budget whose dynamic plan is predicted within 3 %
   of the compute-only time, measured against ``none``, and the fraction of feature-map bytes
   offloaded (the paper: 8.3 GB, about 64 %).
6. **Peers** (a child process of its own): PyTorch eager and PyTorch with
   ``save_on_cpu(pin_memory=True)`` at k*, on the very network minicaffe trains (its prototxt
   as PyTorch modules, ``scripts/torch_peer.py``) and on torchvision's model of the name
   (another network for AlexNet and GoogLeNet; the columns of sessions before 26).  The
   issue's dynamic / save_on_cpu ratio is against the same network.

    python3 scripts/tuner_table.py --gpus 0,1,2,3          # the 7 networks on 4 GPUs
    python3 scripts/tuner_table.py --quick                 # CPU, a tiny net (the test suite)

Results: ``docs/results/tuner_table.{csv,md}`` and one JSON per network (with its profile)
under ``docs/results/tuner/``.  Networks that run side by side on different GPUs of one host
share its PCIe root complexes and host memory; ``--gpus 0`` runs them one at a time.
"""
from __future__ import annotations

import argparse
import json
import math
import os
import queue
import statistics
import subprocess
import sys
import threading
import time

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if REPO not in sys.path:
    sys.path.insert(0, REPO)

DEFAULT_NETS = ("resnet152:32,resnet101:32,resnet50:64,vgg16:64,googlenet:128,resnet34:128,"
                "alexnet:256")
QUICK_NETS = "cifar10_quick:4"
# Table 1 of the paper (M40, 12 GB): k*/k_caffe
PAPER_RATIO = {"alexnet": 1.22, "googlenet": 1.91, "vgg16": 2.4, "resnet34": 3.03,
               "resnet50": 3.39, "resnet101": 3.7, "resnet152": 4.15}
# Table 1 of the paper (M40, 12 GB): AccUDNN's k*, its images/s, Caffe's max k, its images/s
PAPER_TABLE1 = {"alexnet": (1032, 853, 848, 865), "googlenet": (286, 245, 150, 263),
                "vgg16": (192, 50, 80, 51), "resnet34": (276, 99, 91, 99),
                "resnet50": (112, 66, 33, 66), "resnet101": (74, 34, 20, 29),
                "resnet152": (54, 24, 13, 19)}
SAVE_ON_CPU_TARGET = 5.0      # issue 5: dynamic images/s over PyTorch save_on_cpu's at k*
SLOWDOWN = 1.03


# ------------------------------------------------------------------ child
def _sync(gpu):
    if gpu:
        import cupy as cp
        cp.cuda.Device().synchronize()


GC = {"collections": 0, "ms": 0.0}     # Python's garbage collections in the last _timed
HOST: list = []                         # host ms of each step of the last _timed
B2B: list = []                          # ms of each back-to-back step of the last _timed (GPU)


# Warm-up on the GPU lasts at least this long (and ``warmup`` steps): the first
# configuration of a process measured 66 ms where the same one measured 47.7 ms later
# (ResNet-50 k = 36, H200, 2026-11-22): clocks and lazy setup after an idle start.
WARMUP_MIN_S = 1.5
WARMUP_MAX_STEPS = 50


def _timed(solver, iters, warmup, gpu, back_to_back: bool = True):
    """Median ms of ``iters`` solver steps after ``warmup`` steps and, on the GPU, at least
    :data:`WARMUP_MIN_S` of them (the executor's dry run is the first warm-up step).  Python's
    garbage collections during the timed steps (count and host time) are left in :data:`GC`:
    a process that holds many plans and profiles pays more per full collection, on the host's
    critical path at small k.  On the GPU (and ``back_to_back``) ``iters`` more steps are
    then timed back to back
    (:func:`scripts.swap_budgets._timed_back_to_back`, into :data:`B2B`): each timed step
    above starts on an idle device, as one waits for it; training does not wait, and where the
    host's issue time nears the device's the two differ (:func:`_b2b`)."""
    import gc
    from scripts.swap_budgets import _timed_back_to_back, _timed_steps
    t0 = time.perf_counter()
    for i in range(WARMUP_MAX_STEPS):
        if i >= warmup and (not gpu or time.perf_counter() - t0 >= WARMUP_MIN_S):
            break
        solver.step(1)
        _sync(gpu)
    GC.update(collections=0, ms=0.0)
    start = []

    def watch(phase, info):
        if phase == "start":
            start.append(time.perf_counter())
        elif start:
            GC["collections"] += 1
            GC["ms"] += 1e3 * (time.perf_counter() - start.pop())
    gc.callbacks.append(watch)
    HOST.clear()
    B2B.clear()
    try:
        times = _timed_steps(solver, iters, gpu, HOST)
    finally:
        gc.callbacks.remove(watch)
    if gpu and back_to_back:
        B2B.extend(_timed_back_to_back(solver, iters))
    return statistics.median(times), times


def _b2b() -> dict:
    """The last :func:`_timed`'s back-to-back steps for a measurement's dict (GPU only)."""
    return {"times_b2b": list(B2B), "ms_b2b": statistics.median(B2B)} if B2B else {}


def _free(ex=None):
    """Close ``ex`` and give its arena and CuPy's cached blocks back to the driver: one process
    builds a dozen executors, and the net's old arrays (re-homed into each arena) would stay
    cached in CuPy's pool."""
    import gc
    if ex is not None:
        ex.close()
        ex.device.release()
    gc.collect()
    try:
        import cupy as cp
        cp.get_default_memory_pool().free_all_blocks()
        cp.get_default_pinned_memory_pool().free_all_blocks()
    except ImportError:
        pass


def _memory_report() -> str:
    import cupy as cp
    from swap.arena import device_memory_report
    return device_memory_report(cp)


def collecting_log():
    """(lines, log): ``log(msg)`` prints to stderr and keeps the message in ``lines`` (a
    network's JSON records its last lines)."""
    lines = []

    def log(msg):
        lines.append(msg)
        print(msg, file=sys.stderr, flush=True)
    return lines, log


def _close(net):
    ex = getattr(net, "executor", None)
    net.executor = None
    _free(ex)


def _mem(ex) -> dict:
    """Measured memory: the plan's peak bytes in use, the transients the dry run measured, and
    the arena's high-water mark (the scratch reserve's included)."""
    sc = getattr(ex, "scratch", None)
    tp = ex.transients
    return {"peak_in_use": int(ex.peak_in_use), "high_water": int(ex.high_water),
            "transients": int(tp.peak) if tp is not None else 0,
            "scratch_high_water": int(getattr(sc, "high_water", 0) or 0),
            "scratch_capacity": int(getattr(sc, "capacity", 0) or 0)}


def _none_max_k(solver, budget, gpu, log):
    """The largest k whose ``none`` plan (Caffe's lowering) and measured temporaries fit the
    budget, found from the plan's k and lowered until the dry run's budget fits."""
    return largest_verified_k(solver, "none", budget, log, lowering="caffe")


def largest_verified_k(solver, strategy, budget, log, lowering=None, margin=0.10):
    """(k, the dry run's TransientProfile): the largest k whose ``strategy`` plan plus the
    temporaries a dry run measures (and ``margin``) fit ``budget``, from the plan's largest k
    down, stepping by the bytes per image of the plan."""
    from swap.gmap import build_gmap
    from swap.plan import max_batch, min_budget
    from swap.profiler import set_batch_size
    from swap.runtime import measure_scratch, set_lowering
    net = solver.net
    if lowering is not None:
        set_lowering(net, lowering)
    net.reshape()
    g = build_gmap(net)
    k = max_batch(g, strategy, budget)
    if k < 1:
        return 0, None
    for _ in range(12):
        set_batch_size(net, k)
        tp = measure_scratch(solver, strategy, **({"lowering": lowering} if lowering else {}))
        need = tp.budget(margin=margin)
        log(f"{strategy} at k = {k}: plan + transients need {need / 2**30:.2f} GiB")
        if need <= budget:
            return k, tp
        if k == 1:
            break
        per_image = max(1, min_budget(g.at(k), strategy) - min_budget(g.at(k - 1), strategy))
        k = max(1, k - max(1, math.ceil((need - budget) / per_image)))
    raise RuntimeError(f"{strategy}: no minibatch fits the budget with its temporaries")


def _time_none(solver, k, budget, lowering, tp, iters, warmup, gpu, margin=0.10,
               workspace_budget=None):
    """``none`` at k (in ``budget``, or outside any with None); ``workspace_budget``: the
    budget whose share bounds the cuDNN workspaces (the swap plans' algorithms at k)."""
    from swap.profiler import set_batch_size
    from swap.runtime import install
    _close(solver.net)
    set_batch_size(solver.net, k)
    reserve = tp.reserve(margin=margin) if tp is not None else None
    ex = install(solver, "none", budget, lowering=lowering, scratch=reserve,
                 workspace_budget=workspace_budget)
    try:
        ms, times = _timed(solver, iters, warmup, gpu)
        return {"k": k, "ms": ms, "times": times, "images_per_s": k * 1e3 / ms,
                "host_ms": statistics.median(HOST), **_b2b(),
                "gc_collections": GC["collections"], "gc_ms": GC["ms"],
                "arena": int(ex.budget), "lowering": lowering, **_mem(ex)}
    finally:
        solver.net.executor = None
        _free(ex)


def _time_kept(solver, k, iters, warmup, gpu, workspace_budget):
    """No swapping at k without Caffe's allocation: the dynamic plan with every feature map
    pinned (kept from its first use to its last, nothing offloaded; each layer's scratch, its
    cuDNN workspace included, only around its step), outside any budget, with the swap plans'
    algorithms (``workspace_budget``).  The no-stall reference where `none`, which holds every
    convolution's workspace at once, does not fit the device."""
    from swap.profiler import set_batch_size
    from swap.runtime import install
    _close(solver.net)
    set_batch_size(solver.net, k)
    ex = install(solver, "dynamic", None, lowering="chunked", pinned="all",
                 workspace_budget=workspace_budget)
    try:
        assert not ex.plan.offloaded
        ms, times = _timed(solver, iters, warmup, gpu)
        return {"k": k, "ms": ms, "times": times, "images_per_s": k * 1e3 / ms,
                "host_ms": statistics.median(HOST), **_b2b(),
                "gc_collections": GC["collections"], "gc_ms": GC["ms"],
                "arena": int(ex.budget), "lowering": "chunked", **_mem(ex)}
    finally:
        solver.net.executor = None
        _free(ex)


def _fits_device_kept(g, k, reserve, gpu) -> tuple[bool, str]:
    """Whether every feature map kept at k (:func:`_time_kept`) fits the device as
    :func:`_fits_device` asks of `none`."""
    from swap.plan import min_budget
    if not gpu:
        return True, ""
    import cupy as cp
    free, _ = cp.cuda.runtime.memGetInfo()
    need = (min_budget(g.at(k), "dynamic", frozenset(g.feature_maps())) + (reserve or 0)
            + (2 << 30))
    return need <= 0.92 * free, (f"every map kept at {k} needs {need / 2**30:.2f} GiB with 2 "
                                 f"GiB to spare; 92 % of the free device memory is "
                                 f"{0.92 * free / 2**30:.2f} GiB")


def _time_none_in_budget(solver, k, budget, tp, iters, warmup, gpu, log):
    """``none`` at k in the budget; a reserve that the transients outgrow (the allocator's
    fragmentation) costs k a few images, measured again."""
    from swap.runtime import ScratchOverflow, measure_scratch
    for attempt in range(4):
        try:
            return _time_none(solver, k, budget, "caffe", tp, iters, warmup, gpu,
                              margin=0.10 + 0.15 * attempt)
        except ScratchOverflow as e:
            log(f"none at k = {k}: {str(e)[:160]}")
            k = max(1, int(k * 0.97))
            _close(solver.net)
            from swap.profiler import set_batch_size
            set_batch_size(solver.net, k)
            tp = measure_scratch(solver, "none", lowering="caffe")
    raise RuntimeError(f"none: no k near {k} trains within the budget")


def _offload_fraction(plan) -> float:
    from swap.arena import align
    g = plan.gmap
    fms = g.feature_maps()
    total = sum(align(g.nbytes(b)) for b in fms)
    off = sum(align(g.nbytes(b)) for b in plan.offloaded if b in set(fms))
    return off / total if total else 0.0


def _measure_dynamic(solver, dec, budget, plan_budget, reserve, iters, warmup, gpu,
                     transients=None, model=None, pcie=None):
    """Install the decision's plan and time it; predicted beside measured.  Where the
    decided plan does not fit the net as built here, the plan at its k is decided again
    (swap.tuner.install_decision) and that one is timed and predicted, recorded as
    ``replanned_live``."""
    from swap.tuner import install_decision
    ex = install_decision(solver, dec, budget, plan_budget - (reserve or 0), scratch=reserve,
                          model=model, pcie=pcie,
                          log=lambda m: print(m, flush=True))
    replanned = ex.decision is not dec
    dec = ex.decision
    try:
        ms, times = _timed(solver, iters, warmup, gpu)
        m = _mem(ex)
        p = ex.plan
        off, pre = p.transfer_bytes()
        # memory: the plan's peak (eq. 4) plus the transients the scratch model predicts,
        # against the peak in use plus the transients the dry run measured
        pred_t = int(transients(dec.k_star)) if transients is not None else 0
        pred_total = int(dec.peak) + pred_t
        meas_total = m["peak_in_use"] + m["transients"]
        return {"k": dec.k_star, "ms": ms, "times": times, "images_per_s": dec.k_star * 1e3 / ms,
                "host_ms": statistics.median(HOST), **_b2b(),
                "gc_collections": GC["collections"], "gc_ms": GC["ms"],
                "pred_ms": 1e3 * dec.t_iter, "pred_compute_ms": 1e3 * dec.timeline.t_model,
                "pred_device_ms": 1e3 * dec.timeline.t_iter, "pred_host_ms": 1e3 * dec.host,
                "time_err": (1e3 * dec.t_iter - ms) / ms,
                "pred_peak": int(dec.peak), "pred_arena": int(p.arena_bytes),
                "pred_transients": pred_t, "pred_total": pred_total, "meas_total": meas_total,
                "peak_err": (pred_total - meas_total) / max(1, meas_total),
                "budget": int(budget), "reserve": int(reserve or 0),
                "offload_bytes": int(off), "host_bytes": int(p.host_bytes),
                "offload_fraction": _offload_fraction(p), "pinned": len(p.pinned),
                "stall_free": bool(dec.stall_free), "replanned_live": replanned, **m}
    finally:
        solver.net.executor = None
        _free(ex)


def dynamic_point(solver, dec, g, k, td, model, pcie, budget, iters, warmup, gpu) -> dict:
    """The tuner's dynamic plan at k (``dec`` itself at its k, a decision of a dict of them
    by k at its own, else planned again from the same model), installed and timed beside its
    prediction.  Transients that outgrow S(k) teach
    the scratch model the measured peak and k is planned again once (recorded); any other
    failure is recorded as ``error`` (with where the device memory is, on the GPU)."""
    from swap.runtime import ScratchOverflow
    from swap.tuner import plan_at
    S = td.scratch
    decided = dec if isinstance(dec, dict) else {dec.k_star: dec}
    try:
        rc = td.decision.recompute
        d = (decided[k] if k in decided else
             plan_at(g, k, td.plan_budget, model, pcie, scratch=S, recompute=rc))
        try:
            return _measure_dynamic(solver, d, budget, td.plan_budget,
                                    S(k) if S is not None else None, iters, warmup, gpu,
                                    transients=S.expected if S is not None else None,
                                    model=model, pcie=pcie)
        except ScratchOverflow as e:
            _close(solver.net)
            S.add(k, int(e.peak or e.scratch or 0) * 1.25)
            d = plan_at(g, k, td.plan_budget, model, pcie, scratch=S, recompute=rc)
            r = _measure_dynamic(solver, d, budget, td.plan_budget, S(k), iters, warmup, gpu,
                                 transients=S.expected, model=model, pcie=pcie)
            r["replanned"] = f"after {type(e).__name__}: {str(e)[:160]}"
            return r
    except Exception as e:            # recorded, the other points still run
        _close(solver.net)
        r = {"k": k, "error": f"{type(e).__name__}: {e}"[:600]}
        if gpu:
            r["memory_after_close"] = _memory_report()
        return r


ROUND_SPREAD = 0.03     # rounds whose medians of one strategy spread more: a moving host
MAX_ROUNDS = 6          # at most this many rounds at one k (no_stall)


def _spread(ms) -> float:
    """(largest - least) / least of the round medians."""
    return (max(ms) - min(ms)) / min(ms) if len(ms) > 1 and min(ms) > 0 else 0.0


def no_stall(r: dict, dynamic, none, rounds: int = 2, max_rounds: int = MAX_ROUNDS) -> dict:
    """``dynamic`` against ``none`` at one k, each a callable that installs and measures once
    (``r`` is dynamic's first measurement), in ``rounds`` rounds ordered ABBA... (dynamic,
    none; none, dynamic; ...) so that a drift of the host's speed weighs on both alike: at
    small k the host bounds the iteration, and its speed varied by up to 37 % within a
    minute on the lent machines (issue 5, session 12).  Writes into ``r``: ``none_ms`` (the
    first none), ``slowdown`` (the median of every dynamic step over that of every none
    step), ``slowdown_first`` (the first pair alone) and ``no_stall_rounds`` (per round, both
    medians and host times); a failed measurement ends the rounds (``no_stall_error``).
    Where ``r`` has a prediction (``pred_ms``), also ``ms_pooled`` (the median of every
    dynamic step of the rounds) and ``time_err_pooled``, the model's error against it: the
    first measurement alone carries the host's drift at host-bound k (ResNet-152 at 16,
    session 13: steps of 91, 87, 137, 152, 155 ms in one process, 79 in the next round).

    Where the round medians of either strategy spread by more than :data:`ROUND_SPREAD` after
    ``rounds`` rounds, two more rounds are run (the ABBA order goes on), until they do not or
    ``max_rounds`` are done: the pooled medians then rest on more than one disturbed round
    (ResNet-152 at 41, session 27: one round at 164 / 168 ms with the host busy throughout,
    the other at 115 / 115, pooled 139).  The decision reads the measurements only, never the
    prediction.

    Measurements with back-to-back steps (GPU, :func:`_b2b`) are pooled the same way apart:
    ``slowdown_b2b``, ``ms_pooled_b2b`` and ``time_err_b2b``, and ``{which}_b2b_ms`` per round."""
    steps = {"dynamic": [], "none": []}
    b2b = {"dynamic": [], "none": []}       # the back-to-back steps (GPU; _timed)
    out = []
    i = 0
    while True:
        if i >= rounds:
            if i >= max_rounds or "no_stall_error" in r or not any(
                    _spread([x[f"{w}_ms"] for x in out if f"{w}_ms" in x]) > ROUND_SPREAD
                    for w in ("dynamic", "none")):
                break
            rounds = i + 2
        row = {}
        for which in (("dynamic", "none") if i % 2 == 0 else ("none", "dynamic")):
            m = r if (i == 0 and which == "dynamic") else (dynamic() if which == "dynamic"
                                                          else none())
            if "error" in m:
                r["no_stall_error"] = m["error"]
                break
            steps[which].extend(m["times"])
            row[f"{which}_ms"] = m["ms"]
            row[f"{which}_host_ms"] = m.get("host_ms")
            if m.get("times_b2b"):
                b2b[which].extend(m["times_b2b"])
                row[f"{which}_b2b_ms"] = m["ms_b2b"]
            if i == 0 and which == "none":
                r.update(none_ms=m["ms"], none_host_ms=m.get("host_ms"),
                         none_gc_ms=m.get("gc_ms"), slowdown_first=r["ms"] / m["ms"])
        out.append(row)
        i += 1
        if "no_stall_error" in r:
            break
    r["no_stall_rounds"] = out
    if steps["none"]:
        r["slowdown"] = statistics.median(steps["dynamic"]) / statistics.median(steps["none"])
    if "pred_ms" in r and steps["dynamic"]:
        pooled = statistics.median(steps["dynamic"])
        r["ms_pooled"] = pooled
        r["time_err_pooled"] = (r["pred_ms"] - pooled) / pooled
    if b2b["dynamic"] and b2b["none"]:
        r["slowdown_b2b"] = statistics.median(b2b["dynamic"]) / statistics.median(b2b["none"])
    if "pred_ms" in r and b2b["dynamic"]:
        pooled = statistics.median(b2b["dynamic"])
        r["ms_pooled_b2b"] = pooled
        r["time_err_b2b"] = (r["pred_ms"] - pooled) / pooled
    return r


def host_now(r: dict, solver, budget, model, scratch=None) -> dict:
    """The host bound timed again right after a point's measurements: a whole iteration of
    `none` at the profile's host k (:func:`swap.profiler.host_whole_now`), and the point's
    prediction with it (:meth:`swap.model.ComputeModel.with_host_whole`).  Writes into ``r``
    ``host_now_ms``, ``host_now_k``, ``pred_ms_host_now`` and ``time_err_host_now`` (against the
    pooled measurement where there is one); nothing where the model has no such bound (CPU
    profiles, the CUDA-graph model).  The host's speed drifts within a process (session 25:
    67-96 ms per small iteration while profiling, 117-123 ms minutes later), which the
    profile-time bound cannot follow."""
    from swap.profiler import host_whole_now
    hm = getattr(model, "host", None)
    if hm is None or hm.whole <= 0.0 or "pred_device_ms" not in r:
        return r
    _close(solver.net)
    try:
        whole, _ = host_whole_now(solver, budget, hm.whole_k, scratch=scratch)
    finally:
        solver.net.executor = None
        _free()
    if whole is None:
        r["host_now_error"] = f"`none` does not fit at k = {hm.whole_k}"
        return r
    pred = 1e3 * model.with_host_whole(whole).iteration(r["pred_device_ms"] / 1e3, r["k"])
    meas = r.get("ms_pooled", r["ms"])
    r.update(host_now_ms=1e3 * whole, host_now_k=hm.whole_k, pred_ms_host_now=pred,
             time_err_host_now=(pred - meas) / meas)
    return r


def _fits_device(g, k, reserve, gpu) -> tuple[bool, str]:
    """Whether `none` at k (every buffer, every convolution's workspace included, resident at
    once) fits the device's free memory with 2 GiB and 8 % to spare; (fits, the figures)."""
    from swap.plan import min_budget
    if not gpu:
        return True, ""
    import cupy as cp
    free, _ = cp.cuda.runtime.memGetInfo()
    need = min_budget(g.at(k), "none") + (reserve or 0) + (2 << 30)
    return need <= 0.92 * free, (f"none at {k} needs {need / 2**30:.2f} GiB with 2 GiB to "
                                 f"spare; 92 % of the free device memory is "
                                 f"{0.92 * free / 2**30:.2f} GiB")


def _replay_saved_gmap(td, granularity, search, recompute, log):
    """The k* that ``minicaffe plan --layout device`` takes from this run's profile (the GMAP
    it keeps, ``swap.tuner.with_gmap``), planned as that command plans it; None where the
    profile keeps none (a reused older one) or the model was rescaled for CUDA graphs."""
    saved = td.profile.meta.get("gmap")
    if saved is None or td.graph is not None:
        return None
    from swap.gmap import gmap_from_dict
    from swap.profiler import ScratchModel, max_batch_scratch
    from swap.tuner import profile_models, tune
    g = gmap_from_dict(saved)
    scratch = ScratchModel.from_profile(td.profile)
    host = td.profile.meta.get("host_budget")
    k_max = (None if host is None else
             max_batch_scratch(g, td.plan_budget, scratch, host_budget=host))
    model, pcie = profile_models(td.profile, g, granularity)
    k = tune(g, td.plan_budget, model, pcie, method=search, k_max=k_max, scratch=scratch,
             recompute=recompute).k_star
    log(f"AccUDNN: the profile's saved GMAP replays to k* = {k} (this run: "
        f"{td.decision.k_star})")
    return k


def run_net(name, k_base, budget, host_budget, iters, warmup, engine, mode, search,
            out_dir, r152_batch, profile_dir=None, granularity="segment",
            rounds: int = 2, recompute=(), max_rounds: int = MAX_ROUNDS) -> dict:
    from scripts.swap_budgets import _device, _solver
    from swap.gmap import build_gmap
    from swap.memory import caffe_max_batch
    from swap.profiler import set_batch_size
    from swap.runtime import set_lowering
    from swap.tuner import profile_models, train_dynamic, tune
    gpu = mode == "GPU"
    lines, log = collecting_log()

    t_start = time.time()
    solver = _solver(name, k_base, engine, mode)
    net = solver.net
    out = {"net": name, "k_base": k_base, "budget": budget, "host_budget": host_budget,
           "device": _device(gpu), "mode": mode, "engine": engine, "search": search,
           "granularity": granularity, "date": time.strftime("%Y-%m-%d"),
           "recompute": [recompute] if isinstance(recompute, str) else list(recompute)}
    # Caffe's accounting: its one-image im2col and its cuDNN workspaces (swap.runtime)
    set_lowering(net, "caffe")
    net.reshape()
    out["k_caffe"] = caffe_max_batch(build_gmap(net), budget)
    # ---- 1. Caffe mode
    k_none, tp_none = _none_max_k(solver, budget, gpu, log)
    out["none"] = _time_none_in_budget(solver, k_none, budget, tp_none, iters, warmup, gpu, log)
    k_none = out["none"]["k"]
    log(f"none at k_none = {k_none}: {out['none']['ms']:.1f} ms")
    # the same k with the chunked im2col of the other strategies, outside the budget: the
    # engine's own speed at Caffe's largest k (Caffe-faithful one-image GEMMs are slow here)
    out["none_chunked"] = _time_none(solver, k_none, None, "chunked", None, iters, warmup, gpu,
                                     workspace_budget=budget)
    # ---- 2. the tuner
    _close(net)
    if gpu:
        log(f"device memory before the tuner: {_memory_report()}")
    set_batch_size(net, k_base)
    reused = None
    if profile_dir:  # a profile saved by an earlier run: stage 1 (profiling) is skipped
        from swap.profiler import saved_profile
        path = saved_profile(profile_dir, name)
        if path is not None:
            reused = path
            log(f"AccUDNN: reusing the saved profile {path} (stage 1 skipped)")
    t0 = time.perf_counter()
    ex, td = train_dynamic(solver, budget, auto_batch=True, method=search, log=log,
                           host_budget=host_budget if gpu else None, keep_epochs=False,
                           profile=reused, granularity=granularity, recompute=recompute)
    t_tuner = time.perf_counter() - t0  # without profiling when a profile was reused
    dec = td.decision
    if isinstance(recompute, str):          # "auto": the layers the tuner chose, after it
        out["recompute"] = [recompute, *dec.recompute]
    g = ex.gmap
    g_dec = td.gmap if td.gmap is not None else g       # what the decision was made on
    # closed before the model is asked about other ks: its cuDNN searches there (the model's
    # probe) allocate their operands, which no executor's scratch reserve is sized for
    net.executor = None
    _free(ex)
    model, pcie = profile_models(td.profile, g, granularity)
    if td.model is not None:           # under --cuda-graph: scaled by the calibration
        model = td.model
    t0 = time.perf_counter()
    again = tune(g_dec, td.plan_budget, model, pcie, method=search, k_max=dec.k_max,
                 scratch=td.scratch, recompute=recompute)
    t_decide = time.perf_counter() - t0
    replay = _replay_saved_gmap(td, granularity, search, recompute, log)
    # the paper's k*, the largest stall-free k with its plan laid out and replayed (the
    # throughput objective's search stops at the fastest k, below it)
    paper = dec
    auto = isinstance(recompute, str)  # "auto": the paper's rule may keep another set of layers
    if auto or (dec.k_largest and dec.k_largest != dec.k_star):
        paper = tune(g_dec, td.plan_budget, model, pcie, method=search, k_max=dec.k_max,
                     scratch=td.scratch, objective="largest", recompute=recompute)
    S = td.scratch
    out["tuner"] = {"k_star": dec.k_star, "k_max": dec.k_max, "objective": dec.objective,
                    "k_largest": paper.k_star,
                    "largest_pred_img_s": paper.images_per_s, "seconds": t_tuner,
                    "decision_seconds": t_decide, "repeat_k_star": again.k_star,
                    "replay_k_star": replay,
                    "profiled_ks": list(td.profile.ks), "pcie_h2d": pcie.h2d, "pcie_d2h": pcie.d2h,
                    "describe": dec.describe(limit=6), "log": lines[-40:]}
    if gpu and engine == "CUDNN":      # cuDNN's algorithm choices so far (per-k workspaces)
        from minicaffe.cudnn import ops as cudnn_ops
        out["tuner"]["cudnn_cache"] = cudnn_ops.algo_cache_info()
    # --cuda-graph asked for (the environment reaches the solvers): whether the run kept it,
    # or the tuner predicted the eager iterations faster (swap.tuner.graph_or_eager)
    out["tuner"]["cuda_graph"] = bool(getattr(solver, "cuda_graph", False))
    out["tuner"]["cuda_graph_choice"] = next(
        (ln for ln in lines if ln.startswith(("cuda_graph: WARNING: the eager",
                                              "cuda_graph: graph launches predicted"))), None)
    if td.graph is not None:
        out["tuner"]["graph_calibration"] = {
            "k": td.graph.k, "measured_ms": 1e3 * td.graph.measured,
            "steps_ms": 1e3 * td.graph.steps, "tail_ms": 1e3 * td.graph.tail,
            "gap_us": 1e6 * td.graph.gap, "launches": td.graph.launches,
            "points": [[k, 1e6 * gap] for k, gap in td.graph.points]}
    hm = model.host
    out["tuner"]["host_model"] = None if hm is None else {
        "method": hm.method, "ks": list(hm.ks), "intercept_ms": 1e3 * hm.intercept,
        "slope_us": 1e6 * hm.slope, "meta": td.profile.meta.get("host_sums")}
    # ---- 3's ks: k*, the largest stall-free k (the paper's k*), k_none, k*/2
    ks = [dec.k_star] + sorted({k for k in (paper.k_star, k_none, max(1, dec.k_star // 2))
                                if k != dec.k_star}, reverse=True)
    # the model's cuDNN searches at these ks now, while no executor is installed (an installed
    # one refuses them, and the model would price those ks by its curves), before the profile
    # is saved with them; which ks the search prices is recorded
    for k in ks:
        model.step_times(g.at(k))
    if model.searched:
        key = (model.searched[0][0], model.searched[0][1])
        out["tuner"]["searched_at"] = {str(k): model.searched_time(key, k) is not None
                                       for k in ks}
    if reused:
        out["profile"] = os.path.relpath(reused, REPO)
        out["profile_reused"] = True
        # the host's issue time was taken in this run, or cuDNN searched more ks for the model
        if td.profile.host_samples or getattr(td.profile.search_probe, "ks", None):
            prof_path = os.path.join(out_dir, f"{name}_profile.json")
            td.profile.save(prof_path)
            out["profile_with_host"] = os.path.relpath(prof_path, REPO)
    else:
        prof_path = os.path.join(out_dir, f"{name}_profile.json")
        td.profile.save(prof_path)
        out["profile"] = os.path.relpath(prof_path, REPO)
    json_path = os.path.join(out_dir, f"{name}.json")
    out["partial"] = True
    _save_json(json_path, out)
    if gpu:
        log(f"device memory after the tuner: {_memory_report()}")
    # ---- 3. model error at k*, the largest stall-free k (the paper's k*), k_none, k*/2
    # (each plan from the same model)
    out["dynamic"] = []
    # at k* and at the paper's k, the decisions tune() laid out and replayed (the paper's
    # may have needed a larger layout margin than plan_at's: AlexNet at 1639, session 16)
    decided = {paper.k_star: paper, dec.k_star: dec}
    for k in ks:
        r = dynamic_point(solver, decided, g, k, td, model, pcie, budget, iters, warmup, gpu)
        if "error" in r:
            log(f"dynamic at k = {k}: {r['error']}")
        else:
            log(f"dynamic at k = {k}: measured {r['ms']:.1f} ms, predicted {r['pred_ms']:.1f} ms"
                f" ({100 * r['time_err']:+.1f} %); peak in use {r['peak_in_use'] / 2**30:.2f} "
                f"GiB, predicted {r['pred_peak'] / 2**30:.2f} GiB")
        # ---- 4. none at the same k, same lowering, where it fits the device
        fits, why = (_fits_device(g, k, S(k) if S is not None else None, gpu)
                     if "error" not in r else (False, ""))
        reference = None
        if fits:
            reference = lambda: _time_none(solver, k, None, "chunked", None, iters,  # noqa: E731
                                           warmup, gpu, workspace_budget=budget)
        elif why:
            r["none_skipped"] = why
            # no swapping without Caffe's per-layer workspaces: every map kept
            kept, why_kept = _fits_device_kept(g, k, S(k) if S is not None else None, gpu)
            if kept:
                r["no_stall_reference"] = "kept"
                reference = lambda: _time_kept(solver, k, iters, warmup, gpu,  # noqa: E731
                                               budget)
            log(f"dynamic at k = {k}: no `none` beside it: {why}"
                + ("; every feature map kept instead" if kept else f"; nor {why_kept}"))
        if reference is not None:
            try:
                no_stall(r, lambda: dynamic_point(solver, decided, g, k, td, model, pcie, budget,
                                                  iters, warmup, gpu), reference, rounds,
                         max(rounds, max_rounds))
            except Exception as e:
                r["none_error"] = f"{type(e).__name__}: {e}"[:400]
        if "error" not in r:
            try:
                host_now(r, solver, budget, model, S)
            except Exception as e:            # recorded: the point stands without it
                r["host_now_error"] = f"{type(e).__name__}: {e}"[:400]
        out["dynamic"].append(r)
        _save_json(json_path, out)
        if gpu:
            log(f"device memory after k = {k}: {_memory_report()}")
    # ---- 5. the paper's ResNet-152 point: least memory at <= 3 % slowdown
    if r152_batch and name == "resnet152":
        try:
            out["at_batch"] = _least_memory(solver, g, r152_batch, model, pcie, S, iters,
                                            warmup, gpu, log)
        except Exception as e:            # recorded: the rows above are kept
            _close(net)
            out["at_batch"] = {"k": r152_batch, "error": f"{type(e).__name__}: {e}"[:600]}
            if gpu:
                out["at_batch"]["memory_after_close"] = _memory_report()
            log(f"least memory at k = {r152_batch}: {out['at_batch']['error']}")
    out["seconds"] = time.time() - t_start
    out.pop("partial", None)
    _save_json(os.path.join(out_dir, f"{name}.json"), out)
    return out


def _save_json(path, out: dict):
    """``out`` to ``path`` atomically (a temporary file beside it, then a rename).
    :func:`run_net` writes it after the tuner and after every measured point, marked
    ``"partial": true`` until the end: a run killed midway (a device call's time limit)
    keeps the tuner's decision and the points it measured."""
    tmp = f"{path}.tmp{os.getpid()}"
    with open(tmp, "w") as f:
        json.dump(out, f, indent=1, default=str)
    os.replace(tmp, path)


def _least_memory(solver, g, k, model, pcie, S, iters, warmup, gpu, log) -> dict:
    """The smallest budget whose dynamic plan at k is predicted within SLOWDOWN of the compute
    alone; measured against `none` at k (chunked lowering), stepping up the budget when the
    measurement is slower than SLOWDOWN."""
    from swap.plan import BudgetError, min_budget
    from swap.tuner import plan_at
    reserve = S(k) if S is not None else 0
    hi = min_budget(g.at(k), "none") + reserve
    lo = min_budget(g.at(k), "naive") + reserve
    n = _time_none(solver, k, None, "chunked", None, iters, warmup, gpu)
    grid = [int(lo * (hi / lo) ** (i / 24)) for i in range(25)]
    ok = []
    for b in grid:
        try:
            d = plan_at(g, k, b, model, pcie, scratch=S)
        except BudgetError:
            continue
        # the timeline alone (stalls against compute): the model's time outside the steps,
        # in d.t_iter, is the same with or without swapping
        if (d.timeline.t_iter <= SLOWDOWN * d.timeline.t_model
                and d.plan.arena_bytes + reserve <= b):
            ok.append((b, d))
    res = {"k": k, "none_ms": n["ms"], "none_arena": n["arena"], "tries": []}
    for b, d in ok[:4]:
        try:
            r = _measure_dynamic(solver, d, b, b, reserve or None, iters, warmup, gpu,
                                 transients=S.expected if S is not None else None)
        except Exception as e:
            res["tries"].append({"budget": b, "error": f"{type(e).__name__}: {e}"[:300]})
            _close(solver.net)
            continue
        r["slowdown"] = r["ms"] / n["ms"]
        res["tries"].append(r)
        log(f"resnet152 k = {k}: budget {b / 2**30:.2f} GiB: {r['ms']:.1f} ms against none "
            f"{n['ms']:.1f} ms ({r['slowdown']:.3f}x), offloaded "
            f"{100 * r['offload_fraction']:.0f} % of the feature-map bytes")
        if r["slowdown"] <= SLOWDOWN:
            res["chosen"] = r
            break
    return res


def run_torch_peers(name, k, iters, warmup) -> dict:
    """PyTorch eager and save_on_cpu at ``k``: "same_eager" / "same_save_on_cpu" on the
    prototxt's own network, "eager" / "save_on_cpu" on torchvision's (where it is installed)."""
    from scripts.bench_throughput import run_torch, torch_available
    out = {"net": name, "k": k}
    runs = [("same_eager", False, "prototxt"), ("same_save_on_cpu", True, "prototxt")]
    if torch_available("torchvision"):
        runs += [("eager", False, "torchvision"), ("save_on_cpu", True, "torchvision")]
    for key, flag, arch in runs:
        try:
            r = run_torch(name, k, iters, warmup, save_on_cpu=flag, arch=arch)
            out[key] = {"ms": r["ms"], "images_per_s": k * 1e3 / r["ms"],
                        "peak_bytes": r["peak_bytes"]}
        except Exception as e:
            out[key] = {"error": f"{type(e).__name__}: {e}"[:300]}
            try:
                import torch
                torch.cuda.empty_cache()
            except Exception:
                pass
    return out


# ----------------------------------------------------------------- parent
def _child(args, extra, gpu_id, timeout, tag, script=__file__):
    """Run ``script`` (this one by default) with ``extra`` on GPU ``gpu_id``: (RESULT, None)
    or (None, why)."""
    env = dict(os.environ)
    if gpu_id is not None:
        env["CUDA_VISIBLE_DEVICES"] = str(gpu_id)
    cmd = [sys.executable, os.path.abspath(script)] + extra
    t0 = time.time()
    try:
        p = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, cwd=REPO,
                           env=env)
    except subprocess.TimeoutExpired as e:
        err = (e.stderr or b"")
        err = err.decode(errors="replace") if isinstance(err, bytes) else err
        return None, f"timed out after {timeout}s; last lines: " + " | ".join(
            err.strip().splitlines()[-4:])
    res = [ln for ln in p.stdout.splitlines() if ln.startswith("RESULT ")]
    if p.returncode != 0 or not res:
        why = " | ".join((p.stderr or p.stdout).strip().splitlines()[-6:])
        # the whole of the child's output, its log and traceback, beside the tables: six
        # lines of a traceback do not say which stage failed
        out_dir = getattr(args, "out", None)
        if out_dir:
            name = "".join(c if c.isalnum() else "_" for c in tag).strip("_")
            path = os.path.join(out_dir, f"failed_{name}.log")
            try:
                os.makedirs(out_dir, exist_ok=True)
                with open(path, "w") as f:
                    f.write(p.stdout + "\n--- stderr ---\n" + p.stderr)
                why = f"(whole output: {path}) {why}"
            except OSError:
                pass
        return None, why
    print(f"{tag}: done in {time.time() - t0:.0f}s", flush=True)
    return json.loads(res[0][len("RESULT "):]), None


def run_side_by_side(nets, gpus, job) -> float:
    """``job(name, k, gpu_id)`` for every (name, k) of ``nets``, each in a thread that holds one
    of ``gpus`` while it runs (so networks run side by side, one per GPU); returns the seconds
    all of them took."""
    free = queue.Queue()
    for g in gpus:
        free.put(g)

    def work(name, k):
        gpu_id = free.get()
        try:
            job(name, k, gpu_id)
        finally:
            free.put(gpu_id)

    t0 = time.time()
    threads = [threading.Thread(target=work, args=(n, k)) for n, k in nets]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return time.time() - t0


def default_host_budget(n_gpus: int, n_nets: int) -> str:
    """Pinned host memory per network: half the RAM, shared by the networks running at once."""
    return str(os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE") // 2
               // max(1, min(n_gpus, n_nets)))


def work_plan(args, default_nets: str, mode: str):
    """(nets as [name, k] pairs, GPU ids, pinned host budget per network) from the common
    options --nets, --gpus and --host-budget."""
    nets = [s.split(":") for s in (args.nets or default_nets).split(",") if s.strip()]
    gpus = [g.strip() for g in args.gpus.split(",") if g.strip()] if mode == "GPU" else [None]
    hb = args.host_budget
    if hb is None and mode == "GPU":
        hb = default_host_budget(len(gpus), len(nets))
    return nets, gpus, hb


def _fmt(x, spec):
    return "-" if x is None else format(x, spec)


def write_tables(results, peers, csv_path, md_path, header):
    import csv
    rows = []
    for r in results:
        t = r["tuner"]
        dyn = {d["k"]: d for d in r["dynamic"]}
        star = dyn.get(t["k_star"], {})
        p = peers.get(r["net"], {})
        soc = p.get("save_on_cpu", {}).get("images_per_s")
        eag = p.get("eager", {}).get("images_per_s")
        same_soc = p.get("same_save_on_cpu", {}).get("images_per_s")
        same_eag = p.get("same_eager", {}).get("images_per_s")
        nc = r.get("none_chunked", {}).get("images_per_s")
        rows.append({
            "net": r["net"], "k_caffe": r["k_caffe"], "k_none": r["none"]["k"],
            "none_img_s": r["none"]["images_per_s"], "none_chunked_img_s": nc,
            "k_star": t["k_star"], "k_max": t["k_max"],
            "dyn_img_s": star.get("images_per_s"),
            "k_largest": t.get("k_largest", t["k_star"]),
            "largest_img_s": dyn.get(t.get("k_largest", t["k_star"]), {}).get("images_per_s"),
            "ratio": t["k_star"] / r["none"]["k"], "paper_ratio": PAPER_RATIO.get(r["net"]),
            "speed_ratio": (star["images_per_s"] / nc if nc and "images_per_s" in star
                            else None),
            "torch_eager_img_s": eag, "torch_save_on_cpu_img_s": soc,
            "vs_save_on_cpu": (star["images_per_s"] / soc if soc and "images_per_s" in star
                               else None),
            "torch_same_eager_img_s": same_eag, "torch_same_save_on_cpu_img_s": same_soc,
            "vs_same_save_on_cpu": (star["images_per_s"] / same_soc
                                    if same_soc and "images_per_s" in star else None),
            "tuner_s": t["seconds"], "decision_s": t["decision_seconds"],
            "recompute": ",".join(r.get("recompute") or ())})
    if csv_path:
        os.makedirs(os.path.dirname(os.path.abspath(csv_path)), exist_ok=True)
        with open(csv_path, "w", newline="") as f:
            w = csv.DictWriter(f, fieldnames=list(rows[0]) if rows else ["net"])
            w.writeheader()
            w.writerows(rows)
    md = [header, "", "**Table 1**: `none` = Caffe's allocation (one-image "
          "im2col) at its largest verified k; its img/s with that im2col, and with the chunked "
          "im2col of the other strategies at the same k (outside the budget: the engine's own "
          "speed); `dynamic` = the tuner's k*; img/s ratio = dynamic / none chunked.", "",
          "| net | k Caffe accounting | k none | none img/s (Caffe im2col) | none img/s (chunked) "
          "| k* | dynamic img/s | paper's k*: largest stall-free k (img/s) | k*/k_none | paper "
          "| img/s ratio | PyTorch eager img/s (torchvision) "
          "| save_on_cpu img/s (torchvision) | dynamic/save_on_cpu (torchvision) "
          "| PyTorch eager img/s (same net) | save_on_cpu img/s (same net) "
          "| dynamic/save_on_cpu (same net) | tuner s (decision s) |",
          "|" + "---|" * 18]
    for x in rows:
        shown = x["net"] + (f" (recomputing {x['recompute']})" if x["recompute"] else "")
        md.append(f"| {shown} | {x['k_caffe']} | {x['k_none']} | {x['none_img_s']:.0f} | "
                  f"{_fmt(x['none_chunked_img_s'], '.0f')} | "
                  f"{x['k_star']} | {_fmt(x['dyn_img_s'], '.0f')} | "
                  f"{x['k_largest']} ({_fmt(x['largest_img_s'], '.0f')} img/s, "
                  f"{x['k_largest'] / x['k_none']:.2f} x k_none) | {x['ratio']:.2f} | "
                  f"{_fmt(x['paper_ratio'], '.2f')} | {_fmt(x['speed_ratio'], '.2f')} | "
                  f"{_fmt(x['torch_eager_img_s'], '.0f')} | "
                  f"{_fmt(x['torch_save_on_cpu_img_s'], '.0f')} | "
                  f"{_fmt(x['vs_save_on_cpu'], '.1f')} | "
                  f"{_fmt(x['torch_same_eager_img_s'], '.0f')} | "
                  f"{_fmt(x['torch_same_save_on_cpu_img_s'], '.0f')} | "
                  f"{_fmt(x['vs_same_save_on_cpu'], '.1f')} | {x['tuner_s']:.0f} "
                  f"({x['decision_s']:.1f}) |")
    md += ["", "**Model error and no stall** (dynamic plans from the same profile; `none` at the "
           "same k with the same chunked im2col where it fits the whole device; where it does "
           "not, as it holds every convolution's workspace at once, the plan that keeps every "
           "feature map, marked \"every map kept\"):", "",
           "| net | k | measured ms: median of the rounds' dynamic steps (first round) | "
           "predicted ms | time error (against the first round) | measured peak GiB (plan in use "
           "+ transients) | predicted peak GiB (eq. 4 + S(k)) | memory error | arena high-water "
           "GiB | budget GiB | feature-map bytes offloaded | none ms | dynamic/none | "
           "time error with the host bound timed again after the point (host ms) |",
           "|" + "---|" * 14]
    for r in results:
        for d in r["dynamic"]:
            if "error" in d:
                md.append(f"| {r['net']} | {d['k']} | failed: {d['error'][:120]} |" + " |" * 11)
                continue
            if "ms_pooled" in d:
                meas = f"{d['ms_pooled']:.1f} ({d['ms']:.1f})"
                err = f"{100 * d['time_err_pooled']:+.1f} % ({100 * d['time_err']:+.1f} %)"
            else:
                meas, err = f"{d['ms']:.1f}", f"{100 * d['time_err']:+.1f} %"
            md.append(
                f"| {r['net']} | {d['k']} | {meas} | {d['pred_ms']:.1f} | "
                f"{err} | {d['meas_total'] / 2**30:.2f} | "
                f"{d['pred_total'] / 2**30:.2f} | {100 * d['peak_err']:+.1f} % | "
                f"{d['high_water'] / 2**30:.2f} | "
                f"{d['budget'] / 2**30:.2f} | {100 * d['offload_fraction']:.0f} % | "
                f"{_fmt(d.get('none_ms'), '.1f')}"
                + (" (every map kept)" if d.get("no_stall_reference") == "kept" else "")
                + f" | {_fmt(d.get('slowdown'), '.3f')} | "
                + (f"{100 * d['time_err_host_now']:+.1f} % ({d['host_now_ms']:.1f} at k = "
                   f"{d['host_now_k']})" if "time_err_host_now" in d else "-") + " |")
    b2b = [(r["net"], d) for r in results for d in r["dynamic"] if "ms_pooled_b2b" in d]
    if b2b:
        md += ["", "**Back to back** (the same points, their steps issued back to back as in "
               "training, one wait at the end of each measurement's steps, pooled over the "
               "rounds; the table above waits after every step):", "",
               "| net | k | measured ms, each step waited for | measured ms, back to back | "
               "predicted ms | time error, back to back | dynamic/none, back to back |",
               "|" + "---|" * 7]
        for net, d in b2b:
            md.append(f"| {net} | {d['k']} | {d['ms_pooled']:.1f} | {d['ms_pooled_b2b']:.1f} | "
                      f"{d['pred_ms']:.1f} | {100 * d['time_err_b2b']:+.1f} % | "
                      f"{_fmt(d.get('slowdown_b2b'), '.3f')} |")
    for r in results:
        choice = r["tuner"].get("cuda_graph_choice")
        if choice and not r["tuner"].get("cuda_graph", True):
            md += ["", f"**{r['net']} ran eagerly under --cuda-graph**: "
                   + choice[len("cuda_graph: WARNING: "):] + " (swap.tuner.graph_or_eager)."]
        c = r["tuner"].get("graph_calibration")
        if c:
            md += ["", f"**{r['net']} as CUDA graph launches**: calibrated at k = {c['k']} "
                   f"(every map kept): {c['measured_ms']:.1f} ms per iteration against "
                   f"{c['steps_ms']:.1f} ms of eager profiled steps + {c['tail_ms']:.1f} ms "
                   f"update: every step of the model {c['gap_us']:.2f} us shorter, no host bound "
                   "(swap.tuner.calibrate_graph)."]
    for r in results:
        a = r.get("at_batch")
        if not a:
            continue
        if "error" in a:
            md += ["", f"**{r['net']} at batch {a['k']}**: failed: {a['error'][:300]}"]
            continue
        md += ["", f"**{r['net']} at batch {a['k']}**: `none` {a['none_ms']:.1f} ms in "
               f"{a['none_arena'] / 2**30:.2f} GiB (chunked im2col); the smallest budgets "
               f"predicted within {SLOWDOWN:.2f}x, measured:", "",
               "| budget GiB | arena high-water GiB | ms | slowdown | feature-map bytes "
               "offloaded |", "|---|---|---|---|---|"]
        for t in a["tries"]:
            if "error" in t:
                md.append(f"| {t['budget'] / 2**30:.2f} | failed: {t['error'][:100]} | | | |")
                continue
            md.append(f"| {t['budget'] / 2**30:.2f} | {t['high_water'] / 2**30:.2f} | "
                      f"{t['ms']:.1f} | {t['slowdown']:.3f} | {100 * t['offload_fraction']:.0f} % |")
    if md_path:
        with open(md_path, "w") as f:
            f.write("\n".join(md) + "\n")
        if rows:
            plot_table1(rows, os.path.splitext(md_path)[0] + ".png", header.split(" (`")[0])
    return rows, "\n".join(md)


def plot_table1(rows, path, title=None) -> bool:
    """Table 1 beside the paper's, as three panels per network: k*/k_none (paper: AccUDNN's k*
    over Caffe's max k), images/s at k* over `none`'s at k_none (paper: AccUDNN over Caffe;
    here against `none` with Caffe's im2col and with the chunked one), and dynamic over PyTorch
    save_on_cpu at k* (the issue's target line at 5).  False without matplotlib."""
    from scripts._figures import pyplot, save
    plt = pyplot()
    if plt is None:
        return False
    names = [r["net"] + ("\n+ " + r["recompute"] if r.get("recompute") else "") for r in rows]
    x = list(range(len(rows)))

    def paper(net, what):
        p = PAPER_TABLE1.get(net)
        if p is None:
            return 0.0
        return p[0] / p[2] if what == "k" else p[1] / p[3]

    def ratio(a, b):
        return a / b if a and b else 0.0

    def largest(r):
        """The largest stall-free k (the paper's k*) over k_none: write_tables' ``k_largest``
        or the saved table's "K (... img/s, R x k_none)" cell."""
        k = r.get("k_largest")
        if k is None and r.get("largest"):
            k = float(str(r["largest"]).split()[0])
        return ratio(k, r.get("k_none"))

    fig, axes = plt.subplots(1, 3, figsize=(14, 3.8))
    w = 0.27
    ax = axes[0]
    ax.bar([i - w for i in x], [r["ratio"] or 0 for r in rows], w,
           label="here: k* (most img/s) / k_none")
    ax.bar(x, [largest(r) for r in rows], w, label="here: largest stall-free k / k_none")
    ax.bar([i + w for i in x], [paper(r["net"], "k") for r in rows], w,
           label="paper (M40): k*/Caffe max k")
    ax.set_title("minibatch gain at a 12 GB budget")
    ax = axes[1]
    ax.bar([i - w for i in x], [ratio(r["dyn_img_s"], r["none_img_s"]) for r in rows], w,
           label="here: over none (Caffe im2col)")
    ax.bar(x, [ratio(r["dyn_img_s"], r["none_chunked_img_s"]) for r in rows], w,
           label="here: over none (chunked im2col)")
    ax.bar([i + w for i in x], [paper(r["net"], "img") for r in rows], w,
           label="paper (M40): AccUDNN over Caffe")
    ax.axhline(1.0, color="k", lw=0.8)
    ax.set_title("images/s at k* over none at k_none")
    ax = axes[2]
    ax.bar([i - w for i in x], [r.get("vs_same_save_on_cpu") or 0 for r in rows], w,
           label="dynamic / PyTorch save_on_cpu, same net, at k*")
    ax.bar(x, [r["vs_save_on_cpu"] or 0 for r in rows], w,
           label="dynamic / save_on_cpu of torchvision's model")
    ax.bar([i + w for i in x], [ratio(r.get("torch_same_eager_img_s"),
                                      r.get("torch_same_save_on_cpu_img_s")) for r in rows],
           w, color="tab:gray", label="PyTorch eager / its save_on_cpu (same net)")
    ax.axhline(SAVE_ON_CPU_TARGET, color="tab:red", ls="--", lw=1, label="target 5x")
    ax.set_title("against PyTorch's offloading")
    for ax in axes:
        ax.set_xticks(x)
        ax.set_xticklabels(names, rotation=30, fontsize=8, ha="right")
        ax.legend(fontsize=7)
        ax.grid(axis="y", alpha=0.3)
    save(fig, path, title)
    return True


# Table 1's columns in tuner_table.md, as write_tables writes them (18 cells; 15 before
# session 26, without the same-network peer)
_MD_COLUMNS_OLD = ("net", "k_caffe", "k_none", "none_img_s", "none_chunked_img_s", "k_star",
                   "dyn_img_s", "largest", "ratio", "paper_ratio", "speed_ratio",
                   "torch_eager_img_s", "torch_save_on_cpu_img_s", "vs_save_on_cpu", "tuner")
_MD_SAME = ("torch_same_eager_img_s", "torch_same_save_on_cpu_img_s", "vs_same_save_on_cpu")
_MD_COLUMNS = _MD_COLUMNS_OLD[:-1] + _MD_SAME + _MD_COLUMNS_OLD[-1:]
_MD_TEXT = ("net", "largest", "tuner")


def saved_runs(pattern: str):
    """``(base, run, profile path)`` of every saved run whose profile lies beside it, in name
    order: ``pattern`` globs the profiles (``.../*_profile.json*``, gzipped or not); a run is
    ``BASE.json`` as this script writes it (``out/tuner/NET.json``, or renamed with a prefix
    in docs/results) with its ``dynamic`` points.  For the replays in docs/results."""
    import glob
    for prof in sorted(glob.glob(pattern)):
        base = prof.replace("_profile.json.gz", "").replace("_profile.json", "")
        if not os.path.exists(base + ".json"):
            continue
        with open(base + ".json") as f:
            run = json.load(f)
        if "dynamic" in run:
            yield base, run, prof


def kept_prediction(model, profile, k: int) -> float:
    """Seconds of an iteration at ``k`` with every map kept, as ``model`` predicts it from
    ``profile``'s steps (each step's FLOPs scaled from its first sample; the time outside the
    steps and the host bound included; no plan, so no copies).  For the replays in
    docs/results."""
    first = {}
    for c in profile.compute:
        first.setdefault(c.step, c)
    steps = {s.step: s for s in profile.steps}
    dev = sum(model.step_time(steps[j], c.flops * k / c.k, k=k) for j, c in first.items())
    return model.iteration(dev, k)


def read_table1_md(paths) -> list[dict]:
    """The Table 1 rows of saved ``tuner_table.md`` files (one network per row; a later file's
    row replaces an earlier one of the same network), for :func:`plot_table1`."""
    by_net: dict = {}
    for path in paths:
        with open(path) as f:
            for line in f:
                cells = [c.strip() for c in line.strip().strip("|").split("|")]
                name = cells[0].split(" (recomputing ")[0]      # write_tables' label
                columns = {len(_MD_COLUMNS): _MD_COLUMNS,
                           len(_MD_COLUMNS_OLD): _MD_COLUMNS_OLD}.get(len(cells))
                if columns is None or name not in PAPER_RATIO:
                    continue
                row = dict.fromkeys(_MD_SAME)
                row.update(zip(columns, cells))
                row["net"] = name
                row["recompute"] = cells[0][len(name):].strip(" ()").replace("recomputing ", "")
                for k in columns:
                    if k in _MD_TEXT:
                        continue
                    try:
                        row[k] = float(row[k])
                    except ValueError:      # "-": not measured
                        row[k] = None
                row["source"] = path
                by_net[row["net"]] = row
    order = [n for n in PAPER_RATIO if n in by_net]
    return [by_net[n] for n in order]


def redraw(paths, out_dir) -> int:
    """``--redraw``: Table 1 from saved tables, with the paper's columns (table1.csv, .png)."""
    import csv
    rows = read_table1_md(paths)
    if not rows:
        print(f"no Table 1 rows in {', '.join(paths)}", file=sys.stderr)
        return 1
    os.makedirs(out_dir, exist_ok=True)
    fields = list(_MD_COLUMNS) + ["recompute", "paper_k_star", "paper_img_s", "paper_caffe_k",
                                  "paper_caffe_img_s", "source"]
    with open(os.path.join(out_dir, "table1.csv"), "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=fields)
        w.writeheader()
        for r in rows:
            p = PAPER_TABLE1.get(r["net"], (None,) * 4)
            w.writerow(dict(r, paper_k_star=p[0], paper_img_s=p[1], paper_caffe_k=p[2],
                            paper_caffe_img_s=p[3]))
    png = os.path.join(out_dir, "table1.png")
    plot_table1(rows, png, "Table 1 at 12 GiB (from " + ", ".join(
        sorted({os.path.basename(os.path.dirname(p)) or "." for p in paths})) + ")")
    for r in rows:
        print(f"{r['net']}: k*/k_none {r['ratio']:.2f} (paper {r['paper_ratio']:.2f}), "
              f"dynamic/save_on_cpu {r.get('vs_same_save_on_cpu') or 0:.1f} (same net), "
              f"{r['vs_save_on_cpu'] or 0:.1f} (torchvision)  [{r['source']}]")
    print(f"wrote {png}")
    return 0


def recompute_of(specs) -> dict:
    """``["vgg16=conv1_1", "alexnet=conv1"]`` -> {"vgg16": ("conv1_1",), "alexnet": ("conv1",)};
    ``NET=auto`` -> "auto" (the tuner chooses, swap.tuner.recompute_sets)."""
    out = {}
    for spec in specs:
        net, sep, layers = spec.partition("=")
        if not sep or not net.strip() or not layers.strip():
            raise SystemExit(f"--recompute {spec!r}: give NET=LAYER[,LAYER...] or NET=auto, "
                             "e.g. vgg16=conv1_1")
        names = tuple(x.strip() for x in layers.split(",") if x.strip())
        if any(x.lower() == "auto" for x in names) and len(names) > 1:
            raise SystemExit(f"--recompute {spec!r}: 'auto' lets the tuner choose the layers; "
                             "give it alone")
        out[net.strip()] = "auto" if names[0].lower() == "auto" else names
    return out


def graph_env(on: bool, env=None) -> None:
    """``--cuda-graph``: the solvers of this process and of the per-network processes it
    starts (they inherit the environment) take ``MINICAFFE_CUDA_GRAPH=1``."""
    if on:
        (os.environ if env is None else env)["MINICAFFE_CUDA_GRAPH"] = "1"


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--nets", default=None, help=f"name:k_base,... (default {DEFAULT_NETS})")
    ap.add_argument("--budget", default="12G")
    ap.add_argument("--host-budget", default=None,
                    help="pinned host memory per network (default: half the RAM shared by the "
                         "GPUs running at once)")
    ap.add_argument("--gpus", default="0", help="GPU ids to run networks on side by side")
    ap.add_argument("--iters", type=int, default=5)
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument("--engine", default="CAFFE", choices=("CAFFE", "CUDNN"))
    ap.add_argument("--search", default="bisect", choices=("linear", "bisect"))
    ap.add_argument("--r152-batch", type=int, default=32)
    ap.add_argument("--no-torch", action="store_true")
    ap.add_argument("--timeout", type=int, default=560, help="seconds per network")
    ap.add_argument("--quick", action="store_true", help="CPU, a tiny net (the test suite)")
    ap.add_argument("--out", default=os.path.join(REPO, "docs", "results"))
    ap.add_argument("--profiles", default=None,
                    help="a folder of saved profiles (NAME_profile.json, as this script writes "
                         "them, or NAME_profile.json.gz): the tuner reuses them instead of "
                         "profiling again")
    ap.add_argument("--granularity", default="segment", choices=("type", "step", "segment"),
                    help="throughput curves per step (the tuner's default) or per layer type "
                         "(the paper's)")
    ap.add_argument("--no-stall-rounds", type=int, default=2,
                    help="rounds of dynamic against none at each k, ordered ABBA (1: one each)")
    ap.add_argument("--no-stall-max-rounds", type=int, default=MAX_ROUNDS,
                    help="two more rounds while a strategy's round medians spread by more than "
                         f"{100 * ROUND_SPREAD:.0f} %%, up to this many (the --no-stall-rounds "
                         "value: never more)")
    ap.add_argument("--recompute", action="append", default=[], metavar="NET=LAYERS",
                    help="the dynamic plans of NET rebuild these forward layers (comma-"
                         "separated, each with its in-place chain) in backward instead of keeping "
                         "or offloading them, e.g. vgg16=conv1_1 (repeatable)")
    ap.add_argument("--cuda-graph", action="store_true",
                    help="minicaffe's timed iterations run as CUDA graph launches (under a plan: "
                         "swap/graph.py; without one: minicaffe/graph.py), as with "
                         "MINICAFFE_CUDA_GRAPH=1; the profiling iterations stay eager")
    ap.add_argument("--one", default=None, help=argparse.SUPPRESS)
    ap.add_argument("--torch-one", default=None, help=argparse.SUPPRESS)
    ap.add_argument("--mode", default=None, help=argparse.SUPPRESS)
    ap.add_argument("--redraw", nargs="+", default=None, metavar="MD",
                    help="no run: draw Table 1 (table1.png, table1.csv in --out) from saved "
                         "tuner_table.md files, a later file's row replacing an earlier one's")
    args = ap.parse_args(argv)
    if args.redraw:
        return redraw(args.redraw, args.out)
    graph_env(args.cuda_graph)
    from swap.memory import parse_bytes
    mode = args.mode or ("CPU" if args.quick else "GPU")
    if args.quick and args.budget == "12G":
        args.budget = "40M"         # a budget the tiny net outgrows at a few dozen images
    out_dir = os.path.join(args.out, "tuner")
    os.makedirs(out_dir, exist_ok=True)
    budget = parse_bytes(args.budget)
    if args.one:
        name, k = args.one.split(":")
        hb = parse_bytes(args.host_budget) if args.host_budget else None
        r = run_net(name, int(k), budget, hb, args.iters, args.warmup, args.engine, mode,
                    args.search, out_dir, args.r152_batch, args.profiles, args.granularity,
                    args.no_stall_rounds, recompute_of(args.recompute).get(name, ()),
                    args.no_stall_max_rounds)
        print("RESULT " + json.dumps(r), flush=True)
        return 0
    if args.torch_one:
        name, k = args.torch_one.split(":")
        print("RESULT " + json.dumps(run_torch_peers(name, int(k), args.iters, args.warmup)),
              flush=True)
        return 0
    nets, gpus, hb = work_plan(args, QUICK_NETS if args.quick else DEFAULT_NETS, mode)
    torch_ok = not args.no_torch and mode == "GPU"
    if torch_ok:
        from scripts.bench_throughput import torch_available
        torch_ok = torch_available()
    results, peers, failures = {}, {}, []
    lock = threading.Lock()

    def job(name, k, gpu_id):
        extra = ["--one", f"{name}:{k}", "--budget", args.budget, "--iters", str(args.iters),
                 "--warmup", str(args.warmup), "--engine", args.engine, "--search",
                 args.search, "--r152-batch", str(args.r152_batch), "--mode", mode,
                 "--out", args.out, "--granularity", args.granularity,
                 "--no-stall-rounds", str(args.no_stall_rounds),
                 "--no-stall-max-rounds", str(args.no_stall_max_rounds)]
        if args.profiles:
            extra += ["--profiles", args.profiles]
        for spec in args.recompute:
            extra += ["--recompute", spec]
        if hb:
            extra += ["--host-budget", hb]
        r, err = _child(args, extra, gpu_id, args.timeout, f"{name} (GPU {gpu_id})")
        with lock:
            if r is None:
                failures.append((name, err))
                print(f"{name}: failed: {err}", flush=True)
                return
            results[name] = r
        if torch_ok:
            p, err = _child(args, ["--torch-one", f"{name}:{r['tuner']['k_star']}",
                                   "--iters", "3", "--warmup", "2"], gpu_id, 600,
                            f"{name} PyTorch at k* (GPU {gpu_id})")
            with lock:
                peers[name] = p if p is not None else {"error": err}

    seconds = run_side_by_side(nets, gpus, job)
    ordered = [results[n] for n, _ in nets if n in results]
    device = ordered[0]["device"] if ordered else "?"
    cmd = "python3 scripts/tuner_table.py " + " ".join(argv if argv is not None else sys.argv[1:])
    header = (f"Tuner table, {device}, {mode} mode, engine {args.engine}, budget {args.budget}, "
              f"{args.search} search, {args.granularity} curves, "
              f"{args.iters} timed iterations after {args.warmup}; "
              f"{len(gpus)} GPU(s) side by side (`{cmd.strip()}`, {time.strftime('%Y-%m-%d')})")
    _, md = write_tables(ordered, peers, os.path.join(args.out, "tuner_table.csv"),
                         os.path.join(args.out, "tuner_table.md"), header)
    print(md)
    for name, err in failures:
        print(f"FAILED {name}: {err}")
    print(f"{len(ordered)}/{len(nets)} networks in {seconds:.0f}s")
    return 0 if not failures else 1


if __name__ == "__main__":
    sys.exit(main())
