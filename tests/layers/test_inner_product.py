"""InnerProduct: shapes, axis, transpose, fillers, gradients, flops, GPU parity."""
import numpy as np
import pytest

import minicaffe.layers  # noqa: F401  (registers the layer types)
from minicaffe.backend import to_numpy
from minicaffe.blob import Blob
from minicaffe.layer import BackwardReads
from minicaffe.testing import check_gradient, make_blob, make_layer


def ip_text(params="num_output: 4"):
    return ('name: "ip" type: "InnerProduct" inner_product_param { '
            f'{params} weight_filler {{ type: "gaussian" std: 0.5 }} '
            'bias_filler { type: "uniform" min: -1 max: 1 } }')


def setup(text, shape, rng, xp=np, dtype=np.float64):
    layer = make_layer(text, xp=xp, dtype=dtype)
    bottom = [make_blob(rng.standard_normal(shape), xp=xp, dtype=dtype, name="x")]
    top = [Blob(xp=xp, dtype=dtype, name="y")]
    layer.setup(bottom, top)
    return layer, bottom, top


@pytest.mark.parametrize("params,shape,wshape,tshape", [
    ("num_output: 4", (2, 3, 2, 2), (4, 12), (2, 4)),
    ("num_output: 4 transpose: true", (2, 3, 2, 2), (12, 4), (2, 4)),
    ("num_output: 5 axis: 2", (2, 3, 2, 2), (5, 4), (2, 3, 5)),
    ("num_output: 5 axis: -1", (2, 3, 2), (5, 2), (2, 3, 5)),
    ("num_output: 3 axis: 0", (2, 3), (3, 6), (3,)),
])
def test_shapes_and_forward(params, shape, wshape, tshape, rng):
    layer, bottom, top = setup(ip_text(params), shape, rng)
    assert layer.blobs[0].shape == wshape
    assert layer.blobs[1].shape == (wshape[1] if "transpose" in params else wshape[0],)
    assert top[0].shape == tshape
    layer.forward(bottom, top)
    w = to_numpy(layer.blobs[0].data)
    w = w.T if "transpose" in params else w
    n = w.shape[0]
    x = to_numpy(bottom[0].data).reshape(-1, w.shape[1])
    expected = (x @ w.T + to_numpy(layer.blobs[1].data)).reshape(tshape)
    np.testing.assert_allclose(to_numpy(top[0].data), expected, rtol=1e-12)
    assert tshape[-1] == n


@pytest.mark.parametrize("params,shape", [
    ("num_output: 4", (2, 3, 2, 2)),
    ("num_output: 4 transpose: true", (2, 3, 2)),
    ("num_output: 3 axis: 2", (2, 2, 3)),
    ("num_output: 3 bias_term: false", (3, 4)),
])
def test_gradient(params, shape, rng):
    layer = make_layer(ip_text(params))
    check_gradient(layer, [make_blob(rng.standard_normal(shape))])


def test_against_torch_linear(rng):
    torch = pytest.importorskip("torch")
    layer, bottom, top = setup(ip_text("num_output: 6"), (5, 2, 2, 2), rng)
    layer.forward(bottom, top)
    dy = rng.standard_normal((5, 6))
    top[0].diff[...] = dy
    layer.backward(top, [True], bottom)
    tx = torch.tensor(to_numpy(bottom[0].data), requires_grad=True)
    tw = torch.tensor(to_numpy(layer.blobs[0].data), requires_grad=True)
    tb = torch.tensor(to_numpy(layer.blobs[1].data), requires_grad=True)
    ty = torch.nn.functional.linear(tx.flatten(1), tw, tb)
    ty.backward(torch.tensor(dy))
    for mine, ref in ((top[0].data, ty.detach()), (bottom[0].diff, tx.grad),
                      (layer.blobs[0].diff, tw.grad), (layer.blobs[1].diff, tb.grad)):
        np.testing.assert_allclose(to_numpy(mine), ref.numpy(), rtol=1e-12, atol=1e-12)


def test_default_fillers_are_zero(rng):
    layer, _, _ = setup('name: "ip" type: "InnerProduct" inner_product_param { num_output: 2 }',
                        (3, 4), rng)
    for b in layer.blobs:
        np.testing.assert_array_equal(to_numpy(b.data), 0)


def test_param_diffs_accumulate(rng):
    layer, bottom, top = setup(ip_text(), (2, 3), rng)
    layer.forward(bottom, top)
    top[0].diff[...] = rng.standard_normal(top[0].shape)
    layer.backward(top, [True], bottom)
    w1, b1, x1 = (to_numpy(a).copy() for a in (layer.blobs[0].diff, layer.blobs[1].diff,
                                               bottom[0].diff))
    layer.backward(top, [True], bottom)
    np.testing.assert_allclose(to_numpy(layer.blobs[0].diff), 2 * w1)
    np.testing.assert_allclose(to_numpy(layer.blobs[1].diff), 2 * b1)
    np.testing.assert_allclose(to_numpy(bottom[0].diff), x1)  # bottom diff overwritten


def test_backward_reads_and_flops(rng):
    layer, bottom, top = setup(ip_text("num_output: 4"), (2, 3, 5), rng)
    assert layer.backward_reads() == BackwardReads(bottom=(0,))
    layer.param_propagate_down = [False, True]  # frozen weights: x not needed
    assert layer.backward_reads() == BackwardReads()
    fwd, bwd = layer.flops(bottom, top)
    assert fwd == 2 * 2 * 15 * 4 + 2 * 4
    assert bwd == 2 * (2 * 2 * 15 * 4) + 2 * 4


