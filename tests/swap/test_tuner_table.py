"""scripts/tuner_table.py --quick: issue 5's measurement script end to end on the CPU."""
import csv
import json
import os
import subprocess
import sys

import pytest

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def test_tuner_table_quick(tuner_quick_run):
    if REPO not in sys.path:
        sys.path.insert(0, REPO)
    from scripts.tuner_table import MAX_ROUNDS, ROUND_SPREAD, _spread
    tmp_path = tuner_quick_run                  # `tuner_table.py --quick ... --out tmp_path` (conftest)
    r = json.load(open(tmp_path / "tuner" / "cifar10_quick.json"))
    t = r["tuner"]
    # the tuner's k* lies within its k_max, and the decision alone gives the same k* again
    assert 1 <= t["k_star"] <= t["k_max"] and t["repeat_k_star"] == t["k_star"]
    # and the GMAP the profile keeps replays to it, as `minicaffe plan --layout device` plans
    assert t["replay_k_star"] == t["k_star"]
    assert t["seconds"] > t["decision_seconds"] > 0 and len(t["profiled_ks"]) >= 2
    assert (tmp_path / "tuner" / "cifar10_quick_profile.json").exists()
    # none: Caffe's lowering, verified within the budget
    assert r["none"]["lowering"] == "caffe" and r["none"]["k"] >= 1
    assert r["none"]["arena"] <= r["budget"]
    assert r["none_chunked"]["k"] == r["none"]["k"] and r["none_chunked"]["lowering"] == "chunked"
    ks = [d["k"] for d in r["dynamic"]]
    assert ks[0] == t["k_star"] and len(ks) == len(set(ks))
    for d in r["dynamic"]:
        assert "error" not in d, d
        # the measured peak never exceeds the budget; the model's relative errors are computed
        assert d["high_water"] <= d["budget"] == r["budget"]
        assert d["peak_err"] == (d["pred_total"] - d["meas_total"]) / d["meas_total"]
        assert d["time_err"] == (d["pred_ms"] - d["ms"]) / d["ms"]
        assert 0.0 <= d["offload_fraction"] <= 1.0
        assert d["slowdown_first"] == d["ms"] / d["none_ms"]
        # two rounds, ABBA, and two more at a time while either strategy's round medians
        # spread by more than ROUND_SPREAD (the CPU's timings often do), up to MAX_ROUNDS;
        # the pooled steps' ratio lies within the rounds' medians' span
        rounds = d["no_stall_rounds"]
        assert len(rounds) in range(2, MAX_ROUNDS + 1, 2) and all(
            set(x) == {"dynamic_ms", "none_ms", "dynamic_host_ms", "none_host_ms"}
            for x in rounds)
        dyn = [x["dynamic_ms"] for x in rounds]
        non = [x["none_ms"] for x in rounds]
        for n in range(2, len(rounds), 2):      # rounds were added only while they disagreed
            assert _spread(dyn[:n]) > ROUND_SPREAD or _spread(non[:n]) > ROUND_SPREAD
        if len(rounds) < MAX_ROUNDS:            # and stopped when they agreed
            assert _spread(dyn) <= ROUND_SPREAD and _spread(non) <= ROUND_SPREAD
        assert min(dyn) / max(non) <= d["slowdown"] <= max(dyn) / min(non)
    assert "partial" not in r                   # written whole at the end
    assert t["cuda_graph"] is False and t["cuda_graph_choice"] is None   # no --cuda-graph
    assert not [p for p in os.listdir(tmp_path / "tuner") if ".tmp" in p]
    rows = list(csv.DictReader(open(tmp_path / "tuner_table.csv")))
    assert [x["net"] for x in rows] == ["cifar10_quick"]
    assert int(rows[0]["k_star"]) == t["k_star"] and int(rows[0]["k_none"]) == r["none"]["k"]
    md = (tmp_path / "tuner_table.md").read_text()
    assert "**Table 1**" in md and "| cifar10_quick | " in md and "CPU mode" in md
    assert (tmp_path / "tuner_table.png").stat().st_size > 0


