"""scripts/_telemetry.py: the GPU samples and the host's steal time that ps_scaling.py
records beside each configuration (issue 6's slow rank: its GPU or its host?)."""
import os
import stat
import sys
import time

import pytest

from ps_helpers import ROOT

sys.path.insert(0, str(ROOT))
from scripts import _telemetry as tm  # noqa: E402

# index, util %, SM MHz, W, C, reasons: GPU 1 power-capped in two of its three busy samples
SAMPLES = """\
0, 97, 1980, 610.5, 55, 0x0000000000000000
1, 95, 1755, 700.0, 61, 0x0000000000000004
0, 3, 345, 80.1, 40, 0x0000000000000001
1, 99, 1740, 699.1, 62, 0x0000000000000004
0, 98, 1975, 605.0, 56, 0x0000000000000000
1, 96, 1980, 500.0, 60, 0x0000000000000000
1, 9
"""


def test_busy_samples_are_summarised_per_gpu_in_rank_order():
    samples = tm.parse_samples(SAMPLES)
    assert len(samples) == 6                      # the cut last line is skipped
    got = tm.summarise_gpu(samples, [1, 0, 2])
    assert got["gpu_busy_samples"] == "3;2;0"     # GPU 0's idle sample left out; no GPU 2
    assert got["gpu_sm_mhz_per_rank"] == "1755;1978;"
    assert got["gpu_power_w_per_rank"] == "699;608;"
    assert got["gpu_temp_c_per_rank"] == "61;56;"
    assert got["gpu_slowdown_per_rank"] == "0.67;0.00;"
    assert got["gpu_reasons_per_rank"] == "0x4;0x0;"


def test_samples_without_a_reason_field_or_with_na_values():
    got = tm.summarise_gpu(tm.parse_samples("0, 90, 1500, [N/A], 50\n", with_reasons=False), [0])
    assert got["gpu_sm_mhz_per_rank"] == "1500" and got["gpu_power_w_per_rank"] == ""
    assert got["gpu_slowdown_per_rank"] == "" and got["gpu_reasons_per_rank"] == ""


def test_steal_is_a_share_of_all_cpu_time(tmp_path):
    def stat_file(name, steal, idle):
        p = tmp_path / name
        # user nice system idle iowait irq softirq steal guest guest_nice
        p.write_text(f"cpu  100 0 50 {idle} 0 0 0 {steal} 30 0\ncpu0 1 2 3\n")
        return str(p)
    before = tm.cpu_times(stat_file("a", 10, 1000))
    after = tm.cpu_times(stat_file("b", 30, 1180))
    assert before == (10, 1160) and after == (30, 1360)     # guest time not counted twice
    assert tm.steal_pct(before, after) == "10.00"
    assert tm.steal_pct(None, after) == "" and tm.steal_pct(after, before) == ""
    assert tm.cpu_times(str(tmp_path / "missing")) is None


def test_sampler_runs_nvidia_smi_in_the_background_and_stops(tmp_path):
    fake = tmp_path / "nvidia-smi"
    # answers the reason-field probe for the new name only, then loops like -lms
    fake.write_text("#!/bin/sh\n"
                    "case \"$1\" in *clocks_event_reasons.active) ;; *) "
                    "[ \"$#\" -eq 2 ] && exit 6 ;; esac\n"
                    "if [ \"$#\" -eq 2 ]; then echo 0x0; exit 0; fi\n"
                    "echo \"$@\" > \"$(dirname \"$0\")/args\"\n"
                    "while true; do echo '0, 90, 1800, 650, 50, 0x8'; sleep 0.05; done\n")
    fake.chmod(fake.stat().st_mode | stat.S_IEXEC)
    s = tm.GpuSampler(str(tmp_path / "samples.csv"), smi=str(fake)).start()
    assert s.reason_field == "clocks_event_reasons.active"
    time.sleep(0.5)
    got = s.stop([0])
    assert "--loop-ms=100" in (tmp_path / "args").read_text()
    assert int(got["gpu_busy_samples"]) >= 2
    assert got["gpu_sm_mhz_per_rank"] == "1800" and got["gpu_slowdown_per_rank"] == "1.00"
    assert s.proc is None


def test_sampler_without_nvidia_smi_says_so():
    s = tm.GpuSampler(os.devnull, smi="no-such-nvidia-smi-here").start()
    assert s.stop([0]) == {} and "no nvidia-smi" in s.note


def test_backlog_is_device_time_less_host_time_since_the_first_probe():
    from swap.runtime import backlog_summary
    # host-bound: the device keeps up with the host's launches (backlog ~0)
    assert backlog_summary([(0.0, 0.0), (0.010, 0.0101), (0.030, 0.0299), (0.050, 0.0502)]) \
        == pytest.approx({"gpu_backlog_s": 1e-4, "gpu_backlog_max_s": 2e-4})
    # device-bound: the host runs ahead until the queue is full (backlog grows, then holds)
    got = backlog_summary([(0.0, 0.0), (0.005, 0.020), (0.010, 0.045), (0.060, 0.105)])
    assert got == pytest.approx({"gpu_backlog_s": 0.035, "gpu_backlog_max_s": 0.045})
    assert backlog_summary([(0.0, 0.0)]) == {} and backlog_summary([]) == {}


class _Cuda:
    @staticmethod
    def get_elapsed_time(a, b):
        return 1e3 * (b["t"] - a["t"])       # milliseconds, as CuPy's


class _FakeStreams:
    """Events that remember when they were recorded, on a clock the test moves."""
    gpu = True
    cp = type("cupy", (), {"cuda": _Cuda})

    def __init__(self):
        self.now = 0.0
        self.recorded = []

    def event(self, timing=False):
        assert timing
        return {"t": None}

    def record(self, event, stream):
        event["t"] = self.now
        self.recorded.append(stream)


def test_backlog_probes_every_nth_step_and_the_last():
    from swap.runtime import COMPUTE, Backlog
    st = _FakeStreams()
    b = Backlog(st, n_steps=70, every=32)
    assert sorted(b.steps) == [0, 32, 64, 69]
    for j in range(70):
        st.now = 2.0 * j                       # the device's clock when step j's event ran
        if j in b.steps:
            b.mark(j)
    pts = b.read()
    assert [round(d, 6) for _, d in pts] == [0.0, 64.0, 128.0, 138.0]
    assert all(h >= 0 for h, _ in pts) and st.recorded == [COMPUTE] * 4
    assert b.read() == []                      # one iteration's probes are read once
    with pytest.raises(ValueError, match="every must be >= 1"):
        Backlog(st, 10, every=0)


def test_physical_gpus_follow_cuda_visible_devices():
    assert tm.physical_gpus(2, {}) == [0, 1]
    assert tm.physical_gpus(2, {"CUDA_VISIBLE_DEVICES": "3, 1,0"}) == [3, 1]
    assert tm.physical_gpus(2, {"CUDA_VISIBLE_DEVICES": "GPU-aa,GPU-bb"}) == [0, 1]
    assert tm.physical_gpus(3, {"CUDA_VISIBLE_DEVICES": "2"}) == [0, 1, 2]
