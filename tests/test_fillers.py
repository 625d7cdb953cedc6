"""Weight fillers against Caffe's filler.hpp: values, statistics, fans, errors, seeding."""
import numpy as np
import pytest

from minicaffe.backend import to_numpy
from minicaffe.blob import Blob
from minicaffe.fillers import fill
from minicaffe.proto import caffe_pb2, parse_text
from minicaffe.rng import set_random_seed


def filled(text, shape, dtype=np.float64, seed=1):
    set_random_seed(seed)
    blob = Blob(shape, dtype=dtype, name="w")
    fill(blob, parse_text(text, caffe_pb2.FillerParameter))
    return to_numpy(blob.data)


def test_constant_and_default():
    np.testing.assert_array_equal(filled('type: "constant" value: 2.5', (3, 4)), 2.5)
    np.testing.assert_array_equal(filled("", (3,)), 0.0)  # FillerParameter default: constant 0


def filled_peak(text, shape=(1000, 1000), dtype=np.float32):
    """(the filled blob, the most host memory Python allocated while filling it)."""
    import tracemalloc
    blob = Blob(shape, dtype=dtype, name="w")
    blob.data[...] = 0                             # the blob's own memory, before tracing
    tracemalloc.start()
    try:
        fill(blob, parse_text(text, caffe_pb2.FillerParameter))
        return blob, tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()


def test_constant_fills_in_place_in_the_blobs_type():
    """Caffe's ConstantFiller is caffe_set(count, Dtype(value)): the float value in the blob's
    type, with no other array of the blob's size (FCN-8s's fc6: 103 M weights)."""
    v = filled('type: "constant" value: 0.1', (5,), dtype=np.float32)
    assert v.dtype == np.float32 and (v == np.float32(np.float32(0.1))).all()
    blob, peak = filled_peak('type: "constant" value: -3')
    assert peak < (1 << 20), peak                  # the blob is 4 MB; float64 beside it, 8 MB
    assert (to_numpy(blob.data) == -3).all()


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_dense_fillers_draw_in_chunks_the_values_of_one_draw(monkeypatch, dtype):
    """uniform, gaussian, xavier and msra draw FILL_CHUNK values at a time into the blob:
    bitwise the values one draw of the whole blob gives, with no float64 array of the
    blob's size beside it."""
    import minicaffe.fillers as fillers
    from minicaffe.rng import host_rng
    shape = (13, 5, 3)
    cases = [('type: "uniform" min: -2 max: 3', lambda r: r.uniform(-2, 3, size=shape)),
             ('type: "gaussian" mean: 1 std: 0.5', lambda r: r.normal(1, 0.5, size=shape)),
             ('type: "xavier"', lambda r: r.uniform(-np.sqrt(0.2), np.sqrt(0.2), size=shape)),
             ('type: "msra"', lambda r: r.normal(0, np.sqrt(2 / 15), size=shape))]
    for chunk in (7, 1 << 22):
        monkeypatch.setattr(fillers, "FILL_CHUNK", chunk)
        for text, ref in cases:
            set_random_seed(4)
            want = ref(host_rng()).astype(dtype)
            np.testing.assert_array_equal(filled(text, shape, dtype=dtype, seed=4), want, text)
    monkeypatch.setattr(fillers, "FILL_CHUNK", 1 << 16)
    blob, peak = filled_peak('type: "gaussian" std: 0.01', dtype=dtype)
    assert peak < (2 << 20), peak                  # one draw of it all: 8 MB of float64
    assert 0.009 < float(to_numpy(blob.data).std()) < 0.011


def test_uniform():
    v = filled('type: "uniform" min: -2 max: 3', (200, 100))
    assert v.min() >= -2 and v.max() <= 3
    assert abs(v.mean() - 0.5) < 0.05
    assert abs(v.std() - 5 / np.sqrt(12)) < 0.02


def test_gaussian():
    v = filled('type: "gaussian" mean: 1 std: 0.5', (200, 100))
    assert abs(v.mean() - 1) < 0.02
    assert abs(v.std() - 0.5) < 0.01


def test_sparse_gaussian_keeps_sparse_over_num_outputs():
    # Caffe keeps each weight with probability sparse / shape[0].
    v = filled('type: "gaussian" std: 1 sparse: 5', (20, 2000))
    assert abs((v != 0).mean() - 5 / 20) < 0.01
    v = filled('type: "gaussian" std: 1 sparse: 3', (10,))  # one axis is enough
    assert v.shape == (10,)


