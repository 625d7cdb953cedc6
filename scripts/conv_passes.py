#!/usr/bin/env python3
"""The CAFFE engine's convolution passes besides lowering and GEMMs, timed one by one.

Per convolution top of AlexNet (b256), VGG-16 (b64) and ResNet-34 (b128), with CUDA events
after warm-up (median of ``--reps``), ms per call of:

* ``copy``: a plain device copy of the top's bytes (what the memory allows for one read and
  one write of the top);
* ``fwd T+bias (cupy)`` / ``(kernel)``: the forward's pass from the GEMM result (M, b, L) into
  the top (b, M, L) with the bias, as CuPy's add on a transposed view and as
  :func:`minicaffe.kernels.cuda_vision.swap_outer`;
* ``bwd T (cupy)`` / ``(kernel)``: the backward's transpose of the top diff (b, M, L) into
  (M, b, L), the same two ways;
* ``bias grad (cupy sum)``: ``dy.sum(axis=(0, 2))``, the engine's bias gradient;
* ``bias grad (gemm)``: the same sum as two cuBLAS GEMMs, per image over its pixels with a
  row of ones (strided-batched, Caffe's ``bias_multiplier``), then over the images.

Prints one table (ms and the fraction of the copy's rate) and the per-network sums.

    python3 scripts/conv_passes.py --nets alexnet,vgg16,resnet34
"""
from __future__ import annotations

import argparse
import os
import sys

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if REPO not in sys.path:
    sys.path.insert(0, REPO)

# (layer, N, M, OH, OW): the tops of the 3x3 / 5x5 / 11x11 convolutions (one of each
# repeated shape, with its count)
TOPS = {
    "alexnet": [("conv1", 256, 96, 55, 55, 1), ("conv2", 256, 256, 27, 27, 1),
                ("conv3", 256, 384, 13, 13, 1), ("conv4", 256, 384, 13, 13, 1),
                ("conv5", 256, 256, 13, 13, 1)],
    "vgg16": [("conv1_x", 64, 64, 224, 224, 2), ("conv2_x", 64, 128, 112, 112, 2),
              ("conv3_x", 64, 256, 56, 56, 3), ("conv4_x", 64, 512, 28, 28, 3),
              ("conv5_x", 64, 512, 14, 14, 3)],
    "resnet34": [("conv1", 128, 64, 112, 112, 1), ("l1", 128, 64, 56, 56, 7),
                 ("l2", 128, 128, 28, 28, 8), ("l3", 128, 256, 14, 14, 12),
                 ("l4", 128, 512, 7, 7, 6)],
}

PASSES = ("copy", "fwd T+bias (cupy)", "fwd T+bias (kernel)", "bwd T (cupy)", "bwd T (kernel)",
          "bias grad (cupy sum)", "bias grad (gemm)")


def time_top(n, m, hw, reps) -> dict:
    import cupy as cp
    import numpy as np
    from minicaffe import cublas
    from minicaffe.kernels import cuda_vision
    from scripts.conv_algos import median_ms
    rs = cp.random.RandomState(0)
    src = rs.standard_normal((m, n, hw), dtype=np.float32)
    top = cp.empty((n, m, hw), np.float32)
    dyt = cp.empty((m, n, hw), np.float32)
    bias = rs.standard_normal(m, dtype=np.float32)
    diff = cp.zeros((1, m), np.float32)
    ones_l = cp.ones((hw, 1), np.float32)
    ones_n = cp.ones((1, n), np.float32)
    per_image = cp.empty((n, m, 1), np.float32)

    def gemm_bias():
        cublas.gemm_strided_batched(top, ones_l, per_image)
        cublas.gemm(ones_n, per_image.reshape(n, m), diff, beta=1.0)

    fns = {
        "copy": lambda: cp.copyto(dyt.reshape(-1), src.reshape(-1)),
        "fwd T+bias (cupy)": lambda: cp.add(src.transpose(1, 0, 2), bias.reshape(1, m, 1),
                                            out=top),
        "fwd T+bias (kernel)": lambda: cuda_vision.swap_outer(src, top, bias),
        "bwd T (cupy)": lambda: dyt.__setitem__(Ellipsis, top.transpose(1, 0, 2)),
        "bwd T (kernel)": lambda: cuda_vision.swap_outer(top, dyt),
        "bias grad (cupy sum)": lambda: top.sum(axis=(0, 2)),
        "bias grad (gemm)": gemm_bias,
    }
    out = {name: median_ms(fn, reps) for name, fn in fns.items()}
    # the GEMM form sums what the reduction sums
    ref = top.sum(axis=(0, 2))
    diff[...] = 0
    gemm_bias()
    out["bias grad max rel diff"] = float(cp.abs(diff[0] - ref).max() / cp.abs(ref).max())
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--nets", default="alexnet,vgg16,resnet34")
    ap.add_argument("--reps", type=int, default=20)
    args = ap.parse_args(argv)
    import cupy as cp
    name = cp.cuda.runtime.getDeviceProperties(0)["name"].decode()
    print(f"conv_passes on {name}: ms per call (in brackets: the copy's time over this one)")
    for net in args.nets.split(","):
        sums = dict.fromkeys(PASSES, 0.0)
        print(f"\n{net}\n| top | N, M, L | count | " + " | ".join(PASSES) + " |")
        print("|---|---|---|" + "---|" * len(PASSES))
        for layer, n, m, oh, ow, count in TOPS[net]:
            r = time_top(n, m, oh * ow, args.reps)
            for p in PASSES:
                sums[p] += count * r[p]
            cells = [f"{r[p]:.3f} ({r['copy'] / r[p]:.2f})" for p in PASSES]
            print(f"| {layer} | {n}, {m}, {oh * ow} | {count} | " + " | ".join(cells)
                  + f" |  gemm vs sum {r['bias grad max rel diff']:.1e}")
        print("| all, per iteration | | | " + " | ".join(f"{sums[p]:.2f}" for p in PASSES)
              + " |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
