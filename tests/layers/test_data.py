"""Data layers: Input, DummyData, Data (LMDB, prefetch thread), HDF5Data, MemoryData."""
import gc
import time

import numpy as np
import pytest

import minicaffe.layers  # noqa: F401  (registers the layer types)
from minicaffe import io as mio
from minicaffe.backend import to_numpy
from minicaffe.blob import Blob
from minicaffe.rng import set_random_seed
from minicaffe.testing import make_layer
from minicaffe.transform import TEST, TRAIN

pytest.importorskip("lmdb")

N_RECORDS = 10
SHAPE = (2, 4, 5)


def tops(n, xp=np, dtype=np.float32):
    return [Blob(xp=xp, dtype=dtype, name=f"top{i}") for i in range(n)]


def setup_layer(text, n_top=2, phase=None, xp=np, dtype=np.float32, source_dir=None):
    layer = make_layer(text, xp=xp, dtype=dtype, phase=phase)
    if source_dir is not None:
        layer.source_dir = source_dir
    t = tops(n_top, xp, dtype)
    layer.setup([], t)
    return layer, t


@pytest.fixture
def db(tmp_path):
    """An LMDB of 10 random (2, 4, 5) uint8 images labelled 0..9; returns (path, images)."""
    imgs = np.random.default_rng(0).integers(0, 256, (N_RECORDS,) + SHAPE, dtype=np.uint8)
    path = tmp_path / "train_lmdb"
    with mio.LMDBWriter(path) as w:
        for i, im in enumerate(imgs):
            w.put(f"{i:08d}_img{i}.png", mio.array_to_datum(im, i).SerializeToString())
    return str(path), imgs


def data_text(source, batch=4, extra="", transform="", prefetch=None, tops_=("data", "label")):
    pf = f"prefetch: {prefetch}" if prefetch is not None else ""
    top_lines = " ".join(f'top: "{t}"' for t in tops_)
    return (f'name: "data" type: "Data" {top_lines} '
            f'data_param {{ source: "{source}" batch_size: {batch} backend: LMDB {pf} {extra} }} '
            f"transform_param {{ {transform} }}")


# every test here ends with no prefetch thread left (tests/layers/conftest.py)
pytestmark = pytest.mark.usefixtures("no_leftover_prefetch_threads")


# -------------------------------------------------------------------- Input
def test_input_shapes_one_shared_or_none():
    layer, t = setup_layer('name: "in" type: "Input" top: "a" top: "b" '
                           "input_param { shape { dim: 2 dim: 3 } shape { dim: 4 } }")
    assert t[0].shape == (2, 3) and t[1].shape == (4,)
    layer, t = setup_layer('name: "in" type: "Input" top: "a" top: "b" '
                           "input_param { shape { dim: 5 dim: 1 } }")
    assert t[0].shape == t[1].shape == (5, 1)
    layer, t = setup_layer('name: "in" type: "Input" top: "a"', n_top=1)
    assert t[0].shape == ()
    # forward and reshape leave the caller's data and shape alone
    t[0].reshape(2, 2)
    t[0].data[...] = 7
    layer.reshape([], t)
    layer.forward([], t)
    assert t[0].shape == (2, 2) and (t[0].data == 7).all()
    assert layer.flops([], t) == (0.0, 0.0)
    assert layer.backward_reads().bottom == () and layer.backward_reads().top == ()


def test_input_shape_count_error():
    layer = make_layer('name: "in" type: "Input" top: "a" top: "b" top: "c" '
                       "input_param { shape { dim: 1 } shape { dim: 2 } }")
    with pytest.raises(ValueError, match="once per top blob, or not at all: 3 tops vs. 2 shapes"):
        layer.setup([], tops(3))


# ---------------------------------------------------------------- DummyData
def test_dummy_data_default_is_constant_zero_and_legacy_dims():
    layer, t = setup_layer('name: "d" type: "DummyData" top: "a" top: "b" '
                           "dummy_data_param { num: 2 channels: 3 height: 4 width: 5 "
                           "num: 1 channels: 1 height: 1 width: 7 }")
    assert t[0].shape == (2, 3, 4, 5) and t[1].shape == (1, 1, 1, 7)
    assert (t[0].data == 0).all() and (t[1].data == 0).all()


