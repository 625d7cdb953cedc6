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
