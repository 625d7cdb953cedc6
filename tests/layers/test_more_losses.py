"""MultinomialLogisticLoss, InfogainLoss, HingeLoss, ContrastiveLoss: values and gradients
against torch or NumPy formulas, float64 gradient checks, Caffe's refusals (no gradient to
labels or to a bottom H), loss weights, InfogainLoss's normalization, ignore label, axis and
both sources of H, errors that name the layer, declarations, GPU parity; and a net of all four
trained plainly and under the memory planner's plans."""
import numpy as np
import pytest

from minicaffe.backend import to_numpy
from minicaffe.blob import Blob
from minicaffe.io import array_to_blobproto, write_blobproto
from minicaffe.layer import BackwardReads
from minicaffe.testing import check_gradient, make_blob, make_layer, sgd_solver, train_steps


def build(text, arrays, n_top=1, xp=np, dtype=np.float64, names=("x", "label", "h")):
    layer = make_layer(text, xp=xp, dtype=dtype)
    bottom = [make_blob(a, xp=xp, dtype=dtype, name=n) for a, n in zip(arrays, names)]
    top = [Blob(xp=xp, dtype=dtype, name=f"top{i}") for i in range(n_top)]
    layer.setup(bottom, top)
    return layer, bottom, top


def run(text, arrays, propagate, n_top=1):
    """(layer, loss, bottom diffs of the propagated bottoms, tops) after forward + backward."""
    layer, bottom, top = build(text, arrays, n_top)
    loss = float(to_numpy(layer.forward(bottom, top)))
    layer.backward(top, propagate, bottom)
    return layer, loss, [to_numpy(b.diff).copy() for b, p in zip(bottom, propagate) if p], top


def softmax_np(x, axis=1):
    e = np.exp(x - x.max(axis=axis, keepdims=True))
    return e / e.sum(axis=axis, keepdims=True)


# ============================================================ MultinomialLogisticLoss
MLL = 'name: "mll" type: "MultinomialLogisticLoss"'


def test_multinomial_matches_torch_nll(rng):
    torch = pytest.importorskip("torch")
    p = softmax_np(rng.standard_normal((4, 6))).reshape(4, 3, 2)   # dim = 6 per example
    label = np.array([0, 5, 2, 3], dtype=float)
    _, loss, (dp,), _ = run(MLL + " loss_weight: 2.5", [p, label], [True, False])
    tp = torch.tensor(p.reshape(4, 6), requires_grad=True)
    ref = 2.5 * torch.nn.functional.nll_loss(torch.log(tp), torch.tensor(label).long())
    ref.backward()
    np.testing.assert_allclose(loss, float(ref.detach()), rtol=1e-12)
    np.testing.assert_allclose(dp.reshape(4, 6), tp.grad.numpy(), rtol=1e-12, atol=0)


def test_multinomial_clips_at_log_threshold_and_truncates_labels():
    """kLOG_THRESHOLD = 1e-20: a zero probability costs -log(thr), its gradient stays finite;
    a label 1.9 is class 1 (C's int cast). Caffe declares ``const float kLOG_THRESHOLD``, so
    in double thr is float32(1e-20) widened."""
    thr = float(np.float32(1e-20))
    p = np.array([[0.5, 0.0, 0.5], [0.2, 0.3, 0.5]])
    _, loss, (dp,), _ = run(MLL, [p, [1.9, 2.0]], [True, False])
    np.testing.assert_allclose(loss, (-np.log(thr) - np.log(0.5)) / 2, rtol=1e-12)
    np.testing.assert_allclose(dp, [[0, -1 / (2 * thr), 0], [0, 0, -1 / (2 * 0.5)]],
                               rtol=1e-12)


def test_multinomial_gradient(rng):
    layer = make_layer(MLL)
    assert not layer.allow_force_backward(1) and layer.allow_force_backward(0)
    check_gradient(layer, [make_blob(rng.uniform(0.1, 1, (3, 4, 1, 1))),
                           make_blob([[3.0], [0.0], [2.0]])])


def test_multinomial_declarations_and_refusal(rng):
    layer, bottom, top = build(MLL, [rng.uniform(size=(2, 3)), [0, 1]])
    assert layer.backward_reads() == BackwardReads(bottom=(0, 1))
    assert layer.internals == {} and layer.loss_weights == [1.0] and top[0].shape == ()
    layer.forward(bottom, top)
    with pytest.raises(ValueError, match="'mll' of type MultinomialLogisticLoss: cannot "
                                         "backpropagate to label inputs"):
        layer.backward(top, [True, True], bottom)


