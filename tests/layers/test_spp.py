"""SPP: Caffe's GetPoolingParam and pooling rules against a NumPy reference built from Caffe's
formulas (and torch's plain pooling windows), gradients, errors, declarations, GPU parity;
and a small net of SPP, Im2col and BatchReindex trained plainly and under the memory planner."""
import math

import numpy as np
import pytest

from minicaffe.backend import to_numpy
from minicaffe.blob import Blob
from minicaffe.layers.spp import spp_pooling_geometry
from minicaffe.testing import check_gradient, make_blob, make_layer, sgd_solver, train_steps

FLT_MAX = float(np.finfo(np.float32).max)


def spp_text(height, pool="MAX", name="spp"):
    return f'name: "{name}" type: "SPP" spp_param {{ pyramid_height: {height} pool: {pool} }}'


def distinct(rng, shape):
    n = int(np.prod(shape))
    return (rng.permutation(n).reshape(shape) - n / 2) * 0.01


def reference_level(x, level, pool):
    """One pyramid level as Caffe computes it: GetPoolingParam, then PoolingLayer's
    Reshape and Forward_cpu written out window by window."""
    n, c, h, w = x.shape
    bins = 2 ** level
    kh, kw = math.ceil(h / bins), math.ceil(w / bins)
    ph, pw = (kh * bins - h + 1) // 2, (kw * bins - w + 1) // 2
    oh = int(math.ceil((h + 2 * ph - kh) / kh)) + 1
    ow = int(math.ceil((w + 2 * pw - kw) / kw)) + 1
    if ph or pw:
        if (oh - 1) * kh >= h + ph:
            oh -= 1
        if (ow - 1) * kw >= w + pw:
            ow -= 1
    out = np.empty((n, c, oh, ow))
    for i in range(oh):
        for j in range(ow):
            hs, ws = i * kh - ph, j * kw - pw
            he, we = min(hs + kh, h + ph), min(ws + kw, w + pw)
            size = (he - hs) * (we - ws)
            hs, ws, he, we = max(hs, 0), max(ws, 0), min(he, h), min(we, w)
            win = x[:, :, hs:he, ws:we]
            if pool == "MAX":
                out[:, :, i, j] = win.max(axis=(2, 3)) if win.size else -FLT_MAX
            else:
                out[:, :, i, j] = win.sum(axis=(2, 3)) / size
    return out


def reference(x, height, pool):
    levels = [reference_level(x, lv, pool) for lv in range(height)]
    if height == 1:
        return levels[0]
    return np.concatenate([lv.reshape(x.shape[0], -1) for lv in levels], axis=1)


def run(x, text, xp=np, dtype=np.float64):
    layer = make_layer(text, xp=xp, dtype=dtype)
    bottom = [make_blob(x, xp=xp, dtype=dtype, name="in")]
    top = [Blob(xp=xp, dtype=dtype, name="out")]
    layer.setup(bottom, top)
    layer.forward(bottom, top)
    return layer, bottom, top


def test_get_pooling_param_by_hand():
    # H = 9, 4 bins: kernel ceil(9/4) = 3, remainder 12 - 9 = 3, pad (3 + 1)/2 = 2;
    # W = 7: kernel 2, remainder 1, pad 1
    assert spp_pooling_geometry(2, 9, 7) == ((3, 2), (3, 2), (2, 1))
    assert spp_pooling_geometry(0, 9, 7) == ((9, 7), (9, 7), (0, 0))
    assert spp_pooling_geometry(1, 6, 5) == ((3, 3), (3, 3), (0, 1))


@pytest.mark.parametrize("shape", [(2, 3, 9, 7), (1, 2, 8, 8), (2, 2, 13, 11), (1, 1, 6, 10)])
@pytest.mark.parametrize("pool", ["MAX", "AVE"])
@pytest.mark.parametrize("height", [1, 2, 3])
def test_forward_matches_caffe_formulas(shape, pool, height, rng):
    x = rng.standard_normal(shape)
    layer, _, (top,) = run(x, spp_text(height, pool))
    ref = reference(x, height, pool)
    n, c = shape[:2]
    expected = (n, c, 1, 1) if height == 1 else (n, c * sum(4 ** lv for lv in range(height)))
    assert top.shape == expected == ref.shape
    np.testing.assert_allclose(top.data, ref, rtol=1e-13, atol=1e-15)
    # every level pools into exactly 2^l x 2^l windows
    assert layer.bins == [(2 ** lv, 2 ** lv) for lv in range(height)]


