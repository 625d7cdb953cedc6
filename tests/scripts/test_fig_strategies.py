"""scripts/fig_strategies.py: the quick run (swap_budgets.py and tuner_table.py --quick on the CPU,
then the figure from their files) carries every value over unchanged, and the selection rules
(lowering, nearest k, missing points) on small hand-written result files."""
import csv
import json
import os
import subprocess
import sys

import pytest

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
if REPO not in sys.path:            # scripts/ is imported as a package
    sys.path.insert(0, REPO)

KEYS = ("none_caffe", "none_chunked", "naive", "vdnn", "dynamic")


def _csv(path):
    with open(path, newline="") as f:
        return list(csv.DictReader(f))


@pytest.fixture(scope="module")
def quick(tmp_path_factory, tuner_quick_run):
    """fig_strategies.py --quick, its tuner rows from the suite's shared tuner_table.py --quick
    run (``--tuner-dir``); returns (out, work, rows, stdout, tuner dir)."""
    out = tmp_path_factory.mktemp("fig_strategies")
    work = out / "src"
    tuner = tuner_quick_run / "tuner"
    proc = subprocess.run([sys.executable, os.path.join(REPO, "scripts", "fig_strategies.py"),
                           "--quick", "--out-dir", str(out), "--work", str(work),
                           "--tuner-dir", str(tuner)],
                          capture_output=True, text=True, timeout=900, cwd=REPO)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert not (work / "tuner").exists()                  # no tuner_table.py run of its own
    return out, work, _csv(out / "fig_strategies_quick.csv"), proc.stdout, tuner


def test_swap_rows_equal_their_source_rows(quick):
    _, work, rows, _, _ = quick
    assert [(r["net"], r["paper_batch"], r["strategy"]) for r in rows] == [
        ("cifar10_quick", "4", k) for k in KEYS]
    chunked = _csv(work / "swap_budgets.csv")
    caffe = _csv(work / "swap_budgets_none_caffe_lowering.csv")
    src = {"none_caffe": (caffe[0], "swap_budgets_none_caffe_lowering.csv", 1)}
    for i, key in enumerate(("none_chunked", "naive", "vdnn")):
        src[key] = (chunked[i], "swap_budgets.csv", i + 1)
    by = {r["strategy"]: r for r in rows}
    for key, (s, name, n) in src.items():
        r = by[key]
        assert s["strategy"] == key.split("_")[0]
        assert s["lowering"] == r["lowering"] == ("caffe" if key == "none_caffe" else "chunked")
        assert int(r["k"]) == int(s["batch"]) == 4
        assert int(r["budget_bytes"]) == int(s["budget_bytes"])
        assert int(r["high_water_bytes"]) == int(s["high_water"])
        assert float(r["ms_per_iter"]) == float(s["ms"])
        assert float(r["images_per_s"]) == float(s["images_per_s"])
        assert float(r["ms_per_image"]) == pytest.approx(float(s["ms"]) / 4, rel=1e-12)
        assert r["device"] == s["device"] == "CPU"
        assert r["source"] == str(work / name) and r["locator"] == f"row {n}"
        assert r["budget_kind"] == "smallest verified" and r["note"] == ""
        assert r["date"] and r["date_from"] == f"header of {work / name[:-4]}.md"
        assert r["date"] in (work / (name[:-4] + ".md")).read_text().splitlines()[0]


def test_dynamic_row_is_the_json_point_nearest_the_batch(quick):
    _, work, rows, _, tuner = quick
    path = tuner / "cifar10_quick.json"
    doc = json.loads(path.read_text())
    measured = [(i, d) for i, d in enumerate(doc["dynamic"]) if "error" not in d]
    assert measured
    i, d = min(measured, key=lambda c: (abs(c[1]["k"] - 4), c[1]["k"]))
    r = rows[-1]
    assert r["strategy"] == "dynamic" and r["locator"] == f"dynamic[{i}]"
    assert r["source"] == str(path)
    assert int(r["k"]) == d["k"]
    assert float(r["ms_per_iter"]) == d["ms"]
    assert float(r["ms_per_image"]) == pytest.approx(d["ms"] / d["k"], rel=1e-12)
    assert int(r["high_water_bytes"]) == d["high_water"]
    assert int(r["budget_bytes"]) == d["budget"] == 40 << 20     # tuner_table --quick's budget
    assert r["budget_kind"].startswith("tuner budget")
    assert r["device"] == doc["device"] and r["date"] == doc["date"]
    assert f"k = {d['k']}, the measured k closest to batch 4" in r["note"]