def test_dummy_data_constant_fills_once_others_refill():
    layer, t = setup_layer(
        'name: "d" type: "DummyData" top: "c" top: "g" '
        "dummy_data_param { shape { dim: 2 dim: 3 } "
        'data_filler { type: "constant" value: 1.5 } data_filler { type: "gaussian" std: 1 } }')
    assert (t[0].data == 1.5).all()
    assert t[1].shape == (2, 3)
    # Caffe fills constant tops in setup only: a later change to them stays
    t[0].data[0, 0] = -1
    layer.forward([], t)
    g1 = t[1].data.copy()
    layer.forward([], t)
    assert t[0].data[0, 0] == -1 and (t[0].data.ravel()[1:] == 1.5).all()
    assert not np.array_equal(g1, t[1].data)  # gaussian: new values every forward
    assert layer.persistent_tops(2) == (0,)


def test_dummy_data_one_filler_for_all_tops_is_seeded():
    text = ('name: "d" type: "DummyData" top: "a" top: "b" dummy_data_param { '
            'shape { dim: 3 } shape { dim: 2 dim: 2 } '
            'data_filler { type: "uniform" min: 2 max: 3 } }')
    set_random_seed(4)
    layer, t = setup_layer(text)
    layer.forward([], t)
    a, b = t[0].data.copy(), t[1].data.copy()
    assert t[0].shape == (3,) and t[1].shape == (2, 2)
    assert (a >= 2).all() and (a <= 3).all() and (b >= 2).all()
    set_random_seed(4)
    layer, t = setup_layer(text)
    layer.forward([], t)
    np.testing.assert_array_equal(t[0].data, a)


@pytest.mark.parametrize("text, msg", [
    ('dummy_data_param { shape { dim: 1 } data_filler { } data_filler { } }',
     "must be 0, 1 or equal to the number of tops: 3; you specified 2"),
    ("dummy_data_param { shape { dim: 1 } shape { dim: 2 } }",
     "must specify 'shape' once, or once per top blob \\(3\\); specified 2"),
    ("dummy_data_param { num: 1 channels: 1 height: 1 width: 1 shape { dim: 1 } }",
     "both shape and legacy fields"),
    ("dummy_data_param { num: 1 num: 2 channels: 1 height: 1 width: 1 }",
     "must specify 'num' once, or once per top blob \\(3\\); specified 2"),
])
def test_dummy_data_errors(text, msg):
    layer = make_layer(f'name: "d" type: "DummyData" top: "a" top: "b" top: "c" {text}')
    with pytest.raises(ValueError, match=msg):
        layer.setup([], tops(3))


def mio_has_plyvel() -> bool:
    try:
        mio.require_plyvel()
        return True
    except ImportError:
        return False


# --------------------------------------------------------------------- Data
@pytest.mark.parametrize("prefetch", [0, 2])
def test_data_reads_a_leveldb_as_caffe_by_default(db, tmp_path, prefetch):
    """data_param.backend defaults to LEVELDB, as in Caffe: the same records in a LevelDB give
    the same batches as the LMDB, wrapping around, and a resumed position too."""
    pytest.importorskip("plyvel")
    path, imgs = db
    ldb = tmp_path / "train_leveldb"
    with mio.LMDBReader(path) as src, mio.LevelDBWriter(ldb) as w:
        for k, v in src.items():
            w.put(k, v)
    text = data_text(str(ldb), batch=4, prefetch=prefetch).replace("backend: LMDB", "")
    layer, t = setup_layer(text)
    for labels in [[0, 1, 2, 3], [4, 5, 6, 7], [8, 9, 0, 1]]:
        layer.forward([], t)
        np.testing.assert_array_equal(t[1].data, labels)
        np.testing.assert_array_equal(t[0].data, imgs[labels].astype(np.float32))
    state = layer.state_dict()
    again, t2 = setup_layer(text)
    again.load_state_dict(state)
    again.forward([], t2)
    np.testing.assert_array_equal(t2[1].data, [2, 3, 4, 5])
    layer.close()
    again.close()
    with mio.LevelDBReader(ldb) as r:
        assert len(r) == N_RECORDS and [k for k, _ in r.items()][:2] == [
            b"00000000_img0.png", b"00000001_img1.png"]
    with pytest.raises(FileExistsError, match="already exists"):
        mio.LevelDBWriter(ldb)


