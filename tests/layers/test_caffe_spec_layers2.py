"""Layers against BVLC Caffe's own unit tests, the files not yet ported elsewhere (part 1;
parts 2 to 5 are test_caffe_spec_layers3.py to test_caffe_spec_layers5.py, and
test_caffe_spec_neuron2.py; they import the helpers defined here).

Each test's docstring names the Caffe file and TYPED_TEST it mirrors.  Caffe fills its bottoms
at random; here a seeded NumPy generator fills them the same way (Gaussian std 1, uniform
[0, 1], labels ``rand() % K``) and the expectation is computed as Caffe's test computes it.
Caffe's GradientChecker (a finite step of 1e-2 in float or double, a threshold of 1e-2 to 1e-3)
becomes minicaffe's float64 central-difference check (step 1e-6, relative 1e-5) unless a test
says why it needs Caffe's looser bound.  ``CheckGradientExhaustive(..., i)`` checks bottom i and
every param blob; ``-2`` checks only the params.

* ``test_accuracy_layer.cpp``: TestSetup, TestSetupTopK, TestSetupOutputPerClass,
  TestForward, TestForwardWithSpatialAxes, TestForwardIgnoreLabel, TestForwardTopK,
  TestForwardPerClass, TestForwardPerClassWithIgnoreLabel.
* ``test_argmax_layer.cpp``: TestSetup, TestSetupMaxVal, TestSetupAxis,
  TestSetupAxisNegativeIndexing, TestSetupAxisMaxVal, TestCPU, TestCPUMaxVal, TestCPUTopK,
  TestCPUMaxValTopK, TestCPUAxis, TestCPUAxisTopK, TestCPUAxisMaxValTopK.
* ``test_batch_norm_layer.cpp``: TestForward, TestForwardInplace, TestGradient.
* ``test_batch_reindex_layer.cpp``: TestForward, TestGradient.
* ``test_concat_layer.cpp``: TestSetupNum, TestSetupChannels,
  TestSetupChannelsNegativeIndexing, TestForwardTrivial, TestForwardNum,
  TestForwardChannels, TestGradientTrivial, TestGradientNum, TestGradientChannels,
  TestGradientChannelsBottomOneOnly.
* ``test_contrastive_loss_layer.cpp``: TestForward, TestGradient, TestForwardLegacy,
  TestGradientLegacy.
* ``test_crop_layer.cpp``: TestSetupShapeAll, TestSetupShapeDefault,
  TestSetupShapeNegativeIndexing, TestDimensionsCheck, TestCropAll, TestCropAllOffset,
  TestCropHW, TestCrop5D, TestCropAllGradient, TestCropHWGradient, TestCrop5DGradient.
* ``test_eltwise_layer.cpp``: TestSetUp, TestProd, TestSum, TestSumCoeff,
  TestStableProdGradient, TestUnstableProdGradient, TestSumGradient, TestSumCoeffGradient,
  TestMax, TestMaxGradient.
* ``test_euclidean_loss_layer.cpp``: TestForward, TestGradient.
* ``test_filter_layer.cpp``: TestReshape, TestForward, TestGradient.
* ``test_flatten_layer.cpp``: TestSetup, TestSetupWithAxis, TestSetupWithEndAxis,
  TestSetupWithStartAndEndAxis, TestForward, TestGradient.
* ``test_hinge_loss_layer.cpp``: TestGradientL1, TestGradientL2.

Besides what the tests assert, the CHECKs of the layers' sources (``src/caffe/layers``) that
a user can trip are checked to fail with a message that names the layer.
"""
import numpy as np
import pytest

import minicaffe.layers  # noqa: F401  (registers the layer types)
from minicaffe.blob import Blob
from minicaffe.testing import check_gradient, make_blob, make_layer


def blobs(*arrays, names=None):
    names = names or [f"in{i}" for i in range(len(arrays))]
    return [make_blob(a, name=n) for a, n in zip(arrays, names)]


def tops(n):
    return [Blob(dtype=np.float64, name=f"out{i}") for i in range(n)]


def setup(text, *arrays, n_top=1, phase=None):
    """(layer, bottom, top) after SetUp."""
    layer = make_layer(text, phase=phase)
    bottom, top = blobs(*arrays), tops(n_top)
    layer.setup(bottom, top)
    return layer, bottom, top


def forward(text, *arrays, n_top=1, phase=None):
    layer, bottom, top = setup(text, *arrays, n_top=n_top, phase=phase)
    layer.forward(bottom, top)
    return layer, bottom, top


def gradient(text, *arrays, n_top=1, check_bottom=None, **tol):
    """Caffe's CheckGradientExhaustive: the chosen bottoms and every param blob."""
    layer = make_layer(text)
    check_gradient(layer, blobs(*arrays), tops(n_top), check_bottom=check_bottom, **tol)
    return layer


def labels(rng, shape, k):
    """Caffe's ``rand() % k`` labels, as floats."""
    return rng.integers(0, k, size=shape).astype(np.float64)


def gaussian(shape, seed=0, std=1.0):
    """Caffe's GaussianFiller (mean 0, ``std``), seeded."""
    return std * np.random.default_rng(seed).standard_normal(shape)