@pytest.mark.parametrize("label,match", [(np.zeros((2, 2)), "takes one label per example"),
                                         (np.zeros(3), "the data and label should have the "
                                                       "same number")])
def test_multinomial_shape_errors(label, match):
    with pytest.raises(ValueError, match=f"'mll' of type MultinomialLogisticLoss: {match}"):
        build(MLL, [np.full((2, 3), 1 / 3), label])


# ====================================================================== InfogainLoss
def infogain_text(params="", loss_params="", extra=""):
    return (f'name: "info" type: "InfogainLoss" infogain_loss_param {{ {params} }} '
            f'loss_param {{ {loss_params} }} {extra}')


def write_h(path, h, legacy=False):
    write_blobproto(str(path), array_to_blobproto(h, legacy=legacy))
    return str(path)


def infogain_torch(torch, x, label, h, axis, norm_of, ignore=None, weight=1.0):
    """(loss, dx) of -sum_valid sum_k H[l, k] log softmax(x)_k / normalizer, by autograd."""
    tx = torch.tensor(x, requires_grad=True)
    logp = torch.log_softmax(tx, dim=axis).movedim(axis, -1)       # (..., K)
    lab = torch.tensor(label.reshape(logp.shape[:-1])).long()
    valid = torch.ones_like(lab, dtype=torch.bool) if ignore is None else lab != ignore
    rows = torch.tensor(h)[torch.where(valid, lab, 0)]              # (..., K)
    per = -(rows * logp).sum(-1) * valid
    ref = weight * per.sum() / norm_of(int(valid.sum()))
    ref.backward()
    return float(ref.detach()), tx.grad.numpy()


# (normalization, normalizer for 2 x 3 positions with v valid ones)
INFO_NORMS = [("", lambda v: max(v, 1)),                  # proto default: VALID
              ("normalization: FULL", lambda v: 6),
              ("normalization: VALID", lambda v: max(v, 1)),
              ("normalization: BATCH_SIZE", lambda v: 2),
              ("normalization: NONE", lambda v: 1)]


@pytest.mark.parametrize("norm,norm_of", INFO_NORMS)
@pytest.mark.parametrize("ignore", [False, True])
def test_infogain_matches_torch(norm, norm_of, ignore, rng):
    torch = pytest.importorskip("torch")
    x = 2 * rng.standard_normal((2, 4, 3))                # K = 4 classes on axis 1, inner 3
    label = rng.integers(0, 4, size=(2, 3)).astype(float)
    h = rng.uniform(0, 2, size=(4, 4))
    loss_params = norm
    if ignore:
        label[0, 1] = label[1, 2] = 7
        loss_params += " ignore_label: 7"
    _, loss, (dx,), _ = run(infogain_text("", loss_params, "loss_weight: 1.5"),
                            [x, label, h], [True, False, False])
    ref, ref_dx = infogain_torch(torch, x, label, h, 1, norm_of, 7 if ignore else None, 1.5)
    np.testing.assert_allclose(loss, ref, rtol=1e-12)
    np.testing.assert_allclose(dx, ref_dx, rtol=1e-10, atol=1e-15)
    if ignore:
        assert np.all(dx[0, :, 1] == 0) and np.all(dx[1, :, 2] == 0)


@pytest.mark.parametrize("axis", [2, -1])
def test_infogain_axis(axis, rng):
    torch = pytest.importorskip("torch")
    x = rng.standard_normal((2, 3, 5))                    # K = 5 on the last axis
    label = rng.integers(0, 5, size=(2, 3)).astype(float)
    h = rng.uniform(0, 1, size=(5, 5))
    _, loss, (dx,), _ = run(infogain_text(f"axis: {axis}"), [x, label, h], [True, False, False])
    ref, ref_dx = infogain_torch(torch, x, label, h, 2, lambda v: v)
    np.testing.assert_allclose(loss, ref, rtol=1e-12)
    np.testing.assert_allclose(dx, ref_dx, rtol=1e-10, atol=1e-15)


