#!/usr/bin/env python3
"""The paper's Figure 1: the memory footprint of seven networks at several minibatch sizes.

For each network and minibatch k, what Caffe allocates with every buffer resident (the paper's
baseline; CAFFE_FACTS, "Memory that Caffe allocates"), stacked by category as
:func:`swap.memory.caffe_breakdown` counts it: parameters, their diffs, solver history, feature
maps (blob data and saved layer internals), blob diffs, workspace (the convolution's one-image
im2col) and Caffe's extra reservations.  Over each bar, a white circle marks the peak live
memory of one layer (the paper's "peak real-time memory usage"): the most bytes any single
forward or backward step touches, i.e. the buffers of :class:`swap.gmap.Step`'s ``reads``,
``writes`` and ``scratch`` (its inputs, outputs, their diffs, its saved internals and scratch,
and its own parameters and their diffs), at Caffe's sizes.  A dashed line marks the budget
(12 GiB, the paper's "mid-to-high end GPU").

Per network it also reports:

* Caffe's max trainable minibatch under the budget (:func:`swap.memory.caffe_max_batch`; the
  paper's Table 1 baseline, measured on an M40, is printed beside it);
* the layer-wise bound: the largest k at which the one-layer peak still fits the budget, the
  upper bound of any layer-wise swapping scheme (all other data off the device);
* minicaffe's own ``naive`` k_max (:func:`swap.plan.max_batch`: the layer-wise plan with every
  parameter, diff and history resident, its own chunked im2col and the arena layout), which
  lies below that bound.

No device is involved: the nets are built on the CPU at minibatch ``--k0`` (2; sizes are linear
in k, section 3, so ``GMAP.at(k)`` gives every other k without rebuilding) and only analysed.

    python3 scripts/fig1_memory.py                                 # 7 nets, k = 16..256, ~15 s
    python3 scripts/fig1_memory.py --ks 32,64 --budget 24G --nets resnet101,resnet152
    python3 scripts/fig1_memory.py --quick --out-dir /tmp/fig1     # two small nets (the test)

Writes ``<out-dir>/<prefix>.csv`` (one row per net and k, bytes), ``.png`` and ``.md`` (the
tables, with the device, date and command, for docs/RESULTS.md).
"""
from __future__ import annotations

import argparse
import csv
import datetime
import os
import platform
import shlex
import sys
import time

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if REPO not in sys.path:
    sys.path.insert(0, REPO)

NETS = ("alexnet", "googlenet", "vgg16", "resnet34", "resnet50", "resnet101", "resnet152")
QUICK_NETS = ("cifar10_quick", "digits")
KS = (16, 32, 64, 128, 256)
BUDGET = "12G"
QUICK_BUDGET = "32M"
LABELS = {"alexnet": "AlexNet", "googlenet": "GoogLeNet", "vgg16": "VGG-16",
          "resnet34": "ResNet-34", "resnet50": "ResNet-50", "resnet101": "ResNet-101",
          "resnet152": "ResNet-152", "cifar10_quick": "CIFAR-10 quick", "digits": "LeNet (digits)"}
# Table 1 of the paper: Caffe's max trainable minibatch at 12 GB (M40, cuDNN)
PAPER_CAFFE_MAX_K = {"alexnet": 848, "googlenet": 150, "vgg16": 80, "resnet34": 91,
                     "resnet50": 33, "resnet101": 20, "resnet152": 13}
COLORS = {"params": "#4c72b0", "param diffs": "#8da0cb", "history": "#b3b3b3",
          "feature maps": "#dd8452", "diffs": "#55a868", "workspace": "#c44e52",
          "caffe extra": "#8172b2"}