def test_markdown_and_plot(quick):
    out, work, rows, stdout, tuner = quick
    md = (out / "fig_strategies_quick.md").read_text()
    assert "`python3 scripts/fig_strategies.py --quick --out-dir " in md
    assert "dynamic is measured at the tuner's k, not at the paper's batch" in md
    assert "| net | batch | strategy | k measured | smallest budget MiB | high-water MiB |" in md
    for r in rows:
        hw = f"{int(r['high_water_bytes']) / 2**20:.2f}"
        line = (f"| CIFAR-10 quick | 4 | {r['label']} | {r['k']} | ")
        assert line in md
        row = next(ln for ln in md.splitlines() if ln.startswith(line))
        assert (f"| {hw} | {float(r['ms_per_iter']):.1f} | {float(r['ms_per_image']):.3f} | "
                f"CPU | {r['date']} | `{r['source']}` {r['locator']} |") in row
    for path in (work / "swap_budgets.csv", work / "swap_budgets_none_caffe_lowering.csv",
                 tuner / "cifar10_quick.json"):
        assert f"- `{path}`: CPU, " in md
    png = (out / "fig_strategies_quick.png").read_bytes()
    assert png[:8] == b"\x89PNG\r\n\x1a\n" and len(png) > 20_000
    assert "ms/image" in stdout


# ------------------------------------------------ selection rules on hand-written files
SWAP_KEYS = ["net", "batch", "strategy", "mode", "engine", "device", "budget_bytes",
             "high_water", "ms", "images_per_s", "attempts"]


