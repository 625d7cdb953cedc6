"""Blob against BVLC Caffe's own unit tests and the CHECKs of its Blob.

Mirrors ``src/caffe/test/test_blob.cpp`` (BlobSimpleTest) and, where that file has no test,
the behaviour of ``src/caffe/blob.cpp`` and ``include/caffe/blob.hpp`` that a user reaches
through pycaffe's Blob (``num``/``channels``/``height``/``width``, ``count``, ``reshape``,
``data``, ``diff``) or through minicaffe's (``shape_at``, ``count_range``, ``share_data``,
``to_proto``/``from_proto``).

Not ported:

* BlobSimpleTest.TestPointersCPUGPU: ``gpu_data``/``mutable_cpu_data`` are C++ pointers into
  SyncedMemory; pycaffe's Blob has ``data``/``diff`` arrays only (and minicaffe's device arrays
  are tested in tests/test_gpu_training.py).
* BlobMathTest.TestSumOfSquares, TestAsum, TestScaleData: ``sumsq_data``, ``asum_data``,
  ``scale_data`` and their diff twins are C++ only; neither pycaffe's Blob nor minicaffe's
  has them (NumPy on ``blob.data`` does the same).
* Reshape's ``CHECK_LE(shape[i], INT_MAX / count_)`` ("blob size exceeds INT_MAX"): a limit of
  C++'s int counts, which Python's do not have.
"""
import numpy as np
import pytest

from minicaffe.blob import MAX_BLOB_AXES, Blob, shape_equals
from minicaffe.proto import caffe_pb2


# ------------------------------------------------------------------- BlobSimpleTest
def test_initialization():
    """test_blob.cpp BlobSimpleTest.TestInitialization: ``Blob()`` has no axes and a count of
    0; ``Blob(2, 3, 4, 5)`` has the legacy dimensions and 120 elements."""
    blob, preshaped = Blob(), Blob((2, 3, 4, 5))
    assert (preshaped.num, preshaped.channels, preshaped.height, preshaped.width) == (2, 3, 4, 5)
    assert preshaped.count == 120
    assert blob.ndim == 0 and blob.count == 0


def test_default_blob_is_not_a_0d_blob():
    """blob.hpp: ``Blob()`` sets count_ 0 and no memory, while ``Blob(vector<int>())`` (a loss
    top) is Reshape({}) with one element: data of the first is an error naming the blob."""
    scalar = Blob(())
    assert scalar.ndim == 0 and scalar.count == 1 and scalar.data.shape == ()
    with pytest.raises(RuntimeError, match="'top0': data accessed before the blob has a shape"):
        Blob(name="top0").data
    unshaped = Blob()
    assert (unshaped.num, unshaped.channels, unshaped.height, unshaped.width) == (1, 1, 1, 1)
    unshaped.reshape(())          # Reshape(vector<int>()): now one element
    assert unshaped.count == 1 and float(unshaped.data) == 0.0


def test_reshape():
    """test_blob.cpp BlobSimpleTest.TestReshape: Reshape(2, 3, 4, 5) of a default blob."""
    blob = Blob()
    blob.reshape(2, 3, 4, 5)
    assert (blob.num, blob.channels, blob.height, blob.width, blob.count) == (2, 3, 4, 5, 120)
    assert blob.data.shape == (2, 3, 4, 5) and blob.diff.shape == (2, 3, 4, 5)


def test_reshape_zero():
    """test_blob.cpp BlobSimpleTest.TestReshapeZero: a (0, 5) blob has count 0 (and, being
    shaped, an empty data array)."""
    blob = Blob()
    blob.reshape([0, 5])
    assert blob.count == 0 and blob.data.shape == (0, 5)


def test_legacy_blob_proto_shape_equals():
    """test_blob.cpp BlobSimpleTest.TestLegacyBlobProtoShapeEquals: a legacy 4-d proto matches
    a blob of <= 4 axes that equals it after left-padding with ones."""
    blob = Blob()
    proto = caffe_pb2.BlobProto()

    def legacy(num, channels, height, width):
        proto.num, proto.channels, proto.height, proto.width = num, channels, height, width
        return proto

    blob.reshape(3, 2)
    assert shape_equals(legacy(1, 1, 3, 2), blob.shape)          # (3 x 2) == (1 x 1 x 3 x 2)
    assert not shape_equals(legacy(0, 1, 3, 2), blob.shape)      # (3 x 2) != (0 x 1 x 3 x 2)
    assert not shape_equals(legacy(3, 1, 3, 2), blob.shape)      # (3 x 2) != (3 x 1 x 3 x 2)
    blob.reshape(1, 3, 2)
    assert shape_equals(legacy(1, 1, 3, 2), blob.shape)          # (1 x 3 x 2) == (1 x 1 x 3 x 2)
    blob.reshape(2, 3, 2)
    assert not shape_equals(legacy(1, 1, 3, 2), blob.shape)      # (2 x 3 x 2) != (1 x 1 x 3 x 2)


