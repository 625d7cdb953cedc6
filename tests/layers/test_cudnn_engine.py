"""The CUDNN engine inside the layers (GPU): each CUDNN-engine layer on the GPU
computes what the CAFFE-engine layer computes on the CPU (float32, normwise
relative error <= 1e-5: top, bottom diff, and parameter diffs that accumulate
over two backward calls), declares what its backward reads and its scratch
(the convolution workspace), and falls back to the CAFFE engine, at setup, where
cuDNN cannot compute Caffe's numbers.  Last, ResNet-50 (batch 2, TRAIN): one
forward/backward under the CUDNN and the CAFFE engines agree within 1e-4."""
import os

import numpy as np
import pytest

import minicaffe.layers  # noqa: F401  (registers the layer types)
from minicaffe import engine
from minicaffe.blob import Blob
from minicaffe.cudnn import lib as cudnn_lib
from minicaffe.layer import BackwardReads
from minicaffe.rng import set_random_seed
from minicaffe.testing.gradient_check import make_blob, make_layer

pytestmark = pytest.mark.gpu

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
TOL = 1e-5
ENV = (engine.ENV_ENGINE, engine.ENV_DETERMINISTIC, engine.ENV_TF32, engine.ENV_FIND,
       "MINICAFFE_CUDNN_WORKSPACE_LIMIT")


@pytest.fixture(autouse=True)
def clean_engine_state(monkeypatch):
    for name in ENV:
        monkeypatch.delenv(name, raising=False)
    engine.set_default_engine(None)
    yield
    engine.set_default_engine(None)


@pytest.fixture
def cu(cp):
    """minicaffe.cudnn.ops, skipping where cuDNN does not load (tests/cudnn reports why)."""
    if not cudnn_lib.available():
        pytest.skip("cuDNN not loadable: " + cudnn_lib.load_report())
    from minicaffe.cudnn import ops
    ops.release_workspaces()
    return ops


def host(a):
    return a.get() if hasattr(a, "get") else np.asarray(a)


def rel_err(got, ref) -> float:
    """max |got - ref| / max |ref| (normwise, as tests/cudnn)."""
    got = np.asarray(host(got), dtype=np.float64)
    ref = np.asarray(host(ref), dtype=np.float64)
    if got.shape != ref.shape:
        return float("inf")
    if got.size == 0:
        return 0.0
    scale = max(float(np.abs(ref).max()), 1e-30)
    return float(np.abs(got - ref).max()) / scale


def build_pair(cp, text, inputs, n_top=1, in_place=False):
    """The layer of ``text`` ("@ENGINE@" replaced) as CAFFE on the CPU and CUDNN on the
    GPU, float32, set up on ``inputs``, with the GPU layer's params copied from the CPU
    layer's.  Returns [(layer, bottom, top) CPU, (layer, bottom, top) GPU]."""
    out = []
    for xp, eng in ((np, "CAFFE"), (cp, "CUDNN")):
        set_random_seed(5)
        layer = make_layer(text.replace("@ENGINE@", f"engine: {eng}"), xp=xp, dtype=np.float32)
        bottom = [make_blob(a, xp=xp, dtype=np.float32, name=f"in{i}")
                  for i, a in enumerate(inputs)]
        top = (list(bottom) if in_place else
               [Blob(xp=xp, dtype=np.float32, name=f"out{i}") for i in range(n_top)])
        layer.setup(bottom, top)
        out.append((layer, bottom, top))
    (c, _, _), (g, _, _) = out
    assert c.engine == engine.CAFFE
    for pc, pg in zip(c.blobs, g.blobs):
        pg.data[...] = cp.asarray(pc.data)
    return out


