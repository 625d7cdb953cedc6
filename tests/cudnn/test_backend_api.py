"""cuDNN's graph (backend) API for the bound convolutions (minicaffe.cudnn.backend_api):
the choice of API and the engine rules on the CPU; on the GPU every direction against the
NumPy references of test_cudnn (float32 without TF32 within 1e-5, float64 within 1e-12),
Caffe's accumulation rule, no TF32 engine for float32, kept variant packs, the legacy
call for misaligned pointers, the legacy choice's workspace as the limit, and capture in
a CUDA graph."""
import math

import numpy as np
import pytest

from minicaffe.cudnn import backend_api as B
from minicaffe.cudnn import lib as cudnn_lib
from minicaffe.cudnn import ops
from test_cudnn import CONV_CASES, TOL, conv_backward_reference, conv_out_hw, conv_reference
from test_cudnn import rel_err


# ======================================================================= CPU
def test_api_choice(monkeypatch):
    monkeypatch.delenv(B.ENV_API, raising=False)
    assert B.api_choice() == "graph" == B.DEFAULT_API
    monkeypatch.setenv(B.ENV_API, " Graph ")
    assert B.api_choice() == "graph"
    assert B.api_choice("legacy") == "legacy"
    monkeypatch.setenv(B.ENV_API, "backend")
    with pytest.raises(ValueError, match=r"\$MINICAFFE_CUDNN_API'backend'.*legacy, graph"):
        B.api_choice()
    with pytest.raises(ValueError, match=r"api='v8'"):
        B.api_choice("v8")


def test_counts_are_a_copy_and_count_one_kind():
    c = B.counts()
    c["executes"] += 5                  # the caller's copy, not the module's
    B.count("legacy_no_plan")
    now = B.counts()
    assert now["legacy_no_plan"] == c["legacy_no_plan"] + 1
    assert now["executes"] == c["executes"] - 5
    with pytest.raises(KeyError):
        B.count("no such kind")


def test_bound_conv_takes_the_api(monkeypatch):
    monkeypatch.setenv(B.ENV_API, "graph")
    assert ops.BoundConv((2, 3, 5, 5), (4, 3, 3, 3), 1).api == "graph"
    assert ops.BoundConv((2, 3, 5, 5), (4, 3, 3, 3), 1, api="legacy").api == "legacy"
    with pytest.raises(ValueError, match="the cuDNN API is one of"):
        ops.BoundConv((2, 3, 5, 5), (4, 3, 3, 3), 1, api="new")


@pytest.mark.parametrize("notes, behaviours, dtype, tf32, det, why", [
    ((), (), np.float32, False, False, None),
    (("TENSOR_CORE",), (), np.float32, False, False, "TENSOR_CORE (float32 without TF32)"),
    (("TENSOR_CORE",), (), np.float32, True, False, None),
    (("TENSOR_CORE",), (), np.float64, False, False, None),
    (("DOWN_CONVERT_INPUTS",), (), np.float32, False, False,
     "DOWN_CONVERT_INPUTS (float32 without TF32)"),
    (("REDUCED_PRECISION_REDUCTION",), (), np.float32, False, False,
     "REDUCED_PRECISION_REDUCTION (float32 without TF32)"),
    (("NONDETERMINISTIC", "FFT"), (), np.float32, False, False, None),
    (("NONDETERMINISTIC",), (), np.float64, False, True, "NONDETERMINISTIC"),
    (("WINOGRAD",), ("RUNTIME_COMPILATION",), np.float32, False, False,
     "RUNTIME_COMPILATION"),
])
def test_engine_rules_are_the_legacy_searchs(notes, behaviours, dtype, tf32, det, why):
    assert B.refusal(notes, behaviours, dtype, tf32, det) == why


def test_strides_and_alignment():
    assert B.packed_strides((16, 64, 56, 56)) == [64 * 56 * 56, 56 * 56, 56, 1]
    assert B.packed_strides((7,)) == [1]
    assert B.aligned(256, 4096, None, 0)
    assert not B.aligned(256, 4100)
    assert not B.aligned(8)


# ======================================================================= GPU
@pytest.fixture
def cu(cp):
    if not cudnn_lib.available():
        pytest.skip("cuDNN not loadable: " + cudnn_lib.load_report())
    ops.clear_cache()       # the searches are kept per process; each test makes its own
    return ops


def _gpu(cp, rng, shape, dtype):
    return cp.asarray(rng.standard_normal(shape).astype(dtype))


