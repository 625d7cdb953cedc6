"""LSTMUnit, LSTM and RNN: forward against hand formulas and a step-by-step NumPy reference
written from Caffe's unrolled nets (lstm_layer.cpp, rnn_layer.cpp), LSTM against torch.nn.LSTM,
the cont indicators, the carried and the exposed state, float64 gradient checks, errors,
.caffemodel loading, a small net trained plainly and under the memory planner's plans, and GPU
parity."""
import numpy as np
import pytest

from minicaffe.backend import to_numpy
from minicaffe.blob import Blob
from minicaffe.layer import BackwardReads
from minicaffe.testing import (check_gradient, make_blob, make_layer, numerical_gradients,
                               sgd_solver, train_steps)


def sigmoid(x):
    return 1 / (1 + np.exp(-x))


def tops(n, xp=np, dtype=np.float64):
    return [Blob(xp=xp, dtype=dtype, name=f"top{i}") for i in range(n)]


# ----------------------------------------------------------------------------- LSTMUnit
UNIT = 'name: "unit" type: "LSTMUnit"'


def unit_bottoms(rng, n=3, h=2, cont=(1.0, 0.0, 1.0)):
    return [make_blob(rng.standard_normal((1, n, h)), name="c_prev"),
            make_blob(2 * rng.standard_normal((1, n, 4 * h)), name="gates"),
            make_blob(np.array([cont]), name="cont")]


def unit_reference(c_prev, x, cont):
    """Caffe's LSTMUnit Forward_cpu: gates i, f, o, g; f scaled by cont; no clipping."""
    h = c_prev.shape[-1]
    i, f, o = (sigmoid(x[..., k * h:(k + 1) * h]) for k in range(3))
    g = np.tanh(x[..., 3 * h:])
    c = cont[..., None] * f * c_prev + i * g
    return c, o * np.tanh(c)


@pytest.mark.parametrize("cont", [(1.0, 0.0, 1.0), (0.5, 1.0, 0.25)])
def test_unit_forward_and_backward_by_hand(cont, rng):
    layer = make_layer(UNIT)
    bottom, top = unit_bottoms(rng, cont=cont), tops(2)
    layer.setup(bottom, top)
    assert top[0].shape == top[1].shape == (1, 3, 2)
    layer.forward(bottom, top)
    c_prev, x, k = (to_numpy(b.data) for b in bottom)
    c, h = unit_reference(c_prev, x, k)
    np.testing.assert_allclose(to_numpy(top[0].data), c, rtol=1e-12)
    np.testing.assert_allclose(to_numpy(top[1].data), h, rtol=1e-12)
    dc, dh = rng.standard_normal(c.shape), rng.standard_normal(c.shape)
    top[0].diff[...], top[1].diff[...] = dc, dh
    layer.backward(top, [True, True, False], bottom)
    H = 2
    i, sf, o = (sigmoid(x[..., j * H:(j + 1) * H]) for j in range(3))
    g = np.tanh(x[..., 3 * H:])
    c_term = dc + dh * o * (1 - np.tanh(c) ** 2)
    kk = k[..., None]
    np.testing.assert_allclose(to_numpy(bottom[0].diff), c_term * kk * sf, rtol=1e-12)
    expected = np.concatenate([c_term * g * i * (1 - i),
                               c_term * c_prev * kk * sf * (1 - sf),   # exact d/dX_f
                               dh * np.tanh(c) * o * (1 - o),
                               c_term * i * (1 - g * g)], axis=-1)
    np.testing.assert_allclose(to_numpy(bottom[1].diff), expected, rtol=1e-12, atol=1e-15)


def test_unit_has_no_clipping(rng):
    """Large gate inputs saturate; nothing clips c (it grows past 1 across steps)."""
    layer = make_layer(UNIT)
    bottom = [make_blob(np.full((1, 1, 1), 5.0)), make_blob([[[30.0, 30.0, 30.0, 30.0]]]),
              make_blob([[1.0]])]
    top = tops(2)
    layer.setup(bottom, top)
    layer.forward(bottom, top)
    np.testing.assert_allclose(to_numpy(top[0].data), 6.0, rtol=1e-12)


def test_unit_gradient(rng):
    layer = make_layer(UNIT)
    assert not layer.allow_force_backward(2)
    check_gradient(layer, unit_bottoms(rng, n=4, h=3, cont=(1.0, 0.0, 1.0, 1.0)), tops(2))


