#!/usr/bin/env python3
"""Per-layer cuDNN convolution algorithms and their times, against PyTorch's.

For every Convolution layer of a network at a batch size, this times the
three directions (forward, backward data, backward filter) with the algorithm
that each selection rule picks, so one can see which layers a rule makes
slow and what the workspace limit costs:

- ``heur:<limit>``: cuDNN's heuristics (minicaffe's default), fastest
  algorithm whose workspace fits ``limit``;
- ``find:<limit>``: cuDNN's timed search (``MINICAFFE_CUDNN_FIND=1``);
- ``per:<bytes>``: the timed search with a limit of ``bytes`` per image (the
  limit at batch k is k times it), the bound that keeps an algorithm from
  changing with k;
- ``torch``: PyTorch's own convolution of the same shapes, float32, TF32
  off, ``cudnn.benchmark`` on (forward with ``conv2d``, the two backward
  directions with ``aten.convolution_backward``).

Each call is timed with CUDA events, ``--reps`` times after one warm-up
call, and the median is kept.  Operands are random normal arrays of the
layer's shapes.  Output: a table per layer and the sums, on stdout and as CSV;
with several batches (``--net vgg16:32,64,128``), the time per image and the
largest workspace of each rule at each batch.

    python3 scripts/conv_algos.py --net vgg16:64 --rules heur:64M,find:64M,find:4G,torch
    python3 scripts/conv_algos.py --net alexnet:128,256,512 --rules find:768M,per:4M,torch
"""
from __future__ import annotations

import argparse
import os
import sys

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if REPO not in sys.path:
    sys.path.insert(0, REPO)

from scripts._bench import median_ms, write_rows  # noqa: E402

DIRECTIONS = ("fwd", "bwd_data", "bwd_filter")


def conv_shapes(name: str, batch: int) -> list[dict]:
    """(layer, x shape, w shape, pad, stride, dilation, groups) of every convolution,
    read from the net as minicaffe builds it (CAFFE engine, CPU shapes only)."""
    from minicaffe.net import Net
    from scripts.bench_throughput import minicaffe_net_param
    from minicaffe.proto import caffe_pb2
    param = minicaffe_net_param(name, batch, "CAFFE")
    net = Net(param, caffe_pb2.TRAIN, mode="CPU")
    out = []
    for layer in net.layers:
        if layer.type != "Convolution":
            continue
        out.append({"layer": layer.name, "x": (layer.num, layer.channels) + tuple(layer.in_hw),
                    "w": tuple(layer.blobs[0].shape), "pad": tuple(layer.pad),
                    "stride": tuple(layer.stride), "dilation": tuple(layer.dilation),
                    "groups": int(layer.group)})
    return out


def time_cudnn(c: dict, rule: str, reps: int) -> dict:
    """{direction: (algorithm name, workspace bytes, ms)} under ``rule``."""
    import cupy as cp
    from minicaffe.cudnn import ops
    limit, find = rule_limit(rule, c["x"][0])
    geo = (c["pad"], c["stride"], c["dilation"], c["groups"])
    algos = ops.conv_algorithms(c["x"], c["w"], *geo, find=find, workspace_limit=limit)
    rng = cp.random.default_rng(0)
    x = rng.standard_normal(c["x"], dtype=cp.float32)
    w = rng.standard_normal(c["w"], dtype=cp.float32)
    y_shape = ops.conv_geometry(c["x"], c["w"], *geo).y_shape
    dy = rng.standard_normal(y_shape, dtype=cp.float32)
    y, dx, dw = cp.empty(y_shape, cp.float32), cp.empty_like(x), cp.zeros_like(w)
    ws = cp.empty(max(a.workspace for a in algos.values()) or 1, dtype=cp.uint8)
    kw = {"workspace": ws, "find": find, "workspace_limit": limit}
    calls = {"fwd": lambda: ops.conv2d_forward(x, w, None, y, *geo, **kw),
             "bwd_data": lambda: ops.conv2d_backward_data(w, dy, dx, *geo, **kw),
             "bwd_filter": lambda: ops.conv2d_backward_filter(x, dy, dw, *geo, **kw)}
    return {d: (algos[d].name, algos[d].workspace, median_ms(calls[d], reps)) for d in DIRECTIONS}


