"""Layers against BVLC Caffe's own unit tests, the files not yet ported elsewhere (part 3;
see test_caffe_spec_layers2.py for the conventions: seeded NumPy fills in place of Caffe's,
float64 gradient checks in place of its GradientChecker).

* ``test_scale_layer.cpp``: TestForwardEltwise, TestForwardBroadcastBegin,
  TestForwardBroadcastMiddle, TestForwardBroadcastMiddleWithParam,
  TestForwardBroadcastMiddleWithParamAndBias, TestForwardBroadcastEnd, TestForwardScale,
  TestForwardScaleAxis2, TestGradientEltwise, TestGradientEltwiseWithParam,
  TestGradientBroadcastBegin, TestGradientBroadcastMiddle,
  TestGradientBroadcastMiddleWithParam, TestGradientBroadcastEnd, TestGradientScale,
  TestGradientScaleAndBias, TestGradientScaleAxis2 (the in-place cases and
  TestForwardEltwiseWithParam are in test_caffe_spec_shape.py).
* ``test_bias_layer.cpp``: the same cases for Bias (TestForwardBias, TestForwardBiasAxis2,
  TestGradientBias, TestGradientBiasAxis2 for the scalar ones; no ...WithParamAndBias).
* ``test_lstm_layer.cpp``: TestSetUp, TestForward, TestLSTMUnitSetUp, TestLSTMUnitGradient,
  TestLSTMUnitGradientNonZeroCont, TestGradient, TestGradientNonZeroCont,
  TestGradientNonZeroContBufferSize2, TestGradientNonZeroContBufferSize2WithStaticInput.
* ``test_rnn_layer.cpp``: TestSetUp, TestForward, TestGradient, TestGradientNonZeroCont,
  TestGradientNonZeroContBufferSize2, TestGradientNonZeroContBufferSize2WithStaticInput.
* ``test_hdf5_output_layer.cpp``: TestForward (on the data of Caffe's
  ``src/caffe/test/test_data/sample_data.h5``, as its ``generate_sample_data.py`` makes it).
* ``test_image_data_layer.cpp``: TestRead, TestResize, TestReshape, TestShuffle, TestSpace
  (on PNGs of the sizes of Caffe's examples/images/cat.jpg, fish-bike.jpg and "cat gray.jpg":
  360 x 480, 323 x 481, 360 x 480 grey).
"""
import gc

import numpy as np
import pytest

import minicaffe.layers  # noqa: F401  (registers the layer types)
from minicaffe.blob import Blob
from minicaffe.proto import caffe_pb2
from minicaffe.rng import set_random_seed
from minicaffe.testing import check_gradient, make_layer
from test_caffe_spec_layers2 import blobs, forward, setup, tops


# ---------------------------------------------------------------------- Scale and Bias
def operands(seed=1701):
    """ScaleLayerTest's and BiasLayerTest's blobs, all uniform in [1, 10]: the bottom
    (2, 3, 4, 5), an operand of its shape, the broadcast operands (2, 3), (3, 4), (4, 5) and
    a scalar (shape ())."""
    rng = np.random.default_rng(seed)
    return {name: rng.uniform(1, 10, shape) for name, shape in [
        ("bottom", (2, 3, 4, 5)), ("eltwise", (2, 3, 4, 5)), ("begin", (2, 3)),
        ("middle", (3, 4)), ("end", (4, 5)), ("scalar", ())]}


# the second bottom, the axis, and how the operand lines up with (N, C, H, W)
BROADCAST = {
    "Eltwise": ("eltwise", 0, lambda o: o),
    "BroadcastBegin": ("begin", 0, lambda o: o[:, :, None, None]),
    "BroadcastMiddle": ("middle", 1, lambda o: o[None, :, :, None]),
    "BroadcastEnd": ("end", 2, lambda o: o[None, None, :, :]),
    "Scale": ("scalar", 1, lambda o: o),
    "ScaleAxis2": ("scalar", 2, lambda o: o),
}
COMBINE = {"Scale": np.multiply, "Bias": np.add}


def operand_layer(kind, body):
    return f'name: "op" type: "{kind}" {kind.lower()}_param {{ {body} }}'


