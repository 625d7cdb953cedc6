"""PReLU, ELU, AbsVal, BNLL, Power, Exp, Log, Threshold, Clip, Swish (layers/activation.py).

Forward values against PyTorch and hand-computed Caffe formulas, float64 gradient checks
(PReLU's slopes too), in place against out of place, the declared backward reads (backward
still right with every undeclared buffer poisoned), Caffe's special cases and errors, PReLU's
slopes through a .caffemodel, a net of these layers under a naive swap plan bit for bit, and
on a GPU the CuPy path against the CPU."""
import math

import numpy as np
import pytest

from minicaffe.backend import to_numpy
from minicaffe.blob import Blob
from minicaffe.layer import BackwardReads
from minicaffe.net import TRAIN, TEST, Net
from minicaffe.proto import caffe_pb2, parse_text
from minicaffe.testing import check_gradient, make_blob, make_layer, sgd_solver, train_steps

SHAPE = (2, 3, 2, 3)

PRELU = 'name: "prelu" type: "PReLU"'
PRELU_SHARED = 'name: "prelu" type: "PReLU" prelu_param { channel_shared: true }'
ELU = 'name: "elu" type: "ELU"'
ELU_HALF = 'name: "elu" type: "ELU" elu_param { alpha: 0.5 }'
ELU_NEG = 'name: "elu" type: "ELU" elu_param { alpha: -0.5 }'
ABSVAL = 'name: "abs" type: "AbsVal"'
BNLL = 'name: "bnll" type: "BNLL"'
POWER = 'name: "pow" type: "Power" power_param { power: 3 scale: 0.5 shift: 0.25 }'
POWER_SQ = 'name: "pow" type: "Power" power_param { power: 2 scale: -1.5 shift: 0.5 }'
POWER_ROOT = 'name: "pow" type: "Power" power_param { power: 0.5 scale: 1 shift: 3 }'
POWER_LIN = 'name: "pow" type: "Power" power_param { power: 1 scale: 2 shift: -1 }'
EXP = 'name: "exp" type: "Exp"'
EXP_B2 = 'name: "exp" type: "Exp" exp_param { base: 2 scale: 0.5 shift: 1 }'
EXP_E_SHIFT = 'name: "exp" type: "Exp" exp_param { scale: 0.5 shift: 1 }'
LOG = 'name: "log" type: "Log" log_param { shift: 3 }'
LOG_B10 = 'name: "log" type: "Log" log_param { base: 10 scale: 2 shift: 5 }'
THRESHOLD = 'name: "thr" type: "Threshold" threshold_param { threshold: 0.3 }'
CLIP = 'name: "clip" type: "Clip" clip_param { min: -0.5 max: 0.7 }'
SWISH = 'name: "swish" type: "Swish"'
SWISH_B = 'name: "swish" type: "Swish" swish_param { beta: 1.5 }'

# every differentiable configuration; x from away_from_zero keeps every base positive
DIFFERENTIABLE = [PRELU, PRELU_SHARED, ELU, ELU_HALF, ELU_NEG, ABSVAL, BNLL, POWER, POWER_SQ,
                  POWER_ROOT, POWER_LIN, EXP, EXP_B2, EXP_E_SHIFT, LOG, LOG_B10, CLIP, SWISH,
                  SWISH_B]
# those whose backward reads the overwritten bottom in place, as Caffe's does (the module doc)
READS_OVERWRITTEN = [BNLL, POWER, POWER_SQ, POWER_ROOT, LOG, LOG_B10, CLIP]
# those with which Caffe's in-place result is its out-of-place one
IN_PLACE_OK = [t for t in DIFFERENTIABLE if t not in [ABSVAL, ELU_NEG] + READS_OVERWRITTEN]


def away_from_zero(rng, shape=SHAPE, margin=0.1, high=2.0):
    """Values in [-high, -margin] U [margin, high]: no kinks inside a finite difference."""
    mag = rng.uniform(margin, high, size=shape)
    return mag * rng.choice([-1.0, 1.0], size=shape)


def clip_safe(rng, shape=SHAPE):
    """Values at least 0.05 from Clip's bounds (-0.5, 0.7) and from 0."""
    x = away_from_zero(rng, shape)
    for bound in (-0.5, 0.7):
        near = np.abs(x - bound) < 0.05
        x[near] = bound + 0.1 * np.sign(x[near] - bound + 1e-12)
    return x


def sample(text, rng, shape=SHAPE):
    return clip_safe(rng, shape) if "Clip" in text else away_from_zero(rng, shape)


def setup(text, x, in_place=False, xp=np, dtype=np.float64, slopes=None):
    layer = make_layer(text, xp=xp, dtype=dtype)
    bottom = make_blob(x, xp=xp, dtype=dtype, name="x")
    top = bottom if in_place else Blob(xp=xp, dtype=dtype, name="y")
    layer.setup([bottom], [top])
    if slopes is not None:
        layer.blobs[0].data[...] = xp.asarray(slopes, dtype=dtype)
    for p in layer.blobs:
        p.diff[...] = 0
    return layer, bottom, top


def run(text, x, dy, in_place=False, xp=np, dtype=np.float64, slopes=None, poison=False):
    """Forward then backward; returns (top data, bottom diff, param diffs, layer).

    poison: before backward, fill with NaN every buffer that backward_reads() does not name
    (bottom data, top data, internals) and the bottom diff (overwritten, never read)."""
    layer, bottom, top = setup(text, x, in_place, xp, dtype, slopes)
    layer.forward([bottom], [top])
    y = to_numpy(top.data).copy()
    top.diff[...] = xp.asarray(dy, dtype=dtype)
    if poison:
        reads = layer.backward_reads()
        if in_place:
            if 0 not in reads.bottom and 0 not in reads.top:
                bottom.data[...] = np.nan
        else:
            if 0 not in reads.bottom:
                bottom.data[...] = np.nan
            if 0 not in reads.top:
                top.data[...] = np.nan
            bottom.diff[...] = np.nan
        for name, it in layer.internals.items():
            if name not in reads.internals:
                it.blob.data[...] = np.nan
    layer.backward([top], [True], [bottom])
    pdiffs = [to_numpy(p.diff).copy() for p in layer.blobs]
    return y, to_numpy(bottom.diff).copy(), pdiffs, layer