def f32(value):
    """A float field of caffe.proto as the layer sees it: float32, widened."""
    return float(np.float32(value))


# ----------------------------------------------------------------------------- Accuracy
def accuracy_fixture(seed=0):
    """AccuracyLayerTest: scores (100, 10) Gaussian, labels (100,) in [0, 10)."""
    rng = np.random.default_rng(seed)
    return rng.standard_normal((100, 10)), labels(rng, (100,), 10)


def argmax_first(scores):
    """The test's loop: the first class of the largest score (strictly greater wins)."""
    return np.argmax(scores, axis=1)


@pytest.mark.parametrize("body, n_top, shapes", [
    ("", 1, [()]),                                # TestSetup
    ("accuracy_param { top_k: 5 }", 1, [()]),     # TestSetupTopK
    ("", 2, [(), (10,)]),                         # TestSetupOutputPerClass
])
def test_accuracy_setup(body, n_top, shapes):
    """test_accuracy_layer.cpp TestSetup, TestSetupTopK, TestSetupOutputPerClass: a scalar
    accuracy (Caffe's 0-axis blob, num() 1) and one per class (10 classes)."""
    x, lab = accuracy_fixture()
    _, _, top = setup(f'name: "acc" type: "Accuracy" {body}', x, lab, n_top=n_top)
    assert [t.shape for t in top] == shapes


def test_accuracy_forward_repeated():
    """test_accuracy_layer.cpp TestForward: three forwards, each the fraction of items whose
    first-largest score is the label's."""
    x, lab = accuracy_fixture(1)
    layer, bottom, top = setup('name: "acc" type: "Accuracy"', x, lab)
    want = np.mean(argmax_first(x) == lab)
    for _ in range(3):
        layer.forward(bottom, top)
        assert top[0].data == pytest.approx(want, abs=1e-4)


def test_accuracy_with_spatial_axes():
    """test_accuracy_layer.cpp TestForwardWithSpatialAxes: scores (2, 10, 4, 5), labels
    (2, 4, 5), ``axis: 1``: one prediction per (n, h, w)."""
    rng = np.random.default_rng(2)
    x, lab = rng.standard_normal((2, 10, 4, 5)), labels(rng, (2, 4, 5), 10)
    layer, bottom, top = setup('name: "acc" type: "Accuracy" accuracy_param { axis: 1 }', x, lab)
    want = np.sum(np.argmax(x, axis=1) == lab) / lab.size
    for _ in range(3):
        layer.forward(bottom, top)
        assert top[0].data == pytest.approx(want, abs=1e-4)


IGNORED = (2, 5, 32)   # the items AccuracyLayerTest sets to the ignore label -1


@pytest.mark.parametrize("n_top", [1, 2], ids=["TestForwardIgnoreLabel",
                                               "TestForwardPerClassWithIgnoreLabel"])
def test_accuracy_ignore_label(n_top):
    """test_accuracy_layer.cpp TestForwardIgnoreLabel and TestForwardPerClassWithIgnoreLabel:
    ``ignore_label: -1`` on items 2, 5 and 32 leaves 97 counted; per class, the hits over the
    items of that class (0 for a class absent)."""
    x, lab = accuracy_fixture(3)
    lab[list(IGNORED)] = -1
    layer, bottom, top = setup('name: "acc" type: "Accuracy" accuracy_param { ignore_label: -1 }',
                               x, lab, n_top=n_top)
    keep = lab != -1
    assert keep.sum() == 97
    hit = (argmax_first(x) == lab) & keep
    for _ in range(3):
        layer.forward(bottom, top)
        assert top[0].data == pytest.approx(hit.sum() / 97, abs=1e-4)
        if n_top == 2:
            for c in range(10):
                n_c = np.sum(lab == c)
                want = hit[lab == c].sum() / n_c if n_c else 0
                assert top[1].data[c] == pytest.approx(want, abs=1e-4)


def test_accuracy_top_k():
    """test_accuracy_layer.cpp TestForwardTopK: ``top_k: 3``; an item counts when fewer
    than 3 classes score strictly above the label's."""
    x, lab = accuracy_fixture(4)
    layer, bottom, top = setup('name: "acc" type: "Accuracy" accuracy_param { top_k: 3 }', x, lab)
    true_score = x[np.arange(100), lab.astype(int)]
    rank = np.sum(x > true_score[:, None], axis=1)
    for _ in range(3):
        layer.forward(bottom, top)
        assert top[0].data == pytest.approx(np.mean(rank < 3), abs=1e-4)


def test_accuracy_per_class():
    """test_accuracy_layer.cpp TestForwardPerClass: the second top holds each class's
    accuracy over the items labelled with it."""
    x, lab = accuracy_fixture(5)
    layer, bottom, top = setup('name: "acc" type: "Accuracy"', x, lab, n_top=2)
    hit = argmax_first(x) == lab
    for _ in range(3):
        layer.forward(bottom, top)
        assert top[0].data == pytest.approx(hit.mean(), abs=1e-4)
        want = [hit[lab == c].mean() if np.any(lab == c) else 0 for c in range(10)]
        np.testing.assert_allclose(top[1].data, want, atol=1e-4)


