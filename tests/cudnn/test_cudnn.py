"""The cuDNN binding: library discovery and its error (CPU), the NumPy references
checked against the CAFFE engine layers (CPU), then every op against those
references on the GPU (float32 with TF32 off within 1e-5 relative error, float64
within 1e-12), Caffe's accumulation rule, the algorithm cache, the workspace
limit, determinism, stream binding and the pooling ceil-rounding probe."""
import numpy as np
import pytest

import minicaffe.layers  # noqa: F401  (registers the layer types)
from minicaffe.blob import Blob
from minicaffe.cudnn import lib as cudnn_lib
from minicaffe.cudnn import ops
from minicaffe.layers.pooling import pooled_size
from minicaffe.testing.gradient_check import make_blob, make_layer


# ============================================================ NumPy references
def pair(v):
    return (v, v) if isinstance(v, int) else tuple(v)


def _windows(xpad, i, j, dil, stride, out_hw):
    """x_pad[:, :, i*dh + sh*oh, j*dw + sw*ow] for all outputs (N, C, OH, OW)."""
    (dh, dw), (sh, sw), (oh, ow) = dil, stride, out_hw
    return xpad[:, :, i * dh: i * dh + sh * (oh - 1) + 1: sh,
                j * dw: j * dw + sw * (ow - 1) + 1: sw]


