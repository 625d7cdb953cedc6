"""ReLU, Sigmoid, TanH, Dropout: forward values, gradients, in-place runs, GPU parity.

Dropout also: its counter-based draw (a pure function of key, counter and index),
Caffe's threshold rule, keep fractions, the key's seeding, and its state through
state_dict; on a GPU, masks, tops and diffs bit for bit those of the CPU."""
import contextlib

import numpy as np
import pytest

import minicaffe.layers  # noqa: F401  (registers the layer types)
from minicaffe.backend import to_numpy
from minicaffe.blob import Blob
from minicaffe.layer import BackwardReads
from minicaffe.proto import caffe_pb2
from minicaffe.rng import caffe_uint_threshold, set_random_seed, stream_uint32
from minicaffe.testing import check_gradient, make_blob, make_layer

SHAPE = (2, 3, 2, 3)


def away_from_zero(rng, shape=SHAPE, margin=0.1):
    """Values in [-2, -margin] U [margin, 2]: no kinks inside a finite difference."""
    mag = rng.uniform(margin, 2.0, size=shape)
    return mag * rng.choice([-1.0, 1.0], size=shape)


def run(text, x, dy, in_place=False, phase=None, xp=np, dtype=np.float64, seed=3):
    """Forward then backward; returns (top data, bottom diff, layer)."""
    layer = make_layer(text, xp=xp, dtype=dtype, phase=phase)
    bottom = make_blob(x, xp=xp, dtype=dtype, name="x")
    top = bottom if in_place else Blob(xp=xp, dtype=dtype, name="y")
    layer.setup([bottom], [top])
    set_random_seed(seed)
    layer.forward([bottom], [top])
    y = to_numpy(top.data).copy()
    top.diff[...] = xp.asarray(dy, dtype=dtype)
    layer.backward([top], [True], [bottom])
    return y, to_numpy(bottom.diff).copy(), layer


RELU = 'name: "relu" type: "ReLU"'
LEAKY = 'name: "relu" type: "ReLU" relu_param { negative_slope: 0.25 }'
SIGMOID = 'name: "sig" type: "Sigmoid"'
TANH = 'name: "tanh" type: "TanH"'
DROPOUT = 'name: "drop" type: "Dropout" dropout_param { dropout_ratio: 0.3 }'


# ------------------------------------------------------------------ forward
def test_relu_forward_values():
    x = np.array([[-2.0, -0.5, 0.0, 0.5, 3.0]])
    y, _, _ = run(RELU, x, np.zeros_like(x))
    np.testing.assert_array_equal(y, [[0, 0, 0, 0.5, 3.0]])
    y, _, _ = run(LEAKY, x, np.zeros_like(x))
    np.testing.assert_allclose(y, [[-0.5, -0.125, 0, 0.5, 3.0]])


def test_relu_backward_at_zero_is_zero():
    # Caffe: gradient passes where bottom > 0 only; at exactly 0 it is blocked
    # (slope 0) or scaled by negative_slope.
    x = np.array([[0.0, 1.0, -1.0]])
    _, dx, _ = run(RELU, x, np.ones_like(x))
    np.testing.assert_array_equal(dx, [[0, 1, 0]])
    _, dx, _ = run(LEAKY, x, np.ones_like(x))
    np.testing.assert_allclose(dx, [[0.25, 1, 0.25]])


def test_sigmoid_tanh_forward_against_formulas(rng):
    x = rng.uniform(-20, 20, size=SHAPE)
    y, _, _ = run(SIGMOID, x, np.zeros(SHAPE))
    np.testing.assert_allclose(y, 1 / (1 + np.exp(-x)), rtol=1e-12, atol=1e-15)
    y, _, _ = run(TANH, x, np.zeros(SHAPE))
    np.testing.assert_allclose(y, np.tanh(x), rtol=1e-12)


def test_against_torch(rng):
    torch = pytest.importorskip("torch")
    x = away_from_zero(rng)
    dy = rng.standard_normal(SHAPE)
    for text, fn in ((RELU, torch.relu), (SIGMOID, torch.sigmoid), (TANH, torch.tanh),
                     (LEAKY, lambda t: torch.nn.functional.leaky_relu(t, 0.25))):
        tx = torch.tensor(x, requires_grad=True)
        ty = fn(tx)
        ty.backward(torch.tensor(dy))
        y, dx, _ = run(text, x, dy)
        np.testing.assert_allclose(y, ty.detach().numpy(), rtol=1e-12, atol=1e-15)
        np.testing.assert_allclose(dx, tx.grad.numpy(), rtol=1e-7, atol=1e-7)


