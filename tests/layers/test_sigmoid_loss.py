"""SigmoidCrossEntropyLoss: value and gradient against torch for every normalization, the
ignore label, the loss weight, the stable form, Caffe's errors, declarations, GPU parity; and a
small net of the new layer types trained plainly and under the memory planner's plans."""
import numpy as np
import pytest

from minicaffe.backend import to_numpy
from minicaffe.blob import Blob
from minicaffe.layer import BackwardReads
from minicaffe.testing import check_gradient, make_blob, make_layer, sgd_solver, train_steps


def loss_text(params="", extra=""):
    return f'name: "sce" type: "SigmoidCrossEntropyLoss" loss_param {{ {params} }} {extra}'


def setup(x, t, text, xp=np, dtype=np.float64):
    layer = make_layer(text, xp=xp, dtype=dtype)
    bottom = [make_blob(x, xp=xp, dtype=dtype, name="score"),
              make_blob(t, xp=xp, dtype=dtype, name="target")]
    top = [Blob(xp=xp, dtype=dtype, name="loss")]
    layer.setup(bottom, top)
    return layer, bottom, top


def run(x, t, text):
    layer, bottom, top = setup(x, t, text)
    loss = float(to_numpy(layer.forward(bottom, top)))
    layer.backward(top, [True, False], bottom)
    return layer, loss, to_numpy(bottom[0].diff)


# (params, normalizer for x of shape (4, 3, 2) with `ignored` ignored elements)
NORMS = [("", lambda n, ignored: 4),                     # no field: BATCH_SIZE, not VALID
         ("normalization: FULL", lambda n, ignored: 24),
         ("normalization: VALID", lambda n, ignored: 24 - ignored),
         ("normalization: BATCH_SIZE", lambda n, ignored: 4),
         ("normalization: NONE", lambda n, ignored: 1),
         ("normalize: true", lambda n, ignored: 24 - ignored),
         ("normalize: false", lambda n, ignored: 4)]


@pytest.mark.parametrize("params,norm", NORMS)
@pytest.mark.parametrize("ignore", [False, True])
def test_matches_torch_bce_with_logits(params, norm, ignore, rng):
    torch = pytest.importorskip("torch")
    x = 3 * rng.standard_normal((4, 3, 2))
    t = rng.uniform(0, 1, size=(4, 6))                 # same count, another shape
    if ignore:
        t[rng.uniform(size=t.shape) < 0.3] = -1
        params += " ignore_label: -1"
    valid = t != -1
    ignored = int((~valid).sum())
    _, loss, dx = run(x, t, loss_text(params, "loss_weight: 2.5"))
    tx = torch.tensor(x.reshape(4, 6), requires_grad=True)
    per = torch.nn.functional.binary_cross_entropy_with_logits(
        tx, torch.tensor(np.where(valid, t, 0.0)), reduction="none")
    ref = 2.5 * (per * torch.tensor(valid)).sum() / norm(4, ignored)
    ref.backward()
    np.testing.assert_allclose(loss, float(ref.detach()), rtol=1e-12)
    np.testing.assert_allclose(dx.reshape(4, 6), tx.grad.numpy(), rtol=1e-10, atol=1e-15)
    if ignore:
        assert np.all(dx.reshape(4, 6)[~valid] == 0)


def test_ignore_label_compares_the_truncated_target(rng):
    """Caffe casts the target to int: -1.7 truncates to -1 and is ignored, -0.5 to 0 is not."""
    x = rng.standard_normal((1, 3))
    _, loss, dx = run(x, [[-1.7, -0.5, 0.0]], loss_text("ignore_label: -1 normalization: NONE"))
    assert dx[0, 0] == 0 and dx[0, 1] != 0
    sig = 1 / (1 + np.exp(-x[0, 1:]))
    t = np.array([-0.5, 0.0])
    expected = -(t * np.log(sig) + (1 - t) * np.log(1 - sig)).sum()
    np.testing.assert_allclose(loss, expected, rtol=1e-12)


def test_all_ignored_gives_zero_not_nan():
    _, loss, dx = run(np.ones((2, 2)), -np.ones((2, 2)),
                      loss_text("ignore_label: -1 normalization: VALID"))
    assert loss == 0.0 and np.all(dx == 0)


