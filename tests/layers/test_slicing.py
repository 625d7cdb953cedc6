"""Slice and Tile: shapes along any axis, slice_point vs an equal split, legacy slice_dim,
gradients, Caffe's errors, declarations, GPU parity."""
import numpy as np
import pytest

from minicaffe.backend import to_numpy
from minicaffe.blob import Blob
from minicaffe.layer import BackwardReads
from minicaffe.testing import check_gradient, make_blob, make_layer


def slice_text(params=""):
    return f'name: "sl" type: "Slice" slice_param {{ {params} }}'


def tile_text(params=""):
    return f'name: "tl" type: "Tile" tile_param {{ {params} }}'


def setup(text, shape, n_top, rng, xp=np, dtype=np.float64):
    layer = make_layer(text, xp=xp, dtype=dtype)
    bottom = [make_blob(rng.standard_normal(shape), xp=xp, dtype=dtype, name="in")]
    top = [Blob(xp=xp, dtype=dtype, name=f"out{i}") for i in range(n_top)]
    layer.setup(bottom, top)
    return layer, bottom, top


# ------------------------------------------------------------------ Slice
@pytest.mark.parametrize("params,shape,n_top,axis,cuts", [
    ("slice_point: 1 slice_point: 3", (2, 5, 3), 3, 1, [1, 3]),
    ("", (2, 6, 3), 3, 1, [2, 4]),                          # equal split of the channels
    ("axis: 0 slice_point: 2", (5, 3), 2, 0, [2]),
    ("axis: -1", (2, 3, 4), 2, 2, [2]),
    ("slice_dim: 0", (4, 3), 2, 0, [2]),                    # legacy slice_dim
    ("slice_dim: 2 slice_point: 1", (2, 3, 4), 2, 2, [1]),
])
def test_slice_forward_matches_numpy(params, shape, n_top, axis, cuts, rng):
    layer, bottom, top = setup(slice_text(params), shape, n_top, rng)
    layer.forward(bottom, top)
    expected = np.split(to_numpy(bottom[0].data), cuts, axis=axis)
    assert [t.shape for t in top] == [e.shape for e in expected]
    for t, e in zip(top, expected):
        np.testing.assert_array_equal(to_numpy(t.data), e)
    assert layer.backward_reads() == BackwardReads()
    assert layer.internals == {}


def test_slice_backward_puts_each_diff_in_place(rng):
    layer, bottom, top = setup(slice_text("slice_point: 1 slice_point: 4"), (2, 6, 2), 3, rng)
    layer.forward(bottom, top)
    dys = [rng.standard_normal(t.shape) for t in top]
    for t, d in zip(top, dys):
        t.diff[...] = d
    layer.backward(top, [True], bottom)
    np.testing.assert_array_equal(to_numpy(bottom[0].diff), np.concatenate(dys, axis=1))
    bottom[0].diff[...] = 42.0
    layer.backward(top, [False], bottom)
    np.testing.assert_array_equal(to_numpy(bottom[0].diff), 42.0)


@pytest.mark.parametrize("params,shape,n_top", [
    ("slice_point: 1 slice_point: 3", (2, 4, 2), 3),
    ("axis: 0", (4, 3), 2),
    ("axis: -1 slice_point: 1", (2, 2, 3), 2),
])
def test_slice_gradient(params, shape, n_top, rng):
    layer = make_layer(slice_text(params))
    top = [Blob(dtype=np.float64, name=f"out{i}") for i in range(n_top)]
    check_gradient(layer, [make_blob(rng.standard_normal(shape))], top)


def test_slice_single_top_shares_storage(rng):
    layer, bottom, top = setup(slice_text(), (2, 3), 1, rng)
    layer.forward(bottom, top)
    assert top[0].data_storage is bottom[0].data_storage
    assert top[0].diff_storage is bottom[0].diff_storage
    assert layer.flops(bottom, top) == (0.0, 0.0)         # shared: nothing is copied


def test_slice_flops_count_the_elements_copied(rng):
    """The performance model's work for a copy: the bottom's elements each way."""
    layer, bottom, top = setup(slice_text("slice_point: 1"), (4, 3, 2), 2, rng)
    assert layer.flops(bottom, top) == (24.0, 24.0)


def test_slice_point_at_the_end_gives_an_empty_top(rng):
    """Caffe: the last extent is D - last point, 0 when the point is D (the counts still add
    up, so Caffe's CHECK_EQ passes)."""
    layer, bottom, top = setup(slice_text("slice_point: 3"), (2, 3), 2, rng)
    layer.forward(bottom, top)
    assert top[0].shape == (2, 3) and top[1].shape == (2, 0)
    np.testing.assert_array_equal(to_numpy(top[0].data), to_numpy(bottom[0].data))


