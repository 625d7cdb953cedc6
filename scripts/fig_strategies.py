#!/usr/bin/env python3
"""The paper's evaluation figure: memory and time of none, naive, vDNN and dynamic per network.

Nothing is measured here: every number is read from a result file already written by
``scripts/swap_budgets.py`` or ``scripts/tuner_table.py``, and each row of the outputs names its
file, the row (or JSON key) in it, the device and the date.  A point no file holds is shown as
missing, never estimated.

Per network at the paper's minibatch (AlexNet 256, GoogLeNet 128, VGG-16 64, ResNet-34 128,
ResNet-50 64, ResNet-101 32, ResNet-152 32), five strategies:

* ``none``, Caffe's one-image im2col (every buffer resident, what Caffe allocates):
  ``docs/results/swap_budgets_none_caffe_lowering.csv``;
* ``none``, minicaffe's chunked im2col (the engine's own speed without swapping), ``naive`` and
  ``vdnn``: ``docs/results/swap_budgets.csv``.  A row without a ``lowering`` column comes from
  before the column existed, when every strategy ran the chunked im2col: it counts as chunked;
* ``dynamic``: the tuner's JSON ``docs/results/tuner/<net>.json``, or where a network has
  none, Table 3's ``docs/results/table3/<net>.json`` (its dynamic plan at k* and at the vDNN
  comparison's fixed minibatch, measured the same way).  The tuner measures its plans
  at its own k (k*, Caffe's largest k and k*/2 at a 12 GiB budget), not at the paper's batch; the
  point drawn is the successfully measured one whose k is closest to the paper's batch (ties:
  the smaller k; ``at_batch.chosen``, a measurement at exactly the paper's batch, wins when
  present).  A network without a JSON has no dynamic bar, and a note says so.

The two panels:

* **memory**: the arena's high-water mark in GiB (the most device bytes the strategy held, its
  scratch reserve for CuPy's temporaries included: the one quantity measured for all five).  A
  black tick marks the smallest verified budget of none, naive and vDNN; dynamic ran inside the
  tuner's budget (12 GiB), which is no smallest budget and is not drawn.  Dynamic's memory is the
  one measured at its k, not scaled to the paper's batch: memory is not proportional to k
  (parameters, their diffs and history are constant), so a scaled value would be an estimate;
* **time per image** (ms per iteration / minibatch, log scale): per image so that dynamic, at
  another k, sits on the same axis.  For the others k is the paper's batch, and the tables give
  ms per iteration too.

    python3 scripts/fig_strategies.py                       # the committed GPU results, ~2 s
    python3 scripts/fig_strategies.py --quick --out-dir /tmp/fs --work /tmp/fs/src   # the test

``--quick`` first runs ``scripts/swap_budgets.py --quick`` (twice: chunked im2col for all three
strategies, then ``none`` with Caffe's im2col) and ``scripts/tuner_table.py --quick`` on the CPU
into ``--work`` (default: a new temporary directory, kept), then draws cifar10_quick at its
batch 4 from those files, as the full run draws the committed ones.

Writes ``<out-dir>/<prefix>.csv`` (one row per net and strategy, bytes and ms as in the source),
``.png`` and ``.md`` (the table with sources, devices and dates, and the caption).
"""
from __future__ import annotations

import argparse
import csv
import datetime
import json
import os
import re
import shlex
import subprocess
import sys
import tempfile
import time

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if REPO not in sys.path:
    sys.path.insert(0, REPO)

RESULTS = os.path.join(REPO, "docs", "results")
NETS = "alexnet:256,googlenet:128,vgg16:64,resnet34:128,resnet50:64,resnet101:32,resnet152:32"
QUICK_NETS = "cifar10_quick:4"
LABELS = {"alexnet": "AlexNet", "googlenet": "GoogLeNet", "vgg16": "VGG-16",
          "resnet34": "ResNet-34", "resnet50": "ResNet-50", "resnet101": "ResNet-101",
          "resnet152": "ResNet-152", "cifar10_quick": "CIFAR-10 quick"}
# (key, label, strategy in swap_budgets.csv, its convolution lowering); dynamic: the tuner JSON
STRATEGIES = (("none_caffe", "none (Caffe im2col)", "none", "caffe"),
              ("none_chunked", "none (chunked im2col)", "none", "chunked"),
              ("naive", "naive", "naive", "chunked"),
              ("vdnn", "vDNN", "vdnn", "chunked"),
              ("dynamic", "dynamic (tuner, nearest k)", None, None))