@pytest.mark.parametrize("case", sorted(BROADCAST))
@pytest.mark.parametrize("kind", ["Scale", "Bias"])
def test_operand_as_second_bottom_forward(kind, case):
    """test_scale_layer.cpp TestForwardEltwise, TestForwardBroadcastBegin,
    TestForwardBroadcastMiddle, TestForwardBroadcastEnd, TestForwardScale,
    TestForwardScaleAxis2, and test_bias_layer.cpp's same cases (TestForwardBias,
    TestForwardBiasAxis2 for the scalar): bottom 1 starts at ``axis`` of bottom 0 (a scalar
    at any axis) and is broadcast over the other axes; the top has bottom 0's shape."""
    ops = operands()
    name, axis, line_up = BROADCAST[case]
    _, _, (top,) = forward(operand_layer(kind, f"axis: {axis}"), ops["bottom"], ops[name])
    assert top.shape == (2, 3, 4, 5)
    np.testing.assert_allclose(top.data, COMBINE[kind](ops["bottom"], line_up(ops[name])),
                               rtol=1e-12)


@pytest.mark.parametrize("kind, bias_term", [("Scale", False), ("Scale", True), ("Bias", False)],
                         ids=["Scale-TestForwardBroadcastMiddleWithParam",
                              "Scale-TestForwardBroadcastMiddleWithParamAndBias",
                              "Bias-TestForwardBroadcastMiddleWithParam"])
def test_operand_as_param_forward(kind, bias_term):
    """test_scale_layer.cpp TestForwardBroadcastMiddleWithParam and
    TestForwardBroadcastMiddleWithParamAndBias, test_bias_layer.cpp
    TestForwardBroadcastMiddleWithParam: ``axis: 1 num_axes: 2`` learns a (3, 4) operand
    (Gaussian filler), and Scale's ``bias_term`` a (3, 4) bias after it."""
    body = 'axis: 1 num_axes: 2 filler { type: "gaussian" }'
    if bias_term:
        body += ' bias_term: true bias_filler { type: "gaussian" }'
    ops = operands(1)
    layer, _, (top,) = forward(operand_layer(kind, body), ops["bottom"])
    assert [b.shape for b in layer.blobs] == [(3, 4)] * (1 + bias_term)
    line_up = BROADCAST["BroadcastMiddle"][2]
    want = COMBINE[kind](ops["bottom"], line_up(layer.blobs[0].data))
    if bias_term:
        want = want + line_up(layer.blobs[1].data)
    np.testing.assert_allclose(top.data, want, rtol=1e-12)


@pytest.mark.parametrize("case", sorted(BROADCAST))
@pytest.mark.parametrize("kind", ["Scale", "Bias"])
def test_operand_as_second_bottom_gradient(kind, case):
    """test_scale_layer.cpp TestGradientEltwise, TestGradientBroadcastBegin,
    TestGradientBroadcastMiddle, TestGradientBroadcastEnd, TestGradientScale,
    TestGradientScaleAxis2, and test_bias_layer.cpp's same cases: both bottoms."""
    ops = operands(2)
    name, axis, _ = BROADCAST[case]
    check_gradient(make_layer(operand_layer(kind, f"axis: {axis}")),
                   blobs(ops["bottom"], ops[name]), tops(1))


@pytest.mark.parametrize("body, second", [
    ('axis: 0 num_axes: -1 filler { type: "gaussian" }', None),
    ('axis: 1 num_axes: 2 filler { type: "gaussian" }', "middle"),
], ids=["TestGradientEltwiseWithParam", "TestGradientBroadcastMiddleWithParam"])
@pytest.mark.parametrize("kind", ["Scale", "Bias"])
def test_operand_param_gradient(kind, body, second):
    """test_scale_layer.cpp and test_bias_layer.cpp TestGradientEltwiseWithParam (a learned
    operand of the bottom's whole shape: the bottom and the param) and
    TestGradientBroadcastMiddleWithParam (which also gives the (3, 4) second bottom: that
    bottom is the operand and the layer has no param)."""
    ops = operands(3)
    arrays = [ops["bottom"]] + ([ops[second]] if second else [])
    layer = make_layer(operand_layer(kind, body))
    check_gradient(layer, blobs(*arrays), tops(1))
    assert len(layer.blobs) == (0 if second else 1)