@pytest.mark.parametrize("body, x_shape, lab_shape, match", [
    ("accuracy_param { top_k: 11 }", (100, 10), (100,), r"top_k \(11\) must be less than"),
    ("", (100, 10), (99,), "number of labels must match number of predictions"),
    ("accuracy_param { axis: 2 }", (100, 10), (100,), "axis 2 out of range"),
])
def test_accuracy_setup_checks(body, x_shape, lab_shape, match):
    """accuracy_layer.cpp Reshape's CHECKs: top_k at most the classes, one label per
    prediction, a valid axis."""
    with pytest.raises(ValueError, match=rf"'acc'.*{match}"):
        setup(f'name: "acc" type: "Accuracy" {body}', np.zeros(x_shape), np.zeros(lab_shape))


# ------------------------------------------------------------------------------- ArgMax
TOP_K = 5   # ArgMaxLayerTest's top_k_


@pytest.fixture(scope="module")
def argmax_bottom():
    """ArgMaxLayerTest: (10, 10, 20, 20) Gaussian."""
    return np.random.default_rng(1701).standard_normal((10, 10, 20, 20))


def argmax(body, x):
    return forward(f'name: "argmax" type: "ArgMax" argmax_param {{ {body} }}', x)[2][0].data


@pytest.mark.parametrize("body, shape", [
    ("", (10, 1, 1, 1)),                                    # TestSetup
    ("out_max_val: true", (10, 2, 1, 1)),                   # TestSetupMaxVal
    ("axis: 0", (1, 10, 20, 20)),                           # TestSetupAxis
    ("axis: -2", (10, 10, 1, 20)),                          # TestSetupAxisNegativeIndexing
    ("axis: 2 out_max_val: true", (10, 10, 1, 20)),         # TestSetupAxisMaxVal
])
def test_argmax_setup(argmax_bottom, body, shape):
    """test_argmax_layer.cpp TestSetup, TestSetupMaxVal, TestSetupAxis,
    TestSetupAxisNegativeIndexing, TestSetupAxisMaxVal: without an axis (N, 1 or 2, top_k, 1);
    with one, the bottom's shape with that axis cut to top_k (default 1)."""
    _, _, (top,) = setup(f'name: "argmax" type: "ArgMax" argmax_param {{ {body} }}',
                         argmax_bottom)
    assert top.shape == shape


def count_above(values, picked):
    """How many entries of each row of ``values`` exceed ``picked`` (rows, k)."""
    return np.sum(values[:, None, :] > picked[:, :, None], axis=2)


@pytest.mark.parametrize("top_k, max_val", [(1, False), (1, True), (TOP_K, False),
                                            (TOP_K, True)],
                         ids=["TestCPU", "TestCPUMaxVal", "TestCPUTopK", "TestCPUMaxValTopK"])
def test_argmax_per_item(argmax_bottom, top_k, max_val):
    """test_argmax_layer.cpp TestCPU, TestCPUMaxVal, TestCPUTopK, TestCPUMaxValTopK: over the
    flattened item, the j-th index picked has exactly j entries above it; with
    ``out_max_val`` channel 1 holds the values at the indices of channel 0."""
    top = argmax(f"top_k: {top_k} out_max_val: {str(max_val).lower()}", argmax_bottom)
    flat = argmax_bottom.reshape(10, -1)
    idx = top[:, 0, :, 0]
    assert np.all((idx >= 0) & (idx < flat.shape[1]))
    picked = np.take_along_axis(flat, idx.astype(int), axis=1)
    if max_val:
        np.testing.assert_array_equal(top[:, 1, :, 0], picked)
    np.testing.assert_array_equal(count_above(flat, picked), np.tile(np.arange(top_k), (10, 1)))


@pytest.mark.parametrize("body, axis, top_k", [
    ("axis: 0", 0, 1),                                      # TestCPUAxis
    (f"axis: 2 top_k: {TOP_K}", 2, TOP_K),                   # TestCPUAxisTopK
    (f"axis: -1 top_k: {TOP_K} out_max_val: true", 3, TOP_K),  # TestCPUAxisMaxValTopK
])
def test_argmax_along_axis(argmax_bottom, body, axis, top_k):
    """test_argmax_layer.cpp TestCPUAxis, TestCPUAxisTopK, TestCPUAxisMaxValTopK: along the
    axis, the m-th pick has m entries above it (indices, or with ``out_max_val`` values)."""
    top = argmax(body, argmax_bottom)
    rows = np.moveaxis(argmax_bottom, axis, -1).reshape(-1, argmax_bottom.shape[axis])
    got = np.moveaxis(top, axis, -1).reshape(-1, top_k)
    if "out_max_val" in body:
        picked = got
    else:
        assert np.all((got >= 0) & (got < rows.shape[1]))
        picked = np.take_along_axis(rows, got.astype(int), axis=1)
    np.testing.assert_array_equal(count_above(rows, picked),
                                  np.tile(np.arange(top_k), (rows.shape[0], 1)))


@pytest.mark.parametrize("body, match", [
    ("top_k: 0", "top k must not be less than 1"),
    ("top_k: 4001", r"top_k \(4001\) must be less than or equal to the dimension of the "
                    "flattened bottom"),
    ("axis: 1 top_k: 11", r"top_k \(11\) must be less than or equal to the dimension of axis"),
    ("axis: 4", "axis 4 out of range"),
])
def test_argmax_setup_checks(body, match):
    """argmax_layer.cpp LayerSetUp's CHECKs: top_k >= 1 and at most what it ranks; a valid
    axis."""
    with pytest.raises(ValueError, match=rf"'argmax'.*{match}"):
        argmax(body, np.zeros((4, 10, 20, 20)))


