"""scripts/profile_gaps.py on a hand-made profile: steps grouped by the idle gap before them at
the smallest k, each with its time per image against the next k."""
import os
import subprocess
import sys

import pytest

from scripts.profile_gaps import gaps_before, groups
from swap.profiler import ComputeSample, Profile, StepInfo

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
MS = 1e-3


def profile():
    """Four steps of 1 ms at k = 4 (0.25 ms per image), 2 ms at k = 8, except step 2, which
    follows a 2 ms gap at k = 4 and takes 1.5 ms there; step 3 follows it without a gap; the
    k = 8 iteration has no gaps."""
    steps = tuple(StepInfo(j, f"l{j}", "Convolution", "forward") for j in range(4))
    small, t = [], 0.0
    for j, (gap, time) in enumerate(((0, 1), (0, 1), (2, 1.5), (0, 1))):
        t += gap * MS
        small.append(ComputeSample(4, j, 1e9, time * MS, t))
        t += time * MS
    big = [ComputeSample(8, j, 2e9, 2 * MS, 2 * j * MS) for j in range(4)]
    return Profile(net="toy", device="cpu", mode="GPU", k_base=4, ks=(4, 8), steps=steps,
                   compute=tuple(small + big), transfers=())


def test_gaps_and_groups_of_a_known_profile():
    p = profile()
    g = gaps_before(p, 4)
    assert g[0] == float("inf")
    assert g[1] == pytest.approx(0.0) and g[3] == pytest.approx(0.0)
    assert g[2] == pytest.approx(2 * MS)
    rows = {(r["gap_lo_us"], r["gap_hi_us"]): r for r in groups(p)}
    busy = rows[(0.0, 5.0)]          # steps 1 and 3: 0.25 ms per image at both k
    assert busy["steps"] == 2 and busy["median_ratio"] == pytest.approx(1.0)
    assert busy["ms_at_k"] == pytest.approx(2.0) and busy["ms_at_next"] == pytest.approx(4.0)
    idle = rows[(500.0, float("inf"))]  # step 0 (the first) and step 2 (after 2 ms)
    assert idle["steps"] == 2
    # step 0: ratio 1.0; step 2: (1.5 / 4) / (2 / 8) = 1.5; weighted by time at k = 8 (equal)
    assert idle["weighted_ratio"] == pytest.approx(1.25)
    assert (5.0, 50.0) not in rows and (50.0, 500.0) not in rows


def test_command_line_prints_the_groups(tmp_path):
    path = tmp_path / "toy_profile.json"
    profile().save(path)
    out = subprocess.run([sys.executable, os.path.join(REPO, "scripts", "profile_gaps.py"),
                          str(path)], capture_output=True, text=True, timeout=120, cwd=REPO)
    assert out.returncode == 0, out.stderr
    assert "steps at k = 4 against k = 8" in out.stdout
    assert "[500, inf) us" in out.stdout and "[0, 5) us" in out.stdout