def test_infogain_with_identity_is_softmax_with_loss(rng):
    x = rng.standard_normal((3, 4, 2))
    label = rng.integers(0, 4, size=(3, 1, 2)).astype(float)
    label[1, 0, 1] = -1
    lp = "normalization: VALID ignore_label: -1"
    two = "loss_weight: 1 loss_weight: 0"        # Caffe: every top's weight, or none
    info, loss_i, (dx_i,), top_i = run(infogain_text("", lp, two), [x, label, np.eye(4)],
                                       [True, False, False], n_top=2)
    _, loss_s, (dx_s,), top_s = run(f'name: "s" type: "SoftmaxWithLoss" loss_param {{ {lp} }}',
                                    [x, label], [True, False])
    np.testing.assert_allclose(loss_i, loss_s, rtol=1e-12)
    np.testing.assert_allclose(dx_i, dx_s, rtol=1e-12, atol=1e-16)
    np.testing.assert_allclose(to_numpy(top_i[1].data), softmax_np(x), rtol=1e-12)
    assert top_i[1].shape == x.shape


@pytest.mark.parametrize("legacy", [False, True])
def test_infogain_source_file_equals_bottom_h(legacy, tmp_path, rng):
    """H from infogain_param.source (a BlobProto, float32 as Caffe stores it; legacy 4-d or
    shaped) gives what the same H as a third bottom gives."""
    x = rng.standard_normal((4, 3))
    label = np.array([0, 2, 1, 2.0])
    h = rng.uniform(0, 2, size=(3, 3)).astype(np.float32).astype(np.float64)
    path = write_h(tmp_path / "H.binaryproto", h, legacy)
    layer, loss_f, (dx_f,), _ = run(infogain_text(f'source: "{path}"', "", "loss_weight: 2"),
                                    [x, label], [True, False])
    _, loss_b, (dx_b,), _ = run(infogain_text("", "", "loss_weight: 2"), [x, label, h],
                                [True, False, False])
    assert loss_f == loss_b
    np.testing.assert_array_equal(dx_f, dx_b)
    np.testing.assert_array_equal(to_numpy(layer.sum_rows_h), h.sum(axis=1))


def test_infogain_gradient_with_bottom_h(rng):
    layer = make_layer(infogain_text("", "ignore_label: 1"))
    label = np.array([[0, 1], [2, 0], [1, 2.0]])
    bottom = [make_blob(rng.standard_normal((3, 3, 2))), make_blob(label),
              make_blob(rng.uniform(0, 2, (3, 3)))]
    assert [layer.allow_force_backward(i) for i in range(3)] == [True, False, False]
    check_gradient(layer, bottom)


def test_infogain_gradient_with_source(tmp_path, rng):
    path = write_h(tmp_path / "H.binaryproto", rng.uniform(0, 2, (4, 4)))
    layer = make_layer(infogain_text(f'source: "{path}" axis: 1', "normalization: FULL"))
    check_gradient(layer, [make_blob(rng.standard_normal((3, 4))),
                           make_blob([3.0, 0.0, 1.0])])


def test_infogain_refuses_gradients_to_labels_and_h(rng):
    layer, bottom, top = build(infogain_text(), [rng.standard_normal((2, 3)), [0, 1], np.eye(3)])
    layer.forward(bottom, top)
    with pytest.raises(ValueError, match="'info' of type InfogainLoss: cannot backpropagate to "
                                         "label inputs"):
        layer.backward(top, [True, True, False], bottom)
    with pytest.raises(ValueError, match="'info' of type InfogainLoss: cannot backpropagate to "
                                         "infogain inputs"):
        layer.backward(top, [True, False, True], bottom)


def test_infogain_all_ignored_gives_zero_not_nan(rng):
    _, loss, (dx,), _ = run(infogain_text("", "ignore_label: 0"),
                            [rng.standard_normal((2, 3)), [0, 0], np.ones((3, 3))],
                            [True, False, False])
    assert loss == 0.0 and np.all(dx == 0)


def test_infogain_declarations(tmp_path, rng):
    layer, _, top = build(infogain_text("", "", "loss_weight: 1 loss_weight: 0"),
                          [rng.standard_normal((2, 3, 2)), np.zeros((2, 2)), np.eye(3)], n_top=2)
    assert layer.backward_reads() == BackwardReads(bottom=(1, 2), internals=("prob",))
    assert layer.internals["prob"].saved and layer.internals["prob"].blob.shape == (2, 3, 2)
    assert layer.loss_weights == [1.0, 0.0] and top[0].shape == () and top[1].shape == (2, 3, 2)
    path = write_h(tmp_path / "H.binaryproto", np.eye(3))
    layer, _, _ = build(infogain_text(f'source: "{path}"'), [rng.standard_normal((2, 3)), [0, 1]])
    assert layer.backward_reads() == BackwardReads(bottom=(1,), internals=("prob",))


