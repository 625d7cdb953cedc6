#!/usr/bin/env python3
"""Training throughput: minicaffe (CUDNN and CAFFE engines) against PyTorch eager.

Each configuration runs in its own process (so one framework's memory pool
never hides another's) on ImageNet-shaped synthetic data that is drawn once on
the device: random normal images, random labels.  A configuration is timed
with CUDA events around each SGD iteration after ``--warmup`` iterations;
the median of ``--iters`` is reported, and every configuration is timed
``--repeat`` times to show the noise.

    python3 scripts/bench_throughput.py                       # all 7 nets, all competitors
    python3 scripts/bench_throughput.py --nets resnet50:64 --engines CAFFE --no-torch
    python3 scripts/bench_throughput.py --nets resnet50:64 --graph   # + each engine as a CUDA graph

``--graph`` adds, per engine, minicaffe with each iteration replayed as one CUDA
graph (``Solver(cuda_graph=True)``, rows "CUDNN+graph", "CAFFE+graph"); where the
iteration cannot be captured (a solver other than SGD, an Accuracy layer...) the row
runs eagerly and the reason is printed under the table.

PyTorch runs twice, in float32 with TF32 off and ``cudnn.benchmark`` on: torchvision's
model of the name (``vs tv``) and the very network minicaffe trains, its prototxt built as
PyTorch modules by ``scripts/torch_peer.py`` (``vs same``: torchvision's AlexNet and GoogLeNet
are other networks than Caffe's).  It is skipped cleanly where torch (or, for its models,
torchvision) is missing.  Results: a table on stdout and a CSV (``--csv``).
"""
from __future__ import annotations

import argparse
import csv
import json
import os
import statistics
import sys
import time

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if REPO not in sys.path:
    sys.path.insert(0, REPO)

from scripts._child import run_child  # noqa: E402

DEFAULT_NETS = "alexnet:256,googlenet:128,vgg16:64,resnet34:128,resnet50:64,resnet101:32,resnet152:32"
INPUT_SIZE = {"alexnet": 227}
TORCH_NAMES = {"alexnet": "alexnet", "googlenet": "googlenet", "vgg16": "vgg16",
               "resnet34": "resnet34", "resnet50": "resnet50", "resnet101": "resnet101",
               "resnet152": "resnet152"}


# ------------------------------------------------------------- minicaffe
ENGINE_FIELD = {"Convolution": "convolution_param", "Pooling": "pooling_param",
                "LRN": "lrn_param", "ReLU": "relu_param", "Softmax": "softmax_param",
                "SoftmaxWithLoss": "softmax_param"}


def minicaffe_net_param(name: str, batch: int, engine: str):
    """The dummy variant of ``name`` with an Input layer (data drawn once on the
    device, so the host never refills it) and every layer's engine set to
    ``engine``, as Caffe's ``engine:`` field would."""
    from scripts.gen_prototxt import build
    from minicaffe.proto import caffe_pb2
    src = build(name, batch=batch, data="dummy")
    out = caffe_pb2.NetParameter()
    out.CopyFrom(src)
    del out.layer[:]
    eng = {"CAFFE": caffe_pb2.ConvolutionParameter.CAFFE,
           "CUDNN": caffe_pb2.ConvolutionParameter.CUDNN}[engine]
    for layer in src.layer:
        if layer.type == "DummyData":
            new = out.layer.add(name=layer.name, type="Input")
            new.top.extend(layer.top)
            for shape in layer.dummy_data_param.shape:
                new.input_param.shape.add().CopyFrom(shape)
            continue
        new = out.layer.add()
        new.CopyFrom(layer)
        if layer.type in ENGINE_FIELD:
            getattr(new, ENGINE_FIELD[layer.type]).engine = eng
    return out


def minicaffe_solver(name, batch, engine, graph=False):
    """An SGD solver on the GPU for the dummy variant of ``name`` (:func:`minicaffe_net_param`)
    with its input drawn once on the device: random normal images, random labels."""
    import cupy as cp
    from minicaffe.proto import caffe_pb2
    from minicaffe.solver import Solver
    p = caffe_pb2.SolverParameter(base_lr=1e-4, momentum=0.9, weight_decay=5e-4,
                                  lr_policy="fixed", max_iter=10**9, display=0, random_seed=1)
    p.net_param.CopyFrom(minicaffe_net_param(name, batch, engine))
    solver = Solver(p, mode="GPU", device_id=0, verbose=False, cuda_graph=graph)
    net = solver.net
    rng = cp.random.default_rng(0)
    net.blobs["data"].data[...] = rng.standard_normal(net.blobs["data"].shape, dtype=cp.float32)
    net.blobs["label"].data[...] = rng.integers(0, 1000, net.blobs["label"].shape).astype(cp.float32)
    return solver