def run_forward(text, x, in_place=False):
    """Forward only; returns the top data."""
    layer, bottom, top = setup(text, x, in_place)
    layer.forward([bottom], [top])
    return to_numpy(top.data).copy()


# ------------------------------------------------------------------ forward values
def sigmoid(x):
    return 0.5 * np.tanh(0.5 * x) + 0.5


def caffe_reference(text, x):
    """Each layer's forward as Caffe's source writes it, in float64."""
    layer = make_layer(text)
    t = layer.type
    if t == "ELU":
        a = layer.param.elu_param.alpha
        return np.maximum(x, 0) + a * (np.exp(np.minimum(x, 0)) - 1)
    if t == "AbsVal":
        return np.abs(x)
    if t == "BNLL":
        return np.where(x > 0, x + np.log1p(np.exp(-np.abs(x))), np.log1p(np.exp(np.minimum(x, 0))))
    if t == "Power":
        p = layer.param.power_param
        return (p.shift + p.scale * x) ** p.power
    if t == "Exp":
        p = layer.param.exp_param
        base = math.e if p.base == -1 else p.base
        return base ** (p.shift + p.scale * x)
    if t == "Log":
        p = layer.param.log_param
        ln = np.log(p.shift + p.scale * x)
        return ln if p.base == -1 else ln / math.log(p.base)
    if t == "Threshold":
        return (x > layer.param.threshold_param.threshold).astype(np.float64)
    if t == "Clip":
        p = layer.param.clip_param
        return np.maximum(p.min, np.minimum(x, p.max))
    if t == "Swish":
        b = layer.param.swish_param.beta
        return x * sigmoid(b * x)
    raise AssertionError(t)


@pytest.mark.parametrize("text", [ELU, ELU_HALF, ELU_NEG, ABSVAL, BNLL, POWER, POWER_SQ,
                                  POWER_ROOT, POWER_LIN, EXP, EXP_B2, EXP_E_SHIFT, LOG, LOG_B10,
                                  THRESHOLD, CLIP, SWISH, SWISH_B])
def test_forward_against_caffe_formula(text, rng):
    x = sample(text, rng)
    y = run_forward(text, x)
    np.testing.assert_allclose(y, caffe_reference(text, x), rtol=1e-13, atol=1e-15)


def test_forward_hand_computed():
    x = np.array([[-2.0, -0.5, 0.0, 0.3, 0.7, 1.0]])
    z = np.zeros_like(x)
    y = run_forward(THRESHOLD, x)
    np.testing.assert_array_equal(y, [[0, 0, 0, 0, 1, 1]])        # x > t, strictly
    y = run(CLIP, x, z)[0]
    top = float(np.float32(0.7))                 # proto floats: Caffe's Dtype(0.7f)
    np.testing.assert_array_equal(y, [[-0.5, -0.5, 0.0, 0.3, top, top]])
    y = run(EXP_B2, x, z)[0]                                         # 2^(1 + x/2)
    np.testing.assert_allclose(y, [[1.0, 2 ** 0.75, 2.0, 2 ** 1.15, 2 ** 1.35, 2 ** 1.5]],
                               rtol=1e-15)
    y = run(EXP_E_SHIFT, x, z)[0]                                    # e^(1 + x/2), not -e^(x/2)
    np.testing.assert_allclose(y, np.exp(1 + x / 2), rtol=1e-15)
    y = run(LOG_B10, x, z)[0]                                        # log10(5 + 2x)
    np.testing.assert_allclose(y, np.log10(5 + 2 * x), rtol=1e-15)
    y = run(POWER_SQ, x, z)[0]                                       # (0.5 - 1.5x)^2
    np.testing.assert_allclose(y, (0.5 - 1.5 * x) ** 2, rtol=1e-15)
    y = run(ABSVAL, x, z)[0]
    np.testing.assert_array_equal(y, np.abs(x))
    y = run(BNLL, np.array([[0.0]]), np.zeros((1, 1)))[0]
    np.testing.assert_allclose(y, [[math.log(2)]], rtol=1e-15)
    x2 = np.array([[-1.0, 2.0], [3.0, -4.0]])                        # (N, C), default slope 0.25
    y = run(PRELU, x2, np.zeros_like(x2))[0]
    np.testing.assert_array_equal(y, [[-0.25, 2.0], [3.0, -1.0]])


def test_against_torch(rng):
    torch = pytest.importorskip("torch")
    F = torch.nn.functional
    x = away_from_zero(rng)
    dy = rng.standard_normal(SHAPE)
    refs = [
        (ELU, lambda t: F.elu(t, 1.0)),
        (ELU_HALF, lambda t: F.elu(t, 0.5)),
        (ABSVAL, torch.abs),
        (BNLL, F.softplus),                   # |x| <= 2: below softplus's linear threshold
        (POWER, lambda t: (0.25 + 0.5 * t) ** 3),
        (POWER_ROOT, lambda t: torch.sqrt(3 + t)),
        (EXP_B2, lambda t: 2 ** (1 + 0.5 * t)),
        (LOG_B10, lambda t: torch.log10(5 + 2 * t)),
        (CLIP, lambda t: torch.clamp(t, -0.5, float(np.float32(0.7)))),
        (SWISH, F.silu),
        (SWISH_B, lambda t: t * torch.sigmoid(1.5 * t)),
    ]
    for text, fn in refs:
        xs = clip_safe(rng) if text == CLIP else x
        tx = torch.tensor(xs, requires_grad=True)
        ty = fn(tx)
        ty.backward(torch.tensor(dy))
        y, dx, _, _ = run(text, xs, dy)
        np.testing.assert_allclose(y, ty.detach().numpy(), rtol=1e-12, atol=1e-15,
                                   err_msg=text)
        np.testing.assert_allclose(dx, tx.grad.numpy(), rtol=1e-10, atol=1e-13, err_msg=text)