@pytest.mark.parametrize("text,arrays,match", [
    (infogain_text(), [np.zeros((2, 3)), [0, 1]], "infogain matrix source must be specified"),
    (infogain_text('source: "/nonexistent/H.binaryproto"'), [np.zeros((2, 3)), [0, 1]],
     "infogain matrix source '/nonexistent/H.binaryproto' is not a file"),
    (infogain_text("", "normalize: true"), [np.zeros((2, 3)), [0, 1], np.eye(3)],
     "loss_param.normalize is deprecated"),
    (infogain_text(), [np.zeros((2, 3)), [0, 1], np.eye(2)],
     r"the infogain matrix H must be 3x3 .* bottom 'h' of shape \(2, 2\) holds 4 values"),
    (infogain_text(), [np.zeros((2, 3, 2)), [0, 1], np.eye(3)],
     "number of labels must match number of predictions"),
    (infogain_text(), [np.zeros((2, 3)), [0, 1, 1], np.eye(3)],
     "the data and label should have the same number"),
    (infogain_text("axis: 2"), [np.zeros((2, 3)), [0, 1], np.eye(3)], "axis 2 out of range"),
])
def test_infogain_errors(text, arrays, match):
    with pytest.raises(ValueError, match=f"'info' of type InfogainLoss: {match}"):
        build(text, arrays)


def test_infogain_source_of_the_wrong_size(tmp_path):
    path = write_h(tmp_path / "H.binaryproto", np.eye(4))
    with pytest.raises(ValueError, match=r"'info' of type InfogainLoss: the infogain matrix H "
                                         r"must be 3x3 .*H.binaryproto' holds 16 values"):
        build(infogain_text(f'source: "{path}"'), [np.zeros((2, 3)), [0, 1]])


# ========================================================================= HingeLoss
def hinge_text(norm="", extra=""):
    return f'name: "hinge" type: "HingeLoss" hinge_loss_param {{ {norm} }} {extra}'


def test_hinge_hand_computed():
    x = np.array([[0.5, -2.0, 0.2], [1.5, 0.0, -0.5]])
    label = np.array([0, 2.0])
    # row 0: 1-0.5, max(0, 1-2), 1+0.2 -> 0.5, 0, 1.2; row 1: 2.5, 1, 1.5
    _, loss, (dx,), _ = run(hinge_text(), [x, label], [True, False])
    np.testing.assert_allclose(loss, (0.5 + 1.2 + 2.5 + 1 + 1.5) / 2)
    np.testing.assert_allclose(dx, [[-0.5, 0, 0.5], [0.5, 0.5, -0.5]])
    _, loss, (dx,), _ = run(hinge_text("norm: L2"), [x, label], [True, False])
    np.testing.assert_allclose(loss, (0.25 + 1.44 + 6.25 + 1 + 2.25) / 2)
    np.testing.assert_allclose(dx, [[-0.5, 0, 1.2], [2.5, 1, -1.5]])


@pytest.mark.parametrize("norm,power", [("", 1), ("norm: L1", 1), ("norm: L2", 2)])
def test_hinge_matches_torch(norm, power, rng):
    torch = pytest.importorskip("torch")
    x = rng.standard_normal((5, 4, 1, 1))
    label = rng.integers(0, 4, size=(5, 1, 1, 1)).astype(float)
    _, loss, (dx,), _ = run(hinge_text(norm, "loss_weight: 0.25"), [x, label], [True, False])
    tx = torch.tensor(x.reshape(5, 4), requires_grad=True)
    t = 2 * torch.nn.functional.one_hot(torch.tensor(label.reshape(5)).long(), 4) - 1
    ref = 0.25 * (torch.relu(1 - t * tx) ** power).sum() / 5
    ref.backward()
    np.testing.assert_allclose(loss, float(ref.detach()), rtol=1e-12)
    np.testing.assert_allclose(dx.reshape(5, 4), tx.grad.numpy(), rtol=1e-12, atol=1e-16)