def test_table1_redrawn_from_saved_tables_later_rows_win(tmp_path):
    head = ("| net | k Caffe accounting | k none | none img/s (Caffe im2col) | none img/s "
            "(chunked) | k* | dynamic img/s | largest | k*/k_none | paper | img/s ratio | "
            "PyTorch eager img/s | save_on_cpu img/s | dynamic/save_on_cpu | tuner s |\n"
            "|" + "---|" * 15 + "\n")
    a, b = tmp_path / "a.md", tmp_path / "b.md"
    a.write_text("Tuner table\n\n" + head +
                 "| vgg16 | 92 | 92 | 294 | 569 | 176 | 581 | 176 (581) | 1.91 | 2.40 | 1.02 | "
                 "694 | 157 | 3.7 | 45 (0.9) |\n"
                 "| alexnet | 1133 | 1131 | 5206 | 11314 | 1152 | 11329 | 1536 (7345) | 1.02 | "
                 "1.22 | 1.00 | - | - | - | 3 (2.1) |\n"
                 "| cifar10_quick | 9 | 9 | 1 | 1 | 9 | 1 | 9 | 1.00 | - | 1.0 | - | - | - | 1 |\n")
    b.write_text(head + "| vgg16 (recomputing conv1_1) | 92 | 90 | 300 | 570 | 198 | 590 | "
                 "221 (544 img/s, 2.46 x k_none) | 2.20 | 2.40 | 1.04 | 700 | 150 | 3.9 | "
                 "40 (1.0) |\n")
    # session 26's form: three more cells, PyTorch on the prototxt's own network
    c = tmp_path / "c.md"
    c.write_text(head.replace("dynamic/save_on_cpu | tuner", "dynamic/save_on_cpu | same eager "
                              "| same save_on_cpu | dynamic/same | tuner").replace(
                                  "---|" * 15, "---|" * 18) +
                 "| googlenet | 180 | 180 | 1797 | 2481 | 497 | 2533 | 497 (2533 img/s, 2.76 x "
                 "k_none) | 2.76 | 1.91 | 1.02 | 2485 | 339 | 7.5 | 2000 | 250 | 10.1 | "
                 "112 (36.4) |\n")
    out = tmp_path / "out"
    proc = subprocess.run([sys.executable, os.path.join(REPO, "scripts", "tuner_table.py"),
                           "--redraw", str(a), str(b), str(c), "--out", str(out)],
                          capture_output=True, text=True, timeout=120, cwd=REPO)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    rows = {r["net"]: r for r in csv.DictReader(open(out / "table1.csv"))}
    # the paper's order, networks of the paper only; b's VGG-16 replaces a's
    assert list(rows) == ["alexnet", "googlenet", "vgg16"]
    g = rows["googlenet"]
    assert (float(g["torch_same_eager_img_s"]), float(g["torch_same_save_on_cpu_img_s"]),
            float(g["vs_same_save_on_cpu"]), float(g["vs_save_on_cpu"])) == (2000, 250, 10.1, 7.5)
    assert g["tuner"] == "112 (36.4)" and rows["vgg16"]["vs_same_save_on_cpu"] == ""
    assert float(rows["vgg16"]["k_star"]) == 198 and rows["vgg16"]["source"] == str(b)
    assert rows["vgg16"]["recompute"] == "conv1_1" and rows["alexnet"]["recompute"] == ""
    assert rows["alexnet"]["vs_save_on_cpu"] == "" and rows["alexnet"]["paper_k_star"] == "1032"
    assert (out / "table1.png").stat().st_size > 0


