"""Parameter: a zero-initialized learnable blob as the top, its gradient (the top's diff,
overwritten as Caffe's shared diff is), loading from a .caffemodel and from the prototxt's
blobs, errors, declarations; trained in a net plainly and under the memory planner."""
import numpy as np
import pytest

from minicaffe.backend import to_numpy
from minicaffe.blob import Blob
from minicaffe.testing import check_gradient, make_layer, sgd_solver, train_steps

TEXT = 'name: "w" type: "Parameter" parameter_param { shape { dim: 2 dim: 3 } }'


def setup(text=TEXT, dtype=np.float64, xp=np):
    layer = make_layer(text, xp=xp, dtype=dtype)
    top = [Blob(xp=xp, dtype=dtype, name="w")]
    layer.setup([], top)
    return layer, top


def test_zero_blob_of_the_given_shape():
    layer, top = setup()
    assert len(layer.blobs) == 1 and layer.blobs[0].shape == (2, 3) and top[0].shape == (2, 3)
    layer.forward([], top)
    np.testing.assert_array_equal(top[0].data, np.zeros((2, 3)))
    layer.blobs[0].data[...] = np.arange(6).reshape(2, 3)
    layer.forward([], top)
    np.testing.assert_array_equal(top[0].data, np.arange(6).reshape(2, 3))


def test_gradient_is_the_top_diff_overwritten(rng):
    layer, top = setup()
    layer.blobs[0].data[...] = rng.standard_normal((2, 3))
    check_gradient(layer, [], top)
    layer.forward([], top)
    for value in (1.0, 2.0):              # Caffe's diff is shared: the last backward's stays
        top[0].diff[...] = value
        layer.backward(top, [], [])
    np.testing.assert_array_equal(layer.blobs[0].diff, np.full((2, 3), 2.0))


def test_blobs_from_the_prototxt():
    text = 'name: "w" type: "Parameter" parameter_param { shape { dim: 2 dim: 3 } } ' \
           'blobs { shape { dim: 2 dim: 3 } data: [1, 2, 3, 4, 5, 6] }'
    layer, top = setup(text)
    layer.forward([], top)
    np.testing.assert_array_equal(top[0].data, np.arange(1, 7).reshape(2, 3))


@pytest.mark.parametrize("text,match", [
    ('name: "w" type: "Parameter" parameter_param { shape { dim: 2 dim: 3 } } '
     'blobs { shape { dim: 5 } data: [1, 2, 3, 4, 5] }', r"'w' \(Parameter\): the parameter "
                                                         "blob of shape \\(5,\\) does not have"),
])
def test_errors(text, match):
    with pytest.raises(ValueError, match=match):
        setup(text)


def test_blob_counts():
    layer = make_layer(TEXT)
    with pytest.raises(ValueError, match="exactly 0 bottom"):
        layer.setup([Blob(dtype=np.float64)], [Blob(dtype=np.float64)])


def test_declarations():
    layer, top = setup()
    br = layer.backward_reads()
    assert br.bottom == () and br.top == () and br.internals == ()
    assert layer.internals == {}
    assert top[0].data_storage is not layer.blobs[0].data_storage


NET = """
name: "param_net"
layer { name: "data" type: "DummyData" top: "x" top: "target"
  dummy_data_param { shape { dim: 4 dim: 3 } shape { dim: 4 dim: 3 }
    data_filler { type: "gaussian" std: 1 } data_filler { type: "constant" value: 0.5 } } }
layer { name: "w" type: "Parameter" top: "w" parameter_param { shape { dim: 4 dim: 3 } } }
layer { name: "sum" type: "Eltwise" bottom: "x" bottom: "w" top: "sum" }
layer { name: "loss" type: "EuclideanLoss" bottom: "sum" bottom: "target" top: "loss" }
"""


def make_solver():
    from minicaffe.proto import caffe_pb2, parse_text
    return sgd_solver(parse_text(NET, caffe_pb2.NetParameter), weight_decay=0.0, max_iter=10)


def test_net_gradient_and_caffemodel_round_trip(tmp_path):
    solver = make_solver()
    net = solver.net
    net.forward_from_to()
    net.clear_param_diffs()
    net.backward_from_to()
    w = net.layers[net.layer_names.index("w")].blobs[0]
    assert w in net.learnable_params
    # EuclideanLoss: d/dw of sum((x + w - t)^2) / (2N) = (x + w - t) / N, w = 0
    x, t = to_numpy(net.blobs["x"].data), to_numpy(net.blobs["target"].data)
    np.testing.assert_allclose(to_numpy(w.diff), (x - t) / 4, rtol=1e-6)
    w.data[...] = np.arange(12, dtype=np.float32).reshape(4, 3)
    net.save(str(tmp_path / "w.caffemodel"))
    other = make_solver().net
    other.copy_from(str(tmp_path / "w.caffemodel"))
    other.forward_from_to()
    np.testing.assert_array_equal(to_numpy(other.blobs["w"].data),
                                  np.arange(12).reshape(4, 3))


def test_memory_planner_trains_it_bit_identically():
    base = train_steps(make_solver(), 5, None, None, "chunked")
    assert np.abs(base[0][0]).sum() > 0                  # w moved away from 0
    for strategy in ("none", "naive"):
        params, history, losses, ex = train_steps(make_solver(), 5, strategy, None, "chunked")
        assert all(np.array_equal(a, b) for a, b in zip(params, base[0])), strategy
        assert all(np.array_equal(a, b) for a, b in zip(history, base[1])), strategy
        assert losses == base[2], strategy


@pytest.mark.gpu
def test_gpu_matches_cpu(cp):
    outs = []
    for xp in (np, cp):
        layer, top = setup(dtype=np.float32, xp=xp)
        layer.blobs[0].data[...] = xp.arange(6, dtype=np.float32).reshape(2, 3)
        layer.forward([], top)
        top[0].diff[...] = 3
        layer.backward(top, [], [])
        outs.append((to_numpy(top[0].data), to_numpy(layer.blobs[0].diff)))
    for g, c in zip(outs[1], outs[0]):
        np.testing.assert_array_equal(g, c)