def test_unit_refuses_gradient_to_cont_and_declares_reads(rng):
    layer = make_layer(UNIT)
    bottom, top = unit_bottoms(rng), tops(2)
    layer.setup(bottom, top)
    assert layer.backward_reads() == BackwardReads(bottom=(0, 1, 2), top=(0,))
    assert layer.internals == {}
    layer.forward(bottom, top)
    with pytest.raises(ValueError, match="'unit' of type LSTMUnit: cannot backpropagate to "
                                         "sequence indicators"):
        layer.backward(top, [True, True, True], bottom)


@pytest.mark.parametrize("shapes,match", [
    (((1, 3, 2), (1, 3, 7), (1, 3)), "must hold 4 \\* H = 8 gate inputs"),
    (((1, 3, 2), (1, 2, 8), (1, 3)), "bottom\\[1\\] 'b1' of shape \\(1, 2, 8\\)"),
    (((2, 3, 2), (2, 3, 8), (2, 3)), "bottom\\[0\\] 'b0' of shape \\(2, 3, 2\\)"),
    (((1, 3, 2), (1, 3, 8), (1, 3, 1)), "bottom\\[2\\] 'b2'.*must have 2 axes"),
])
def test_unit_shape_errors(shapes, match):
    layer = make_layer(UNIT)
    bottom = [make_blob(np.zeros(s), name=f"b{i}") for i, s in enumerate(shapes)]
    with pytest.raises(ValueError, match=f"'unit' of type LSTMUnit: .*{match}"):
        layer.setup(bottom, tops(2))


# -------------------------------------------------------------- LSTM and RNN references
def rec_text(kind, num_output=3, extra=""):
    return (f'name: "{kind.lower()}" type: "{kind}" recurrent_param {{ num_output: {num_output} '
            'weight_filler { type: "gaussian" std: 0.5 } '
            f'bias_filler {{ type: "uniform" min: -0.5 max: 0.5 }} {extra} }}')


def lstm_reference(params, x, cont, x_static=None, h0=None, c0=None):
    """Caffe's unrolled LSTM, step by step (lstm_layer.cpp, FillUnrolledNet)."""
    if x_static is None:
        w_xc, b_c, w_hc = params
    else:
        w_xc, b_c, w_xs, w_hc = params
    T, N = cont.shape
    H = w_hc.shape[1]
    h = np.zeros((N, H)) if h0 is None else h0.reshape(N, H)
    c = np.zeros((N, H)) if c0 is None else c0.reshape(N, H)
    out = []
    for t in range(T):
        k = cont[t][:, None]
        a = (k * h) @ w_hc.T + (x[t].reshape(N, -1) @ w_xc.T + b_c)
        if x_static is not None:
            a = a + x_static.reshape(N, -1) @ w_xs.T
        i, f, o = (sigmoid(a[:, j * H:(j + 1) * H]) for j in range(3))
        g = np.tanh(a[:, 3 * H:])
        c = k * f * c + i * g
        h = o * np.tanh(c)
        out.append(h)
    return np.stack(out), h[None], c[None]


def rnn_reference(params, x, cont, x_static=None, h0=None):
    """Caffe's unrolled RNN, step by step (rnn_layer.cpp, FillUnrolledNet)."""
    if x_static is None:
        w_xh, b_h, w_hh, w_ho, b_o = params
    else:
        w_xh, b_h, w_xs, w_hh, w_ho, b_o = params
    T, N = cont.shape
    H = w_hh.shape[0]
    h = np.zeros((N, H)) if h0 is None else h0.reshape(N, H)
    out = []
    for t in range(T):
        a = (cont[t][:, None] * h) @ w_hh.T + (x[t].reshape(N, -1) @ w_xh.T + b_h)
        if x_static is not None:
            a = a + x_static.reshape(N, -1) @ w_xs.T
        h = np.tanh(a)
        out.append(np.tanh(h @ w_ho.T + b_o))
    return np.stack(out), h[None]


REFERENCES = {"LSTM": lstm_reference, "RNN": rnn_reference}


def rec_setup(kind, rng, T=5, N=3, xshape=(2, 2), static=False, cont=None, extra="",
              num_output=3, xp=np, dtype=np.float64):
    layer = make_layer(rec_text(kind, num_output, extra), xp=xp, dtype=dtype)
    if cont is None:
        cont = np.ones((T, N))
        cont[0] = 0
    bottom = [make_blob(rng.standard_normal((T, N) + xshape), xp=xp, dtype=dtype, name="x"),
              make_blob(cont, xp=xp, dtype=dtype, name="cont")]
    if static:
        bottom.append(make_blob(rng.standard_normal((N, 4)), xp=xp, dtype=dtype,
                                name="x_static"))
    return layer, bottom