def test_stable_for_large_scores():
    """Caffe's form never takes exp of a positive number: finite where the naive form is not."""
    x = np.array([[-800.0, 800.0, -800.0, 800.0]], dtype=np.float32)
    t = np.array([[0.0, 1.0, 1.0, 0.0]], dtype=np.float32)
    layer, bottom, top = setup(x, t, loss_text("normalization: NONE"), dtype=np.float32)
    loss = float(to_numpy(layer.forward(bottom, top)))
    np.testing.assert_allclose(loss, 1600.0, rtol=1e-6)   # two right (0), two off by 800
    layer.backward(top, [True, False], bottom)
    np.testing.assert_array_equal(to_numpy(bottom[0].diff), [[0, 0, -1, 1]])


@pytest.mark.parametrize("params", ["", "normalization: VALID ignore_label: 2"])
def test_gradient(params, rng):
    x = rng.standard_normal((3, 2, 2))
    t = rng.uniform(0, 1, size=(3, 4))
    t[0, 1] = t[2, 3] = 2
    layer = make_layer(loss_text(params))
    assert not layer.allow_force_backward(1)
    check_gradient(layer, [make_blob(x), make_blob(t)])


def test_declarations(rng):
    layer, bottom, top = setup(rng.standard_normal((2, 3)), rng.uniform(size=(2, 3)),
                               loss_text())
    assert layer.backward_reads() == BackwardReads(bottom=(1,), internals=("sigmoid_output",))
    assert layer.internals["sigmoid_output"].saved
    assert layer.internals["sigmoid_output"].blob.shape == (2, 3)
    assert layer.loss_weights == [1.0] and top[0].shape == ()
    layer.forward(bottom, top)
    with pytest.raises(ValueError, match="'sce' of type SigmoidCrossEntropyLoss: cannot "
                                         "backpropagate to label inputs"):
        layer.backward(top, [True, True], bottom)


@pytest.mark.parametrize("sa,sb,match", [((2, 3), (3, 2), "the data and label should have the "
                                                          "same first dimension"),
                                         ((2, 3), (2, 4), "inputs must have the same count")])
def test_shape_errors(sa, sb, match):
    with pytest.raises(ValueError, match=f"'sce' of type SigmoidCrossEntropyLoss: {match}"):
        setup(np.zeros(sa), np.zeros(sb), loss_text())


# -------------------------------------------------------------------- GPU
def rel_err(a, b):
    return float(np.max(np.abs(a - b)) / max(np.max(np.abs(b)), 1e-30))


@pytest.mark.gpu
@pytest.mark.parametrize("params", ["", "normalization: VALID ignore_label: -1",
                                    "normalization: FULL"])
def test_gpu_matches_cpu(cp, params):
    r = np.random.default_rng(9)
    x = (4 * r.standard_normal((16, 10, 3))).astype(np.float32)
    t = r.uniform(size=(16, 10, 3)).astype(np.float32)
    t[r.uniform(size=t.shape) < 0.2] = -1
    outs = []
    for xp in (np, cp):
        layer, bottom, top = setup(x, t, loss_text(params, "loss_weight: 0.5"), xp=xp,
                                   dtype=np.float32)
        loss = to_numpy(layer.forward(bottom, top))
        layer.backward(top, [True, False], bottom)
        outs.append((np.atleast_1d(loss), to_numpy(bottom[0].diff)))
    for c, g in zip(*outs):
        assert rel_err(g, c) <= 1e-5


# ------------------------------------------------- a net of the new layer types
NET = """
name: "new_layers"
layer { name: "data" type: "DummyData" top: "data" top: "target" top: "words"
  dummy_data_param { shape { dim: 4 dim: 3 dim: 4 dim: 4 } shape { dim: 4 dim: 2 dim: 4 dim: 4 }
    shape { dim: 4 dim: 3 }
    data_filler { type: "gaussian" std: 1 } data_filler { type: "uniform" min: 0 max: 1 }
    data_filler { type: "constant" value: 2 } } }
layer { name: "conv" type: "Convolution" bottom: "data" top: "conv"
  convolution_param { num_output: 6 kernel_size: 3 pad: 1 weight_filler { type: "xavier" } } }
layer { name: "slice" type: "Slice" bottom: "conv" top: "a" top: "b" top: "c"
  slice_param { slice_point: 2 slice_point: 5 } }
layer { name: "mvn" type: "MVN" bottom: "a" top: "a_n" }
layer { name: "loss" type: "SigmoidCrossEntropyLoss" bottom: "a_n" bottom: "target" top: "loss"
  loss_param { normalization: VALID ignore_label: -1 } }
layer { name: "tile" type: "Tile" bottom: "b" top: "b_t" tile_param { axis: 2 tiles: 2 } }
layer { name: "sq" type: "Reduction" bottom: "b_t" top: "sq" loss_weight: 0.01
  reduction_param { operation: SUMSQ axis: 0 } }
layer { name: "abs" type: "Reduction" bottom: "c" top: "abs" loss_weight: 0.02
  reduction_param { operation: ASUM axis: 1 } }
layer { name: "emb" type: "Embed" bottom: "words" top: "emb"
  embed_param { input_dim: 5 num_output: 2 weight_filler { type: "gaussian" std: 1 } } }
layer { name: "mean" type: "Reduction" bottom: "emb" top: "emb_mean" loss_weight: 0.1
  reduction_param { operation: MEAN } }
layer { name: "argmax" type: "ArgMax" bottom: "a_n" top: "argmax" argmax_param { axis: 1 } }
"""