# ------------------------------------------------------------------- analysis
def net_param(name: str, k0: int):
    """The NetParameter of ``prototxt/<name>/dummy.prototxt`` (or of the prototxt file
    ``name``) with the batch of its DummyData / Input tops set to ``k0``."""
    from minicaffe.proto import read_net_param
    path = name if name.endswith(".prototxt") else os.path.join(REPO, "prototxt", name,
                                                                 "dummy.prototxt")
    if not os.path.exists(path):
        known = sorted(d for d in os.listdir(os.path.join(REPO, "prototxt"))
                       if os.path.exists(os.path.join(REPO, "prototxt", d, "dummy.prototxt")))
        raise SystemExit(f"no net {name!r}: {path} does not exist (known: {', '.join(known)}, "
                         "or a path ending in .prototxt)")
    param = read_net_param(path)
    found = False
    for layer in param.layer:
        shapes = (layer.dummy_data_param.shape if layer.type == "DummyData" else
                  layer.input_param.shape if layer.type == "Input" else ())
        for s in shapes:
            if s.dim:
                s.dim[0] = k0
                found = True
    if not found:
        raise SystemExit(f"{path}: no DummyData or Input layer whose batch could be set")
    return param


def analyse(name: str, k0: int = 2, solver_type: str = "SGD"):
    """The GMAP of net ``name`` built on the CPU at minibatch ``k0`` (TRAIN phase)."""
    from minicaffe.net import TRAIN, Net
    from swap.gmap import build_gmap
    net = Net(net_param(name, k0), TRAIN, mode="CPU")
    return build_gmap(net, solver_type=solver_type)


class LayerPeak:
    """The most bytes one step touches, at Caffe's sizes, as a function of k.

    A step touches ``reads | writes | scratch`` (:attr:`swap.gmap.Step.touches`): for a
    forward step its bottoms, tops, saved internals, scratch and parameters; for a backward
    step what its ``backward_reads()`` name, the tops' diffs, the bottoms' diffs, its scratch,
    its parameters and their diffs.  Everything else could be off the device meanwhile, so
    ``budget >= peak(k)`` is necessary for any layer-wise scheme at k.

    ``resident=True`` adds every parameter, parameter diff and history of the net (constant in
    k), as a layer-wise plan that swaps only feature maps holds them: the real-time memory of
    a layer-wise run."""

    RESIDENT = ("param", "param_diff", "history")

    def __init__(self, gmap):
        self.gmap = gmap
        bufs = gmap.buffers

        def size(b):
            return b.caffe if b.caffe is not None else b.size
        self._sizes = [[size(bufs[b]) for b in s.touches] for s in gmap.steps]
        self._dynamic = [[size(bufs[b]) for b in s.touches if bufs[b].kind not in self.RESIDENT]
                         for s in gmap.steps]
        self.resident = sum(b.caffe_nbytes(gmap.k) for b in bufs if b.kind in self.RESIDENT)

    def at(self, k: int, resident: bool = False) -> tuple[int, int]:
        """(bytes, step index) of the largest step at minibatch k."""
        best, where = -1, 0
        for j, sizes in enumerate(self._dynamic if resident else self._sizes):
            v = sum(s.at(k) for s in sizes)
            if v > best:
                best, where = v, j
        return best + (self.resident if resident else 0), where

    def bound(self, budget: int, resident: bool = False, k_limit: int = 1 << 20) -> int:
        """The largest k whose one-layer peak fits ``budget`` (0: not even k = 1)."""
        from swap.plan import largest_k
        return largest_k(lambda k: self.at(k, resident)[0] <= budget, k_limit)