# ---------------------------------------------------------------- gradients
@pytest.mark.parametrize("text", [RELU, LEAKY, SIGMOID, TANH])
def test_gradient(text, rng):
    layer = make_layer(text)
    check_gradient(layer, [make_blob(away_from_zero(rng))])


def test_dropout_gradient_train(rng):
    layer = make_layer(DROPOUT, phase=caffe_pb2.TRAIN)
    check_gradient(layer, [make_blob(rng.standard_normal(SHAPE))])


def test_dropout_gradient_test_phase(rng):
    layer = make_layer(DROPOUT, phase=caffe_pb2.TEST)
    check_gradient(layer, [make_blob(rng.standard_normal(SHAPE))])


# ------------------------------------------------------------------ in place
@pytest.mark.parametrize("text", [RELU, LEAKY, SIGMOID, TANH, DROPOUT])
def test_in_place_matches_out_of_place(text, rng):
    x = away_from_zero(rng)
    dy = rng.standard_normal(SHAPE)
    y0, dx0, _ = run(text, x, dy, in_place=False, phase=caffe_pb2.TRAIN)
    y1, dx1, _ = run(text, x, dy, in_place=True, phase=caffe_pb2.TRAIN)
    np.testing.assert_array_equal(y0, y1)
    np.testing.assert_array_equal(dx0, dx1)


def test_negative_slope_reads_bottom_like_caffe():
    x = np.array([[-2.0, 3.0]])
    y, dx, layer = run('name: "r" type: "ReLU" relu_param { negative_slope: -0.5 }', x,
                       np.ones_like(x))
    np.testing.assert_allclose(y, [[1.0, 3.0]])
    np.testing.assert_allclose(dx, [[-0.5, 1.0]])
    assert layer.backward_reads() == BackwardReads(bottom=(0,), top=())


def test_backward_reads_declarations(rng):
    x = rng.standard_normal(SHAPE)
    for text in (RELU, LEAKY, SIGMOID, TANH):
        _, _, layer = run(text, x, x)
        assert layer.backward_reads() == BackwardReads(bottom=(), top=(0,))
        assert not layer.internals
    _, _, layer = run(DROPOUT, x, x, phase=caffe_pb2.TRAIN)
    assert layer.backward_reads() == BackwardReads(bottom=(), top=(), internals=("mask",))
    assert layer.internal("mask").dtype == np.uint32
    assert layer.internal("mask").shape == SHAPE
    _, _, layer = run(DROPOUT, x, x, phase=caffe_pb2.TEST)
    assert layer.backward_reads() == BackwardReads()
    assert not layer.internals


# ------------------------------------------------------------------- dropout
def test_dropout_train_scales_kept_and_zeroes_dropped():
    x = np.full((4, 50, 10, 10), 2.0)
    y, dx, layer = run(DROPOUT, x, np.ones_like(x), phase=caffe_pb2.TRAIN)
    mask = to_numpy(layer.internal("mask").data)
    scale = 1 / (1 - 0.3)
    np.testing.assert_allclose(y, 2.0 * scale * mask)
    np.testing.assert_allclose(dx, scale * mask)
    kept = mask.mean()
    assert abs(kept - 0.7) < 0.02  # 20000 draws: 5 sigma is about 0.016


def test_dropout_test_phase_is_identity(rng):
    x = rng.standard_normal(SHAPE)
    dy = rng.standard_normal(SHAPE)
    for in_place in (False, True):
        y, dx, _ = run(DROPOUT, x, dy, in_place=in_place, phase=caffe_pb2.TEST)
        np.testing.assert_array_equal(y, x)
        np.testing.assert_array_equal(dx, dy)


def test_dropout_same_seed_same_mask(rng):
    x = rng.standard_normal(SHAPE)
    y0, _, _ = run(DROPOUT, x, x, phase=caffe_pb2.TRAIN, seed=5)
    y1, _, _ = run(DROPOUT, x, x, phase=caffe_pb2.TRAIN, seed=5)
    y2, _, _ = run(DROPOUT, x, x, phase=caffe_pb2.TRAIN, seed=6)
    np.testing.assert_array_equal(y0, y1)
    assert not np.array_equal(y0, y2)


