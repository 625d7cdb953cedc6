"""The channel-walking LRN kernels against the per-element ones (GPU)."""
import numpy as np
import pytest

from minicaffe.kernels import cuda_vision


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("size", [3, 5, 7])
@pytest.mark.parametrize("shape", [(2, 1, 3, 4), (2, 4, 5, 3), (3, 16, 7, 9)])
def test_walking_lrn_gives_the_per_element_bits(cp, shape, size, dtype, rng, monkeypatch):
    x = cp.asarray(rng.standard_normal(shape).astype(dtype))
    td = cp.asarray(rng.standard_normal(shape).astype(dtype))
    alpha, beta, k = 1e-4 * 7, 0.75, 2.0

    def run():
        scale, top, bd = (cp.full(shape, 9.0, dtype=dtype) for _ in range(3))
        cuda_vision.lrn_across_forward(x, scale, top, size, alpha, beta, k)
        cuda_vision.lrn_across_backward(x, top, scale, td, bd, size, alpha, beta)
        return [cp.asnumpy(a) for a in (scale, top, bd)]

    assert cuda_vision._walk_name("lrn_across_walk_forward", np.dtype(dtype), size, 10)
    got = run()
    monkeypatch.setattr(cuda_vision, "LRN_WALK_SIZES", ())
    ref = run()
    for g, r in zip(got, ref):
        np.testing.assert_array_equal(g, r)
    # and Caffe's formula, on the host
    xs = cp.asnumpy(x).astype(np.float64)
    pad = np.pad(xs ** 2, ((0, 0), ((size - 1) // 2, size // 2), (0, 0), (0, 0)))
    win = sum(pad[:, i:i + shape[1]] for i in range(size))
    scale = k + alpha / size * win
    tol = 1e-5 if dtype == np.float32 else 1e-12
    np.testing.assert_allclose(got[0], scale, rtol=tol)
    np.testing.assert_allclose(got[1], xs * scale ** -beta, rtol=tol, atol=tol)