def params_of(layer):
    return [to_numpy(p.data) for p in layer.blobs]


@pytest.mark.parametrize("kind,static,shapes", [
    ("LSTM", False, [(12, 4), (12,), (12, 3)]),
    ("LSTM", True, [(12, 4), (12,), (12, 4), (12, 3)]),
    ("RNN", False, [(3, 4), (3,), (3, 3), (3, 3), (3,)]),
    ("RNN", True, [(3, 4), (3,), (3, 4), (3, 3), (3, 3), (3,)]),
])
def test_forward_against_reference(kind, static, shapes, rng):
    """Params in Caffe's order and shapes; cont = 0 at t = 0 and in mid-sequence for one
    stream; the output against the step-by-step reference."""
    cont = np.ones((6, 3))
    cont[0] = 0
    cont[3, 1] = 0
    layer, bottom = rec_setup(kind, rng, T=6, static=static, cont=cont)
    top = tops(1)
    layer.setup(bottom, top)
    assert [p.shape for p in layer.blobs] == shapes
    assert top[0].shape == (6, 3, 3)
    layer.forward(bottom, top)
    xs = to_numpy(bottom[2].data) if static else None
    expected = REFERENCES[kind](params_of(layer), to_numpy(bottom[0].data), cont, xs)[0]
    np.testing.assert_allclose(to_numpy(top[0].data), expected, rtol=1e-12, atol=1e-14)


@pytest.mark.parametrize("kind", ["LSTM", "RNN"])
def test_cont_zero_restarts_the_state(kind, rng):
    """From a step with cont = 0 on, a stream's outputs are those of a fresh sequence."""
    cont = np.ones((7, 2))
    cont[0] = 0
    cont[4, 0] = 0
    layer, bottom = rec_setup(kind, rng, T=7, N=2, cont=cont)
    top = tops(1)
    layer.setup(bottom, top)
    layer.forward(bottom, top)
    out = to_numpy(top[0].data)
    fresh = REFERENCES[kind](params_of(layer), to_numpy(bottom[0].data)[4:, :1],
                             np.ones((3, 1)))[0]
    np.testing.assert_allclose(out[4:, :1], fresh, rtol=1e-12, atol=1e-14)
    # the other stream went on: not the fresh answer
    fresh1 = REFERENCES[kind](params_of(layer), to_numpy(bottom[0].data)[4:, 1:],
                              np.ones((3, 1)))[0]
    assert np.abs(out[4:, 1:] - fresh1).max() > 1e-3


@pytest.mark.parametrize("kind", ["LSTM", "RNN"])
def test_state_carries_across_forwards(kind, rng):
    """Without expose_hidden Caffe copies h_T (c_T) into h_0 (c_0) before each forward: two
    halves with cont = 1 at the second's start give the whole sequence; reset() zeroes it."""
    cont = np.ones((8, 2))
    cont[0] = 0
    x = rng.standard_normal((8, 2, 3))
    whole, _ = rec_setup(kind, rng, T=8, N=2, xshape=(3,), cont=cont)
    whole.blobs = []
    half = make_layer(rec_text(kind))
    hb = [make_blob(x[:4], name="x"), make_blob(cont[:4], name="cont")]
    ht = tops(1)
    half.setup(hb, ht)
    half.forward(hb, ht)
    first = to_numpy(ht[0].data).copy()
    hb[0].data[...], hb[1].data[...] = x[4:], cont[4:]
    half.forward(hb, ht)
    expected = REFERENCES[kind](params_of(half), x, cont)[0]
    np.testing.assert_allclose(np.concatenate([first, to_numpy(ht[0].data)]), expected,
                               rtol=1e-12, atol=1e-14)
    half.reset()
    half.forward(hb, ht)
    np.testing.assert_allclose(to_numpy(ht[0].data),
                               REFERENCES[kind](params_of(half), x[4:], cont[4:])[0],
                               rtol=1e-12, atol=1e-14)


@pytest.mark.parametrize("kind,static", [("LSTM", False), ("LSTM", True), ("RNN", False),
                                         ("RNN", True)])