def _directions_on_graph(conv) -> set:
    return {key[0] for key, g in conv._graph.items() if g}


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("case", sorted(CONV_CASES))
def test_graph_conv_matches_reference(cp, cu, case, dtype, rng, monkeypatch):
    """Every direction through the backend API's plan (the legacy margin lifted, so a plan
    runs wherever one exists) against the references; beta 0 overwrites, beta 1 adds."""
    monkeypatch.setattr(B, "LEGACY_MARGIN", math.inf)
    x_shape, w_shape, pad, stride, dil, groups = CONV_CASES[case]
    y_shape = (x_shape[0], w_shape[0]) + conv_out_hw(x_shape, w_shape, pad, stride, dil)
    x, w, dy = (_gpu(cp, rng, s, dtype) for s in (x_shape, w_shape, y_shape))
    b = _gpu(cp, rng, (w_shape[0],), dtype)
    conv = cu.BoundConv(x_shape, w_shape, pad, stride, dil, groups, dtype, api="graph")
    xh, wh, bh, dyh = (cp.asnumpy(a) for a in (x, w, b, dy))
    dx_ref, dw_ref, _ = conv_backward_reference(xh, wh, dyh, pad, stride, dil, groups)
    tol = TOL[dtype]
    for _ in range(2):      # the search's call, then a call on the kept plan
        y = cp.full(y_shape, np.nan, dtype)
        conv.forward(x, w, b, y)
        assert rel_err(cp.asnumpy(y), conv_reference(xh, wh, bh, pad, stride, dil, groups)) \
            <= tol
        dx = cp.full(x_shape, np.nan, dtype)
        conv.backward_data(w, dy, dx)
        assert rel_err(cp.asnumpy(dx), dx_ref) <= tol
        conv.backward_data(w, dy, dx, accumulate=True)
        assert rel_err(cp.asnumpy(dx), 2 * dx_ref) <= tol
        dw = cp.ones(w_shape, dtype)
        conv.backward_filter(x, dy, dw)                 # Caffe's rule: accumulates
        assert rel_err(cp.asnumpy(dw), dw_ref + 1) <= tol
        conv.backward_filter(x, dy, dw, accumulate=False)
        assert rel_err(cp.asnumpy(dw), dw_ref) <= tol
    if case == "wide" and dtype == np.float32:
        assert _directions_on_graph(conv) == {cu.FWD, cu.BWD_DATA, cu.BWD_FILTER}, \
            B.search_log()[-6:]


@pytest.mark.gpu
def test_float32_takes_no_tensor_core_engine(cp, cu, rng):
    """Caffe's float32 without TF32: no plan whose engine is noted TENSOR_CORE is timed or
    used (on an H100/H200 the heuristics name such engines first, and they are left out);
    with tf32=True they may be."""
    B.clear_search_log()
    x_shape, w_shape = (16, 256, 14, 14), (256, 256, 3, 3)
    x, w = _gpu(cp, rng, x_shape, np.float32), _gpu(cp, rng, w_shape, np.float32)
    y = cp.empty((16, 256, 14, 14), np.float32)
    cu.BoundConv(x_shape, w_shape, 1, api="graph").forward(x, w, None, y)
    record = B.search_log()[-1]
    assert record["error"] is None and record["candidates"] > 0, record
    assert any("TENSOR_CORE" in why for why in record["left_out"].values()), record
    ref = cp.empty_like(y)
    cu.conv2d_forward(x, w, None, ref, 1)
    assert rel_err(cp.asnumpy(y), cp.asnumpy(ref)) <= 1e-5
    cu.BoundConv(x_shape, w_shape, 1, tf32=True, api="graph").forward(x, w, None, y)
    assert not any("TENSOR_CORE" in why for why in B.search_log()[-1]["left_out"].values())


@pytest.mark.gpu
def test_packs_are_kept_and_misaligned_calls_go_legacy(cp, cu, rng, monkeypatch):
    monkeypatch.setattr(B, "LEGACY_MARGIN", math.inf)
    x_shape, w_shape = (4, 16, 12, 12), (32, 16, 3, 3)
    x, w = _gpu(cp, rng, x_shape, np.float32), _gpu(cp, rng, w_shape, np.float32)
    conv = cu.BoundConv(x_shape, w_shape, 1, api="graph")
    y = cp.empty((4, 32, 12, 12), np.float32)
    for _ in range(5):
        conv.forward(x, w, None, y)
    g = conv._graph[(cu.FWD, False, -1)]
    assert g and g.packs() == 1
    y2 = cp.empty_like(y)
    before = B.counts()
    conv.forward(x, w, None, y2)
    assert g.packs() == 2 and cp.array_equal(y, y2)
    # x four bytes past an aligned address: the legacy call runs, right, and no pack is made
    buf = cp.empty(x.size + 1, np.float32)
    xs = buf[1:].reshape(x_shape)
    xs[...] = x
    y3 = cp.empty_like(y)
    conv.forward(xs, w, None, y3)
    assert g.packs() == 2
    assert rel_err(cp.asnumpy(y3), cp.asnumpy(y)) <= 1e-5
    after = B.counts()          # one execution on a new pack, one call left to legacy
    assert {k: after[k] - before[k] for k in after if after[k] != before[k]} == {
        "executes": 1, "packs_built": 1, "legacy_misaligned": 1}


