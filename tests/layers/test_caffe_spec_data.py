"""Data layers against the cases of BVLC Caffe's unit tests that the per-layer tests here do
not already assert.

* ``src/caffe/test/test_dummy_data_layer.cpp``: TestOneTopConstant, TestTwoTopConstant
  (legacy num/channels/height/width given once or per top), and
  TestThreeTopConstantGaussianConstant (constant tops are filled at set-up and kept, the
  gaussian top is zero until the first forward and refilled on every forward).
* ``src/caffe/test/test_hdf5data_layer.cpp``: TestRead (a list of two files, the second
  gzip-compressed, three tops with (n, 1) labels, batches walking both files and wrapping).
* ``src/caffe/test/test_memory_data_layer.cpp``: TestSetup, TestForward (12 batches of 8,
  six passes), AddDatumVectorDefaultTransform, TestSetBatchSize.
* ``src/caffe/test/test_data_layer.cpp``: TestReadLMDB (scale) and TestReshapeLMDB
  (records of different sizes: the top reshapes with each batch of one).
"""
import numpy as np
import pytest

import minicaffe.layers  # noqa: F401  (registers the layer types)
from minicaffe import io as mio
from minicaffe.blob import Blob
from minicaffe.proto import caffe_pb2
from minicaffe.testing import make_layer

# every test here ends with no prefetch thread left (tests/layers/conftest.py)
pytestmark = pytest.mark.usefixtures("no_leftover_prefetch_threads")


def setup_layer(text, n_top):
    layer = make_layer(text)
    top = [Blob(dtype=np.float32, name=f"top{i}") for i in range(n_top)]
    layer.setup([], top)
    return layer, top


# -------------------------------------------------------------------- DummyData
def test_dummy_one_top_legacy_dims_is_zero():
    layer, (top,) = setup_layer('name: "d" type: "DummyData" top: "a" dummy_data_param { '
                                'num: 5 channels: 3 height: 2 width: 4 }', 1)
    assert top.shape == (5, 3, 2, 4) and not top.data.any()
    layer.forward([], [top])
    assert not top.data.any()


def test_dummy_two_tops_take_a_dim_given_once_for_both():
    layer, top = setup_layer('name: "d" type: "DummyData" top: "a" top: "b" dummy_data_param { '
                             'num: 5 channels: 3 height: 2 width: 4 num: 5 height: 1 '
                             'data_filler { value: 7 } }', 2)
    assert [t.shape for t in top] == [(5, 3, 2, 4), (5, 3, 1, 4)]
    for _ in range(2):
        assert all((t.data == 7).all() for t in top)
        layer.forward([], top)


def test_dummy_constant_tops_kept_gaussian_top_refilled_each_forward():
    layer, (a, b, c) = setup_layer(
        'name: "d" type: "DummyData" top: "a" top: "b" top: "c" dummy_data_param { '
        'num: 5 channels: 3 height: 2 width: 4 data_filler { value: 7 } '
        'data_filler { type: "gaussian" mean: 3 std: 0.01 } data_filler { value: 9 } }', 3)
    assert a.shape == b.shape == c.shape == (5, 3, 2, 4)
    assert (a.data == 7).all() and (c.data == 9).all()
    assert not b.data.any()   # a gaussian top is not filled at set-up
    samples = []
    for _ in range(2):
        layer.forward([], [a, b, c])
        assert (a.data == 7).all() and (c.data == 9).all()
        assert (np.abs(b.data - 3) <= 0.1).all()
        samples.append(b.data.ravel()[[0, -1]].copy())
    assert (samples[0] != samples[1]).all()


# --------------------------------------------------------------------- HDF5Data
@pytest.fixture
def sample_data(tmp_path):
    """Caffe's generate_sample_data.py: two files of 10 rows, data (10, 8, 6, 5) counting up
    (the second offset by 2400 and gzip-compressed), label (10, 1) = 1..10, label2 = label + 1
    as integers; the list names them by absolute path."""
    h5py = pytest.importorskip("h5py")
    names = []
    for k, compression in enumerate([None, "gzip"]):
        path = tmp_path / ("sample_data.h5" if k == 0 else "sample_data_2_gzip.h5")
        label = 1 + np.arange(10, dtype=np.float64).reshape(10, 1)
        with h5py.File(path, "w") as f:
            f.create_dataset("data", data=np.arange(2400, dtype=np.float32).reshape(10, 8, 6, 5)
                             + 2400 * k, compression=compression)
            f.create_dataset("label", data=label, compression=compression)
            f.create_dataset("label2", data=(label + 1).astype(np.int32),
                             compression=compression)
        names.append(str(path))
    listfile = tmp_path / "sample_data_list.txt"
    listfile.write_text("\n".join(names) + "\n")
    return listfile


def test_hdf5_read_walks_both_files_and_wraps(sample_data):
    layer, (data, label, label2) = setup_layer(
        f'name: "h5" type: "HDF5Data" top: "data" top: "label" top: "label2" '
        f'hdf5_data_param {{ source: "{sample_data}" batch_size: 5 }}', 3)
    assert data.shape == (5, 8, 6, 5) and label.shape == label2.shape == (5, 1)
    for it in range(10):
        layer.forward([], [data, label, label2])
        first_row = 0 if it % 2 == 0 else 5       # halves of a file in turn
        file_offset = 0 if it % 4 < 2 else 2400   # the files in turn
        np.testing.assert_array_equal(label.data.ravel(), 1 + first_row + np.arange(5))
        np.testing.assert_array_equal(label2.data.ravel(), 2 + first_row + np.arange(5))
        np.testing.assert_array_equal(data.data.ravel(),
                                      file_offset + 240 * first_row + np.arange(1200))