def test_expose_hidden(kind, static, rng):
    """Bottoms h_0 (c_0) after x, cont[, x_static]; tops h_T (c_T); no state carried; no
    gradient to the initial states (Caffe shares only their data)."""
    n_states = 2 if kind == "LSTM" else 1
    cont = np.ones((4, 3))
    layer, bottom = rec_setup(kind, rng, T=4, static=static, cont=cont,
                              extra="expose_hidden: true")
    states = [rng.standard_normal((1, 3, 3)) for _ in range(n_states)]
    bottom += [make_blob(s, name=f"s{i}") for i, s in enumerate(states)]
    top = tops(1 + n_states)
    layer.setup(bottom, top)
    assert [t.shape for t in top] == [(4, 3, 3)] + [(1, 3, 3)] * n_states
    for _ in range(2):                       # the same answer twice: nothing carried
        layer.forward(bottom, top)
        xs = to_numpy(bottom[2].data) if static else None
        ref = REFERENCES[kind](params_of(layer), to_numpy(bottom[0].data), cont, xs, *states)
        for t, r in zip(top, ref):
            np.testing.assert_allclose(to_numpy(t.data), r, rtol=1e-12, atol=1e-14)
    # the gradient is that of the output alone: Caffe drops the final states' top diffs
    first = 3 if static else 2
    checked = [0] + ([2] if static else [])
    w = [rng.standard_normal(top[0].shape)] + [np.zeros((1, 3, 3))] * n_states
    numeric = numerical_gradients(layer, bottom, top, w, [bottom[i] for i in checked]
                                  + layer.blobs, 1e-6, 0)
    layer.forward(bottom, top)
    top[0].diff[...] = w[0]
    for t in top[1:]:
        t.diff[...] = rng.standard_normal(t.shape)              # ignored, as in Caffe
    for p in layer.blobs:
        p.diff[...] = 0
    for b in bottom[first:]:
        b.diff[...] = np.nan
    layer.backward(top, [True, False] + [True] * (len(bottom) - 2), bottom)
    analytic = [to_numpy(bottom[i].diff) for i in checked] + [to_numpy(p.diff)
                                                              for p in layer.blobs]
    for a, n in zip(analytic, numeric):
        np.testing.assert_allclose(a, n, rtol=1e-5, atol=1e-7)
    for b in bottom[first:]:
        np.testing.assert_array_equal(to_numpy(b.diff), 0)


def test_lstm_against_torch(rng):
    """torch.nn.LSTM with Caffe's weights, its gate order i, f, g, o (Caffe's: i, f, o, g),
    b_ih = b_c, b_hh = 0; cont = 1 after t = 0, an initial state given by expose_hidden."""
    torch = pytest.importorskip("torch")
    T, N, D, H = 6, 3, 4, 5
    layer = make_layer(rec_text("LSTM", H, "expose_hidden: true"))
    cont = np.ones((T, N))
    bottom = [make_blob(rng.standard_normal((T, N, D)), name="x"), make_blob(cont, name="cont"),
              make_blob(rng.standard_normal((1, N, H)), name="h0"),
              make_blob(rng.standard_normal((1, N, H)), name="c0")]
    top = tops(3)
    layer.setup(bottom, top)
    layer.forward(bottom, top)
    dy = rng.standard_normal((T, N, H))
    top[0].diff[...] = dy
    for p in layer.blobs:
        p.diff[...] = 0
    layer.backward(top, [True, False, False, False], bottom)

    order = np.r_[0:2 * H, 3 * H:4 * H, 2 * H:3 * H]            # Caffe i f o g -> torch i f g o
    w_xc, b_c, w_hc = params_of(layer)
    m = torch.nn.LSTM(D, H).double()
    with torch.no_grad():
        m.weight_ih_l0.copy_(torch.tensor(w_xc[order]))
        m.weight_hh_l0.copy_(torch.tensor(w_hc[order]))
        m.bias_ih_l0.copy_(torch.tensor(b_c[order]))
        m.bias_hh_l0.zero_()
    tx = torch.tensor(to_numpy(bottom[0].data), requires_grad=True)
    h0, c0 = (torch.tensor(to_numpy(b.data)) for b in bottom[2:])
    y, (hT, cT) = m(tx, (h0, c0))
    y.backward(torch.tensor(dy))
    np.testing.assert_allclose(to_numpy(top[0].data), y.detach().numpy(), rtol=1e-10,
                               atol=1e-12)
    np.testing.assert_allclose(to_numpy(top[1].data), hT.detach().numpy(), rtol=1e-10)
    np.testing.assert_allclose(to_numpy(top[2].data), cT.detach().numpy(), rtol=1e-10)
    inv = np.argsort(order)                                      # torch -> Caffe order
    np.testing.assert_allclose(to_numpy(bottom[0].diff), tx.grad.numpy(), rtol=1e-9,
                               atol=1e-12)
    for mine, ref in ((layer.blobs[0].diff, m.weight_ih_l0.grad),
                      (layer.blobs[1].diff, m.bias_ih_l0.grad),
                      (layer.blobs[2].diff, m.weight_hh_l0.grad)):
        np.testing.assert_allclose(to_numpy(mine), ref.numpy()[inv], rtol=1e-9, atol=1e-12)