# ---------------------------------------------------------------------------- BatchNorm
def batchnorm_bottom(seed=0):
    """BatchNormLayerTest: (5, 2, 3, 4) Gaussian."""
    return np.random.default_rng(seed).standard_normal((5, 2, 3, 4))


def assert_standardized_per_channel(y):
    for c in range(y.shape[1]):
        v = y[:, c]
        assert np.mean(v) == pytest.approx(0, abs=1e-3)
        assert np.mean(v * v) == pytest.approx(1, abs=1e-3)


def test_batchnorm_forward():
    """test_batch_norm_layer.cpp TestForward: in TRAIN each channel of the top has mean 0
    and (biased) variance 1 over N, H and W."""
    _, _, (top,) = forward('name: "bn" type: "BatchNorm"', batchnorm_bottom())
    assert_standardized_per_channel(top.data)


def test_batchnorm_forward_in_place():
    """test_batch_norm_layer.cpp TestForwardInplace: the same with the top the bottom."""
    layer = make_layer('name: "bn" type: "BatchNorm"')
    (b,) = blobs(batchnorm_bottom(1))
    layer.setup([b], [b])
    layer.forward([b], [b])
    assert_standardized_per_channel(b.data)


def test_batchnorm_gradient():
    """test_batch_norm_layer.cpp TestGradient: TRAIN, the batch statistics differentiated
    through; the three statistic blobs are not learned (no param gradient)."""
    layer = gradient('name: "bn" type: "BatchNorm"', batchnorm_bottom(2))
    assert layer.param_propagate_down == [False] * 3


# ------------------------------------------------------------------------- BatchReindex
PERM = [4, 0, 4, 0, 1, 2]   # BatchReindexLayerTest's permutation


def test_batch_reindex_forward():
    """test_batch_reindex_layer.cpp TestForward: bottom (5, 4, 3, 2) holding 0, 1, 2, ...;
    top item n is bottom item PERM[n], the top (6, 4, 3, 2)."""
    x = np.arange(120.0).reshape(5, 4, 3, 2)
    _, _, (top,) = forward('name: "reindex" type: "BatchReindex"', x, np.array(PERM, float))
    assert top.shape == (6, 4, 3, 2)
    np.testing.assert_array_equal(top.data, x[PERM])


def test_batch_reindex_gradient():
    """test_batch_reindex_layer.cpp TestGradient: bottom 0 (the indices get none); items
    picked twice (4 and 0) sum both diffs, item 3 gets zero."""
    x = np.random.default_rng(1701).standard_normal((5, 4, 3, 2))
    gradient('name: "reindex" type: "BatchReindex"', x, np.array(PERM, float), check_bottom=[0])


@pytest.mark.parametrize("index, match", [([0, 5], "greater than batch size"),
                                          ([-1, 0], "negative")])
def test_batch_reindex_index_checks(index, match):
    """batch_reindex_layer.cpp check_batch_reindex: every index in [0, N)."""
    with pytest.raises(ValueError, match=rf"'reindex'.*index specified for reindex layer "
                                         rf"was {match}"):
        forward('name: "reindex" type: "BatchReindex"', np.zeros((5, 2)), np.array(index, float))


# ------------------------------------------------------------------------------- Concat
def concat_bottoms():
    """ConcatLayerTest: constants 1 (2, 3, 6, 5), 2 (2, 5, 6, 5) and 3 (5, 3, 6, 5)."""
    return (np.full((2, 3, 6, 5), 1.0), np.full((2, 5, 6, 5), 2.0), np.full((5, 3, 6, 5), 3.0))


@pytest.mark.parametrize("body, pick, shape", [
    ("axis: 0", (0, 2), (7, 3, 6, 5)),     # TestSetupNum
    ("", (0, 1), (2, 8, 6, 5)),            # TestSetupChannels
    ("axis: -3", (0, 1), (2, 8, 6, 5)),    # TestSetupChannelsNegativeIndexing
])
def test_concat_setup(body, pick, shape):
    """test_concat_layer.cpp TestSetupNum, TestSetupChannels,
    TestSetupChannelsNegativeIndexing (axis -3 of 4 axes is the channels; Caffe's test sets it
    after building the layer, so there it tests the default; here the axis is given)."""
    b = concat_bottoms()
    _, _, (top,) = setup(f'name: "concat" type: "Concat" concat_param {{ {body} }}',
                         *(b[i] for i in pick))
    assert top.shape == shape


def test_concat_forward_trivial():
    """test_concat_layer.cpp TestForwardTrivial: one bottom, the top equals it."""
    x = np.random.default_rng(0).standard_normal((2, 3, 6, 5))
    _, _, (top,) = forward('name: "concat" type: "Concat"', x)
    np.testing.assert_array_equal(top.data, x)


@pytest.mark.parametrize("axis, pick", [(0, (0, 2)), (1, (0, 1))],
                         ids=["TestForwardNum", "TestForwardChannels"])