def test_tuner_table_reuses_a_saved_profile(tmp_path, tuner_quick_run):
    """--profiles: the tuner decides from the profile a first run saved, without profiling,
    and the second run's JSON points at it instead of writing a new one."""
    first = tuner_quick_run                     # `tuner_table.py --quick ... --out first` (conftest)
    script = os.path.join(REPO, "scripts", "tuner_table.py")
    k_star = json.load(open(first / "tuner" / "cifar10_quick.json"))["tuner"]["k_star"]
    second = tmp_path / "second"
    # the reuse only: one no-stall round of each strategy (two: 9 s a run, one: 6 s)
    fewer = ["--iters", "2", "--warmup", "1", "--no-stall-rounds", "1", "--no-stall-max-rounds",
             "1"]
    proc = subprocess.run([sys.executable, script, "--quick", "--no-torch", "--out", str(second),
                           "--profiles", str(first / "tuner")] + fewer,
                          capture_output=True, text=True, timeout=300, cwd=REPO)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    r = json.load(open(second / "tuner" / "cifar10_quick.json"))
    assert r["profile_reused"] is True
    assert r["profile"].endswith("tuner_quick_run/tuner/cifar10_quick_profile.json")
    assert not (second / "tuner" / "cifar10_quick_profile.json").exists()
    assert any("reusing the saved profile" in ln for ln in r["tuner"]["log"])
    # --recompute NET=auto reaches the tuner as "auto"; the row names what it chose
    auto = tmp_path / "auto"
    proc = subprocess.run([sys.executable, script, "--quick", "--no-torch", "--out", str(auto),
                           "--profiles", str(first / "tuner"), "--recompute",
                           "cifar10_quick=auto"] + fewer,
                          capture_output=True, text=True, timeout=300, cwd=REPO)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    r = json.load(open(auto / "tuner" / "cifar10_quick.json"))
    assert r["recompute"][0] == "auto"
    assert any("--recompute auto tried: nothing: k" in ln for ln in r["tuner"]["log"])
    assert not any("Profiled minibatch" in ln for ln in r["tuner"]["log"])
    assert r["tuner"]["k_star"] == k_star      # the same profile, the same decision


def test_a_run_stopped_midway_keeps_the_decision_and_the_points_measured(
        tmp_path, tuner_quick_run, monkeypatch):
    """The network's JSON is written after the tuner and after every measured point, marked
    partial: a run stopped in its second point (a device call's time limit) keeps the
    decision and the first point (session 44's note: a run that did not finish in one call
    wrote nothing)."""
    if REPO not in sys.path:
        sys.path.insert(0, REPO)
    from scripts import tuner_table
    real, ks = tuner_table.dynamic_point, []

    def stop_at_the_second(solver, dec, g, k, *a, **kw):
        ks.append(k)                           # the first point's no-stall rounds call it too
        if k != ks[0]:
            raise KeyboardInterrupt            # stands for the call's time limit
        return real(solver, dec, g, k, *a, **kw)
    monkeypatch.setattr(tuner_table, "dynamic_point", stop_at_the_second)
    out = tmp_path / "tuner"
    out.mkdir()
    with pytest.raises(KeyboardInterrupt):
        tuner_table.run_net("cifar10_quick", 4, 40 << 20, None, 2, 1, "CAFFE", "CPU", "bisect",
                            str(out), 0, profile_dir=str(tuner_quick_run / "tuner"),
                            rounds=1, max_rounds=1)
    r = json.load(open(out / "cifar10_quick.json"))
    assert r["partial"] is True and r["tuner"]["k_star"] >= 1
    assert len(r["dynamic"]) == 1 and r["dynamic"][0]["k"] == r["tuner"]["k_star"]
    assert "ms" in r["dynamic"][0] and "seconds" not in r
    assert not [p for p in os.listdir(out) if ".tmp" in p]


def test_no_stall_rounds_are_abba_and_pool_every_step():
    """no_stall: dynamic and none alternate ABBA (the first dynamic is the point itself), the
    slowdown pools every step of each, and a failed measurement ends the rounds."""
    sys.path.insert(0, REPO)
    from scripts.tuner_table import no_stall
    calls = []

    def meas(which, ms):
        def f():
            calls.append(which)
            return {"ms": ms, "times": [ms, ms + 2], "host_ms": ms / 2}
        return f
    r = {"ms": 10.0, "times": [10.0, 12.0], "host_ms": 5.0}
    no_stall(r, meas("dynamic", 14.0), meas("none", 9.0), rounds=3, max_rounds=3)
    assert calls == ["none", "none", "dynamic", "dynamic", "none"]
    assert [list(x) for x in r["no_stall_rounds"]] == [
        ["dynamic_ms", "dynamic_host_ms", "none_ms", "none_host_ms"],
        ["none_ms", "none_host_ms", "dynamic_ms", "dynamic_host_ms"],
        ["dynamic_ms", "dynamic_host_ms", "none_ms", "none_host_ms"]]
    assert r["none_ms"] == 9.0 and r["slowdown_first"] == 10.0 / 9.0
    # dynamic steps 10, 12, 14, 16, 14, 16 (median 14); none 9, 11 three times (median 10)
    assert r["slowdown"] == 14.0 / 10.0
    assert "ms_pooled" not in r                    # no prediction: no model error
    r = {"ms": 10.0, "times": [10.0, 30.0], "pred_ms": 15.0}
    no_stall(r, meas("dynamic", 14.0), meas("none", 9.0), rounds=2, max_rounds=2)
    # dynamic steps 10, 30, 14, 16 (median 15): the model's error against the pooled median
    assert r["ms_pooled"] == 15.0 and r["time_err_pooled"] == 0.0
    r = {"ms": 10.0, "times": [10.0]}
    no_stall(r, lambda: {"error": "out of memory"}, meas("none", 9.0), rounds=2)
    # dynamic 10; none 9, 11 in each round (median 10)
    assert r["no_stall_error"] == "out of memory" and r["slowdown"] == 10.0 / 10.0
    assert r["no_stall_rounds"][-1] == {"none_ms": 9.0, "none_host_ms": 4.5}


