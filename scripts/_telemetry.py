"""What the GPUs and the host's CPUs did during one benchmark configuration.

Issue 6's parameter-server runs at W = 4 have one rank, a different one each run,
computing 10-40 % slower than the others in about a third of the runs.  The worker's
own statistics tell whether its host thread was behind; these samples tell whether
its GPU ran slower (SM clock, power, temperature, the driver's clock-event reasons)
and whether the host's virtual CPUs lost time to the hypervisor (``steal`` in
``/proc/stat``).

* :class:`GpuSampler` runs ``nvidia-smi --query-gpu=... -lms P`` in the background
  and, when stopped, summarises the samples per GPU (:func:`summarise_gpu`).  Where
  ``nvidia-smi`` is missing (CI, a CPU host) it records nothing and says so.
* :func:`cpu_times` / :func:`steal_pct`: the host's steal time between two readings.

Only samples of a busy GPU (utilisation >= ``BUSY_PCT``) are summarised, so that the
idle start-up and tear-down of the processes do not pull the medians down.
"""
from __future__ import annotations

import shutil
import statistics
import subprocess

BUSY_PCT = 50.0
# nvidia-smi's clock-event (formerly "throttle") reason bits that slow a busy GPU down:
# SW power cap 0x4, HW slowdown 0x8, SW thermal 0x20, HW thermal 0x40, HW power brake 0x80.
# Idle (0x1), application clocks (0x2) and sync boost (0x10) are left out.
SLOWDOWN_BITS = 0x4 | 0x8 | 0x20 | 0x40 | 0x80
FIELDS = ("index", "utilization.gpu", "clocks.sm", "power.draw", "temperature.gpu")
REASON_FIELDS = ("clocks_event_reasons.active", "clocks_throttle_reasons.active")


def _number(text: str):
    text = text.strip()
    if not text or text.startswith("[") or text.upper() in ("N/A", "[N/A]"):
        return None
    try:
        return int(text, 16) if text.lower().startswith("0x") else float(text)
    except ValueError:
        return None


def parse_samples(text: str, with_reasons: bool = True) -> list:
    """``nvidia-smi --format=csv,noheader,nounits`` lines of :data:`FIELDS` (plus one reason
    field) as dicts; lines that do not parse (a header, a cut last line) are skipped."""
    names = ("gpu", "util", "sm_mhz", "power_w", "temp_c") + (("reasons",) if with_reasons else ())
    out = []
    for line in text.splitlines():
        parts = [p.strip() for p in line.split(",")]
        if len(parts) != len(names):
            continue
        values = [_number(p) for p in parts]
        if values[0] is None or values[1] is None:
            continue
        d = dict(zip(names, values))
        d["gpu"] = int(d["gpu"])
        out.append(d)
    return out


def summarise_gpu(samples: list, gpus) -> dict:
    """Per GPU of ``gpus`` (in that order, ";"-joined as the per-rank columns of
    ``ps_scaling.py``): the median SM clock, power and temperature of its busy samples, the
    fraction of them with a slowdown reason (:data:`SLOWDOWN_BITS`), and the reasons seen
    (OR of the bits, hex).  A GPU without busy samples gets empty fields."""
    cols = {"gpu_sm_mhz_per_rank": [], "gpu_power_w_per_rank": [], "gpu_temp_c_per_rank": [],
            "gpu_slowdown_per_rank": [], "gpu_reasons_per_rank": [], "gpu_busy_samples": []}
    for g in gpus:
        busy = [s for s in samples if s["gpu"] == g and s["util"] >= BUSY_PCT]
        cols["gpu_busy_samples"].append(str(len(busy)))

        def med(key, fmt):
            got = [s[key] for s in busy if s.get(key) is not None]
            return fmt.format(statistics.median(got)) if got else ""
        cols["gpu_sm_mhz_per_rank"].append(med("sm_mhz", "{:.0f}"))
        cols["gpu_power_w_per_rank"].append(med("power_w", "{:.0f}"))
        cols["gpu_temp_c_per_rank"].append(med("temp_c", "{:.0f}"))
        reasons = [int(s["reasons"]) for s in busy if s.get("reasons") is not None]
        cols["gpu_slowdown_per_rank"].append(
            f"{sum(1 for r in reasons if r & SLOWDOWN_BITS) / len(reasons):.2f}" if reasons else "")
        seen = 0
        for r in reasons:
            seen |= r
        cols["gpu_reasons_per_rank"].append(f"{seen:#x}" if reasons else "")
    return {k: ";".join(v) for k, v in cols.items()}