def test_concat_forward(axis, pick):
    """test_concat_layer.cpp TestForwardNum and TestForwardChannels: the first bottom, then
    the second after it along the axis (items 2.. or channels 3..)."""
    b = [concat_bottoms()[i] for i in pick]
    b[0] = b[0] + np.random.default_rng(axis).standard_normal(b[0].shape)  # distinct values
    _, _, (top,) = forward(f'name: "concat" type: "Concat" concat_param {{ axis: {axis} }}', *b)
    split = b[0].shape[axis]
    np.testing.assert_array_equal(np.take(top.data, range(split), axis=axis), b[0])
    np.testing.assert_array_equal(np.take(top.data, range(split, top.shape[axis]), axis=axis),
                                  b[1])


@pytest.mark.parametrize("axis, pick, check", [
    (1, (0,), None),      # TestGradientTrivial
    (0, (0, 2), None),    # TestGradientNum
    (1, (0, 1), None),    # TestGradientChannels
    (1, (0, 1), [1]),     # TestGradientChannelsBottomOneOnly
], ids=["Trivial", "Num", "Channels", "ChannelsBottomOneOnly"])
def test_concat_gradient(axis, pick, check):
    """test_concat_layer.cpp TestGradientTrivial, TestGradientNum, TestGradientChannels,
    TestGradientChannelsBottomOneOnly (on Gaussian bottoms of the fixture's shapes; the
    constants have no gradient worth checking)."""
    rng = np.random.default_rng(3)
    b = [rng.standard_normal(concat_bottoms()[i].shape) for i in pick]
    gradient(f'name: "concat" type: "Concat" concat_param {{ axis: {axis} }}', *b,
             check_bottom=check)


def test_concat_shape_check():
    """concat_layer.cpp Reshape: all inputs the same shape except at the concat axis."""
    with pytest.raises(ValueError, match=r"'concat'.*same shape except at concat axis"):
        setup('name: "concat" type: "Concat"', np.zeros((2, 3, 6, 5)), np.zeros((5, 3, 6, 5)))


# ----------------------------------------------------------------------- ContrastiveLoss
def contrastive_fixture(seed=0):
    """ContrastiveLossLayerTest: two (512, 2, 1, 1) uniform in [-1, 1] (distances near the
    margin 1, both sides of it), similarity labels 0 or 1."""
    rng = np.random.default_rng(seed)
    a, b = rng.uniform(-1, 1, (2, 512, 2, 1, 1))
    return a, b, labels(rng, (512, 1, 1, 1), 2)


def contrastive_reference(a, b, y, legacy, margin=1.0):
    dist_sq = np.sum((a - b).reshape(512, -1) ** 2, axis=1)
    if legacy:
        far = np.maximum(margin - dist_sq, 0)
    else:
        far = np.maximum(margin - np.sqrt(dist_sq), 0) ** 2
    return np.sum(np.where(y.reshape(-1) != 0, dist_sq, far)) / (2 * 512)


@pytest.mark.parametrize("legacy", [False, True], ids=["TestForward", "TestForwardLegacy"])
def test_contrastive_forward(legacy):
    """test_contrastive_loss_layer.cpp TestForward and TestForwardLegacy: similar pairs add
    d^2, dissimilar max(margin - d, 0)^2 (legacy: max(margin - d^2, 0)), over 2N."""
    a, b, y = contrastive_fixture()
    body = "contrastive_loss_param { legacy_version: true }" if legacy else ""
    _, _, (top,) = forward(f'name: "loss" type: "ContrastiveLoss" {body}', a, b, y)
    assert top.data == pytest.approx(contrastive_reference(a, b, y, legacy), abs=1e-6)


@pytest.mark.parametrize("legacy", [False, True], ids=["TestGradient", "TestGradientLegacy"])
def test_contrastive_gradient(legacy):
    """test_contrastive_loss_layer.cpp TestGradient and TestGradientLegacy: bottoms 0 and 1.
    Caffe's threshold 1e-2 (relative) for the current version: its backward divides by
    d + 1e-4, not d (contrastive_loss_layer.cpp), a relative 1e-4 / d off the exact gradient
    (2e-3 for the closest dissimilar pair here)."""
    a, b, y = contrastive_fixture(1)
    body = "contrastive_loss_param { legacy_version: true }" if legacy else ""
    tol = dict(rtol=1e-5) if legacy else dict(rtol=1e-2)
    gradient(f'name: "loss" type: "ContrastiveLoss" {body}', a, b, y, check_bottom=[0, 1], **tol)


# --------------------------------------------------------------------------------- Crop
def crop_bottoms(seed=0, extra=()):
    """CropLayerTest: (2, 4, 5, 4) and (2, 3, 4, 2) Gaussian, each with ``extra`` axes."""
    rng = np.random.default_rng(seed)
    return (rng.standard_normal((2, 4, 5, 4) + extra[:1]),
            rng.standard_normal((2, 3, 4, 2) + extra[1:]))


def crop(body):
    return f'name: "crop" type: "Crop" crop_param {{ {body} }}'