def rule_limit(rule: str, batch: int) -> tuple[int, bool]:
    """(workspace limit in bytes at ``batch``, timed search?) of a cuDNN rule."""
    from minicaffe.cudnn import ops
    how, _, limit = rule.partition(":")
    if how not in ("heur", "find", "per") or not limit:
        raise ValueError(f"rule {rule!r}: use heur:<bytes>, find:<bytes>, per:<bytes> or torch")
    limit = ops.parse_bytes(limit)
    return (limit * batch if how == "per" else limit), how != "heur"


def time_torch(c: dict, reps: int) -> dict:
    import cupy as cp
    import torch
    torch.backends.cudnn.benchmark = True
    torch.backends.cudnn.allow_tf32 = False
    torch.backends.cuda.matmul.allow_tf32 = False
    dev = torch.device("cuda")
    x = torch.randn(c["x"], device=dev)
    w = torch.randn(c["w"], device=dev)
    args = (c["stride"], c["pad"], c["dilation"], c["groups"])
    y = torch.nn.functional.conv2d(x, w, None, *args)
    dy = torch.randn_like(y)
    stream = cp.cuda.ExternalStream(torch.cuda.current_stream().cuda_stream)

    def back(mask):
        return lambda: torch.ops.aten.convolution_backward(
            dy, x, w, None, list(c["stride"]), list(c["pad"]), list(c["dilation"]), False,
            [0, 0], c["groups"], mask)
    calls = {"fwd": lambda: torch.nn.functional.conv2d(x, w, None, *args),
             "bwd_data": back([True, False, False]),
             "bwd_filter": back([False, True, False])}
    with stream:
        return {d: ("torch", 0, median_ms(calls[d], reps)) for d in DIRECTIONS}


def time_net(name: str, batch: int, rules: list, reps: int) -> list:
    """One row per convolution, rule and direction at ``batch``; prints a line per layer
    and the sums."""
    convs = conv_shapes(name, batch)
    rows = []
    totals = {r: 0.0 for r in rules}
    for c in convs:
        line = [f"{c['layer']:<22s} x{c['x']} w{c['w']}"]
        for r in rules:
            res = time_torch(c, reps) if r == "torch" else time_cudnn(c, r, reps)
            for d in DIRECTIONS:
                algo, ws, ms = res[d]
                rows.append({"net": name, "batch": batch, "layer": c["layer"], "rule": r,
                             "direction": d, "algo": algo, "workspace_bytes": ws,
                             "ms": round(ms, 4)})
                totals[r] += ms
            line.append(f"{r}: " + " ".join(f"{res[d][0]}={res[d][2]:.2f}" for d in DIRECTIONS))
        print("  ".join(line), flush=True)
    print(f"\n{name} b{batch}: sum of the three directions over {len(convs)} convolutions (ms)")
    for r in rules:
        print(f"  {r:<12s} {totals[r]:9.2f}")
    return rows


def summarize(rows: list) -> dict:
    """{(batch, rule): (ms of all rows, largest workspace bytes)}."""
    out: dict = {}
    for r in rows:
        key = (int(r["batch"]), r["rule"])
        ms, ws = out.get(key, (0.0, 0))
        out[key] = (ms + float(r["ms"]), max(ws, int(r["workspace_bytes"])))
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--net", default="vgg16:64", help="name:batch")
    ap.add_argument("--rules", default="heur:64M,find:64M,find:4G,torch")
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--csv", default=None)
    args = ap.parse_args()
    name, batches = args.net.split(":")
    rules = args.rules.split(",")
    rows = []
    for batch in (int(b) for b in batches.split(",")):
        rows += time_net(name, batch, rules, args.reps)
    summary = summarize(rows)
    if len(summary) > len(rules):
        print(f"\n{name}: time per image of all convolutions (three directions) and the "
              "largest workspace")
        for (batch, rule), (ms, ws) in sorted(summary.items()):
            print(f"  b{batch:<5d} {rule:<12s} {1e3 * ms / batch:9.2f} us/image "
                  f"{ws / 2**20:9.1f} MiB")
    if args.csv:
        write_rows(args.csv, rows)
    return 0


if __name__ == "__main__":
    sys.exit(main())