def train_dropout(ratio=0.3, shape=SHAPE, xp=np, dtype=np.float64, in_place=False):
    """A set-up TRAIN Dropout layer with its bottom and top."""
    layer = make_layer(f'name: "d" type: "Dropout" dropout_param {{ dropout_ratio: {ratio} }}',
                       xp=xp, dtype=dtype, phase=caffe_pb2.TRAIN)
    bottom = Blob(shape, xp=xp, dtype=dtype, name="x")
    top = bottom if in_place else Blob(xp=xp, dtype=dtype, name="y")
    layer.setup([bottom], [top])
    return layer, bottom, top


def mask_of(layer, bottom, top):
    """One forward; the mask it drew."""
    layer.forward([bottom], [top])
    return to_numpy(layer.internal("mask").data).copy()


def reference_uint32(key, counter, i):
    """minicaffe.rng.stream_uint32 for one element, in Python integers (splitmix64)."""
    m64 = (1 << 64) - 1

    def mix64(z):
        z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & m64
        z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & m64
        return z ^ (z >> 31)

    base = mix64((key + 0x9E3779B97F4A7C15 * (counter + 1)) & m64)
    return mix64((base + 0x9E3779B97F4A7C15 * (i + 1)) & m64) >> 32


@pytest.mark.parametrize("key,counter", [(0, 0), (1, 7), (2**64 - 1, 2**64 - 2),
                                         (0xD1B54A32D192ED03, 123456789)])
def test_stream_is_a_pure_function_of_key_counter_and_index(key, counter):
    bits = stream_uint32(key, counter, 0, 300)
    assert bits.dtype == np.uint32 and bits.shape == (300,)
    np.testing.assert_array_equal(bits, [reference_uint32(key, counter, i) for i in range(300)])
    np.testing.assert_array_equal(stream_uint32(key, counter, 100, 150), bits[100:150])
    again = stream_uint32(np.array([key], np.uint64), np.array([counter], np.uint64), 0, 300)
    np.testing.assert_array_equal(again, bits)  # as arrays (where the layer keeps them)
    # another draw, another key: different words (at most a chance coincidence per 2**32)
    assert np.sum(stream_uint32(key, (counter + 1) % 2**64, 0, 300) == bits) <= 1
    assert np.sum(stream_uint32(key ^ 1, counter, 0, 300) == bits) <= 1


def test_stream_known_values():
    """Pinned words: the NumPy and CUDA definitions cannot drift unnoticed."""
    np.testing.assert_array_equal(stream_uint32(0, 0, 0, 4),
                                  [reference_uint32(0, 0, i) for i in range(4)])
    assert [int(v) for v in stream_uint32(5, 0, 0, 4)] == \
        [4208386630, 454703515, 3710264032, 3341650772]


@pytest.mark.parametrize("ratio,dtype,want", [
    (0.5, np.float32, 2147483648),   # float(UINT_MAX) = 2**32, times 0.5
    (0.5, np.float64, 2147483647),   # 4294967295 * 0.5 = 2147483647.5, truncated
    (0.3, np.float32, 1288490240),   # 2**32 * 0.3f rounded to float32
    (0.3, np.float64, 1288490239),   # 4294967295 * 0.300000011920928955078125 truncated
    (0.9, np.float32, 3865470464),
    (0.9, np.float64, 3865470463),
])
def test_dropout_threshold_is_caffes(ratio, dtype, want):
    """uint_thres_ = static_cast<unsigned int>(UINT_MAX * threshold_), threshold_ of the
    net's type (the proto's float, widened for double nets)."""
    layer, _, _ = train_dropout(ratio, dtype=dtype)
    assert layer.uint_thres == want == caffe_uint_threshold(np.float32(ratio), dtype)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_dropout_keeps_only_draws_above_the_threshold(dtype):
    """mask = rand > uint_thres, strictly (Caffe's DropoutForward)."""
    layer, bottom, top = train_dropout(0.5, shape=(64, 50), dtype=dtype)
    layer.load_state_dict({"key": 99, "counter": 3})
    rand = stream_uint32(99, 3, 0, bottom.count).reshape(bottom.shape)
    np.testing.assert_array_equal(mask_of(layer, bottom, top), rand > layer.uint_thres)
    # a threshold equal to a draw drops that element; one below keeps it
    layer.load_state_dict({"key": 99, "counter": 3})
    layer.uint_thres = int(rand.flat[0])
    assert mask_of(layer, bottom, top).flat[0] == 0
    layer.load_state_dict({"key": 99, "counter": 3})
    layer.uint_thres = int(rand.flat[0]) - 1
    assert mask_of(layer, bottom, top).flat[0] == 1


