"""minicaffe.cublas: the library search, the argument checks and the row-major to
column-major planning (on the CPU, each planned call run by a NumPy emulator of
cuBLAS's column-major GEMM on the same memory), then on the GPU every
transpose combination and both dtypes against NumPy, the strided-batched forms
the layers use, and a GEMM captured in a CUDA graph and replayed."""
import ctypes.util
from types import SimpleNamespace

import numpy as np
import pytest

from minicaffe import cublas
from minicaffe.cublas import CUBLAS_OP_N, CublasError, CublasNotFound, GemmCall, plan_gemm


# ------------------------------------------------------------- the library search
def test_explicit_file_is_the_only_candidate(tmp_path):
    f = tmp_path / "libcublas.so.13"
    env = {cublas.ENV_LIB: str(f)}
    assert cublas.candidates(env) == [(cublas.ENV_LIB, str(f))]


def test_explicit_folder_takes_the_soname_it_holds(tmp_path):
    (tmp_path / "libcublas.so.12").write_bytes(b"")
    got = cublas.candidates({cublas.ENV_LIB: str(tmp_path)}, cuda_major=13)
    assert got == [(f"{cublas.ENV_LIB} folder", str(tmp_path / "libcublas.so.12"))]


def test_wheel_folders_of_cuda_13_and_12_in_cupys_order(tmp_path, monkeypatch):
    for sub, so in (("cu13", "libcublas.so.13"), ("cublas", "libcublas.so.12")):
        d = tmp_path / "nvidia" / sub / "lib"
        d.mkdir(parents=True)
        (d / so).write_bytes(b"")
    monkeypatch.setattr(cublas, "_site_dirs", lambda: [str(tmp_path)])
    env = {"CUDA_HOME": str(tmp_path / "none")}
    wheels = lambda major: [t for w, t in cublas.candidates(env, major) if w.startswith("nvidia")]
    assert wheels(13) == [str(tmp_path / "nvidia/cu13/lib/libcublas.so.13"),
                          str(tmp_path / "nvidia/cublas/lib/libcublas.so.12")]
    assert wheels(12) == wheels(13)[::-1]
    where = [w for w, _ in cublas.candidates(env, 13)]
    assert where[0] == "already loaded in this process" and where[-1] == "system loader"


def test_missing_library_names_the_path_and_how_to_install(tmp_path):
    path = str(tmp_path / "nowhere" / "libcublas.so.13")
    with pytest.raises(CublasNotFound) as e:
        cublas.load({cublas.ENV_LIB: path})
    msg = str(e.value)
    assert path in msg and cublas.ENV_LIB in msg and "nvidia-cublas" in msg
    cublas._reset_cache()


def test_a_library_that_is_not_cublas_is_refused():
    libm = ctypes.util.find_library("m")
    if libm is None:
        pytest.skip("no libm to load")
    with pytest.raises(CublasNotFound, match="lacks .*cublasCreate_v2"):
        cublas.load({cublas.ENV_LIB: libm})
    cublas._reset_cache()


def test_a_real_libcublas_binds_every_function():
    """Loads no GPU: cublasGetProperty answers without one.  Skips where no
    libcublas is installed (set MINICAFFE_CUBLAS_LIB to a wheel's folder to run it)."""
    try:
        lib = cublas.load()
    except CublasNotFound as e:
        pytest.skip(str(e).splitlines()[0])
    for name in ("cublasCreate_v2", "cublasSetStream_v2", "cublasSetWorkspace_v2",
                 "cublasSetMathMode", "cublasSgemm_v2", "cublasDgemm_v2",
                 "cublasSgemmStridedBatched", "cublasDgemmStridedBatched"):
        assert callable(getattr(lib, name))
    assert lib.version[0] >= 12
    assert "cuBLAS" in cublas.load_report()