def _write_swap(path, rows, lowering=None):
    keys = SWAP_KEYS + (["lowering"] if lowering is not None else [])
    with open(path, "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=keys)
        w.writeheader()
        for r in rows:
            w.writerow({**{k: "" for k in keys}, **r,
                        **({"lowering": lowering} if lowering is not None else {})})


def test_rules_lowering_nearest_k_and_missing(tmp_path):
    from scripts.fig_strategies import collect
    old, caffe = tmp_path / "swap_budgets.csv", tmp_path / "none_caffe.csv"
    # no lowering column (the committed swap_budgets.csv): chunked; a failed vdnn row
    _write_swap(old, [
        {"net": "a", "batch": 8, "strategy": "none", "device": "G", "budget_bytes": 100,
         "high_water": 90, "ms": 4.0, "images_per_s": 2000.0, "attempts": "[]"},
        {"net": "a", "batch": 8, "strategy": "naive", "device": "G", "budget_bytes": 50,
         "high_water": 40, "ms": 8.0, "images_per_s": 1000.0, "attempts": "[]"},
        {"net": "a", "batch": 8, "strategy": "vdnn", "device": "G",
         "attempts": json.dumps([{"error": "x"}, {"error": "y"}])}])
    _write_swap(caffe, [{"net": "a", "batch": 8, "strategy": "none", "device": "G",
                         "budget_bytes": 120, "high_water": 110, "ms": 16.0,
                         "images_per_s": 500.0, "attempts": "[]"}], lowering="caffe")
    (tmp_path / "swap_budgets.md").write_text("Smallest budgets (`cmd`, 2026-01-02)\n")
    tuner = tmp_path / "tuner"
    tuner.mkdir()
    (tuner / "a.json").write_text(json.dumps({
        "device": "G", "date": "2026-01-03", "tuner": {"k_star": 20},
        "dynamic": [{"k": 20, "ms": 30.0, "high_water": 70, "budget": 200},
                    {"k": 4, "error": "CUDARuntimeError: out of memory"},
                    {"k": 12, "ms": 15.0, "high_water": 60, "budget": 200, "stall_free": False},
                    {"k": 4, "ms": 2.0, "high_water": 30, "budget": 200,
                     "error": "failed after timing"}]}))
    (tuner / "b.json").write_text(json.dumps({
        "device": "G", "date": "2026-01-03", "tuner": {"k_star": 8},
        "dynamic": [{"k": 8, "error": "out of memory"}]}))
    (tuner / "c_profile.json").write_text("{}")
    (tmp_path / "tuner_table_run1.csv").write_text("net,k_star\nc,9\n")
    rows = collect([("a", 8), ("b", 8), ("c", 8)], [str(old), str(caffe)], str(tuner))
    by = {(r["net"], r["strategy"]): r for r in rows}
    assert len(rows) == 15
    r = by[("a", "none_chunked")]
    assert (r["lowering"], r["budget_bytes"], r["high_water_bytes"], r["ms_per_iter"],
            r["ms_per_image"], r["locator"]) == ("chunked", 100, 90, 4.0, 0.5, "row 1")
    assert (r["date"], r["date_from"]) == ("2026-01-02", f"header of {tmp_path}/swap_budgets.md")
    r = by[("a", "none_caffe")]
    assert (r["lowering"], r["budget_bytes"], r["ms_per_iter"], r["ms_per_image"]) == (
        "caffe", 120, 16.0, 2.0)
    assert r["source"] == str(caffe) and r["locator"] == "row 1"
    r = by[("a", "vdnn")]
    assert r["ms_per_iter"] is None and r["budget_bytes"] is None and r["k"] == 8
    assert "failed in the source (2 attempts" in r["note"]
    # k = 4 (distance 4) failed; k = 12 (distance 4) wins over k = 20
    r = by[("a", "dynamic")]
    assert (r["k"], r["ms_per_iter"], r["ms_per_image"], r["high_water_bytes"],
            r["locator"]) == (12, 15.0, 1.25, 60, "dynamic[2]")
    assert (r["device"], r["date"]) == ("G", "2026-01-03")
    assert "not stall-free" in r["note"] and "also measured: 20" in r["note"]
    for net in ("b", "c"):
        for key in KEYS:
            r = by[(net, key)]
            assert r["ms_per_iter"] is None and r["high_water_bytes"] is None
            assert r["note"]
    assert "no row b,8,naive with chunked im2col" in by[("b", "naive")]["note"]
    assert "every dynamic measurement" in by[("b", "dynamic")]["note"]
    note = by[("c", "dynamic")]["note"]
    assert "no tuner JSON" in note and "only its profile" in note
    assert "tuner_table_run1.csv has its Table 1 row" in note


def test_a_measurement_at_the_batch_wins(tmp_path):
    from scripts.fig_strategies import dynamic_point
    (tmp_path / "r.json").write_text(json.dumps({
        "device": "G", "date": "2026-01-03", "tuner": {"k_star": 54},
        "dynamic": [{"k": 33, "ms": 50.0, "high_water": 5, "budget": 9}],
        "at_batch": {"k": 32, "chosen": {"k": 32, "ms": 40.0, "high_water": 7, "budget": 8}}}))
    r = dynamic_point(str(tmp_path), "r", 32)
    assert (r["k"], r["ms_per_iter"], r["budget_bytes"], r["locator"]) == (
        32, 40.0, 8, "at_batch.chosen")


def test_table3_json_stands_in_for_a_missing_tuner_json(tmp_path):
    """No tuner/<net>.json but table3/<net>.json beside it: the dynamic point is Table 3's
    measurement of the tuner's plan nearest the batch (k* or the vDNN comparison's k)."""
    from scripts.fig_strategies import dynamic_point
    tuner, t3 = tmp_path / "tuner", tmp_path / "table3"
    tuner.mkdir()
    t3.mkdir()
    (t3 / "v.json").write_text(json.dumps({
        "device": "G", "date": "2026-01-04",
        "accudnn": {"k": 208, "ms": 750.0, "high_water": 11, "budget": 12},
        "fixed": {"k": 192, "vdnn": {"k": 192, "ms": 900.0},
                  "dynamic": {"k": 192, "ms": 690.0, "high_water": 10, "budget": 12}}}))
    r = dynamic_point(str(tuner), "v", 64)
    assert (r["k"], r["ms_per_iter"], r["high_water_bytes"], r["locator"]) == (
        192, 690.0, 10, "fixed.dynamic")
    assert r["source"].endswith("table3/v.json") and (r["device"], r["date"]) == (
        "G", "2026-01-04")
    assert "k* = 208" in r["note"] and "also measured: 208" in r["note"]
    (t3 / "v.json").write_text(json.dumps({
        "device": "G", "date": "2026-01-04", "accudnn": {"k": 70, "error": "failed"}}))
    r = dynamic_point(str(tuner), "v", 64)   # nothing measured: no point, and a note
    assert r["ms_per_iter"] is None and r["note"]
