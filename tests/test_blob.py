"""minicaffe.blob: the cached views of data and diff (the hot path of every layer call)."""
import numpy as np
import pytest

from minicaffe.blob import Blob


def test_views_are_cached_and_follow_reshape_and_rebinding():
    b = Blob((2, 3))
    v = b.data
    assert b.data is v and v.shape == (2, 3)          # the same view, no new one per access
    b.data[...] = 1.0
    b.reshape(3, 2)                                   # a new shape: a new view of the same buffer
    assert b.data is not v and b.data.shape == (3, 2) and float(b.data.sum()) == 6.0
    b.reshape(4, 4)                                   # beyond the buffer: a new, zeroed one
    assert b.data.shape == (4, 4) and float(b.data.sum()) == 0.0
    # the memory manager binds another buffer: the next access views it, not the old one
    region = np.arange(20, dtype=np.float32)
    b.data_storage.array, b.data_storage.external = region, True
    assert np.array_equal(b.data.ravel(), region[:16])
    assert np.shares_memory(b.data, region)


def test_released_external_storage_is_never_served_from_the_cache():
    b = Blob((2, 2))
    b.diff_storage.array, b.diff_storage.external = np.zeros(4, np.float32), True
    assert b.diff.shape == (2, 2)                     # cached now
    b.diff_storage.array = None                       # the plan released it
    with pytest.raises(RuntimeError, match="diff accessed while its storage is released"):
        b.diff


def test_a_storage_bound_to_regions_in_turn_keeps_a_view_of_each():
    """A swap plan binds a storage to a few arena regions in turn: each region's view is made
    once and served again when the storage comes back to it; a reshape, a share or
    drop_views forgets them all; the views kept are bounded."""
    b = Blob((2, 2))
    regions = [np.full(4, float(i), np.float32) for i in range(3)]
    st = b.data_storage
    st.external = True
    first = []
    for r in regions:
        st.array = r
        first.append(b.data)
    for _ in range(2):
        for r, v in zip(regions, first):
            st.array = r
            assert b.data is v and np.shares_memory(v, r) and float(v[0, 0]) == r[0]
    st.array = None                                   # released: never a cached view
    with pytest.raises(RuntimeError, match="data accessed while its storage is released"):
        b.data
    st.array = regions[1]
    assert b.data is first[1]
    b.reshape(4)                                      # a new shape: new views
    assert b.data is not first[1] and b.data.shape == (4,)
    st.array = regions[0]
    assert b.data.shape == (4,) and np.shares_memory(b.data, regions[0])
    many = [np.zeros(4, np.float32) for _ in range(3 * Blob._MORE_VIEWS)]
    for r in many:
        st.array = r
        b.data
    assert len(b._views) <= 3 + Blob._MORE_VIEWS      # bounded
    b.drop_views()
    assert not b._views


@pytest.mark.parametrize("shape, dtype, diff", [
    ((3, 4), np.float32, False), ((2, 3, 4, 5), np.float32, True), ((7,), np.float64, True),
    ((0, 3), np.float32, True), ((300, 70), np.float32, True)])
def test_to_proto_is_the_message_caffe_writes(shape, dtype, diff):
    """to_proto builds the BlobProto from its wire bytes: the same message (and bytes) as
    filling shape, data and diff field by field, as Blob::ToProto does."""
    from minicaffe.proto import caffe_pb2
    rng = np.random.default_rng(1)
    b = Blob(shape=shape, dtype=dtype)
    b.data[...] = rng.standard_normal(shape)
    b.diff[...] = rng.standard_normal(shape)
    got = b.to_proto(caffe_pb2.BlobProto(data=[9.0]), write_diff=diff)   # cleared first
    want = caffe_pb2.BlobProto()
    want.shape.dim.extend(shape)
    wide = dtype == np.float64
    (want.double_data if wide else want.data).extend(np.asarray(b.data).ravel().tolist())
    if diff:
        (want.double_diff if wide else want.diff).extend(np.asarray(b.diff).ravel().tolist())
    assert got == want and got.SerializeToString() == want.SerializeToString()
    back = Blob(shape=shape, dtype=dtype)
    back.from_proto(got, reshape=False)
    assert np.array_equal(back.data, b.data)


def test_a_0d_blob_proto_has_no_shape_as_caffes():
    """Blob::ToProto adds a dim per axis, so a 0-d blob (Scale with num_axes 0) writes data
    alone; it loads back into a 0-d blob."""
    from minicaffe.proto import caffe_pb2
    b = Blob(shape=(), dtype=np.float32)
    b.data[...] = 2.5
    p = b.to_proto(caffe_pb2.BlobProto())
    assert not p.HasField("shape") and list(p.data) == [2.5]
    c = Blob(shape=(), dtype=np.float32)
    c.from_proto(p, reshape=False)
    assert float(c.data) == 2.5