@pytest.mark.parametrize("body, shape", [
    ("axis: 0", (2, 3, 4, 2)),     # TestSetupShapeAll
    ("", (2, 4, 4, 2)),            # TestSetupShapeDefault
    ("axis: -1", (2, 4, 5, 2)),    # TestSetupShapeNegativeIndexing
])
def test_crop_setup(body, shape):
    """test_crop_layer.cpp TestSetupShapeAll, TestSetupShapeDefault,
    TestSetupShapeNegativeIndexing: axes before ``axis`` (default 2) keep bottom 0's sizes,
    the rest take bottom 1's."""
    _, _, (top,) = setup(crop(body), *crop_bottoms())
    assert top.shape == shape


def test_crop_dimensions_check():
    """test_crop_layer.cpp TestDimensionsCheck: bottom 1 with more channels (5) than bottom 0
    is fine, the channels are not cropped."""
    x, _ = crop_bottoms()
    _, _, (top,) = setup(crop(""), x, np.zeros((2, 5, 4, 2)))
    assert top.shape == (2, 4, 4, 2)


@pytest.mark.parametrize("body, start", [
    ("axis: 0", (0, 0, 0, 0)),                                  # TestCropAll
    ("axis: 0 offset: 0 offset: 1 offset: 1 offset: 2", (0, 1, 1, 2)),  # TestCropAllOffset
    ("axis: 2 offset: 1 offset: 2", (0, 0, 1, 2)),              # TestCropHW
])
def test_crop_forward(body, start):
    """test_crop_layer.cpp TestCropAll, TestCropAllOffset, TestCropHW: top[n, c, h, w] =
    bottom0[n + o0, c + o1, h + o2, w + o3]."""
    x, ref = crop_bottoms(1)
    _, _, (top,) = forward(crop(body), x, ref)
    window = tuple(slice(o, o + s) for o, s in zip(start, top.shape))
    np.testing.assert_array_equal(top.data, x[window])


def test_crop_5d():
    """test_crop_layer.cpp TestCrop5D: (2, 4, 5, 4, 2) cropped to (2, 4, 4, 2, 1) from axis 2
    at offsets 1, 2, 0."""
    x, ref = crop_bottoms(2, extra=(2, 1))
    _, _, (top,) = forward(crop("axis: 2 offset: 1 offset: 2 offset: 0"), x, ref)
    assert top.shape == (2, 4, 4, 2, 1)
    np.testing.assert_array_equal(top.data, x[:, :, 1:5, 2:4, 0:1])


@pytest.mark.parametrize("body, extra", [
    ("axis: 0", ()),                                        # TestCropAllGradient
    ("axis: 2 offset: 1 offset: 2", ()),                    # TestCropHWGradient
    ("axis: 2 offset: 1 offset: 2 offset: 0", (2, 1)),      # TestCrop5DGradient
], ids=["All", "HW", "5D"])
def test_crop_gradient(body, extra):
    """test_crop_layer.cpp TestCropAllGradient, TestCropHWGradient, TestCrop5DGradient: both
    bottoms (bottom 1 only gives a shape: a zero gradient)."""
    gradient(crop(body), *crop_bottoms(3, extra))


@pytest.mark.parametrize("body, ref_shape, match", [
    ("axis: 1 offset: 1 offset: 1", (2, 3, 4, 2),
     "number of offset values specified must be equal to the number of dimensions"),
    ("axis: 2 offset: 2", (2, 3, 4, 2), "crop for dimension 2 is out-of-bounds"),
    ("axis: 4", (2, 3, 4, 2), "crop axis 4 out of range"),
])
def test_crop_setup_checks(body, ref_shape, match):
    """crop_layer.cpp's CHECKs: as many offsets as cropped axes (or one, or none), a crop
    inside bottom 0, an axis in range."""
    x, _ = crop_bottoms()
    with pytest.raises(ValueError, match=rf"'crop'.*{match}"):
        setup(crop(body), x, np.zeros(ref_shape))


# ------------------------------------------------------------------------------ Eltwise
def eltwise_bottoms(seed=1701):
    """EltwiseLayerTest: three (2, 3, 4, 5) uniform in [0, 1]."""
    return tuple(np.random.default_rng(seed).uniform(0, 1, (3, 2, 3, 4, 5)))


def eltwise(body):
    return f'name: "eltwise" type: "Eltwise" eltwise_param {{ {body} }}'


def test_eltwise_setup():
    """test_eltwise_layer.cpp TestSetUp: PROD of three (2, 3, 4, 5) is (2, 3, 4, 5)."""
    _, _, (top,) = setup(eltwise("operation: PROD"), *eltwise_bottoms())
    assert top.shape == (2, 3, 4, 5)


@pytest.mark.parametrize("body, combine", [
    ("operation: PROD", lambda a, b, c: a * b * c),                          # TestProd
    ("operation: SUM", lambda a, b, c: a + b + c),                           # TestSum
    ("operation: SUM coeff: 1 coeff: -0.5 coeff: 2", lambda a, b, c: a - 0.5 * b + 2 * c),
    ("operation: MAX", lambda a, b, c: np.maximum(a, np.maximum(b, c))),     # TestMax
], ids=["TestProd", "TestSum", "TestSumCoeff", "TestMax"])
def test_eltwise_forward(body, combine):
    """test_eltwise_layer.cpp TestProd, TestSum, TestSumCoeff (1, -0.5, 2), TestMax (exact)."""
    a, b, c = eltwise_bottoms()
    _, _, (top,) = forward(eltwise(body), a, b, c)
    np.testing.assert_allclose(top.data, combine(a, b, c), rtol=0, atol=1e-12)


