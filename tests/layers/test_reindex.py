"""BatchReindex and Filter: forward against NumPy, Caffe's index checks and truncation,
backward sums (repeated indices) and zeros (filtered-out items), gradients, errors,
declarations, GPU parity; Filter's data-dependent top shape in a Net, plainly and under the
memory planner."""
import numpy as np
import pytest

from minicaffe.backend import to_numpy
from minicaffe.blob import Blob
from minicaffe.testing import check_gradient, make_blob, make_layer, sgd_solver, train_steps

REINDEX = 'name: "reindex" type: "BatchReindex"'
FILTER = 'name: "filter" type: "Filter"'


def setup(text, arrays, n_top=1, xp=np, dtype=np.float64):
    layer = make_layer(text, xp=xp, dtype=dtype)
    bottom = [make_blob(a, xp=xp, dtype=dtype, name=f"b{i}") for i, a in enumerate(arrays)]
    top = [Blob(xp=xp, dtype=dtype, name=f"t{i}") for i in range(n_top)]
    layer.setup(bottom, top)
    return layer, bottom, top


# ------------------------------------------------------------- BatchReindex
def test_reindex_forward_and_truncation(rng):
    x = rng.standard_normal((4, 3, 2))
    idx = np.array([3, 0.9, 2.999, 0, 3, 1.5])          # truncated: 3 0 2 0 3 1
    layer, bottom, top = setup(REINDEX, [x, idx])
    assert top[0].shape == (6, 3, 2)
    layer.forward(bottom, top)
    np.testing.assert_array_equal(top[0].data, x[[3, 0, 2, 0, 3, 1]])


def test_reindex_backward_sums_repeats_in_top_order(rng):
    x = rng.standard_normal((4, 5))
    idx = np.array([2, 0, 2, 2, 1, 0])
    layer, bottom, top = setup(REINDEX, [x, idx])
    layer.forward(bottom, top)
    dy = rng.standard_normal((6, 5))
    top[0].diff[...] = dy
    bottom[0].diff[...] = np.nan
    layer.backward(top, [True, False], bottom)
    expected = np.zeros((4, 5))
    for n, i in enumerate(idx):                          # Caffe's loop, in its order
        expected[i] += dy[n]
    np.testing.assert_array_equal(bottom[0].diff, expected)
    assert np.all(bottom[0].diff[3] == 0)                # never picked


def test_reindex_empty_index(rng):
    layer, bottom, top = setup(REINDEX, [rng.standard_normal((3, 2)), np.zeros((0,))])
    layer.forward(bottom, top)
    assert top[0].shape == (0, 2)
    layer.backward(top, [True, False], bottom)
    assert np.all(bottom[0].diff == 0)


def test_reindex_gradient(rng):
    layer = make_layer(REINDEX)
    assert not layer.allow_force_backward(1) and layer.allow_force_backward(0)
    check_gradient(layer, [make_blob(rng.standard_normal((4, 2, 3))),
                           make_blob([1, 3, 1, 0.2, 1])])


@pytest.mark.parametrize("idx,match", [([0, -0.5], r"'reindex' \(BatchReindex\): index "
                                                   "specified for reindex layer was negative"),
                                       ([0, 3], "was greater than batch size"),
                                       ([np.nan], "was greater than batch size")])
def test_reindex_bad_index(idx, match):
    layer, bottom, top = setup(REINDEX, [np.zeros((3, 2)), np.array(idx, dtype=float)])
    with pytest.raises(ValueError, match=match):
        layer.forward(bottom, top)


def test_reindex_errors():
    with pytest.raises(ValueError, match=r"'reindex' \(BatchReindex\): the index bottom 'b1' "
                                         "must have 1 axis"):
        setup(REINDEX, [np.zeros((3, 2)), np.zeros((2, 1))])
    layer, bottom, top = setup(REINDEX, [np.zeros((3, 2)), np.zeros(2)])
    layer.forward(bottom, top)
    with pytest.raises(ValueError, match="cannot backprop to index"):
        layer.backward(top, [True, True], bottom)
    with pytest.raises(ValueError, match="exactly 2 bottom"):
        setup(REINDEX, [np.zeros((3, 2))])


def test_reindex_declarations(rng):
    layer, bottom, top = setup(REINDEX, [rng.standard_normal((3, 2)), np.array([1.0, 2.0])])
    br = layer.backward_reads()
    assert br.bottom == () and br.top == () and br.internals == ()
    assert layer.internals == {}


# ------------------------------------------------------------------ Filter
def test_filter_forward_backward(rng):
    a = rng.standard_normal((5, 2, 3))
    b = rng.standard_normal((5, 4))
    sel = np.array([[0.0], [1.0], [-2.0], [0.0], [np.nan]])   # NaN is non-zero, as in C++
    layer, bottom, top = setup(FILTER, [a, b, sel], n_top=2)
    assert top[0].shape == (5, 2, 3) and top[1].shape == (5, 4)   # Caffe's first reshape
    layer.forward(bottom, top)
    keep = [1, 2, 4]
    assert top[0].shape == (3, 2, 3) and top[1].shape == (3, 4)
    np.testing.assert_array_equal(top[0].data, a[keep])
    np.testing.assert_array_equal(top[1].data, b[keep])
    dy0, dy1 = rng.standard_normal((3, 2, 3)), rng.standard_normal((3, 4))
    top[0].diff[...], top[1].diff[...] = dy0, dy1
    for bl in bottom[:2]:
        bl.diff[...] = np.nan
    layer.backward(top, [True, True, False], bottom)
    e0, e1 = np.zeros_like(a), np.zeros_like(b)
    e0[keep], e1[keep] = dy0, dy1
    np.testing.assert_array_equal(bottom[0].diff, e0)
    np.testing.assert_array_equal(bottom[1].diff, e1)