COLORS = {"none_caffe": "#8c8c8c", "none_chunked": "#c7c7c7", "naive": "#4c72b0",
          "vdnn": "#55a868", "dynamic": "#dd8452"}
CSV_KEYS = ("net", "paper_batch", "strategy", "label", "k", "lowering", "budget_bytes",
            "budget_kind", "high_water_bytes", "ms_per_iter", "ms_per_image", "images_per_s",
            "device", "date", "date_from", "source", "locator", "note")
CAPTION = (
    "Memory: the arena's high-water mark ({unit}; the scratch reserve for CuPy's temporaries "
    "included), a black tick at the smallest verified budget (none, naive, vDNN). Time: ms per "
    "image = ms per iteration / minibatch. none, naive and vDNN are measured at the paper's "
    "minibatch. **dynamic is measured at the tuner's k, not at the paper's batch**: the bar is the "
    "measured k closest to the paper's batch (its k is written on it), its time normalized per "
    "image, its memory the one measured at that k (not scaled: memory is not proportional to "
    "k). A network without a tuner JSON has no dynamic bar. Missing points are marked n/a; no "
    "value is estimated.")


# -------------------------------------------------------------------- sources
def rel(path: str) -> str:
    """``path`` relative to the repository when inside it (the tables' citations)."""
    a = os.path.abspath(path)
    return os.path.relpath(a, REPO) if a.startswith(REPO + os.sep) else a


def file_date(path: str) -> tuple[str, str]:
    """(date, where it comes from) of a result file: the date in the first line of the markdown
    table written beside it (``swap_budgets.py`` and ``tuner_table.py`` end their header with
    it), else the date of the last commit that touched the file, else unknown."""
    md = os.path.splitext(path)[0] + ".md"
    if os.path.exists(md):
        with open(md) as f:
            first = f.readline()
        dates = re.findall(r"\b(\d{4}-\d{2}-\d{2})\b", first)
        if dates:
            return dates[-1], f"header of {rel(md)}"
    try:
        out = subprocess.run(["git", "log", "-1", "--format=%ad", "--date=short", "--",
                              os.path.abspath(path)], capture_output=True, text=True, cwd=REPO,
                             timeout=30).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        out = ""
    if out:
        return out, "last commit of the file"
    return "", "unknown"


def _int(text):
    return None if text in (None, "", "None") else int(text)


def _float(text):
    return None if text in (None, "", "None") else float(text)


def read_swap_rows(paths) -> list[dict]:
    """Every row of the ``swap_budgets.py`` CSVs ``paths``, in order, with ``_source`` (path),
    ``_row`` (1-based data row) and ``_lowering`` (the column, or "chunked" where the file has
    none: module doc)."""
    rows = []
    for path in paths:
        if not os.path.exists(path):
            continue
        with open(path, newline="") as f:
            for i, r in enumerate(csv.DictReader(f), 1):
                r["_source"], r["_row"] = path, i
                r["_lowering"] = r.get("lowering") or "chunked"
                rows.append(r)
    return rows


def swap_point(rows, paths, net, batch, key, strategy, lowering) -> dict:
    """The output row of ``strategy`` with ``lowering`` for net:batch (first match in file
    order), or a row of missing values that says where it was looked for."""
    out = empty(net, batch, key)
    out["lowering"] = lowering
    for r in rows:
        if (r["net"], int(r["batch"]), r["strategy"], r["_lowering"]) != (net, batch, strategy,
                                                                           lowering):
            continue
        date, how = file_date(r["_source"])
        out.update(k=int(r["batch"]), budget_bytes=_int(r.get("budget_bytes")),
                   budget_kind="smallest verified", high_water_bytes=_int(r.get("high_water")),
                   ms_per_iter=_float(r.get("ms")), images_per_s=_float(r.get("images_per_s")),
                   device=r.get("device", ""), date=date, date_from=how,
                   source=rel(r["_source"]), locator=f"row {r['_row']}")
        if out["ms_per_iter"] is not None:
            out["ms_per_image"] = out["ms_per_iter"] / out["k"]
        else:
            out["note"] = f"failed in the source ({len(json.loads(r.get('attempts') or '[]'))} " \
                          "attempts, none trained)"
            out["budget_kind"] = ""
        return out
    out["note"] = (f"no row {net},{batch},{strategy} with {lowering} im2col in "
                   + ", ".join(rel(p) for p in paths))
    return out