@pytest.mark.parametrize("pool", ["MAX", "AVE"])
def test_forward_matches_torch_plain_windows(pool, rng):
    """Each level through torch's pooling with Caffe's kernel, stride and pad given
    explicitly (ceil_mode, padding counted in the average): not adaptive pooling."""
    torch = pytest.importorskip("torch")
    F = torch.nn.functional
    x = rng.standard_normal((2, 3, 7, 10))           # every pad at most half its kernel
    _, _, (top,) = run(x, spp_text(3, pool))
    parts = []
    for lv in range(3):
        k, s, p = spp_pooling_geometry(lv, 7, 10)
        tx = torch.tensor(x)
        if pool == "MAX":
            y = F.max_pool2d(tx, k, s, p, ceil_mode=True)
        else:
            y = F.avg_pool2d(tx, k, s, p, ceil_mode=True, count_include_pad=True)
        assert y.shape[2:] == (2 ** lv, 2 ** lv)
        parts.append(y.reshape(2, -1).numpy())
    np.testing.assert_allclose(top.data, np.concatenate(parts, axis=1), rtol=1e-13)


def test_adaptive_pooling_differs_where_caffe_pads(rng):
    """torch's adaptive pooling is not Caffe's SPP: with padding the bins differ."""
    torch = pytest.importorskip("torch")
    x = rng.standard_normal((1, 1, 5, 5))
    _, _, (top,) = run(x, spp_text(2, "AVE"))
    adaptive = torch.nn.functional.adaptive_avg_pool2d(torch.tensor(x), 2).reshape(-1).numpy()
    assert not np.allclose(top.data[0, 1:], adaptive)
    np.testing.assert_allclose(top.data, reference(x, 2, "AVE"), rtol=1e-13)


@pytest.mark.parametrize("phase", [0, 1])
def test_stochastic_samples_in_both_phases(phase):
    """Caffe's GetPoolingParam builds each level's LayerParameter afresh, so its phase is
    the proto default TRAIN whatever the net's phase: a STOCHASTIC SPP samples one pixel per
    window in a TEST net too (never the test-time weighted average), and has a backward."""
    x = np.random.default_rng(1).uniform(0.1, 1.0, (2, 2, 8, 8))
    layer = make_layer(spp_text(3, "STOCHASTIC"), phase=phase)
    bottom, top = [make_blob(x)], [Blob(dtype=np.float64)]
    layer.setup(bottom, top)
    layer.forward(bottom, top)
    y = to_numpy(top[0].data)
    offset = 0
    for lv in range(3):
        b, k = 2 ** lv, 8 // 2 ** lv
        win = x.reshape(2, 2, b, k, b, k).transpose(0, 1, 2, 4, 3, 5).reshape(2, 2, b, b, -1)
        got = y[:, offset:offset + 2 * b * b].reshape(2, 2, b, b)
        offset += 2 * b * b
        assert (win == got[..., None]).any(axis=-1).all(), f"level {lv}: not a sampled pixel"
    assert set(layer.backward_reads().internals) == {f"level{lv}/rand_idx" for lv in range(3)}
    top[0].diff[...] = 1.0
    layer.backward(top, [True], bottom)
    # each level routes each bin's gradient to its one sampled pixel: 1 + 4 + 16 per image
    np.testing.assert_allclose(to_numpy(bottom[0].diff).sum(axis=(2, 3)), 21.0)


@pytest.mark.parametrize("pool", ["MAX", "AVE"])
@pytest.mark.parametrize("height,shape", [(1, (2, 2, 5, 4)), (2, (2, 2, 5, 7)),
                                          (3, (1, 2, 9, 8))])
def test_gradient(pool, height, shape, rng):
    x = distinct(rng, shape) if pool == "MAX" else rng.standard_normal(shape)
    check_gradient(make_layer(spp_text(height, pool)), [make_blob(x)])