@pytest.mark.parametrize("ratio", [0.1, 0.3, 0.5, 0.9])
def test_dropout_keep_fraction_is_binomial(ratio):
    """Over three draws of 100000 elements, each kept fraction lies within 5 standard
    deviations of P(rand > uint_thres) = (2**32 - 1 - uint_thres) / 2**32, and the
    draws differ."""
    layer, bottom, top = train_dropout(ratio, shape=(100, 1000), dtype=np.float32)
    p = (2**32 - 1 - layer.uint_thres) / 2**32
    sigma = np.sqrt(p * (1 - p) / bottom.count)
    masks = [mask_of(layer, bottom, top) for _ in range(3)]
    for m in masks:
        assert abs(m.mean() - p) < 5 * sigma, (m.mean(), p, sigma)
    # independent draws agree where both keep or both drop: p^2 + (1-p)^2 of them
    agree = np.mean(masks[0] == masks[1])
    q = p * p + (1 - p) * (1 - p)
    assert abs(agree - q) < 5 * np.sqrt(q * (1 - q) / bottom.count)


def test_dropout_mask_is_the_stream_and_the_counter_advances():
    layer, bottom, top = train_dropout()
    key = layer.state_dict()["key"]
    assert layer.state_dict()["counter"] == 0
    for c in range(3):
        rand = stream_uint32(key, c, 0, bottom.count).reshape(SHAPE)
        np.testing.assert_array_equal(mask_of(layer, bottom, top), rand > layer.uint_thres)
        assert layer.state_dict() == {"key": key, "counter": c + 1}
    layer.backward([top], [True], [bottom])  # backward draws nothing
    assert layer.state_dict()["counter"] == 3


def test_dropout_chunks_do_not_change_the_mask(monkeypatch):
    layer, bottom, top = train_dropout(shape=(5, 7, 3))
    layer.load_state_dict({"key": 11, "counter": 0})
    whole = mask_of(layer, bottom, top)
    monkeypatch.setattr(layer, "_CHUNK", 16)  # 105 elements in 7 chunks
    layer.load_state_dict({"key": 11, "counter": 0})
    np.testing.assert_array_equal(mask_of(layer, bottom, top), whole)
    assert layer.state_dict()["counter"] == 1


def test_dropout_key_follows_the_seed():
    """Drawn from the host generator at set-up: one per layer, the same ones again
    after the same seed, unpredictable without one."""
    set_random_seed(7)
    keys = [train_dropout()[0].state_dict()["key"] for _ in range(3)]
    assert len(set(keys)) == 3
    set_random_seed(7)
    assert [train_dropout()[0].state_dict()["key"] for _ in range(3)] == keys
    set_random_seed(None)
    a = train_dropout()[0].state_dict()["key"]
    set_random_seed(None)
    assert train_dropout()[0].state_dict()["key"] != a


def test_dropout_reseed_restarts_the_stream():
    """set_random_seed(s) restarts every stream, as it restarts the host generator: the
    next draw is that of a layer keyed right after it (the gradient checker needs this)."""
    layer, bottom, top = train_dropout()
    mask_of(layer, bottom, top)
    set_random_seed(21)
    first = mask_of(layer, bottom, top)
    assert layer.state_dict()["counter"] == 1
    set_random_seed(21)
    fresh, b2, t2 = train_dropout()
    np.testing.assert_array_equal(mask_of(fresh, b2, t2), first)
    assert fresh.state_dict() == layer.state_dict()


def test_dropout_state_dict_round_trip():
    """A second layer given the first's state (through JSON, as in a .solverstate)
    draws the very masks the first draws next; a restore is not undone by a later
    forward (no re-key)."""
    import json
    a, xa, ya = train_dropout()
    for _ in range(4):
        mask_of(a, xa, ya)
    state = json.loads(json.dumps(a.state_dict()))
    b, xb, yb = train_dropout()
    assert b.state_dict() != state
    b.load_state_dict(state)
    assert b.state_dict() == state
    for _ in range(3):
        np.testing.assert_array_equal(mask_of(b, xb, yb), mask_of(a, xa, ya))
    with pytest.raises(ValueError, match="'d' of type Dropout.*no key and counter"):
        b.load_state_dict({})