@pytest.mark.parametrize("norm", ["norm: L1", "norm: L2"])
def test_hinge_gradient(norm, rng):
    x = rng.standard_normal((4, 3))
    x[np.abs(np.abs(x) - 1) < 0.05] += 0.2              # keep off the kinks at |x| = 1
    layer = make_layer(hinge_text(norm))
    assert not layer.allow_force_backward(1)
    check_gradient(layer, [make_blob(x), make_blob([0, 2, 1, 1.0])])


def test_hinge_declarations_and_errors(rng):
    layer, bottom, top = build(hinge_text(), [rng.standard_normal((2, 3)), [0, 1]])
    assert layer.backward_reads() == BackwardReads(bottom=(0, 1)) and layer.internals == {}
    layer.forward(bottom, top)
    with pytest.raises(ValueError, match="'hinge' of type HingeLoss: cannot backpropagate to "
                                         "label inputs"):
        layer.backward(top, [True, True], bottom)
    with pytest.raises(ValueError, match="'hinge' of type HingeLoss: takes one label per "
                                         "example"):
        build(hinge_text(), [np.zeros((2, 3)), np.zeros((2, 2))])
    with pytest.raises(ValueError, match="'hinge' of type HingeLoss: the data and label should "
                                         "have the same number"):
        build(hinge_text(), [np.zeros((2, 3)), np.zeros(3)])


# =================================================================== ContrastiveLoss
def contrastive_text(params="", extra=""):
    return (f'name: "con" type: "ContrastiveLoss" contrastive_loss_param {{ {params} }} '
            f'{extra}')


def contrastive_caffe(a, b, y, margin, legacy, weight):
    """Caffe's Forward_cpu and Backward_cpu loops, transliterated."""
    n = a.shape[0]
    diff = (a - b).reshape(n, -1)
    dist_sq = (diff * diff).sum(axis=1)
    loss = 0.0
    for i in range(n):
        if int(y[i]):
            loss += dist_sq[i]
        elif legacy:
            loss += max(margin - dist_sq[i], 0.0)
        else:
            loss += max(margin - np.sqrt(dist_sq[i]), 0.0) ** 2
    loss = loss / n / 2
    grads = []
    for sign in (1.0, -1.0):
        alpha = sign * weight / n
        g = np.zeros_like(diff)
        for j in range(n):
            if int(y[j]):
                g[j] = alpha * diff[j]
                continue
            if legacy:
                mdist, beta = margin - dist_sq[j], -alpha
            else:
                dist = np.sqrt(dist_sq[j])
                mdist = margin - dist
                beta = -alpha * mdist / (dist + 1e-4)
            if mdist > 0:
                g[j] = beta * diff[j]
        grads.append(g.reshape(a.shape))
    return weight * loss, grads


def contrastive_data(rng, n=8, c=3):
    a = rng.standard_normal((n, c, 1, 1))
    b = rng.standard_normal((n, c, 1, 1))
    y = np.array([1, 0, 0, 1, 0, 0, 1.9, 0.4])[:n]       # 1.9 -> similar, 0.4 -> dissimilar
    return a, b, y


@pytest.mark.parametrize("params,margin,legacy,scale", [
    ("", 1.0, False, 0.4),                               # the default margin, smaller features
    ("margin: 3", 3.0, False, 1.0),
    ("margin: 6 legacy_version: true", 6.0, True, 1.0)])
def test_contrastive_matches_caffe_loops(params, margin, legacy, scale, rng):
    a, b, y = contrastive_data(rng)
    a, b = scale * a, scale * b
    dist = np.sqrt(((a - b) ** 2).sum(axis=(1, 2, 3)))
    far = dist ** 2 if legacy else dist
    dissimilar = y.astype(int) == 0
    assert ((far < margin) & dissimilar).any()
    assert ((far > margin) & dissimilar).any()            # both sides of the margin
    _, loss, (da, db), _ = run(contrastive_text(params, "loss_weight: 0.75"), [a, b, y],
                               [True, True, False])
    ref, (ra, rb) = contrastive_caffe(a, b, y, margin, legacy, 0.75)
    np.testing.assert_allclose(loss, ref, rtol=1e-12)
    np.testing.assert_allclose(da, ra, rtol=1e-12, atol=1e-16)
    np.testing.assert_allclose(db, rb, rtol=1e-12, atol=1e-16)