@pytest.mark.parametrize("shared", [False, True])
def test_prelu_against_torch(rng, shared):
    torch = pytest.importorskip("torch")
    x = away_from_zero(rng)
    dy = rng.standard_normal(SHAPE)
    slopes = rng.uniform(-0.5, 0.8, size=() if shared else (SHAPE[1],))
    tx = torch.tensor(x, requires_grad=True)
    tw = torch.tensor(np.atleast_1d(slopes), requires_grad=True)
    ty = torch.nn.functional.prelu(tx, tw)
    ty.backward(torch.tensor(dy))
    y, dx, (da,), _ = run(PRELU_SHARED if shared else PRELU, x, dy, slopes=slopes)
    np.testing.assert_allclose(y, ty.detach().numpy(), rtol=1e-14)
    np.testing.assert_allclose(dx, tx.grad.numpy(), rtol=1e-12)
    np.testing.assert_allclose(np.atleast_1d(da), tw.grad.numpy(), rtol=1e-12)


# ---------------------------------------------------------------- gradients
@pytest.mark.parametrize("text", DIFFERENTIABLE)
def test_gradient(text, rng):
    check_gradient(make_layer(text), [make_blob(sample(text, rng))])


@pytest.mark.parametrize("text", [PRELU, PRELU_SHARED])
@pytest.mark.parametrize("shape", [SHAPE, (3, 4), (2, 3, 5)])
def test_prelu_gradient_of_slopes_and_bottom(text, shape, rng):
    """check_gradient checks the bottom and the slope blob (param_propagate_down)."""
    layer = make_layer(text)
    bottom, top = make_blob(away_from_zero(rng, shape)), Blob(dtype=np.float64)
    layer.setup([bottom], [top])
    layer.blobs[0].data[...] = rng.uniform(-0.5, 0.8, size=layer.blobs[0].shape)
    assert layer.param_propagate_down == [True]
    check_gradient(layer, [bottom], top=[top], setup=False)


@pytest.mark.parametrize("text", [PRELU, PRELU_SHARED])
def test_prelu_in_place_gradient(text, rng):
    """In place, backward reads the saved copy: the numerical gradient still agrees."""
    layer = make_layer(text)
    bottom = make_blob(away_from_zero(rng))
    layer.setup([bottom], [bottom])
    x0 = to_numpy(bottom.data).copy()
    layer.forward([bottom], [bottom])
    y = bottom.data.copy()
    dy = rng.standard_normal(SHAPE)
    bottom.diff[...] = dy
    layer.blobs[0].diff[...] = 0
    layer.backward([bottom], [True], [bottom])
    # out of place from the same x: the same diffs
    _, dx, (da,), _ = run(text, x0, dy)
    np.testing.assert_array_equal(to_numpy(bottom.diff), dx)
    np.testing.assert_array_equal(to_numpy(layer.blobs[0].diff), da)
    np.testing.assert_array_equal(y, run(text, x0, dy)[0])


# ------------------------------------------------------------------ in place
@pytest.mark.parametrize("text", IN_PLACE_OK + [THRESHOLD])
def test_in_place_matches_out_of_place(text, rng):
    x = sample(text, rng)
    dy = rng.standard_normal(SHAPE)
    if text == THRESHOLD:      # forward only (no backward in Caffe)
        a = run_forward(text, x, in_place=False)
        b = run_forward(text, x, in_place=True)
        np.testing.assert_array_equal(a, b)
        return
    y0, dx0, p0, _ = run(text, x, dy, in_place=False)
    y1, dx1, p1, _ = run(text, x, dy, in_place=True)
    np.testing.assert_array_equal(y0, y1)
    np.testing.assert_array_equal(dx0, dx1)
    for a, b in zip(p0, p1):
        np.testing.assert_array_equal(a, b)


@pytest.mark.parametrize("text", READS_OVERWRITTEN)
def test_in_place_reads_the_overwritten_bottom_as_caffe(text, rng):
    """In place, Caffe's BNLL, Power, Log and Clip read bottom[0]->cpu_data(), which holds
    the top: their gradient is the out-of-place backward evaluated at y instead of x, except
    Power outside powers 1 and 2, whose quotient form also reads the top (y again)."""
    x = sample(text, rng)
    dy = rng.standard_normal(SHAPE)
    y, dx_in, _, layer = run(text, x, dy, in_place=True)
    assert not layer.internals
    ref, bottom, top = setup(text, x)
    ref.forward([bottom], [top])
    np.testing.assert_array_equal(to_numpy(top.data), y)
    if ref.type == "Power" and ref.power not in (1, 2):
        # power_layer.cpp: diff_scale * top_data / (shift + scale * bottom_data), both y
        p = ref.param.power_param
        want = dy * (p.power * p.scale) * y / (p.shift + p.scale * y)
        np.testing.assert_allclose(dx_in, want, rtol=1e-13)
        return
    bottom.data[...] = top.data                    # what Caffe's in-place backward reads
    top.diff[...] = dy
    ref.backward([top], [True], [bottom])
    np.testing.assert_array_equal(to_numpy(bottom.diff), dx_in)