@pytest.mark.parametrize("prefetch", [0, 4, 1])
def test_data_batches_in_order_and_wrap_around(db, prefetch):
    path, imgs = db
    layer, t = setup_layer(data_text(path, batch=4, prefetch=prefetch))
    assert t[0].shape == (4,) + SHAPE and t[1].shape == (4,)
    expect = [[0, 1, 2, 3], [4, 5, 6, 7], [8, 9, 0, 1], [2, 3, 4, 5]]
    for labels in expect:
        layer.forward([], t)
        np.testing.assert_array_equal(t[1].data, labels)
        np.testing.assert_array_equal(t[0].data, imgs[labels].astype(np.float32))
    layer.close()


def test_data_without_label_top_and_shape_errors(db):
    path, _ = db
    layer, t = setup_layer(data_text(path, batch=3, tops_=("data",)), n_top=1)
    layer.forward([], t)
    assert t[0].shape == (3,) + SHAPE
    layer.close()
    layer = make_layer(data_text(path, tops_=("a", "b", "c")))
    with pytest.raises(ValueError, match="at most 2 top"):
        layer.setup([], tops(3))


def test_data_train_crop_mirror_is_seeded_and_prefetch_independent(db):
    path, imgs = db
    tr = "crop_size: 3 mirror: true scale: 0.5 mean_value: 10 mean_value: 20"
    runs = []
    for prefetch in (4, 0, 2):
        set_random_seed(21)
        layer, t = setup_layer(data_text(path, batch=4, transform=tr, prefetch=prefetch),
                               phase=TRAIN)
        batches = []
        for _ in range(3):
            layer.forward([], t)
            batches.append((t[0].data.copy(), t[1].data.copy()))
        layer.close()
        runs.append(batches)
    for other in runs[1:]:
        for (d0, l0), (d1, l1) in zip(runs[0], other):
            np.testing.assert_array_equal(d0, d1)
            np.testing.assert_array_equal(l0, l1)
    data, labels = runs[0][0]
    assert data.shape == (4, 2, 3, 3)
    # every output is some crop (maybe mirrored) of its record, minus the mean, times 0.5
    mv = np.array([10, 20], np.float32).reshape(2, 1, 1)
    for out, lab in zip(data, labels.astype(int)):
        cands = []
        for h in range(2):
            for w in range(3):
                win = (imgs[lab][:, h:h + 3, w:w + 3].astype(np.float32) - mv) * np.float32(0.5)
                cands += [win, win[:, :, ::-1]]
        assert any(np.array_equal(out, c) for c in cands)
    set_random_seed(22)
    layer, t = setup_layer(data_text(path, batch=4, transform=tr), phase=TRAIN)
    layer.forward([], t)
    assert not np.array_equal(t[0].data, data)
    layer.close()


def test_data_test_phase_center_crop_values(db):
    path, imgs = db
    layer, t = setup_layer(data_text(path, batch=2, transform="crop_size: 2"), phase=TEST)
    assert t[0].shape == (2, 2, 2, 2)
    layer.forward([], t)
    # H = 4, W = 5, crop 2: offsets (1, 1)
    np.testing.assert_array_equal(t[0].data, imgs[:2, :, 1:3, 1:3].astype(np.float32))
    layer.close()


def test_data_mean_file_relative_to_prototxt(db, tmp_path, monkeypatch):
    path, imgs = db
    mean = imgs.astype(np.float32).mean(axis=0, keepdims=True)
    mio.save_mean_file(tmp_path / "mean.binaryproto", mean)
    monkeypatch.chdir(tmp_path.parent)  # neither file is found from the working directory
    layer, t = setup_layer(data_text("train_lmdb", batch=2,
                                     transform='mean_file: "mean.binaryproto"'),
                           source_dir=str(tmp_path))
    layer.forward([], t)
    np.testing.assert_allclose(t[0].data, imgs[:2] - mean, rtol=0, atol=1e-4)
    layer.close()


