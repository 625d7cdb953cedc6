"""BatchNorm: batch statistics, running averages, global-stats mode, gradients, in place."""
import numpy as np
import pytest

import minicaffe.layers  # noqa: F401  (registers the layer types)
from minicaffe.backend import to_numpy
from minicaffe.blob import Blob
from minicaffe.layer import BackwardReads
from minicaffe.proto import caffe_pb2
from minicaffe.testing import check_gradient, make_blob, make_layer

BN = 'name: "bn" type: "BatchNorm"'
SHAPE = (3, 2, 2, 3)
EPS = float(np.float32(1e-5))  # the proto field is a float


def build(text=BN, shape=SHAPE, phase=caffe_pb2.TRAIN, in_place=False, xp=np,
          dtype=np.float64):
    layer = make_layer(text, xp=xp, dtype=dtype, phase=phase)
    bottom = Blob(shape, xp=xp, dtype=dtype, name="x")
    top = bottom if in_place else Blob(xp=xp, dtype=dtype, name="y")
    layer.setup([bottom], [top])
    return layer, bottom, top


def run(layer, bottom, top, x, dy):
    bottom.data[...] = layer.xp.asarray(x, dtype=layer.dtype)
    layer.forward([bottom], [top])
    y = to_numpy(top.data).copy()
    top.diff[...] = layer.xp.asarray(dy, dtype=layer.dtype)
    layer.backward([top], [True], [bottom])
    return y, to_numpy(bottom.diff).copy()


def reference_forward(x, mean, var, eps=EPS):
    return (x - mean[None, :, None, None]) / np.sqrt(var[None, :, None, None] + eps)


# ------------------------------------------------------------------- set up
def test_blobs_and_param_specs():
    layer, _, _ = build()
    assert [b.shape for b in layer.blobs] == [(2,), (2,), (1,)]
    assert all(not to_numpy(b.data).any() for b in layer.blobs)
    assert layer.param_propagate_down == [False, False, False]
    # Caffe masks the statistics from the solver with lr_mult 0.
    assert [p.lr_mult for p in layer.param.param] == [0, 0, 0]


def test_nonzero_lr_mult_is_refused():
    layer = make_layer(BN + " param { lr_mult: 1 }")
    with pytest.raises(ValueError, match="lr_mult"):
        layer.setup([Blob(SHAPE)], [Blob()])


def test_channel_mismatch_on_reshape():
    layer, bottom, top = build()
    bottom.reshape(3, 5, 2, 2)
    with pytest.raises(ValueError, match="5 channels"):
        layer.reshape([bottom], [top])


def test_use_global_stats_default_follows_phase():
    assert not build(phase=caffe_pb2.TRAIN)[0].use_global_stats
    assert build(phase=caffe_pb2.TEST)[0].use_global_stats
    text = BN + " batch_norm_param { use_global_stats: false }"
    assert not build(text, phase=caffe_pb2.TEST)[0].use_global_stats


def test_declared_internals():
    layer, _, _ = build()
    assert layer.backward_reads() == BackwardReads(internals=("x_norm", "std"))
    assert layer.internals["x_norm"].saved and layer.internals["x_norm"].blob.shape == SHAPE
    assert layer.internals["std"].saved and not layer.internals["std"].batch_scaled
    assert not layer.internals["temp"].saved
    layer, _, _ = build(phase=caffe_pb2.TEST)
    assert layer.backward_reads() == BackwardReads(internals=("std",))
    assert set(layer.internals) == {"std"}


# ------------------------------------------------------------------ forward
def test_train_forward_and_gradient_against_torch(rng):
    torch = pytest.importorskip("torch")
    x = rng.standard_normal(SHAPE) * 3 + 1
    dy = rng.standard_normal(SHAPE)
    layer, bottom, top = build()
    y, dx = run(layer, bottom, top, x, dy)
    tx = torch.tensor(x, requires_grad=True)
    rm, rv = torch.zeros(2, dtype=torch.float64), torch.ones(2, dtype=torch.float64)
    ty = torch.nn.functional.batch_norm(tx, rm, rv, training=True, momentum=1.0, eps=EPS)
    ty.backward(torch.tensor(dy))
    np.testing.assert_allclose(y, ty.detach().numpy(), rtol=1e-10, atol=1e-12)
    np.testing.assert_allclose(dx, tx.grad.numpy(), rtol=1e-9, atol=1e-12)
    # momentum 1 leaves torch's running stats at the batch mean and unbiased variance,
    # which is what Caffe accumulates in one step from zero.
    s = to_numpy(layer.blobs[2].data)[0]
    np.testing.assert_allclose(to_numpy(layer.blobs[0].data) / s, rm.numpy(), rtol=1e-12)
    np.testing.assert_allclose(to_numpy(layer.blobs[1].data) / s, rv.numpy(), rtol=1e-12)