def test_prototypes_take_the_planned_arguments():
    """Every bound function called with a NULL handle: cuBLAS answers NOT_INITIALIZED,
    which proves the symbol, the argument count and the ctypes conversions (the GEMMs
    with the planner's arguments).  Skips where no libcublas is installed."""
    try:
        lib = cublas.load()
    except CublasNotFound as e:
        pytest.skip(str(e).splitlines()[0])
    r = np.random.default_rng(0)
    for dtype in (np.float32, np.float64):
        for batched in (False, True):
            ar = Arena(dtype)
            a = ar.take((2, 2, 3) if batched else (2, 3), r)
            b = ar.take((4, 3), r)
            out = ar.take((2, 2, 4) if batched else (2, 4), r)
            call = plan_gemm(a, b, out, trans_b=True, alpha=2.0, beta=1.0, batched=batched)
            with pytest.raises(CublasError, match="NOT_INITIALIZED") as e:
                getattr(lib, call.function)(None, *cublas.c_args(call))
            assert e.value.status == 1 and e.value.func == call.function
    for name, args in (("cublasSetStream_v2", (None, None)),
                       ("cublasSetWorkspace_v2", (None, None, 1 << 20)),
                       ("cublasSetMathMode", (None, cublas.CUBLAS_DEFAULT_MATH)),
                       ("cublasSetPointerMode_v2", (None, cublas.CUBLAS_POINTER_MODE_HOST)),
                       ("cublasDestroy_v2", (None,))):
        with pytest.raises(CublasError, match="NOT_INITIALIZED"):
            getattr(lib, name)(*args)


def test_workspace_size_from_the_environment(monkeypatch):
    monkeypatch.delenv(cublas.ENV_WORKSPACE, raising=False)
    assert cublas.workspace_bytes() == 32 << 20
    monkeypatch.setenv(cublas.ENV_WORKSPACE, "4M")
    assert cublas.workspace_bytes() == 4 << 20
    monkeypatch.setenv(cublas.ENV_WORKSPACE, "lots")
    with pytest.raises(ValueError, match=cublas.ENV_WORKSPACE):
        cublas.workspace_bytes()


def test_numpy_arrays_never_take_the_binding():
    assert not cublas.enabled_for(np)
    assert cublas.unavailable_reason(np) == "not CuPy arrays"
    with cublas.disabled():
        assert not cublas.enabled()
        assert cublas.ENV_SWITCH in cublas.unavailable_reason()
    assert cublas.enabled()


# ------------------------------------------------- planning, run by an emulator
def emulate(call: GemmCall, buf: np.ndarray):
    """cuBLAS's column-major GEMM on host memory, as its reference defines it, with its
    own argument checks (CUBLAS_STATUS_INVALID_VALUE): the call's addresses point into
    ``buf``, a flat NumPy array."""
    t = buf.itemsize
    ta, tb = call.transa != CUBLAS_OP_N, call.transb != CUBLAS_OP_N
    m, n, k = call.m, call.n, call.k
    assert min(m, n, k, call.batch) >= 0
    assert call.lda >= max(1, k if ta else m), "lda"
    assert call.ldb >= max(1, n if tb else k), "ldb"
    assert call.ldc >= max(1, m), "ldc"

    def view(ptr, rows, cols, ld, i, stride):  # column-major rows x cols, leading dim ld
        off = (ptr - buf.ctypes.data) // t + i * stride
        assert off >= 0 and off + (cols - 1) * ld + rows <= buf.size, "out of bounds"
        return np.lib.stride_tricks.as_strided(buf[off:], (rows, cols), (t, ld * t))

    for i in range(call.batch if call.batched else 1):
        sa, sb, sc = ((call.stride_a, call.stride_b, call.stride_c) if call.batched
                      else (0, 0, 0))
        A = view(call.a, k, m, call.lda, i, sa).T if ta else view(call.a, m, k, call.lda, i, sa)
        B = view(call.b, n, k, call.ldb, i, sb).T if tb else view(call.b, k, n, call.ldb, i, sb)
        C = view(call.c, m, n, call.ldc, i, sc)
        C[...] = call.alpha * (A.astype(np.float64) @ B) + call.beta * C


class Arena:
    """Arrays carved out of one flat buffer, so that their addresses are offsets."""

    def __init__(self, dtype, size=1 << 14):
        self.buf = np.zeros(size, dtype)
        self.used = 0

    def take(self, shape, rng):
        n = int(np.prod(shape))
        a = self.buf[self.used:self.used + n].reshape(shape)
        a[...] = rng.standard_normal(shape)
        self.used += n + 7  # a gap: no two arrays touch
        return a