def test_data_source_errors(db, tmp_path):
    path, _ = db
    layer = make_layer(data_text(str(tmp_path / "nowhere_lmdb")))
    layer.source_dir = str(tmp_path / "proto")
    with pytest.raises(FileNotFoundError,
                       match=r"layer 'data' \(Data\): data source .*nowhere_lmdb"):
        layer.setup([], tops(2))
    if mio_has_plyvel():      # an LMDB read with Caffe's default backend
        text = data_text(path).replace("backend: LMDB", "")
        with pytest.raises(ValueError, match=r"backend is LEVELDB \(Caffe's default\), but .*"
                                             r"train_lmdb is not a LevelDB database .* set "
                                             r"`backend: LMDB`"):
            make_layer(text).setup([], tops(2))
    with pytest.raises(ValueError, match="batch_size must be positive"):
        make_layer(data_text(path, batch=0)).setup([], tops(2))
    empty = tmp_path / "empty_lmdb"
    with mio.LMDBWriter(empty):
        pass
    with pytest.raises(ValueError, match="holds no records"):
        make_layer(data_text(str(empty))).setup([], tops(2))


def test_data_rand_skip_is_ignored_as_upstream_data_layer_does(db):
    """Upstream data_layer.cpp reads no rand_skip (since the 2015 DataReader): the first
    batch starts at the first record whatever the seed (tests/test_caffe_proto_coverage.py
    checks the warning a net gives)."""
    path, _ = db
    for seed in (9, 10):
        set_random_seed(seed)
        layer, t = setup_layer(data_text(path, batch=2, extra="rand_skip: 7"))
        layer.forward([], t)
        np.testing.assert_array_equal(t[1].data, [0, 1])
        layer.close()


def test_data_two_layers_on_one_database(db):
    path, imgs = db
    a, ta = setup_layer(data_text(path, batch=3))
    b, tb = setup_layer(data_text(path, batch=5))
    a.forward([], ta)
    b.forward([], tb)
    a.forward([], ta)
    np.testing.assert_array_equal(ta[1].data, [3, 4, 5])
    np.testing.assert_array_equal(tb[1].data, [0, 1, 2, 3, 4])
    a.close()
    b.forward([], tb)
    np.testing.assert_array_equal(tb[1].data, [5, 6, 7, 8, 9])
    b.close()


def test_data_prefetch_thread_shutdown(db):
    path, _ = db
    layer, t = setup_layer(data_text(path, batch=2, prefetch=3))
    assert layer.prefetch_thread is None  # started by the first forward
    layer.forward([], t)
    thread = layer.prefetch_thread
    assert thread.is_alive() and thread.daemon
    time.sleep(0.05)  # let it fill every buffer and block
    layer.close()
    assert not thread.is_alive()
    with pytest.raises(RuntimeError, match="closed"):
        layer.forward([], t)
    layer.close()  # idempotent
    # a layer dropped without close() stops its thread when collected
    layer, t = setup_layer(data_text(path, batch=2))
    layer.forward([], t)
    thread = layer.prefetch_thread
    del layer
    gc.collect()
    thread.join(5)
    assert not thread.is_alive()


def test_data_loading_error_reaches_forward(tmp_path):
    path = tmp_path / "mixed_lmdb"
    with mio.LMDBWriter(path) as w:
        w.put("0", mio.array_to_datum(np.zeros((1, 2, 2), np.uint8), 0).SerializeToString())
        w.put("1", mio.array_to_datum(np.zeros((1, 3, 3), np.uint8), 1).SerializeToString())
    layer, t = setup_layer(data_text(str(path), batch=2))
    with pytest.raises(RuntimeError, match="loading a batch failed.*one shape"):
        layer.forward([], t)
    with pytest.raises(RuntimeError, match="loading a batch failed"):
        layer.forward([], t)
    layer.close()