def test_absval_refuses_in_place():
    """Caffe's AbsValLayer::LayerSetUp: CHECK_NE(top[0], bottom[0])."""
    layer = make_layer(ABSVAL)
    b = make_blob(np.ones(SHAPE), name="x")
    with pytest.raises(ValueError, match="'abs' of type AbsVal: does not allow in-place"):
        layer.setup([b], [b])


def test_elu_negative_alpha_in_place_is_caffes():
    """alpha < 0: the mask comes from the bottom as in Caffe, which in place is the top."""
    x = np.array([[-2.0, 0.5]])
    dy = np.ones_like(x)
    y, dx, _, layer = run(ELU_NEG, x, dy)
    a = -0.5
    np.testing.assert_allclose(y, [[a * (math.exp(-2) - 1), 0.5]])
    np.testing.assert_allclose(dx, [[a + y[0, 0], 1.0]])
    assert layer.backward_reads() == BackwardReads(bottom=(0,), top=(0,))
    # in place: y(-2) = 0.43 > 0, so Caffe's mask (bottom_data > 0 on the overwritten
    # bottom) passes dy unchanged there
    _, dx_in, _, _ = run(ELU_NEG, x, dy, in_place=True)
    np.testing.assert_allclose(dx_in, [[1.0, 1.0]])


# ------------------------------------------------------- backward declarations
EXPECTED_READS = {
    # text: (out of place, in place); None: not allowed
    PRELU: (BackwardReads(bottom=(0,)), BackwardReads(internals=("bottom_copy",))),
    ELU: (BackwardReads(top=(0,)), BackwardReads(top=(0,))),
    ELU_NEG: (BackwardReads(bottom=(0,), top=(0,)), BackwardReads(bottom=(0,), top=(0,))),
    ABSVAL: (BackwardReads(bottom=(0,)), None),
    BNLL: (BackwardReads(bottom=(0,)), BackwardReads(bottom=(0,))),
    POWER: (BackwardReads(bottom=(0,)), BackwardReads(bottom=(0,))),
    POWER_SQ: (BackwardReads(bottom=(0,)), BackwardReads(bottom=(0,))),
    POWER_LIN: (BackwardReads(), BackwardReads()),
    EXP_B2: (BackwardReads(top=(0,)), BackwardReads(top=(0,))),
    LOG_B10: (BackwardReads(bottom=(0,)), BackwardReads(bottom=(0,))),
    THRESHOLD: (BackwardReads(), BackwardReads()),
    CLIP: (BackwardReads(bottom=(0,)), BackwardReads(bottom=(0,))),
    SWISH_B: (BackwardReads(top=(0,), internals=("sigmoid_output",)),
              BackwardReads(top=(0,), internals=("sigmoid_output",))),
}


@pytest.mark.parametrize("text", list(EXPECTED_READS))
def test_backward_reads_declarations(text, rng):
    x = sample(text, rng)
    for in_place, want in zip((False, True), EXPECTED_READS[text]):
        if want is None:
            continue
        layer, _, _ = setup(text, x, in_place)
        assert layer.backward_reads() == want, (text, in_place)
        saved = {n for n, it in layer.internals.items() if it.saved}
        assert set(want.internals) == saved, (text, in_place)
        for n in want.internals:
            assert layer.internal(n).shape == SHAPE
    # Swish's beta * x buffer is forward scratch (Caffe's sigmoid_input_)
    if text == SWISH_B:
        it = layer.internals["sigmoid_input"]
        assert not it.saved and it.uses == ("forward",)


def test_power_linear_and_constant_keep_no_copy(rng):
    x = away_from_zero(rng)
    for text in (POWER_LIN, 'name: "p" type: "Power" power_param { scale: 0 shift: 2 }',
                 'name: "p" type: "Power" power_param { power: 0 }'):
        layer, _, _ = setup(text, x, in_place=True)
        assert not layer.internals and layer.backward_reads() == BackwardReads()


@pytest.mark.parametrize("text", DIFFERENTIABLE)
@pytest.mark.parametrize("in_place", [False, True])
def test_declared_reads_suffice(text, in_place, rng):
    """Backward gives the same bits with every buffer it does not declare set to NaN."""
    if in_place and text == ABSVAL:
        return
    x = sample(text, rng)
    dy = rng.standard_normal(SHAPE)
    _, dx, pd, _ = run(text, x, dy, in_place=in_place)
    _, dx_p, pd_p, _ = run(text, x, dy, in_place=in_place, poison=True)
    np.testing.assert_array_equal(dx_p, dx)
    for a, b in zip(pd_p, pd):
        np.testing.assert_array_equal(a, b)


# ------------------------------------------------------------- Caffe's details
def test_prelu_slopes_default_filler_and_shapes():
    x = np.zeros((2, 5, 3))
    layer, _, _ = setup(PRELU, x)
    assert layer.blobs[0].shape == (5,)
    np.testing.assert_array_equal(layer.blobs[0].data, np.full(5, 0.25))
    assert layer.param_propagate_down == [True]
    layer, _, _ = setup(PRELU_SHARED, x)
    assert layer.blobs[0].shape == () and layer.blobs[0].count == 1   # Caffe: vector<int>(0)
    assert float(layer.blobs[0].data) == 0.25
    layer, _, _ = setup('name: "p" type: "PReLU" prelu_param { filler { type: "constant" '
                        'value: -0.1 } }', x)
    np.testing.assert_allclose(layer.blobs[0].data, np.full(5, -0.1))


def test_prelu_errors():
    layer = make_layer(PRELU)
    with pytest.raises(ValueError, match="'prelu' of type PReLU: bottom 'x' must have at least 2"):
        layer.setup([make_blob(np.zeros(4), name="x")], [Blob()])
    layer, bottom, top = setup(PRELU, np.zeros((2, 3, 4)))
    bottom.reshape((2, 4, 4))
    with pytest.raises(ValueError, match="3 negative slope.*needs 4"):
        layer.reshape([bottom], [top])