def make_solver(seed=3):
    from minicaffe.proto import caffe_pb2, parse_text
    return sgd_solver(parse_text(NET, caffe_pb2.NetParameter), seed=seed, weight_decay=0.0,
                      max_iter=10)


def test_net_forward_backward():
    from minicaffe.net import TRAIN, Net
    from minicaffe.proto import caffe_pb2, parse_text
    net = Net(parse_text(NET, caffe_pb2.NetParameter), TRAIN, mode="CPU")
    assert net.blobs["a_n"].shape == (4, 2, 4, 4) and net.blobs["c"].shape == (4, 1, 4, 4)
    assert net.blobs["b_t"].shape == (4, 3, 8, 4) and net.blobs["emb"].shape == (4, 3, 2)
    assert net.blobs["sq"].shape == () and net.blobs["abs"].shape == (4,)
    assert net.blobs["argmax"].shape == (4, 1, 4, 4)
    loss = float(to_numpy(net.forward_from_to()))
    expected = float(to_numpy(net.blobs["loss"].data)) \
        + 0.01 * float(to_numpy(net.blobs["sq"].data)) \
        + 0.02 * float(to_numpy(net.blobs["abs"].data).sum()) \
        + 0.1 * float(to_numpy(net.blobs["emb_mean"].data))
    np.testing.assert_allclose(loss, expected, rtol=1e-6)
    argmax_layer = net.layers[net.layer_names.index("argmax")]
    assert not net.layer_need_backward[net.layer_names.index("argmax")]
    net.clear_param_diffs()
    net.backward_from_to()
    conv_w = net.layers[net.layer_names.index("conv")].blobs[0]
    emb_w = net.layers[net.layer_names.index("emb")].blobs[0]
    assert np.abs(to_numpy(conv_w.diff)).sum() > 0
    # every word is 2: only row 2 of the embedding gets a gradient, 0.1 / 24 from each of 12
    np.testing.assert_allclose(to_numpy(emb_w.diff)[2], 0.1 / 24 * 12, rtol=1e-6)
    np.testing.assert_array_equal(np.delete(to_numpy(emb_w.diff), 2, axis=0), 0.0)
    assert argmax_layer.backward_reads() == BackwardReads()


def train(strategy=None, iters=5):
    """Train ``iters`` iterations (with minicaffe's chunked convolution lowering, the same in
    every run); return (params, history, losses, executor)."""
    return train_steps(make_solver(), iters, strategy, None, "chunked")


def test_memory_planner_accepts_the_net_and_trains_it_bit_identically():
    """The GMAP sees the new layers' internals; `none` and `naive` (every feature map offloaded,
    freed regions poisoned with NaN, so an undeclared backward read shows) train exactly as the
    plain net does."""
    from swap.gmap import SAVED, SCRATCH, build_gmap
    from swap.plan import make_plan, min_budget
    g = build_gmap(make_solver().net)
    kinds = {b.name: b.kind for b in g.buffers}
    assert kinds["saved:mvn/variance"] == SAVED
    assert kinds["saved:loss/sigmoid_output"] == SAVED
    assert kinds["scratch:mvn/temp"] == SCRATCH
    assert make_plan(g, "naive").offloaded
    assert min_budget(g, "naive") < min_budget(g, "none")
    base = train()
    for strategy in ("none", "naive"):
        params, history, losses, ex = train(strategy)
        assert ex.iterations == 5
        assert all(np.array_equal(a, b) for a, b in zip(params, base[0])), strategy
        assert all(np.array_equal(a, b) for a, b in zip(history, base[1])), strategy
        assert losses == base[2], strategy
        if strategy == "naive":
            assert ex.plan.offloaded and ex.host.nbytes == ex.plan.host_bytes