def test_no_stall_adds_rounds_while_the_rounds_disagree():
    """Two more rounds (ABBA goes on) while a strategy's round medians spread by more than
    ROUND_SPREAD, up to max_rounds: one disturbed round no longer sets half the pooled
    median.  Rounds that agree get no more."""
    sys.path.insert(0, REPO)
    from scripts.tuner_table import ROUND_SPREAD, no_stall
    calls = []

    def seq(which, values):
        values = list(values)

        def f():
            calls.append(which)
            ms = values.pop(0) if len(values) > 1 else values[0]
            return {"ms": ms, "times": [ms] * 5}
        return f
    # round 2's dynamic ran on a busy host (ResNet-152 at 41, session 27: 164 against 115)
    r = {"ms": 115.0, "times": [115.0] * 5, "pred_ms": 118.0}
    no_stall(r, seq("dynamic", [164.0, 115.0]), seq("none", [115.0]), rounds=2, max_rounds=6)
    assert len(r["no_stall_rounds"]) == 6 and calls == ["none", "none", "dynamic"] + [
        "dynamic", "none", "none", "dynamic"] * 2
    assert r["ms_pooled"] == 115.0 and r["slowdown"] == 1.0
    # with two rounds only, the busy round is half the pool
    calls.clear()
    r2 = {"ms": 115.0, "times": [115.0] * 5, "pred_ms": 118.0}
    no_stall(r2, seq("dynamic", [164.0, 115.0]), seq("none", [115.0]), rounds=2, max_rounds=2)
    assert len(r2["no_stall_rounds"]) == 2 and r2["ms_pooled"] == (115.0 + 164.0) / 2
    # rounds within ROUND_SPREAD of each other: the two rounds stand
    calls.clear()
    near = 115.0 * (1 + ROUND_SPREAD / 2)
    r3 = {"ms": 115.0, "times": [115.0] * 5}
    no_stall(r3, seq("dynamic", [near]), seq("none", [near, 115.0]), rounds=2, max_rounds=6)
    assert len(r3["no_stall_rounds"]) == 2 and len(calls) == 3


def test_a_decided_k_is_measured_with_its_own_decision(monkeypatch):
    """At k* and at the paper's k the table measures the plans tune() laid out and replayed;
    only another k is planned again (plan_at)."""
    sys.path.insert(0, REPO)
    import swap.tuner
    from scripts import tuner_table

    class Td:
        scratch = None
        plan_budget = 1 << 30

        class decision:
            recompute = ()

    class Dec:
        def __init__(self, k):
            self.k_star = k

    measured, replanned = [], []
    monkeypatch.setattr(tuner_table, "_measure_dynamic",
                        lambda solver, d, *a, **kw: measured.append(d) or {"k": d.k_star})
    monkeypatch.setattr(swap.tuner, "plan_at",
                        lambda g, k, *a, **kw: replanned.append(k) or Dec(k))
    star, paper = Dec(100), Dec(160)
    decided = {100: star, 160: paper}
    for k in (100, 160, 50):
        tuner_table.dynamic_point(None, decided, None, k, Td, None, None, 0, 1, 0, False)
    assert measured[:2] == [star, paper] and replanned == [50]
    tuner_table.dynamic_point(None, star, None, 100, Td, None, None, 0, 1, 0, False)
    assert measured[-1] is star and replanned == [50]        # one decision, as table3 passes