def test_filter_nothing_selected(rng):
    layer, bottom, top = setup(FILTER, [rng.standard_normal((3, 2)), np.zeros((3, 1))])
    layer.forward(bottom, top)
    assert top[0].shape == (0, 2)
    layer.backward(top, [True, False], bottom)
    assert np.all(bottom[0].diff == 0)


def test_filter_gradient(rng):
    layer = make_layer(FILTER)
    bottom = [make_blob(rng.standard_normal((4, 3))), make_blob(rng.standard_normal((4, 2, 2))),
              make_blob([1, 0, 3, 1])]
    top = [Blob(dtype=np.float64), Blob(dtype=np.float64)]
    check_gradient(layer, bottom, top)
    assert not layer.allow_force_backward(2) and layer.allow_force_backward(1)


@pytest.mark.parametrize("shapes,n_top,match", [
    ([(4, 2), (4, 2)], 1, "selector blob dimensions must be singletons"),
    ([(4, 2), (3, 1)], 1, "each bottom should have the same 0th dimension as the selector"),
    ([(4, 2), (4, 1)], 2, r"'filter' \(Filter\): needs one top per filtered bottom"),
])
def test_filter_errors(shapes, n_top, match):
    with pytest.raises(ValueError, match=match):
        setup(FILTER, [np.ones(s) for s in shapes], n_top=n_top)


def test_filter_refuses_backprop_to_selector():
    layer, bottom, top = setup(FILTER, [np.ones((2, 2)), np.ones((2,))])
    layer.forward(bottom, top)
    with pytest.raises(ValueError, match="cannot backpropagate to filter index inputs"):
        layer.backward(top, [True, True], bottom)
    assert layer.backward_reads().bottom == () and layer.internals == {}


# -------------------------------------------------------------------- GPU
@pytest.mark.gpu
def test_gpu_matches_cpu(cp, rng):
    x = rng.standard_normal((6, 3, 4)).astype(np.float32)
    idx = np.array([5, 0, 5, 2.5, 5, 1], dtype=np.float32)
    sel = np.array([1, 0, 0, 1, 1, 0], dtype=np.float32)
    dy = rng.standard_normal((6, 3, 4)).astype(np.float32)
    outs = []
    for xp in (np, cp):
        got = []
        for text, arrays, k in ((REINDEX, [x, idx], 6), (FILTER, [x, sel], 3)):
            layer, bottom, top = setup(text, arrays, xp=xp, dtype=np.float32)
            layer.forward(bottom, top)
            top[0].diff[...] = xp.asarray(dy[:k])
            layer.backward(top, [True, False], bottom)
            got += [to_numpy(top[0].data), to_numpy(bottom[0].diff)]
        outs.append(got)
    for g, c in zip(outs[1], outs[0]):
        np.testing.assert_allclose(g, c, rtol=1e-6, atol=1e-7)


# ------------------------------------------- Filter in a Net, and under a plan
NET = """
name: "filter_net"
layer { name: "data" type: "DummyData" top: "data" top: "noise" top: "target"
  dummy_data_param { shape { dim: 8 dim: 3 dim: 4 dim: 4 } shape { dim: 8 dim: 1 }
    shape { dim: 8 dim: 2 }
    data_filler { type: "gaussian" std: 1 } data_filler { type: "gaussian" std: 1 }
    data_filler { type: "constant" value: 0.5 } } }
layer { name: "sel" type: "Threshold" bottom: "noise" top: "sel" }
layer { name: "conv" type: "Convolution" bottom: "data" top: "conv"
  convolution_param { num_output: 2 kernel_size: 3 pad: 1 weight_filler { type: "xavier" } } }
layer { name: "filter" type: "Filter" bottom: "conv" bottom: "target" bottom: "sel"
  top: "fconv" top: "ftarget" }
layer { name: "ip" type: "InnerProduct" bottom: "fconv" top: "ip"
  inner_product_param { num_output: 2 weight_filler { type: "xavier" } } }
layer { name: "loss" type: "EuclideanLoss" bottom: "ip" bottom: "ftarget" top: "loss" }
"""


def make_solver():
    from minicaffe.proto import caffe_pb2, parse_text
    return sgd_solver(parse_text(NET, caffe_pb2.NetParameter), weight_decay=0.0, max_iter=10)


def test_filter_in_a_net_reshapes_the_layers_after_it():
    net = make_solver().net
    li = net.layer_names.index("filter")
    assert net.bottom_need_backward[li] == [True, False, False]
    assert net.blobs["fconv"].shape == (8, 2, 4, 4)      # the whole batch before a forward
    counts = set()
    for _ in range(6):
        net.forward_from_to()
        k = int((to_numpy(net.blobs["noise"].data) > 0).sum())
        counts.add(k)
        assert net.blobs["fconv"].shape == (k, 2, 4, 4) and net.blobs["ip"].shape == (k, 2)
        net.clear_param_diffs()
        net.backward_from_to()
    assert len(counts) > 1                               # the shape did change


def test_memory_planner_bounds_filter_by_the_whole_batch():
    """install reshapes the net, which shapes Filter's tops for the whole batch: the plan's
    regions bound every selection, and `none` and `naive` train as the plain run does."""
    base = train_steps(make_solver(), 5, None, None, "chunked")
    for strategy in ("none", "naive"):
        params, history, losses, ex = train_steps(make_solver(), 5, strategy, None, "chunked")
        assert ex.iterations == 5
        assert all(np.array_equal(a, b) for a, b in zip(params, base[0])), strategy
        assert losses == base[2], strategy
