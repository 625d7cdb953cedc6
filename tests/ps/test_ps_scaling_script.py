"""scripts/ps_scaling.py (issue 6): the --quick CPU run end to end, a failed
configuration recorded, and the statistics it derives from the workers'
--ps-stats records."""
import csv
import os
import statistics
import subprocess
import sys
import time

import pytest

from ps_helpers import ROOT, env, write_solver

sys.path.insert(0, str(ROOT))
from scripts import ps_scaling  # noqa: E402

SCRIPT = str(ROOT / "scripts" / "ps_scaling.py")


def run_script(tmp_path, *extra, timeout=120):
    out = {"csv": tmp_path / "out.csv", "md": tmp_path / "out.md"}
    cmd = [sys.executable, SCRIPT, "--quick", "--csv", str(out["csv"]), "--md", str(out["md"]),
           "--work-dir", str(tmp_path / "work"), *extra]
    r = subprocess.run(cmd, cwd=ROOT, env=env(), capture_output=True, text=True, timeout=timeout)
    rows = list(csv.DictReader(open(out["csv"]))) if out["csv"].exists() else []
    md = out["md"].read_text() if out["md"].exists() else ""
    return r, rows, md


def close(a, b, rel=2e-3):
    return abs(a - b) <= rel * max(abs(a), abs(b))


def test_quick_run_measures_every_configuration(tmp_path):
    t0 = time.monotonic()
    r, rows, md = run_script(tmp_path)
    took = time.monotonic() - t0
    assert r.returncode == 0, r.stdout + r.stderr
    # 40 s alone on 2 cores; the README's `pytest -n auto` runs another test on the other core
    assert took < 100, f"--quick took {took:.0f} s"
    assert (tmp_path / "out.png").stat().st_size > 0     # Table 2's figure beside the md
    assert list(rows[0]) == ps_scaling.CSV_COLUMNS
    # 2 modes x (ZeroMQ on loopback, ZeroMQ with emulated links) x W = 1, 2; nccl skipped on CPU
    got = {(x["mode"], x["comm"], x["link"], int(x["world_size"])) for x in rows}
    want = {(m, "ps", lk, w) for m in ("caffe_ps", "accudnn_ps") for lk in ("none", "emulated")
            for w in (1, 2)}
    assert got == want and len(rows) == len(want)
    ips = {}
    for x in rows:
        assert x["status"] == "ok", x["error"]
        w, k = int(x["world_size"]), int(x["batch_per_worker"])
        assert k == 4 and x["net"] == "cifar10_quick"
        assert int(x["shards"]) == w and int(x["timed_iterations"]) == 10
        assert float(x["images_per_s"]) > 0
        assert close(float(x["images_per_s"]), w * k / float(x["iter_s"]))
        compute, comm = float(x["compute_s"]), float(x["comm_s"])
        assert compute > 0 and comm > 0
        assert close(float(x["comp_comm_ratio"]), compute / comm)
        for col in ("compute_s_per_rank", "comm_s_per_rank"):
            per_rank = [float(v) for v in x[col].split(";")]
            assert len(per_rank) == w and min(per_rank) > 0
        assert float(x["mb_pushed_per_iter"]) > 0.5    # cifar10_quick: 145,578 float32
        # one monotonic clock for the workers and the shards: a gradient is read after it left
        assert 0 <= float(x["read_lag_s"]) < 10
        if sys.platform.startswith("linux"):           # the main thread's rusage
            assert 0 < float(x["host_cpu_s"]) and float(x["host_vcsw"]) >= 0
            assert float(x["host_ivcsw"]) >= 0
            per_rank = [float(v) for v in x["host_cpu_s_per_rank"].split(";")]
            assert len(per_rank) == w and min(per_rank) > 0
            # the round thread's own clock: it works every round, less than the main thread
            assert 0 < float(x["round_cpu_s"]) < float(x["host_cpu_s"])
            assert x["copy_cpu_s"] == ""                # the forward copy thread is GPU-only
        assert x["gpu_backlog_s"] == ""                 # CPU workers: no device to fall behind
        assert x["swap"] == ("none" if x["mode"] == "caffe_ps" else "naive")
        if x["mode"] == "accudnn_ps":
            assert "naive" in x["note"]     # no profile: the fallback is said on the row
        if x["link"] == "emulated":
            assert float(x["link_gbps"]) == 10 and float(x["link_latency_ms"]) == 0.1
        ips[(x["mode"], x["link"], w)] = float(x["images_per_s"])
    for x in rows:        # speedup and efficiency follow from the measured images/s
        w = int(x["world_size"])
        speedup = ips[(x["mode"], x["link"], w)] / ips[(x["mode"], x["link"], 1)]
        assert close(float(x["speedup"]), speedup)
        assert close(float(x["efficiency"]), speedup / w)
    # the markdown: device, date, the command, the table, the notes, the paper's figures
    assert "python3 scripts/ps_scaling.py --quick" in md and "CPU" in md.splitlines()[0]
    assert md.count("| cifar10_quick |") == len(rows)
    assert "--comm nccl skipped" in md and "--swap naive" in md
    assert "Caffe_PS 4.4x, AccUDNN_PS 7.2x" in md and "Caffe_PS 4.0x, AccUDNN_PS 7.7x" in md
    assert "images/s" in r.stdout and "efficiency" in r.stdout