@pytest.mark.parametrize("body", [
    "operation: PROD stable_prod_grad: true",     # TestStableProdGradient
    "operation: PROD stable_prod_grad: false",    # TestUnstableProdGradient
    "operation: SUM",                             # TestSumGradient
    "operation: SUM coeff: 1 coeff: -0.5 coeff: 2",  # TestSumCoeffGradient
    "operation: MAX",                             # TestMaxGradient
], ids=["StableProd", "UnstableProd", "Sum", "SumCoeff", "Max"])
def test_eltwise_gradient(body):
    """test_eltwise_layer.cpp TestStableProdGradient, TestUnstableProdGradient,
    TestSumGradient, TestSumCoeffGradient, TestMaxGradient: all three bottoms."""
    gradient(eltwise(body), *eltwise_bottoms(7))


@pytest.mark.parametrize("body, shapes, match", [
    ("operation: SUM coeff: 1", [(2, 3)] * 2, "one coefficient per bottom blob"),
    ("operation: PROD coeff: 1 coeff: 1", [(2, 3)] * 2, "only takes coefficients for summation"),
    ("operation: SUM", [(2, 3), (3, 2)], "all bottoms must have the same shape"),
])
def test_eltwise_setup_checks(body, shapes, match):
    """eltwise_layer.cpp's CHECKs: one coeff per bottom, coeffs only for SUM, one shape."""
    with pytest.raises(ValueError, match=rf"'eltwise'.*{match}"):
        setup(eltwise(body), *(np.zeros(s) for s in shapes))


# ------------------------------------------------------------------------ EuclideanLoss
def euclidean_bottoms(seed=0):
    """EuclideanLossLayerTest: two (10, 5, 1, 1) Gaussian."""
    return tuple(np.random.default_rng(seed).standard_normal((2, 10, 5, 1, 1)))


def test_euclidean_forward_scales_with_the_loss_weight():
    """test_euclidean_loss_layer.cpp TestForward: Forward returns the loss times
    ``loss_weight`` (3.7 against the default 1), and the loss is not trivial (>= 0.1)."""
    a, b = euclidean_bottoms()
    text = 'name: "loss" type: "EuclideanLoss" {}'
    layer, bottom, top = setup(text.format(""), a, b)
    loss_1 = float(layer.forward(bottom, top))
    layer, bottom, top = setup(text.format("loss_weight: 3.7"), a, b)
    loss_2 = float(layer.forward(bottom, top))
    assert loss_2 == pytest.approx(float(np.float32(3.7)) * loss_1, rel=1e-12)
    assert abs(loss_1) >= 0.1
    assert loss_1 == pytest.approx(np.sum((a - b) ** 2) / 20, rel=1e-12)


def test_euclidean_gradient_with_loss_weight():
    """test_euclidean_loss_layer.cpp TestGradient: ``loss_weight: 3.7``, both bottoms; the
    weight seeded in the top's diff by SetUp scales the gradient: da = -db = 3.7 (a - b) / N,
    3.7 as the float field holds it (float32, widened)."""
    a, b = euclidean_bottoms(1)
    text = 'name: "loss" type: "EuclideanLoss" loss_weight: 3.7'
    gradient(text, a, b)
    layer, bottom, top = setup(text, a, b)
    layer.forward(bottom, top)
    layer.backward(top, [True, True], bottom)
    w = float(np.float32(3.7))
    np.testing.assert_allclose(bottom[0].diff, w * (a - b) / 10, rtol=1e-12)
    np.testing.assert_allclose(bottom[1].diff, -w * (a - b) / 10, rtol=1e-12)


# ------------------------------------------------------------------------------- Filter
SELECTOR = [0, 1, 1, 0]   # FilterLayerTest's selector: items 1 and 2 pass


def filter_bottoms(seed=1890):
    """FilterLayerTest: data (4, 3, 6, 4) Gaussian, labels (4, 1, 1, 1) in [0, 5), the
    selector (4, 1, 1, 1)."""
    rng = np.random.default_rng(seed)
    return (rng.standard_normal((4, 3, 6, 4)), labels(rng, (4, 1, 1, 1), 5),
            np.array(SELECTOR, float).reshape(4, 1, 1, 1))


def test_filter_reshape_and_forward():
    """test_filter_layer.cpp TestReshape and TestForward: items 1 and 2 pass, in order, to
    both tops, (2, 3, 6, 4) and (2, 1, 1, 1).

    Caffe's Reshape selects from its second call on, so its test sees 2 items right after an
    explicit Reshape.  minicaffe's reshape always shapes the tops for the whole batch (the
    most a forward can select; a memory plan made from reshaped shapes must bound every
    forward) and its forward selects, so here the 2 items are checked after the forward."""
    data, lab, sel = filter_bottoms()
    layer, bottom, top = setup('name: "filter" type: "Filter"', data, lab, sel, n_top=2)
    layer.reshape(bottom, top)
    assert [t.shape[0] for t in top] == [4, 4]     # minicaffe: the whole batch, see above
    layer.forward(bottom, top)
    assert top[0].shape == (2, 3, 6, 4) and top[1].shape == (2, 1, 1, 1)
    np.testing.assert_array_equal(top[1].data, lab[[1, 2]])
    np.testing.assert_array_equal(top[0].data, data[[1, 2]])