@pytest.mark.gpu
def test_plan_fits_the_legacy_choices_workspace(cp, cu, rng):
    """Without a caller's buffer the plan fits the legacy choice's bytes; with one, the
    buffer."""
    x_shape, w_shape = (16, 64, 28, 28), (64, 64, 3, 3)
    x, w = _gpu(cp, rng, x_shape, np.float32), _gpu(cp, rng, w_shape, np.float32)
    y = cp.empty((16, 64, 28, 28), np.float32)
    conv = cu.BoundConv(x_shape, w_shape, 1, api="graph")
    conv.forward(x, w, None, y)
    legacy = conv._choices[(cu.FWD, -1)]
    record = B.search_log()[-1]
    assert record["limit"] == legacy.workspace
    g = conv._graph[(cu.FWD, False, -1)]
    assert not g or g.workspace <= legacy.workspace
    small = cp.empty(1 << 10, np.uint8)
    conv.forward(x, w, None, y, small)
    assert B.search_log()[-1]["limit"] <= small.nbytes
    ref = cp.empty_like(y)
    cu.conv2d_forward(x, w, None, ref, 1)
    assert rel_err(cp.asnumpy(y), cp.asnumpy(ref)) <= 1e-5


@pytest.mark.gpu
def test_a_shape_is_searched_once_per_process(cp, cu, rng):
    """A second bound convolution of the same shape and options takes the first one's
    plan (the profiler and the tuner bind the same shapes again); clear_cache forgets it."""
    x_shape, w_shape = (8, 32, 14, 14), (64, 32, 3, 3)
    x, w = _gpu(cp, rng, x_shape, np.float32), _gpu(cp, rng, w_shape, np.float32)
    y = cp.empty((8, 64, 14, 14), np.float32)
    B.clear_search_log()
    a = cu.BoundConv(x_shape, w_shape, 1, api="graph")
    a.forward(x, w, None, y)
    b = cu.BoundConv(x_shape, w_shape, 1, api="graph")
    b.forward(x, w, None, y)
    assert len(B.search_log()) == 1
    assert a._graph[(cu.FWD, False, -1)] is b._graph[(cu.FWD, False, -1)]
    cu.clear_cache()
    a.forward(x, w, None, y)
    assert len(B.search_log()) == 2


@pytest.mark.gpu
def test_graph_conv_is_captured_in_a_cuda_graph(cp, cu, rng, monkeypatch):
    """Plans searched eagerly, then captured on a stream and replayed: the replay computes
    what the eager calls did, for new input values at the same addresses."""
    monkeypatch.setattr(B, "LEGACY_MARGIN", math.inf)
    x_shape, w_shape = (8, 32, 14, 14), (64, 32, 3, 3)
    x, w = _gpu(cp, rng, x_shape, np.float32), _gpu(cp, rng, w_shape, np.float32)
    dy = _gpu(cp, rng, (8, 64, 14, 14), np.float32)
    y, dx, dw = (cp.zeros(s, np.float32) for s in ((8, 64, 14, 14), x_shape, w_shape))
    conv = cu.BoundConv(x_shape, w_shape, 1, api="graph")
    stream = cp.cuda.Stream(non_blocking=True)
    with stream:
        conv.forward(x, w, None, y)
        conv.backward_data(w, dy, dx)
        conv.backward_filter(x, dy, dw, accumulate=False)
        stream.synchronize()
        assert _directions_on_graph(conv) == {cu.FWD, cu.BWD_DATA, cu.BWD_FILTER}
        stream.begin_capture()
        conv.forward(x, w, None, y)
        conv.backward_data(w, dy, dx)
        conv.backward_filter(x, dy, dw, accumulate=False)
        graph = stream.end_capture()
        x[...] = _gpu(cp, rng, x_shape, np.float32)
        dy[...] = _gpu(cp, rng, (8, 64, 14, 14), np.float32)
        graph.launch(stream)
        stream.synchronize()
    xh, wh, dyh = (cp.asnumpy(a) for a in (x, w, dy))
    dx_ref, dw_ref, _ = conv_backward_reference(xh, wh, dyh, 1, 1, 1, 1)
    assert rel_err(cp.asnumpy(y), conv_reference(xh, wh, None, 1, 1, 1, 1)) <= 1e-5
    assert rel_err(cp.asnumpy(dx), dx_ref) <= 1e-5
    assert rel_err(cp.asnumpy(dw), dw_ref) <= 1e-5


