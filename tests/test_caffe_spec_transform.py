"""DataTransformer against BVLC Caffe's ``src/caffe/test/test_data_transformer.cpp``.

Caffe's fixture: Datums of 2 x 10 x 10 bytes, either every pixel equal to the label
or "unique" pixels 0, 1, ..., 199 in memory order; seed 1701; 10 iterations.  Its
``NumSequenceMatches`` transforms one Datum 10 times, then 10 times more, and counts
the output values that repeat: a TEST centre crop repeats all of them, a TRAIN
crop or any mirror (TRAIN or TEST) does not.
"""
import numpy as np
import pytest

from minicaffe import io as mio
from minicaffe.proto import caffe_pb2, write_binary
from minicaffe.rng import set_random_seed
from minicaffe.transform import TEST, TRAIN, DataTransformer

C, H, W = 2, 10, 10
SEED = 1701
ITERS = 10


def datum(label=0, unique=False):
    """Caffe's FillDatum: bytes pixels, j or the label."""
    d = caffe_pb2.Datum(channels=C, height=H, width=W, label=label)
    d.data = bytes(j if unique else label for j in range(C * H * W))
    return d


def tparam(**kw):
    mean_value = kw.pop("mean_value", [])
    p = caffe_pb2.TransformationParameter(**kw)
    p.mean_value.extend(mean_value)
    return p


def test_empty_transform_copies_the_pixels():
    """TestEmptyTransform, TestEmptyTransformUniquePixels."""
    t = DataTransformer(tparam(), TEST)
    data, labels = t.transform_datums([datum(0)])
    assert data.shape == (1, C, H, W) and labels.tolist() == [0]
    np.testing.assert_array_equal(data, 0)
    data, _ = t.transform_datums([datum(0, unique=True)])
    np.testing.assert_array_equal(data.ravel(), np.arange(C * H * W))


def test_crop_size_gives_crops_of_the_label():
    """TestCropSize: a 2x2 TEST crop of a constant Datum, 10 times."""
    t = DataTransformer(tparam(crop_size=2), TEST)
    for _ in range(ITERS):
        data, _ = t.transform_datums([datum(0)])
        assert data.shape == (1, C, 2, 2)
        np.testing.assert_array_equal(data, 0)


def num_sequence_matches(param, phase):
    """Caffe's NumSequenceMatches: values equal between a first and a second sequence of
    ITERS transforms of one unique-pixel Datum, the transformer seeded by 1701."""
    set_random_seed(SEED)
    t = DataTransformer(param, phase)
    d = [datum(0, unique=True)]
    first = [t.transform_datums(d)[0] for _ in range(ITERS)]
    return sum(int(np.sum(a == t.transform_datums(d)[0])) for a in first), first[0].size


@pytest.mark.parametrize("kw, phase, all_match", [
    (dict(crop_size=2), TRAIN, False),     # TestCropTrain
    (dict(crop_size=2), TEST, True),       # TestCropTest
    (dict(mirror=True), TRAIN, False),     # TestMirrorTrain
    (dict(mirror=True), TEST, False),      # TestMirrorTest
])
def test_sequence_matches(kw, phase, all_match):
    matches, size = num_sequence_matches(tparam(**kw), phase)
    if all_match:
        assert matches == size * ITERS
    else:
        assert matches < size * ITERS


def test_mirror_on_top_of_a_test_crop_matches_less():
    """TestCropMirrorTest.  (TestCropMirrorTrain's ``<=`` between two random sequences holds
    for Caffe's generator stream at seed 1701, not as a property: not mirrored here.)"""
    crop, size = num_sequence_matches(tparam(crop_size=2), TEST)
    both, _ = num_sequence_matches(tparam(crop_size=2, mirror=True), TEST)
    assert crop == size * ITERS and both < crop


def test_mean_value_and_mean_values():
    """TestMeanValue (one value for all channels), TestMeanValues (one per channel)."""
    data, _ = DataTransformer(tparam(mean_value=[2]), TEST).transform_datums([datum(0)])
    np.testing.assert_array_equal(data, -2)
    data, _ = DataTransformer(tparam(mean_value=list(range(C))), TEST).transform_datums(
        [datum(0)])
    for c in range(C):
        np.testing.assert_array_equal(data[0, c], -c)


def test_mean_file_with_legacy_dimensions(tmp_path):
    """TestMeanFile: a BlobProto with num/channels/height/width (no shape) holding
    0..size-1 cancels the unique pixels exactly."""
    mean = caffe_pb2.BlobProto(num=1, channels=C, height=H, width=W)
    mean.data.extend(range(C * H * W))
    path = tmp_path / "mean.binaryproto"
    write_binary(mean, str(path))
    assert mio.load_mean_file(str(path)).shape[-3:] == (C, H, W)
    t = DataTransformer(tparam(mean_file=str(path)), TEST)
    data, _ = t.transform_datums([datum(0, unique=True)])
    np.testing.assert_array_equal(data, 0)
