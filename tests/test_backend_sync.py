"""$MINICAFFE_CUDA_SYNC: how a host thread waits for the GPU (minicaffe.backend.set_device).
The parsing is tested here; the GPU test reads the primary context's flags back in fresh
processes (before and after the context exists)."""
import os
import subprocess
import sys

import pytest

from minicaffe import backend

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def test_the_variable_names_a_cuda_scheduling_flag():
    assert backend.cuda_sync_flag({}) is None
    assert backend.cuda_sync_flag({"MINICAFFE_CUDA_SYNC": ""}) is None
    assert backend.cuda_sync_flag({"MINICAFFE_CUDA_SYNC": " Blocking "}) == 0x4
    assert backend.cuda_sync_flag({"MINICAFFE_CUDA_SYNC": "spin"}) == 0x1
    assert backend.cuda_sync_flag({"MINICAFFE_CUDA_SYNC": "auto"}) == 0x0
    with pytest.raises(ValueError, match=r"\$MINICAFFE_CUDA_SYNC='sleep': give one of auto, "
                                         r"spin, yield, blocking"):
        backend.cuda_sync_flag({"MINICAFFE_CUDA_SYNC": "sleep"})


def test_without_a_gpu_set_device_sets_no_flag(monkeypatch):
    monkeypatch.setenv("MINICAFFE_CUDA_SYNC", "blocking")
    monkeypatch.setattr(backend, "gpu_available", lambda: False)
    monkeypatch.setattr(backend, "set_sync", lambda *a: pytest.fail("set_sync without a GPU"))
    before = backend._default["device"]
    try:
        backend.set_device(0)
        assert backend._default["device"] == 0
    finally:
        backend._default["device"] = before


PROBE = """
import cupy
from minicaffe.backend import set_device, sync_flags
if {early}:
    cupy.zeros(1)                      # the context exists before set_device
set_device(0)
x = cupy.arange(10) * 2
cupy.cuda.Device().synchronize()
print("FLAGS", sync_flags(0), int(x.sum()))
"""


@pytest.mark.gpu
@pytest.mark.parametrize("value,want", [("blocking", 4), ("spin", 1), (None, 0)])
@pytest.mark.parametrize("early", [False, True])
def test_gpu_the_flag_reaches_the_primary_context(cp, value, want, early):
    env = dict(os.environ, PYTHONPATH=REPO + os.pathsep + os.environ.get("PYTHONPATH", ""))
    env.pop("MINICAFFE_CUDA_SYNC", None)
    if value is not None:
        env["MINICAFFE_CUDA_SYNC"] = value
    r = subprocess.run([sys.executable, "-c", PROBE.format(early=early)], env=env, cwd=REPO,
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    line = [ln for ln in r.stdout.splitlines() if ln.startswith("FLAGS")][0]
    assert line.split()[1:] == [str(want), "90"]