def test_running_statistics_two_iterations():
    """Hand-computed: maf 0.5, one channel, batches {0, 2} and {1, 5}."""
    text = BN + " batch_norm_param { moving_average_fraction: 0.5 eps: 0 }"
    layer, bottom, top = build(text, shape=(2, 1))
    run(layer, bottom, top, [[0.0], [2.0]], np.zeros((2, 1)))
    # mean 1, biased var 1, m = 2 so the unbiased var is 2.
    np.testing.assert_allclose(to_numpy(layer.blobs[2].data), [1.0])
    np.testing.assert_allclose(to_numpy(layer.blobs[0].data), [1.0])
    np.testing.assert_allclose(to_numpy(layer.blobs[1].data), [2.0])
    y, _ = run(layer, bottom, top, [[1.0], [5.0]], np.zeros((2, 1)))
    # batch 2: mean 3, biased var 4 -> y = (x - 3) / 2; unbiased var 8.
    np.testing.assert_allclose(y, [[-1.0], [1.0]])
    np.testing.assert_allclose(to_numpy(layer.blobs[2].data), [0.5 * 1 + 1])
    np.testing.assert_allclose(to_numpy(layer.blobs[0].data), [0.5 * 1 + 3])
    np.testing.assert_allclose(to_numpy(layer.blobs[1].data), [0.5 * 2 + 8])
    # A TEST layer with these blobs uses mean 3.5 / 1.5 and var 9 / 1.5 = 6.
    test_layer, tb, tt = build(text, shape=(2, 1), phase=caffe_pb2.TEST)
    for dst, src in zip(test_layer.blobs, layer.blobs):
        dst.data[...] = src.data
    y, _ = run(test_layer, tb, tt, [[0.0], [7.0]], np.zeros((2, 1)))
    np.testing.assert_allclose(y, (np.array([[0.0], [7.0]]) - 3.5 / 1.5) / np.sqrt(6.0))


def test_running_statistics_default_fraction(rng):
    layer, bottom, top = build()
    xs = [rng.standard_normal(SHAPE) + i for i in range(3)]
    s, msum, vsum = 0.0, np.zeros(2), np.zeros(2)
    m = SHAPE[0] * SHAPE[2] * SHAPE[3]
    maf = float(np.float32(0.999))  # the proto field is a float
    for x in xs:
        run(layer, bottom, top, x, np.zeros(SHAPE))
        s = maf * s + 1
        msum = maf * msum + x.mean(axis=(0, 2, 3))
        vsum = maf * vsum + x.var(axis=(0, 2, 3)) * m / (m - 1)
    np.testing.assert_allclose(to_numpy(layer.blobs[2].data), [s], rtol=1e-12)
    np.testing.assert_allclose(to_numpy(layer.blobs[0].data), msum, rtol=1e-12)
    np.testing.assert_allclose(to_numpy(layer.blobs[1].data), vsum, rtol=1e-12)


def test_global_stats_forward_backward(rng):
    layer, bottom, top = build(phase=caffe_pb2.TEST)
    layer.blobs[0].data[...] = [2.0, -4.0]
    layer.blobs[1].data[...] = [8.0, 0.5]
    layer.blobs[2].data[...] = 2.0
    x = rng.standard_normal(SHAPE)
    dy = rng.standard_normal(SHAPE)
    y, dx = run(layer, bottom, top, x, dy)
    mean, var = np.array([1.0, -2.0]), np.array([4.0, 0.25])
    np.testing.assert_allclose(y, reference_forward(x, mean, var), rtol=1e-12)
    np.testing.assert_allclose(dx, dy / np.sqrt(var + EPS)[None, :, None, None], rtol=1e-12)
    # the statistics are read, never updated
    np.testing.assert_array_equal(to_numpy(layer.blobs[2].data), [2.0])


def test_global_stats_with_zero_scale_factor_uses_zero_statistics(rng):
    layer, bottom, top = build(phase=caffe_pb2.TEST)
    layer.blobs[0].data[...] = 5.0  # ignored: the scale factor is 0
    x = rng.standard_normal(SHAPE)
    y, _ = run(layer, bottom, top, x, np.zeros(SHAPE))
    np.testing.assert_allclose(y, x / np.sqrt(EPS), rtol=1e-12)


def test_eps_and_two_dimensional_input(rng):
    text = BN + " batch_norm_param { eps: 0.5 }"
    x = rng.standard_normal((5, 4))
    layer, bottom, top = build(text, shape=(5, 4))
    y, _ = run(layer, bottom, top, x, np.zeros((5, 4)))
    np.testing.assert_allclose(y, (x - x.mean(0)) / np.sqrt(x.var(0) + 0.5), rtol=1e-12)