def test_recompute_specs_per_network():
    from scripts.tuner_table import recompute_of
    assert recompute_of(["vgg16=conv1_1", "alexnet = conv1, conv2"]) == {
        "vgg16": ("conv1_1",), "alexnet": ("conv1", "conv2")}
    assert recompute_of([]) == {}
    assert recompute_of(["vgg16=Auto"]) == {"vgg16": "auto"}
    with pytest.raises(SystemExit, match="'auto' lets the tuner choose"):
        recompute_of(["vgg16=auto,conv1_1"])
    for bad in ("vgg16", "=conv1", "vgg16="):
        with pytest.raises(SystemExit, match="NET=LAYER"):
            recompute_of([bad])


def test_no_stall_falls_back_to_every_map_kept_where_none_does_not_fit(tmp_path, monkeypatch):
    """Where `none` (every convolution's workspace held at once) does not fit the device, the
    no-stall reference is the plan that keeps every feature map: timed in ABBA rounds,
    marked in the row and the table, and the reason for skipping `none` recorded."""
    sys.path.insert(0, REPO)
    from scripts import tuner_table
    monkeypatch.setattr(tuner_table, "_fits_device",
                        lambda g, k, reserve, gpu: (False, f"none at {k} needs 99 GiB"))
    kept = []
    real = tuner_table._time_kept

    def spy(solver, k, *a, **kw):
        m = real(solver, k, *a, **kw)
        kept.append((k, m["ms"]))
        return m

    monkeypatch.setattr(tuner_table, "_time_kept", spy)
    r = tuner_table.run_net("cifar10_quick", 4, 40 << 20, None, 2, 1, "CAFFE", "CPU", "bisect",
                            str(tmp_path), 0, rounds=1)
    pts = [d for d in r["dynamic"] if "error" not in d]
    assert pts and all(d["no_stall_reference"] == "kept" for d in pts)
    assert all(d["none_skipped"] == f"none at {d['k']} needs 99 GiB" for d in pts)
    assert all(d["slowdown"] > 0 for d in pts) and {k for k, _ in kept} == {d["k"] for d in pts}
    _, md = tuner_table.write_tables([r], {}, None, str(tmp_path / "t.md"), "header")
    assert md.count("(every map kept)") == len(pts)


def test_cuda_graph_reaches_the_solvers_through_the_environment():
    sys.path.insert(0, REPO)
    from minicaffe.solver import cuda_graph_from_env
    from scripts import tuner_table
    env = {}
    tuner_table.graph_env(False, env)
    assert env == {} and not cuda_graph_from_env(env)
    tuner_table.graph_env(True, env)
    assert cuda_graph_from_env(env)


def test_host_bound_timed_again_after_a_point(make_solver):
    """host_now times a whole iteration of `none` at the model's host k again (real training
    iterations, CPU) and predicts the point with it; a model without that bound (CPU
    profiles, the CUDA-graph model) leaves the point as it is, and so does a budget that
    `none` does not fit at that k."""
    import dataclasses

    from scripts.tuner_table import host_now
    from swap.gmap import build_gmap
    from swap.model import ComputeModel, HostModel, IterationOverhead, ThroughputCurve
    from swap.plan import min_budget
    from swap.profiler import host_whole_now
    s = make_solver("lenet", batch=4)
    budget = 4 * min_budget(build_gmap(s.net), "none")
    model = dataclasses.replace(ComputeModel.uniform(ThroughputCurve(peak=1e9, x_half=1e6)),
                                overhead=IterationOverhead(a=1e-4, b=0.0),
                                host=HostModel(a=(0.0,), b=(0.0,), method="issue", whole=1.0,
                                               whole_k=2))
    it0 = s.iter
    # a device time below any host's whole LeNet iteration (a fast CPU runs it at batch 2 in
    # 0.45 ms, under the 0.5 this test once took)
    r = host_now({"k": 4, "ms": 10.0, "ms_pooled": 8.0, "pred_device_ms": 1e-6}, s, budget,
                 model)
    assert s.iter == it0 + 2 + 3                    # warm-up and three timed iterations
    assert r["host_now_k"] == 2 and 0 < r["host_now_ms"] < 1e3
    # device-bound at 1 ns?  no: the host's whole iteration (less O, plus O) bounds it
    assert r["pred_ms_host_now"] == pytest.approx(r["host_now_ms"])
    assert r["time_err_host_now"] == pytest.approx((r["pred_ms_host_now"] - 8.0) / 8.0)
    assert "host_now_ms" not in host_now({"k": 4, "ms": 1.0, "pred_device_ms": 0.5}, s, budget,
                                         ComputeModel.uniform(ThroughputCurve(1e9, 1e6)))
    small = host_now({"k": 4, "ms": 1.0, "pred_device_ms": 0.5}, s, 1 << 10, model)
    assert "host_now_ms" not in small and "does not fit" in small["host_now_error"]
    assert host_whole_now(s, 1 << 10, 2) == (None, 0)


