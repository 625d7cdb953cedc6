#!/usr/bin/env python3
"""How close the fused BatchNorm+Scale, Eltwise and Split kernels come to the GPU's memory
bandwidth, with 16-byte lanes and one element at a time, side by side in one run.

ResNet-152's BatchNorm+Scale pairs ran at 1.6-2.2 TB/s of an H200's 4.8 (RESULTS "Session
23", a CPU analysis of the saved profile at k = 99).  This times each kernel group of
:mod:`minicaffe.kernels.cuda_fused` on the tensor shapes of ResNet-152's four stages at one
batch, float32:

* ``pair fwd``: BatchNorm TRAIN forward with the Scale fused in (statistics, then x_norm
  and y): 4 full passes (read x twice, write x_norm and y);
* ``pair bwd``: the pair's backward (per-block sums of both layers, the Scale's parameter
  gradients, then dx and the Scale's bottom diff): 6 passes (read dy and x_norm twice,
  write dy_out and dx);
* ``eltwise fwd`` (read a and b, write y) and ``eltwise bwd`` (read dy, write dx0 and
  dx1): 3 passes each;
* ``split bwd``: the sum of two top diffs, 3 passes;
* ``copy``: a device-to-device ``cudaMemcpyAsync`` of the same tensor, 2 passes: the
  bandwidth the others are judged against.

Each group runs with ``lanes`` (16-byte accesses where the shape allows; ResNet's 7x7 stage
has S = 49, so it runs one element at a time either way) and ``single`` (one element per
access, ``MINICAFFE_FUSED_LANES=0``), alternately, timed with CUDA events after warm-up; a
row is the median of ``--repeats`` launches.  GB/s counts the passes above.

Usage (GPU):  python3 scripts/fused_bench.py [--batch 85] [--out CSV]
"""
from __future__ import annotations

import argparse
import functools
import os
import sys

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if REPO not in sys.path:
    sys.path.insert(0, REPO)

from scripts._bench import median_ms, write_rows  # noqa: E402

# ResNet-152 at 224: (channels, height*width) of the tensors its BatchNorm layers see, one
# row per stage (the widest of each: the bottleneck's expanded output)
STAGES = (("conv2 (256x56x56)", 256, 56 * 56), ("conv3 (512x28x28)", 512, 28 * 28),
          ("conv4 (1024x14x14)", 1024, 14 * 14), ("conv5 (2048x7x7)", 2048, 7 * 7))
PASSES = {"pair fwd": 4, "pair bwd": 6, "eltwise fwd": 3, "eltwise bwd": 3, "split bwd": 3,
          "copy": 2}