def test_data_prefetch_nbytes_and_declarations(db):
    path, _ = db
    layer, t = setup_layer(data_text(path, batch=4))
    assert layer.prefetch_nbytes() == 4 * (4 * 2 * 4 * 5 + 4) * 4
    assert layer.flops([], t) == (0.0, 0.0)
    assert layer.backward_reads().bottom == ()
    layer.backward(t, [], [])  # nothing to do, no error
    layer.close()


def test_data_in_a_net_finds_its_source_next_to_the_prototxt(db, tmp_path, monkeypatch):
    from minicaffe.net import Net
    path, imgs = db
    proto = tmp_path / "net.prototxt"
    proto.write_text('name: "n" layer { name: "data" type: "Data" top: "data" top: "label" '
                     'data_param { source: "train_lmdb" batch_size: 5 backend: LMDB } }')
    monkeypatch.chdir(tmp_path.parent)
    net = Net(str(proto), TRAIN)
    out = net.forward()
    np.testing.assert_array_equal(out["label"], [0, 1, 2, 3, 4])
    np.testing.assert_array_equal(out["data"], imgs[:5].astype(np.float32))
    net.layers[0].close()


# ----------------------------------------------------------------- HDF5Data
@pytest.fixture
def h5files(tmp_path):
    h5py = pytest.importorskip("h5py")
    rows = [4, 2]
    start = 0
    names = []
    for k, n in enumerate(rows):
        idx = np.arange(start, start + n)
        name = f"part{k}.h5"
        with h5py.File(tmp_path / name, "w") as f:
            f["data"] = np.stack([np.full((2, 3), i, np.float32) for i in idx])
            f["label"] = idx.astype(np.float64)
        names.append(name)
        start += n
    (tmp_path / "list.txt").write_text("\n".join(names) + "\n")
    return tmp_path


def h5_text(source, batch=4, shuffle=False):
    return (f'name: "h5" type: "HDF5Data" top: "data" top: "label" '
            f'hdf5_data_param {{ source: "{source}" batch_size: {batch} '
            f'shuffle: {str(shuffle).lower()} }}')


def test_hdf5_two_files_in_order_with_wrap_around(h5files):
    layer, t = setup_layer(h5_text(h5files / "list.txt", batch=4))
    assert t[0].shape == (4, 2, 3) and t[1].shape == (4,)
    for expect in ([0, 1, 2, 3], [4, 5, 0, 1], [2, 3, 4, 5]):
        layer.forward([], t)
        np.testing.assert_array_equal(t[1].data, expect)
        np.testing.assert_array_equal(t[0].data[:, 0, 0], expect)
        assert (t[0].data == t[0].data[:, :1, :1]).all()


def test_hdf5_shuffle_is_seeded_and_covers_every_row(h5files, monkeypatch):
    monkeypatch.chdir(h5files)  # the list names files relative to its folder / the cwd
    runs = []
    for _ in range(2):
        set_random_seed(5)
        layer, t = setup_layer(h5_text("list.txt", batch=3, shuffle=True))
        seq = []
        for _ in range(4):
            layer.forward([], t)
            seq += t[1].data.astype(int).tolist()
        runs.append(seq)
    assert runs[0] == runs[1]
    assert sorted(runs[0][:6]) == list(range(6)) and sorted(runs[0][6:]) == list(range(6))
    # files are not interleaved: each pass takes one file's rows together
    first = set(runs[0][:4]), set(runs[0][:2])
    assert first[0] == {0, 1, 2, 3} or first[1] == {4, 5}


def test_hdf5_errors(h5files, tmp_path):
    h5py = pytest.importorskip("h5py")
    (tmp_path / "empty.txt").write_text("\n")
    with pytest.raises(ValueError, match="at least 1 HDF5 filename"):
        make_layer(h5_text(tmp_path / "empty.txt")).setup([], tops(2))
    with h5py.File(tmp_path / "bad.h5", "w") as f:
        f["data"] = np.zeros((3, 2))
        f["label"] = np.zeros(2)
    (tmp_path / "bad.txt").write_text("bad.h5")
    with pytest.raises(ValueError, match="different numbers of rows"):
        make_layer(h5_text(tmp_path / "bad.txt")).setup([], tops(2))
    with h5py.File(tmp_path / "nolabel.h5", "w") as f:
        f["data"] = np.zeros((3, 2))
    (tmp_path / "nolabel.txt").write_text("nolabel.h5")
    with pytest.raises(ValueError, match="has no dataset 'label' \\(it has data\\)"):
        make_layer(h5_text(tmp_path / "nolabel.txt")).setup([], tops(2))
    (tmp_path / "missing.txt").write_text("nothere.h5")
    with pytest.raises(FileNotFoundError, match="HDF5 file 'nothere.h5' not found"):
        make_layer(h5_text(tmp_path / "missing.txt")).setup([], tops(2))