def test_backward_is_the_sum_of_the_levels(rng):
    """Caffe's Split sums the levels' gradients: check against per-level references."""
    x = distinct(rng, (2, 3, 9, 7))
    layer, bottom, top = run(x, spp_text(3, "AVE"))
    dy = rng.standard_normal(top[0].shape)
    top[0].diff[...] = dy
    bottom[0].diff[...] = np.nan                     # overwritten, not accumulated
    layer.backward(top, [True], bottom)
    expected = np.zeros_like(x)
    off = 0
    for lv in range(3):
        (kh, kw), _, (ph, pw) = spp_pooling_geometry(lv, 9, 7)
        b = 2 ** lv
        g = dy[:, off:off + 3 * b * b].reshape(2, 3, b, b)
        off += 3 * b * b
        for i in range(b):
            for j in range(b):
                hs, ws = i * kh - ph, j * kw - pw
                he, we = min(hs + kh, 9 + ph), min(ws + kw, 7 + pw)
                size = (he - hs) * (we - ws)
                expected[:, :, max(hs, 0):min(he, 9), max(ws, 0):min(we, 7)] += \
                    (g[:, :, i, j] / size)[:, :, None, None]
    np.testing.assert_allclose(bottom[0].diff, expected, rtol=1e-12)


def test_declarations(rng):
    layer, bottom, top = run(distinct(rng, (2, 3, 9, 7)), spp_text(3, "MAX"))
    names = [f"level{lv}/mask" for lv in range(3)]
    assert layer.backward_reads().internals == tuple(names)
    assert layer.backward_reads().bottom == () and layer.backward_reads().top == ()
    for nm, lv in zip(names, range(3)):
        it = layer.internals[nm]
        assert it.saved and it.blob.dtype == np.int32 and it.blob.shape == (2, 3, 2 ** lv, 2 ** lv)
    assert not layer.internals["pooled"].saved
    assert layer.internals["pooled"].blob.count == 2 * 3 * 16
    assert layer.internals["bottom_diff"].uses == ("backward",)
    assert layer.internals["bottom_diff"].blob.shape == (2, 3, 9, 7)
    ave, _, _ = run(rng.standard_normal((2, 3, 9, 7)), spp_text(2, "AVE"))
    assert ave.backward_reads().internals == ()
    one, _, _ = run(rng.standard_normal((2, 3, 9, 7)), spp_text(1, "AVE"))
    assert one.internals == {}
    f, b = layer.flops(bottom, top)
    assert f > 0 and b > 0


def test_reshape_follows_the_bottom(rng):
    layer, bottom, top = run(rng.standard_normal((2, 3, 9, 7)), spp_text(2, "MAX"))
    bottom[0].reshape(4, 3, 16, 12)
    bottom[0].data[...] = x = rng.standard_normal((4, 3, 16, 12))
    layer.reshape(bottom, top)
    layer.forward(bottom, top)
    assert top[0].shape == (4, 15)
    assert layer.internals["level1/mask"].blob.shape == (4, 3, 2, 2)
    np.testing.assert_allclose(top[0].data, reference(x, 2, "MAX"))


@pytest.mark.parametrize("text,shape,match", [
    (spp_text(3), (1, 1, 5, 5), r"'spp' \(SPP\): pyramid level 2 \(4x4 bins\) of the 5x5 input "
                                r"'in' pools with kernel \(2, 2\), stride \(2, 2\), pad \(2, 2\)"),
    (spp_text(2, "STOCHASTIC"), (1, 1, 5, 5), "padding implemented only for average and max"),
    ('name: "spp" type: "SPP" spp_param { pool: MAX }', (1, 1, 4, 4),
     "pyramid_height must be given"),
    (spp_text(2), (2, 3, 4), "input must have 4 axes"),
])
def test_errors(text, shape, match):
    layer = make_layer(text)
    with pytest.raises(ValueError, match=match):
        layer.setup([make_blob(np.zeros(shape), name="in")], [Blob(dtype=np.float64)])


# -------------------------------------------------------------------- GPU
@pytest.mark.gpu
@pytest.mark.parametrize("pool,height", [("MAX", 1), ("MAX", 3), ("AVE", 3), ("AVE", 2)])
def test_gpu_matches_cpu(cp, pool, height, rng):
    x = distinct(rng, (4, 3, 13, 11)).astype(np.float32)
    outs = []
    for xp in (np, cp):
        layer, bottom, top = run(x, spp_text(height, pool), xp=xp, dtype=np.float32)
        top[0].diff[...] = xp.asarray(np.linspace(-1, 1, top[0].count, dtype=np.float32)
                                      .reshape(top[0].shape))
        layer.backward(top, [True], bottom)
        outs.append((to_numpy(top[0].data), to_numpy(bottom[0].diff)))
    for g, c in zip(outs[1], outs[0]):
        assert np.abs(g - c).max() <= 1e-5 * max(np.abs(c).max(), 1e-30)