def synthetic_row(mode, link, w, ips, **kw):
    row = {c: "" for c in ps_scaling.CSV_COLUMNS}
    row.update(net="cifar10_quick", mode=mode, swap="none", comm="ps", link=link, overlap="on",
               world_size=w, batch_per_worker=4, shards=w, status="ok", images_per_s=ips,
               iter_s=w * 4 / ips,
               compute_s=0.01, comm_s=0.002, comp_comm_ratio=5.0, device="an earlier device",
               date="2026-01-01 00:00", command="an earlier command", **kw)
    return row


def test_a_failed_configuration_is_recorded_and_the_run_goes_on(tmp_path):
    # rows of an earlier run (--append keeps those this run does not measure again)
    ps_scaling.write_csv(tmp_path / "out.csv", [
        synthetic_row("caffe_ps", "emulated", 1, 100.0),
        synthetic_row("caffe_ps", "emulated", 2, 150.0),
        synthetic_row("caffe_ps", "none", 1, 1.0, note="replaced")])
    # 1 KiB cannot hold the net: every worker stops at its memory plan
    r, rows, md = run_script(tmp_path, "--modes", "caffe_ps", "--links", "none",
                             "--budget", "1K", "--append", timeout=60)
    assert r.returncode == 1
    got = [(x["link"], x["world_size"], x["status"]) for x in rows]
    assert got == [("none", "1", "failed"), ("none", "2", "failed"),
                   ("emulated", "1", "ok"), ("emulated", "2", "ok")]
    for x in rows[:2]:
        assert "rank" in x["error"] and "too small" in x["error"]
        assert x["images_per_s"] == "" and x["speedup"] == "" and x["note"] == ""
        assert x["command"].startswith("python3 scripts/ps_scaling.py --quick")
    assert rows[3]["command"] == "an earlier command"
    assert float(rows[3]["speedup"]) == 1.5 and float(rows[3]["efficiency"]) == 0.75
    assert "2 of 4 configuration(s) failed" in md and "too small" in md
    assert "an earlier command" in md and "--budget 1K" in md
    assert "too small" in r.stderr