# --------------------------------------------------------------- MemoryData
MEM = ('name: "mem" type: "MemoryData" top: "data" top: "label" '
       "memory_data_param { batch_size: 2 channels: 1 height: 2 width: 3 }")


def test_memory_data_cycles_through_reset_arrays():
    layer, t = setup_layer(MEM)
    assert t[0].shape == (2, 1, 2, 3) and t[1].shape == (2,)
    data = np.arange(4 * 6, dtype=np.float32).reshape(4, 1, 2, 3)
    layer.reset(data, np.array([5, 6, 7, 8]))
    for rows in ([0, 1], [2, 3], [0, 1]):
        layer.forward([], t)
        np.testing.assert_array_equal(t[0].data, data[rows])
        assert t[1].shape == (2, 1, 1, 1)           # Caffe's Forward_cpu reshapes the label
        np.testing.assert_array_equal(t[1].data.ravel(), [5 + r for r in rows])
    data[...] = -1  # reset copied the arrays
    layer.forward([], t)
    assert (t[0].data >= 0).all()
    layer.set_input_arrays(data[:2], np.zeros((2, 1, 1, 1)))  # pycaffe's label layout
    layer.forward([], t)
    assert (t[0].data == -1).all() and (t[1].data == 0).all()


def test_memory_data_reset_errors():
    layer, t = setup_layer(MEM)
    with pytest.raises(RuntimeError, match="call reset\\(data, labels\\)"):
        layer.forward([], t)
    ok = np.zeros((4, 1, 2, 3))
    with pytest.raises(ValueError, match="multiple of batch size 2, got n = 3"):
        layer.reset(np.zeros((3, 1, 2, 3)), np.zeros(3))
    with pytest.raises(ValueError, match="non-zero multiple"):
        layer.reset(np.zeros((0, 1, 2, 3)), np.zeros(0))
    with pytest.raises(ValueError, match="takes \\(C, H, W\\) = \\(1, 2, 3\\)"):
        layer.reset(np.zeros((4, 1, 3, 2)), np.zeros(4))
    with pytest.raises(ValueError, match="must be 4-d"):
        layer.reset(np.zeros((4, 6)), np.zeros(4))
    with pytest.raises(ValueError, match="same first dimension \\(4 vs 2\\)"):
        layer.reset(ok, np.zeros(2))
    with pytest.raises(ValueError, match="labels array must be"):
        layer.reset(ok, np.zeros((4, 2)))
    bad = make_layer(MEM.replace("height: 2", "height: 0"))
    with pytest.raises(ValueError, match="must be specified and positive"):
        bad.setup([], tops(2))


def test_memory_data_add_datum_vector_and_batch_size():
    layer, t = setup_layer(MEM.replace("top: \"label\"", "top: \"label\" "
                                       "transform_param { scale: 2 }"))
    datums = [mio.array_to_datum(np.full((1, 2, 3), i, np.uint8), 10 + i) for i in range(2)]
    layer.add_datum_vector(datums)
    with pytest.raises(RuntimeError, match="until current data has been consumed"):
        layer.add_datum_vector(datums)
    with pytest.raises(RuntimeError, match="change batch_size"):
        layer.set_batch_size(1)
    layer.forward([], t)
    np.testing.assert_array_equal(t[0].data[:, 0, 0, 0], [0, 2])
    np.testing.assert_array_equal(t[1].data.ravel(), [10, 11])
    assert not layer.has_new_data
    with pytest.raises(ValueError, match="multiple of the batch size"):
        layer.add_datum_vector(datums[:1])
    layer.set_batch_size(1)
    layer.reset(np.ones((3, 1, 2, 3)), np.arange(3))
    layer.forward([], t)
    assert t[0].shape == (1, 1, 2, 3) and t[1].shape == (1, 1, 1, 1)
    assert t[1].data.ravel().tolist() == [0]