def dynamic_candidates(doc) -> list[tuple[str, dict]]:
    """(JSON key, measurement) of every dynamic point measured without error."""
    cands = []
    chosen = (doc.get("at_batch") or {}).get("chosen")
    if chosen and "error" not in chosen:
        cands.append(("at_batch.chosen", chosen))
    for i, d in enumerate(doc.get("dynamic", [])):
        if "error" not in d and d.get("ms") is not None:
            cands.append((f"dynamic[{i}]", d))
    return cands


def dynamic_point(tuner_dir, net, batch) -> dict:
    """The dynamic row of net: the measured k closest to ``batch`` (module doc)."""
    out = empty(net, batch, "dynamic")
    path = os.path.join(tuner_dir, f"{net}.json")
    t3 = os.path.join(os.path.dirname(os.path.abspath(tuner_dir)), "table3", f"{net}.json")
    if not os.path.exists(path) and os.path.exists(t3):
        # Table 3's run measured the tuner's plan too: at k* and, for the vDNN comparison,
        # at a fixed minibatch (scripts/table3.py); same measurement, same fields
        path = t3
        with open(path) as f:
            doc = json.load(f)
        cands = [(where, d) for where, d in (("accudnn", doc.get("accudnn")),
                                             ("fixed.dynamic", (doc.get("fixed") or {})
                                              .get("dynamic")))
                 if d and "ms" in d and d.get("k")]
        doc["tuner"] = {"k_star": (doc.get("accudnn") or {}).get("k", "?")}
    elif not os.path.exists(path):
        prof = os.path.join(tuner_dir, f"{net}_profile.json")
        out["note"] = (f"no tuner JSON {rel(path)}" + (f" (only its profile, {rel(prof)}, is "
                       "stored)" if os.path.exists(prof) else "") + ": dynamic not measured"
                       + table_rows_elsewhere(tuner_dir, net))
        return out
    else:
        with open(path) as f:
            doc = json.load(f)
        cands = dynamic_candidates(doc)
    out.update(source=rel(path), device=doc.get("device", ""), date=doc.get("date", ""),
               date_from="its \"date\" key" if doc.get("date") else "")
    if not cands:
        errs = "; ".join(f"k={d.get('k')}: {str(d.get('error'))[:80]}"
                         for d in doc.get("dynamic", []))
        out["note"] = f"every dynamic measurement in {rel(path)} failed ({errs})"
        return out
    where, d = min(cands, key=lambda c: (abs(c[1]["k"] - batch), c[1]["k"]))
    k = int(d["k"])
    # the tuner's plans run the chunked im2col (swap.runtime.lowering_for: all but `none`)
    out.update(k=k, lowering=d.get("lowering", "chunked"), budget_bytes=d.get("budget"),
               budget_kind="tuner budget (not a smallest)", high_water_bytes=d.get("high_water"),
               ms_per_iter=d["ms"], ms_per_image=d["ms"] / k,
               images_per_s=d.get("images_per_s"), locator=where)
    others = sorted(c[1]["k"] for c in cands if c[1] is not d)
    out["note"] = (f"k = {k}, the measured k closest to batch {batch} (k* = "
                   f"{doc.get('tuner', {}).get('k_star', '?')}"
                   + (f"; also measured: {', '.join(map(str, others))}" if others else "") + ")"
                   + ("; the tuner's plan at this k was not stall-free" if d.get("stall_free")
                      is False else ""))
    return out


def table_rows_elsewhere(tuner_dir, net) -> str:
    """A note on the Table 1 CSVs beside ``tuner_dir`` that name ``net`` without a JSON (a
    throughput at k*, no memory: not drawn)."""
    base = os.path.dirname(os.path.abspath(tuner_dir))
    found = []
    for name in sorted(os.listdir(base)) if os.path.isdir(base) else ():
        if name.startswith("tuner_table") and name.endswith(".csv"):
            with open(os.path.join(base, name), newline="") as f:
                if any(r.get("net") == net for r in csv.DictReader(f)):
                    found.append(rel(os.path.join(base, name)))
    if not found:
        return ""
    return (f"; {', '.join(found)} has its Table 1 row (img/s at k*, no memory, no JSON), "
            "not drawn")