@pytest.mark.parametrize("norm,n", [("FAN_IN", 3 * 5 * 5), ("FAN_OUT", 64 * 5 * 5),
                                    ("AVERAGE", (3 * 25 + 64 * 25) / 2)])
def test_xavier_fans(norm, n):
    v = filled(f'type: "xavier" variance_norm: {norm}', (64, 3, 5, 5))
    bound = np.sqrt(3.0 / n)
    assert np.abs(v).max() <= bound
    assert np.abs(v).max() > 0.95 * bound
    assert abs(v.std() - bound / np.sqrt(3)) < 0.05 * bound


@pytest.mark.parametrize("norm,n", [("FAN_IN", 3 * 5 * 5), ("FAN_OUT", 64 * 5 * 5),
                                    ("AVERAGE", (3 * 25 + 64 * 25) / 2)])
def test_msra_fans(norm, n):
    v = filled(f'type: "msra" variance_norm: {norm}', (64, 3, 5, 5))
    assert abs(v.std() - np.sqrt(2.0 / n)) < 0.03 * np.sqrt(2.0 / n)
    assert abs(v.mean()) < 0.05 * np.sqrt(2.0 / n)


def test_xavier_inner_product_weight_uses_fan_in():
    v = filled('type: "xavier"', (500, 800))  # InnerProduct weight (N_out, K)
    assert np.abs(v).max() <= np.sqrt(3.0 / 800)


def test_positive_unitball():
    v = filled('type: "positive_unitball"', (6, 2, 3))
    assert (v >= 0).all() and (v <= 1).all()
    np.testing.assert_allclose(v.reshape(6, -1).sum(axis=1), 1.0)


@pytest.mark.parametrize("k", [3, 4, 5])
def test_bilinear_matches_caffe_loop(k):
    v = filled('type: "bilinear"', (2, 1, k, k))
    f = int(np.ceil(k / 2.0))
    c = (k - 1) / (2.0 * f)  # Caffe's BilinearFiller (and test_filler.cpp's reference)
    ref = np.empty(2 * k * k)
    for i in range(ref.size):  # Caffe's loop over the flat blob
        x = i % k
        y = (i // k) % k
        ref[i] = (1 - abs(x / f - c)) * (1 - abs(y / f - c))
    np.testing.assert_allclose(v.ravel(), ref)


def test_bilinear_shape_errors():
    with pytest.raises(ValueError, match="bilinear"):
        filled('type: "bilinear"', (2, 3, 4))
    with pytest.raises(ValueError, match="bilinear"):
        filled('type: "bilinear"', (2, 3, 4, 5))


def test_unknown_type():
    with pytest.raises(ValueError, match=r"unknown filler type 'glorot'.*xavier"):
        filled('type: "glorot"', (2, 2))


@pytest.mark.parametrize("kind", ["constant", "uniform", "xavier", "msra", "positive_unitball"])
def test_sparse_only_for_gaussian(kind):
    with pytest.raises(ValueError, match="sparse"):
        filled(f'type: "{kind}" sparse: 2', (4, 4))
    with pytest.raises(ValueError, match="sparse"):
        filled('type: "gaussian" sparse: -2', (4, 4))


def test_seeded_and_cast_to_blob_dtype():
    a = filled('type: "gaussian"', (5, 5), dtype=np.float32, seed=7)
    b = filled('type: "gaussian"', (5, 5), dtype=np.float32, seed=7)
    c = filled('type: "gaussian"', (5, 5), dtype=np.float32, seed=8)
    assert a.dtype == np.float32
    np.testing.assert_array_equal(a, b)
    assert not np.array_equal(a, c)


@pytest.mark.gpu
def test_gpu_blob_gets_host_drawn_values(cp):
    filler = parse_text('type: "msra"', caffe_pb2.FillerParameter)
    set_random_seed(3)
    host = fill(Blob((8, 4, 3, 3), dtype=np.float32), filler)
    set_random_seed(3)
    dev = fill(Blob((8, 4, 3, 3), xp=cp, dtype=np.float32), filler)
    np.testing.assert_array_equal(to_numpy(dev.data), to_numpy(host.data))