@pytest.mark.parametrize("kind", ["LSTM", "RNN"])
@pytest.mark.parametrize("static", [False, True])
def test_gradient(kind, static, rng):
    """x, x_static and every param, with cont = 0 at t = 0 and once in mid-sequence (a
    zero cont also makes the objective independent of the carried state)."""
    cont = np.ones((4, 2))
    cont[0] = 0
    cont[2, 1] = 0
    layer, bottom = rec_setup(kind, rng, T=4, N=2, static=static, cont=cont)
    assert not layer.allow_force_backward(1)
    check_gradient(layer, bottom, check_bottom=[0, 2] if static else [0])


def test_gradient_with_fractional_cont(rng):
    """cont may be any number: it scales the carried h and f (the exact derivative)."""
    cont = rng.uniform(0.2, 0.9, (4, 2))
    cont[0] = 0
    layer, bottom = rec_setup("LSTM", rng, T=4, N=2, cont=cont)
    check_gradient(layer, bottom, check_bottom=[0])


@pytest.mark.parametrize("kind", ["LSTM", "RNN"])
def test_param_diffs_accumulate_and_frozen_params(kind, rng):
    layer, bottom = rec_setup(kind, rng)
    top = tops(1)
    layer.setup(bottom, top)
    layer.forward(bottom, top)
    top[0].diff[...] = rng.standard_normal(top[0].shape)
    layer.backward(top, [True, False], bottom)
    once = [to_numpy(p.diff).copy() for p in layer.blobs]
    dx = to_numpy(bottom[0].diff).copy()
    layer.backward(top, [True, False], bottom)
    for p, d in zip(layer.blobs, once):
        np.testing.assert_allclose(to_numpy(p.diff), 2 * d, rtol=1e-12)
    np.testing.assert_allclose(to_numpy(bottom[0].diff), dx)       # overwritten
    # Caffe's RecurrentLayer::Backward_cpu runs the unrolled net's whole backward
    # ("unconditionally"): params the outer net froze (lr_mult 0) still accumulate their
    # gradients, and x gets its diff even where propagate_down says no
    layer.param_propagate_down = [False] * len(layer.blobs)
    assert layer.backward_reads().bottom == (0, 1)
    bottom[0].diff[...] = 0
    layer.backward(top, [False, False], bottom)
    for p, d in zip(layer.blobs, once):
        np.testing.assert_allclose(to_numpy(p.diff), 3 * d, rtol=1e-12)
    np.testing.assert_allclose(to_numpy(bottom[0].diff), dx, rtol=1e-12)
    # where a memory plan holds x's diff storage and did not place it, it stays out
    bottom[0].diff_storage.array = None
    bottom[0].diff_storage.external = True
    layer.backward(top, [False, False], bottom)
    assert not bottom[0].has_diff


def test_declarations(rng):
    layer, bottom = rec_setup("LSTM", rng, T=5, N=3, static=True)
    top = tops(1)
    layer.setup(bottom, top)
    assert layer.backward_reads() == BackwardReads(bottom=(0, 1, 2), internals=("h", "c",
                                                                                 "gates"))
    its = layer.internals
    assert its["h"].saved and its["c"].saved and its["gates"].saved
    assert not its["gates_diff"].saved and its["gates_diff"].uses == ("backward",)
    assert its["h"].blob.shape == (6, 3, 3) and its["gates"].blob.shape == (5, 3, 12)
    fwd, bwd = layer.flops(bottom, top)
    gemm = 2.0 * 5 * 3 * 12 * (4 + 3) + 2.0 * 3 * 12 * 4
    assert fwd == gemm + 30 * 45 and bwd == 2 * gemm + 40 * 45
    rnn, rb = rec_setup("RNN", rng)
    rnn.setup(rb, tops(1))
    assert rnn.backward_reads() == BackwardReads(bottom=(0, 1), internals=("h", "o"))
    assert set(rnn.internals) == {"h", "o", "h_diff"}
    with pytest.raises(ValueError, match="'lstm' of type LSTM: cannot backpropagate to "
                                         "sequence indicators"):
        layer.forward(bottom, top)
        layer.backward(top, [True, True, False], bottom)