def test_no_stall_pools_the_back_to_back_steps_apart():
    """On the GPU each measurement also times its steps back to back (_timed, _b2b): the
    rounds pool them apart from the steps waited for one by one."""
    sys.path.insert(0, REPO)
    from scripts.tuner_table import no_stall

    def meas(ms, b2b):
        return lambda: {"ms": ms, "times": [ms] * 3, "ms_b2b": b2b, "times_b2b": [b2b] * 3}
    r = {"ms": 80.0, "times": [80.0] * 3, "ms_b2b": 70.0, "times_b2b": [70.0] * 3,
         "pred_ms": 66.0}
    no_stall(r, meas(80.0, 70.0), meas(74.0, 68.0), rounds=2, max_rounds=2)
    assert r["ms_pooled"] == 80.0 and r["ms_pooled_b2b"] == 70.0
    assert r["time_err_b2b"] == (66.0 - 70.0) / 70.0
    assert r["slowdown"] == 80.0 / 74.0 and r["slowdown_b2b"] == 70.0 / 68.0
    assert r["no_stall_rounds"][1] == {"none_ms": 74.0, "none_host_ms": None, "none_b2b_ms": 68.0,
                                       "dynamic_ms": 80.0, "dynamic_host_ms": None,
                                       "dynamic_b2b_ms": 70.0}
    # CPU measurements have none: no back-to-back keys at all
    r = {"ms": 80.0, "times": [80.0], "pred_ms": 66.0}
    no_stall(r, lambda: {"ms": 80.0, "times": [80.0]}, lambda: {"ms": 74.0, "times": [74.0]},
             rounds=2, max_rounds=2)
    assert not any("b2b" in key for key in r) and not any(
        "b2b" in key for row in r["no_stall_rounds"] for key in row)


def test_the_back_to_back_table_is_written_and_table1_still_reads(tmp_path):
    """write_tables adds a 7-column table of the back-to-back points; --redraw still finds
    exactly the one Table 1 row (its parser tells rows by their column count)."""
    sys.path.insert(0, REPO)
    from scripts.tuner_table import read_table1_md, write_tables
    r = json.load(open(os.path.join(REPO, "docs", "results", "tuner_s27", "d_resnet152.json")))
    for d in r["dynamic"]:
        d.update(ms_pooled_b2b=d["ms_pooled"] * 0.9, slowdown_b2b=1.01,
                 time_err_b2b=(d["pred_ms"] - 0.9 * d["ms_pooled"]) / (0.9 * d["ms_pooled"]))
    md = tmp_path / "t.md"
    write_tables([r], {}, str(tmp_path / "t.csv"), str(md), "header")
    text = md.read_text()
    assert "**Back to back**" in text
    k16 = [ln for ln in text.splitlines() if ln.startswith("| resnet152 | 16 | 82.0 |")]
    assert len(k16) == 1 and len(k16[0].strip("|").split("|")) == 7
    assert "| 73.8 | 66.2 | -10.3 % | 1.010 |" in k16[0]
    rows = read_table1_md([str(md)])
    assert [x["net"] for x in rows] == ["resnet152"] and rows[0]["k_star"] == 83