def measure(names, ks, budget: int, k0: int = 2, log=print) -> tuple[list, list]:
    """(rows, summary): one row per (net, k) and one summary per net (module doc)."""
    from swap.memory import CATEGORIES, caffe_breakdown, caffe_max_batch, caffe_total
    from swap.plan import max_batch
    rows, summary = [], []
    for name in names:
        t0 = time.time()
        g = analyse(name, k0)
        peak = LayerPeak(g)
        caffe_k = caffe_max_batch(g, budget)
        bound_k = peak.bound(budget)
        bound_res_k = peak.bound(budget, resident=True)
        naive_k = max_batch(g, "naive", budget)
        const = caffe_total(g.at(1)) - (caffe_total(g.at(2)) - caffe_total(g.at(1)))
        per_image = caffe_total(g.at(2)) - caffe_total(g.at(1))
        pb, pj = peak.at(bound_k or 1)
        summary.append({"net": name, "label": LABELS.get(name, g.net_name), "steps": g.n_steps,
                        "constant_bytes": const, "per_image_bytes": per_image,
                        "caffe_max_k": caffe_k, "layer_bound_k": bound_k,
                        "layer_bound_resident_k": bound_res_k,
                        "naive_k_max": naive_k, "paper_caffe_max_k": PAPER_CAFFE_MAX_K.get(name),
                        "bound_step": str(g.steps[pj])})
        for k in ks:
            gk = g.at(k)
            br = caffe_breakdown(gk)
            pb, pj = peak.at(k)
            total = sum(br.values())
            row = {"net": name, "k": k}
            row.update({cat: br[cat] for cat, _ in CATEGORIES})
            row.update(total=total, layer_peak=pb, layer_peak_step=str(gk.steps[pj]),
                       layer_peak_share=pb / total,
                       layer_peak_resident=peak.at(k, resident=True)[0],
                       caffe_max_k=caffe_k, layer_bound_k=bound_k,
                       layer_bound_resident_k=bound_res_k, naive_k_max=naive_k, budget=budget)
            rows.append(row)
        log(f"{name}: {g.n_steps} steps; Caffe max k {caffe_k}, layer-wise bound {bound_k}, "
            f"naive k_max {naive_k} at {budget / 2**30:g} GiB ({time.time() - t0:.1f}s)")
    return rows, summary


# -------------------------------------------------------------------- outputs
def device_line() -> str:
    return (f"static analysis on the CPU ({platform.processor() or platform.machine()}, "
            f"{platform.node()}): byte counts of the GMAP, no device involved")