@pytest.mark.parametrize("kind", ["LSTM", "RNN"])
def test_errors_name_the_layer(kind, rng):
    name = kind.lower()

    def setup(shapes, extra="", num_output=3, n_top=1):
        layer = make_layer(rec_text(kind, num_output, extra))
        bottom = [make_blob(np.zeros(s), name=f"b{i}") for i, s in enumerate(shapes)]
        layer.setup(bottom, tops(n_top))
        return layer, bottom

    pre = f"'{name}' of type {kind}: "
    with pytest.raises(ValueError, match=pre + "num_output must be positive"):
        setup([(4, 2, 3), (4, 2)], num_output=0)
    with pytest.raises(ValueError, match=pre + r"bottom\[0\] 'b0' of shape \(4, 2\) must "
                                               "have at least 3 axes"):
        setup([(4, 2), (4, 2)])
    with pytest.raises(ValueError, match=pre + r"bottom\[1\] \(cont\) 'b1' of shape \(4, 3\) "
                                               r"must be \(T, N\) = \(4, 2\)"):
        setup([(4, 2, 3), (4, 3)])
    with pytest.raises(ValueError, match=pre + r"bottom\[2\] \(x_static\) 'b2' of shape "
                                               r"\(3, 5\) must be \(N = 2"):
        setup([(4, 2, 3), (4, 2), (3, 5)])
    with pytest.raises(ValueError, match=pre + "takes at most 3 bottom"):
        setup([(4, 2, 3), (4, 2), (2, 5), (1, 2, 3)])
    n_states = 2 if kind == "LSTM" else 1
    with pytest.raises(ValueError, match=pre + r"bottom\[2\] \(h_0\) 'b2' of shape \(1, 2, 4\) "
                                               r"must match the hidden state input shape "
                                               r"\(1, 2, 3\)"):
        setup([(4, 2, 3), (4, 2), (1, 2, 4)] + [(1, 2, 3)] * (n_states - 1),
              "expose_hidden: true", n_top=1 + n_states)
    with pytest.raises(ValueError, match=pre + f"takes exactly {1 + n_states} top"):
        setup([(4, 2, 3), (4, 2)] + [(1, 2, 3)] * n_states, "expose_hidden: true")
    layer, bottom = setup([(4, 2, 3), (4, 2)])
    bottom[0].reshape(5, 2, 3)
    bottom[1].reshape(5, 2)
    with pytest.raises(ValueError, match=pre + "bottom.*cannot change"):
        layer.reshape(bottom, tops(1))
    bottom[0].reshape(4, 7, 3)                    # another N is fine
    bottom[1].reshape(4, 7)
    top = tops(1)
    layer.reshape(bottom, top)
    assert top[0].shape == (4, 7, 3)


# ------------------------------------------------------------------------ .caffemodel
def net_text(kind, static=False):
    s = ' input: "xs" input_shape { dim: 3 dim: 4 }' if static else ""
    sb = ' bottom: "xs"' if static else ""
    return (f'name: "rec" input: "x" input_shape {{ dim: 5 dim: 3 dim: 2 }} '
            f'input: "cont" input_shape {{ dim: 5 dim: 3 }}{s} '
            f'layer {{ name: "{kind.lower()}" type: "{kind}" bottom: "x" bottom: "cont"{sb} '
            f'top: "y" recurrent_param {{ num_output: 4 '
            'weight_filler { type: "uniform" min: -0.3 max: 0.3 } '
            'bias_filler { type: "uniform" min: -0.3 max: 0.3 } } }')


