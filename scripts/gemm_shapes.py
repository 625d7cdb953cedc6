#!/usr/bin/env python3
"""The CAFFE engine's convolution GEMMs, timed in several arrangements, beside cuDNN.

For each 3x3/5x5/11x11 convolution of AlexNet (b256), VGG-16 (b64) and ResNet-34 (b128) this
times, with CUDA events after warm-up (median of ``--reps``), the GEMMs of one iteration of
the layer in the arrangements the engine can choose between:

* ``fwd batched``: one strided-batched GEMM per chunk of images, W (M, K) @ col[b] (K, L);
* ``fwd flat``: one GEMM over the chunk's columns laid out (K, b L), giving (M, b L), plus
  the copy that transposes it to the top's (b, M, L) layout (timed apart);
* ``wgrad``: dW (M, K) += dY (M, b L) @ col (K, b L)^T, one GEMM per chunk (beta = 1);
* ``wgrad split S``: the same product as S partial GEMMs in one strided-batched launch
  over slices of the b L columns, then one reduction GEMM into dW;
* ``dgrad``: dcol (K, b L) = W^T @ dY, one GEMM per chunk;

for chunks of 1 image up to the whole batch (bounded by ``--max-col`` bytes of column
buffer), and PyTorch's cuDNN convolution forward and backward on the same shape
(float32, TF32 off, ``cudnn.benchmark``) as the reference.  A square 8192 SGEMM gives the
device's float32 GEMM rate.  Prints a table of ms per iteration and TFLOP/s and writes
JSON with ``--json``.

    python3 scripts/gemm_shapes.py --nets vgg16,alexnet,resnet34 --json out.json
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import sys

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if REPO not in sys.path:
    sys.path.insert(0, REPO)

# (layer, N, C, H, W, M, kernel, stride, pad, group)
SHAPES = {
    "alexnet": [("conv1", 256, 3, 227, 227, 96, 11, 4, 0, 1),
                ("conv2", 256, 96, 27, 27, 256, 5, 1, 2, 2),
                ("conv3", 256, 256, 13, 13, 384, 3, 1, 1, 1),
                ("conv4", 256, 384, 13, 13, 384, 3, 1, 1, 2),
                ("conv5", 256, 384, 13, 13, 256, 3, 1, 1, 2)],
    "vgg16": [("conv1_1", 64, 3, 224, 224, 64, 3, 1, 1, 1),
              ("conv1_2", 64, 64, 224, 224, 64, 3, 1, 1, 1),
              ("conv2_2", 64, 128, 112, 112, 128, 3, 1, 1, 1),
              ("conv3_2", 64, 256, 56, 56, 256, 3, 1, 1, 1),
              ("conv4_2", 64, 512, 28, 28, 512, 3, 1, 1, 1),
              ("conv5_2", 64, 512, 14, 14, 512, 3, 1, 1, 1)],
    "resnet34": [("conv1", 128, 3, 224, 224, 64, 7, 2, 3, 1),
                 ("l1", 128, 64, 56, 56, 64, 3, 1, 1, 1),
                 ("l2", 128, 128, 28, 28, 128, 3, 1, 1, 1),
                 ("l3", 128, 256, 14, 14, 256, 3, 1, 1, 1),
                 ("l4", 128, 512, 7, 7, 512, 3, 1, 1, 1)],
}


def _time(cp, fn, reps):
    from scripts.conv_algos import median_ms
    return median_ms(fn, reps)


def _square(cp, cublas):
    a = cp.ones((8192, 8192), cp.float32)
    c = cp.empty_like(a)
    return _time(cp, lambda: cublas.gemm(a, a, c), 5)


def layer_rows(cp, cublas, shape, max_col, reps, only=None):
    name, n, c, h, w, m, k, s, p, g = shape
    oh, ow = (h + 2 * p - k) // s + 1, (w + 2 * p - k) // s + 1
    L, K = oh * ow, c // g * k * k
    mg = m // g
    flop = 2.0 * n * L * K * mg * g          # one of forward / wgrad / dgrad
    rows = []
    rng = cp.random.default_rng(0)
    wt = rng.standard_normal((mg, K), dtype=cp.float32)
    dw = cp.zeros((mg, K), cp.float32)
    bmax = max(1, min(n, max_col // (K * L * 4)))
    chunks = sorted({b for b in (1, 2, 4, 8, 16, 32, 64, 128, 256) if b <= bmax} | {bmax})
    if only:
        chunks = sorted({min(b, bmax) for b in only})
    for b in chunks:
        iters = -(-n // b) * g                 # chunks x groups per layer iteration
        col_bm = rng.standard_normal((b, K, L), dtype=cp.float32)
        y_bm = cp.empty((b, mg, L), cp.float32)
        col = col_bm.reshape(K, b * L)
        yt = cp.empty((mg, b * L), cp.float32)
        dy = rng.standard_normal((mg, b * L), dtype=cp.float32)

        def rep(fn):
            return lambda: [fn() for _ in range(iters)]
        t = {}
        t["fwd batched"] = _time(cp, rep(lambda: cublas.gemm_strided_batched(wt, col_bm, y_bm)),
                                 reps)
        t["fwd flat"] = _time(cp, rep(lambda: cublas.gemm(wt, col, yt)), reps)
        t["fwd flat transpose"] = _time(
            cp, rep(lambda: y_bm.__setitem__(Ellipsis, yt.reshape(mg, b, L).transpose(1, 0, 2))),
            reps)
        t["wgrad"] = _time(cp, rep(lambda: cublas.gemm(dy, col, dw, trans_b=True, beta=1.0)),
                           reps)
        for split in (4, 16, 64):
            if (b * L) % split or b * L // split < 256:
                continue
            seg = b * L // split
            part = cp.empty((split, mg, K), cp.float32)
            ones = cp.ones((1, split), cp.float32)
            dys = dy.reshape(mg, split, seg).transpose(1, 0, 2)
            cols = col.reshape(K, split, seg).transpose(1, 0, 2)

            def split_k(dys=dys, cols=cols, part=part, ones=ones, split=split):
                cublas.gemm_strided_batched(dys, cols, part, trans_b=True)
                cublas.gemm(ones, part.reshape(split, mg * K), dw.reshape(1, mg * K), beta=1.0)
            t[f"wgrad split {split}"] = _time(cp, rep(split_k), reps)
        t["dgrad"] = _time(cp, rep(lambda: cublas.gemm(wt, dy, col, trans_a=True)), reps)
        if K % 4:  # rows of K floats are not 16-byte aligned: the same GEMMs on K padded
            kp = -(-K // 4) * 4
            wtp = cp.zeros((mg, kp), cp.float32)
            dwp = cp.zeros((mg, kp), cp.float32)
            colp = cp.zeros((kp, b * L), cp.float32)
            t[f"fwd flat, K {kp}"] = _time(cp, rep(lambda: cublas.gemm(wtp, colp, yt)), reps)
            t[f"wgrad, K {kp}"] = _time(
                cp, rep(lambda: cublas.gemm(dy, colp, dwp, trans_b=True, beta=1.0)), reps)
            t[f"dgrad, K {kp}"] = _time(
                cp, rep(lambda: cublas.gemm(wtp, dy, colp, trans_a=True)), reps)
        for what, ms in t.items():
            rows.append({"layer": name, "chunk": b, "what": what, "ms": ms,
                         "tflops": None if "transpose" in what else flop / ms / 1e9})
        cp.get_default_memory_pool().free_all_blocks()
    return rows, flop


def torch_rows(shape, reps):
    try:
        import torch
    except ImportError:
        return []
    torch.backends.cudnn.benchmark = True
    torch.backends.cudnn.allow_tf32 = False
    torch.backends.cuda.matmul.allow_tf32 = False
    name, n, c, h, w, m, k, s, p, g = shape
    conv = torch.nn.Conv2d(c, m, k, s, p, groups=g).cuda()
    x = torch.randn(n, c, h, w, device="cuda", requires_grad=True)
    out = []
    for _ in range(3):
        y = conv(x)
        y.backward(torch.ones_like(y))
    torch.cuda.synchronize()
    for _ in range(reps):
        a, b, e = (torch.cuda.Event(enable_timing=True) for _ in range(3))
        a.record()
        y = conv(x)
        b.record()
        y.backward(torch.ones_like(y))
        e.record()
        e.synchronize()
        out.append((a.elapsed_time(b), b.elapsed_time(e)))
    f = statistics.median(o[0] for o in out)
    bw = statistics.median(o[1] for o in out)
    return [{"layer": name, "chunk": n, "what": "torch fwd", "ms": f, "tflops": None},
            {"layer": name, "chunk": n, "what": "torch bwd", "ms": bw, "tflops": None}]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--nets", default="vgg16,alexnet,resnet34")
    ap.add_argument("--layers", default=None, help="only these layers (comma-separated names)")
    ap.add_argument("--chunks", default=None,
                    help="only these chunk sizes (comma-separated; the largest that fits)")
    ap.add_argument("--max-col", type=int, default=1 << 30, help="column buffer bound, bytes")
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--json", default=None)
    args = ap.parse_args()
    import cupy as cp

    from minicaffe import cublas
    if not cublas.enabled_for(cp):
        print(f"minicaffe.cublas unavailable: {cublas.unavailable_reason(cp)}")
        return 1
    sq = _square(cp, cublas)
    print(f"square 8192 SGEMM: {sq:.2f} ms, {2 * 8192 ** 3 / sq / 1e9:.1f} TFLOP/s")
    result = {"square_tflops": 2 * 8192 ** 3 / sq / 1e9, "layers": []}
    for net in args.nets.split(","):
        for shape in SHAPES[net]:
            if args.layers and shape[0] not in args.layers.split(","):
                continue
            only = [int(v) for v in args.chunks.split(",")] if args.chunks else None
            rows, flop = layer_rows(cp, cublas, shape, args.max_col, args.reps, only)
            rows += torch_rows(shape, args.reps)
            result["layers"].append({"net": net, "shape": shape, "flop": flop, "rows": rows})
            print(f"{net} {shape[0]} {shape[1:]}  one GEMM pass = {flop / 1e9:.1f} GFLOP")
            for r in rows:
                tf = f"{r['tflops']:.1f}" if r["tflops"] else ""
                print(f"   chunk {r['chunk']:>4} {r['what']:<20} {r['ms']:8.2f} ms {tf:>6}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(result, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