def physical_gpus(n: int, env=None) -> list:
    """``nvidia-smi``'s indices of CUDA devices 0 .. n-1 of a process started with ``env``:
    ``$CUDA_VISIBLE_DEVICES``'s first n entries where it lists indices, else 0 .. n-1 (UUIDs
    and unset both give 0 .. n-1: nvidia-smi then names them in the same order only where
    CUDA_DEVICE_ORDER=PCI_BUS_ID, which this does not check)."""
    import os
    vis = (os.environ if env is None else env).get("CUDA_VISIBLE_DEVICES")
    if vis:
        ids = [x.strip() for x in vis.split(",") if x.strip()]
        if len(ids) >= n and all(x.isdigit() for x in ids[:n]):
            return [int(x) for x in ids[:n]]
    return list(range(n))


class GpuSampler:
    """``nvidia-smi`` sampling every ``period_ms`` into ``path`` until :meth:`stop`."""

    def __init__(self, path: str, period_ms: int = 100, smi: str = "nvidia-smi"):
        self.path = path
        self.period_ms = period_ms
        self.smi = shutil.which(smi)
        self.reason_field = None
        self.proc = None
        self.note = ""

    def _reason_field(self):
        """The clock-event reason field this driver knows (renamed in 2023), or None."""
        for field in REASON_FIELDS:
            try:
                got = subprocess.run([self.smi, f"--query-gpu={field}", "--format=csv,noheader"],
                                     capture_output=True, text=True, timeout=20)
            except (OSError, subprocess.TimeoutExpired):
                return None
            if got.returncode == 0 and got.stdout.strip():
                return field
        return None

    def start(self) -> "GpuSampler":
        if self.smi is None:
            self.note = "no nvidia-smi: GPU clocks not sampled"
            return self
        self.reason_field = self._reason_field()
        fields = FIELDS + ((self.reason_field,) if self.reason_field else ())
        with open(self.path, "w") as out:
            self.proc = subprocess.Popen(
                [self.smi, "--query-gpu=" + ",".join(fields), "--format=csv,noheader,nounits",
                 f"--loop-ms={self.period_ms}"], stdout=out, stderr=subprocess.DEVNULL)
        return self

    def stop(self, gpus) -> dict:
        """Stop sampling; :func:`summarise_gpu` of the samples (empty without ``nvidia-smi``)."""
        if self.proc is None:
            return {}
        self.proc.terminate()
        try:
            self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        self.proc = None
        try:
            with open(self.path) as f:
                text = f.read()
        except OSError:
            return {}
        return summarise_gpu(parse_samples(text, self.reason_field is not None), gpus)


def cpu_times(path: str = "/proc/stat"):
    """(steal, total) jiffies of all CPUs from ``/proc/stat``'s first line; None off Linux."""
    try:
        with open(path) as f:
            first = f.readline().split()
    except OSError:
        return None
    if not first or first[0] != "cpu":
        return None
    values = [int(v) for v in first[1:]]
    # user nice system idle iowait irq softirq steal guest guest_nice; guest time is already
    # counted in user and nice
    total = sum(values[:8])
    steal = values[7] if len(values) > 7 else 0
    return steal, total


def steal_pct(before, after) -> str:
    """The host's CPU time stolen by the hypervisor between two :func:`cpu_times`, in %
    of all CPUs' time; "" when either reading is missing."""
    if before is None or after is None or after[1] <= before[1]:
        return ""
    return f"{100.0 * (after[0] - before[0]) / (after[1] - before[1]):.2f}"