@pytest.mark.parametrize("kind,static", [("LSTM", True), ("RNN", False)])
def test_caffemodel_round_trip(kind, static, rng, tmp_path):
    """The params go out as Caffe writes them (one layer, its blobs in Caffe's order) and
    come back into a fresh net, which then computes the same outputs; a hand-written
    NetParameter as Caffe would save it loads too."""
    from minicaffe.net import TEST, Net
    from minicaffe.proto import caffe_pb2, parse_text
    param = parse_text(net_text(kind, static), caffe_pb2.NetParameter)
    src = Net(param, TEST, mode="CPU")          # float32, as a .caffemodel
    path = str(tmp_path / "rec.caffemodel")
    src.save(path)
    proto = src.to_proto()
    (lp,) = [lp for lp in proto.layer if lp.name == kind.lower()]
    expected_shapes = ([[16, 2], [16], [16, 4], [16, 4]] if kind == "LSTM"
                       else [[4, 2], [4], [4, 4], [4, 4], [4]])
    assert [list(b.shape.dim) for b in lp.blobs] == expected_shapes
    dst = Net(param, TEST, mode="CPU")
    assert any(np.abs(to_numpy(a.data) - to_numpy(b.data)).max() > 0
               for a, b in zip(src.layers[-1].blobs, dst.layers[-1].blobs))
    dst.copy_from(path)
    for a, b in zip(src.layers[-1].blobs, dst.layers[-1].blobs):
        np.testing.assert_array_equal(to_numpy(a.data), to_numpy(b.data))
    x = rng.standard_normal((5, 3, 2))
    cont = np.ones((5, 3))
    cont[0] = 0
    feeds = {"x": x, "cont": cont}
    if static:
        feeds["xs"] = rng.standard_normal((3, 4))
    outs = []
    for net in (src, dst):
        for name, v in feeds.items():
            net.blobs[name].data[...] = v
        net.forward_from_to()
        outs.append(to_numpy(net.blobs["y"].data).copy())
    np.testing.assert_array_equal(outs[0], outs[1])
    # a NetParameter built by hand, as Caffe's Net::ToProto would write it
    weights = [rng.standard_normal(s) for s in expected_shapes]
    hand = caffe_pb2.NetParameter()
    hl = hand.layer.add()
    hl.name, hl.type = kind.lower(), kind
    for w in weights:
        bp = hl.blobs.add()
        bp.shape.dim.extend(w.shape)
        bp.data.extend(w.astype(np.float32).ravel().tolist())
    dst.copy_from(hand)
    dst.forward_from_to()
    ws = [w.astype(np.float32).astype(np.float64) for w in weights]
    ref = REFERENCES[kind](ws, x, cont, feeds.get("xs"))[0]
    np.testing.assert_allclose(to_numpy(dst.blobs["y"].data), ref, rtol=1e-5, atol=1e-6)
    hl.blobs.pop()
    with pytest.raises(ValueError, match="incompatible number of blobs"):
        dst.copy_from(hand)


# ---------------------------------------------------------- a net, and the memory planner
NET = """
name: "lstm_net"
layer { name: "data" type: "DummyData" top: "x" top: "cont" top: "label"
  dummy_data_param { shape { dim: 6 dim: 4 dim: 5 } shape { dim: 6 dim: 4 }
    shape { dim: 6 dim: 4 }
    data_filler { type: "gaussian" std: 1 } data_filler { type: "constant" value: 1 }
    data_filler { type: "constant" value: 2 } } }
layer { name: "lstm" type: "LSTM" bottom: "x" bottom: "cont" top: "h"
  recurrent_param { num_output: 7 weight_filler { type: "uniform" min: -0.2 max: 0.2 }
    bias_filler { type: "constant" value: 0 } } }
layer { name: "rnn" type: "RNN" bottom: "h" bottom: "cont" top: "o"
  recurrent_param { num_output: 6 weight_filler { type: "uniform" min: -0.2 max: 0.2 } } }
layer { name: "ip" type: "InnerProduct" bottom: "o" top: "score"
  inner_product_param { num_output: 3 axis: 2 weight_filler { type: "xavier" } } }
layer { name: "loss" type: "SoftmaxWithLoss" bottom: "score" bottom: "label" top: "loss"
  softmax_param { axis: 2 } }
"""


def make_solver(seed=3):
    from minicaffe.proto import caffe_pb2, parse_text
    return sgd_solver(parse_text(NET, caffe_pb2.NetParameter), seed=seed, base_lr=0.5,
                      weight_decay=0.0, max_iter=40)


def train(strategy=None, iters=6):
    return train_steps(make_solver(), iters, strategy, None, "chunked")


def test_net_trains():
    """DummyData -> LSTM -> RNN -> InnerProduct (axis 2) -> SoftmaxWithLoss (axis 2): the
    loss falls as the net learns the constant label, through both recurrent layers (cont = 1
    throughout: the state carries from one iteration to the next)."""
    solver = make_solver()
    net = solver.net
    assert net.blobs["h"].shape == (6, 4, 7) and net.blobs["score"].shape == (6, 4, 3)
    assert not net.bottom_need_backward[net.layer_names.index("lstm")][1]
    before = [to_numpy(p.data).copy() for p in net.learnable_params]
    _, _, losses, _ = train_steps(solver, 30)
    assert all(np.isfinite(losses))
    assert all(np.abs(to_numpy(p.data) - b).max() > 0            # every param learned
               for p, b in zip(net.learnable_params, before))
    assert np.mean(losses[-5:]) < 0.3 * np.mean(losses[:5]), losses