@pytest.mark.parametrize("params,shape,n_top,match", [
    ("axis: 1 slice_dim: 1", (2, 4), 2, "either axis or slice_dim"),
    ("slice_point: 1", (2, 4), 3, r"1 slice_point\(s\) \[1\] need 2 tops, got 3"),
    ("", (2, 5), 2, r"number of top blobs \(2\) should evenly divide input slice axis \(5"),
    ("slice_point: 2 slice_point: 2", (2, 4), 3, "strictly increasing"),
    ("slice_point: 0", (2, 4), 2, "strictly increasing and positive"),
    ("slice_point: 5", (2, 4), 2, "past the end of axis 1"),
    ("slice_point: 1 slice_point: 2", (2, 2), 3, "3 tops cannot slice axis 1 of extent 2"),
    ("axis: 2", (2, 4), 2, "axis 2 out of range for bottom 'in'"),
    ("slice_dim: 2", (2, 4), 2, "slice_dim 2 out of range"),
])
def test_slice_errors(params, shape, n_top, match, rng):
    with pytest.raises(ValueError, match=match) as e:
        setup(slice_text(params), shape, n_top, rng)
    assert "'sl'" in str(e.value)


# ------------------------------------------------------------------- Tile
@pytest.mark.parametrize("params,shape,reps", [
    ("tiles: 2", (2, 3, 2), (1, 2, 1)),
    ("axis: 0 tiles: 3", (2, 3), (3, 1)),
    ("axis: -1 tiles: 4", (2, 1, 3), (1, 1, 4)),
])
def test_tile_forward_matches_numpy_and_torch(params, shape, reps, rng):
    layer, bottom, top = setup(tile_text(params), shape, 1, rng)
    layer.forward(bottom, top)
    x = to_numpy(bottom[0].data)
    np.testing.assert_array_equal(to_numpy(top[0].data), np.tile(x, reps))
    assert layer.backward_reads() == BackwardReads()
    dy = rng.standard_normal(top[0].shape)
    top[0].diff[...] = dy
    layer.backward(top, [True], bottom)
    torch = pytest.importorskip("torch")
    tx = torch.tensor(x, requires_grad=True)
    ty = tx.repeat(*reps)
    np.testing.assert_array_equal(ty.detach().numpy(), to_numpy(top[0].data))
    ty.backward(torch.tensor(dy))
    np.testing.assert_allclose(to_numpy(bottom[0].diff), tx.grad.numpy(), rtol=1e-12)


@pytest.mark.parametrize("params,shape", [("tiles: 3", (2, 2, 2)), ("axis: 0 tiles: 2", (3, 2))])
def test_tile_gradient(params, shape, rng):
    check_gradient(make_layer(tile_text(params)), [make_blob(rng.standard_normal(shape))])


@pytest.mark.parametrize("params,match", [
    ("axis: 1", "number of tiles must be specified"),
    ("tiles: 0", "number of tiles must be positive, got 0"),
    ("axis: 3 tiles: 2", "axis 3 out of range for bottom 'in'"),
])
def test_tile_errors(params, match, rng):
    with pytest.raises(ValueError, match=match) as e:
        setup(tile_text(params), (2, 3), 1, rng)
    assert "'tl'" in str(e.value)


# -------------------------------------------------------------------- GPU
def rel_err(a, b):
    return float(np.max(np.abs(a - b)) / max(np.max(np.abs(b)), 1e-30))


@pytest.mark.gpu
@pytest.mark.parametrize("text,n_top", [
    (slice_text("slice_point: 1 slice_point: 5"), 3), (slice_text("axis: -1"), 2),
    (tile_text("tiles: 3"), 1), (tile_text("axis: 0 tiles: 2"), 1)])
def test_gpu_matches_cpu(cp, text, n_top):
    outs = []
    for xp in (np, cp):
        r = np.random.default_rng(2)
        layer, bottom, top = setup(text, (4, 8, 5, 6), n_top, r, xp=xp, dtype=np.float32)
        layer.forward(bottom, top)
        for t in top:
            t.diff[...] = xp.asarray(r.standard_normal(t.shape), dtype=np.float32)
        layer.backward(top, [True], bottom)
        outs.append([to_numpy(t.data) for t in top] + [to_numpy(bottom[0].diff)])
    for c, g in zip(*outs):
        assert rel_err(g, c) <= 1e-6
