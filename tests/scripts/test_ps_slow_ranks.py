"""scripts/ps_slow_ranks.py: issue 6's per-iteration split of a run's records by the main
thread's CPU time, from work directories and .tgz archives alike."""
import io
import json
import os
import sys
import tarfile

import pytest

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, REPO)
from scripts import ps_slow_ranks as sr  # noqa: E402


def records(cpu_ms, compute_ms, backlog_ms=None):
    out = []
    for i, (c, t) in enumerate(zip(cpu_ms, compute_ms)):
        parts = {"host_cpu_s": c / 1e3}
        if backlog_ms is not None:
            parts["gpu_backlog_s"] = backlog_ms[i] / 1e3
        out.append({"iteration": i, "compute_s": t / 1e3, "delta_s": 0.01, "parts": parts})
    return "\n".join(json.dumps(x) for x in out) + "\n"


RUN = "resnet152_accudnn_ps_ps_shm_W2"
# warm-up first (700 ms), then: rank 0 normal, rank 1 slow in its last two iterations
RANK0 = records([700, 120, 125, 118], [720, 205, 206, 204], [0, 35, 38, 36])
RANK1 = records([690, 130, 205, 210], [710, 207, 248, 251], [0, 30, 2, 4])


def test_split_by_cpu_time_with_the_backlog(tmp_path, capsys):
    run = tmp_path / "w" / RUN
    run.mkdir(parents=True)
    (run / "rank0.jsonl").write_text(RANK0)
    (run / "rank1.jsonl").write_text(RANK1)
    (run / "shard0.jsonl").write_text("{}\n")           # not a rank's: ignored
    runs = sr.read_records([str(tmp_path / "w")])
    assert list(runs) == [(str(tmp_path / "w"), RUN, 2)] and sorted(runs[list(runs)[0]]) == [0, 1]
    got = sr.split(runs, warmup=1, slow_ms=175, normal_ms=150)
    assert got["all"] == 6 and len(got["slow"]) == 2 and len(got["normal"]) == 4
    assert sorted(round(b * 1e3) for _, _, b in got["slow"]) == [2, 4]
    assert sr.split(runs, 1, 175, 150, world=4) == {"slow": [], "normal": [], "all": 0,
                                                   "runs": 0}
    assert sr.main([str(tmp_path / "w"), "--warmup", "1"]) == 0
    out = capsys.readouterr().out
    assert "> 175 ms: 2 records, CPU 208 ms, compute 250 ms, device backlog 3.0 ms" in out
    assert "<= 150 ms: 4 records" in out


def test_archives_keep_runs_of_the_same_name_apart(tmp_path):
    path = tmp_path / "raw.tgz"
    with tarfile.open(path, "w:gz") as tar:
        for d in ("w1", "w2"):
            data = RANK1.encode()
            info = tarfile.TarInfo(f"{d}/{RUN}/rank1.jsonl")
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    runs = sr.read_records([str(path)])
    assert len(runs) == 2
    assert sr.split(runs, 1, 175, 150)["all"] == 6


def test_bad_input_is_named(tmp_path, capsys):
    f = tmp_path / "notes.txt"
    f.write_text("x")
    with pytest.raises(SystemExit, match="notes.txt: neither a directory nor a .tgz"):
        sr.main([str(f)])
    assert sr.main([str(tmp_path)]) == 1
    assert "no rank*.jsonl records" in capsys.readouterr().err