def test_memory_planner_trains_bit_identically():
    """The GMAP sees the recurrent internals (saved states and gates, backward scratch);
    `none` and `naive` (every feature map offloaded, freed regions poisoned with NaN) train
    exactly as the plain net does, the carried state included."""
    from swap.gmap import SAVED, SCRATCH, build_gmap
    from swap.plan import make_plan, min_budget
    g = build_gmap(make_solver().net)
    kinds = {b.name: b.kind for b in g.buffers}
    for name in ("saved:lstm/h", "saved:lstm/c", "saved:lstm/gates", "saved:rnn/h",
                 "saved:rnn/o"):
        assert kinds[name] == SAVED, name
    assert kinds["scratch:lstm/gates_diff"] == SCRATCH
    assert kinds["scratch:rnn/h_diff"] == SCRATCH
    assert make_plan(g, "naive").offloaded
    assert min_budget(g, "naive") < min_budget(g, "none")
    base = train()
    for strategy in ("none", "naive"):
        params, history, losses, ex = train(strategy)
        assert ex.iterations == 6
        assert all(np.array_equal(a, b) for a, b in zip(params, base[0])), strategy
        assert all(np.array_equal(a, b) for a, b in zip(history, base[1])), strategy
        assert losses == base[2], strategy


# ------------------------------------------------------------------------------- GPU
def rel_err(a, b):
    return float(np.max(np.abs(a - b)) / max(np.max(np.abs(b)), 1e-30))


@pytest.mark.gpu
@pytest.mark.parametrize("kind,static", [("LSTM", False), ("LSTM", True), ("RNN", True)])
def test_gpu_matches_cpu(cp, kind, static):
    outs = []
    for xp in (np, cp):
        r = np.random.default_rng(5)
        cont = np.ones((8, 16))
        cont[0] = 0
        cont[4, ::3] = 0
        layer, bottom = rec_setup(kind, r, T=8, N=16, xshape=(10,), static=static, cont=cont,
                                  num_output=32, xp=xp, dtype=np.float32)
        top = tops(1, xp=xp, dtype=np.float32)
        layer.setup(bottom, top)
        for p in layer.blobs:
            p.data[...] = xp.asarray(0.3 * r.standard_normal(p.shape), dtype=np.float32)
        layer.forward(bottom, top)
        top[0].diff[...] = xp.asarray(r.standard_normal(top[0].shape), dtype=np.float32)
        layer.backward(top, [True, False] + [True] * (len(bottom) - 2), bottom)
        outs.append([to_numpy(top[0].data), to_numpy(bottom[0].diff)]
                    + [to_numpy(p.diff) for p in layer.blobs])
    for c, g in zip(*outs):
        assert rel_err(g, c) <= 1e-4


def test_lstm_on_the_data_writes_the_data_diff_and_frozen_weights_get_gradients():
    """In a net, as in Caffe: an LSTM reading the data needs backward for its weights, and
    its backward writes the data's diff too (the unrolled net's x_transform says
    propagate_down: true); an LSTM whose weights have lr_mult 0 but whose input needs
    backward still accumulates their gradients (the unrolled net's layers all have
    param_propagate_down), though the solver will not move them."""
    from minicaffe.net import TRAIN, Net
    from minicaffe.proto import caffe_pb2, parse_text

    def net(lstm_params, before_lstm):
        return Net(parse_text(f"""
            input: "x" input_shape {{ dim: 3 dim: 2 dim: 4 }}
            input: "cont" input_shape {{ dim: 3 dim: 2 }}
            input: "y" input_shape {{ dim: 3 dim: 2 dim: 5 }}
            {before_lstm}
            layer {{ name: "lstm" type: "LSTM" bottom: "x" bottom: "cont" top: "h"
                     {lstm_params} recurrent_param {{ num_output: 5
                       weight_filler {{ type: "gaussian" std: 0.5 }} }} }}
            layer {{ name: "loss" type: "EuclideanLoss" bottom: "h" bottom: "y" top: "l" }}
            """, caffe_pb2.NetParameter), TRAIN, dtype=np.float64)

    rng = np.random.default_rng(0)
    on_data = net("", "")
    frozen = net("param { lr_mult: 0 } " * 3,     # an in-place Scale makes x need backward
                 'layer { name: "s" type: "Scale" bottom: "x" top: "x" }')
    for n in (on_data, frozen):
        n.blobs["x"].data[...] = rng.standard_normal((3, 2, 4))
        n.blobs["cont"].data[...] = [[0, 0], [1, 1], [1, 0]]
        n.blobs["y"].data[...] = rng.standard_normal((3, 2, 5))
        n.forward()
        n.backward()
    assert on_data.bottom_need_backward[on_data.layer_names.index("lstm")] == [False, False]
    assert np.abs(on_data.blobs["x"].diff).max() > 0
    assert all(np.abs(p.diff).max() > 0 for p in frozen.params["lstm"])