def run_minicaffe(name, batch, engine, iters, warmup, graph=False):
    """``graph``: each iteration replayed as one CUDA graph where it can be captured
    (its two eager warm-up iterations and the capture fall within ``warmup``)."""
    import cupy as cp
    solver = minicaffe_solver(name, batch, engine, graph)
    if graph:
        warmup = max(warmup, 3)  # IterationGraph: two eager iterations, then the capture
    for _ in range(warmup):
        solver.step(1)
    cp.cuda.Device().synchronize()
    times = []
    for _ in range(iters):
        a, b = cp.cuda.Event(), cp.cuda.Event()
        a.record()
        solver.step(1)
        b.record()
        b.synchronize()
        times.append(cp.cuda.get_elapsed_time(a, b))
    loss = float(solver.last_loss)
    pool = cp.get_default_memory_pool()
    out = {"ms": statistics.median(times), "peak_bytes": pool.total_bytes(), "loss": loss,
           "times": times}
    if graph:
        g = solver.graph
        out["graph"] = (f"replayed ({g.captures} capture)" if g is not None and g.captures
                        else f"ran eagerly: {solver.graph_refused or 'not captured'}")
        if g is not None:  # the graph's private pool holds the temporaries
            out["peak_bytes"] += g.pool.total_bytes()
    return out


# ---------------------------------------------------------------- torch
def torch_training_step(name, batch, save_on_cpu=False, arch="torchvision"):
    """One SGD iteration of ``name`` in PyTorch on the GPU as a function (returns the loss):
    float32, TF32 off, ``cudnn.benchmark`` on, data drawn once; ``save_on_cpu``: every tensor
    autograd saves for backward goes to pinned host memory
    (``torch.autograd.graph.save_on_cpu(pin_memory=True)``), PyTorch's own offloading, the
    peer of minicaffe's swap strategies.

    ``arch="torchvision"``: torchvision's model of that name; ``arch="prototxt"``: the very
    network minicaffe trains, its dummy-data prototxt built as PyTorch modules
    (``scripts/torch_peer.py``: Caffe's AlexNet with groups and LRN, Caffe's GoogLeNet with
    LRN and its two weighted auxiliary losses, the ResNets striding in the first 1x1)."""
    import contextlib

    import torch
    torch.backends.cudnn.benchmark = True
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    dev = torch.device("cuda")
    if arch == "prototxt":
        from scripts.gen_prototxt import build
        from scripts.torch_peer import TorchNet
        model = TorchNet(build(name, batch=batch, data="dummy")).to(dev).train()
        shapes = model.input_shapes
        x = torch.randn(shapes["data"], device=dev)
        y = torch.randint(0, model.classes, shapes["label"], device=dev).float()
    elif arch == "torchvision":
        import torchvision
        kw = {"aux_logits": True, "init_weights": True} if name == "googlenet" else {}
        model = getattr(torchvision.models, TORCH_NAMES[name])(**kw).to(dev).train()
        size = INPUT_SIZE.get(name, 224)
        x = torch.randn(batch, 3, size, size, device=dev)
        y = torch.randint(0, 1000, (batch,), device=dev)
    else:
        raise ValueError(f"arch must be 'torchvision' or 'prototxt', not {arch!r}")
    opt = torch.optim.SGD(model.parameters(), lr=1e-4, momentum=0.9, weight_decay=5e-4)
    lossf = torch.nn.CrossEntropyLoss()

    def saving():
        return (torch.autograd.graph.save_on_cpu(pin_memory=True) if save_on_cpu
                else contextlib.nullcontext())

    def step():
        opt.zero_grad(set_to_none=True)
        with saving():
            if arch == "prototxt":
                loss = model(data=x, label=y)[0]
            else:
                out = model(x)
                if name == "googlenet":
                    loss = (lossf(out.logits, y)
                            + 0.3 * (lossf(out.aux_logits1, y) + lossf(out.aux_logits2, y)))
                else:
                    loss = lossf(out, y)
        loss.backward()
        opt.step()
        return loss

    return step


def run_torch(name, batch, iters, warmup, save_on_cpu=False, arch="torchvision"):
    """PyTorch eager on the GPU (:func:`torch_training_step`), timed like minicaffe."""
    import torch
    step = torch_training_step(name, batch, save_on_cpu, arch)
    for _ in range(warmup):
        step()
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    times = []
    for _ in range(iters):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        loss = step()
        b.record()
        b.synchronize()
        times.append(a.elapsed_time(b))
    return {"ms": statistics.median(times), "peak_bytes": torch.cuda.max_memory_reserved(),
            "loss": float(loss.detach()), "times": times}


def torch_available(arch="torchvision") -> bool:
    """PyTorch with CUDA (and torchvision, for its models)."""
    try:
        import torch
        if arch == "torchvision":
            import torchvision  # noqa: F401
        return torch.cuda.is_available()
    except Exception:
        return False


