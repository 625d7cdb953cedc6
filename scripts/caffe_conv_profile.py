#!/usr/bin/env python3
"""Where the CAFFE engine's convolution time goes: lowering, GEMMs, folding, per layer.

Issue 3 asks the CAFFE engine (im2col + GEMM) for 0.6x PyTorch; it is at 0.42 to 0.46 on
AlexNet, VGG-16 and ResNet-34.  This times one net's convolution layers in the CAFFE engine
on the GPU and splits each layer's forward and backward into its primitives: ``im2col``
and ``col2im`` (:mod:`minicaffe.kernels.cuda_vision`) and the GEMM calls (``matmul``,
``dot``, ``tensordot`` of CuPy, and ``minicaffe.cublas`` where present), each call between
two CUDA events.  For each primitive it reports the summed milliseconds per iteration and,
for the GEMMs, the achieved TFLOP/s (2 m n k per call).

    python3 scripts/caffe_conv_profile.py --net vgg16:64 --json out.json
"""
from __future__ import annotations

import argparse
import json
import os
import sys
from collections import defaultdict

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if REPO not in sys.path:
    sys.path.insert(0, REPO)


def _gemm_flops(name, args, kwargs):
    """2 m n k of a matmul/dot/tensordot call on its operands (None when not a GEMM)."""
    import numpy as np
    if name == "tensordot":
        a, b = args[0], args[1]
        axes = kwargs.get("axes", args[2] if len(args) > 2 else 2)
        ka = axes[0] if isinstance(axes, (list, tuple)) else list(range(-axes, 0))
        k = int(np.prod([a.shape[i] for i in ka]))
        return 2.0 * a.size * b.size / k
    if name in ("matmul", "dot"):
        a, b = args[0], args[1]
        if a.ndim < 2 or b.ndim < 2:
            return None
        m, k = a.shape[-2], a.shape[-1]
        n = b.shape[-1]
        batch = max(int(np.prod(a.shape[:-2], dtype=np.int64)),
                    int(np.prod(b.shape[:-2], dtype=np.int64)), 1)
        return 2.0 * batch * m * n * k
    return None


def profile(name: str, batch: int, iters: int, warmup: int) -> dict:
    import cupy as cp

    from minicaffe.kernels import cuda_vision
    from minicaffe.net import TRAIN, Net
    from scripts.bench_throughput import minicaffe_net_param
    net = Net(minicaffe_net_param(name, batch, "CAFFE"), TRAIN, mode="GPU")
    rng = cp.random.default_rng(0)
    net.blobs["data"].data[...] = rng.standard_normal(net.blobs["data"].shape, dtype=cp.float32)
    net.blobs["label"].data[...] = rng.integers(0, 1000, net.blobs["label"].shape).astype(
        cp.float32)
    conv = [li for li, layer in enumerate(net.layers) if layer.type == "Convolution"]
    records = []          # (layer, phase, primitive, start event, end event, flops)
    state = {"layer": None, "phase": None, "on": False}

    def wrap(module, attr, label):
        fn = getattr(module, attr)

        def timed(*args, **kwargs):
            if not state["on"] or state["layer"] is None:
                return fn(*args, **kwargs)
            a, b = cp.cuda.Event(), cp.cuda.Event()
            a.record()
            out = fn(*args, **kwargs)
            b.record()
            records.append((state["layer"], state["phase"], label, a, b,
                            _gemm_flops(attr, args, kwargs)))
            return out
        setattr(module, attr, timed)
        return fn

    originals = [(cp, a, wrap(cp, a, a)) for a in ("matmul", "dot", "tensordot")]
    originals += [(cuda_vision, a, wrap(cuda_vision, a, a)) for a in ("im2col", "col2im")]
    try:
        import minicaffe.cublas as cublas_mod
        originals += [(cublas_mod, a, wrap(cublas_mod, a, a))
                      for a in ("gemm", "gemm_strided_batched") if hasattr(cublas_mod, a)]
    except Exception:
        pass
    totals = defaultdict(float)
    layer_ms = defaultdict(lambda: [0.0, 0.0])
    try:
        for it in range(warmup + iters):
            state["on"] = it >= warmup
            records.clear()
            spans = []
            for li in range(len(net.layers)):
                state["layer"], state["phase"] = (li, "forward") if li in conv else (None, None)
                a, b = cp.cuda.Event(), cp.cuda.Event()
                a.record()
                net.forward_layer(li)
                b.record()
                spans.append((li, "forward", a, b))
            for li in range(len(net.layers) - 1, -1, -1):
                state["layer"], state["phase"] = (li, "backward") if li in conv else (None, None)
                a, b = cp.cuda.Event(), cp.cuda.Event()
                a.record()
                net.backward_layer(li)
                b.record()
                spans.append((li, "backward", a, b))
            cp.cuda.Device().synchronize()
            if not state["on"]:
                continue
            for li, phase, a, b in spans:
                if li in conv:
                    layer_ms[li][0 if phase == "forward" else 1] += cp.cuda.get_elapsed_time(a, b)
            for li, phase, prim, a, b, flops in records:
                ms = cp.cuda.get_elapsed_time(a, b)
                totals[(phase, prim, "ms")] += ms
                if flops:
                    totals[(phase, prim, "flop")] += flops
    finally:
        for module, attr, fn in originals:
            setattr(module, attr, fn)
    prims = {}
    for (phase, prim, what), v in totals.items():
        d = prims.setdefault(f"{phase} {prim}", {"ms": 0.0, "tflops": None})
        if what == "ms":
            d["ms"] = v / iters
    for key, d in prims.items():
        phase, prim = key.split(" ", 1)
        flop = totals.get((phase, prim, "flop"))
        if flop:
            d["tflops"] = flop / iters / (d["ms"] * 1e-3) / 1e12
    layers = [{"name": net.layer_names[li], "bottom": list(net.bottom_vecs[li][0].shape),
               "top": list(net.top_vecs[li][0].shape),
               "chunk": getattr(net.layers[li], "chunk", None),
               "fwd_ms": layer_ms[li][0] / iters, "bwd_ms": layer_ms[li][1] / iters}
              for li in conv]
    return {"net": name, "batch": batch, "primitives": prims, "layers": layers,
            "conv_ms": sum(x["fwd_ms"] + x["bwd_ms"] for x in layers)}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--net", default="vgg16:64")
    ap.add_argument("--iters", type=int, default=3)
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument("--json", default=None)
    args = ap.parse_args()
    name, batch = args.net.split(":")
    r = profile(name, int(batch), args.iters, args.warmup)
    print(f"{name} batch {batch}, CAFFE engine: convolutions {r['conv_ms']:.1f} ms per iteration")
    print("| primitive | ms per iteration | TFLOP/s |")
    print("|---|---|---|")
    for key, d in sorted(r["primitives"].items(), key=lambda kv: -kv[1]["ms"]):
        tf = "" if d["tflops"] is None else f"{d['tflops']:.1f}"
        print(f"| {key} | {d['ms']:.1f} | {tf} |")
    print("| layer | bottom | chunk | fwd ms | bwd ms |")
    print("|---|---|---|---|---|")
    for x in r["layers"]:
        print(f"| {x['name']} | {x['bottom']} | {x['chunk']} | {x['fwd_ms']:.2f} | "
              f"{x['bwd_ms']:.2f} |")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(r, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