def empty(net, batch, key) -> dict:
    label = dict((s[0], s[1]) for s in STRATEGIES)[key]
    row = {k: None for k in CSV_KEYS}
    row.update(net=net, paper_batch=batch, strategy=key, label=label, note="", device="",
               date="", date_from="", source="", locator="", lowering="", budget_kind="")
    return row


def collect(nets, swap_csvs, tuner_dir) -> list[dict]:
    """One row per net and strategy (STRATEGIES order)."""
    rows_in = read_swap_rows(swap_csvs)
    out = []
    for net, batch in nets:
        for key, _, strategy, lowering in STRATEGIES:
            if strategy is None:
                out.append(dynamic_point(tuner_dir, net, batch))
            else:
                out.append(swap_point(rows_in, swap_csvs, net, batch, key, strategy, lowering))
    return out


# -------------------------------------------------------------------- outputs
def unit_of(rows) -> tuple[str, float]:
    """GiB when any memory reaches a GiB, else MiB (the quick run's tiny net)."""
    top = max([r["high_water_bytes"] or 0 for r in rows] + [r["budget_bytes"] or 0
                                                           for r in rows])
    return ("GiB", 2.0 ** 30) if top >= 2 ** 30 else ("MiB", 2.0 ** 20)


def write_csv(rows, path):
    with open(path, "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=list(CSV_KEYS))
        w.writeheader()
        for r in rows:
            w.writerow({k: ("" if r[k] is None else r[k]) for k in CSV_KEYS})


def _f(x, spec):
    return "n/a" if x is None else format(x, spec)


def write_md(rows, path, command, date, nets):
    unit, div = unit_of(rows)
    lines = [f"Memory and time per strategy (the paper's evaluation figure), from the result files "
             f"named in each row; drawn {date} by `{command}` (`{rel(path)[:-3]}.png`)", "",
             CAPTION.format(unit=unit), "",
             f"| net | batch | strategy | k measured | smallest budget {unit} | high-water {unit} "
             "| ms/iter | ms/image | device | date | source |",
             "|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        budget = _f(r["budget_bytes"] and r["budget_bytes"] / div, ".2f")
        if r["budget_bytes"] is not None and r["budget_kind"] != "smallest verified":
            budget = f"({budget}: tuner budget)"
        src = f"`{r['source']}` {r['locator']}".strip() if r["source"] else "-"
        lines.append(
            f"| {LABELS.get(r['net'], r['net'])} | {r['paper_batch']} | {r['label']} | "
            f"{_f(r['k'], 'd')} | {budget} | "
            f"{_f(r['high_water_bytes'] and r['high_water_bytes'] / div, '.2f')} | "
            f"{_f(r['ms_per_iter'], '.1f')} | {_f(r['ms_per_image'], '.3f')} | "
            f"{r['device'] or '-'} | {r['date'] or '-'} | {src} |")
    lines += ["", "Notes:", ""]
    for r in rows:
        if r["note"]:
            lines.append(f"- {LABELS.get(r['net'], r['net'])}, {r['label']}: {r['note']}.")
    try:
        from scripts.swap_budgets import PAPER
    except ImportError:                  # the table stands without the paper's line
        PAPER = {}
    for nb in nets:
        if tuple(nb) in PAPER:
            lines.append(f"- For comparison, {PAPER[tuple(nb)]} (the paper's text, not drawn).")
    sources = {}
    for r in rows:
        if r["source"]:
            sources.setdefault(r["source"], set()).add((r["device"], r["date"], r["date_from"]))
    lines += ["", "Sources (device and date as each file records them; a CSV of "
              "`swap_budgets.py` has no date column, its date is the one in the header of the "
              "markdown table written beside it):", ""]
    for s in sorted(sources):
        what = "; ".join(f"{d or '?'}, {t or '?'} ({h})" for d, t, h in sorted(sources[s]))
        lines.append(f"- `{s}`: {what}")
    with open(path, "w") as f:
        f.write("\n".join(lines) + "\n")


def plot(rows, nets, path, title=None):
    """Grouped bars per net: memory (upper panel) and ms per image (lower, log scale)."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    unit, div = unit_of(rows)
    by = {(r["net"], r["strategy"]): r for r in rows}
    keys = [s[0] for s in STRATEGIES]
    width = 0.8 / len(keys)
    fig, (ax_m, ax_t) = plt.subplots(2, 1, figsize=(max(7, 1.9 * len(nets) + 1.5), 8.5))
    tick_label = True
    for i, (net, _) in enumerate(nets):
        for j, key in enumerate(keys):
            r = by[(net, key)]
            x = i - 0.4 + (j + 0.5) * width
            first = i == 0
            for ax, v in ((ax_m, r["high_water_bytes"] and r["high_water_bytes"] / div),
                          (ax_t, r["ms_per_image"])):
                if v is None:
                    ax.text(x, 0.01, "n/a", transform=ax.get_xaxis_transform(), rotation=90,
                            ha="center", va="bottom", fontsize=7, color="#555555")
                    if first:       # the legend lists every strategy, drawn or not
                        ax.bar(x, 0, width, color=COLORS[key], label=dict(
                            (s[0], s[1]) for s in STRATEGIES)[key])
                    continue
                ax.bar(x, v, width, color=COLORS[key], edgecolor="black", lw=0.4,
                       label=r["label"] if first else None)
                if key == "dynamic":
                    ax.annotate(f"k={r['k']}", (x, v), xytext=(0, 2), textcoords="offset points",
                                rotation=90, ha="center", va="bottom", fontsize=7)
            if r["budget_kind"] == "smallest verified" and r["budget_bytes"] is not None:
                ax_m.plot(x, r["budget_bytes"] / div, marker="_", color="black", ms=9, mew=1.6,
                          ls="none", label="smallest verified budget" if tick_label else None)
                tick_label = False
    names = [f"{LABELS.get(n, n)}\nbatch {b}" for n, b in nets]
    for ax in (ax_m, ax_t):
        ax.set_xticks(range(len(nets)), names, fontsize=8)
        ax.set_xlim(-0.6, len(nets) - 0.4)
        ax.grid(axis="y", alpha=0.3)
    ax_m.set_ylabel(f"arena high-water {unit}")
    top = max([r["high_water_bytes"] or 0 for r in rows] + [r["budget_bytes"] or 0 for r in rows
                                                           if r["strategy"] != "dynamic"])
    ax_m.set_ylim(0, 1.15 * top / div if top else 1)
    ax_t.set_ylabel("ms per image (log)")
    ts = [r["ms_per_image"] for r in rows if r["ms_per_image"]]
    if ts:
        from matplotlib.ticker import FormatStrFormatter, LogLocator
        ax_t.set_yscale("log")
        ax_t.set_ylim(min(ts) / 2, max(ts) * 3)
        ax_t.yaxis.set_major_locator(LogLocator(subs=(1.0, 2.0, 5.0)))
        ax_t.yaxis.set_major_formatter(FormatStrFormatter("%g"))
        ax_t.yaxis.set_minor_formatter(FormatStrFormatter(""))
    ax_m.legend(fontsize=7, ncol=3, loc="upper left")
    devices = sorted({r["device"] for r in rows if r["device"]})
    ax_m.set_title(title or f"Memory and time per strategy ({', '.join(devices) or '?'});\n"
                   "dynamic at the tuner's k nearest the batch (k on the bar)", fontsize=10)
    ax_t.set_title("time per image = ms per iteration / minibatch (dynamic: at its k)",
                   fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


# ---------------------------------------------------------------------- quick
def _run(cmd, timeout):
    t0 = time.time()
    p = subprocess.run(cmd, capture_output=True, text=True, cwd=REPO, timeout=timeout)
    if p.returncode != 0:
        tail = "\n".join((p.stdout + p.stderr).strip().splitlines()[-12:])
        raise SystemExit(f"{shlex.join(cmd[1:])} failed (exit {p.returncode}):\n{tail}")
    print(f"{shlex.join(cmd[1:])}: {time.time() - t0:.0f}s", flush=True)


def run_quick(work: str, tuner: bool = True) -> tuple[list[str], str]:
    """The CPU sources of --quick under ``work``, named as in docs/results: (swap CSVs, tuner
    directory); ``tuner`` False: no tuner_table.py run (``--tuner-dir`` names one)."""
    os.makedirs(work, exist_ok=True)
    sb = os.path.join(REPO, "scripts", "swap_budgets.py")
    swap = os.path.join(work, "swap_budgets.csv")
    caffe = os.path.join(work, "swap_budgets_none_caffe_lowering.csv")
    _run([sys.executable, sb, "--quick", "--lowering", "chunked", "--csv", swap,
          "--md", swap[:-4] + ".md"], 300)
    _run([sys.executable, sb, "--quick", "--strategies", "none", "--lowering", "caffe",
          "--csv", caffe, "--md", caffe[:-4] + ".md"], 300)
    if tuner:
        _run([sys.executable, os.path.join(REPO, "scripts", "tuner_table.py"), "--quick",
              "--out", work], 600)
    return [swap, caffe], os.path.join(work, "tuner")


# ----------------------------------------------------------------------- main
def parse_nets(text) -> list[tuple[str, int]]:
    nets = []
    for item in text.split(","):
        if not item.strip():
            continue
        name, _, batch = item.strip().partition(":")
        if not batch.isdigit():
            raise SystemExit(f"--nets: {item!r} is not name:batch (e.g. resnet50:64)")
        nets.append((name, int(batch)))
    return nets


def main(argv=None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--nets", default=None,
                    help=f"name:batch,... (default {NETS}; --quick: {QUICK_NETS})")
    ap.add_argument("--swap-csv", default=None,
                    help="comma-separated swap_budgets.py CSVs, searched in order (default "
                         "docs/results/swap_budgets.csv,docs/results/"
                         "swap_budgets_none_caffe_lowering.csv)")
    ap.add_argument("--tuner-dir", default=None,
                    help="the tuner's JSONs (default docs/results/tuner; with --quick, a "
                         "tuner_table.py --quick run's, instead of running one)")
    ap.add_argument("--quick", action="store_true",
                    help="run swap_budgets.py and tuner_table.py --quick on the CPU first and "
                         "draw from their files (the test)")
    ap.add_argument("--work", default=None,
                    help="--quick: where its source files go (default: a new temporary "
                         "directory, kept)")
    ap.add_argument("--out-dir", default=RESULTS)
    ap.add_argument("--prefix", default=None,
                    help="file names (default fig_strategies, --quick: fig_strategies_quick)")
    args = ap.parse_args(argv)
    nets = parse_nets(args.nets or (QUICK_NETS if args.quick else NETS))
    if args.quick:
        work = args.work or tempfile.mkdtemp(prefix="fig_strategies_")
        swap_csvs, tuner_dir = run_quick(work, tuner=args.tuner_dir is None)
    else:
        swap_csvs = [os.path.join(RESULTS, "swap_budgets.csv"),
                     os.path.join(RESULTS, "swap_budgets_none_caffe_lowering.csv")]
        tuner_dir = os.path.join(RESULTS, "tuner")
    if args.swap_csv:
        swap_csvs = [p.strip() for p in args.swap_csv.split(",") if p.strip()]
    if args.tuner_dir:
        tuner_dir = args.tuner_dir
    missing = [p for p in swap_csvs if not os.path.exists(p)]
    if missing:
        raise SystemExit(f"no such result file: {', '.join(missing)} (write it with "
                         "scripts/swap_budgets.py, or name others with --swap-csv)")
    rows = collect(nets, swap_csvs, tuner_dir)
    prefix = args.prefix or ("fig_strategies_quick" if args.quick else "fig_strategies")
    os.makedirs(args.out_dir, exist_ok=True)
    base = os.path.join(args.out_dir, prefix)
    command = "python3 scripts/fig_strategies.py" + (" " + shlex.join(argv) if argv else "")
    write_csv(rows, base + ".csv")
    write_md(rows, base + ".md", command, datetime.date.today().isoformat(), nets)
    plot(rows, nets, base + ".png")
    unit, div = unit_of(rows)
    print(f"{'net':<14}{'strategy':<28}{'k':>6}{'high-water ' + unit:>16}{'ms/iter':>10}"
          f"{'ms/image':>10}")
    for r in rows:
        hw = r["high_water_bytes"]
        print(f"{r['net']:<14}{r['label']:<28}{_f(r['k'], 'd'):>6}"
              f"{_f(hw and hw / div, '.2f'):>16}{_f(r['ms_per_iter'], '.1f'):>10}"
              f"{_f(r['ms_per_image'], '.3f'):>10}")
    print(f"\n{base}.csv, {base}.md, {base}.png")
    return 0


if __name__ == "__main__":
    sys.exit(main())