def test_scale_and_bias_gradient():
    """test_scale_layer.cpp TestGradientScaleAndBias: a scalar scale as bottom 1 and
    ``bias_term`` (a learned scalar bias, Gaussian filler): both bottoms and the bias."""
    ops = operands(4)
    layer = make_layer(operand_layer("Scale", 'bias_term: true bias_filler { type: "gaussian" }'))
    check_gradient(layer, blobs(ops["bottom"], ops["scalar"]), tops(1))
    assert [b.shape for b in layer.blobs] == [()]


@pytest.mark.parametrize("kind", ["Scale", "Bias"])
def test_operand_shape_check(kind):
    """scale_layer.cpp / bias_layer.cpp Reshape: bottom 1's dimensions must match bottom 0's
    from ``axis`` on."""
    with pytest.raises(ValueError, match="'op'"):
        setup(operand_layer(kind, "axis: 1"), np.zeros((2, 3, 4, 5)), np.zeros((4, 4)))


# ---------------------------------------------------------------------- LSTM and RNN
H = 7   # LSTMLayerTest's and RNNLayerTest's num_output_


def recurrent(kind):
    """The fixtures' layer: num_output 7, Gaussian weights (std 0.2) and biases (std 0.1),
    phase TEST."""
    return (f'name: "rec" type: "{kind}" recurrent_param {{ num_output: {H} '
            'weight_filler { type: "gaussian" std: 0.2 } '
            'bias_filler { type: "gaussian" std: 0.1 } }')


def recurrent_bottoms(rng, t, n, cont=None, static=False):
    """ReshapeBlobs(t, n): x (t, n, 3, 2) uniform in [-1, 1], cont (t, n) (zeros as Caffe's
    fresh blob unless given), and x_static (n, 2, 3, 4) uniform in [-1, 1]."""
    x = rng.uniform(-1, 1, (t, n, 3, 2))
    c = np.zeros((t, n)) if cont is None else np.asarray(cont, float).reshape(t, n)
    return [x, c] + ([rng.uniform(-1, 1, (n, 2, 3, 4))] if static else [])


def recurrent_layer(kind, seed=1701):
    set_random_seed(seed)     # Caffe::set_random_seed before SetUp: the same weights
    return make_layer(recurrent(kind), phase=caffe_pb2.TEST)


@pytest.mark.parametrize("kind", ["LSTM", "RNN"])
def test_recurrent_setup(kind):
    """test_lstm_layer.cpp and test_rnn_layer.cpp TestSetUp: the top is (T, N, num_output)
    for x (1, 3, 3, 2)."""
    layer = recurrent_layer(kind)
    top = tops(1)
    layer.setup(blobs(*recurrent_bottoms(np.random.default_rng(0), 1, 3)), top)
    assert top[0].shape == (1, 3, H)


@pytest.mark.parametrize("kind", ["LSTM", "RNN"])
def test_recurrent_forward_by_steps(kind):
    """test_lstm_layer.cpp and test_rnn_layer.cpp TestForward: a sequence of 3 steps of 3
    streams (Gaussian x, cont 0 then 1) in one forward gives what three one-step forwards of
    a layer with the same weights give, each carrying the state to the next (within 1e-5);
    with cont 0 at every step, only the first step agrees."""
    rng = np.random.default_rng(1)
    x = rng.standard_normal((3, 3, 3, 2))
    cont = np.array([[0.0] * 3, [1.0] * 3, [1.0] * 3])
    layer = recurrent_layer(kind)
    bottom, top = blobs(x, cont), tops(1)
    layer.setup(bottom, top)
    layer.forward(bottom, top)
    whole = top[0].data.copy()
    for cont_t, agrees_after_0 in (([0, 1, 1], True), ([0, 0, 0], False)):
        layer = recurrent_layer(kind)
        bottom, top = blobs(x[:1], np.zeros((1, 3))), tops(1)
        layer.setup(bottom, top)
        for t in range(3):
            bottom[0].data[...] = x[t:t + 1]
            bottom[1].data[...] = cont_t[t]
            layer.forward(bottom, top)
            if t == 0 or agrees_after_0:
                np.testing.assert_allclose(top[0].data, whole[t:t + 1], rtol=0, atol=1e-5)
            else:
                assert np.all(top[0].data != whole[t:t + 1])