def test_filter_gradient():
    """test_filter_layer.cpp TestGradient: bottom 0 only (the labels and the selector need
    none); filtered-out items get a zero diff."""
    gradient('name: "filter" type: "Filter"', *filter_bottoms(1), n_top=2, check_bottom=[0])


@pytest.mark.parametrize("selector_shape, data_shape, n_top, match", [
    ((4, 2), (4, 3), 1, "selector blob dimensions must be singletons"),
    ((4, 1), (3, 3), 1, "same 0th dimension as the selector"),
    ((4, 1), (4, 3), 2, "needs one top per filtered bottom"),
])
def test_filter_setup_checks(selector_shape, data_shape, n_top, match):
    """filter_layer.cpp's CHECKs: one top per filtered bottom, a selector of singletons after
    its first axis, and the bottoms' first axis equal to the selector's."""
    with pytest.raises(ValueError, match=rf"'filter'.*{match}"):
        setup('name: "filter" type: "Filter"', np.zeros(data_shape), np.zeros(selector_shape),
              n_top=n_top)


# ------------------------------------------------------------------------------ Flatten
def flatten_bottom(seed=1701):
    """FlattenLayerTest: (2, 3, 6, 5) Gaussian."""
    return np.random.default_rng(seed).standard_normal((2, 3, 6, 5))


@pytest.mark.parametrize("body, shape", [
    ("", (2, 90)),                          # TestSetup
    ("axis: 2", (2, 3, 30)),                # TestSetupWithAxis
    ("end_axis: -2", (2, 18, 5)),           # TestSetupWithEndAxis
    ("axis: 0 end_axis: -2", (36, 5)),      # TestSetupWithStartAndEndAxis
])
def test_flatten_setup(body, shape):
    """test_flatten_layer.cpp TestSetup, TestSetupWithAxis, TestSetupWithEndAxis,
    TestSetupWithStartAndEndAxis."""
    _, _, (top,) = setup(f'name: "flat" type: "Flatten" flatten_param {{ {body} }}',
                         flatten_bottom())
    assert top.shape == shape


def test_flatten_forward():
    """test_flatten_layer.cpp TestForward: top[n, c] = bottom[n, c / 30, (c / 5) % 6, c % 5]."""
    x = flatten_bottom()
    _, _, (top,) = forward('name: "flat" type: "Flatten"', x)
    c = np.arange(90)
    for n in range(2):
        np.testing.assert_array_equal(top.data[n], x[n, c // 30, (c // 5) % 6, c % 5])


def test_flatten_gradient():
    """test_flatten_layer.cpp TestGradient."""
    gradient('name: "flat" type: "Flatten"', flatten_bottom(2))


def test_flatten_refuses_in_place():
    """flatten_layer.cpp Reshape: ``CHECK_NE(top[0], bottom[0])``."""
    layer = make_layer('name: "flat" type: "Flatten"')
    (b,) = blobs(flatten_bottom())
    with pytest.raises(ValueError, match=r"'flat'.*does not allow in-place computation"):
        layer.setup([b], [b])


# ---------------------------------------------------------------------------- HingeLoss
def hinge_bottoms(seed=1701):
    """HingeLossLayerTest: scores (10, 5, 1, 1) Gaussian of std 10, labels in [0, 5)."""
    rng = np.random.default_rng(seed)
    return 10 * rng.standard_normal((10, 5, 1, 1)), labels(rng, (10, 1, 1, 1), 5)


@pytest.mark.parametrize("norm", ["L1", "L2"], ids=["TestGradientL1", "TestGradientL2"])
def test_hinge_gradient(norm):
    """test_hinge_loss_layer.cpp TestGradientL1 and TestGradientL2: bottom 0 (L1's kinks at a
    margin of exactly 1 are where Caffe's checker skips; none of these scores is near one)."""
    x, lab = hinge_bottoms()
    t = np.where(np.arange(5) == lab.reshape(10, 1), 1, -1)
    assert np.min(np.abs(1 - t * x.reshape(10, 5))) > 1e-3
    gradient(f'name: "loss" type: "HingeLoss" hinge_loss_param {{ norm: {norm} }}', x, lab,
             check_bottom=[0])


@pytest.mark.parametrize("norm", ["L1", "L2"])
def test_hinge_forward(norm):
    """hinge_loss_layer.cpp Forward_cpu (no forward test in Caffe's file): the one-vs-all
    margins max(0, 1 - t x), summed (L1) or squared and summed (L2), over N."""
    x, lab = hinge_bottoms(2)
    _, _, (top,) = forward(f'name: "loss" type: "HingeLoss" hinge_loss_param {{ norm: {norm} }}',
                           x, lab)
    t = np.where(np.arange(5) == lab.reshape(10, 1), 1, -1)
    m = np.maximum(0, 1 - t * x.reshape(10, 5))
    assert top.data == pytest.approx(np.sum(m if norm == "L1" else m * m) / 10, rel=1e-12)