def test_prelu_slope_diff_accumulates_and_in_place_order(rng):
    """Param diffs accumulate (upstream Caffe); in place the slope gradient is taken from the
    top diff before the bottom diff overwrites it."""
    x = away_from_zero(rng)
    dy = rng.standard_normal(SHAPE)
    layer, bottom, top = setup(PRELU, x)
    layer.forward([bottom], [top])
    top.diff[...] = dy
    layer.backward([top], [True], [bottom])
    once = layer.blobs[0].diff.copy()
    np.testing.assert_allclose(once, (dy * x * (x <= 0)).sum(axis=(0, 2, 3)), rtol=1e-14)
    layer.backward([top], [True], [bottom])
    np.testing.assert_allclose(layer.blobs[0].diff, 2 * once, rtol=1e-14)
    # slope gradient only (propagate_down false): the bottom diff is left alone
    bottom.diff[...] = 7.0
    layer.backward([top], [False], [bottom])
    np.testing.assert_array_equal(bottom.diff, 7.0)


def test_prelu_gradient_at_zero_uses_slope():
    """Caffe: x <= 0 takes the slope (both in dx and in the slope gradient, where x = 0
    contributes 0)."""
    x = np.array([[0.0, 1.0, -1.0]]).T.reshape(1, 3)          # (N=1, C=3)
    y, dx, (da,), _ = run(PRELU_SHARED, x, np.ones_like(x))
    np.testing.assert_array_equal(dx, [[0.25, 1.0, 0.25]])
    assert float(da) == -1.0


def test_bnll_extremes_are_finite_and_match_caffe():
    """Caffe's kBNLL_THRESHOLD = 50 keeps exp finite; the forward never overflows."""
    x = np.array([[-1000.0, -100.0, -30.0, -1.0, 0.0, 1.0, 30.0, 49.0, 51.0, 100.0, 1000.0]])
    dy = np.ones_like(x)
    for dtype in (np.float64, np.float32):
        y, dx, _, _ = run(BNLL, x, dy, dtype=dtype)
        assert np.isfinite(y).all() and np.isfinite(dx).all()
        e = np.exp(np.minimum(x, 50.0))
        tol = dict(rtol=2e-7, atol=1e-38) if dtype == np.float32 else dict(rtol=1e-15)
        np.testing.assert_allclose(dx, e / (e + 1), **tol)     # float32 denormals: atol
        ref = np.maximum(x, 0) + np.log1p(np.exp(-np.abs(x)))
        np.testing.assert_allclose(y, ref, **tol)
    assert dx[0, -1] == 1.0 and dx[0, 0] == 0.0


def test_power_special_cases():
    x = np.array([[-1.0, 0.0, 2.0]])
    dy = np.array([[3.0, 5.0, 7.0]])
    # diff_scale = power * scale = 0: constant output, zero gradient, input ignored
    y, dx, _, _ = run('name: "p" type: "Power" power_param { power: 2 scale: 0 shift: 3 }', x,
                      dy)
    np.testing.assert_array_equal(y, [[9.0, 9.0, 9.0]])
    np.testing.assert_array_equal(dx, [[0.0, 0.0, 0.0]])
    y, dx, _, _ = run('name: "p" type: "Power" power_param { power: 0 shift: 0 }', x, dy)
    np.testing.assert_array_equal(y, [[1.0, 1.0, 1.0]])                # 0^0 read as 1
    np.testing.assert_array_equal(dx, [[0.0, 0.0, 0.0]])
    # power 1: the constant diff_scale
    y, dx, _, _ = run(POWER_LIN, x, dy)
    np.testing.assert_array_equal(y, 2 * x - 1)
    np.testing.assert_array_equal(dx, 2 * dy)
    # power 2: Caffe's form diff_scale * scale * x + diff_scale * shift
    y, dx, _, _ = run(POWER_SQ, x, dy)
    np.testing.assert_allclose(dx, dy * 2 * -1.5 * (0.5 - 1.5 * x), rtol=1e-15)
    # power 3, shift 0 at x = 0: the derivative 0 (Caffe's power * y / x is 0/0 there)
    _, dx, _, _ = run('name: "p" type: "Power" power_param { power: 3 }', x, dy)
    np.testing.assert_allclose(dx, dy * 3 * x ** 2)
    assert dx[0, 1] == 0.0


def test_power_in_place_is_caffes_quotient():
    """power_layer.cpp in place: bottom_data and top_data both hold y, so the quotient form
    gives diff_scale * y / (shift + scale * y), and power * y / y = power for shift 0."""
    x = np.array([[1.0, 2.0, 0.5]])
    dy = np.ones_like(x)
    y, dx, _, _ = run(POWER, x, dy, in_place=True)      # power 3, scale 0.5, shift 0.25
    np.testing.assert_allclose(y, (0.25 + 0.5 * x) ** 3)
    np.testing.assert_allclose(dx[0, 0], 1.5 * 0.421875 / (0.25 + 0.5 * 0.421875), rtol=1e-15)
    np.testing.assert_allclose(dx, 1.5 * y / (0.25 + 0.5 * y), rtol=1e-15)
    _, dx, _, _ = run('name: "p" type: "Power" power_param { power: 3 scale: 0.5 }', x, dy,
                      in_place=True)
    np.testing.assert_array_equal(dx, [[3.0, 3.0, 3.0]])


def test_clip_gradient_passes_at_both_bounds():
    """clip_layer.cpp: top_diff * (x >= min && x <= max)."""
    top = float(np.float32(0.7))                 # the bound as the layer holds it
    x = np.array([[-0.6, -0.5, 0.0, top, np.nextafter(top, 1.0)]])
    dy = np.ones_like(x)
    y, dx, _, _ = run(CLIP, x, dy)
    np.testing.assert_array_equal(dx, [[0.0, 1.0, 1.0, 1.0, 0.0]])
    np.testing.assert_array_equal(y, [[-0.5, -0.5, 0.0, top, top]])
    # in place Caffe reads the clipped values, all within the bounds: every gradient passes
    y, dx, _, _ = run(CLIP, x, dy, in_place=True)
    np.testing.assert_array_equal(dx, np.ones_like(x))
    np.testing.assert_array_equal(y, [[-0.5, -0.5, 0.0, top, top]])