def test_shape_equals_of_a_shape_proto_is_exact():
    """blob.cpp ShapeEquals: without legacy fields the proto's ``shape.dim`` must equal the
    blob's shape exactly (no padding); a legacy proto never matches a blob of > 4 axes."""
    proto = caffe_pb2.BlobProto()
    proto.shape.dim.extend([3, 2])
    assert shape_equals(proto, (3, 2))
    assert not shape_equals(proto, (1, 3, 2))
    legacy = caffe_pb2.BlobProto(num=1, channels=1, height=1, width=2)
    assert shape_equals(legacy, (2,)) and not shape_equals(legacy, (1, 1, 1, 1, 2))


# ------------------------------------------------------ blob.hpp: accessors and CHECKs
def test_legacy_accessors_pad_with_ones_and_refuse_more_than_4_axes():
    """blob.hpp LegacyShape: an axis past the blob's is 1; ``CHECK_LE(num_axes(), 4)``
    ("Cannot use legacy accessors on Blobs with > 4 axes."), which pycaffe's ``num`` trips."""
    b = Blob((2, 3, 4))
    assert (b.num, b.channels, b.height, b.width) == (2, 3, 4, 1)
    assert b.legacy_shape(-1) == 4 and b.legacy_shape(-4) == 1
    five = Blob((2, 3, 4, 5, 6), name="conv3d")
    for attr in ("num", "channels", "height", "width"):
        with pytest.raises(ValueError, match="'conv3d'.*Cannot use legacy accessors"):
            getattr(five, attr)
    with pytest.raises(IndexError, match="-4 <= index < 4"):
        b.legacy_shape(4)


def test_reshape_checks_axes_and_dimensions():
    """blob.cpp Reshape: ``CHECK_LE(shape.size(), kMaxBlobAxes)`` (32) and
    ``CHECK_GE(shape[i], 0)``; the error names the blob."""
    b = Blob(name="x")
    b.reshape((1,) * MAX_BLOB_AXES)
    assert MAX_BLOB_AXES == 32 and b.ndim == 32 and b.count == 1
    with pytest.raises(ValueError, match="'x'.*33 axes.*at most 32"):
        b.reshape((1,) * 33)
    with pytest.raises(ValueError, match="'x': negative dimension"):
        b.reshape(2, -1)


def test_count_of_an_axis_range_checks_its_bounds():
    """blob.hpp count(start_axis, end_axis): the product over [start, end), with
    ``0 <= start <= end <= num_axes()``."""
    b = Blob((2, 3, 4, 5), name="b")
    assert b.count_range(1) == 60 and b.count_range(1, 3) == 12 and b.count_range(2, 2) == 1
    assert b.count_range(0) == b.count == 120 and b.count_range(4) == 1
    for start, end in ((3, 2), (0, 5), (-1, 2), (5, None)):
        with pytest.raises(IndexError, match="'b'"):
            b.count_range(start, end)


def test_shape_of_an_axis_takes_canonical_indices():
    """blob.hpp shape(index) through CanonicalAxisIndex: -num_axes <= index < num_axes; a 0-d
    blob has no axis at all."""
    b = Blob((2, 3, 4, 5), name="b")
    assert b.shape_at(0) == 2 and b.shape_at(-1) == 5 and b.shape_at(-4) == 2
    for axis in (4, -5):
        with pytest.raises(IndexError, match="axis .* out of range for blob 'b'"):
            b.shape_at(axis)
    with pytest.raises(IndexError, match="out of range"):
        Blob(()).shape_at(0)


def test_reshape_keeps_the_memory_up_to_its_capacity():
    """blob.cpp Reshape: memory is reallocated only when the count exceeds the capacity, so
    a smaller reshape and back keeps the values; a larger one gets new, zeroed memory
    (SyncedMemory's first access memsets it)."""
    b = Blob((2, 3))
    b.data[...] = np.arange(6).reshape(2, 3)
    b.reshape(3)
    np.testing.assert_array_equal(b.data, [0, 1, 2])
    b.reshape(2, 3)
    np.testing.assert_array_equal(b.data.ravel(), np.arange(6))
    b.reshape(7)
    np.testing.assert_array_equal(b.data, np.zeros(7))


def test_share_data_and_diff_check_the_count():
    """blob.cpp ShareData / ShareDiff: ``CHECK_EQ(count_, other.count())``; once shared,
    writes through one blob are seen through the other."""
    a, b = Blob((2, 3), name="a"), Blob((3, 2), name="b")
    b.share_data(a)
    a.data[...] = 5
    assert float(b.data.sum()) == 30
    with pytest.raises(ValueError, match="'c' has 4 elements, 'a' 6"):
        Blob((4,), name="c").share_data(a)
    with pytest.raises(ValueError, match="share_diff"):
        Blob((4,), name="c").share_diff(a)


