"""Embed: the lookup against torch, weight layout, gradient accumulation for repeated indices,
gradients, index errors, declarations, GPU parity."""
import numpy as np
import pytest

from minicaffe.backend import to_numpy
from minicaffe.blob import Blob
from minicaffe.layer import BackwardReads
from minicaffe.testing import check_gradient, make_blob, make_layer

FILLERS = 'weight_filler { type: "gaussian" std: 1 } bias_filler { type: "gaussian" std: 1 }'


def embed_text(params="input_dim: 5 num_output: 3"):
    return f'name: "emb" type: "Embed" embed_param {{ {params} {FILLERS} }}'


def setup(text, idx, xp=np, dtype=np.float64):
    layer = make_layer(text, xp=xp, dtype=dtype)
    bottom = [make_blob(idx, xp=xp, dtype=dtype, name="words")]
    top = [Blob(xp=xp, dtype=dtype, name="vec")]
    layer.setup(bottom, top)
    return layer, bottom, top


IDX = np.array([[1, 4, 1], [0, 4, 4]])  # repeated indices


@pytest.mark.parametrize("bias", [True, False])
def test_forward_and_accumulating_backward_match_torch(bias, rng):
    torch = pytest.importorskip("torch")
    params = "input_dim: 5 num_output: 3" + ("" if bias else " bias_term: false")
    layer, bottom, top = setup(embed_text(params), IDX)
    assert layer.blobs[0].shape == (5, 3)               # Caffe's (input_dim, num_output)
    assert len(layer.blobs) == (2 if bias else 1)
    layer.forward(bottom, top)
    assert top[0].shape == (2, 3, 3)
    w = torch.tensor(to_numpy(layer.blobs[0].data), requires_grad=True)
    b = torch.tensor(to_numpy(layer.blobs[1].data), requires_grad=True) if bias else None
    ref = torch.nn.functional.embedding(torch.tensor(IDX), w)
    if bias:
        ref = ref + b
    np.testing.assert_allclose(to_numpy(top[0].data), ref.detach().numpy(), rtol=1e-12)
    dy = rng.standard_normal(top[0].shape)
    top[0].diff[...] = dy
    for p in layer.blobs:
        p.diff[...] = 0
    layer.backward(top, [False], bottom)
    ref.backward(torch.tensor(dy))
    np.testing.assert_allclose(to_numpy(layer.blobs[0].diff), w.grad.numpy(), rtol=1e-12)
    # rows 1 and 4 were picked 2 and 3 times: their gradients are summed
    np.testing.assert_allclose(to_numpy(layer.blobs[0].diff)[4],
                               dy[0, 1] + dy[1, 1] + dy[1, 2], rtol=1e-12)
    np.testing.assert_array_equal(to_numpy(layer.blobs[0].diff)[[2, 3]], 0.0)
    if bias:
        np.testing.assert_allclose(to_numpy(layer.blobs[1].diff), b.grad.numpy(), rtol=1e-12)
    # param diffs accumulate across backward calls (Caffe's rule)
    layer.backward(top, [False], bottom)
    np.testing.assert_allclose(to_numpy(layer.blobs[0].diff), 2 * w.grad.numpy(), rtol=1e-12)


@pytest.mark.parametrize("params", ["input_dim: 4 num_output: 3",
                                    "input_dim: 4 num_output: 2 bias_term: false"])
def test_gradient(params):
    layer = make_layer(embed_text(params))
    check_gradient(layer, [make_blob([[3, 0], [3, 3], [1, 0]])])
    assert layer.backward_reads() == BackwardReads(bottom=(0,))
    assert layer.internals == {}


def test_declarations_without_a_weight_gradient():
    layer, _, _ = setup(embed_text(), IDX)
    assert not layer.allow_force_backward(0)
    layer.param_propagate_down = [False, True]
    assert layer.backward_reads() == BackwardReads()    # the bias gradient needs no indices