class _FakeCupy:
    """Enough of CuPy for _device_ms: events on one stream, each recorded at a time the test
    sets, and whether the device-side wait had ended when the host finished queueing."""

    def __init__(self, overruns):
        self.overruns = list(overruns)      # per try: did the wait end too early?
        self.clock = 0.0
        self.waits = []
        fake = self

        class Event:
            def __init__(self):
                self.t = None

            def record(self, stream=None):
                fake.clock += 1.0
                self.t = fake.clock

            @property
            def done(self):
                return fake.overruns.pop(0)

            def synchronize(self):
                pass

        class Stream:
            def synchronize(self):
                pass

        class cuda:
            pass

        cuda.Event = Event
        cuda.get_current_stream = staticmethod(lambda: Stream())
        cuda.get_elapsed_time = staticmethod(lambda a, b: b.t - a.t)
        self.cuda = cuda


def test_device_ms_times_again_behind_a_longer_wait_where_the_host_fell_behind(monkeypatch):
    from minicaffe.kernels import device_wait as dw
    cp = _FakeCupy([True, False])
    monkeypatch.setattr(dw, "device_wait", lambda cp_, seconds: cp.waits.append(seconds))
    calls = []
    runs = [lambda: calls.append("a"), lambda: calls.append("b")]
    times = B._device_ms(cp, runs, reps=2)
    assert len(cp.waits) == 2 and cp.waits[1] == pytest.approx(2 * cp.waits[0])
    assert cp.waits[0] == pytest.approx(2e-4 + 2 * 2 * B.HOST_US_PER_RUN * 1e-6)
    # one warm-up run each, then two timed runs each per try
    assert calls.count("a") == calls.count("b") == 1 + 2 * 2
    assert times == [0.5, 0.5]          # (end event - start event) / reps on the fake clock
    cp = _FakeCupy([True, True, True])
    B._device_ms(cp, runs, reps=1, tries=3)
    assert len(cp.waits) == 3 and cp.overruns == []


@pytest.mark.gpu
def test_a_first_call_inside_a_capture_stays_legacy(cp, cu, rng):
    """A search synchronizes, so a bound convolution first called while its stream captures
    a CUDA graph makes the legacy call there (captured, replayed right) and searches at its
    first eager call."""
    x_shape, w_shape = (4, 16, 12, 12), (32, 16, 3, 3)
    x, w = _gpu(cp, rng, x_shape, np.float32), _gpu(cp, rng, w_shape, np.float32)
    y = cp.zeros((4, 32, 12, 12), np.float32)
    conv = cu.BoundConv(x_shape, w_shape, 1, api="graph")
    # the legacy choice searched and the shared workspace grown eagerly, outside the capture
    cu.BoundConv(x_shape, w_shape, 1, api="legacy").forward(x, w, None, y)
    B.clear_search_log()
    in_capture = B.counts()["legacy_in_capture"]
    stream = cp.cuda.Stream(non_blocking=True)
    with stream:
        stream.begin_capture()
        conv.forward(x, w, None, y)
        graph = stream.end_capture()
        assert B.search_log() == [] and not conv._graph
        assert B.counts()["legacy_in_capture"] == in_capture + 1
        graph.launch(stream)
        stream.synchronize()
    xh, wh = cp.asnumpy(x), cp.asnumpy(w)
    assert rel_err(cp.asnumpy(y), conv_reference(xh, wh, None, 1, 1, 1, 1)) <= 1e-5
    conv.forward(x, w, None, y)
    assert len(B.search_log()) == 1 and (cu.FWD, False, -1) in conv._graph


def test_a_profile_names_the_api_it_was_measured_on(monkeypatch):
    from swap.profiler import cudnn_api_now
    monkeypatch.delenv(B.ENV_API, raising=False)
    assert cudnn_api_now() == "graph"
    monkeypatch.setenv(B.ENV_API, "legacy")
    assert cudnn_api_now() == "legacy"