# ------------------------------------------------------------------- MemoryData
BATCH, BATCHES, C, H, W = 8, 12, 4, 7, 11
MEM = ('name: "mem" type: "MemoryData" top: "data" top: "label" memory_data_param { '
       f'batch_size: {BATCH} channels: {C} height: {H} width: {W} }}')


def test_memory_data_setup_and_six_passes_over_twelve_batches():
    """Caffe's DataLayerSetUp shapes the label (N,), its Forward_cpu (N, 1, 1, 1)."""
    layer, (data, label) = setup_layer(MEM, 2)
    assert data.shape == (BATCH, C, H, W) and label.shape == (BATCH,)
    rng = np.random.default_rng(0)
    x = rng.standard_normal((BATCHES * BATCH, C, H, W)).astype(np.float32)
    y = rng.standard_normal(BATCHES * BATCH).astype(np.float32)
    layer.reset(x, y)
    for i in range(BATCHES * 6):
        layer.forward([], [data, label])
        assert label.shape == (BATCH, 1, 1, 1)
        rows = slice((i % BATCHES) * BATCH, (i % BATCHES + 1) * BATCH)
        np.testing.assert_array_equal(data.data, x[rows])
        np.testing.assert_array_equal(label.data.ravel(), y[rows])


def test_memory_data_add_datum_vector_without_transform():
    layer, (data, label) = setup_layer(MEM, 2)
    rng = np.random.default_rng(1)
    for _ in range(2):   # once the data is consumed, more can be added
        imgs = rng.integers(0, 256, (BATCH, C, H, W), dtype=np.uint8)
        layer.add_datum_vector([mio.array_to_datum(im, i) for i, im in enumerate(imgs)])
        layer.forward([], [data, label])
        np.testing.assert_array_equal(data.data, imgs.astype(np.float32))
        np.testing.assert_array_equal(label.data.ravel(), np.arange(BATCH))


def test_memory_data_set_batch_size():
    layer, (data, label) = setup_layer(MEM, 2)
    new_batch, n_iter = 16, 3
    layer.set_batch_size(new_batch)
    imgs = np.random.default_rng(2).integers(0, 256, (n_iter * new_batch, C, H, W),
                                             dtype=np.uint8)
    layer.add_datum_vector([mio.array_to_datum(im, i) for i, im in enumerate(imgs)])
    for it in range(n_iter):
        layer.forward([], [data, label])
        assert data.shape == (new_batch, C, H, W) and label.shape == (new_batch, 1, 1, 1)
        rows = slice(it * new_batch, (it + 1) * new_batch)
        np.testing.assert_array_equal(data.data, imgs[rows].astype(np.float32))
        np.testing.assert_array_equal(label.data.ravel(),
                                      np.arange(n_iter * new_batch)[rows])


# ------------------------------------------------------------------------- Data
def write_lmdb(path, datums):
    with mio.LMDBWriter(path) as w:
        for i, d in enumerate(datums):
            w.put(f"{i:08d}", d.SerializeToString())


@pytest.mark.parametrize("prefetch", [0, 4])
def test_data_lmdb_read_with_scale(tmp_path, prefetch):
    pytest.importorskip("lmdb")
    write_lmdb(tmp_path / "db", [mio.array_to_datum(np.full((2, 3, 4), i, np.uint8), i)
                                 for i in range(5)])
    layer, (data, label) = setup_layer(
        f'name: "d" type: "Data" top: "data" top: "label" data_param {{ source: '
        f'"{tmp_path / "db"}" batch_size: 5 backend: LMDB prefetch: {prefetch} }} '
        'transform_param { scale: 3 }', 2)
    assert data.shape == (5, 2, 3, 4) and label.shape == (5,)
    for _ in range(3):
        layer.forward([], [data, label])
        np.testing.assert_array_equal(label.data, np.arange(5))
        np.testing.assert_allclose(data.data, np.broadcast_to(
            3.0 * np.arange(5).reshape(5, 1, 1, 1), data.shape), rtol=1e-7)
    layer.close()


@pytest.mark.parametrize("prefetch", [0, 4])
def test_data_lmdb_top_reshapes_with_each_record(tmp_path, prefetch):
    pytest.importorskip("lmdb")
    datums = []
    for i in range(5):
        d = caffe_pb2.Datum(label=i, channels=2, height=i % 2 + 1, width=i % 4 + 1)
        d.data = bytes(range(2 * d.height * d.width))
        datums.append(d)
    write_lmdb(tmp_path / "db", datums)
    layer, (data, label) = setup_layer(
        f'name: "d" type: "Data" top: "data" top: "label" data_param {{ source: '
        f'"{tmp_path / "db"}" batch_size: 1 backend: LMDB prefetch: {prefetch} }}', 2)
    assert data.shape == (1, 2, 1, 1) and label.shape == (1,)
    for i in range(5):
        layer.forward([], [data, label])
        assert data.shape == (1, 2, i % 2 + 1, i % 4 + 1)
        assert label.data[0] == i
        np.testing.assert_array_equal(data.data.ravel(), np.arange(data.count))
    layer.close()