def test_a_run_killed_midway_keeps_the_rows_it_finished(tmp_path, monkeypatch):
    """The tables are rewritten, atomically, after every configuration: a run stopped in
    its third configuration (session 45: an outer `timeout` killed one during its fourth and
    the three rows it had measured were lost) leaves the first two, with --append's earlier
    rows, and no temporary file."""
    ps_scaling.write_csv(tmp_path / "out.csv", [
        synthetic_row("caffe_ps", "emulated", 2, 150.0)])       # kept: not measured again
    done = []

    def fake_run(cfg, args, work):
        if len(done) == 2:
            raise KeyboardInterrupt                  # stands for the outer timeout's signal
        done.append(cfg)
        row = synthetic_row(cfg.mode, cfg.link, cfg.world, 10.0 * cfg.world)
        row.update(error="", wall_s=1.0)
        return row
    monkeypatch.setattr(ps_scaling, "run_config", fake_run)
    with pytest.raises(KeyboardInterrupt):
        ps_scaling.main(["--quick", "--modes", "accudnn_ps", "--append",
                         "--csv", str(tmp_path / "out.csv"), "--md", str(tmp_path / "out.md"),
                         "--work-dir", str(tmp_path / "work")])
    rows = ps_scaling.read_csv_rows(tmp_path / "out.csv")
    got = sorted((r["mode"], r["link"], int(r["world_size"])) for r in rows)
    want = sorted([(c.mode, c.link, c.world) for c in done] + [("caffe_ps", "emulated", 2)])
    assert got == want and len(done) == 2
    assert "accudnn_ps" in (tmp_path / "out.md").read_text()
    assert not [p for p in os.listdir(tmp_path) if ".tmp" in p]


def test_ipc_links_bind_socket_files_and_remove_them(tmp_path, monkeypatch):
    """--links ipc: the shards bind ZeroMQ ipc:// sockets in a directory of their own, the
    workers reach them there, and the directory is gone afterwards."""
    sock_root = tmp_path / "tmp"
    sock_root.mkdir()
    monkeypatch.setenv("TMPDIR", str(sock_root))
    r, rows, md = run_script(tmp_path, "--modes", "caffe_ps", "--links", "ipc", timeout=60)
    assert r.returncode == 0, r.stdout + r.stderr
    assert [(x["link"], x["world_size"], x["status"]) for x in rows] == [
        ("ipc", "1", "ok"), ("ipc", "2", "ok")]
    assert float(rows[1]["speedup"]) > 0 and float(rows[1]["mb_pushed_per_iter"]) > 0.5
    endpoints = [p.read_text() for p in (tmp_path / "work").rglob("shard*.endpoint")]
    assert len(endpoints) == 3                   # W = 1: one shard; W = 2: two
    assert all(e.startswith(f"ipc://{sock_root}/mcps-") for e in endpoints), endpoints
    assert list(sock_root.iterdir()) == []       # the socket directory was removed
    assert "| ipc |" in md


def test_read_lag_is_from_a_ranks_last_push_to_the_last_shard_reading_it():
    def rank(push_ts):
        return [{"iteration": i, "parts": {"last_push_t": t}} for i, t in enumerate(push_ts)]

    def shard(starts, done):
        return [{"iteration": i, "start_t": s, "rank_done_s": d}
                for i, (s, d) in enumerate(zip(starts, done))]
    # 3 rounds, the first a warm-up; two ranks, two shards
    ranks = [rank([10.0, 20.0, 30.0]), rank([10.5, 20.5, 30.5])]
    shards = [shard([9.0, 19.0, 29.0], [[1.1, 1.6], [1.2, 1.7], [1.4, 1.9]]),
              shard([9.0, 19.0, 29.0], [[1.0, 1.5], [1.3, 1.8], [1.1, 1.6]])]
    # round 1: rank 0 read at max(20.2, 20.3) - 20.0 = 0.3, rank 1 20.8 - 20.5 = 0.3;
    # round 2: rank 0 30.4 - 30 = 0.4, rank 1 30.9 - 30.5 = 0.4
    got = ps_scaling.read_lag(ranks, shards, warmup=1, iters=2)
    assert abs(got["read_lag_s"] - 0.35) < 1e-9
    old = [[{k: v for k, v in x.items() if k != "start_t"} for x in recs] for recs in shards]
    assert ps_scaling.read_lag(ranks, old, 1, 2) == {}            # an older shard's stats
    assert ps_scaling.read_lag([[{"iteration": 1, "parts": {}}]], shards, 0, 2) == {}


def test_pin_plan_gives_each_worker_a_block_and_the_shards_the_rest():
    assert ps_scaling.pin_plan(0, 3) == ([None] * 3, None)
    blocks, shards = ps_scaling.pin_plan(2, 2, allowed={4, 5, 6, 7, 8, 9})
    assert blocks == [{4, 5}, {6, 7}] and shards == {8, 9}
    with pytest.raises(ValueError, match="--pin 2: 3 worker.*need 6 CPUs.*may use 6"):
        ps_scaling.pin_plan(2, 3, allowed=set(range(6)))