# (T, N, cont, static) of each gradient test; T = 1, N = 3 unless ReshapeBlobs(2, 2).  The
# fixture's cont blob is never filled for TestGradient (zeros), and ``cont[i] = i > 2`` is all
# zeros at T = 1, N = 3; at T = 2, N = 2 it is 0, 0, 0, 1.
GRADIENT_CASES = {
    "TestGradient": (1, 3, None, False),
    "TestGradientNonZeroCont": (1, 3, [0, 0, 0], False),
    "TestGradientNonZeroContBufferSize2": (2, 2, [0, 0, 0, 1], False),
    "TestGradientNonZeroContBufferSize2WithStaticInput": (2, 2, [0, 0, 0, 1], True),
}


@pytest.mark.parametrize("case", sorted(GRADIENT_CASES))
@pytest.mark.parametrize("kind", ["LSTM", "RNN"])
def test_recurrent_gradient(kind, case):
    """test_lstm_layer.cpp and test_rnn_layer.cpp TestGradient, TestGradientNonZeroCont,
    TestGradientNonZeroContBufferSize2, TestGradientNonZeroContBufferSize2WithStaticInput: x
    (and x_static) and every param (Caffe's BufferSize2 cases refill x uniform in [0, 1])."""
    t, n, cont, static = GRADIENT_CASES[case]
    rng = np.random.default_rng(2)
    arrays = recurrent_bottoms(rng, t, n, cont, static)
    if t == 2:
        arrays[0] = rng.uniform(0, 1, arrays[0].shape)
    check_gradient(recurrent_layer(kind), blobs(*arrays), tops(1),
                   check_bottom=[0, 2] if static else [0])


def unit_bottoms(rng, cont):
    """LSTMLayerTest's unit blobs: c_prev (1, 3, 7) and gates (1, 3, 28) uniform in [-1, 1],
    cont (1, 3)."""
    return [rng.uniform(-1, 1, (1, 3, H)), rng.uniform(-1, 1, (1, 3, 4 * H)),
            np.asarray(cont, float).reshape(1, 3)]


def test_lstm_unit_setup():
    """test_lstm_layer.cpp TestLSTMUnitSetUp: both tops (c_t, h_t) have c_prev's shape."""
    _, _, top = setup('name: "unit" type: "LSTMUnit"',
                      *unit_bottoms(np.random.default_rng(0), [0, 0, 0]), n_top=2)
    assert [t.shape for t in top] == [(1, 3, H)] * 2


@pytest.mark.parametrize("cont", [[0, 0, 0], [1, 0, 1]],
                         ids=["TestLSTMUnitGradient", "TestLSTMUnitGradientNonZeroCont"])
def test_lstm_unit_gradient(cont):
    """test_lstm_layer.cpp TestLSTMUnitGradient and TestLSTMUnitGradientNonZeroCont: bottoms
    0 (c_prev) and 1 (the gates).  Caffe's tests write cont into the LSTM fixture's cont
    blob, not the unit's, which stays zero in both; here the NonZeroCont case gets the
    1, 0, 1 it means to test."""
    layer = make_layer('name: "unit" type: "LSTMUnit"')
    check_gradient(layer, blobs(*unit_bottoms(np.random.default_rng(3), cont)), tops(2),
                   check_bottom=[0, 1])


# ---------------------------------------------------------------------------- HDF5Output
def sample_data():
    """sample_data.h5 as Caffe's generate_sample_data.py writes it: data 0, 1, 2, ... as
    (10, 8, 6, 5) float32, label 1..10 as (10, 1) float32."""
    data = np.arange(10 * 8 * 6 * 5, dtype=np.float32).reshape(10, 8, 6, 5)
    label = (1 + np.arange(10, dtype=np.float32))[:, None]
    return data, label


def test_hdf5_output_forward(tmp_path):
    """test_hdf5_output_layer.cpp TestForward: data and label written to ``file_name``
    (reported back by the layer) and read again equal, by their (num, channels, height,
    width): the (10, 1) label comes back (10, 1, 1, 1)."""
    h5py = pytest.importorskip("h5py")
    data, label = sample_data()
    out = str(tmp_path / "out.h5")
    layer = make_layer(f'name: "out" type: "HDF5Output" hdf5_output_param {{ file_name: "{out}" }}')
    bottom = blobs(data, label)
    layer.setup(bottom, [])
    assert layer.file_name == out
    layer.forward(bottom, [])
    layer.close()           # the test's block that destroys the layer, closing the file
    with h5py.File(out, "r") as f:
        np.testing.assert_array_equal(f["data"][...], data)
        assert f["label"].shape == (10, 1, 1, 1)
        np.testing.assert_array_equal(f["label"][...].reshape(10, 1), label)