def write_csv(rows, path):
    from swap.memory import CATEGORIES
    keys = (["net", "k"] + [c for c, _ in CATEGORIES]
            + ["total", "layer_peak", "layer_peak_step", "layer_peak_share",
               "layer_peak_resident", "caffe_max_k", "layer_bound_k", "layer_bound_resident_k",
               "naive_k_max", "budget"])
    with open(path, "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=keys)
        w.writeheader()
        for r in rows:
            w.writerow({k: (f"{r[k]:.6f}" if k == "layer_peak_share" else r[k]) for k in keys})


def unit_of(budget: int) -> tuple[str, float]:
    """GiB for budgets of a GiB or more, else MiB (the tables' and the plot's unit)."""
    return ("GiB", 2.0 ** 30) if budget >= 2 ** 30 else ("MiB", 2.0 ** 20)


def write_md(rows, summary, ks, budget, path, command, date):
    from swap.memory import fmt_bytes
    by = {(r["net"], r["k"]): r for r in rows}
    unit, div = unit_of(budget)

    def fmt(n):
        return f"{n / div:.2f}" if n >= div / 10 else f"{n / div:.3f}"
    lines = [f"Figure 1, memory footprint with every buffer resident (Caffe's accounting, "
             f"`swap.memory.caffe_breakdown`), budget {fmt_bytes(budget)}; {device_line()}; "
             f"{date}; `{command}`", "",
             f"Caffe's footprint in {unit} at minibatch k, and in parentheses the peak live memory "
             "of one layer (the most bytes one forward or backward step touches):", "",
             "| net | " + " | ".join(f"k = {k}" for k in ks) + " |",
             "|---|" + "---|" * len(ks)]
    for s in summary:
        cells = [f"{fmt(by[(s['net'], k)]['total'])} ({fmt(by[(s['net'], k)]['layer_peak'])})"
                 for k in ks]
        lines.append(f"| {s['label']} | " + " | ".join(cells) + " |")
    lines += ["", f"At {fmt_bytes(budget)}:", "",
              "| net | constant in k | per image | Caffe max k | paper's "
              "Caffe max k (M40) | naive k_max (minicaffe) | layer-wise bound k | the same "
              "with all parameters resident | largest layer at the bound |",
              "|---|---|---|---|---|---|---|---|---|"]
    for s in summary:
        paper = s["paper_caffe_max_k"]
        lines.append(f"| {s['label']} | {fmt_bytes(s['constant_bytes'])} | "
                     f"{fmt_bytes(s['per_image_bytes'])} | {s['caffe_max_k']} | "
                     f"{'-' if paper is None else paper} | {s['naive_k_max']} | "
                     f"{s['layer_bound_k']} | {s['layer_bound_resident_k']} | "
                     f"{s['bound_step']} |")
    lines += ["", "Constant in k: parameters, their diffs and history, the one-image im2col and "
              "other fixed buffers; per image: what each image of the minibatch adds. "
              "Caffe max k: the largest k whose footprint fits the budget "
              "(`swap.memory.caffe_max_batch`). Layer-wise bound: the largest k at which the "
              "one-layer peak still fits, the upper bound of layer-wise swapping; with all "
              "parameters resident: the same with every parameter, parameter diff and history "
              "added, as a plan that swaps only feature maps holds them. naive k_max: "
              "minicaffe's layer-wise plan (`swap.plan.max_batch`, every parameter, diff and "
              "history resident, its chunked im2col and its arena layout)."]
    r101 = by.get(("resnet101", 64))
    if r101 is not None:
        lines += ["", f"ResNet-101 at k = 64: one layer needs {100 * r101['layer_peak_share']:.1f}"
                  f" % of the footprint ({fmt(r101['layer_peak'])} of {fmt(r101['total'])} {unit}),"
                  f" {100 * r101['layer_peak_resident'] / r101['total']:.1f} % with all "
                  "parameters, their diffs and history resident (the paper: about 4 %)."]
    with open(path, "w") as f:
        f.write("\n".join(lines) + "\n")


def plot(rows, summary, ks, budget, path, title=None):
    """Stacked bars per net (groups) and k (bars), one-layer peaks as white circles, the
    budget dashed; the lower panel repeats the bars up to twice the budget."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from swap.memory import CATEGORIES
    by = {(r["net"], r["k"]): r for r in rows}
    unit, div = unit_of(budget)
    width, gap = 0.8, 1.2
    xs, labels, centers = [], [], []
    x = 0.0
    for s in summary:
        group = []
        for k in ks:
            xs.append((s["net"], k, x))
            labels.append(str(k))
            group.append(x)
            x += 1
        centers.append((sum(group) / len(group), s["label"]))
        x += gap
    fig, axes = plt.subplots(2, 1, figsize=(max(8, 0.42 * len(xs) + 2), 8.5),
                             gridspec_kw={"height_ratios": [3, 2]})
    top = max(r["total"] for r in rows) / div
    for ax, ylim in zip(axes, (1.05 * max(top, budget / div), 2.0 * budget / div)):
        for net, k, xi in xs:
            r = by[(net, k)]
            bottom = 0.0
            for cat, _ in CATEGORIES:
                h = r[cat] / div
                if h:
                    ax.bar(xi, h, width, bottom=bottom, color=COLORS[cat],
                           label=cat if (net, k) == xs[0][:2] else None)
                bottom += h
            ax.plot(xi, r["layer_peak"] / div, "o", mfc="white", mec="black", ms=5, zorder=3,
                    label="one-layer peak" if (net, k) == xs[0][:2] else None)
        ax.axhline(budget / div, color="black", ls="--", lw=1.2,
                   label=f"{budget / div:g} {unit}")
        ax.set_ylim(0, ylim)
        ax.set_ylabel(unit)
        ax.set_xticks([xi for _, _, xi in xs], labels, fontsize=7)
        ax.set_xlim(-0.8, xs[-1][2] + 0.8)
        for c, name in centers:
            ax.text(c, -0.09, name, transform=ax.get_xaxis_transform(), ha="center",
                    va="top", fontsize=9)
        ax.grid(axis="y", alpha=0.3)
    axes[0].legend(loc="upper left", fontsize=8, ncol=2)
    axes[0].set_title(title or "Memory footprint, every buffer resident (Caffe's accounting); "
                      "bars: minibatch k")
    axes[1].set_title(f"the same, up to {2 * budget / div:g} {unit}", fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


# ----------------------------------------------------------------------- main
def _ints(text) -> tuple:
    return tuple(int(x) for x in str(text).split(",") if x.strip())


def main(argv=None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--nets", default=None,
                    help=f"comma-separated names under prototxt/ or .prototxt paths (default "
                         f"{','.join(NETS)}; --quick: {','.join(QUICK_NETS)})")
    ap.add_argument("--ks", default=",".join(map(str, KS)), help="minibatch sizes to draw")
    ap.add_argument("--budget", default=None,
                    help=f"the line and the max minibatches (default {BUDGET}; --quick: "
                         f"{QUICK_BUDGET}); binary units")
    ap.add_argument("--k0", type=int, default=2, help="minibatch the nets are built at")
    ap.add_argument("--quick", action="store_true", help="two small nets (the CPU test)")
    ap.add_argument("--out-dir", default=os.path.join(REPO, "docs", "results"))
    ap.add_argument("--prefix", default=None,
                    help="file names (default fig1_memory, --quick: fig1_memory_quick)")
    args = ap.parse_args(argv)
    from swap.memory import fmt_bytes, parse_bytes
    names = ([n.strip() for n in args.nets.split(",") if n.strip()] if args.nets
             else list(QUICK_NETS if args.quick else NETS))
    ks = _ints(args.ks)
    if not ks or min(ks) < 1:
        ap.error(f"--ks must be positive minibatch sizes, got {args.ks!r}")
    if args.k0 < 1:
        ap.error(f"--k0 must be positive, got {args.k0}")
    budget = parse_bytes(args.budget or (QUICK_BUDGET if args.quick else BUDGET))
    prefix = args.prefix or ("fig1_memory_quick" if args.quick else "fig1_memory")
    os.makedirs(args.out_dir, exist_ok=True)
    base = os.path.join(args.out_dir, prefix)
    command = "python3 scripts/fig1_memory.py" + (" " + shlex.join(argv) if argv else "")
    date = datetime.date.today().isoformat()
    t0 = time.time()
    rows, summary = measure(names, ks, budget, args.k0)
    write_csv(rows, base + ".csv")
    write_md(rows, summary, ks, budget, base + ".md", command, date)
    plot(rows, summary, ks, budget, base + ".png")
    unit, div = unit_of(budget)
    print()
    print(f"{'net':<16}{'Caffe max k':>12}{'layer bound':>12}{'naive k_max':>12}  "
          + "  ".join(f"k={k}: {unit} (peak)" for k in ks))
    for s in summary:
        cells = [f"{r['total'] / div:.2f} ({r['layer_peak'] / div:.3f})"
                 for r in rows if r["net"] == s["net"]]
        print(f"{s['net']:<16}{s['caffe_max_k']:>12}{s['layer_bound_k']:>12}"
              f"{s['naive_k_max']:>12}  " + "  ".join(cells))
    print(f"\nbudget {fmt_bytes(budget)}; {len(names)} nets in {time.time() - t0:.1f}s; "
          f"{base}.csv, {base}.md, {base}.png")
    return 0


if __name__ == "__main__":
    sys.exit(main())
