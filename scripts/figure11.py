#!/usr/bin/env python3
"""The paper's Figure 11 in one command: swap-in / swap-out memory curves within one iteration.

The paper draws AlexNet at minibatch 256 under a 3 GB budget with every feature map swapped:
the memory the swap-in stream has taken (allocations and prefetches, cumulative) and the memory
the swap-out stream has given back (releases, cumulative) over one iteration, whose difference,
the memory held, stays under the budget (eq. 4).  This script trains that net for a few
iterations under ``--swap naive --budget 3G --memory-trace`` (``minicaffe train`` in a child
process), then draws the last complete iteration with :mod:`scripts.plot_memory_trace`.

The DummyData images are constant here (filled once): with Gaussian images the layer draws
k x 3 x 227 x 227 numbers on the host before the first convolution of every iteration (about
0.6 s at 256 on the lent GPU's host), which Caffe's DummyData does too but which hides the
curves.  The plan and its memory do not depend on the values.

    python3 scripts/figure11.py                          # GPU 0: AlexNet, 256, naive, 3G
    python3 scripts/figure11.py --batch 512 --budget 6G --strategy dynamic --profile P.json
    python3 scripts/figure11.py --quick --out-dir /tmp/f11   # CPU, CIFAR-10 quick (the test)

Writes ``<out-dir>/figure11.csv`` (the executor's trace, every iteration), ``figure11.png`` and
``figure11.md`` (the figure's figures beside the paper's, with the device, date and command).
"""
from __future__ import annotations

import argparse
import datetime
import os
import platform
import shlex
import subprocess
import sys
import tempfile

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if REPO not in sys.path:
    sys.path.insert(0, REPO)

from scripts import plot_memory_trace as pmt  # noqa: E402

QUICK = dict(net="cifar10_quick", batch=32, budget="48M", iters=3)
FULL = dict(net="alexnet", batch=256, budget="3G", iters=3)
PAPER = ("AlexNet at minibatch 256 under a 3 GB budget on an M40 (section 6, Figure 11): the "
         "swap-in curve rises steeply in forward (allocations take microseconds) and more "
         "slowly in backward (prefetches wait for the copies); the swap-out curve follows the "
         "computation; the memory held never passes the budget")


def constant_net(src: str, batch: int, dst: str):
    """``src`` (a DummyData net) with constant images and labels, at minibatch ``batch``."""
    from minicaffe.proto import read_net_param, write_text
    param = read_net_param(src)
    data = [lp for lp in param.layer if lp.type == "DummyData"]
    if not data:
        raise ValueError(f"{src}: no DummyData layer to make constant")
    dp = data[0].dummy_data_param
    for f in dp.data_filler:
        f.Clear()
        f.type = "constant"
        f.value = 0.5
    for shape in dp.shape:
        shape.dim[0] = batch
    write_text(param, dst)
    return param


def trace_run(net: str, trace: str, strategy: str, budget: str, iters: int, gpu: bool,
              profile: str | None) -> float:
    """Train ``net`` for ``iters`` iterations under the plan, writing ``trace``; seconds."""
    cmd = [sys.executable, "-m", "minicaffe", "train", net, "--max-iter", str(iters),
           "--swap", strategy, "--budget", budget, "--memory-trace", trace,
           "--base-lr", "0.001"]
    cmd += ["--gpu", "0"] if gpu else ["--cpu"]
    if profile:
        cmd += ["--profile", profile]
    env = dict(os.environ)
    env.setdefault("MINICAFFE_SCRATCH", "768M" if gpu else "16M")
    t0 = datetime.datetime.now()
    proc = subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True)
    if proc.returncode != 0:
        raise RuntimeError(f"{shlex.join(cmd)} failed ({proc.returncode}):\n"
                           f"{proc.stdout[-2000:]}\n{proc.stderr[-3000:]}")
    return (datetime.datetime.now() - t0).total_seconds()


def summary(rows, budget: int) -> dict:
    """The figure's numbers for one iteration (bytes, ms)."""
    c = pmt.curves(rows)
    fwd = c["backward_ms"] if c["backward_ms"] is not None else c["t"][-1]
    return {"iteration": rows[0]["iteration"], "steps": len(rows), "ms": c["t"][-1],
            "forward_ms": fwd, "backward_ms": c["t"][-1] - fwd,
            "allocated": c["allocated"][-1], "released": c["released"][-1],
            "offloaded": c["offloaded"][-1], "prefetched": c["prefetched"][-1],
            "peak_held": max(c["held"]), "high_water": c["high_water"], "budget": budget}