def test_clip_min_above_max_gives_min_as_caffe():
    y = run_forward('name: "c" type: "Clip" clip_param { min: 1 max: -1 }', np.array([[0.0, 5.0]]))
    np.testing.assert_array_equal(y, [[1.0, 1.0]])


def test_swish_backward_uses_sigmoid_of_beta_x(rng):
    x = away_from_zero(rng)
    dy = rng.standard_normal(SHAPE)
    y, dx, _, layer = run(SWISH_B, x, dy)
    s = sigmoid(1.5 * x)
    np.testing.assert_allclose(to_numpy(layer.internal("sigmoid_output").data), s, rtol=1e-15)
    np.testing.assert_allclose(dx, dy * (s + 1.5 * x * s * (1 - s)), rtol=1e-12)


def test_exp_log_backward_formulas(rng):
    x = away_from_zero(rng)
    dy = rng.standard_normal(SHAPE)
    y, dx, _, _ = run(EXP_B2, x, dy)                                    # y ln2 / 2
    np.testing.assert_allclose(dx, dy * y * math.log(2) * 0.5, rtol=1e-14)
    _, dx, _, _ = run(LOG_B10, x, dy)                                   # 2 / ((5 + 2x) ln10)
    np.testing.assert_allclose(dx, dy * 2 / ((5 + 2 * x) * math.log(10)), rtol=1e-14)


@pytest.mark.parametrize("text, match", [
    ('name: "e" type: "Exp" exp_param { base: 0 }', "'e' of type Exp: base must be strictly"),
    ('name: "e" type: "Exp" exp_param { base: -2 }', "base must be strictly positive"),
    ('name: "l" type: "Log" log_param { base: -3 }', "'l' of type Log: base must be strictly"),
    ('name: "l" type: "Log" log_param { base: 1 }', "'l' of type Log: 1/log.*not be 1"),
    ('name: "c" type: "Clip"', "'c' of type Clip: clip_param .* required"),
    ('name: "c" type: "Clip" clip_param { min: 0 }', "required"),
])
def test_bad_parameters_name_the_layer(text, match):
    layer = make_layer(text)
    with pytest.raises(ValueError, match=match):
        layer.setup([make_blob(np.ones((2, 2)))], [Blob()])


def test_threshold_has_no_backward_like_caffe():
    x = np.array([[0.3, 0.30001, -1.0]])
    layer, bottom, top = setup(THRESHOLD, x)
    layer.forward([bottom], [top])
    np.testing.assert_array_equal(top.data, [[0.0, 1.0, 0.0]])
    bottom.diff[...] = 5.0
    layer.backward([top], [False], [bottom])                  # nothing asked: nothing done
    np.testing.assert_array_equal(bottom.diff, 5.0)
    with pytest.raises(NotImplementedError, match="'thr' of type Threshold has no backward"):
        layer.backward([top], [True], [bottom])
    assert layer.backward_reads() == BackwardReads()


# ----------------------------------------------------------------------- nets
def net_param(text):
    return parse_text(text, caffe_pb2.NetParameter, filename="<test net>")


PRELU_NET = """
name: "prelu_net"
layer { name: "data" type: "Input" top: "data"
  input_param { shape { dim: 2 dim: 3 dim: 4 dim: 4 } } }
layer { name: "conv" type: "Convolution" bottom: "data" top: "conv"
  convolution_param { num_output: 5 kernel_size: 3 weight_filler { type: "gaussian" std: 0.3 } } }
layer { name: "prelu" type: "PReLU" bottom: "conv" top: "conv" }
layer { name: "prelu_s" type: "PReLU" bottom: "conv" top: "out"
  prelu_param { channel_shared: true } }
"""


def test_prelu_caffemodel_round_trip(tmp_path, rng):
    a = Net(net_param(PRELU_NET), TEST, mode="CPU", dtype=np.float32)
    a.layers[a.layer_index("prelu")].blobs[0].data[...] = rng.uniform(-1, 1, 5)
    a.layers[a.layer_index("prelu_s")].blobs[0].data[...] = -0.375
    path = tmp_path / "prelu.caffemodel"
    a.save(str(path))
    b = Net(net_param(PRELU_NET), TEST, weights=str(path), mode="CPU", dtype=np.float32)
    for name in ("conv", "prelu", "prelu_s"):
        for pa, pb in zip(a.params[name], b.params[name]):
            assert pa.shape == pb.shape
            np.testing.assert_array_equal(pb.data, pa.data)
    assert b.params["prelu_s"][0].shape == ()
    x = rng.standard_normal((2, 3, 4, 4)).astype(np.float32)
    outs = []
    for n in (a, b):
        n.blobs["data"].data[...] = x
        outs.append(n.forward()["out"].copy())
    np.testing.assert_array_equal(outs[0], outs[1])