def test_contrastive_against_torch(rng):
    """Hadsell et al.'s loss by autograd: the value exactly, the gradient up to Caffe's 1e-4
    in the dissimilar pairs' denominator (d + 1e-4)."""
    torch = pytest.importorskip("torch")
    a, b, y = contrastive_data(rng)
    _, loss, (da, db), _ = run(contrastive_text("margin: 3"), [a, b, y], [True, True, False])
    ta = torch.tensor(a.reshape(8, 3), requires_grad=True)
    tb = torch.tensor(b.reshape(8, 3), requires_grad=True)
    d = (ta - tb).norm(dim=1)
    sim = torch.tensor(y).long() != 0
    ref = torch.where(sim, d ** 2, torch.relu(3 - d) ** 2).sum() / 16
    ref.backward()
    np.testing.assert_allclose(loss, float(ref.detach()), rtol=1e-12)
    np.testing.assert_allclose(da.reshape(8, 3), ta.grad.numpy(), rtol=1e-3, atol=1e-12)
    np.testing.assert_allclose(db.reshape(8, 3), tb.grad.numpy(), rtol=1e-3, atol=1e-12)


@pytest.mark.parametrize("params,rtol", [("margin: 6 legacy_version: true", 1e-5),
                                         ("margin: 3", 1e-3)])   # the 1e-4: see above
def test_contrastive_gradient(params, rtol, rng):
    a, b, y = contrastive_data(rng, n=6)
    layer = make_layer(contrastive_text(params))
    assert [layer.allow_force_backward(i) for i in range(3)] == [True, True, False]
    check_gradient(layer, [make_blob(a), make_blob(b), make_blob(y)], rtol=rtol)


def test_contrastive_declarations_and_refusal(rng):
    a, b, y = contrastive_data(rng, n=4)
    layer, bottom, top = build(contrastive_text(), [a.reshape(4, 3), b.reshape(4, 3), y],
                               names=("a", "b", "sim"))
    assert layer.backward_reads() == BackwardReads(bottom=(2,), internals=("diff", "dist_sq"))
    assert layer.internals["diff"].blob.shape == (4, 3)
    assert layer.internals["dist_sq"].blob.shape == (4,)
    assert not layer.internals["diff_sq"].saved
    assert layer.internals["diff_sq"].uses == ("forward",)
    layer.forward(bottom, top)
    with pytest.raises(ValueError, match="'con' of type ContrastiveLoss: cannot backpropagate "
                                         "to label inputs \\(bottom 'sim'\\)"):
        layer.backward(top, [True, False, True], bottom)


@pytest.mark.parametrize("sa,sb,sy,match", [
    ((2, 3), (2, 4), (2,), "the two inputs must have the same channels"),
    ((2, 3, 2), (2, 3, 2), (2,), r"bottom 'a' of shape \(2, 3, 2\) must be \(N, C\)"),
    ((2, 3), (2, 3), (3,), "takes one similarity label per pair"),
    ((2, 3), (3, 3), (2,), "the data and label should have the same number"),
])
def test_contrastive_shape_errors(sa, sb, sy, match):
    with pytest.raises(ValueError, match=f"'con' of type ContrastiveLoss: {match}"):
        build(contrastive_text(), [np.zeros(sa), np.zeros(sb), np.zeros(sy)],
              names=("a", "b", "sim"))


# ============================================================================ GPU
def rel_err(a, b):
    return float(np.max(np.abs(a - b)) / max(np.max(np.abs(b)), 1e-30))


def gpu_cases(rng):
    x = rng.standard_normal((16, 10)).astype(np.float32)
    label = rng.integers(0, 10, size=16).astype(np.float32)
    label[3] = -1
    p = softmax_np(x).astype(np.float32)
    h = rng.uniform(0, 2, (10, 10)).astype(np.float32)
    a, b = (rng.standard_normal((16, 5, 1, 1)).astype(np.float32) for _ in range(2))
    y = (rng.uniform(size=16) < 0.5).astype(np.float32)
    return [(MLL, [p, np.abs(label)], [True, False]),
            (infogain_text("", "ignore_label: -1"), [x, label, h], [True, False, False]),
            (infogain_text("", "normalization: FULL"), [x, np.abs(label), h],
             [True, False, False]),
            (hinge_text(), [x, np.abs(label)], [True, False]),
            (hinge_text("norm: L2"), [x, np.abs(label)], [True, False]),
            (contrastive_text("margin: 3"), [a, b, y], [True, True, False]),
            (contrastive_text("margin: 10 legacy_version: true"), [a, b, y],
             [True, True, False])]


