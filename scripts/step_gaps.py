"""Where an eager iteration's time goes beyond its layer steps, step by step (issue 5).

For each k: the plan "none" (nothing swapped; the convolutions lowered in chunks as the swap
plans lower them; outside any budget by default) runs ``warmup + iters`` training iterations
under the profiler's own timing hooks (:class:`swap.profiler._Instrument`: CUDA events around
every layer step on the GPU, ``perf_counter`` on the CPU), each timed pass behind the
profiler's device-side wait so that the events time the device rather than the host's pace
(``--no-head-start``: without it), then the same iterations again without hooks.  It prints

* the iteration without hooks (the time a user sees), the iteration with hooks, its head
  (before the first step) and tail (the solver update), the sum of the steps' own times and
  what is left between them (the device idle while the host issues the next step);
* with ``--profile``, the performance model's prediction from that saved profile beside it:
  the sum of its t_j(k), O(k) (the time outside the steps) and the host's issue time H(k), and
  the steps and layer types whose measured time differs most from t_j(k).

Written for ResNet-152 at k = 71 on the H200, which took 177.6 and 178.5 ms in sessions 42
and 44 against 169.0 predicted (the steps alone; steps plus O(k) say 177.5), where at k = 35
the prediction held (RESULTS "Session 44").

    python3 scripts/step_gaps.py --gpu --engine CUDNN --net resnet152 --k-base 16 --ks 35,71 \\
        --profile docs/results/tuner_s42/f/resnet152/tuner/resnet152_profile.json.gz \\
        --json out.json
    python3 scripts/step_gaps.py --quick                 # cifar10_quick on the CPU (the test)
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
from collections import defaultdict

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def measured_steps(prof, k: int) -> dict:
    """``(layer, phase) -> (type, median seconds over the recorded iterations)`` at ``k``."""
    info = {s.step: s for s in prof.steps}
    times = defaultdict(list)
    for c in prof.compute:
        if c.k == k:
            times[c.step].append(c.time)
    return {(info[j].layer, info[j].phase): (info[j].type, statistics.median(t))
            for j, t in times.items()}


def predicted_steps(prof, k: int, granularity: str) -> tuple[dict, float, float]:
    """``(layer, phase) -> t_j(k)`` of the model fitted on the saved profile ``prof`` (on the
    GMAP its run decided on), O(k) and H(k) in seconds."""
    from swap.gmap import gmap_from_dict
    from swap.tuner import profile_models
    saved = (prof.meta or {}).get("gmap")
    if saved is None:
        raise ValueError("--profile: this profile keeps no GMAP (profiles saved by train "
                         "--swap dynamic or tuner_table.py since session 30 do)")
    g = gmap_from_dict(saved)
    model, _ = profile_models(prof, g, granularity)
    at = g.at(k)
    t = model.step_times(at)
    return ({(s.name, s.phase): float(x) for s, x in zip(at.steps, t)},
            model.overhead_at(k), model.host_at(k))


def point(solver, k: int, budget, warmup: int, iters: int, gpu: bool,
          predicted=None, head_start: bool = True) -> dict:
    """One k: the hooked iterations' per-step times and the unhooked iteration (module doc).
    ``budget``: bytes, or None for none (as ``tuner_table.py`` times "none" above k_none,
    where it does not fit the device's budget).  ``head_start``: each hooked pass starts
    behind the profiler's device-side wait (:func:`swap.profiler.head_start_seconds`), so
    that the host has queued it and the events time the device, not the host's pace (as
    the copy calibration times its kept steps); without it, session 45's steps of ResNet-152
    came out 28 and 63 ms over the model at 35 and 71, mostly host-paced convolutions."""
    from scripts.tuner_table import _free, _timed
    from swap.profiler import _Instrument, _recorded_steps, set_batch_size, step_infos
    from swap.runtime import install
    set_batch_size(solver.net, k)
    ex = install(solver, "none", budget, lowering="chunked")
    try:
        inst = _Instrument(ex, k, head_start=head_start)
        try:
            _recorded_steps(inst, solver, warmup, iters)
        finally:
            inst.remove()
        info = {i.step: i for i in step_infos(ex.gmap)}
        times = defaultdict(list)
        for c in inst.compute:
            times[c.step].append(c.time)
        steps = {(info[j].layer, info[j].phase): (info[j].type, statistics.median(t))
                 for j, t in times.items()}
        runs = list(inst.solver_steps)
        waits = [float(w) for w in inst.head_starts]
        plain_ms, _ = _timed(solver, iters, warmup, gpu, back_to_back=False)
    finally:
        solver.net.executor = None
        _free(ex)
    hooked = statistics.median(s.seconds for s in runs)
    head = statistics.median(s.head for s in runs)
    tail = statistics.median(s.tail for s in runs)
    step_sum = sum(t for _, t in steps.values())
    r = {"k": k, "iteration_ms": plain_ms, "hooked_ms": 1e3 * hooked, "head_ms": 1e3 * head,
         "head_start_ms": 1e3 * statistics.median(waits) if waits else 0.0,
         "tail_ms": 1e3 * tail, "steps_ms": 1e3 * step_sum,
         "between_steps_ms": 1e3 * (hooked - head - tail - step_sum), "n_steps": len(steps)}
    if predicted is not None:
        pred, overhead, host = predicted
        common = [key for key in steps if key in pred]
        diff = sorted(((1e3 * (steps[key][1] - pred[key]), key) for key in common),
                      reverse=True)
        by_type = defaultdict(lambda: [0.0, 0.0])
        for key in common:
            typ = steps[key][0]
            by_type[(typ, key[1])][0] += 1e3 * steps[key][1]
            by_type[(typ, key[1])][1] += 1e3 * pred[key]
        r.update(pred_steps_ms=1e3 * sum(pred[key] for key in common),
                 pred_overhead_ms=1e3 * overhead, pred_host_ms=1e3 * host,
                 steps_matched=len(common), unmatched=len(steps) - len(common),
                 most_over=[{"layer": key[0], "phase": key[1], "type": steps[key][0],
                             "measured_ms": 1e3 * steps[key][1], "predicted_ms": 1e3 * pred[key],
                             "over_ms": d} for d, key in diff[:TOP]],
                 by_type=[{"type": t, "phase": ph, "measured_ms": m, "predicted_ms": p}
                          for (t, ph), (m, p) in sorted(by_type.items(),
                                                        key=lambda kv: kv[1][1] - kv[1][0])])
    return r


TOP = 15


def report(r: dict) -> str:
    lines = [f"k = {r['k']}: iteration {r['iteration_ms']:.1f} ms without hooks, "
             f"{r['hooked_ms']:.1f} with (head {r['head_ms']:.1f}"
             + (f", of it a device-side wait of {r['head_start_ms']:.1f}"
                if r.get("head_start_ms") else "")
             + f", tail {r['tail_ms']:.1f}); "
             f"{r['n_steps']} steps take {r['steps_ms']:.1f} ms, "
             f"{r['between_steps_ms']:.1f} ms between them"]
    if "pred_steps_ms" in r:
        lines.append(f"  model: steps {r['pred_steps_ms']:.1f} ms ({r['steps_matched']} matched, "
                     f"{r['unmatched']} not), O(k) {r['pred_overhead_ms']:.1f} ms, host H(k) "
                     f"{r['pred_host_ms']:.1f} ms; measured steps - predicted "
                     f"{r['steps_ms'] - r['pred_steps_ms']:+.1f} ms")
        lines.append("  steps most over their t_j(k) (ms measured / predicted):")
        lines += [f"    {d['layer']} {d['phase']} ({d['type']}): {d['measured_ms']:.3f} / "
                  f"{d['predicted_ms']:.3f} ({d['over_ms']:+.3f})" for d in r["most_over"]]
        lines.append("  by layer type and phase (ms measured / predicted):")
        lines += [f"    {d['type']} {d['phase']}: {d['measured_ms']:.2f} / {d['predicted_ms']:.2f}"
                  f" ({d['measured_ms'] - d['predicted_ms']:+.2f})" for d in r["by_type"]]
    return "\n".join(lines)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--net", default="resnet152")
    ap.add_argument("--k-base", type=int, default=16)
    ap.add_argument("--ks", default="35,71", help="comma-separated minibatch sizes")
    ap.add_argument("--profile", help="a saved profile: the model's t_j(k) beside the measured")
    ap.add_argument("--granularity", default="segment", choices=("type", "step", "segment"))
    ap.add_argument("--engine", default="CUDNN", choices=("CAFFE", "CUDNN"))
    ap.add_argument("--budget", default="none",
                    help="the plan's budget (default none: outside any budget, as tuner_table.py "
                         "times 'none' at the swap plans' k, where it does not fit 12 GiB)")
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument("--iters", type=int, default=5)
    ap.add_argument("--gpu", action="store_true")
    ap.add_argument("--no-head-start", action="store_true",
                    help="time the hooked passes without the profiler's device-side wait ahead "
                         "of each (the steps then carry the host's pace where it is slower)")
    ap.add_argument("--json", help="also write the rows to this JSON file")
    ap.add_argument("--quick", action="store_true",
                    help="cifar10_quick at k = 2 and 4 on the CPU, 1 warm-up, 2 iterations")
    args = ap.parse_args(argv)
    if args.quick:
        args.net, args.k_base, args.ks, args.engine = "cifar10_quick", 2, "2,4", "CAFFE"
        args.warmup, args.iters, args.gpu = 1, 2, False
    from minicaffe.cli import _size_flag
    from scripts.swap_budgets import _device, _solver
    from swap.profiler import Profile
    budget = None if args.budget == "none" else _size_flag(args.budget, "--budget")
    ks = [int(x) for x in args.ks.split(",") if x.strip()]
    mode = "GPU" if args.gpu else "CPU"
    saved = Profile.load(args.profile) if args.profile else None
    solver = _solver(args.net, args.k_base, args.engine, mode)
    rows = []
    print(f"{args.net} on {_device(args.gpu)} ({args.engine}), budget {args.budget}"
          + (f", model from {args.profile}" if saved else ""))
    for k in ks:
        pred = predicted_steps(saved, k, args.granularity) if saved else None
        r = point(solver, k, budget, args.warmup, args.iters, args.gpu, pred,
                  head_start=not args.no_head_start)
        rows.append(r)
        print(report(r), flush=True)
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"net": args.net, "engine": args.engine, "device": _device(args.gpu),
                       "profile": args.profile, "rows": rows}, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