# ---------------------------------------------------------------- gradients
@pytest.mark.parametrize("shape", [SHAPE, (4, 3)])
def test_gradient_train(shape, rng):
    layer = make_layer(BN, phase=caffe_pb2.TRAIN)
    check_gradient(layer, [make_blob(rng.standard_normal(shape) * 2 + 0.5)], rtol=1e-5,
                   atol=1e-6)


def test_gradient_global_stats(rng):
    layer = make_layer(BN, phase=caffe_pb2.TEST)
    bottom = [make_blob(rng.standard_normal(SHAPE))]
    top = [Blob(dtype=np.float64, name="y")]
    layer.setup(bottom, top)
    layer.blobs[0].data[...] = [0.3, -0.2]
    layer.blobs[1].data[...] = [1.5, 0.7]
    layer.blobs[2].data[...] = 1.0
    check_gradient(layer, bottom, top, setup=False)


# ------------------------------------------------------------------ in place
@pytest.mark.parametrize("phase", [caffe_pb2.TRAIN, caffe_pb2.TEST])
def test_in_place_matches_out_of_place(phase, rng):
    x = rng.standard_normal(SHAPE) * 2 + 1
    dy = rng.standard_normal(SHAPE)
    results = []
    for in_place in (False, True):
        layer, bottom, top = build(phase=phase, in_place=in_place)
        layer.blobs[0].data[...] = [1.0, 2.0]
        layer.blobs[1].data[...] = [3.0, 4.0]
        layer.blobs[2].data[...] = 2.0
        stats = tuple(to_numpy(b.data) for b in layer.blobs)
        results.append(run(layer, bottom, top, x, dy) + stats)
    for a, b in zip(*results):
        np.testing.assert_allclose(a, b, rtol=1e-12, atol=1e-14)


def test_backward_survives_overwritten_top(rng):
    """A later in-place layer (Scale, ReLU) overwrites the top; backward uses x_norm."""
    x = rng.standard_normal(SHAPE)
    dy = rng.standard_normal(SHAPE)
    layer, bottom, top = build()
    _, dx_ref = run(layer, bottom, top, x, dy)
    layer, bottom, top = build()
    bottom.data[...] = x
    layer.forward([bottom], [top])
    top.data[...] = -7.0
    top.diff[...] = dy
    layer.backward([top], [True], [bottom])
    np.testing.assert_allclose(to_numpy(bottom.diff), dx_ref, rtol=1e-12)


# ----------------------------------------------------------------------- GPU
def rel_err(a, b):
    return float(np.max(np.abs(a - b)) / max(np.max(np.abs(b)), 1e-30))


@pytest.mark.gpu
@pytest.mark.parametrize("phase", [caffe_pb2.TRAIN, caffe_pb2.TEST])
@pytest.mark.parametrize("in_place", [False, True])
def test_gpu_matches_cpu(cp, phase, in_place):
    rng = np.random.default_rng(2)
    shape = (8, 16, 7, 7)
    x = (rng.standard_normal(shape) * 2 + 1).astype(np.float32)
    dy = rng.standard_normal(shape).astype(np.float32)
    stats = [rng.uniform(0.5, 2.0, 16).astype(np.float32),
             rng.uniform(0.5, 2.0, 16).astype(np.float32), np.float32([1.7])]
    out = []
    for xp in (np, cp):
        layer, bottom, top = build(shape=shape, phase=phase, in_place=in_place, xp=xp,
                                   dtype=np.float32)
        for b, s in zip(layer.blobs, stats):
            b.data[...] = xp.asarray(s)
        y, dx = run(layer, bottom, top, x, dy)
        out.append([y, dx] + [to_numpy(b.data) for b in layer.blobs])
    for c, g in zip(*out):
        assert rel_err(g, c) <= 1e-5


def test_backward_writes_the_bottom_diff_unasked_unless_a_plan_left_it_out(rng):
    """BatchNormLayer::Backward_cpu never reads propagate_down: the bottom diff is written
    also when the net did not ask for it (a BatchNorm on the data).  Where a memory plan
    holds that diff's storage and did not place it, backward leaves it out instead."""
    layer, bottom, top = build()
    _, asked = run(layer, bottom, top, rng.standard_normal(SHAPE), rng.standard_normal(SHAPE))
    assert np.abs(asked).max() > 0
    bottom.diff[...] = 0
    layer.backward([top], [False], [bottom])
    np.testing.assert_array_equal(to_numpy(bottom.diff), asked)
    bottom.diff_storage.array = None
    bottom.diff_storage.external = True
    layer.backward([top], [False], [bottom])          # no diff placed: nothing written
    assert not bottom.has_diff