def test_dropout_test_phase_has_no_stream():
    layer = make_layer(DROPOUT, phase=caffe_pb2.TEST)
    layer.setup([make_blob(np.zeros(SHAPE))], [Blob()])
    assert layer.rng_state is None and layer.state_dict() == {}
    layer.load_state_dict({})  # nothing to restore


@pytest.mark.parametrize("ratio", ["-0.5", "1", "1.5"])   # 0 runs, as in Caffe's release builds
def test_dropout_bad_ratio(ratio):
    layer = make_layer(f'name: "d" type: "Dropout" dropout_param {{ dropout_ratio: {ratio} }}')
    with pytest.raises(ValueError, match="dropout_ratio"):
        layer.setup([make_blob(np.zeros((2, 2)))], [Blob()])


# ----------------------------------------------------------------------- GPU
def rel_err(a, b):
    return float(np.max(np.abs(a - b)) / max(np.max(np.abs(b)), 1e-30))


@pytest.mark.gpu
@pytest.mark.parametrize("text", [RELU, LEAKY, SIGMOID, TANH])
@pytest.mark.parametrize("in_place", [False, True])
def test_gpu_matches_cpu(cp, text, in_place):
    rng = np.random.default_rng(1)
    x = away_from_zero(rng, (4, 8, 5, 5)).astype(np.float32)
    dy = rng.standard_normal(x.shape).astype(np.float32)
    yc, dxc, _ = run(text, x, dy, in_place=in_place, dtype=np.float32)
    yg, dxg, _ = run(text, x, dy, in_place=in_place, xp=cp, dtype=np.float32)
    assert rel_err(yg, yc) <= 1e-5
    assert rel_err(dxg, dxc) <= 1e-5


def dropout_run(xp, dtype, in_place, iters=3, shape=(8, 16, 10, 10)):
    """Three TRAIN iterations from one key and counter: masks, tops, bottom diffs, state."""
    rng = np.random.default_rng(1)
    layer, bottom, top = train_dropout(0.3, shape=shape, xp=xp, dtype=dtype, in_place=in_place)
    layer.load_state_dict({"key": 0x5EED, "counter": 1000})
    out = []
    for _ in range(iters):
        x = rng.standard_normal(shape)
        x.flat[::7] *= -1e-30  # tiny negatives: the dropped ones become -0.0
        bottom.data[...] = xp.asarray(x, dtype=dtype)
        layer.forward([bottom], [top])
        out += [to_numpy(layer.internal("mask").data).copy(), to_numpy(top.data).copy()]
        top.diff[...] = xp.asarray(rng.standard_normal(shape), dtype=dtype)
        layer.backward([top], [True], [bottom])
        out.append(to_numpy(bottom.diff).copy())
    return out, layer


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("in_place", [False, True])
@pytest.mark.parametrize("fused", [True, False], ids=["fused", "generic"])
def test_gpu_dropout_is_bitwise_cpu(cp, dtype, in_place, fused):
    """Same key and counter: the GPU draws the CPU's masks, and y and dx are the same
    bits (finite inputs), through the fused kernels and through the generic CuPy code;
    the counter ends where the CPU's does."""
    from minicaffe.kernels import cuda_fused
    cpu, cpu_layer = dropout_run(np, dtype, in_place)
    with contextlib.nullcontext() if fused else cuda_fused.disabled():
        gpu, gpu_layer = dropout_run(cp, dtype, in_place)
    assert gpu_layer._fused is fused and not cpu_layer._fused
    for i, (g, c) in enumerate(zip(gpu, cpu)):
        assert g.dtype == c.dtype and g.shape == c.shape
        u = f"u{c.itemsize}"
        np.testing.assert_array_equal(g.view(u), c.view(u), err_msg=f"output {i}")
    assert gpu_layer.state_dict() == cpu_layer.state_dict() == {"key": 0x5EED, "counter": 1003}
    assert int(gpu_layer.rng_state[2].get()) == 0  # the kernel's tickets


@pytest.mark.gpu
@pytest.mark.parametrize("in_place", [False, True])
def test_gpu_dropout_test_phase_is_identity(cp, in_place):
    rng = np.random.default_rng(1)
    x = rng.standard_normal((8, 16, 10, 10)).astype(np.float32)
    dy = rng.standard_normal(x.shape).astype(np.float32)
    y, dx, _ = run(DROPOUT, x, dy, in_place=in_place, phase=caffe_pb2.TEST, xp=cp,
                   dtype=np.float32)
    np.testing.assert_array_equal(y, x)
    np.testing.assert_array_equal(dx, dy)