def check_pair(cp, pair, propagate, rng, set_top_diff=True, calls=2):
    """Forward both; set one top diff on both; backward ``calls`` times: tops, bottom
    diffs (overwritten) and param diffs (accumulated) agree within TOL each time."""
    (c, cb, ct), (g, gb, gt) = pair
    c.forward(cb, ct)
    g.forward(gb, gt)
    for i, (tc, tg) in enumerate(zip(ct, gt)):
        assert rel_err(tg.data, tc.data) <= TOL, f"top {i}: {rel_err(tg.data, tc.data)}"
    if set_top_diff:
        for tc, tg in zip(ct, gt):
            dy = rng.standard_normal(tc.shape).astype(np.float32)
            tc.diff[...] = dy
            tg.diff[...] = cp.asarray(dy)
    for layer in (c, g):
        for p in layer.blobs:
            p.diff[...] = 0
    first = None
    for call in range(calls):
        c.backward(ct, propagate, cb)
        g.backward(gt, propagate, gb)
        for i, p in enumerate(propagate):
            if p:
                e = rel_err(gb[i].diff, cb[i].diff)
                assert e <= TOL, f"call {call}: bottom {i} diff: {e}"
        for k, (pc, pg) in enumerate(zip(c.blobs, g.blobs)):
            e = rel_err(pg.diff, pc.diff)
            assert e <= TOL, f"call {call}: param {k} diff: {e}"
        if call == 0:
            first = [host(p.diff).copy() for p in g.blobs]
    if calls > 1:  # Caffe's rule: param diffs accumulate
        for k, (f, pg) in enumerate(zip(first, g.blobs)):
            assert rel_err(pg.diff, calls * f) <= TOL, f"param {k} did not accumulate"


# ================================================================= convolution
def conv_text(body):
    return ('name: "conv" type: "Convolution" convolution_param { ' + body +
            ' weight_filler { type: "gaussian" std: 0.5 } bias_filler { type: "gaussian" } '
            '@ENGINE@ }')


CONV_CASES = {  # name: (convolution_param body, bottom shape)
    "basic_3x3": ("num_output: 4 kernel_size: 3 pad: 1", (2, 3, 7, 6)),
    "stride2": ("num_output: 5 kernel_size: 3 pad: 1 stride: 2", (2, 3, 9, 8)),
    "rect": ("num_output: 3 kernel_h: 3 kernel_w: 2 pad_h: 1 pad_w: 0 stride_h: 2 stride_w: 1",
             (2, 2, 7, 5)),
    "rect_repeated": ("num_output: 2 kernel_size: 2 kernel_size: 3 pad: 0 pad: 1 stride: 1 "
                      "stride: 2", (1, 3, 6, 9)),
    "groups": ("num_output: 6 kernel_size: 3 pad: 1 group: 2", (2, 4, 6, 6)),
    "depthwise": ("num_output: 3 kernel_size: 3 group: 3 stride: 2", (2, 3, 8, 7)),
    "dilation": ("num_output: 3 kernel_size: 3 dilation: 2 pad: 2", (2, 2, 9, 8)),
    "dilation_rect": ("num_output: 2 kernel_size: 2 dilation: 3 dilation: 1 pad_h: 1 pad_w: 2",
                      (1, 2, 10, 6)),
    "groups_dilation_stride": ("num_output: 6 kernel_h: 2 kernel_w: 3 group: 3 dilation: 2 "
                               "stride_h: 1 stride_w: 2 pad_h: 2 pad_w: 1", (2, 6, 9, 8)),
    "no_bias": ("num_output: 3 kernel_size: 2 bias_term: false stride: 2", (2, 2, 6, 7)),
    "one_by_one": ("num_output: 4 kernel_size: 1", (2, 5, 4, 3)),
    "one_by_one_strided": ("num_output: 2 kernel_size: 1 stride: 2", (2, 3, 5, 4)),
    "wide": ("num_output: 32 kernel_size: 3 pad: 1", (4, 16, 12, 12)),
    "axis2": ("num_output: 4 kernel_size: 3 axis: 2", (2, 2, 3, 6, 5)),
}


@pytest.mark.parametrize("case", sorted(CONV_CASES))
def test_conv_cudnn_equals_caffe_on_cpu(cp, cu, case, rng):
    body, shape = CONV_CASES[case]
    pair = build_pair(cp, conv_text(body), [rng.standard_normal(shape)])
    g = pair[1][0]
    assert g.engine == engine.CUDNN, g.engine_fallback
    check_pair(cp, pair, [True], rng)


def test_conv_two_bottoms(cp, cu, rng):
    x = [rng.standard_normal((2, 3, 6, 5)) for _ in range(2)]
    pair = build_pair(cp, conv_text("num_output: 4 kernel_size: 3 pad: 1 stride: 2"), x,
                      n_top=2)
    assert pair[1][0].engine == engine.CUDNN
    check_pair(cp, pair, [True, True], rng)