# ------------------------------------------- a net of SPP, Im2col and BatchReindex
NET = """
name: "spp_net"
layer { name: "data" type: "DummyData" top: "data" top: "perm" top: "label"
  dummy_data_param { shape { dim: 4 dim: 3 dim: 9 dim: 9 } shape { dim: 6 } shape { dim: 6 }
    data_filler { type: "gaussian" std: 1 } data_filler { type: "uniform" min: 0 max: 3.99 }
    data_filler { type: "constant" value: 1 } } }
layer { name: "conv" type: "Convolution" bottom: "data" top: "conv"
  convolution_param { num_output: 4 kernel_size: 3 pad: 1 weight_filler { type: "xavier" } } }
layer { name: "cols" type: "Im2col" bottom: "conv" top: "cols"
  convolution_param { kernel_size: 2 stride: 2 pad: 1 } }
layer { name: "spp_max" type: "SPP" bottom: "cols" top: "spp_max"
  spp_param { pyramid_height: 2 pool: MAX } }
layer { name: "spp_ave" type: "SPP" bottom: "conv" top: "spp_ave"
  spp_param { pyramid_height: 3 pool: AVE } }
layer { name: "reindex" type: "BatchReindex" bottom: "spp_max" bottom: "perm" top: "picked" }
layer { name: "ip" type: "InnerProduct" bottom: "picked" top: "ip"
  inner_product_param { num_output: 3 weight_filler { type: "xavier" } } }
layer { name: "loss" type: "SoftmaxWithLoss" bottom: "ip" bottom: "label" top: "loss" }
layer { name: "ip2" type: "InnerProduct" bottom: "spp_ave" top: "ip2"
  inner_product_param { num_output: 2 weight_filler { type: "xavier" } } }
layer { name: "sq" type: "Reduction" bottom: "ip2" top: "sq" loss_weight: 0.01
  reduction_param { operation: SUMSQ } }
"""


def make_solver(seed=3):
    from minicaffe.proto import caffe_pb2, parse_text
    return sgd_solver(parse_text(NET, caffe_pb2.NetParameter), seed=seed, weight_decay=0.0,
                      max_iter=10)


def test_net_shapes_and_backward():
    from minicaffe.net import TRAIN, Net
    from minicaffe.proto import caffe_pb2, parse_text
    net = Net(parse_text(NET, caffe_pb2.NetParameter), TRAIN, mode="CPU")
    assert net.blobs["cols"].shape == (4, 16, 5, 5)
    assert net.blobs["spp_max"].shape == (4, 16 * 5)
    assert net.blobs["spp_ave"].shape == (4, 4 * 21)
    assert net.blobs["picked"].shape == (6, 80)
    net.forward_from_to()
    net.clear_param_diffs()
    net.backward_from_to()
    li = net.layer_names.index("reindex")
    assert net.bottom_need_backward[li] == [True, False]
    conv_w = net.layers[net.layer_names.index("conv")].blobs[0]
    assert np.abs(to_numpy(conv_w.diff)).sum() > 0


def train(strategy=None, iters=5):
    return train_steps(make_solver(), iters, strategy, None, "chunked")


def test_memory_planner_accepts_the_net_and_trains_it_bit_identically():
    from swap.gmap import SAVED, SCRATCH, build_gmap
    from swap.plan import make_plan, min_budget
    g = build_gmap(make_solver().net)
    kinds = {b.name: b.kind for b in g.buffers}
    assert kinds["saved:spp_max/level0/mask"] == SAVED
    assert kinds["saved:spp_max/level1/mask"] == SAVED
    assert kinds["scratch:spp_max/pooled"] == SCRATCH
    assert kinds["scratch:spp_ave/bottom_diff"] == SCRATCH
    assert not any(n.startswith(("saved:cols", "scratch:cols", "saved:reindex",
                                 "scratch:reindex")) for n in kinds)
    assert make_plan(g, "naive").offloaded
    assert min_budget(g, "naive") < min_budget(g, "none")
    base = train()
    assert len(set(base[2])) > 1
    for strategy in ("none", "naive"):
        params, history, losses, ex = train(strategy)
        assert ex.iterations == 5
        assert all(np.array_equal(a, b) for a, b in zip(params, base[0])), strategy
        assert all(np.array_equal(a, b) for a, b in zip(history, base[1])), strategy
        assert losses == base[2], strategy