def test_a_run_that_dropped_the_graph_says_so_in_its_table(tmp_path):
    """Under --cuda-graph the tuner may train eagerly (swap.tuner.graph_or_eager): the
    network's table says so with the tuner's reason; a run that kept the graph says nothing
    of it."""
    sys.path.insert(0, REPO)
    from scripts.tuner_table import write_tables
    r = json.load(open(os.path.join(REPO, "docs", "results", "tuner_s27", "d_resnet152.json")))
    why = ("the eager iterations are predicted faster than graph launches (376.5 images/s at "
           "k = 85 against 319.5 images/s at k = 85, stalling): training eagerly")
    r["tuner"].update(cuda_graph=False, cuda_graph_choice="cuda_graph: WARNING: " + why)
    md = tmp_path / "t.md"
    write_tables([r], {}, str(tmp_path / "t.csv"), str(md), "header")
    assert f"**resnet152 ran eagerly under --cuda-graph**: {why} (swap" in md.read_text()
    r["tuner"].update(cuda_graph=True, cuda_graph_choice="cuda_graph: graph launches "
                      "predicted at 415.1 images/s at k = 85, eagerly 398.0 images/s at k = 71")
    write_tables([r], {}, str(tmp_path / "t.csv"), str(md), "header")
    assert "ran eagerly" not in md.read_text()


@pytest.mark.gpu
def test_back_to_back_steps_are_timed_on_the_gpu(cp):
    """_timed's back-to-back steps on the GPU: one time per step, all positive, kept in B2B
    beside the synced steps; none with back_to_back=False (swap_anatomy's traces)."""
    sys.path.insert(0, REPO)
    import scripts.tuner_table as tt
    from scripts.swap_budgets import _solver, _timed_back_to_back
    solver = _solver("cifar10_quick", 16, "CAFFE", "GPU")
    solver.step(2)
    times = _timed_back_to_back(solver, 4)
    assert len(times) == 4 and all(t > 0 for t in times)
    ms, synced = tt._timed(solver, 3, 1, True)
    assert len(synced) == 3 and len(tt.B2B) == 3 and tt._b2b()["ms_b2b"] == sorted(tt.B2B)[1]
    tt._timed(solver, 3, 1, True, back_to_back=False)
    assert tt.B2B == [] and tt._b2b() == {}


def test_saved_runs_pairs_each_run_with_its_profile(tmp_path):
    """saved_runs: runs with a profile beside them (gzipped or not) and dynamic points, in
    name order; a profile alone, or a run without points, is not one."""
    sys.path.insert(0, REPO)
    from scripts.tuner_table import saved_runs
    (tmp_path / "b_net_profile.json.gz").write_bytes(b"")
    (tmp_path / "b_net.json").write_text(json.dumps({"dynamic": [{"k": 4}]}))
    (tmp_path / "a_net_profile.json").write_text("{}")
    (tmp_path / "a_net.json").write_text(json.dumps({"dynamic": []}))
    (tmp_path / "c_net_profile.json").write_text("{}")            # no run beside it
    (tmp_path / "d_net_profile.json").write_text("{}")
    (tmp_path / "d_net.json").write_text(json.dumps({"none": {}}))  # no dynamic points
    got = list(saved_runs(str(tmp_path / "*_profile.json*")))
    assert [(os.path.basename(b), r["dynamic"], os.path.basename(p)) for b, r, p in got] == [
        ("a_net", [], "a_net_profile.json"), ("b_net", [{"k": 4}], "b_net_profile.json.gz")]


def test_kept_prediction_is_the_models_iteration_from_the_profiles_steps(build_net):
    """kept_prediction (the replays' prediction with every map kept): the model's iteration
    of the steps' times at k, their FLOPs scaled from the profile's first samples, which is
    eq. (2) on the GMAP at k."""
    sys.path.insert(0, REPO)
    from scripts.tuner_table import kept_prediction
    from swap.gmap import build_gmap
    from swap.model import ComputeModel, PCIeModel, ThroughputCurve
    from swap.profiler import synthetic_profile
    g = build_gmap(build_net("resnet", 4))
    truth = ComputeModel(curves=((("*", "*"), ThroughputCurve(1e9, 1e4)),))
    prof = synthetic_profile(g, (2, 4, 8), truth, PCIeModel(1e9, 1e9), gap=1e-5)
    m = ComputeModel.from_profile(prof, granularity="segment")
    for k in (3, 8, 20):
        assert kept_prediction(m, prof, k) == pytest.approx(m.iteration(m.t_iter(g, k), k),
                                                            rel=1e-9)
