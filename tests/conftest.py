"""Shared fixtures: the `gpu` marker skips cleanly where no CUDA device answers."""
import os
import sys

if os.environ.get("PYTEST_XDIST_WORKER"):
    # One BLAS thread per pytest-xdist worker (set before NumPy loads OpenBLAS): with one
    # worker per core, each worker's own BLAS threads oversubscribe the cores, and OpenBLAS's
    # threads spin while they wait.  On a 2-core machine, tests/scripts/test_table3.py and
    # tests/swap/test_tuner_table.py with -n 2 took 312 s with OpenBLAS's default and 97 s
    # with one thread (session 33).  The processes the tests start inherit it.
    for _var in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS"):
        os.environ.setdefault(_var, "1")

import numpy as np  # noqa: E402
import pytest

from minicaffe.backend import gpu_available


def pytest_collection_modifyitems(config, items):
    if gpu_available():
        return
    skip = pytest.mark.skip(reason="no CUDA device (GPU tests run on the device machine)")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


@pytest.fixture(autouse=True)
def _caffe_engine_by_default():
    """Tests exercise the CAFFE engine (the reference kernels) unless they ask for
    another; on a GPU machine the automatic default would otherwise be CUDNN.
    tests/layers/test_cudnn_engine.py sets the engine it tests itself."""
    from minicaffe import engine
    engine.set_default_engine("CAFFE")
    yield
    engine.set_default_engine(None)


@pytest.fixture(autouse=True)
def _executors_closed():
    """Close every swap executor a test leaves open.  An executor still in its dry run keeps
    ``tracemalloc`` tracing (swap.runtime.TransientMeter on the CPU), which slows every later
    test of the process 3 to 7 times: after test_tuner.py's scratch-model test left one open,
    test_plan_command_plans_the_gmap_a_profile_keeps took 22 s instead of 3 s, and so did
    much of whatever that pytest-xdist worker ran next."""
    yield
    runtime = sys.modules.get("swap.runtime")      # imported by the test, if at all
    if runtime is not None:
        runtime.close_all()


@pytest.fixture(autouse=True)
def _log_state_restored():
    """A test that runs a CLI in-process with --quiet (or redirects the log) must not
    silence the log of the tests after it."""
    from minicaffe import log
    saved = dict(log._state)
    yield
    log._state.update(saved)


@pytest.fixture
def cp():
    """The cupy module (only requested by tests marked gpu)."""
    import cupy
    return cupy


@pytest.fixture
def rng():
    return np.random.default_rng(0)


class _RecordingConv:
    """Stands for a CUDNN convolution: records every workspace limit it is given."""
    col_buffer_bytes = 1 << 20

    def __init__(self):
        self.limits = []
        self.per_image = []
        self.floors = []

    def set_workspace_limit(self, limit, per_image=0, floor=0):
        self.limits.append(limit)
        self.per_image.append(per_image)
        self.floors.append(floor)


@pytest.fixture
def recording_net():
    """A net-like object: two recording convolutions around a layer without a workspace."""
    import types
    return types.SimpleNamespace(layers=[_RecordingConv(), object(), _RecordingConv()])


@pytest.fixture(scope="session")
def tuner_quick_run(tmp_path_factory):
    """The folder of one ``scripts/tuner_table.py --quick --iters 2 --warmup 1`` run (about
    22 s on a 2-core CPU), shared by the tests that read its tables or reuse the profile it
    saves; they only read it.  Two timed iterations after one (the script's defaults are five
    after two: 41 s) are enough for what they check, the tables' and the profile's structure
    and the no-stall rounds' rule on whatever the CPU measured (the rounds still go up to
    MAX_ROUNDS while their medians spread); the rule's exact answers are
    test_tuner_table.py's unit tests on given timings.

    Under pytest-xdist the first worker to ask runs it and the others wait on a lock file in
    the session's common temporary folder, then read the same run (three tests had each run
    it before: 2 x 45 s of the suite's time)."""
    import fcntl
    import json
    import subprocess
    import sys
    root = tmp_path_factory.getbasetemp()
    if os.environ.get("PYTEST_XDIST_WORKER"):
        root = root.parent                      # the folder every worker's own one is in
    out = root / "tuner_quick_run"
    repo = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    with open(root / "tuner_quick_run.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            done = root / "tuner_quick_run.json"
            if not done.exists():
                proc = subprocess.run([sys.executable, os.path.join(repo, "scripts",
                                                                    "tuner_table.py"),
                                       "--quick", "--iters", "2", "--warmup", "1",
                                       "--out", str(out)],
                                      capture_output=True, text=True, timeout=600, cwd=repo)
                done.write_text(json.dumps({"returncode": proc.returncode,
                                            "output": proc.stdout + proc.stderr}))
            run = json.loads(done.read_text())
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)
    assert run["returncode"] == 0, run["output"]
    return out