@pytest.mark.skipif(not hasattr(os, "sched_getaffinity") or len(os.sched_getaffinity(0)) < 2,
                    reason="needs Linux affinity and 2 CPUs")
def test_pinned_processes_run_on_their_cpus(tmp_path):
    """--pin 1: the worker runs on the first CPU this process may use, the shard on the rest
    (each process's log names its CPUs, and the run measures as unpinned)."""
    allowed = sorted(os.sched_getaffinity(0))
    r, rows, md = run_script(tmp_path, "--modes", "caffe_ps", "--links", "none", "--gpus", "1",
                             "--pin", "1", timeout=60)
    assert r.returncode == 0, r.stdout + r.stderr
    assert [(x["world_size"], x["status"]) for x in rows] == [("1", "ok")]
    logs = {p.name: p.read_text() for p in (tmp_path / "work").rglob("*.log")}
    rank = next(t for n, t in logs.items() if n == "rank0.log")
    shard = next(t for n, t in logs.items() if n == "shard0.log")
    assert f"# CPUs {allowed[0]}\n" in rank
    assert f"# CPUs {','.join(map(str, allowed[1:]))}\n" in shard


def test_dry_run_lists_the_gpu_matrix():
    r = subprocess.run([sys.executable, SCRIPT, "--dry-run", "--caffe-batch",
                        "resnet101=18,resnet152=12"], cwd=ROOT, env=env(), capture_output=True,
                       text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    tags = [ln.split(":")[0] for ln in r.stdout.splitlines() if ln.startswith("resnet")]
    # 2 nets x 2 modes x (ps loopback, ps emulated, nccl) x W = 1, 2, 4
    assert len(tags) == 36 and len(set(tags)) == 36
    assert "resnet152_accudnn_ps_nccl_none_W4" in tags
    assert "--comm nccl --gpu 0" in r.stdout
    assert "--link-gbps 10.0 --link-latency-ms 0.1" in r.stdout
    assert "--swap none --budget 12G" in r.stdout and "--swap naive --budget 12G" in r.stdout
    assert "NOT AccUDNN's dynamic plan" in r.stdout


def test_dry_run_with_and_without_overlap():
    r = subprocess.run([sys.executable, SCRIPT, "--dry-run", "--caffe-batch", "resnet101=18",
                        "--nets", "resnet101", "--overlap", "on,off",
                        "--bucket-mb", "50"], cwd=ROOT, env=env(), capture_output=True,
                       text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    lines = r.stdout.splitlines()
    tags = [ln.split(":")[0] for ln in lines if ln.startswith("resnet")]
    # 2 modes x (ps loopback, ps emulated, nccl) x (overlap on, off) x W = 1, 2, 4
    assert len(tags) == 36 and len(set(tags)) == 36
    assert sum(t.endswith("_nooverlap") for t in tags) == 18
    cmds = {t: lines[lines.index(next(ln for ln in lines if ln.startswith(t + ":"))) + 1]
            for t in tags}
    assert "--no-overlap" in cmds["resnet101_caffe_ps_nccl_none_W2_nooverlap"]
    assert "--no-overlap" not in cmds["resnet101_caffe_ps_nccl_none_W2"]
    assert "--bucket-mb 50.0" in cmds["resnet101_caffe_ps_nccl_none_W2"]
    assert "--bucket-mb 50.0" in cmds["resnet101_caffe_ps_ps_none_W2"]
    assert "--bucket-mb" not in cmds["resnet101_caffe_ps_ps_none_W2_nooverlap"]
    bad = subprocess.run([sys.executable, SCRIPT, "--dry-run", "--quick", "--overlap", "maybe"],
                         cwd=ROOT, env=env(), capture_output=True, text=True, timeout=60)
    assert bad.returncode != 0 and "known: on, off" in bad.stderr


def test_rows_from_before_the_overlap_column_read_as_overlap_off(tmp_path):
    old_columns = [c for c in ps_scaling.CSV_COLUMNS if c != "overlap"]
    path = tmp_path / "old.csv"
    with open(path, "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=old_columns)
        w.writeheader()
        w.writerow({c: "" for c in old_columns} | {"net": "n", "mode": "caffe_ps", "comm": "ps",
                                                   "link": "none", "world_size": "2",
                                                   "status": "ok", "images_per_s": "10"})
    old = ps_scaling.read_csv_rows(path)
    assert old[0]["overlap"] == "off"
    new = dict(old[0], overlap="on", images_per_s=12.0)
    merged = ps_scaling.merge_rows(old, [new])
    assert [r["overlap"] for r in merged] == ["on", "off"]      # both kept, on first


def rec(it, compute, delta, pushed=100, pulled=100):
    return {"iteration": it, "compute_s": compute, "delta_s": delta, "bytes_pushed": pushed,
            "bytes_pulled": pulled}


def test_summarise_uses_the_slowest_rank_and_medians():
    r0 = [rec(0, 9.0, 9.0)] + [rec(i, 0.10, 0.02) for i in range(1, 6)]
    r1 = [rec(0, 9.0, 9.0)] + [rec(i, 0.08, 0.05 if i != 3 else 0.5) for i in range(1, 6)]
    s = ps_scaling.summarise([r0, r1], warmup=1, iters=5, batch=8)
    periods = [max(0.12, 0.13 if i != 3 else 0.58) for i in range(1, 6)]
    assert s["iter_s"] == pytest.approx(statistics.median(periods))
    assert s["images_per_s"] == pytest.approx(2 * 8 / statistics.median(periods))
    assert s["compute_s"] == pytest.approx(statistics.median([0.10] * 5 + [0.08] * 5))
    assert s["comm_s"] == pytest.approx(statistics.median([0.02] * 5 + [0.05] * 4 + [0.5]))
    assert s["comp_comm_ratio"] == pytest.approx(s["compute_s"] / s["comm_s"])
    assert s["compute_s_per_rank"] == "0.1;0.08" and s["timed_iterations"] == 5
    assert s["mb_pushed_per_iter"] == pytest.approx(1e-4)
    assert "pull_wait_s" not in s                    # no parts recorded, none reported
    with pytest.raises(ValueError, match="none after the 6 warm-up"):
        ps_scaling.summarise([r0, r1], warmup=6, iters=5, batch=8)
    for i, r in enumerate(r0[1:] + r1[1:]):          # a parameter-server worker's parts
        r["parts"] = {"push_s": 0.001, "pull_wait_s": 0.002 * (i % 3), "copy_up_s": 0.004}
    s = ps_scaling.summarise([r0, r1], warmup=1, iters=5, batch=8)
    assert (s["push_s"], s["copy_up_s"]) == pytest.approx((0.001, 0.004))
    assert s["pull_wait_s"] == pytest.approx(0.002)
    assert "cuda_graph" not in s                     # no worker reported it
    for i, r in enumerate(r0[1:] + r1[1:]):          # iterations run as graph launches
        r["parts"]["graph"] = 0.0 if i == 0 else 1.0
    s = ps_scaling.summarise([r0, r1], warmup=1, iters=5, batch=8)
    assert s["cuda_graph"] == pytest.approx(0.9)


def test_cuda_graph_reaches_every_worker():
    args = ps_scaling.parse_args(["--cuda-graph"])
    assert args.cuda_graph
    cfg = ps_scaling.Config("resnet152", "accudnn_ps", "ps", "none", 2, 8, ["--swap", "dynamic"])
    assert "--cuda-graph" in ps_scaling.worker_cmd(cfg, args, 1, "s.prototxt", "tcp://x", "/tmp")
    assert "--cuda-graph" not in ps_scaling.worker_cmd(cfg, ps_scaling.parse_args([]), 1,
                                                       "s.prototxt", "tcp://x", "/tmp")


def test_add_scaling_needs_the_one_worker_baseline():
    def row(mode, w, ips, status="ok", compute_s=0.1):
        return {"net": "n", "mode": mode, "comm": "ps", "link": "none", "overlap": "on",
                "world_size": w, "images_per_s": ips, "status": status, "speedup": "",
                "efficiency": "", "batch_per_worker": 8, "compute_s": compute_s}
    rows = ps_scaling.add_scaling([row("a", 1, 100.0, compute_s=0.05), row("a", 2, 150.0),
                                   row("a", 4, 280.0), row("b", 1, 0.0, "failed"),
                                   row("b", 2, 90.0)])
    assert [r["speedup"] for r in rows[:3]] == pytest.approx([1.0, 1.5, 2.8])
    assert [r["efficiency"] for r in rows[:3]] == pytest.approx([1.0, 0.75, 0.7])
    # alone, one GPU computes 8 images in 50 ms: 160 images/s
    assert [r["eff_alone"] for r in rows[:3]] == pytest.approx([100 / 160, 150 / 320, 280 / 640])
    assert rows[4]["speedup"] == "" and rows[4]["efficiency"] == "" and rows[4]["eff_alone"] == ""


def test_alone_ranks_do_not_wait_for_one_another():
    # two ranks that train by themselves: one at 0.1 s per iteration, one at 0.2 s
    r0 = [rec(i, 0.09, 0.01) for i in range(6)]
    r1 = [rec(i, 0.19, 0.01 if i != 4 else 0.3) for i in range(6)]
    s = ps_scaling.summarise([r0, r1], warmup=1, iters=5, batch=8, together=False)
    assert s["images_per_s"] == pytest.approx(8 / 0.1 + 8 / 0.2)    # not 2 x 8 / 0.2
    assert s["iter_s"] == pytest.approx(2 * 8 / s["images_per_s"])
    together = ps_scaling.summarise([r0, r1], warmup=1, iters=5, batch=8)
    assert together["images_per_s"] == pytest.approx(2 * 8 / 0.2)


def test_vs_together_compares_with_the_alone_row_of_the_same_w():
    def row(comm, w, ips, compute_s=0.1, status="ok"):
        return {"net": "n", "mode": "m", "comm": comm, "link": "none", "overlap": "on",
                "world_size": w, "images_per_s": ips, "status": status,
                "batch_per_worker": 8, "compute_s": compute_s}
    rows = ps_scaling.add_scaling([
        row("alone", 1, 80.0), row("alone", 4, 300.0), row("ps", 1, 70.0),
        row("ps", 4, 240.0), row("nccl", 4, 290.0), row("ps", 2, 100.0),
        row("alone", 8, 0.0, status="failed"), row("ps", 8, 400.0)])
    by = {(r["comm"], r["world_size"]): r for r in rows}
    assert by["ps", 4]["eff_together"] == pytest.approx(240 / 300)
    assert by["nccl", 4]["eff_together"] == pytest.approx(290 / 300)
    assert by["alone", 4]["eff_together"] == ""          # itself
    assert by["ps", 2]["eff_together"] == ""             # no alone row at W = 2
    assert by["ps", 8]["eff_together"] == ""             # its alone row failed
    assert by["alone", 4]["efficiency"] == pytest.approx(300 / 80 / 4)


def test_alone_workers_are_worlds_of_one_on_their_own_gpus():
    cfg = ps_scaling.Config("resnet152", "accudnn_ps", "alone", "none", 4, 72,
                            ["--swap", "dynamic"])
    args = ps_scaling.parse_args(["--nets", "resnet152"])
    cmd = ps_scaling.worker_cmd(cfg, args, 3, "s.prototxt", "tcp://127.0.0.1:5", "d")
    at = {k: cmd[cmd.index(k) + 1] for k in ("--rank", "--world-size", "--comm", "--gpu")}
    assert at == {"--rank": "0", "--world-size": "1", "--comm": "nccl", "--gpu": "3"}
    ports = ps_scaling.distinct_free_ports(8)
    assert len(set(ports)) == 8
    r = subprocess.run([sys.executable, SCRIPT, "--dry-run", "--cpu", "--nets", "resnet152",
                        "--comms", "alone,ps", "--links", "none", "--gpus", "1",
                        "--caffe-batch", "resnet152=4", "--modes", "caffe_ps"], cwd=ROOT,
                       env=env(), capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    assert "--comm alone skipped: CPU workers" in r.stdout
    assert "resnet152_caffe_ps_ps_none_W1" in r.stdout and "_alone_" not in r.stdout


def test_the_busiest_shard_of_each_timed_round():
    def rec(i, update, send):
        return {"iteration": i, "update_s": update, "send_s": send}
    shards = [[rec(0, 9.0, 9.0), rec(1, 0.010, 0.002), rec(2, 0.030, 0.001)],
              [rec(0, 9.0, 9.0), rec(1, 0.020, 0.001), rec(2, 0.010, 0.001)]]
    got = ps_scaling.summarise_shards(shards, warmup=1, iters=5)
    assert got["server_update_s"] == pytest.approx((0.020 + 0.030) / 2)
    assert got["server_busy_s"] == pytest.approx((0.021 + 0.031) / 2)
    assert "server_tail_s" not in got          # records of before session 15: no tail
    for k, sh in enumerate(shards):
        for i, r in enumerate(sh):
            r["tail_s"], r["spread_s"] = 0.001 * (i + k), 0.002 * i
    got = ps_scaling.summarise_shards(shards, warmup=1, iters=5)
    assert got["server_tail_s"] == pytest.approx((0.002 + 0.003) / 2)
    assert got["rank_spread_s"] == pytest.approx((0.002 + 0.004) / 2)
    assert "lagging_ranks" not in got              # no rank_done_s: not reported
    # round 1: shard 1 heard last, from rank 0; round 2: shard 0 heard last, from rank 2
    shards[0][1]["rank_done_s"], shards[1][1]["rank_done_s"] = [0.1, 0.2, 0.0], [0.3, 0.1, 0.2]
    shards[0][2]["rank_done_s"], shards[1][2]["rank_done_s"] = [0.1, 0.2, 0.5], [0.3, 0.1, 0.2]
    for sh in shards:
        sh[0]["rank_done_s"] = [1.0, 0.0, 0.0]     # a warm-up round: not counted
    got = ps_scaling.summarise_shards(shards, warmup=1, iters=5)
    assert got["lagging_ranks"] == "0:1;2:1"
    assert ps_scaling.summarise_shards([], 1, 5) == {}


def test_accudnn_with_a_profile_needs_its_batch_and_runs_dynamic(tmp_path):
    args = ps_scaling.parse_args(["--quick", "--modes", "accudnn_ps", "--links", "none",
                                  "--profile", "cifar10_quick=p.json"])
    args.accudnn_batch = ""
    with pytest.raises(SystemExit, match="--accudnn-batch cifar10_quick=k"):
        ps_scaling.plan_configs(args)
    args.accudnn_batch = "cifar10_quick=6"
    configs, notes = ps_scaling.plan_configs(args)
    assert [c.world for c in configs] == [1, 2] and all(c.batch == 6 for c in configs)
    assert configs[0].swap[:2] == ["--swap", "dynamic"] and "--profile" in configs[0].swap
    assert configs[0].swap[configs[0].swap.index("--batch") + 1] == "6"
    assert not any("naive" in n for n in notes)


def test_wait_group_kills_at_the_deadline(tmp_path):
    p = ps_scaling.Proc("rank0", [sys.executable, "-c", "import time; time.sleep(60)"],
                        str(tmp_path), env())
    t0 = time.monotonic()
    reason, culprit = ps_scaling.wait_group([p], time.monotonic() + 0.5)
    assert "timed out" in reason and "rank0" in reason and culprit is p
    assert time.monotonic() - t0 < 10 and p.popen.poll() is not None


# ------------------------------------------- the timing split the script reads
DUMMY_NET = """
name: "tiny_dummy"
layer {{ name: "data" type: "DummyData" top: "data" top: "target"
        dummy_data_param {{ shape {{ dim: {k} dim: 4 }} shape {{ dim: {k} dim: 2 }}
                            data_filler {{ type: "gaussian" std: 1 }} }} }}
layer {{ name: "ip" type: "InnerProduct" bottom: "data" top: "ip"
        inner_product_param {{ num_output: 2 weight_filler {{ type: "xavier" }} }} }}
layer {{ name: "loss" type: "EuclideanLoss" bottom: "ip" bottom: "target" top: "loss" }}
"""


def test_what_follows_the_sync_counts_as_the_next_compute(tmp_path):
    """compute + Delta must be the whole iteration: the NCCL worker's local update
    (its _after_sync) runs after Delta's clock stops, so it belongs to compute."""
    from minicaffe.solver import Solver
    from ps.worker import DataParallel

    class SlowUpdate(DataParallel):
        def _join(self):
            pass

        def _synchronize(self, display):
            time.sleep(0.01)
            return 0, 0

        def _after_sync(self, display):
            time.sleep(0.05)

        def _abort(self, reason):
            pass

        def _close(self):
            pass

    solver = Solver(write_solver(tmp_path, "t", DUMMY_NET, k=2, max_iter=4), mode="CPU",
                    verbose=False)
    dp = SlowUpdate(solver, 0, 1)
    t0 = time.perf_counter()
    dp.step(4)
    wall = time.perf_counter() - t0
    recs = list(dp.stats.records)
    assert len(recs) == 4
    assert all(r.delta_s >= 0.01 and r.delta_s < 0.05 for r in recs)
    assert all(r.compute_s >= 0.05 for r in recs[1:])
    # the records cover the iterations but the last update (after the last sync)
    covered = sum(r.compute_s + r.delta_s for r in recs)
    assert covered <= wall and wall - covered < 0.05 + 0.04


def test_table2_figure_takes_the_papers_baseline_where_there_is_one(tmp_path):
    def row(net, mode, comm, w, ips):
        return {"net": net, "mode": mode, "comm": comm, "link": "none", "overlap": "on",
                "world_size": w, "images_per_s": ips, "status": "ok", "batch_per_worker": 8,
                "compute_s": 0.1, "device": "D"}
    rows = [row("resnet152", "caffe_ps", "nccl", 1, 50.0), row("resnet152", "caffe_ps", "ps", 1, 40.0),
            row("resnet152", "accudnn_ps", "ps", 1, 100.0),
            row("resnet152", "accudnn_ps", "ps", 8, 385.0), row("other", "accudnn_ps", "ps", 1, 10.0),
            row("other", "accudnn_ps", "ps", 2, 19.0)]
    # one GPU in Caffe mode, not on the parameter server: the alone row first, else NCCL's
    assert ps_scaling.paper_baseline(rows, "resnet152")["comm"] == "nccl"
    assert ps_scaling.paper_baseline(rows + [row("resnet152", "caffe_ps", "alone", 1, 55.0)],
                                     "resnet152")["images_per_s"] == 55.0
    assert ps_scaling.paper_baseline(rows, "other") is None
    csv_a, csv_b = tmp_path / "a.csv", tmp_path / "b.csv"
    ps_scaling.write_csv(csv_a, ps_scaling.add_scaling(rows[:4]))
    ps_scaling.write_csv(csv_b, ps_scaling.add_scaling(rows[4:]))
    assert ps_scaling.main(["--redraw", str(csv_a), str(csv_b), "--md",
                            str(tmp_path / "t2.md")]) == 0
    assert (tmp_path / "t2.png").stat().st_size > 0
    md = (tmp_path / "t2.md").read_text()
    # W = 8 of ResNet-152's AccUDNN_PS: 385 images/s over the NCCL world of one's 50, beside 7.7x
    assert "| resnet152 | accudnn_ps |  | ps | loopback | on | 8 | 8 | 385.0 | 3.85x |" in md
    assert "| 7.70x | 7.7x |" in md and "| other | accudnn_ps |" in md
    # a file with no series to draw says so
    ps_scaling.write_csv(csv_a, [dict(rows[0], status="failed")])
    assert ps_scaling.main(["--redraw", str(csv_a), "--md", str(tmp_path / "t3.md")]) == 1