def test_conv_reshaped_and_rebounded_agrees(cp, cu, rng, monkeypatch):
    """The layer's bound cuDNN call follows a reshape to another minibatch and a new
    workspace limit (set_workspace_limit), and still computes what CAFFE computes."""
    text = conv_text("num_output: 4 kernel_size: 3 pad: 1 stride: 2")
    pair = build_pair(cp, text, [rng.standard_normal((2, 3, 9, 8))])
    check_pair(cp, pair, [True], rng)
    (c, cb, ct), (g, gb, gt) = pair
    first = g._bound[2]
    x = rng.standard_normal((5, 3, 9, 8))
    for layer, bottom, top, xp in ((c, cb, ct, np), (g, gb, gt, cp)):
        bottom[0].reshape(x.shape)
        bottom[0].data[...] = xp.asarray(x, dtype=np.float32)
        layer.reshape(bottom, top)
    check_pair(cp, pair, [True], rng)
    (a, b, conv), = g._bound[2]          # one call: the whole minibatch
    assert conv is not first[0][2] and (a, b) == (0, 5) and conv.geom.x_shape == (5, 3, 9, 8)
    g.set_workspace_limit(0)            # the options change: bound again, with limit 0
    check_pair(cp, pair, [True], rng)
    assert g._bound[2][0][2] is not conv and g._bound[2][0][2].limit == 0


@pytest.mark.parametrize("chunks", [True, False])
def test_conv_past_the_cap_of_a_bound_per_image_runs_in_chunks(cp, cu, rng, monkeypatch, chunks):
    """Under a bound per image whose cap the minibatch passes (16 MiB per image, at most 64
    MiB: 4 images), the layer runs cuDNN on chunks of at most 4 images (4, 3, 3 of 10), each
    under the cap, in one workspace of the largest need; the weight and bias
    diffs accumulate over the chunks (two backward calls too), and it all computes what
    CAFFE computes.  $MINICAFFE_CUDNN_CHUNKS=0: one call, as before."""
    if not chunks:
        monkeypatch.setenv("MINICAFFE_CUDNN_CHUNKS", "0")
    text = conv_text("num_output: 8 kernel_size: 3 pad: 1 stride: 2")
    x = rng.standard_normal((10, 3, 17, 15))
    pair = build_pair(cp, text, [x])
    (c, cb, ct), (g, gb, gt) = pair
    assert g._cudnn.chunks is chunks
    g.set_workspace_limit(64 << 20, 16 << 20)
    g.reshape(gb, gt)
    check_pair(cp, pair, [True], rng, calls=2)
    calls = g._bound[2]
    if chunks:
        assert [(a, b) for a, b, _ in calls] == [(0, 4), (4, 7), (7, 10)]
        assert calls[1][2] is calls[2][2]                  # one bound call per size
        assert [conv.limit for _, _, conv in calls] == [64 << 20] * 3
        sizes = {4, 3}
    else:
        assert [(a, b) for a, b, _ in calls] == [(0, 10)]
        sizes = {10}
    need = max(max(cu.conv_workspace_bytes(
        (n, 3, 17, 15), g.blobs[0].shape, g.pad, g.stride, g.dilation, g.group, np.float32,
        find=g._cudnn.find, workspace_limit=64 << 20).values()) for n in sizes)
    assert g.internals["workspace"].blob.count == need
    assert g.workspace_model()(10) == need
    # the layer's calls as its reshape searched them: one per chunk, of the workspace above
    choices = g.call_choices()
    assert [n for n, _ in choices] == [b - a for a, b, _ in calls]
    assert max(c.workspace for _, ch in choices for c in ch.values()) == need
    assert [n for n, _ in g.call_choices(7)] == ([4, 3] if chunks else [7])