def conv_out_hw(x_shape, w_shape, pad, stride, dil):
    (ph, pw), (sh, sw), (dh, dw) = pair(pad), pair(stride), pair(dil)
    _, _, h, w = x_shape
    _, _, kh, kw = w_shape
    return ((h + 2 * ph - (dh * (kh - 1) + 1)) // sh + 1,
            (w + 2 * pw - (dw * (kw - 1) + 1)) // sw + 1)


def conv_reference(x, w, b, pad, stride, dil, groups):
    """Grouped, dilated, strided cross-correlation in float64, one kernel tap at a time."""
    x, w = x.astype(np.float64), w.astype(np.float64)
    (ph, pw), stride, dil = pair(pad), pair(stride), pair(dil)
    n, c, _, _ = x.shape
    m, cg, kh, kw = w.shape
    mg = m // groups
    oh, ow = conv_out_hw(x.shape, w.shape, pad, stride, dil)
    xpad = np.pad(x, ((0, 0), (0, 0), (ph, ph), (pw, pw)))
    y = np.zeros((n, m, oh, ow))
    for g in range(groups):
        xs = xpad[:, g * cg:(g + 1) * cg]
        for i in range(kh):
            for j in range(kw):
                y[:, g * mg:(g + 1) * mg] += np.einsum(
                    "nchw,kc->nkhw", _windows(xs, i, j, dil, stride, (oh, ow)),
                    w[g * mg:(g + 1) * mg, :, i, j])
    if b is not None:
        y += b.astype(np.float64).reshape(1, m, 1, 1)
    return y


def conv_backward_reference(x, w, dy, pad, stride, dil, groups):
    """(dx, dw, db) of conv_reference for the top diff dy, in float64."""
    x, w, dy = x.astype(np.float64), w.astype(np.float64), dy.astype(np.float64)
    (ph, pw), stride, dil = pair(pad), pair(stride), pair(dil)
    n, c, h, wd = x.shape
    m, cg, kh, kw = w.shape
    mg = m // groups
    oh, ow = dy.shape[2:]
    xpad = np.pad(x, ((0, 0), (0, 0), (ph, ph), (pw, pw)))
    dxpad = np.zeros_like(xpad)
    dw = np.zeros_like(w)
    for g in range(groups):
        cs, ms = slice(g * cg, (g + 1) * cg), slice(g * mg, (g + 1) * mg)
        for i in range(kh):
            for j in range(kw):
                win = _windows(xpad[:, cs], i, j, dil, stride, (oh, ow))
                dw[ms, :, i, j] = np.einsum("nkhw,nchw->kc", dy[:, ms], win)
                _windows(dxpad[:, cs], i, j, dil, stride, (oh, ow))[...] += np.einsum(
                    "nkhw,kc->nchw", dy[:, ms], w[ms, :, i, j])
    dx = dxpad[:, :, ph:ph + h, pw:pw + wd]
    return dx, dw, dy.sum(axis=(0, 2, 3))


def softmax_reference(x, axis):
    x = x.astype(np.float64)
    e = np.exp(x - x.max(axis=axis, keepdims=True))
    return e / e.sum(axis=axis, keepdims=True)


def layer_reference(text, x, rng):
    """Forward and backward of a CAFFE-engine layer on NumPy in float64: (top, bottom diff)."""
    layer = make_layer(text)
    bottom = [make_blob(x.astype(np.float64), name="in")]
    top = [Blob(dtype=np.float64, name="out")]
    layer.setup(bottom, top)
    layer.forward(bottom, top)
    dy = rng.standard_normal(top[0].shape)
    top[0].diff[...] = dy
    layer.backward(top, [True], bottom)
    return layer, top[0].data.copy(), dy, bottom[0].diff.copy()


def rel_err(got, ref) -> float:
    """max |got - ref| / max |ref| (the normwise relative error the brief bounds)."""
    got = np.asarray(got, dtype=np.float64)
    ref = np.asarray(ref, dtype=np.float64)
    scale = max(float(np.abs(ref).max()), 1e-30)
    return float(np.abs(got - ref).max()) / scale


TOL = {np.float32: 1e-5, np.float64: 1e-12}

# (x shape, w shape, pad, stride, dilation, groups); kernels rectangular where useful
CONV_CASES = {
    "basic_3x3": ((2, 3, 7, 6), (4, 3, 3, 3), 1, 1, 1, 1),
    "stride2": ((2, 3, 9, 8), (5, 3, 3, 3), 1, 2, 1, 1),
    "rect_kernel": ((2, 2, 7, 5), (3, 2, 3, 2), (1, 0), (2, 1), 1, 1),
    "rect_pad_stride": ((1, 3, 6, 9), (2, 3, 2, 3), (0, 1), (1, 2), 1, 1),
    "dilation": ((2, 2, 9, 8), (3, 2, 3, 3), 2, 1, 2, 1),
    "dilation_rect": ((1, 2, 10, 6), (2, 2, 2, 2), (1, 2), 1, (3, 1), 1),
    "groups": ((2, 4, 6, 6), (6, 2, 3, 3), 1, 1, 1, 2),
    "depthwise": ((2, 3, 8, 7), (3, 1, 3, 3), 0, 2, 1, 3),
    "groups_dilation_stride": ((2, 6, 9, 8), (6, 2, 2, 3), (2, 1), (1, 2), 2, 3),
    "one_by_one": ((2, 5, 4, 3), (4, 5, 1, 1), 0, 1, 1, 1),
    "one_by_one_strided": ((2, 3, 5, 4), (2, 3, 1, 1), 0, 2, 1, 1),
    "big_pad": ((1, 2, 4, 4), (3, 2, 3, 3), 3, 1, 1, 1),
    "wide": ((4, 16, 12, 12), (32, 16, 3, 3), 1, 1, 1, 1),
}


# =================================================================== CPU: loading
def test_candidates_explicit_path_is_the_only_one(tmp_path):
    f = tmp_path / "libcudnn.so.9"
    assert cudnn_lib.candidates({cudnn_lib.ENV_PATH: str(f)}) == [(cudnn_lib.ENV_PATH, str(f))]
    got = cudnn_lib.candidates({cudnn_lib.ENV_PATH: str(tmp_path)})
    assert got == [(f"{cudnn_lib.ENV_PATH} folder", str(f))]


def test_candidates_find_the_wheel_on_sys_path(tmp_path, monkeypatch):
    libdir = tmp_path / "site-packages" / "nvidia" / "cudnn" / "lib"
    libdir.mkdir(parents=True)
    (libdir / "libcudnn.so.9").write_bytes(b"")
    monkeypatch.syspath_prepend(str(tmp_path / "site-packages"))
    got = cudnn_lib.candidates({})
    wheel = [t for w, t in got if w.startswith("nvidia-cudnn wheel")]
    assert str(libdir / "libcudnn.so.9") in wheel
    # a copy already in the process first, the system loader last
    assert got[0][0] == "already loaded in this process"
    assert got[-1] == ("system loader", "libcudnn.so.9")


def test_missing_library_is_a_clear_error(tmp_path, monkeypatch):
    empty = tmp_path / "no_cudnn_here"
    empty.mkdir()
    monkeypatch.setenv(cudnn_lib.ENV_PATH, str(empty))
    assert cudnn_lib.available() is False
    with pytest.raises(cudnn_lib.CudnnNotFound) as e:
        cudnn_lib.version()
    text = str(e.value)
    assert str(empty / "libcudnn.so.9") in text
    assert "pip install 'minicaffe[cudnn]'" in text
    assert "MINICAFFE_CUDNN_PATH" in text


def test_broken_library_file_is_a_clear_error(tmp_path, monkeypatch):
    fake = tmp_path / "libcudnn.so.9"
    fake.write_bytes(b"not an ELF file")
    monkeypatch.setenv(cudnn_lib.ENV_PATH, str(fake))
    assert cudnn_lib.available() is False
    with pytest.raises(cudnn_lib.CudnnNotFound, match="libcudnn.so.9"):
        cudnn_lib.load()


def test_cudnn_error_names_function_and_status():
    e = cudnn_lib.CudnnError("cudnnPoolingForward", 2000, "dims")
    assert "cudnnPoolingForward" in str(e) and "CUDNN_STATUS_BAD_PARAM" in str(e)
    assert e.category == 2000 and not e.not_supported
    assert cudnn_lib.CudnnError("f", 3002).not_supported
    assert cudnn_lib.version_string(91900) == "9.19.0"


def test_perf_struct_layout():
    """cudnnConvolution*AlgoPerf_t: algo, status, time, (pad), memory, determinism,
    mathType, reserved[3]: 48 bytes with size_t at offset 16 on x86-64."""
    import ctypes
    for s in (cudnn_lib.ConvolutionFwdAlgoPerf, cudnn_lib.ConvolutionBwdDataAlgoPerf,
              cudnn_lib.ConvolutionBwdFilterAlgoPerf):
        assert ctypes.sizeof(s) == 48
        assert s.memory.offset == 16 and s.determinism.offset == 24 and s.mathType.offset == 28


def test_workspace_limit_setting(monkeypatch):
    monkeypatch.delenv(ops.ENV_WORKSPACE_LIMIT, raising=False)
    assert ops.workspace_limit() == 4 << 30
    for text, value in (("0", 0), ("1048576", 1 << 20), ("64M", 64 << 20), ("64MiB", 64 << 20),
                        ("1g", 1 << 30), ("512k", 512 << 10)):
        monkeypatch.setenv(ops.ENV_WORKSPACE_LIMIT, text)
        assert ops.workspace_limit() == value
    assert ops.workspace_limit(123) == 123
    monkeypatch.setenv(ops.ENV_WORKSPACE_LIMIT, "lots")
    with pytest.raises(ValueError, match=ops.ENV_WORKSPACE_LIMIT):
        ops.workspace_limit()
    with pytest.raises(ValueError):
        ops.workspace_limit(-1)


def test_conv_geometry_checks():
    g = ops.conv_geometry((2, 6, 9, 8), (6, 2, 2, 3), (2, 1), (1, 2), 2, 3)
    assert g.y_shape == (2, 6) + conv_out_hw((2, 6, 9, 8), (6, 2, 2, 3), (2, 1), (1, 2), 2)
    with pytest.raises(ValueError, match="channels"):
        ops.conv_geometry((2, 5, 9, 8), (6, 2, 3, 3), groups=3)
    with pytest.raises(ValueError, match="multiple of groups"):
        ops.conv_geometry((2, 6, 9, 8), (4, 2, 3, 3), groups=3)
    with pytest.raises(ValueError, match="does not fit"):
        ops.conv_geometry((1, 1, 2, 2), (1, 1, 3, 3))


def test_lrn_parameter_limits():
    assert ops.lrn_supported(5, 1e-4, 0.75, 2.0) == (True, "")
    assert not ops.lrn_supported(17, 1e-4, 0.75, 2.0)[0]   # cuDNN: n <= 16
    assert not ops.lrn_supported(4, 1e-4, 0.75, 2.0)[0]    # Caffe: odd sizes
    assert not ops.lrn_supported(5, 1e-4, 0.005, 2.0)[0]   # cuDNN: beta >= 0.01
    assert not ops.lrn_supported(5, 1e-4, 0.75, 0.0)[0]    # cuDNN: k >= 1e-5


def test_pool_geometry_rules():
    # Caffe's size (ceil, clipped) is what the ops are told
    for size in range(1, 12):
        for k in range(1, 5):
            for s in range(1, 4):
                for p in range(0, k):
                    assert ops.caffe_pooled_size(size, k, p, s) == pooled_size(size, k, p, s)
    # floor size == Caffe's size: no probe needed
    assert not ops.pool2d_needs_probe((7, 7), (3, 3), 3, 2, 0)
    # 8x6, k3 s2: Caffe 4x3 (ceil) vs cuDNN's floor 3x2
    assert ops.pool2d_needs_probe((8, 6), (4, 3), 3, 2, 0)
    assert ops.pool2d_geometry_issue((8, 6), (4, 3), "AVE", 3, 2, 0) is None
    # stride > kernel without pad: Caffe's last window covers no pixel
    why = ops.pool2d_geometry_issue((5, 5), (3, 3), "MAX", 1, 3, 0)
    assert "past the" in why
    assert "pad 3 >= kernel 3" in ops.pool2d_geometry_issue((9, 9), (5, 5), "MAX", 3, 2, 3)
    with pytest.raises(ValueError, match="STOCHASTIC"):
        ops.pool2d_geometry_issue((4, 4), (2, 2), 2, 2, 2, 0)


POOL_CASES = {
    # name: (pooling_param body, kernel, stride, pad, input shape)
    "k3s2": ("kernel_size: 3 stride: 2", 3, 2, 0, (2, 3, 7, 7)),
    "k3s2_ceil": ("kernel_size: 3 stride: 2", 3, 2, 0, (2, 2, 8, 6)),
    "k3s2p1": ("kernel_size: 3 stride: 2 pad: 1", 3, 2, 1, (2, 2, 8, 7)),
    "k2s2p1_clip": ("kernel_size: 2 stride: 2 pad: 1", 2, 2, 1, (1, 2, 3, 5)),
    "rect": ("kernel_h: 3 kernel_w: 2 stride_h: 2 stride_w: 1 pad_h: 1 pad_w: 0",
             (3, 2), (2, 1), (1, 0), (2, 2, 7, 6)),
    "overlap_s1": ("kernel_size: 3 stride: 1 pad: 1", 3, 1, 1, (1, 2, 5, 4)),
    "k2s2": ("kernel_size: 2 stride: 2", 2, 2, 0, (2, 4, 8, 8)),
    "global_like": ("kernel_size: 5 stride: 1", 5, 1, 0, (2, 3, 5, 5)),
}


@pytest.mark.parametrize("method", ["MAX", "AVE"])
@pytest.mark.parametrize("case", sorted(POOL_CASES))
def test_pool_reference_matches_caffe_layer(method, case, rng):
    """ops.pool2d_reference (used by the ceil probe) is Caffe's pooling."""
    body, k, s, p, shape = POOL_CASES[case]
    x = (rng.permutation(int(np.prod(shape))).reshape(shape) - 20) * 0.01  # no ties
    layer, y, dy, dx = layer_reference(
        f'name: "pool" type: "Pooling" pooling_param {{ pool: {method} {body} }}', x, rng=rng)
    y_ref, dx_ref = ops.pool2d_reference(x, y.shape[2:], method, k, s, p, dy)
    np.testing.assert_allclose(y_ref, y, rtol=1e-12, atol=1e-15)
    np.testing.assert_allclose(dx_ref, dx, rtol=1e-12, atol=1e-15)


@pytest.mark.parametrize("case", sorted(CONV_CASES))
def test_conv_reference_matches_caffe_layer(case, rng):
    """The einsum references of the GPU tests against the CAFFE engine's CPU path."""
    x_shape, w_shape, pad, stride, dil, groups = CONV_CASES[case]
    (ph, pw), (sh, sw), (dh, dw) = pair(pad), pair(stride), pair(dil)
    m, _, kh, kw = w_shape
    text = (f'name: "conv" type: "Convolution" convolution_param {{ num_output: {m} '
            f"kernel_h: {kh} kernel_w: {kw} pad_h: {ph} pad_w: {pw} stride_h: {sh} "
            f"stride_w: {sw} dilation: {dh} dilation: {dw} group: {groups} "
            'weight_filler { type: "gaussian" std: 0.5 } bias_filler { type: "gaussian" } }')
    layer = make_layer(text)
    x = rng.standard_normal(x_shape)
    bottom, top = [make_blob(x, name="in")], [Blob(dtype=np.float64, name="out")]
    layer.setup(bottom, top)
    layer.forward(bottom, top)
    w, b = layer.blobs[0].data, layer.blobs[1].data
    np.testing.assert_allclose(top[0].data, conv_reference(x, w, b, pad, stride, dil, groups),
                               rtol=1e-12, atol=1e-12)
    dy = rng.standard_normal(top[0].shape)
    top[0].diff[...] = dy
    layer.backward(top, [True], bottom)
    dx, dwt, db = conv_backward_reference(x, w, dy, pad, stride, dil, groups)
    np.testing.assert_allclose(bottom[0].diff, dx, rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(layer.blobs[0].diff, dwt, rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(layer.blobs[1].diff, db, rtol=1e-12, atol=1e-12)


def test_host_descriptors_agree_with_caffe_geometry():
    """Descriptors only (no GPU needed): cuDNN's own output size of every conv case
    equals Caffe's.  Runs wherever libcudnn.so.9 loads."""
    if not cudnn_lib.available():
        pytest.skip("cuDNN not installed here")
    lib = cudnn_lib.load()
    for x_shape, w_shape, pad, stride, dil, groups in CONV_CASES.values():
        geom = ops.conv_geometry(x_shape, w_shape, pad, stride, dil, groups)
        for dt in (np.float32, np.float64):
            ops._ConvPlan(geom, dt, False, lib, None)  # raises if cuDNN disagrees


# ======================================================================= GPU
@pytest.fixture
def cu(cp):
    """The ops module, skipping when cuDNN is missing (test_library_loads reports that)."""
    if not cudnn_lib.available():
        pytest.skip("cuDNN not loadable: " + cudnn_lib.load_report())
    return ops


def to_gpu(cp, a, dtype):
    return cp.asarray(np.ascontiguousarray(a, dtype=dtype))


def run_or_xfail_double(dtype, fn, *args, **kwargs):
    """Run an op; for float64 only, cuDNN's NOT_SUPPORTED becomes an XFAIL saying so
    (the engine is float32 first; float64 serves gradient checks)."""
    try:
        return fn(*args, **kwargs)
    except cudnn_lib.CudnnUnsupported as e:
        if np.dtype(dtype) == np.float64:
            pytest.xfail(f"this cuDNN lacks float64 for {fn.__name__}: {e}")
        raise


@pytest.mark.gpu
def test_library_loads_on_the_gpu_machine():
    assert cudnn_lib.available(), cudnn_lib.load_report()
    v = cudnn_lib.version()
    assert v // 10000 == 9, v
    print(cudnn_lib.load_report())


@pytest.mark.gpu
def test_handle_follows_cupy_current_stream(cp, cu):
    from ctypes import byref, c_void_p
    s = cp.cuda.Stream(non_blocking=True)
    with s:
        lib, h = cu._handle()
        got = c_void_p()
        lib.cudnnGetStream(h, byref(got))
        assert (got.value or 0) == s.ptr
    lib, h = cu._handle()
    lib.cudnnGetStream(h, byref(got))
    assert (got.value or 0) == cp.cuda.get_current_stream().ptr


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("case", sorted(CONV_CASES))
def test_conv_matches_reference(cp, cu, case, dtype, rng):
    x_shape, w_shape, pad, stride, dil, groups = CONV_CASES[case]
    x = rng.standard_normal(x_shape).astype(dtype)
    w = rng.standard_normal(w_shape).astype(dtype)
    b = rng.standard_normal(w_shape[0]).astype(dtype)
    y_shape = (x_shape[0], w_shape[0]) + conv_out_hw(x_shape, w_shape, pad, stride, dil)
    dy = rng.standard_normal(y_shape).astype(dtype)
    xg, wg, bg, dyg = (to_gpu(cp, a, dtype) for a in (x, w, b, dy))

    yg = cp.full(y_shape, np.nan, dtype=dtype)
    cu.conv2d_forward(xg, wg, bg, yg, pad, stride, dil, groups)
    assert rel_err(cp.asnumpy(yg), conv_reference(x, w, b, pad, stride, dil, groups)) <= TOL[dtype]
    cu.conv2d_forward(xg, wg, None, yg, pad, stride, dil, groups)
    assert rel_err(cp.asnumpy(yg), conv_reference(x, w, None, pad, stride, dil, groups)) \
        <= TOL[dtype]

    dx_ref, dw_ref, db_ref = conv_backward_reference(x, w, dy, pad, stride, dil, groups)
    dxg = cp.full(x_shape, np.nan, dtype=dtype)  # overwritten (Caffe's bottom diff)
    cu.conv2d_backward_data(wg, dyg, dxg, pad, stride, dil, groups)
    assert rel_err(cp.asnumpy(dxg), dx_ref) <= TOL[dtype]

    dwg = cp.zeros(w_shape, dtype=dtype)
    cu.conv2d_backward_filter(xg, dyg, dwg, pad, stride, dil, groups)
    assert rel_err(cp.asnumpy(dwg), dw_ref) <= TOL[dtype]

    dbg = cp.zeros(w_shape[0], dtype=dtype)
    cu.conv2d_backward_bias(dyg, dbg)
    assert rel_err(cp.asnumpy(dbg), db_ref) <= TOL[dtype]


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("case", sorted(CONV_CASES))
def test_bound_conv_is_the_free_functions(cp, cu, case, dtype, rng):
    """BoundConv's three directions run the algorithms the free functions run and give their
    results (bit for bit where the algorithm is deterministic; cuDNN's others add in any
    order), accumulate alike, and count as cache hits.  The legacy API's calls: on the graph
    API a plan may be another engine within 2 % of the legacy algorithm's time (its own tests,
    test_backend_api.py, check it against the references)."""
    x_shape, w_shape, pad, stride, dil, groups = CONV_CASES[case]
    y_shape = (x_shape[0], w_shape[0]) + conv_out_hw(x_shape, w_shape, pad, stride, dil)
    x, w, dy = (to_gpu(cp, rng.standard_normal(s).astype(dtype), dtype)
                for s in (x_shape, w_shape, y_shape))
    b = to_gpu(cp, rng.standard_normal(w_shape[0]).astype(dtype), dtype)
    conv = cu.BoundConv(x_shape, w_shape, pad, stride, dil, groups, dtype, api="legacy")
    geo = (pad, stride, dil, groups)
    chosen = cu.conv_algorithms(x_shape, w_shape, *geo, dtype=dtype)

    def same(direction, got, ref):
        assert conv._choices[(direction, -1)] == chosen[direction]
        if chosen[direction].deterministic:
            assert cp.array_equal(got, ref), direction
        else:
            assert rel_err(cp.asnumpy(got), cp.asnumpy(ref)) <= TOL[dtype], direction

    y0, y1 = cp.empty(y_shape, dtype), cp.empty(y_shape, dtype)
    cu.conv2d_forward(x, w, b, y0, *geo)
    hits = cu.algo_cache_info()["hits"]
    for _ in range(2):
        assert conv.forward(x, w, b, y1) is y1
        same(cu.FWD, y1, y0)
    assert cu.algo_cache_info()["hits"] > hits
    # each backward pass at its default, then accumulating the other way
    for direction, bound, free, shape, fill, accumulates in (
            (cu.BWD_DATA, lambda out, **kw: conv.backward_data(w, dy, out, **kw),
             lambda out, **kw: cu.conv2d_backward_data(w, dy, out, *geo, **kw), x_shape,
             np.nan, False),
            (cu.BWD_FILTER, lambda out, **kw: conv.backward_filter(x, dy, out, **kw),
             lambda out, **kw: cu.conv2d_backward_filter(x, dy, out, *geo, **kw), w_shape,
             1.0, True)):
        ref, got = cp.full(shape, fill, dtype), cp.full(shape, fill, dtype)
        free(ref)
        bound(got)
        same(direction, got, ref)
        bound(got, accumulate=not accumulates)
        free(ref, accumulate=not accumulates)
        same(direction, got, ref)


@pytest.mark.gpu
def test_bound_conv_hands_other_shapes_to_the_checks(cp, cu, rng):
    """Arrays of another shape or dtype take the free function's path: computed where they
    are a convolution of their own, refused with its message where they are wrong."""
    x_shape, w_shape, pad, stride, dil, groups = CONV_CASES["wide"]
    conv = cu.BoundConv(x_shape, w_shape, pad, stride, dil, groups, np.float32)
    other = (2,) + x_shape[1:]
    x = to_gpu(cp, rng.standard_normal(other).astype(np.float32), np.float32)
    w = to_gpu(cp, rng.standard_normal(w_shape).astype(np.float32), np.float32)
    y_shape = (2, w_shape[0]) + conv_out_hw(other, w_shape, pad, stride, dil)
    y0, y1 = cp.empty(y_shape, np.float32), cp.empty(y_shape, np.float32)
    conv.forward(x, w, None, y1)
    cu.conv2d_forward(x, w, None, y0, pad, stride, dil, groups)
    assert cp.array_equal(y0, y1)
    with pytest.raises(ValueError, match="y has shape"):
        conv.forward(x, w, None, cp.empty((2, 1, 1, 1), np.float32))
    with pytest.raises(TypeError, match="dtypes must match"):
        conv.forward(x.astype(cp.float64), w, None, y1)
    with pytest.raises(TypeError, match="float32 or float64"):
        cu.BoundConv(x_shape, w_shape, pad, stride, dil, groups, np.float16)


@pytest.mark.gpu
def test_bound_conv_sees_clear_cache_and_other_streams(cp, cu, rng):
    """After clear_cache a bound convolution searches again; on another stream it runs
    there (the handle follows CuPy's current stream, set only when it changes)."""
    from ctypes import byref, c_void_p
    x_shape, w_shape, pad, stride, dil, groups = CONV_CASES["wide"]
    conv = cu.BoundConv(x_shape, w_shape, pad, stride, dil, groups, np.float32)
    x = to_gpu(cp, rng.standard_normal(x_shape).astype(np.float32), np.float32)
    w = to_gpu(cp, rng.standard_normal(w_shape).astype(np.float32), np.float32)
    y_shape = (x_shape[0], w_shape[0]) + conv_out_hw(x_shape, w_shape, pad, stride, dil)
    y0, y1 = cp.empty(y_shape, np.float32), cp.empty(y_shape, np.float32)
    conv.forward(x, w, None, y0)
    cu.clear_cache()
    assert cu.algo_cache_info()["searches"] == 0
    conv.forward(x, w, None, y1)
    assert cu.algo_cache_info()["searches"] == 1 and cp.array_equal(y0, y1)
    s = cp.cuda.Stream(non_blocking=True)
    with s:
        conv.forward(x, w, None, y1)
        lib, h = cu._handle()
        got = c_void_p()
        lib.cudnnGetStream(h, byref(got))
        assert (got.value or 0) == s.ptr
    s.synchronize()
    assert cp.array_equal(y0, y1)
    lib, h = cu._handle()
    lib.cudnnGetStream(h, byref(got))
    assert (got.value or 0) == cp.cuda.get_current_stream().ptr


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_param_diffs_accumulate(cp, cu, dtype, rng):
    """Backward filter and bias add into their outputs (beta = 1), as Caffe's param diffs do."""
    x_shape, w_shape, pad, stride, dil, groups = CONV_CASES["groups_dilation_stride"]
    x = rng.standard_normal(x_shape).astype(dtype)
    w = rng.standard_normal(w_shape).astype(dtype)
    y_shape = (x_shape[0], w_shape[0]) + conv_out_hw(x_shape, w_shape, pad, stride, dil)
    dy = rng.standard_normal(y_shape).astype(dtype)
    _, dw_ref, db_ref = conv_backward_reference(x, w, dy, pad, stride, dil, groups)
    dw0 = rng.standard_normal(w_shape).astype(dtype)
    db0 = rng.standard_normal(w_shape[0]).astype(dtype)
    xg, dyg = to_gpu(cp, x, dtype), to_gpu(cp, dy, dtype)
    dwg, dbg = to_gpu(cp, dw0, dtype), to_gpu(cp, db0, dtype)
    for times in (1, 2):
        cu.conv2d_backward_filter(xg, dyg, dwg, pad, stride, dil, groups)
        cu.conv2d_backward_bias(dyg, dbg)
        assert rel_err(cp.asnumpy(dwg), dw0 + times * dw_ref) <= TOL[dtype]
        assert rel_err(cp.asnumpy(dbg), db0 + times * db_ref) <= TOL[dtype]
    cu.conv2d_backward_filter(xg, dyg, dwg, pad, stride, dil, groups, accumulate=False)
    assert rel_err(cp.asnumpy(dwg), dw_ref) <= TOL[dtype]
    # and the bottom diff is overwritten unless asked to accumulate
    dx_ref = conv_backward_reference(x, w, dy, pad, stride, dil, groups)[0]
    dx0 = rng.standard_normal(x_shape).astype(dtype)
    dxg = to_gpu(cp, dx0, dtype)
    cu.conv2d_backward_data(to_gpu(cp, w, dtype), dyg, dxg, pad, stride, dil, groups,
                            accumulate=True)
    assert rel_err(cp.asnumpy(dxg), dx0 + dx_ref) <= TOL[dtype]


@pytest.mark.gpu
@pytest.mark.parametrize("case", ["basic_3x3", "groups_dilation_stride", "wide"])
def test_heuristic_choice_is_correct_too(cp, cu, case, rng):
    x_shape, w_shape, pad, stride, dil, groups = CONV_CASES[case]
    x = rng.standard_normal(x_shape).astype(np.float32)
    w = rng.standard_normal(w_shape).astype(np.float32)
    y_shape = (x_shape[0], w_shape[0]) + conv_out_hw(x_shape, w_shape, pad, stride, dil)
    dy = rng.standard_normal(y_shape).astype(np.float32)
    xg, wg, dyg = (to_gpu(cp, a, np.float32) for a in (x, w, dy))
    yg = cp.empty(y_shape, dtype=np.float32)
    cu.conv2d_forward(xg, wg, None, yg, pad, stride, dil, groups, find=False)
    assert rel_err(cp.asnumpy(yg), conv_reference(x, w, None, pad, stride, dil, groups)) <= 1e-5
    dx_ref, dw_ref, _ = conv_backward_reference(x, w, dy, pad, stride, dil, groups)
    dxg = cp.empty(x_shape, dtype=np.float32)
    cu.conv2d_backward_data(wg, dyg, dxg, pad, stride, dil, groups, find=False)
    assert rel_err(cp.asnumpy(dxg), dx_ref) <= 1e-5
    dwg = cp.zeros(w_shape, dtype=np.float32)
    cu.conv2d_backward_filter(xg, dyg, dwg, pad, stride, dil, groups, find=False)
    assert rel_err(cp.asnumpy(dwg), dw_ref) <= 1e-5
    algos = cu.conv_algorithms(x_shape, w_shape, pad, stride, dil, groups, find=False)
    assert {c.source for c in algos.values()} == {"heuristic"}


@pytest.mark.gpu
def test_no_tf32_by_default(cp, cu):
    """float32 without tf32 only ever runs FMA-math algorithms."""
    for case in ("wide", "basic_3x3"):
        x_shape, w_shape, pad, stride, dil, groups = CONV_CASES[case]
        for find in (True, False):
            algos = cu.conv_algorithms(x_shape, w_shape, pad, stride, dil, groups, np.float32,
                                       find=find)
            for c in algos.values():
                assert c.math_type == cudnn_lib.CUDNN_FMA_MATH, c


@pytest.mark.gpu
def test_tf32_option_runs(cp, cu, rng):
    x_shape, w_shape, pad, stride, dil, groups = CONV_CASES["wide"]
    x = rng.standard_normal(x_shape).astype(np.float32)
    w = rng.standard_normal(w_shape).astype(np.float32)
    y_shape = (x_shape[0], w_shape[0]) + conv_out_hw(x_shape, w_shape, pad, stride, dil)
    yg = cp.empty(y_shape, dtype=np.float32)
    cu.conv2d_forward(to_gpu(cp, x, np.float32), to_gpu(cp, w, np.float32), None, yg, pad,
                      stride, dil, groups, tf32=True)
    # TF32 keeps 10 mantissa bits: about 1e-3 relative
    assert rel_err(cp.asnumpy(yg), conv_reference(x, w, None, pad, stride, dil, groups)) <= 1e-2


@pytest.mark.gpu
def test_algorithm_cache_hits(cp, cu, rng):
    cu.clear_cache()
    x_shape, w_shape, pad, stride, dil, groups = CONV_CASES["stride2"]
    y_shape = (x_shape[0], w_shape[0]) + conv_out_hw(x_shape, w_shape, pad, stride, dil)
    xg = to_gpu(cp, rng.standard_normal(x_shape), np.float32)
    wg = to_gpu(cp, rng.standard_normal(w_shape), np.float32)
    yg = cp.empty(y_shape, dtype=np.float32)
    cu.conv2d_forward(xg, wg, None, yg, pad, stride, dil, groups)
    info = cu.algo_cache_info()
    assert info["searches"] == 1 and info["plans"] == 1
    y1 = cp.asnumpy(yg)
    for _ in range(3):
        cu.conv2d_forward(xg, wg, None, yg, pad, stride, dil, groups)
    info = cu.algo_cache_info()
    assert info["searches"] == 1 and info["hits"] >= 3
    np.testing.assert_array_equal(cp.asnumpy(yg), y1)
    # the sizes the memory manager is told are those of the cached choices
    ws = cu.conv_workspace_bytes(x_shape, w_shape, pad, stride, dil, groups, np.float32)
    assert cu.algo_cache_info()["searches"] == 3  # fwd was cached; bwd_data, bwd_filter new
    assert set(ws) == {"fwd", "bwd_data", "bwd_filter"}
    # another shape is another plan
    x2 = to_gpu(cp, rng.standard_normal((1,) + x_shape[1:]), np.float32)
    y2 = cp.empty((1,) + y_shape[1:], dtype=np.float32)
    cu.conv2d_forward(x2, wg, None, y2, pad, stride, dil, groups)
    assert cu.algo_cache_info()["plans"] == 2


@pytest.mark.gpu
def test_workspace_limit_respected(cp, cu, rng, monkeypatch):
    cu.clear_cache()
    x_shape, w_shape, pad, stride, dil, groups = CONV_CASES["wide"]
    for limit in (0, 1 << 10, 1 << 20):
        for find in (True, False):
            algos = cu.conv_algorithms(x_shape, w_shape, pad, stride, dil, groups, np.float32,
                                       find=find, workspace_limit=limit)
            for c in algos.values():
                assert c.workspace <= limit, c
    monkeypatch.setenv(cu.ENV_WORKSPACE_LIMIT, "0")
    assert cu.conv_workspace_bytes(x_shape, w_shape, pad, stride, dil, groups) == \
        {"fwd": 0, "bwd_data": 0, "bwd_filter": 0}
    # and the zero-workspace algorithms compute the right thing
    x = rng.standard_normal(x_shape).astype(np.float32)
    w = rng.standard_normal(w_shape).astype(np.float32)
    y_shape = (x_shape[0], w_shape[0]) + conv_out_hw(x_shape, w_shape, pad, stride, dil)
    dy = rng.standard_normal(y_shape).astype(np.float32)
    xg, wg, dyg = (to_gpu(cp, a, np.float32) for a in (x, w, dy))
    yg, dxg, dwg = (cp.empty(y_shape, np.float32), cp.empty(x_shape, np.float32),
                    cp.zeros(w_shape, np.float32))
    cu.conv2d_forward(xg, wg, None, yg, pad, stride, dil, groups)
    cu.conv2d_backward_data(wg, dyg, dxg, pad, stride, dil, groups)
    cu.conv2d_backward_filter(xg, dyg, dwg, pad, stride, dil, groups)
    dx_ref, dw_ref, _ = conv_backward_reference(x, w, dy, pad, stride, dil, groups)
    assert rel_err(cp.asnumpy(yg), conv_reference(x, w, None, pad, stride, dil, groups)) <= 1e-5
    assert rel_err(cp.asnumpy(dxg), dx_ref) <= 1e-5
    assert rel_err(cp.asnumpy(dwg), dw_ref) <= 1e-5


@pytest.mark.gpu
def test_given_workspace_is_used_and_bounds_the_choice(cp, cu, rng):
    cu.clear_cache()
    x_shape, w_shape, pad, stride, dil, groups = CONV_CASES["wide"]
    x = rng.standard_normal(x_shape).astype(np.float32)
    w = rng.standard_normal(w_shape).astype(np.float32)
    ref = conv_reference(x, w, None, pad, stride, dil, groups)
    xg, wg = to_gpu(cp, x, np.float32), to_gpu(cp, w, np.float32)
    need = cu.conv_workspace_bytes(x_shape, w_shape, pad, stride, dil, groups)["fwd"]
    yg = cp.empty(ref.shape, dtype=np.float32)
    cu.conv2d_forward(xg, wg, None, yg, pad, stride, dil, groups,
                      workspace=cp.empty(max(need, 1), dtype=cp.uint8))
    assert rel_err(cp.asnumpy(yg), ref) <= 1e-5
    # a buffer smaller than the chosen algorithm's need: an algorithm that fits it is used
    cu.conv2d_forward(xg, wg, None, yg, pad, stride, dil, groups,
                      workspace=cp.empty(0, dtype=cp.uint8))
    assert rel_err(cp.asnumpy(yg), ref) <= 1e-5


@pytest.mark.gpu
@pytest.mark.parametrize("case", ["wide", "groups_dilation_stride", "stride2"])
def test_deterministic_gives_bit_identical_results(cp, cu, case, rng):
    x_shape, w_shape, pad, stride, dil, groups = CONV_CASES[case]
    x = to_gpu(cp, rng.standard_normal(x_shape), np.float32)
    w = to_gpu(cp, rng.standard_normal(w_shape), np.float32)
    y_shape = (x_shape[0], w_shape[0]) + conv_out_hw(x_shape, w_shape, pad, stride, dil)
    dy = to_gpu(cp, rng.standard_normal(y_shape), np.float32)
    kw = dict(deterministic=True)
    algos = cu.conv_algorithms(x_shape, w_shape, pad, stride, dil, groups, **kw)
    assert all(c.deterministic for c in algos.values()), algos
    runs = []
    for _ in range(2):
        y = cp.empty(y_shape, dtype=np.float32)
        dx = cp.empty(x_shape, dtype=np.float32)
        dw = cp.zeros(w_shape, dtype=np.float32)
        cu.conv2d_forward(x, w, None, y, pad, stride, dil, groups, **kw)
        cu.conv2d_backward_data(w, dy, dx, pad, stride, dil, groups, **kw)
        cu.conv2d_backward_filter(x, dy, dw, pad, stride, dil, groups, **kw)
        runs.append([cp.asnumpy(a) for a in (y, dx, dw)])
    for a, b in zip(*runs):
        np.testing.assert_array_equal(a, b)


@pytest.mark.gpu
def test_conv_argument_errors(cp, cu):
    x = cp.zeros((2, 4, 6, 6), dtype=np.float32)
    w = cp.zeros((6, 2, 3, 3), dtype=np.float32)
    y = cp.zeros((2, 6, 4, 4), dtype=np.float32)
    with pytest.raises(ValueError, match="expected"):
        cu.conv2d_forward(x, w, None, cp.zeros((2, 6, 5, 5), np.float32), 0, 1, 1, 2)
    with pytest.raises(ValueError, match="C-contiguous"):
        cu.conv2d_forward(x[:, :, ::2], w, None, y, 0, 1, 1, 2)
    with pytest.raises(TypeError, match="dtypes must match"):
        cu.conv2d_forward(x, w.astype(np.float64), None, y, 0, 1, 1, 2)
    with pytest.raises(TypeError, match="cupy.ndarray"):
        cu.conv2d_forward(cp.asnumpy(x), w, None, y, 0, 1, 1, 2)
    with pytest.raises(ValueError, match="channels"):
        cu.conv2d_forward(x, w, None, y, 0, 1, 1, 1)
    # an empty batch is a no-op
    cu.conv2d_forward(cp.zeros((0, 4, 6, 6), np.float32), w, None,
                      cp.zeros((0, 6, 4, 4), np.float32), 0, 1, 1, 2)


# ------------------------------------------------------------------- pooling
@pytest.mark.gpu
@pytest.mark.parametrize("kind", ["pad", "ceil"])
@pytest.mark.parametrize("method", ["MAX", "AVE"])
def test_pooling_probes(cp, cu, method, kind):
    """Whether this cuDNN pools padded windows ("pad") and Caffe's ceil-rounded output
    ("ceil") as Caffe does: reported either way.

    XFAIL (with cuDNN's answer) means those pooling geometries fall back to the
    CAFFE engine; run pytest with -rx to read the reason.
    """
    why = cu._probe(cu._pool_mode(method), kind)
    if why:
        pytest.xfail(why)


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("method", ["MAX", "AVE"])
@pytest.mark.parametrize("case", sorted(POOL_CASES))
def test_pool_matches_caffe_layer(cp, cu, case, method, dtype, rng):
    body, k, s, p, shape = POOL_CASES[case]
    x = ((rng.permutation(int(np.prod(shape))).reshape(shape) - 20) * 0.01).astype(dtype)
    layer, y_ref, dy, dx_ref = layer_reference(
        f'name: "pool" type: "Pooling" pooling_param {{ pool: {method} {body} }}', x, rng=rng)
    dy = dy.astype(dtype)
    xg, dyg = to_gpu(cp, x, dtype), to_gpu(cp, dy, dtype)
    yg = cp.full(y_ref.shape, np.nan, dtype=dtype)
    dxg = cp.full(shape, np.nan, dtype=dtype)
    ok, why = cu.pool2d_supported(shape[2:], y_ref.shape[2:], method, k, s, p)
    if not ok:
        with pytest.raises(cudnn_lib.CudnnUnsupported, match="CAFFE engine"):
            cu.pool2d_forward(xg, yg, method, k, s, p)
        pytest.xfail(f"cuDNN cannot pool {case} as Caffe does: {why}")
    run_or_xfail_double(dtype, cu.pool2d_forward, xg, yg, method, k, s, p)
    assert rel_err(cp.asnumpy(yg), y_ref) <= TOL[dtype]
    cu.pool2d_backward(yg, dyg, xg, dxg, method, k, s, p)
    assert rel_err(cp.asnumpy(dxg), dx_ref) <= TOL[dtype]
    if method == "AVE":  # AVE backward needs neither x nor y
        dxg[...] = np.nan
        cu.pool2d_backward(None, dyg, None, dxg, method, k, s, p)
        assert rel_err(cp.asnumpy(dxg), dx_ref) <= TOL[dtype]
    else:
        dxg[...] = np.nan
        cu.pool2d_backward(yg, dyg, xg, dxg, method, k, s, p, deterministic=True)
        assert rel_err(cp.asnumpy(dxg), dx_ref) <= TOL[dtype]


@pytest.mark.gpu
def test_pool_refuses_what_caffe_computes_differently(cp, cu):
    x = cp.zeros((1, 1, 5, 5), dtype=np.float32)
    y = cp.zeros((1, 1, 3, 3), dtype=np.float32)   # kernel 1 stride 3: an empty last window
    with pytest.raises(cudnn_lib.CudnnUnsupported, match="CAFFE engine"):
        cu.pool2d_forward(x, y, "MAX", 1, 3, 0)
    with pytest.raises(ValueError, match="STOCHASTIC"):
        cu.pool2d_forward(x, y, 2, 3, 1, 0)


# ----------------------------------------------------------------------- LRN
@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("size,alpha,beta,k", [(5, 1e-4, 0.75, 2.0), (3, 0.5, 0.75, 2.0),
                                               (1, 2.0, 0.5, 1.0), (7, 1.5, 1.25, 0.5),
                                               (5, 3.0, 0.75, 1.0)])
def test_lrn_matches_caffe_layer(cp, cu, size, alpha, beta, k, dtype, rng):
    x = (rng.standard_normal((2, 9, 5, 4)) * 2).astype(dtype)
    layer, y_ref, dy, dx_ref = layer_reference(
        f'name: "norm" type: "LRN" lrn_param {{ local_size: {size} alpha: {alpha} beta: {beta} '
        f"k: {k} }}", x, rng=rng)
    # the schema's fields are float: use exactly the values the layer read
    a, b, kk = layer.alpha, layer.beta, layer.k
    xg, dyg = to_gpu(cp, x, dtype), to_gpu(cp, dy, dtype)
    yg = cp.full(x.shape, np.nan, dtype=dtype)
    run_or_xfail_double(dtype, cu.lrn_forward, xg, yg, size, a, b, kk)
    tol = 1e-5 if dtype == np.float32 else 1e-10
    assert rel_err(cp.asnumpy(yg), y_ref) <= tol
    dxg = cp.full(x.shape, np.nan, dtype=dtype)
    cu.lrn_backward(yg, dyg, xg, dxg, size, a, b, kk)
    assert rel_err(cp.asnumpy(dxg), dx_ref) <= tol


@pytest.mark.gpu
def test_lrn_refuses_parameters_cudnn_cannot_take(cp, cu):
    x = cp.ones((1, 20, 2, 2), dtype=np.float32)
    with pytest.raises(cudnn_lib.CudnnUnsupported, match="CAFFE engine"):
        cu.lrn_forward(x, cp.empty_like(x), 17, 1e-4, 0.75, 1.0)


# ------------------------------------------------------------------- softmax
@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("shape,axis", [((4, 10), 1), ((2, 5, 3, 4), 1), ((2, 3, 6, 2), 2),
                                        ((3, 7), -1), ((2, 2, 4), 1), ((64, 1000), 1)])
def test_softmax_matches_reference(cp, cu, shape, axis, dtype, rng):
    x = (rng.standard_normal(shape) * 4).astype(dtype)
    y_ref = softmax_reference(x, axis)
    dy = rng.standard_normal(shape).astype(dtype)
    dx_ref = (dy - (dy * y_ref).sum(axis=axis, keepdims=True)) * y_ref
    xg, dyg = to_gpu(cp, x, dtype), to_gpu(cp, dy, dtype)
    yg = cp.full(shape, np.nan, dtype=dtype)
    run_or_xfail_double(dtype, cu.softmax_forward, xg, yg, axis)
    assert rel_err(cp.asnumpy(yg), y_ref) <= TOL[dtype]
    dxg = cp.full(shape, np.nan, dtype=dtype)
    cu.softmax_backward(yg, dyg, dxg, axis)
    assert rel_err(cp.asnumpy(dxg), dx_ref) <= TOL[dtype]
    # in place, as Caffe's Softmax layer may run
    cu.softmax_forward(xg, xg, axis)
    assert rel_err(cp.asnumpy(xg), y_ref) <= TOL[dtype]
    cu.softmax_backward(yg, dyg, dyg, axis)
    assert rel_err(cp.asnumpy(dyg), dx_ref) <= TOL[dtype]


@pytest.mark.gpu
def test_softmax_large_logits_do_not_overflow(cp, cu):
    x = cp.asarray(np.array([[1000.0, 1001.0, 999.0]], dtype=np.float32))
    y = cp.empty_like(x)
    cu.softmax_forward(x, y)
    np.testing.assert_allclose(cp.asnumpy(y), softmax_reference(cp.asnumpy(x), 1), rtol=1e-6)


@pytest.mark.gpu
def test_ops_run_on_the_current_stream(cp, cu, rng):
    """Work issued inside `with stream:` is ordered on that stream (no host sync needed)."""
    x_shape, w_shape, pad, stride, dil, groups = CONV_CASES["wide"]
    x = rng.standard_normal(x_shape).astype(np.float32)
    w = rng.standard_normal(w_shape).astype(np.float32)
    ref = conv_reference(x, w, None, pad, stride, dil, groups)
    s = cp.cuda.Stream(non_blocking=True)
    with s:
        xg, wg = to_gpu(cp, x, np.float32), to_gpu(cp, w, np.float32)
        yg = cp.empty(ref.shape, dtype=np.float32)
        cu.conv2d_forward(xg, wg, None, yg, pad, stride, dil, groups)
        zg = cp.empty_like(yg)
        cu.softmax_forward(yg, zg)
        out = cp.asnumpy(zg, stream=s)
        s.synchronize()
    assert rel_err(out, softmax_reference(ref, 1)) <= 1e-5


def test_module_imports_without_gpu():
    assert isinstance(cudnn_lib.available(), bool)
    assert isinstance(cudnn_lib.load_report(), str)


@pytest.mark.gpu
def test_workspace_estimate_exact_where_searched_nearest_choice_elsewhere(cp, cu):
    """conv_workspace_estimate: a searched shape gives its choices' workspaces; another
    minibatch of the same convolution gives the workspaces, at that shape, of the algorithms
    chosen at the nearest searched one (no search), each within the limit; a convolution never
    searched is searched."""
    cu.clear_cache()
    _, w_shape, pad, stride, dil, groups = CONV_CASES["wide"]
    x8 = (8,) + CONV_CASES["wide"][0][1:]
    limit = 1 << 20
    kw = dict(workspace_limit=limit)
    exact8 = cu.conv_workspace_bytes(x8, w_shape, pad, stride, dil, groups, **kw)
    searches = cu.algo_cache_info()["searches"]
    assert cu.conv_workspace_estimate(x8, w_shape, pad, stride, dil, groups, **kw) == exact8
    x64 = (64,) + x8[1:]
    est = cu.conv_workspace_estimate(x64, w_shape, pad, stride, dil, groups, **kw)
    assert cu.algo_cache_info()["searches"] == searches           # no search for it
    chosen = cu.conv_algorithms(x8, w_shape, pad, stride, dil, groups, **kw)
    lib, h = cu._handle()
    plan = cu._plan(cu.conv_geometry(x64, w_shape, pad, stride, dil, groups), np.float32,
                    False, lib, h)
    for d, c in chosen.items():
        plan.set_math(lib, d, c.math_type)
        need = cu._ws_size(lib, h, plan, d, c.algo)
        assert est[d] == min(need, limit) and est[d] <= limit
    # searched at 64 too: exact there
    exact64 = cu.conv_workspace_bytes(x64, w_shape, pad, stride, dil, groups, **kw)
    assert cu.conv_workspace_estimate(x64, w_shape, pad, stride, dil, groups, **kw) == exact64
    # other options: never searched, so searched now
    cu.conv_workspace_estimate(x64, w_shape, pad, stride, dil, groups, workspace_limit=0)
    assert cu.algo_cache_info()["searches"] > searches


@pytest.mark.gpu
def test_workspace_estimate_with_a_bound_per_image(cp, cu):
    """With a limit that grows with the minibatch (limit_at), the nearest searched minibatch's
    choices are those made under its own limit; a minibatch searched under its own limit is
    exact; the answer is within the limit of the minibatch asked."""
    cu.clear_cache()
    _, w_shape, pad, stride, dil, groups = CONV_CASES["wide"]
    x8 = (8,) + CONV_CASES["wide"][0][1:]
    x64 = (64,) + x8[1:]

    def limit_at(n):
        return cu.workspace_limit_at(4 << 30, 16 << 20, n)   # 16 MiB per image: 128 MiB at 8
    geo = (w_shape, pad, stride, dil, groups)
    exact8 = cu.conv_workspace_bytes(x8, *geo, workspace_limit=limit_at(8))
    assert cu.conv_workspace_estimate(x8, *geo, limit_at=limit_at) == exact8
    searches = cu.algo_cache_info()["searches"]
    est = cu.conv_workspace_estimate(x64, *geo, limit_at=limit_at)
    assert cu.algo_cache_info()["searches"] == searches           # the choices at 8, no search
    chosen = cu.conv_algorithms(x8, *geo, workspace_limit=limit_at(8))
    lib, h = cu._handle()
    plan = cu._plan(cu.conv_geometry(x64, *geo), np.float32, False, lib, h)
    for d, c in chosen.items():
        plan.set_math(lib, d, c.math_type)
        need = cu._ws_size(lib, h, plan, d, c.algo)
        assert est[d] == min(need, limit_at(64)) and est[d] <= limit_at(64)
    exact64 = cu.conv_workspace_bytes(x64, *geo, workspace_limit=limit_at(64))
    assert cu.conv_workspace_estimate(x64, *geo, limit_at=limit_at) == exact64


def test_nearest_searched_looks_only_at_the_same_convolution(monkeypatch):
    """_nearest_searched (CPU, no cuDNN): the plan of the same convolution at the nearest
    minibatch by ratio whose every direction was searched under its own keys; other
    convolutions, dtypes and unsearched minibatches are not candidates; ties go to the plan
    made first."""
    from types import SimpleNamespace
    monkeypatch.setattr(ops, "_same_conv", {})
    w, pad = (16, 8, 3, 3), 1

    def plan(n, searched=True, w_shape=w, dtype="<f4"):
        geom = ops.conv_geometry((n, 8, 20, 20), w_shape, pad)
        keys = {d: (d, n * 100, False, True) for d in ops.DIRECTIONS}
        p = SimpleNamespace(geom=geom, choices={k: object() for k in keys.values()}
                            if searched else {})
        ops._same_conv.setdefault(ops._conv_key(0, geom, dtype, False), []).append(p)
        return p

    def keys_at(n):                       # a limit per image, as workspace_limit_at gives
        return {d: (d, n * 100, False, True) for d in ops.DIRECTIONS}
    p8, p64 = plan(8), plan(64)
    plan(30, searched=False)              # nearer to 32, never searched
    plan(32, w_shape=(16, 8, 5, 5))       # another convolution
    plan(32, dtype="<f8")                 # another dtype
    at = ops.conv_geometry((32, 8, 20, 20), w, pad)
    p, there = ops._nearest_searched(0, at, "<f4", False, keys_at)
    assert p is p64 and there == keys_at(64)        # log(64/32) < log(32/8)
    at16 = ops.conv_geometry((16, 8, 20, 20), w, pad)
    assert ops._nearest_searched(0, at16, "<f4", False, keys_at)[0] is p8
    plan(128)                             # farther from 32 than 64
    assert ops._nearest_searched(0, at, "<f4", False, keys_at)[0] is p64
    plan(2)                               # as near to 4 as 8 is (by ratio): the first made wins
    at4 = ops.conv_geometry((4, 8, 20, 20), w, pad)
    assert ops._nearest_searched(0, at4, "<f4", False, keys_at)[0] is p8
    assert ops._nearest_searched(1, at, "<f4", False, keys_at) is None     # another device
    assert ops._nearest_searched(0, at, "<f4", True, keys_at) is None      # TF32 plans: none


def test_a_refused_call_is_cudnn_unsupported_and_other_failures_stay_cudnn_errors():
    """NOT_SUPPORTED (a shape or layout cuDNN lacks) becomes CudnnUnsupported, the error on
    which a layer falls back to the CAFFE engine, whether the call sits in ``_refusal`` or in
    the bound convolutions' own try blocks (``_refused``); any other status stays itself."""
    refused = cudnn_lib.CudnnError("cudnnConvolutionForward", cudnn_lib.STATUS_NOT_SUPPORTED, "")
    other = cudnn_lib.CudnnError("cudnnConvolutionForward", 2000, "dims")
    got = ops._refused("conv2d_forward", refused)
    assert isinstance(got, cudnn_lib.CudnnUnsupported)
    assert "conv2d_forward" in str(got) and "CAFFE engine" in str(got)
    assert ops._refused("conv2d_forward", other) is other
    with pytest.raises(cudnn_lib.CudnnUnsupported, match="pool_forward") as e:
        with ops._refusal("pool_forward"):
            raise refused
    assert e.value.__cause__ is refused
    with pytest.raises(cudnn_lib.CudnnError) as e:
        with ops._refusal("pool_forward"):
            raise other
    assert e.value is other


def test_chunk_count_is_the_number_of_workspace_chunks():
    """The performance model counts a chunked convolution's calls with ``chunk_count``; it is
    ``len(workspace_chunks(...))`` for every size, bound and multiple."""
    for num in (0, 1, 7, 16, 17, 33, 65, 92, 130, 261):
        for limit, per, multiple in ((1 << 20, 0, 1), (100, 10, 1), (100, 10, 4), (100, 30, 16),
                                     (1536, 55, 16), (10 ** 9, 10, 16)):
            assert ops.chunk_count(num, limit, per, multiple) == len(
                ops.workspace_chunks(num, limit, per, multiple)), (num, limit, per, multiple)
    assert ops.chunk_images(1536, 55, 16) == 16 and ops.chunk_images(100, 30, 16) == 3