# ---------------------------------------------------------------------- GPU
@pytest.mark.gpu
def test_data_layers_gpu_match_cpu(cp, db, tmp_path):
    path, _ = db
    tr = "crop_size: 3 mirror: true mean_value: 5 scale: 0.25"
    results = []
    for xp in (np, cp):
        set_random_seed(3)
        layer, t = setup_layer(data_text(path, batch=4, transform=tr), phase=TRAIN, xp=xp)
        out = []
        for _ in range(2):
            layer.forward([], t)
            out.append((to_numpy(t[0].data).copy(), to_numpy(t[1].data).copy()))
        layer.close()
        layer.backward(t, [], [])
        results.append(out)
    for (d0, l0), (d1, l1) in zip(*results):
        np.testing.assert_allclose(d1, d0, rtol=1e-5, atol=0)
        np.testing.assert_array_equal(l1, l0)

    text = ('name: "d" type: "DummyData" top: "a" dummy_data_param { shape { dim: 3 dim: 4 } '
            'data_filler { type: "gaussian" std: 2 } }')
    vals = []
    for xp in (np, cp):
        set_random_seed(8)
        layer, t = setup_layer(text, n_top=1, xp=xp)
        layer.forward([], t)
        vals.append(to_numpy(t[0].data))
    np.testing.assert_allclose(vals[1], vals[0], rtol=1e-5)

    layer, t = setup_layer(MEM, xp=cp)
    data = np.random.default_rng(0).standard_normal((2, 1, 2, 3)).astype(np.float32)
    layer.reset(data, [1, 2])
    layer.forward([], t)
    np.testing.assert_allclose(to_numpy(t[0].data), data, rtol=1e-5)
    np.testing.assert_array_equal(to_numpy(t[1].data).ravel(), [1, 2])


def test_data_prefetch_thread_does_not_hold_up_exit(db):
    import os
    import subprocess
    import sys
    path, _ = db
    repo = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    script = (
        "import minicaffe.layers\n"
        "from minicaffe.blob import Blob\n"
        "from minicaffe.testing import make_layer\n"
        f"layer = make_layer({data_text(path, batch=2, prefetch=2)!r})\n"
        "tops = [Blob(), Blob()]\n"
        "layer.setup([], tops)\n"
        "layer.forward([], tops)\n"
        "print(int(tops[1].data[0]))\n")  # exits with the thread running and the layer alive
    env = dict(os.environ, PYTHONPATH=repo + os.pathsep + os.environ.get("PYTHONPATH", ""))
    r = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, env=env,
                       timeout=60)
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == "0"


def test_a_nets_data_source_errors_name_the_layer_once(db, tmp_path):
    """Built in a net, a missing source stays a FileNotFoundError and gains the net's prefix
    (the layer and its type, once), and each place looked at is listed once."""
    from minicaffe import caffe_pb2
    from minicaffe.net import Net
    from minicaffe.proto import parse_text
    path, _ = db
    text = data_text("nowhere_lmdb")
    param = parse_text(f"name: 'n' layer {{ {text} }}", caffe_pb2.NetParameter)
    with pytest.raises(FileNotFoundError) as info:
        Net(param, "TRAIN")
    msg = str(info.value)
    assert msg.count("layer 'data'") == 1 and "(type Data, bottoms: none)" in msg
    assert msg.count("nowhere_lmdb") == 2          # the name, and one place looked at
    leveldb = parse_text(f"name: 'n' layer {{ {data_text(path).replace('backend: LMDB', '')} }}",
                         caffe_pb2.NetParameter)
    with pytest.raises(ValueError) as info:
        Net(leveldb, "TRAIN")
    assert str(info.value).count("layer 'data'") == 1 and "LEVELDB" in str(info.value)