def device_name(gpu: bool) -> str:
    if gpu:
        try:
            import cupy
            return cupy.cuda.runtime.getDeviceProperties(0)["name"].decode()
        except Exception:   # pragma: no cover - GPU machine only
            return "GPU 0"
    return f"CPU ({platform.processor() or platform.machine()}), NumPy"


def markdown(s: dict, args, device: str, command: str) -> str:
    gib = 2.0 ** 30
    return "\n".join([
        f"Figure 11, {device}, {datetime.date.today().isoformat()}: `{command}`", "",
        f"{args.net} at minibatch {args.batch}, `--swap {args.strategy}` in a "
        f"{s['budget'] / gib:.2f} GiB budget; iteration {s['iteration']} of the trace "
        f"({s['steps']} steps).", "",
        "| | here | paper (M40) |", "|---|---|---|",
        f"| net, minibatch, budget | {args.net}, {args.batch}, {args.budget} | AlexNet, 256, 3 GB |",
        f"| iteration (forward + backward) ms | {s['ms']:.1f} ({s['forward_ms']:.1f} + "
        f"{s['backward_ms']:.1f}) | not given |",
        f"| swap-in stream: allocated + prefetched GiB | {s['allocated'] / gib:.3f} "
        f"(prefetched {s['prefetched'] / gib:.3f}) | curve only |",
        f"| swap-out stream: released GiB | {s['released'] / gib:.3f} (offloaded "
        f"{s['offloaded'] / gib:.3f}) | curve only |",
        f"| most memory held GiB | {s['peak_held'] / gib:.3f} | under 3 GB |",
        f"| arena high-water mark GiB | {s['high_water'] / gib:.3f} | - |",
        f"| held within the budget | {'yes' if s['peak_held'] <= s['budget'] else 'NO'} | yes |",
        "", f"Paper: {PAPER}.", ""])


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--net", default=None, help="a net of prototxt/ with a dummy.prototxt "
                                                "(default alexnet; --quick: cifar10_quick)")
    ap.add_argument("--batch", type=int, default=None, help="minibatch (default 256)")
    ap.add_argument("--budget", default=None, help="device budget (default 3G)")
    ap.add_argument("--strategy", default="naive",
                    choices=["none", "naive", "vdnn", "recompute", "dynamic"])
    ap.add_argument("--profile", default=None, help="with --strategy dynamic: a saved profile")
    ap.add_argument("--iters", type=int, default=None, help="iterations traced (default 3)")
    ap.add_argument("--cpu", action="store_true", help="NumPy instead of GPU 0")
    ap.add_argument("--quick", action="store_true",
                    help="CPU, CIFAR-10 quick at 32 in 48 MiB (the test suite)")
    ap.add_argument("--out-dir", default=os.path.join(REPO, "docs", "results"))
    ap.add_argument("--trace", default=None,
                    help="draw this --memory-trace CSV instead of running (no training); give the "
                         "run's --net, --batch and --strategy for the labels")
    args = ap.parse_args(argv)
    base = QUICK if args.quick else FULL
    for k, v in base.items():
        if getattr(args, k) is None:
            setattr(args, k, v)
    gpu = not (args.cpu or args.quick)
    from swap.memory import parse_bytes
    budget = parse_bytes(args.budget)
    os.makedirs(args.out_dir, exist_ok=True)
    trace = os.path.join(args.out_dir, "figure11.csv")
    if args.trace:
        if os.path.abspath(args.trace) != os.path.abspath(trace):
            import shutil
            shutil.copyfile(args.trace, trace)
    else:
        src = os.path.join(REPO, "prototxt", args.net, "dummy.prototxt")
        with tempfile.TemporaryDirectory() as tmp:
            net = os.path.join(tmp, f"{args.net}_constant.prototxt")
            constant_net(src, args.batch, net)
            trace_run(net, trace, args.strategy, args.budget, args.iters, gpu, args.profile)
    rows = pmt.pick_iteration(pmt.read_trace(trace))
    png = os.path.join(args.out_dir, "figure11.png")
    pmt.plot(rows, png, budget, f"{args.net}({args.batch}), --swap {args.strategy}, "
                                f"budget {args.budget}: one iteration")
    s = summary(rows, budget)
    command = "python3 scripts/figure11.py " + shlex.join(
        argv if argv is not None else sys.argv[1:])
    md = markdown(s, args, device_name(gpu) if not args.trace else "from a saved trace",
                  command.strip())
    with open(os.path.join(args.out_dir, "figure11.md"), "w") as f:
        f.write(md)
    print(md)
    if s["peak_held"] > budget:
        print("error: the bytes held passed the budget", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