def test_prelu_loads_other_writers_shapes(rng):
    """Slopes in the legacy 4-d form load as Caffe's Blob::ShapeEquals allows (the blob's
    shape left-padded with ones): a shared slope as (1, 1, 1, 1), per-channel slopes as
    (1, 1, 1, C).  A shared slope written with ``shape { dim: 1 }`` does not: ShapeEquals
    compares a ``shape`` exactly, and the 0-d blob has no axes.  A wrong count is an error
    that names the layer."""
    net = Net(net_param(PRELU_NET), TEST, mode="CPU")
    src = net.to_proto()
    by_name = {lp.name: lp for lp in src.layer}
    shared = by_name["prelu_s"].blobs[0]
    shared.Clear()
    shared.shape.dim.append(1)
    shared.data.append(0.125)
    with pytest.raises(ValueError, match="'prelu_s'; shape mismatch: source param shape is "
                                         r"\(1,\), target param shape is \(\)"):
        net.copy_from(src)
    shared.Clear()
    shared.num, shared.channels, shared.height, shared.width = 1, 1, 1, 1
    shared.data.append(0.125)
    slopes = rng.uniform(-1, 1, 5).astype(np.float32)
    blob = by_name["prelu"].blobs[0]
    blob.Clear()
    blob.num, blob.channels, blob.height, blob.width = 1, 1, 1, 5
    blob.data.extend(slopes.tolist())
    net.copy_from(src)
    assert float(net.params["prelu_s"][0].data) == 0.125
    np.testing.assert_array_equal(net.params["prelu"][0].data, slopes)
    blob.Clear()
    blob.shape.dim.append(6)
    blob.data.extend([0.0] * 6)
    with pytest.raises(ValueError, match="'prelu'"):
        net.copy_from(src)


# In-place chains follow Caffe's rule: a layer whose backward reads its top (ELU, Exp,
# Swish) is the last in-place writer of that blob, or its top would be overwritten.  BNLL,
# Power, Log and Clip run out of place here: in place their backward reads the output, as
# Caffe's does, and the finite-difference check below wants the true gradient.
ACT_NET = """
name: "activations"
layer { name: "data" type: "DummyData" top: "data" top: "label"
  dummy_data_param { shape { dim: 4 dim: 3 dim: 6 dim: 6 } shape { dim: 4 }
    data_filler { type: "gaussian" std: 1 } data_filler { type: "uniform" min: 0 max: 2.99 } } }
layer { name: "mask" type: "Threshold" bottom: "data" top: "mask"
  threshold_param { threshold: -0.5 } }
layer { name: "masked" type: "Eltwise" bottom: "data" bottom: "mask" top: "masked"
  eltwise_param { operation: PROD } }
layer { name: "conv1" type: "Convolution" bottom: "masked" top: "conv1"
  convolution_param { num_output: 4 kernel_size: 3 pad: 1
    weight_filler { type: "gaussian" std: 0.3 } } }
layer { name: "prelu1" type: "PReLU" bottom: "conv1" top: "conv1" }
layer { name: "pow1" type: "Power" bottom: "conv1" top: "pow1"
  power_param { power: 2 scale: 0.5 shift: -0.2 } }
layer { name: "elu1" type: "ELU" bottom: "pow1" top: "elu1" elu_param { alpha: 0.8 } }
layer { name: "conv2" type: "Convolution" bottom: "elu1" top: "conv2"
  convolution_param { num_output: 4 kernel_size: 3 pad: 1
    weight_filler { type: "gaussian" std: 0.3 } } }
layer { name: "gate" type: "Threshold" bottom: "conv2" top: "gate" propagate_down: false }
layer { name: "gated" type: "Eltwise" bottom: "conv2" bottom: "gate" top: "gated"
  eltwise_param { operation: PROD } }
layer { name: "bnll" type: "BNLL" bottom: "gated" top: "bnll" }
layer { name: "swish" type: "Swish" bottom: "bnll" top: "bnll" swish_param { beta: 1.2 } }
layer { name: "abs" type: "AbsVal" bottom: "bnll" top: "abs" }
layer { name: "clip" type: "Clip" bottom: "abs" top: "clip" clip_param { min: 0.2 max: 3 } }
layer { name: "ip1" type: "InnerProduct" bottom: "clip" top: "ip1"
  inner_product_param { num_output: 8 weight_filler { type: "gaussian" std: 0.1 } } }
layer { name: "prelu2" type: "PReLU" bottom: "ip1" top: "ip1" prelu_param { channel_shared: true } }
layer { name: "pow2" type: "Power" bottom: "ip1" top: "pow2" power_param { power: 2 shift: 0.5 } }
layer { name: "log" type: "Log" bottom: "pow2" top: "log" log_param { shift: 1 } }
layer { name: "exp" type: "Exp" bottom: "log" top: "log" exp_param { base: 2 scale: 0.5 } }
layer { name: "ip2" type: "InnerProduct" bottom: "log" top: "ip2"
  inner_product_param { num_output: 3 weight_filler { type: "gaussian" std: 0.3 } } }
layer { name: "loss" type: "SoftmaxWithLoss" bottom: "ip2" bottom: "label" top: "loss" }
"""


def test_net_of_activations_forward_backward():
    from minicaffe.rng import set_random_seed
    set_random_seed(5)
    net = Net(net_param(ACT_NET), TRAIN, mode="CPU", dtype=np.float64)
    assert not net.layer_need_backward[net.layer_index("mask")]    # nothing below needs it
    # propagate_down: false; the layer still runs backward (its top has a diff), as in Caffe,
    # where NOT_IMPLEMENTED would abort here; minicaffe refuses only a bottom gradient
    gate = net.layer_index("gate")
    assert net.layer_need_backward[gate] and net.bottom_need_backward[gate] == [False]
    assert net.layer_need_backward[net.layer_index("swish")]
    net.forward()
    net.clear_param_diffs()
    net.backward()
    loss = float(net.blobs["loss"].data)
    assert np.isfinite(loss) and loss > 0
    for name in ("conv1", "prelu1", "conv2", "ip1", "prelu2", "ip2"):
        for p in net.params[name]:
            assert np.isfinite(p.diff).all() and np.abs(p.diff).max() > 0, name
    # PReLU in place keeps a copy of its input (Caffe's bottom_memory_); nothing else does
    assert "bottom_copy" in net.layers[net.layer_index("prelu1")].internals
    assert not net.layers[net.layer_index("clip")].internals
    assert not net.layers[net.layer_index("pow1")].internals
    assert not net.layers[net.layer_index("elu1")].internals
    assert not net.layers[net.layer_index("exp")].internals