@pytest.mark.gpu
@pytest.mark.parametrize("case", range(7))
def test_gpu_matches_cpu(cp, case):
    text, arrays, propagate = gpu_cases(np.random.default_rng(5))[case]
    outs = []
    for xp in (np, cp):
        layer, bottom, top = build(text + " loss_weight: 0.5", arrays, xp=xp, dtype=np.float32)
        loss = to_numpy(layer.forward(bottom, top))
        layer.backward(top, propagate, bottom)
        outs.append([np.atleast_1d(loss)] + [to_numpy(b.diff) for b, p in zip(bottom, propagate)
                                             if p])
    for c, g in zip(*outs):
        assert rel_err(g, c) <= 1e-5


@pytest.mark.gpu
def test_gpu_infogain_source(cp, tmp_path):
    r = np.random.default_rng(6)
    path = write_h(tmp_path / "H.binaryproto", r.uniform(0, 2, (6, 6)))
    x = r.standard_normal((8, 6, 3)).astype(np.float32)
    label = r.integers(0, 6, size=(8, 3)).astype(np.float32)
    outs = []
    for xp in (np, cp):
        layer, bottom, top = build(infogain_text(f'source: "{path}"'), [x, label], xp=xp,
                                   dtype=np.float32)
        loss = to_numpy(layer.forward(bottom, top))
        layer.backward(top, [True, False], bottom)
        outs.append((np.atleast_1d(loss), to_numpy(bottom[0].diff)))
    for c, g in zip(*outs):
        assert rel_err(g, c) <= 1e-5


# ============================================================ a net of all four losses
def net_text(h_path):
    return f"""
name: "more_losses"
layer {{ name: "data" type: "DummyData" top: "data" top: "label" top: "other" top: "sim"
  dummy_data_param {{ shape {{ dim: 4 dim: 3 dim: 4 dim: 4 }} shape {{ dim: 4 }}
    shape {{ dim: 4 dim: 3 }} shape {{ dim: 4 }}
    data_filler {{ type: "gaussian" std: 1 }} data_filler {{ type: "uniform" min: 0 max: 3.99 }}
    data_filler {{ type: "gaussian" std: 1 }} data_filler {{ type: "uniform" min: 0 max: 1.99 }}
  }} }}
layer {{ name: "conv" type: "Convolution" bottom: "data" top: "conv"
  convolution_param {{ num_output: 4 kernel_size: 3 pad: 1 weight_filler {{ type: "xavier" }} }} }}
layer {{ name: "score" type: "InnerProduct" bottom: "conv" top: "score"
  inner_product_param {{ num_output: 4 weight_filler {{ type: "xavier" }} }} }}
layer {{ name: "infogain" type: "InfogainLoss" bottom: "score" bottom: "label" top: "info"
  infogain_loss_param {{ source: "{h_path}" }} }}
layer {{ name: "hinge" type: "HingeLoss" bottom: "score" bottom: "label" top: "hinge"
  loss_weight: 0.5 hinge_loss_param {{ norm: L2 }} }}
layer {{ name: "prob" type: "Softmax" bottom: "score" top: "prob" }}
layer {{ name: "mll" type: "MultinomialLogisticLoss" bottom: "prob" bottom: "label"
  top: "mll" loss_weight: 0.3 }}
layer {{ name: "embed" type: "InnerProduct" bottom: "conv" top: "embed"
  inner_product_param {{ num_output: 3 weight_filler {{ type: "xavier" }} }} }}
layer {{ name: "contrastive" type: "ContrastiveLoss" bottom: "embed" bottom: "other"
  bottom: "sim" top: "contrastive" contrastive_loss_param {{ margin: 2 }} }}
"""


def make_solver(h_path, seed=3):
    from minicaffe.proto import caffe_pb2, parse_text
    return sgd_solver(parse_text(net_text(h_path), caffe_pb2.NetParameter), seed=seed,
                      weight_decay=0.0, max_iter=10)


@pytest.fixture
def h_path(tmp_path):
    h = np.array([[2.0, 0.5, 0, 0], [0.5, 1, 0.5, 0], [0, 0.5, 1, 0.5], [0, 0, 0.5, 2]])
    return write_h(tmp_path / "H.binaryproto", h)


