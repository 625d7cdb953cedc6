"""Memory accounting: breakdowns by category, Caffe's footprint, byte sizes for people.

Categories follow the paper's terms (Algorithm 2 separates M_para, M_ws and M_FM): parameters,
their diffs, solver history, feature maps (blob data and saved layer internals), blob diffs,
workspace (scratch internals), and Caffe's extra reservations.

``caffe_breakdown`` is the accounting of the ``none`` baseline as CAFFE_FACTS describes it
("Memory that Caffe allocates"): every buffer at the size Caffe gives it (one image of im2col per
CAFFE-engine convolution instead of minicaffe's chunk of images) plus what Caffe keeps that
minicaffe does not (the Data layer's prefetched batches, BatchNorm's extra full-size copies, the
data blob's diff under a CAFFE convolution, cuDNN workspaces).  Scaled to a 12 GiB budget it
gives the paper's "Caffe max trainable minibatch" within a few percent.  The ``none`` plan holds
minicaffe's own buffers plus those reservations; ``swap.runtime.install`` runs it with Caffe's
one-image lowering (``GMAP.caffe_lowering``), so it equals this total (up to alignment).  With
the chunked lowering of the other strategies it would exceed it by the larger im2col chunks.
"""
from __future__ import annotations

import re

from .arena import align
from .gmap import (CAFFE, CONST_DIFF, DATA, DIFF, GMAP, HISTORY, PARAM, PARAM_DIFF, SAVED,
                   SCRATCH)

CATEGORIES = (
    ("params", (PARAM,)),
    ("param diffs", (PARAM_DIFF,)),
    ("history", (HISTORY,)),
    ("feature maps", (DATA, SAVED)),
    ("diffs", (DIFF, CONST_DIFF)),
    ("workspace", (SCRATCH,)),
    ("caffe extra", (CAFFE,)),
)
_CATEGORY_OF = {kind: name for name, kinds in CATEGORIES for kind in kinds}

_UNITS = {"": 1, "K": 1 << 10, "M": 1 << 20, "G": 1 << 30, "T": 1 << 40}


def parse_bytes(text) -> int:
    """``"12G"``, ``"1.5GiB"``, ``"512M"``, ``"4096"`` -> bytes.

    Units are binary (K = 1024), as GPU memory is quoted: ``12G`` is 12 GiB; ``B``, ``iB`` and
    ``GB`` spellings mean the same.
    """
    if isinstance(text, (int, float)):
        return int(text)
    m = re.fullmatch(r"\s*([0-9]*\.?[0-9]+)\s*([KMGT]?)(?:I?B)?\s*", str(text).upper())
    if not m:
        raise ValueError(f"cannot read {text!r} as a size: give bytes or a number with K, M, G "
                         "or T (binary units), for example 12G or 1536M")
    return int(float(m.group(1)) * _UNITS[m.group(2)])


def fmt_bytes(n) -> str:
    """Bytes for people: ``10.68 GiB``."""
    if n is None:
        return "unbounded"
    n = float(n)
    for unit in ("B", "KiB", "MiB", "GiB"):
        if abs(n) < 1024 or unit == "GiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.2f} {unit}"
        n /= 1024
    return f"{n:.2f} GiB"


def category(kind: str) -> str:
    return _CATEGORY_OF[kind]


def breakdown(plan, step: int | None = None) -> dict:
    """Bytes by category held while ``step`` computes (default: the plan's peak step).

    Aligned sizes, as the arena reserves them; the values sum to ``plan.usage[step]``.
    """
    g = plan.gmap
    step = plan.peak_step if step is None else step
    out = {name: 0 for name, _ in CATEGORIES}
    sizes = [align(b.nbytes(g.k)) for b in g.buffers]
    for bid in plan.resident_at(step):
        out[category(g.buffers[bid].kind)] += sizes[bid]
    return out


def gmap_breakdown(gmap: GMAP) -> dict:
    """Bytes by category of every buffer (unaligned): the network-wide footprint."""
    out = {name: 0 for name, _ in CATEGORIES}
    for b in gmap.buffers:
        out[category(b.kind)] += b.nbytes(gmap.k)
    return out


def caffe_breakdown(gmap: GMAP) -> dict:
    """What Caffe allocates for this net at ``gmap.k``, by category (see the module doc)."""
    out = {name: 0 for name, _ in CATEGORIES}
    for b in gmap.buffers:
        out[category(b.kind)] += b.caffe_nbytes(gmap.k)
    return out


def caffe_total(gmap: GMAP) -> int:
    return sum(caffe_breakdown(gmap).values())


def caffe_max_batch(gmap: GMAP, budget: int, k_limit: int = 1 << 20) -> int:
    """Caffe's max trainable minibatch under ``budget`` (the Table 1 baseline): the largest k
    whose exact total fits, by doubling and bisection (:func:`swap.plan.largest_k`).  Not a
    line through k = 1 and 2: a cuDNN convolution's workspace is neither constant nor linear
    in k (AlexNet under CUDNN: a line flatter than the truth started a walk near k_limit)."""
    from .plan import largest_k
    return largest_k(lambda k: caffe_total(gmap.at(k)) <= budget, k_limit)


def memory_report(gmap: GMAP, budget: int | None = None,
                  strategies=("none", "naive", "vdnn", "recompute")) -> str:
    """The ``minicaffe mem`` table: per strategy the bytes by category at its peak step, the
    peak (eq. 4), the arena it needs, and the largest minibatch under ``budget``."""
    from .plan import SETUP, make_plan, max_batch

    names = [name for name, _ in CATEGORIES]
    head = ["strategy"] + names + ["peak", "arena", "peak at"]
    if budget is not None:
        head.append(f"max k @ {fmt_bytes(budget)}")
    rows = []
    cb = caffe_breakdown(gmap)
    row = ["caffe"] + [fmt_bytes(cb[n]) for n in names] + [fmt_bytes(sum(cb.values())), "-",
                                                             "resident"]
    if budget is not None:
        row.append(str(caffe_max_batch(gmap, budget)))
    rows.append(row)
    for s in strategies:
        g = gmap.caffe_lowering() if s == "none" else gmap    # as swap.runtime.install runs it
        plan = make_plan(g, s, None)
        br = breakdown(plan)
        j = plan.peak_step
        at = "setup" if j == SETUP else f"{g.steps[j].name} ({g.steps[j].phase})"
        row = [s] + [fmt_bytes(br[n]) for n in names] + [fmt_bytes(plan.peak),
                                                          fmt_bytes(plan.arena_bytes), at]
        if budget is not None:
            row.append(str(max_batch(g, s, budget)))
        rows.append(row)
    widths = [max(len(r[i]) for r in rows + [head]) for i in range(len(head))]
    text_cols = (0, head.index("peak at"))          # left-aligned; numbers right-aligned

    def fmt(r):
        return "  ".join(c.ljust(w) if i in text_cols else c.rjust(w)
                         for i, (c, w) in enumerate(zip(r, widths))).rstrip()
    lines = [f"net {gmap.net_name!r}: minibatch {gmap.k} ({len(gmap.steps)} steps, "
             f"{len(gmap.buffers)} buffers, {gmap.flops() / 1e9:.1f} GFLOP per iteration)",
             fmt(head)] + [fmt(r) for r in rows]
    lines.append("caffe: what Caffe allocates (CAFFE_FACTS; the paper's baseline). none: "
                 "minicaffe with everything resident and Caffe's one-image im2col, plus "
                 "Caffe's extra reservations. "
                 "Breakdowns at each plan's peak step; arena = smallest budget that works.")
    return "\n".join(lines)
