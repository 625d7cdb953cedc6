"""pycaffe's own caffe.io tests, as a spec: BVLC Caffe python/caffe/test/test_io.py
(blobproto_to_array in the old 4-D format, the new shape format, without a shape, a scalar;
array_to_datum without a label), written for pytest and run through ``import caffe``.
"""
import numpy as np
import pytest

import minicaffe  # noqa: F401  (makes ``import caffe`` reach minicaffe)
import caffe


def blob_with_data(data):
    blob = caffe.proto.caffe_pb2.BlobProto()
    blob.data.extend(list(data.flatten()))
    return blob


def test_old_format():
    blob = blob_with_data(np.zeros((10, 10)))
    shape = (1, 1, 10, 10)
    blob.num, blob.channels, blob.height, blob.width = shape
    arr = caffe.io.blobproto_to_array(blob)
    assert arr.shape == shape


def test_new_format():
    data = np.zeros((10, 10))
    blob = blob_with_data(data)
    blob.shape.dim.extend(list(data.shape))
    arr = caffe.io.blobproto_to_array(blob)
    assert arr.shape == data.shape


def test_no_shape():
    # 100 values, no shape and the legacy dims at their defaults (0): pycaffe's reshape fails
    blob = blob_with_data(np.zeros((10, 10)))
    with pytest.raises(ValueError):
        caffe.io.blobproto_to_array(blob)


def test_scalar():
    # one value and no shape: the legacy default dims (0, 0, 0, 0) give way to a scalar
    blob = blob_with_data(np.ones(1) * 123)
    arr = caffe.io.blobproto_to_array(blob)
    assert arr == 123
    assert arr.size == 1


def test_label_none_size():
    d1 = caffe.io.array_to_datum(np.ones((10, 10, 3)), label=1)
    d2 = caffe.io.array_to_datum(np.ones((10, 10, 3)))
    # without a label the label field is left unset: a smaller message
    assert len(d1.SerializeToString()) > len(d2.SerializeToString())
    assert d1.HasField('label') and not d2.HasField('label')