def test_input_size_mismatch_on_reshape(rng):
    layer, bottom, top = setup(ip_text(), (2, 3, 2), rng)
    bottom[0].reshape(2, 4, 2)
    with pytest.raises(ValueError, match="incompatible"):
        layer.reshape(bottom, top)
    bottom[0].reshape(7, 3, 2)  # a new batch size is fine
    layer.reshape(bottom, top)
    assert top[0].shape == (7, 4)


def test_bad_params(rng):
    with pytest.raises(ValueError, match="num_output"):
        setup(ip_text("num_output: 0"), (2, 3), rng)
    with pytest.raises(ValueError, match="axis 3 out of range"):
        setup(ip_text("num_output: 2 axis: 3"), (2, 3), rng)


def rel_err(a, b):
    return float(np.max(np.abs(a - b)) / max(np.max(np.abs(b)), 1e-30))


@pytest.mark.gpu
@pytest.mark.parametrize("params", ["num_output: 32", "num_output: 32 transpose: true",
                                    "num_output: 16 axis: 2"])
def test_gpu_matches_cpu(cp, params):
    shape = (16, 8, 6, 6)
    dy = None
    outs = []
    for xp in (np, cp):
        r = np.random.default_rng(11)
        layer, bottom, top = setup(ip_text(params), shape, r, xp=xp, dtype=np.float32)
        for p in layer.blobs:  # same weights on both
            p.data[...] = xp.asarray(r.standard_normal(p.shape), dtype=np.float32)
        layer.forward(bottom, top)
        if dy is None:
            dy = r.standard_normal(top[0].shape).astype(np.float32)
        top[0].diff[...] = xp.asarray(dy)
        layer.backward(top, [True], bottom)
        outs.append([to_numpy(a) for a in (top[0].data, bottom[0].diff, layer.blobs[0].diff,
                                           layer.blobs[1].diff)])
    for c, g in zip(*outs):
        assert rel_err(g, c) <= 1e-5


# ------------------------------------------------------- the cuBLAS branch
IP_CASES = [("num_output: 4", (3, 2, 2, 2)), ("num_output: 4 transpose: true", (3, 2, 2, 2)),
            ("num_output: 5 axis: 2", (2, 3, 2, 2)), ("num_output: 3 axis: 0", (2, 3)),
            ("num_output: 1", (1, 5))]


def _ip_run(params, shape, calls=2):
    """Forward, then ``calls`` backward passes from zeroed param diffs: copies of the
    top, the bottom diff and the param diffs."""
    from minicaffe.rng import set_random_seed
    set_random_seed(3)  # the weight fillers draw the same weights each run
    r = np.random.default_rng(3)
    layer, bottom, top = setup(ip_text(params), shape, r)
    layer.forward(bottom, top)
    top[0].diff[...] = r.standard_normal(top[0].shape)
    for p in layer.blobs:
        p.diff[...] = 0
    for _ in range(calls):
        layer.backward(top, [True], bottom)
    return [to_numpy(a).copy() for a in (top[0].data, bottom[0].diff, layer.blobs[0].diff,
                                         layer.blobs[1].diff)]


@pytest.mark.parametrize("params,shape", IP_CASES)
def test_cublas_branch_computes_the_numpy_branch(params, shape, monkeypatch):
    """The GPU's cuBLAS calls (planned by minicaffe.cublas, run on the host by
    minicaffe.testing.cublas_host) give the NumPy path's numbers, param diffs
    accumulating over two backward passes."""
    from minicaffe.testing.cublas_host import on_host
    ref = _ip_run(params, shape)
    with on_host(monkeypatch) as calls:
        got = _ip_run(params, shape)
    assert calls == ["gemm"] * 5  # forward; per backward the weight and the bottom diff
    for g, c in zip(got, ref):
        np.testing.assert_allclose(g, c, rtol=1e-12, atol=1e-12)


def test_cublas_branch_gradient(rng, monkeypatch):
    from minicaffe.testing.cublas_host import on_host
    with on_host(monkeypatch):
        layer, bottom, top = setup(ip_text("num_output: 3 transpose: true"), (2, 3, 2), rng)
        check_gradient(layer, bottom)


@pytest.mark.gpu
@pytest.mark.parametrize("params", ["num_output: 32", "num_output: 32 transpose: true",
                                    "num_output: 16 axis: 2"])
@pytest.mark.parametrize("path", ["cublas", "cupy"])
def test_gpu_gemm_paths_match_cpu(cp, params, path):
    """Both GPU paths (minicaffe.cublas, and CuPy's matmul where it does not load)
    against the CPU, with two backward passes (param diffs accumulate)."""
    import contextlib
    from minicaffe import cublas
    if path == "cublas" and not cublas.enabled_for(cp):
        pytest.fail("minicaffe.cublas is not usable here: " + cublas.unavailable_reason(cp))
    shape = (16, 8, 6, 6)
    outs = []
    for xp in (np, cp):
        r = np.random.default_rng(11)
        ctx = cublas.disabled() if path == "cupy" else contextlib.nullcontext()
        with ctx:
            layer, bottom, top = setup(ip_text(params), shape, r, xp=xp, dtype=np.float32)
            for p in layer.blobs:
                p.data[...] = xp.asarray(r.standard_normal(p.shape), dtype=np.float32)
                p.diff[...] = 0
            layer.forward(bottom, top)
            top[0].diff[...] = xp.asarray(r.standard_normal(top[0].shape), dtype=np.float32)
            bottom[0].diff[...] = np.nan  # overwritten, never read
            layer.backward(top, [True], bottom)
            layer.backward(top, [True], bottom)
        outs.append([to_numpy(a) for a in (top[0].data, bottom[0].diff, layer.blobs[0].diff,
                                           layer.blobs[1].diff)])
    for c, g in zip(*outs):
        assert rel_err(g, c) <= 1e-5