def test_net_gradient_matches_finite_difference():
    """The slope of prelu2 (shared, in place, between an InnerProduct and Power/Log/Exp)
    against a central difference of the whole net's loss."""
    from minicaffe.rng import set_random_seed
    set_random_seed(5)
    net = Net(net_param(ACT_NET), TRAIN, mode="CPU", dtype=np.float64)
    # DummyData refills from its fillers each forward: keep its first batch fixed
    net.forward()
    data, label = net.blobs["data"].data.copy(), net.blobs["label"].data.copy()
    first = net.layer_index("mask")

    def loss():
        net.blobs["data"].data[...] = data
        net.blobs["label"].data[...] = label
        net.forward_from_to(first)
        return float(net.blobs["loss"].data)

    loss()
    net.clear_param_diffs()
    net.backward()
    slope = net.params["prelu2"][0]
    analytic = float(slope.diff)
    a0 = float(slope.data)
    eps = 1e-6
    slope.data[...] = a0 + eps
    fp = loss()
    slope.data[...] = a0 - eps
    fm = loss()
    slope.data[...] = a0
    np.testing.assert_allclose(analytic, (fp - fm) / (2 * eps), rtol=1e-6, atol=1e-9)


def test_threshold_in_a_net_that_needs_its_gradient_fails_naming_it():
    net = Net(net_param("""
    layer { name: "data" type: "Input" top: "data" top: "label"
            input_param { shape { dim: 2 dim: 3 } shape { dim: 2 } } }
    layer { name: "ip" type: "InnerProduct" bottom: "data" top: "ip"
            inner_product_param { num_output: 3 } }
    layer { name: "step" type: "Threshold" bottom: "ip" top: "step" }
    layer { name: "ip2" type: "InnerProduct" bottom: "step" top: "ip2"
            inner_product_param { num_output: 2 } }
    layer { name: "loss" type: "SoftmaxWithLoss" bottom: "ip2" bottom: "label" top: "loss" }
    """), TRAIN, mode="CPU")
    net.forward()
    with pytest.raises(NotImplementedError, match="'step' of type Threshold has no backward"):
        net.backward()


def make_solver(seed=3):
    return sgd_solver(net_param(ACT_NET), seed=seed)


def train(lowering, iters=6, strategy=None):
    """(params, history, losses) after ``iters`` SGD steps with the convolutions' ``lowering``,
    under a swap plan if given (every fresh or released region of the arena poisoned with
    NaN)."""
    return train_steps(make_solver(), iters, strategy, None, lowering)[:3]


@pytest.mark.parametrize("lowering", ["caffe", "chunked"])
def test_memory_planner_accepts_the_net_and_naive_is_bit_identical(lowering):
    """The GMAP holds the new layers' internals; training under `none` and `naive` (the
    arena poisoned with NaN wherever a buffer is not live) gives exactly the plain run's
    parameters, history and losses, so the declared reads and internals are complete."""
    from swap.gmap import SAVED, SCRATCH, build_gmap
    g = build_gmap(make_solver().net)
    names = {b.name: b for b in g.buffers}
    assert names["saved:prelu1/bottom_copy"].kind == SAVED
    assert "saved:clip/bottom_copy" not in names
    assert names["saved:swish/sigmoid_output"].kind == SAVED
    assert names["scratch:swish/sigmoid_input"].kind == SCRATCH
    base = train(lowering)
    assert np.isfinite(base[2]).all()
    for strategy in ("none", "naive"):
        params, history, losses = train(lowering, strategy=strategy)
        assert losses == base[2], strategy
        assert all(np.array_equal(a, b) for a, b in zip(params, base[0])), strategy
        assert all(np.array_equal(a, b) for a, b in zip(history, base[1])), strategy


# ----------------------------------------------------------------------- GPU
def rel_err(a, b):
    return float(np.max(np.abs(a - b)) / max(np.max(np.abs(b)), 1e-30))


@pytest.mark.gpu
@pytest.mark.parametrize("text", DIFFERENTIABLE)
@pytest.mark.parametrize("in_place", [False, True])
def test_gpu_matches_cpu(cp, text, in_place):
    if in_place and text == ABSVAL:
        return
    rng = np.random.default_rng(1)
    x = sample(text, rng, (4, 8, 5, 5)).astype(np.float32)
    dy = rng.standard_normal(x.shape).astype(np.float32)
    slopes = None
    if text in (PRELU, PRELU_SHARED):
        slopes = rng.uniform(-0.5, 0.8, size=() if text == PRELU_SHARED else (8,))
    yc, dxc, pc, _ = run(text, x, dy, in_place=in_place, dtype=np.float32, slopes=slopes)
    yg, dxg, pg, _ = run(text, x, dy, in_place=in_place, xp=cp, dtype=np.float32,
                         slopes=slopes, poison=True)
    assert rel_err(yg, yc) <= 1e-5
    assert rel_err(dxg, dxc) <= 1e-5
    for g, c in zip(pg, pc):
        assert rel_err(g, c) <= 1e-5


@pytest.mark.gpu
@pytest.mark.parametrize("in_place", [False, True])
def test_gpu_threshold_matches_cpu(cp, in_place):
    rng = np.random.default_rng(1)
    x = rng.standard_normal((4, 8, 5, 5)).astype(np.float32)
    layer, bottom, top = setup(THRESHOLD, x, in_place, xp=cp, dtype=np.float32)
    layer.forward([bottom], [top])
    np.testing.assert_array_equal(to_numpy(top.data), (x > np.float32(0.3)).astype(np.float32))