class Groups:
    """The arrays of one (N, C, S) float32 tensor and a launcher per kernel group."""

    def __init__(self, cp, fused, n: int, c: int, s: int):
        self.cp, self.fused = cp, fused
        shape = (n, c, s)
        rng = cp.random.default_rng(0)
        self.x = rng.standard_normal(shape, dtype=cp.float32)
        self.x_norm, self.y, self.dy, self.dx, self.dy_out, self.b = (
            rng.standard_normal(shape, dtype=cp.float32) for _ in range(6))
        self.std = cp.ones(c, cp.float32)
        self.mean_sum, self.var_sum = cp.zeros(c, cp.float32), cp.zeros(c, cp.float32)
        self.factor = cp.zeros(1, cp.float32)
        self.gamma, self.beta = cp.ones(c, cp.float32), cp.zeros(c, cp.float32)
        self.gamma_diff, self.beta_diff = cp.zeros(c, cp.float32), cp.zeros(c, cp.float32)
        self.p, self.length = fused.channel_chunks(n * s, c)
        self.ws = cp.zeros(fused.workspace_size(c, self.p, 4), cp.float64)
        self.bytes = self.x.nbytes

    def run(self, group: str):
        f = self.fused
        if group == "pair fwd":
            f.bn_forward_train(self.x, self.y, self.x_norm, self.ws, self.std, self.mean_sum,
                               self.var_sum, self.factor, 1e-5, 0.999, 1.0, self.p, self.length,
                               gamma=self.gamma, beta=self.beta)
        elif group == "pair bwd":
            f.bn_scale_backward_partial(self.dy, self.x_norm, self.gamma, self.ws, self.p,
                                        self.length)
            f.scale_backward_finalize(self.ws, self.gamma_diff, self.beta_diff, self.p, 4)
            f.bn_scale_backward_apply(self.dy, self.x_norm, self.std, self.gamma, self.dx,
                                      self.dy_out, self.ws, self.p, self.length)
        elif group == "eltwise fwd":
            f.eltwise_sum2(self.x, 1.0, self.b, 1.0, self.y)
        elif group == "eltwise bwd":
            f.eltwise_sum_backward2(self.dy, self.dx, 1.0, self.dy_out, 1.0)
        elif group == "split bwd":
            f.eltwise_sum2(self.dy, 1.0, self.b, 1.0, self.dx)
        else:  # copy
            rt = self.cp.cuda.runtime
            rt.memcpyAsync(self.y.data.ptr, self.x.data.ptr, self.bytes,
                           getattr(rt, "memcpyDeviceToDevice", 3),
                           self.cp.cuda.get_current_stream().ptr)


def run(args) -> list[dict]:
    try:
        import cupy as cp
        cp.cuda.runtime.getDeviceCount()
    except Exception as e:
        raise SystemExit(f"fused_bench.py needs a CUDA device with CuPy: {e}")
    from minicaffe.kernels import cuda_fused as fused
    if not fused.enabled_for(cp, cp.float32):
        raise SystemExit("fused_bench.py: the fused kernels are off or do not compile here")
    rows = []
    for stage, c, s in STAGES:
        g = Groups(cp, fused, args.batch, c, s)
        for group in PASSES:
            for rnd in range(args.rounds):
                for mode in ("lanes", "single"):
                    if group == "copy" and mode == "single":
                        continue
                    fused._state["lanes"] = mode == "lanes"
                    try:
                        ms = median_ms(functools.partial(g.run, group), args.repeats, warmup=3)
                    finally:
                        fused._state["lanes"] = True
                    gbs = PASSES[group] * g.bytes / ms / 1e6
                    rows.append({"stage": stage, "group": group, "mode": mode, "round": rnd,
                                 "batch": args.batch, "mb": round(g.bytes / 2 ** 20, 1),
                                 "ms": round(ms, 4), "gb_per_s": round(gbs, 1)})
        g = None  # the stage's arrays go before the next stage's are drawn
        cp.get_default_memory_pool().free_all_blocks()
    return rows


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--batch", type=int, default=85, help="images (ResNet-152's k* is 83-99)")
    ap.add_argument("--repeats", type=int, default=20)
    ap.add_argument("--rounds", type=int, default=2, help="time each configuration this often")
    ap.add_argument("--out", default=None, help="CSV of every row")
    args = ap.parse_args(argv)
    rows = run(args)
    print(f"{'stage':<20} {'group':<12} {'mode':<7} {'MB':>7} {'ms (rounds)':>17} "
          f"{'GB/s (rounds)':>14}")
    for key in dict.fromkeys((r["stage"], r["group"], r["mode"]) for r in rows):
        sel = [r for r in rows if (r["stage"], r["group"], r["mode"]) == key]
        ms = "/".join(f"{r['ms']:.3f}" for r in sel)
        gbs = "/".join(f"{r['gb_per_s']:.0f}" for r in sel)
        print(f"{key[0]:<20} {key[1]:<12} {key[2]:<7} {sel[0]['mb']:>7} {ms:>17} {gbs:>14}")
    if args.out:
        write_rows(args.out, rows)
    return 0


if __name__ == "__main__":
    sys.exit(main())