def test_loaded_blobs_are_kept():
    """Blobs present before setup (a .caffemodel, shared params) are not refilled."""
    layer = make_layer(embed_text())
    w = layer.make_param_blob((5, 3), 0)
    w.data[...] = np.arange(15.0).reshape(5, 3)
    bias = layer.make_param_blob((3,), 1)
    bias.data[...] = 0
    layer.blobs = [w, bias]
    bottom, top = [make_blob([2, 0])], [Blob(dtype=np.float64)]
    layer.setup(bottom, top)
    layer.forward(bottom, top)
    np.testing.assert_array_equal(to_numpy(top[0].data), [[6, 7, 8], [0, 1, 2]])


@pytest.mark.parametrize("idx,bad", [([0, 5], "5.0"), ([-1, 2], "-1.0"), ([4.5, 5.2], "5.2")])
def test_bad_indices_are_errors(idx, bad):
    layer, bottom, top = setup(embed_text(), idx)
    with pytest.raises(ValueError, match=rf"'emb' of type Embed: bottom 'words' holds {bad} at "
                                         r"flat position \d; indices \(truncated toward zero\) "
                                         r"must lie in \[0, input_dim = 5\)"):
        layer.forward(bottom, top)


def test_an_index_with_a_fraction_is_truncated_as_caffe_release_does():
    """Caffe's Forward reads ``static_cast<int>(bottom_data[n])``: 1.7 picks row 1, -0.5 row
    0 (toward zero); the weight's gradient goes to the same rows."""
    layer, bottom, top = setup(embed_text(), [1.7, -0.5, 3.999])
    w = layer.blobs[0].data
    layer.forward(bottom, top)
    want = w[[1, 0, 3]] + layer.blobs[1].data[None, :]
    np.testing.assert_allclose(to_numpy(top[0].data), to_numpy(want))
    top[0].diff[...] = 1.0
    layer.blobs[0].diff[...] = 0.0
    layer.backward(top, [False], bottom)
    np.testing.assert_array_equal(to_numpy(layer.blobs[0].diff).sum(axis=1), [3, 3, 0, 3, 0])


@pytest.mark.parametrize("params,match", [("input_dim: 5", "num_output must be positive"),
                                          ("num_output: 3", "input_dim must be positive")])
def test_setup_errors(params, match):
    with pytest.raises(ValueError, match=f"'emb' of type Embed: {match}"):
        setup(embed_text(params), IDX)


def test_no_gradient_to_the_indices():
    layer, bottom, top = setup(embed_text(), IDX)
    layer.forward(bottom, top)
    with pytest.raises(ValueError, match="can't backpropagate to EmbedLayer input"):
        layer.backward(top, [True], bottom)


# -------------------------------------------------------------------- GPU
def rel_err(a, b):
    return float(np.max(np.abs(a - b)) / max(np.max(np.abs(b)), 1e-30))


@pytest.mark.gpu
@pytest.mark.parametrize("bias", [True, False])
def test_gpu_matches_cpu(cp, bias):
    idx = np.random.default_rng(7).integers(0, 50, size=(16, 20))    # many repeats
    params = "input_dim: 50 num_output: 32" + ("" if bias else " bias_term: false")
    outs = []
    for xp in (np, cp):
        r = np.random.default_rng(8)
        layer, bottom, top = setup(embed_text(params), idx, xp=xp, dtype=np.float32)
        for p in layer.blobs:
            p.data[...] = xp.asarray(r.standard_normal(p.shape), dtype=np.float32)
            p.diff[...] = 0
        layer.forward(bottom, top)
        top[0].diff[...] = xp.asarray(r.standard_normal(top[0].shape), dtype=np.float32)
        layer.backward(top, [False], bottom)
        outs.append([to_numpy(top[0].data)] + [to_numpy(p.diff) for p in layer.blobs])
    for c, g in zip(*outs):
        assert rel_err(g, c) <= 1e-5
    layer, bottom, top = setup(embed_text(params), [3.0, 50.0], xp=cp, dtype=np.float32)
    with pytest.raises(ValueError, match="holds 50.0 at flat position 1"):
        layer.forward(bottom, top)