def op(x, t):
    return np.swapaxes(x, -1, -2) if t else x


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("trans_a", [False, True])
@pytest.mark.parametrize("trans_b", [False, True])
@pytest.mark.parametrize("mkn", [(3, 5, 4), (1, 6, 2), (4, 1, 3), (5, 2, 1), (1, 1, 1)])
def test_gemm_plan_computes_the_row_major_product(dtype, trans_a, trans_b, mkn, rng):
    m, k, n = mkn
    ar = Arena(dtype)
    a = ar.take((k, m) if trans_a else (m, k), rng)
    b = ar.take((n, k) if trans_b else (k, n), rng)
    out = ar.take((m, n), rng)
    want = 1.5 * op(a, trans_a) @ op(b, trans_b) + 0.5 * out
    call = plan_gemm(a, b, out, trans_a, trans_b, alpha=1.5, beta=0.5)
    assert call.function == {np.float32: "cublasSgemm_v2", np.float64: "cublasDgemm_v2"}[dtype]
    emulate(call, ar.buf)
    np.testing.assert_allclose(out, want, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("trans_a", [False, True])
@pytest.mark.parametrize("trans_b", [False, True])
@pytest.mark.parametrize("shared", ["none", "a", "b"])
def test_strided_batched_plan_on_strided_views(dtype, trans_a, trans_b, shared, rng):
    """out and the batched inputs are views [:, g] of (B, G, ., .) arrays, as the
    convolution passes them; a shared operand is 2-d (batch stride 0)."""
    B, G, m, k, n = 3, 2, 4, 5, 3
    ar = Arena(dtype)
    sa = (k, m) if trans_a else (m, k)
    sb = (n, k) if trans_b else (k, n)
    a = ar.take(sa, rng) if shared == "a" else ar.take((B, G) + sa, rng)[:, 1]
    b = ar.take(sb, rng) if shared == "b" else ar.take((B, G) + sb, rng)[:, 0]
    out = ar.take((B, G, m, n), rng)[:, 1]
    want = op(a, trans_a) @ op(b, trans_b) - 2.0 * out
    call = plan_gemm(a, b, out, trans_a, trans_b, alpha=1.0, beta=-2.0, batched=True)
    assert call.function.endswith("StridedBatched") and call.batch == B
    assert (call.stride_b == 0) == (shared == "a") and (call.stride_a == 0) == (shared == "b")
    emulate(call, ar.buf)
    np.testing.assert_allclose(out, want, rtol=1e-5, atol=1e-5)


def test_plan_swaps_operands_for_column_major():
    """out (M, N) = a (M, K) b (K, N) is cuBLAS's out^T (N, M) = b^T a^T: b first, m = N."""
    ar = Arena(np.float32)
    r = np.random.default_rng(0)
    a, b, out = ar.take((2, 3), r), ar.take((3, 4), r), ar.take((2, 4), r)
    c = plan_gemm(a, b, out)
    assert (c.m, c.n, c.k) == (4, 2, 3)
    assert (c.a, c.b, c.c) == (b.ctypes.data, a.ctypes.data, out.ctypes.data)
    assert (c.lda, c.ldb, c.ldc) == (4, 3, 4)


# ------------------------------------------------------------- argument errors
def fake(shape, dtype=np.float32, strides=None, ptr=0):
    """An array-like with what the planner reads: shape, strides, dtype, data.ptr."""
    dt = np.dtype(dtype)
    if strides is None:
        strides = tuple(int(np.prod(shape[i + 1:])) * dt.itemsize for i in range(len(shape)))
    return SimpleNamespace(shape=shape, strides=strides, dtype=dt, data=SimpleNamespace(ptr=ptr))


def test_dtypes_must_be_float_and_equal():
    with pytest.raises(TypeError, match="b has dtype int64"):
        plan_gemm(fake((2, 3)), fake((3, 4), np.int64), fake((2, 4)))
    with pytest.raises(TypeError, match="out is float64 but a is float32"):
        plan_gemm(fake((2, 3)), fake((3, 4), ptr=1 << 20), fake((2, 4), np.float64, ptr=2 << 20))


def test_transposed_view_asks_for_the_flag():
    a = np.zeros((3, 2), np.float32).T  # (2, 3), column-major
    with pytest.raises(ValueError, match=r"a of shape \(2, 3\).*trans_a=True"):
        plan_gemm(a, np.zeros((3, 4), np.float32), np.zeros((2, 4), np.float32))


def test_shape_mismatch_names_every_shape():
    with pytest.raises(ValueError, match=r"a\.T is \(3, 2\).*b is \(4, 5\)"):
        plan_gemm(fake((2, 3)), fake((4, 5), ptr=1 << 20), fake((3, 5), ptr=2 << 20),
                  trans_a=True)


def test_dimensions():
    with pytest.raises(ValueError, match="a must be a 2-d array"):
        plan_gemm(fake((1, 2, 3)), fake((3, 4)), fake((2, 4)))
    with pytest.raises(ValueError, match="out must be a 3-d"):
        plan_gemm(fake((2, 3)), fake((3, 4)), fake((2, 4)), batched=True)
    with pytest.raises(ValueError, match="a holds 2 matrices, out 3"):
        plan_gemm(fake((2, 2, 3)), fake((3, 4), ptr=1 << 20), fake((3, 2, 4), ptr=2 << 20),
                  batched=True)


def test_overlaps_and_strides():
    buf = np.zeros(64, np.float32)
    a = buf[:6].reshape(2, 3)
    b = np.zeros((3, 4), np.float32)
    with pytest.raises(ValueError, match="out overlaps a"):
        plan_gemm(a, b, buf[4:12].reshape(2, 4))
    with pytest.raises(ValueError, match="non-negative strides"):
        plan_gemm(a[::-1], b, np.zeros((2, 4), np.float32))
    rows_overlap = fake((2, 4), strides=(8, 4), ptr=1 << 20)
    with pytest.raises(ValueError, match="rows overlap"):
        plan_gemm(fake((2, 3)), fake((3, 4), ptr=1 << 21), rows_overlap)
    batch_overlap = fake((3, 2, 4), strides=(16, 16, 4), ptr=1 << 20)
    with pytest.raises(ValueError, match="matrices of out .* overlap each other"):
        plan_gemm(fake((2, 3)), fake((3, 4), ptr=1 << 21), batch_overlap, batched=True)


def test_sizes_beyond_32_bits_are_refused():
    big = fake((2, 1 << 31), ptr=0)
    with pytest.raises(ValueError, match="32-bit"):
        plan_gemm(big, fake((1 << 31, 1), ptr=1 << 40), fake((2, 1), ptr=1 << 41))


def test_empty_products_plan_nothing_to_overlap():
    call = plan_gemm(np.zeros((0, 3), np.float32), np.zeros((3, 4), np.float32),
                     np.zeros((0, 4), np.float32))
    assert call.n == 0


# ===================================================================== GPU
@pytest.fixture
def cb(cp):
    if not cublas.enabled_for(cp):
        pytest.fail("minicaffe.cublas is not usable on this GPU machine: "
                    + cublas.unavailable_reason(cp))
    return cublas


def _dev(cp, a):
    return cp.asarray(a)


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("trans_a", [False, True])
@pytest.mark.parametrize("trans_b", [False, True])
def test_gemm_matches_numpy(cp, cb, dtype, trans_a, trans_b, rng):
    m, k, n = 37, 19, 23
    a = rng.standard_normal((k, m) if trans_a else (m, k)).astype(dtype)
    b = rng.standard_normal((n, k) if trans_b else (k, n)).astype(dtype)
    c = rng.standard_normal((m, n)).astype(dtype)
    tol = 1e-5 if dtype == np.float32 else 1e-12
    ref = op(a, trans_a).astype(np.float64) @ op(b, trans_b)
    out = _dev(cp, c)
    cb.gemm(_dev(cp, a), _dev(cp, b), out, trans_a, trans_b, alpha=1.5, beta=0.5)
    np.testing.assert_allclose(out.get(), 1.5 * ref + 0.5 * c, rtol=tol, atol=tol * 10)
    out = cp.full((m, n), np.nan, dtype)  # beta = 0 never reads out
    cb.gemm(_dev(cp, a), _dev(cp, b), out, trans_a, trans_b)
    np.testing.assert_allclose(out.get(), ref, rtol=tol, atol=tol * 10)


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("trans_a", [False, True])
@pytest.mark.parametrize("trans_b", [False, True])
@pytest.mark.parametrize("shared", ["none", "a", "b"])
def test_gemm_strided_batched_matches_numpy(cp, cb, dtype, trans_a, trans_b, shared, rng):
    B, G, m, k, n = 5, 3, 17, 11, 13
    sa = (k, m) if trans_a else (m, k)
    sb = (n, k) if trans_b else (k, n)
    a4 = _dev(cp, rng.standard_normal((B, G) + sa).astype(dtype))
    b4 = _dev(cp, rng.standard_normal((B, G) + sb).astype(dtype))
    a = a4[0, 0] if shared == "a" else a4[:, 1]
    b = b4[0, 0] if shared == "b" else b4[:, 2]
    y = _dev(cp, rng.standard_normal((B, G, m, n)).astype(dtype))
    before = y.get()
    ref = op(a.get(), trans_a).astype(np.float64) @ op(b.get(), trans_b)
    cb.gemm_strided_batched(a, b, y[:, 1], trans_a, trans_b, alpha=2.0, beta=1.0)
    tol = 1e-5 if dtype == np.float32 else 1e-12
    got = y.get()
    np.testing.assert_allclose(got[:, 1], 2.0 * ref + before[:, 1], rtol=tol, atol=tol * 10)
    np.testing.assert_array_equal(got[:, [0, 2]], before[:, [0, 2]])  # the other groups untouched


@pytest.mark.gpu
def test_gemm_refuses_host_arrays(cp, cb):
    with pytest.raises(TypeError, match="a must be a cupy.ndarray"):
        cb.gemm(np.zeros((2, 3), np.float32), cp.zeros((3, 4), np.float32),
                cp.zeros((2, 4), np.float32))


@pytest.mark.gpu
def test_gemm_follows_the_current_stream(cp, cb, rng):
    """Issued on a non-blocking stream behind a long kernel: a GEMM that ran on another
    stream would read the inputs before they are written."""
    a = rng.standard_normal((256, 512)).astype(np.float32)
    b = rng.standard_normal((512, 128)).astype(np.float32)
    s = cp.cuda.Stream(non_blocking=True)
    with s:
        da, db = cp.zeros_like(_dev(cp, a)), cp.zeros_like(_dev(cp, b))
        big = cp.ones(1 << 24, cp.float32)
        for _ in range(20):
            big = big * 1.0000001  # keeps the stream busy
        da[...] = _dev(cp, a)
        db[...] = _dev(cp, b)
        out = cp.empty((256, 128), cp.float32)
        cb.gemm(da, db, out)
    s.synchronize()
    np.testing.assert_allclose(out.get(), a.astype(np.float64) @ b, rtol=1e-4, atol=1e-3)


@pytest.mark.gpu
def test_gemm_is_captured_in_a_cuda_graph_and_replayed(cp, cb, rng):
    """Captured on a non-blocking stream after one eager call made the stream's
    workspace; the replay reads the inputs' memory at launch time, and an
    accumulating GEMM (beta = 1) accumulates once per replay."""
    m, k, n = 64, 48, 32
    a = _dev(cp, rng.standard_normal((m, k)).astype(np.float32))
    w = _dev(cp, rng.standard_normal((n, k)).astype(np.float32))
    y = cp.zeros((m, n), cp.float32)
    acc = cp.zeros((n, k), cp.float32)
    z = cp.zeros((3, m, n), cp.float32)
    s = cp.cuda.Stream(non_blocking=True)
    with s:
        cb.prepare()
        s.begin_capture()
        cb.gemm(a, w, y, trans_b=True)                            # y = a w^T
        cb.gemm(y, a, acc, trans_a=True, beta=1.0)                # acc += y^T a
        cb.gemm_strided_batched(a, w, z, trans_b=True)            # z[i] = a w^T, both shared
        graph = s.end_capture()
        new_a = rng.standard_normal((m, k)).astype(np.float32)
        a[...] = _dev(cp, new_a)     # after the capture: the replays must see it
        graph.launch(s)
        graph.launch(s)
    s.synchronize()
    A, W = new_a.astype(np.float64), w.get().astype(np.float64)
    Y = A @ W.T
    np.testing.assert_allclose(y.get(), Y, rtol=1e-4, atol=1e-3)
    np.testing.assert_allclose(acc.get(), 2 * (Y.T @ A), rtol=1e-4, atol=1e-2)
    np.testing.assert_allclose(z.get(), np.broadcast_to(Y, (3, m, n)), rtol=1e-4, atol=1e-3)


@pytest.mark.gpu
def test_first_gemm_on_a_stream_under_capture_is_a_clear_error(cp, cb):
    a = cp.ones((4, 4), cp.float32)
    out = cp.zeros((4, 4), cp.float32)
    s = cp.cuda.Stream(non_blocking=True)  # no eager call on it yet: no workspace
    with s:
        s.begin_capture()
        try:
            out += 1  # something in the graph
            with pytest.raises(CublasError, match="during stream capture"):
                cb.gemm(a, a, out)
        finally:
            s.end_capture()


@pytest.mark.gpu
def test_handles_keep_float32_exact(cp, cb, rng):
    """No TF32: a product whose float32 inputs carry more than TF32's 10 mantissa bits
    agrees with float64 to float32 rounding, not to TF32's ~1e-3."""
    a = (1 + rng.random((64, 256)) * 2 ** -12).astype(np.float32)
    b = (1 + rng.random((256, 64)) * 2 ** -12).astype(np.float32)
    out = cp.empty((64, 64), cp.float32)
    cb.gemm(_dev(cp, a), _dev(cp, b), out)
    ref = a.astype(np.float64) @ b
    # TF32 would round every input to 1.0: a relative error of 2.4e-4
    assert np.abs(out.get() - ref).max() / np.abs(ref).max() < 2e-5