# --------------------------------------------------------------- driver
def one(spec: str, iters: int, warmup: int) -> dict:
    kind, engine, name, batch = spec.split(":")
    batch = int(batch)
    if kind == "torch":     # engine "eager": torchvision's model; "prototxt": the same net
        r = run_torch(name, batch, iters, warmup,
                      arch="prototxt" if engine == "prototxt" else "torchvision")
    else:  # engine CUDNN, CAFFE, or CUDNN+graph, CAFFE+graph
        base, _, extra = engine.partition("+")
        r = run_minicaffe(name, batch, base, iters, warmup, graph=extra == "graph")
    r.update(kind=kind, engine=engine, net=name, batch=batch,
             images_per_s=batch * 1000.0 / r["ms"])
    return r


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--nets", default=DEFAULT_NETS, help="name:batch,...")
    ap.add_argument("--engines", default="CUDNN,CAFFE")
    ap.add_argument("--graph", action="store_true",
                    help="also run each engine with every iteration replayed as one CUDA graph")
    ap.add_argument("--no-torch", action="store_true")
    ap.add_argument("--iters", type=int, default=20)
    ap.add_argument("--warmup", type=int, default=5)
    ap.add_argument("--repeat", type=int, default=2, help="time each configuration this often")
    ap.add_argument("--timeout", type=int, default=600, help="seconds per configuration")
    ap.add_argument("--csv", default=None)
    ap.add_argument("--one", default=None, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.one:
        print("RESULT " + json.dumps(one(args.one, args.iters, args.warmup)))
        return 0

    specs = []
    for item in args.nets.split(","):
        name, batch = item.split(":")
        for eng in [e for e in args.engines.split(",") if e]:
            specs.append(f"minicaffe:{eng}:{name}:{batch}")
            if args.graph:
                specs.append(f"minicaffe:{eng}+graph:{name}:{batch}")
        if not args.no_torch:
            specs.append(f"torch:eager:{name}:{batch}")
            specs.append(f"torch:prototxt:{name}:{batch}")
    if not args.no_torch and not torch_available("prototxt"):
        print("PyTorch with CUDA not available: skipping PyTorch")
        specs = [s for s in specs if not s.startswith("torch")]
    elif not args.no_torch and not torch_available():
        print("torchvision not available: PyTorch runs the prototxt's networks only")
        specs = [s for s in specs if not s.startswith("torch:eager")]

    rows = []
    for spec in specs:
        runs = []
        for r in range(args.repeat):
            t0 = time.time()
            cmd = [sys.executable, __file__, "--one", spec, "--iters", str(args.iters),
                   "--warmup", str(args.warmup)]
            res = run_child(cmd, spec, args.timeout)
            if res is None:
                break
            runs.append(res)
            print(f"{spec} run {r}: {res['ms']:.1f} ms/iter, {res['images_per_s']:.0f} img/s, "
                  f"peak {res['peak_bytes'] / 2**30:.2f} GiB ({time.time() - t0:.0f}s)", flush=True)
        if runs:
            best = dict(runs[0])
            best["ms_runs"] = [x["ms"] for x in runs]
            rows.append(best)

    def who_of(r):
        if r["kind"] != "torch":
            return f"minicaffe {r['engine']}"
        return "pytorch (same net)" if r["engine"] == "prototxt" else "pytorch (torchvision)"

    torch_ips = {(r["net"], r["batch"], r["engine"]): r["images_per_s"]
                 for r in rows if r["kind"] == "torch"}
    print()
    print(f"{'net':<10} {'batch':>5} {'who':<22} {'img/s':>8} {'ms/iter':>9} {'runs (ms)':>18} "
          f"{'peak GiB':>8} {'vs same':>8} {'vs tv':>8}")
    notes = []
    for r in rows:
        ratios = []
        for engine in ("prototxt", "eager"):
            ref = torch_ips.get((r["net"], r["batch"], engine))
            ratios.append(f"{r['images_per_s'] / ref:.2f}" if ref else "-")
        runs = "/".join(f"{m:.1f}" for m in r["ms_runs"])
        print(f"{r['net']:<10} {r['batch']:>5} {who_of(r):<22} {r['images_per_s']:>8.0f} "
              f"{r['ms']:>9.1f} {runs:>18} {r['peak_bytes'] / 2**30:>8.2f} {ratios[0]:>8} "
              f"{ratios[1]:>8}")
        r["vs_same"], r["vs_torch"] = ratios
        if r.get("graph", "").startswith("ran eagerly"):
            notes.append(f"{r['net']} {who_of(r)}: {r['graph']}")
    for line in notes:
        print(line)
    if args.csv:
        os.makedirs(os.path.dirname(os.path.abspath(args.csv)), exist_ok=True)
        with open(args.csv, "w", newline="") as f:
            w = csv.writer(f)
            w.writerow(["net", "batch", "who", "images_per_s", "ms_per_iter", "ms_runs",
                        "peak_bytes", "vs_torch", "graph", "vs_same_net"])
            for r in rows:
                w.writerow([r["net"], r["batch"], who_of(r), f"{r['images_per_s']:.1f}",
                            f"{r['ms']:.2f}", "/".join(f"{m:.2f}" for m in r["ms_runs"]),
                            r["peak_bytes"], r["vs_torch"], r.get("graph", ""), r["vs_same"]])
    return 0


if __name__ == "__main__":
    sys.exit(main())