def test_conv_fits_its_fastest_algorithms_in_chunks(cp, cu, rng):
    """Under a bound per image far below what the layer's fastest algorithms need (1 byte,
    at most 64 MiB), the layer takes the bytes per image of its fastest algorithms as timed
    on 16 images within the cap, runs past cap / that in chunks (if it needs any workspace
    at all), each call searched within its own chunk's bytes, and computes what CAFFE
    computes; the memory model's workspace at 40 images is the layer's own."""
    text = conv_text("num_output: 16 kernel_size: 3 pad: 1")
    x = rng.standard_normal((40, 16, 32, 32))
    pair = build_pair(cp, text, [x])
    (c, cb, ct), (g, gb, gt) = pair
    assert g._cudnn.fit_fastest
    g.set_workspace_limit(64 << 20, 1)
    g.reshape(gb, gt)
    cands = cu.conv_candidates((16, 16, 32, 32), g.blobs[0].shape, g.pad, g.stride,
                               g.dilation, g.group, np.float32, workspace_limit=64 << 20)
    assert all(cands[d] for d in cands)                  # every direction has a candidate
    per = max(1, cu.fastest_bytes_per_image(cands, 16))
    assert g._bytes_per_image() == per
    chunks = cu.workspace_chunks(40, 64 << 20, per, 16 if per > 1 else 1)
    check_pair(cp, pair, [True], rng, calls=2)
    calls = g._bound[2]
    assert [(a, b) for a, b, _ in calls] == list(chunks)
    # a chunk rounded up to whole probes (16 images) has the probe's need within the cap
    assert all(-(-(b - a) // 16) * 16 * per <= 64 << 20 for a, b in chunks)
    # each chunk of a chunked minibatch may use the cap (minicaffe.layers.conv._call_limit)
    assert [conv.limit for _, _, conv in calls] == (
        [64 << 20] * len(chunks) if len(chunks) > 1 else
        [cu.workspace_limit_at(64 << 20, per, 40)])
    assert g.workspace_model()(40) == g.internals["workspace"].blob.count


def test_conv_without_bottom_gradient(cp, cu, rng):
    """The first convolution of a net: weight and bias diffs only."""
    pair = build_pair(cp, conv_text("num_output: 4 kernel_size: 3"),
                      [rng.standard_normal((2, 3, 6, 6))])
    (_, _, _), (g, gb, _) = pair
    assert g.engine == engine.CUDNN
    gb[0].diff[...] = 7.0
    check_pair(cp, pair, [False], rng)
    assert float(gb[0].diff.min()) == float(gb[0].diff.max()) == 7.0  # not written


def test_conv_workspace_is_declared_scratch_and_is_the_only_one(cp, cu, rng):
    body, shape = CONV_CASES["wide"]
    pair = build_pair(cp, conv_text(body), [rng.standard_normal(shape)])
    g = pair[1][0]
    assert g.engine == engine.CUDNN
    assert "col" not in g.internals and "top_diff_t" not in g.internals
    it = g.internals["workspace"]
    assert not it.saved and not it.batch_scaled and it.blob.dtype == np.uint8
    need = cu.conv_workspace_bytes(shape, g.blobs[0].shape, g.pad, g.stride, g.dilation,
                                   g.group, np.float32, find=g._cudnn.find,
                                   workspace_limit=g._cudnn.workspace_limit)
    assert it.blob.count == max(need.values()) <= cu.workspace_limit()
    assert g.backward_reads() == BackwardReads(bottom=(0,), top=(), internals=())
    g.param_propagate_down = [False, True]
    assert g.backward_reads() == BackwardReads(bottom=(), top=(), internals=())
    g.param_propagate_down = [True, True]
    check_pair(cp, pair, [True], rng)
    # no memory manager bound the internal: the calls shared the device's one buffer, of
    # the largest need, and the layer's own internal was never allocated
    assert not it.blob.has_data
    if max(need.values()):
        assert len(cu._workspaces) == 1
        assert next(iter(cu._workspaces.values())).nbytes >= max(need.values())
    # bound to an outside buffer (as the swap arena does), the calls use that one
    cu.release_workspaces()
    it.blob.bind_data(cp.empty(max(it.blob.count, 1), dtype=np.uint8))
    check_pair(cp, pair, [True], rng)
    assert not cu._workspaces
    # steady state: a further iteration allocates nothing through CuPy
    (_, _, _), (g, gb, gt) = pair
    pool = cp.get_default_memory_pool()
    cp.cuda.Device().synchronize()
    used = pool.used_bytes()
    g.forward(gb, gt)
    g.backward(gt, [True], gb)
    cp.cuda.Device().synchronize()
    assert pool.used_bytes() == used


def test_conv_zero_workspace_limit(cp, cu, rng, monkeypatch):
    monkeypatch.setenv("MINICAFFE_CUDNN_WORKSPACE_LIMIT", "0")
    body, shape = CONV_CASES["groups_dilation_stride"]
    pair = build_pair(cp, conv_text(body), [rng.standard_normal(shape)])
    g = pair[1][0]
    assert g.engine == engine.CUDNN, g.engine_fallback
    assert g.internals["workspace"].blob.count == 0
    check_pair(cp, pair, [True], rng)
    assert not cu._workspaces


def test_conv_deterministic_option(cp, cu, rng, monkeypatch):
    monkeypatch.setenv(engine.ENV_DETERMINISTIC, "1")
    body, shape = CONV_CASES["wide"]
    x = rng.standard_normal(shape)
    dy = rng.standard_normal((4, 32, 12, 12)).astype(np.float32)
    runs = []
    for _ in range(2):
        (_, _, _), (g, gb, gt) = build_pair(cp, conv_text(body), [x])
        assert g.engine == engine.CUDNN and g._cudnn.deterministic
        g.forward(gb, gt)
        gt[0].diff[...] = cp.asarray(dy)
        g.backward(gt, [True], gb)
        runs.append([host(a) for a in (gt[0].data, gb[0].diff, g.blobs[0].diff, g.blobs[1].diff)])
    for a, b in zip(*runs):
        np.testing.assert_array_equal(a, b)


def test_conv_explicit_caffe_on_gpu_keeps_its_col_buffer(cp, cu, rng):
    layer = make_layer(conv_text("num_output: 4 kernel_size: 3").replace("@ENGINE@",
                                                                         "engine: CAFFE"),
                       xp=cp, dtype=np.float32)
    layer.setup([make_blob(rng.standard_normal((2, 3, 6, 6)), xp=cp, dtype=np.float32)],
                [Blob(xp=cp, dtype=np.float32)])
    assert layer.engine == engine.CAFFE and "col" in layer.internals
    assert "workspace" not in layer.internals


def test_default_on_gpu_is_cudnn_and_set_default_engine_overrides(cp, cu, rng):
    text = conv_text("num_output: 2 kernel_size: 3").replace("@ENGINE@", "")
    x = rng.standard_normal((1, 2, 5, 5))

    def build():
        layer = make_layer(text, xp=cp, dtype=np.float32)
        layer.setup([make_blob(x, xp=cp, dtype=np.float32)], [Blob(xp=cp, dtype=np.float32)])
        return layer
    assert build().engine == engine.CUDNN
    engine.set_default_engine("CAFFE")
    assert build().engine == engine.CAFFE


# ===================================================================== pooling
POOL_CASES = {  # name: (pooling_param body, bottom shape)
    "k3s2": ("kernel_size: 3 stride: 2", (2, 3, 7, 7)),
    "k3s2_ceil": ("kernel_size: 3 stride: 2", (2, 2, 8, 6)),
    "k3s2_ceil_resnet": ("kernel_size: 3 stride: 2", (1, 2, 12, 12)),
    "k3s2p1": ("kernel_size: 3 stride: 2 pad: 1", (2, 2, 8, 7)),
    "k2s2p1_clip": ("kernel_size: 2 stride: 2 pad: 1", (1, 2, 3, 5)),
    "rect": ("kernel_h: 3 kernel_w: 2 stride_h: 2 stride_w: 1 pad_h: 1 pad_w: 0", (2, 2, 7, 6)),
    "overlap_s1_p1": ("kernel_size: 3 stride: 1 pad: 1", (1, 2, 5, 4)),
    "k2s2": ("kernel_size: 2 stride: 2", (2, 4, 8, 8)),
    "global": ("global_pooling: true", (2, 3, 5, 4)),
    "empty_window": ("kernel_size: 1 stride: 3", (1, 2, 5, 5)),
}


def pool_input(rng, shape):
    """Distinct values (no ties: cuDNN and Caffe may route a tie's gradient differently)."""
    return (rng.permutation(int(np.prod(shape))).reshape(shape) - 20) * 0.01


@pytest.mark.parametrize("method", ["MAX", "AVE"])
@pytest.mark.parametrize("case", sorted(POOL_CASES))
def test_pool_cudnn_equals_caffe_on_cpu(cp, cu, case, method, rng):
    """Where cuDNN reproduces Caffe (pool2d_supported) the layer runs CUDNN, elsewhere it
    has fallen back to CAFFE at setup; the numbers are Caffe's either way."""
    body, shape = POOL_CASES[case]
    pair = build_pair(cp, f'name: "pool" type: "Pooling" pooling_param {{ pool: {method} '
                          f'{body} @ENGINE@ }}', [pool_input(rng, shape)])
    g = pair[1][0]
    ok, why = cu.pool2d_supported(g.in_hw, g.out_hw, method, g.kernel, g.stride, g.pad)
    if ok:
        assert g.engine == engine.CUDNN, g.engine_fallback
        assert "mask" not in g.internals
        want = BackwardReads(bottom=(0,), top=(0,)) if method == "MAX" else BackwardReads()
        assert g.backward_reads() == want
    else:
        assert g.engine == engine.CAFFE and why in g.engine_fallback
        assert ("mask" in g.internals) == (method == "MAX")
    if case == "empty_window":
        assert not ok  # Caffe's -FLT_MAX / 0 windows: cuDNN cannot
    check_pair(cp, pair, [True], rng)


def test_pool_mask_top_and_stochastic_run_caffe(cp, cu, rng):
    x = pool_input(rng, (2, 2, 6, 6))
    pair = build_pair(cp, 'name: "pool" type: "Pooling" pooling_param { pool: MAX '
                          'kernel_size: 2 stride: 2 @ENGINE@ }', [x], n_top=2)
    g = pair[1][0]
    assert g.engine == engine.CAFFE and "mask" in g.engine_fallback
    assert g.backward_reads() == BackwardReads(top=(1,))
    check_pair(cp, pair, [True], rng)
    sto = make_layer('name: "s" type: "Pooling" pooling_param { pool: STOCHASTIC '
                     'kernel_size: 2 stride: 2 engine: CUDNN }', xp=cp, dtype=np.float32)
    sto.setup([make_blob(np.abs(x), xp=cp, dtype=np.float32)], [Blob(xp=cp, dtype=np.float32)])
    assert sto.engine == engine.CAFFE and "STOCHASTIC" in sto.engine_fallback


# ========================================================================= LRN
@pytest.mark.parametrize("size,alpha,beta,k", [(5, 1e-4, 0.75, 2.0), (3, 0.5, 0.75, 2.0),
                                               (1, 2.0, 0.5, 1.0), (7, 1.5, 1.25, 0.5),
                                               (5, 3.0, 0.75, 1.0)])
def test_lrn_cudnn_equals_caffe_on_cpu(cp, cu, size, alpha, beta, k, rng):
    x = rng.standard_normal((2, 9, 5, 4)) * 2
    pair = build_pair(cp, f'name: "norm" type: "LRN" lrn_param {{ local_size: {size} '
                          f'alpha: {alpha} beta: {beta} k: {k} @ENGINE@ }}', [x])
    g = pair[1][0]
    assert g.engine == engine.CUDNN, g.engine_fallback
    assert "scale" not in g.internals
    assert g.backward_reads() == BackwardReads(bottom=(0,), top=(0,), internals=())
    check_pair(cp, pair, [True], rng)


@pytest.mark.parametrize("body,reason", [
    ("local_size: 17", "local_size 17"),
    ("local_size: 3 norm_region: WITHIN_CHANNEL", "ACROSS_CHANNELS only"),
    ("local_size: 3 beta: 0.001", "beta"),
])
def test_lrn_falls_back_where_cudnn_cannot(cp, cu, body, reason, rng):
    x = rng.standard_normal((2, 20, 5, 4))
    pair = build_pair(cp, f'name: "norm" type: "LRN" lrn_param {{ {body} @ENGINE@ }}', [x])
    g = pair[1][0]
    assert g.engine == engine.CAFFE and reason in g.engine_fallback
    assert "scale" in g.internals and g.internals["scale"].saved
    check_pair(cp, pair, [True], rng)


# ===================================================================== softmax
@pytest.mark.parametrize("shape,axis", [((4, 10), 1), ((2, 5, 3, 4), 1), ((2, 3, 6, 2), 2),
                                        ((3, 7), -1), ((64, 1000), 1), ((2, 3, 4), 0)])
def test_softmax_cudnn_equals_caffe_on_cpu(cp, cu, shape, axis, rng):
    x = rng.standard_normal(shape) * 4
    pair = build_pair(cp, f'name: "prob" type: "Softmax" softmax_param {{ axis: {axis} '
                          '@ENGINE@ }', [x])
    g = pair[1][0]
    assert g.engine == engine.CUDNN, g.engine_fallback
    assert g.backward_reads() == BackwardReads(bottom=(), top=(0,), internals=())
    check_pair(cp, pair, [True], rng)


def test_softmax_in_place(cp, cu, rng):
    x = rng.standard_normal((3, 6, 2, 2)) * 3
    pair = build_pair(cp, 'name: "prob" type: "Softmax" softmax_param { @ENGINE@ }', [x],
                      in_place=True)
    assert pair[1][0].engine == engine.CUDNN
    check_pair(cp, pair, [True], rng, calls=1)  # backward overwrites the shared diff


@pytest.mark.parametrize("shape,loss_param,n_top", [
    ((8, 10), "", 1),
    ((2, 5, 3, 4), "", 2),
    ((2, 5, 3, 4), "loss_param { ignore_label: 1 normalization: VALID }", 1),
    ((4, 7), "loss_param { normalization: BATCH_SIZE }", 2),
])
def test_softmax_with_loss_cudnn_equals_caffe_on_cpu(cp, cu, shape, loss_param, n_top, rng):
    x = rng.standard_normal(shape) * 3
    label_shape = (shape[0],) + shape[2:]
    labels = rng.integers(0, shape[1], label_shape).astype(np.float32)
    weights = "loss_weight: 1 loss_weight: 0" if n_top == 2 else ""  # one per top, or none
    pair = build_pair(cp, f'name: "loss" type: "SoftmaxWithLoss" {weights} {loss_param} '
                          'softmax_param { @ENGINE@ }', [x, labels], n_top=n_top)
    g = pair[1][0]
    assert g.engine == engine.CUDNN, g.engine_fallback
    assert g.internals["prob"].saved
    assert g.backward_reads() == BackwardReads(bottom=(1,), top=(), internals=("prob",))
    # the loss weight (1) is the top diff that setup wrote; the prob top gets none
    check_pair(cp, pair, [True, False], rng, set_top_diff=False)


# ============================================================ ResNet-50, batch 2
def resnet50_batch2():
    """prototxt/resnet50/dummy.prototxt at batch 2, its DummyData rewritten as an Input
    layer fed below (DummyData's constant label would make the loss trivial)."""
    from minicaffe.proto import caffe_pb2, read_net_param
    src = read_net_param(os.path.join(REPO, "prototxt", "resnet50", "dummy.prototxt"))
    out = caffe_pb2.NetParameter()
    out.CopyFrom(src)
    del out.layer[:]
    for layer in src.layer:
        if layer.type == "DummyData":
            new = out.layer.add(name=layer.name, type="Input")
            new.top.extend(layer.top)
            for shape in layer.dummy_data_param.shape:
                s = new.input_param.shape.add()
                s.CopyFrom(shape)
                s.dim[0] = 2
            continue
        out.layer.add().CopyFrom(layer)
    return out


def _report(record):
    path = os.environ.get("MINICAFFE_GPU_REPORT")
    if path:
        import json
        with open(path, "a") as f:
            f.write(json.dumps(record) + "\n")


@pytest.mark.slow
def test_resnet50_cudnn_and_caffe_engines_agree(cp, cu):
    """One TRAIN forward/backward of ResNet-50 at batch 2 with the same weights and data
    under the CUDNN and the CAFFE engines (GPU, float32), and in float64 on the CPU.

    The loss agrees within 1e-4.  Parameter diffs: at batch 2 the gradient below
    the last BatchNorm is ill-conditioned (global average pooling makes each
    channel's top diff constant per image, and the batch-statistics BatchNorm
    backward then cancels it almost exactly), so float32 rounding is amplified to
    percent level: measured on the CPU, the CAFFE engine in float32 against
    float64 differs by up to 0.20 (normwise, res4c_branch2b) and by 2% over all
    diffs.  No two float32 implementations agree within 1e-4 there, so the diffs
    are held to 1e-4 where float32 can be (the CAFFE engine's own error against
    float64 below 1e-5), and everywhere to no more than 10 times the CAFFE
    engine's own float32 error against the float64 reference (3 times over all
    diffs).  MINICAFFE_GPU_REPORT=<file> appends the measured errors as JSON.
    """
    from minicaffe.net import TRAIN, Net
    param = resnet50_batch2()
    rng = np.random.default_rng(0)
    data = rng.standard_normal((2, 3, 224, 224)).astype(np.float32)
    label = np.array([3.0, 711.0], dtype=np.float32)
    nets = {}
    for name in ("CAFFE", "CUDNN"):
        engine.set_default_engine(name)
        try:
            set_random_seed(1)
            nets[name] = Net(param, TRAIN, mode="GPU")
        finally:
            engine.set_default_engine(None)
    set_random_seed(1)
    nets["f64"] = Net(param, TRAIN, mode="CPU", dtype=np.float64)
    ref, net = nets["CAFFE"], nets["CUDNN"]
    assert all(e == "CAFFE" for _, _, e, _ in engine.layer_engines(ref))
    used = engine.layer_engines(net)
    convs = [(n, e, why) for n, t, e, why in used if t == "Convolution"]
    assert len(convs) == 53 and all(e == "CUDNN" for _, e, _ in convs), convs
    fallbacks = {n: why for n, _, e, why in used if e != "CUDNN"}
    assert engine.in_place_hazards(net) == []
    # the same weights and data for all three
    for name in ("CUDNN", "f64"):
        for (_, blobs_r), (_, blobs_n) in zip(ref.params.items(), nets[name].params.items()):
            for br, bn in zip(blobs_r, blobs_n):
                bn.data[...] = bn.xp.asarray(host(br.data), dtype=bn.dtype)
    losses = {}
    for name, n in nets.items():
        n.blobs["data"].data[...] = n.xp.asarray(data, dtype=n.dtype)
        n.blobs["label"].data[...] = n.xp.asarray(label, dtype=n.dtype)
        n.clear_param_diffs()
        losses[name] = float(n.forward_backward())  # syncs
    assert np.isfinite(losses["CAFFE"])
    loss_err = abs(losses["CUDNN"] - losses["CAFFE"]) / abs(losses["CAFFE"])

    rows, sq = [], {"CAFFE": 0.0, "CUDNN": 0.0, "ref": 0.0}
    names = [n for n, blobs in ref.params.items() for _ in blobs]
    index = [i for _, blobs in ref.params.items() for i in range(len(blobs))]
    flat = {k: [host(b.diff) for blobs in nets[k].params.values() for b in blobs]
            for k in ("CAFFE", "CUDNN", "f64")}
    for lname, i, gc, gn, g64 in zip(names, index, flat["CAFFE"], flat["CUDNN"], flat["f64"]):
        if float(np.abs(g64).max(initial=0.0)) <= 1e-10:
            continue  # analytically zero: a bias before BatchNorm, BatchNorm's statistics
        rows.append((f"{lname}/{i}", rel_err(gn, gc), rel_err(gc, g64), rel_err(gn, g64)))
        sq["ref"] += float((g64 ** 2).sum())
        sq["CAFFE"] += float(((gc - g64) ** 2).sum())
        sq["CUDNN"] += float(((gn - g64) ** 2).sum())
    global_err = {k: (sq[k] / sq["ref"]) ** 0.5 for k in ("CAFFE", "CUDNN")}
    well = [r for r in rows if r[2] <= 1e-5]
    worst = sorted(rows, key=lambda r: -r[3] / max(1e-4, 10 * r[2]))
    _report({"test": "resnet50_b2_cudnn_vs_caffe", "losses": losses, "loss_err": loss_err,
             "global_err_vs_f64": global_err, "fallbacks": fallbacks,
             "worst (blob, cudnn_vs_caffe, caffe_vs_f64, cudnn_vs_f64)": worst[:10],
             "well_conditioned": well})
    assert loss_err <= 1e-4, (losses, fallbacks)
    assert any(r[0].startswith("fc1000/") for r in well), (rows[-4:], global_err)
    assert all(r[1] <= 1e-4 for r in well), well
    assert all(r[3] <= max(1e-4, 10 * r[2]) for r in rows), (worst[:8], global_err)
    assert global_err["CUDNN"] <= max(1e-4, 3 * global_err["CAFFE"]), global_err