# ------------------------------------------------------- blob.cpp: ToProto / FromProto
@pytest.mark.parametrize("dtype, data_field, diff_field", [
    (np.float32, "data", "diff"), (np.float64, "double_data", "double_diff")])
def test_to_proto_from_proto_round_trip(dtype, data_field, diff_field):
    """blob.cpp ToProto: one ``shape.dim`` per axis, data (and diff with write_diff) in
    ``data``/``diff`` for Blob<float> and ``double_data``/``double_diff`` for Blob<double>;
    FromProto (reshape true) into a default blob gives the same shape and values."""
    rng = np.random.default_rng(1701)
    src = Blob((2, 3, 4), dtype=dtype)
    src.data[...] = rng.standard_normal((2, 3, 4))
    src.diff[...] = rng.standard_normal((2, 3, 4))
    proto = src.to_proto(caffe_pb2.BlobProto(), write_diff=True)
    assert list(proto.shape.dim) == [2, 3, 4]
    assert len(getattr(proto, data_field)) == 24 and len(getattr(proto, diff_field)) == 24
    dst = Blob(dtype=dtype)
    dst.from_proto(proto)
    assert dst.shape == (2, 3, 4)
    np.testing.assert_array_equal(dst.data, src.data)
    np.testing.assert_array_equal(dst.diff, src.diff)
    no_diff = src.to_proto(caffe_pb2.BlobProto())
    assert not len(no_diff.diff) and not len(no_diff.double_diff)


def test_from_proto_reads_legacy_dimensions_and_prefers_double_data():
    """blob.cpp FromProto: any of num/channels/height/width set makes the shape those four
    (unset ones 0); ``double_data`` wins over ``data`` where it has values."""
    proto = caffe_pb2.BlobProto(num=1, channels=2, height=1, width=3)
    proto.shape.dim.extend([6])                      # ignored: the legacy fields win
    proto.data.extend([9.0] * 6)
    proto.double_data.extend(np.arange(6.0).tolist())
    b = Blob()
    b.from_proto(proto)
    assert b.shape == (1, 2, 1, 3)
    np.testing.assert_array_equal(b.data.ravel(), np.arange(6.0))
    partial = caffe_pb2.BlobProto(height=3, width=2)
    partial.data.extend([1.0] * 6)
    with pytest.raises(ValueError, match="holds 6 values in data, expected 0"):
        Blob().from_proto(partial)          # (0, 0, 3, 2): CHECK_EQ(count_, data_size) fails


def test_from_proto_without_reshape_checks_shape_and_counts():
    """blob.cpp FromProto with reshape false: ``CHECK(ShapeEquals(proto))`` ("shape mismatch
    (reshape not set)"), then ``CHECK_EQ(count_, data_size)`` and the same for a diff; the
    errors name the layer."""
    b = Blob((2, 3))
    good = caffe_pb2.BlobProto()
    good.shape.dim.extend([2, 3])
    good.data.extend(range(6))
    b.from_proto(good, reshape=False)
    np.testing.assert_array_equal(b.data.ravel(), np.arange(6))
    wrong_shape = caffe_pb2.BlobProto()
    wrong_shape.CopyFrom(good)
    wrong_shape.shape.dim[:] = [3, 2]
    with pytest.raises(ValueError, match="layer 'ip': cannot copy param blob of shape "
                                         r"\(3, 2\) into blob of shape \(2, 3\)"):
        b.from_proto(wrong_shape, reshape=False, layer="ip")
    short = caffe_pb2.BlobProto()
    short.CopyFrom(good)
    del short.data[5]
    with pytest.raises(ValueError, match="holds 5 values in data, expected 6"):
        b.from_proto(short, reshape=False)
    bad_diff = caffe_pb2.BlobProto()
    bad_diff.CopyFrom(good)
    bad_diff.diff.extend([1.0] * 4)
    with pytest.raises(ValueError, match="holds 4 values in diff, expected 6"):
        b.from_proto(bad_diff, reshape=False)
    # a legacy proto of the padded shape loads into the smaller blob (an old InnerProduct bias)
    legacy = caffe_pb2.BlobProto(num=1, channels=1, height=2, width=3)
    legacy.data.extend(range(6))
    b.from_proto(legacy, reshape=False)
    assert b.shape == (2, 3)


def test_a_0d_blob_round_trips_without_a_shape():
    """blob.cpp ToProto writes no ``dim`` for a 0-d blob, and FromProto of a proto without a
    shape reshapes to 0-d: one value."""
    src = Blob(())
    src.data[...] = 2.5
    proto = src.to_proto(caffe_pb2.BlobProto())
    assert not proto.HasField("shape") and list(proto.data) == [2.5]
    dst = Blob((4,))
    dst.from_proto(proto)
    assert dst.shape == () and float(dst.data) == 2.5