def test_net_forward_backward(h_path):
    from minicaffe.net import TRAIN, Net
    from minicaffe.proto import caffe_pb2, parse_text
    net = Net(parse_text(net_text(h_path), caffe_pb2.NetParameter), TRAIN, mode="CPU")
    loss = float(to_numpy(net.forward_from_to()))
    parts = {n: float(to_numpy(net.blobs[n].data)) for n in ("info", "hinge", "mll",
                                                             "contrastive")}
    np.testing.assert_allclose(loss, parts["info"] + 0.5 * parts["hinge"] + 0.3 * parts["mll"]
                               + parts["contrastive"], rtol=1e-6)
    assert all(np.isfinite(v) and v > 0 for v in parts.values())
    net.clear_param_diffs()
    net.backward_from_to()
    for name in ("conv", "score", "embed"):
        w = net.layers[net.layer_names.index(name)].blobs[0]
        assert np.abs(to_numpy(w.diff)).sum() > 0, name
    # labels and the similarity get no backward
    for name in ("infogain", "hinge", "mll", "contrastive"):
        li = net.layer_names.index(name)
        assert not net.bottom_need_backward[li][-1], name


def train(h_path, strategy=None, iters=5):
    """``iters`` iterations with the chunked convolution lowering (the same in every run);
    (params, history, losses, executor)."""
    return train_steps(make_solver(h_path), iters, strategy, None, "chunked")


def test_memory_planner_accepts_the_net_and_trains_it_bit_identically(h_path):
    """The GMAP sees the losses' internals; `none` and `naive` (every feature map offloaded,
    freed regions poisoned with NaN, so an undeclared backward read shows) train exactly as the
    plain net does."""
    from swap.gmap import SAVED, SCRATCH, build_gmap
    from swap.plan import make_plan, min_budget
    g = build_gmap(make_solver(h_path).net)
    kinds = {b.name: b.kind for b in g.buffers}
    assert kinds["saved:infogain/prob"] == SAVED
    assert kinds["saved:contrastive/diff"] == SAVED
    assert kinds["saved:contrastive/dist_sq"] == SAVED
    assert kinds["scratch:contrastive/diff_sq"] == SCRATCH
    assert make_plan(g, "naive").offloaded
    assert min_budget(g, "naive") < min_budget(g, "none")
    base = train(h_path)
    assert all(np.isfinite(base[2]))      # DummyData draws a new batch every step
    initial = [to_numpy(p.data).copy() for p in make_solver(h_path).net.learnable_params]
    assert not all(np.array_equal(a, b) for a, b in zip(base[0], initial))
    for strategy in ("none", "naive"):
        params, history, losses, ex = train(h_path, strategy)
        assert ex.iterations == 5
        assert all(np.array_equal(a, b) for a, b in zip(params, base[0])), strategy
        assert all(np.array_equal(a, b) for a, b in zip(history, base[1])), strategy
        assert losses == base[2], strategy
        if strategy == "naive":
            assert ex.plan.offloaded and ex.host.nbytes == ex.plan.host_bytes


def test_net_with_h_as_a_bottom():
    """H from a DummyData top: the net gives it no backward (nor the labels)."""
    from minicaffe.net import TRAIN, Net
    from minicaffe.proto import caffe_pb2, parse_text
    text = """
    layer { name: "data" type: "DummyData" top: "x" top: "label" top: "H"
      dummy_data_param { shape { dim: 2 dim: 3 } shape { dim: 2 } shape { dim: 3 dim: 3 }
        data_filler { type: "gaussian" std: 1 } data_filler { type: "constant" value: 1 }
        data_filler { type: "constant" value: 1 } } }
    layer { name: "ip" type: "InnerProduct" bottom: "x" top: "s"
      inner_product_param { num_output: 3 weight_filler { type: "xavier" } } }
    layer { name: "info" type: "InfogainLoss" bottom: "s" bottom: "label" bottom: "H"
      top: "loss" }
    """
    net = Net(parse_text(text, caffe_pb2.NetParameter), TRAIN, mode="CPU")
    net.forward_from_to()
    # all-ones H: -sum_k log p_k per example, divided by the 2 valid labels
    s = to_numpy(net.blobs["s"].data).astype(np.float64)
    ref = -np.log(softmax_np(s)).sum() / 2
    np.testing.assert_allclose(float(to_numpy(net.blobs["loss"].data)), ref, rtol=1e-5)
    li = net.layer_names.index("info")
    assert net.bottom_need_backward[li] == [True, False, False]
    net.clear_param_diffs()
    net.backward_from_to()