# ----------------------------------------------------------------------------- ImageData
@pytest.fixture
def caffe_images(tmp_path):
    """Caffe's example images by their sizes: cat.jpg (360 x 480 colour), fish-bike.jpg
    (323 x 481 colour), "cat gray.jpg" (360 x 480 grey; a space in its name), as PNGs; and
    the fixture's three list files: cat.jpg five times with labels 0..4, cat then
    fish-bike (0, 1), cat then "cat gray" (0, 1)."""
    Image = pytest.importorskip("PIL.Image")
    rng = np.random.default_rng(0)
    paths = {}
    for name, shape, mode in (("cat.png", (360, 480, 3), "RGB"),
                              ("fish-bike.png", (323, 481, 3), "RGB"),
                              ("cat gray.png", (360, 480), "L")):
        paths[name] = tmp_path / name
        Image.fromarray(rng.integers(0, 256, shape, dtype=np.uint8), mode).save(paths[name])
    lists = {}
    for key, entries in (("read", [("cat.png", i) for i in range(5)]),
                         ("reshape", [("cat.png", 0), ("fish-bike.png", 1)]),
                         ("space", [("cat.png", 0), ("cat gray.png", 1)])):
        lists[key] = tmp_path / f"{key}.txt"
        lists[key].write_text("".join(f"{paths[n]} {label}\n" for n, label in entries))
    yield lists
    gc.collect()


def image_data(source, batch, extra=""):
    """An ImageData layer set up on ``source`` (seeded as the fixture: 1701), its two tops;
    no prefetch thread (``prefetch: 0`` loads in forward, with identical results)."""
    set_random_seed(1701)
    layer = make_layer(f'name: "data" type: "ImageData" image_data_param {{ source: "{source}" '
                       f'batch_size: {batch} {extra} }} data_param {{ prefetch: 0 }}',
                       dtype=np.float32)
    top = [Blob(dtype=np.float32, name="data"), Blob(dtype=np.float32, name="label")]
    layer.setup([], top)
    return layer, top


@pytest.mark.parametrize("extra, hw", [("shuffle: false", (360, 480)),
                                       ("new_height: 256 new_width: 256 shuffle: false",
                                        (256, 256))], ids=["TestRead", "TestResize"])
def test_image_data_read(caffe_images, extra, hw):
    """test_image_data_layer.cpp TestRead and TestResize: batches of 5 (5, 3, 360, 480), or
    resized (5, 3, 256, 256), labels (5,) 0..4 in order, twice through the list."""
    layer, (data, label) = image_data(caffe_images["read"], 5, extra)
    try:
        assert data.shape == (5, 3) + hw and label.shape == (5,)
        for _ in range(2):
            layer.forward([], [data, label])
            np.testing.assert_array_equal(label.data, np.arange(5))
    finally:
        layer.close()


@pytest.mark.parametrize("key, shapes", [
    ("reshape", [(1, 3, 360, 480), (1, 3, 323, 481)]),
    ("space", [(1, 3, 360, 480), (1, 3, 360, 480)]),
], ids=["TestReshape", "TestSpace"])
def test_image_data_one_at_a_time(caffe_images, key, shapes):
    """test_image_data_layer.cpp TestReshape (each batch of 1 shaped after its image: cat
    then fish-bike) and TestSpace (a path with a space; the grey image read in colour is 3
    channels): labels 0 then 1."""
    layer, (data, label) = image_data(caffe_images[key], 1, "shuffle: false")
    try:
        assert label.shape == (1,)
        for want_shape, want_label in zip(shapes, (0, 1)):
            layer.forward([], [data, label])
            assert data.shape == want_shape
            assert label.data[0] == want_label
    finally:
        layer.close()


def test_image_data_shuffle(caffe_images):
    """test_image_data_layer.cpp TestShuffle: with ``shuffle: true`` each pass through the 5
    entries gives every label once, not all in order."""
    layer, (data, label) = image_data(caffe_images["read"], 5, "shuffle: true")
    try:
        assert data.shape == (5, 3, 360, 480)
        for _ in range(2):
            layer.forward([], [data, label])
            assert sorted(label.data.tolist()) == [0, 1, 2, 3, 4]
            assert np.sum(label.data == np.arange(5)) < 5
    finally:
        layer.close()
