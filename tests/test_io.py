"""minicaffe.io: Datum and BlobProto conversions, mean files, LMDB reading and writing."""
import io as pyio
import os
import shutil

import numpy as np
import pytest

from minicaffe import io as mio
from minicaffe.proto import caffe_pb2

lmdb = pytest.importorskip("lmdb")


# ------------------------------------------------------------------ Datum
def test_datum_uint8_round_trip():
    arr = np.arange(2 * 3 * 4, dtype=np.uint8).reshape(2, 3, 4)
    d = mio.array_to_datum(arr, label=7)
    assert (d.channels, d.height, d.width, d.label) == (2, 3, 4, 7)
    assert d.data == arr.tobytes() and len(d.float_data) == 0
    back = mio.datum_to_array(mio.parse_datum(d.SerializeToString()))
    assert back.dtype == np.uint8
    np.testing.assert_array_equal(back, arr)


def test_datum_float_round_trip_and_2d():
    arr = np.linspace(-1, 1, 12).reshape(3, 4)
    d = mio.array_to_datum(arr)
    assert (d.channels, d.height, d.width) == (1, 3, 4)
    assert len(d.data) == 0 and len(d.float_data) == 12
    back = mio.datum_to_array(d)
    # pycaffe's datum_to_array: np.array(datum.float_data).astype(float), so float64
    assert back.dtype == np.float64 and back.shape == (1, 3, 4)
    np.testing.assert_array_equal(back[0], arr.astype(np.float32))
    # what the Data layer and compute_image_mean read: Caffe's float32
    assert mio.datum_image(d).dtype == np.float32
    np.testing.assert_array_equal(mio.datum_image(d), back)


def test_datum_errors():
    with pytest.raises(ValueError, match=r"\(C, H, W\)"):
        mio.array_to_datum(np.zeros((1, 2, 3, 4), np.uint8))
    d = caffe_pb2.Datum(channels=1, height=2, width=2, data=b"abc")
    with pytest.raises(ValueError, match="holds 3 bytes, expected 4"):
        mio.datum_to_array(d)
    d = caffe_pb2.Datum(channels=1, height=2, width=2)
    with pytest.raises(ValueError, match="float_data"):
        mio.datum_to_array(d)


def test_encoded_datum_decodes_to_bgr():
    Image = pytest.importorskip("PIL.Image")
    rgb = np.zeros((2, 3, 3), np.uint8)
    rgb[..., 0] = 200  # red
    rgb[0, 0, 2] = 50  # a touch of blue at (0, 0)
    buf = pyio.BytesIO()
    Image.fromarray(rgb).save(buf, format="PNG")
    d = caffe_pb2.Datum(data=buf.getvalue(), encoded=True, label=1)
    chw = mio.datum_to_array(d)
    assert chw.shape == (3, 2, 3)
    np.testing.assert_array_equal(chw[2], rgb[..., 0])  # R is the last channel (BGR)
    np.testing.assert_array_equal(chw[0], rgb[..., 2])
    gray = mio.datum_to_array(d, force_gray=True)
    assert gray.shape == (1, 2, 3)
    with pytest.raises(ValueError, match="both force_color and force_gray"):
        mio.datum_to_array(d, force_color=True, force_gray=True)


# -------------------------------------------------------------- BlobProto
def test_blobproto_round_trip_shape_and_legacy():
    arr = np.random.default_rng(0).standard_normal((2, 3, 4)).astype(np.float32)
    p = mio.array_to_blobproto(arr, diff=2 * arr)
    assert list(p.shape.dim) == [2, 3, 4]
    np.testing.assert_array_equal(mio.blobproto_to_array(p), arr)
    np.testing.assert_array_equal(mio.blobproto_to_array(p, return_diff=True), 2 * arr)
    q = mio.array_to_blobproto(arr, legacy=True)
    assert not q.HasField("shape")
    assert (q.num, q.channels, q.height, q.width) == (1, 2, 3, 4)
    assert mio.blobproto_to_array(q).shape == (1, 2, 3, 4)


def test_blobproto_double_data_and_count_error():
    p = caffe_pb2.BlobProto()
    p.shape.dim.extend([2])
    p.double_data.extend([1.5, 2.5])
    a = mio.blobproto_to_array(p)
    assert a.dtype == np.float64 and a.tolist() == [1.5, 2.5]
    p.double_data.append(3.0)
    with pytest.raises(ValueError, match="holds 3 values, expected 2"):
        mio.blobproto_to_array(p)


def test_mean_file_round_trip(tmp_path):
    mean = np.arange(12, dtype=np.float32).reshape(3, 2, 2) / 7
    path = tmp_path / "mean.binaryproto"
    mio.save_mean_file(path, mean)
    # Caffe's compute_image_mean writes the legacy 4-d fields
    proto = mio.read_blobproto(path)
    assert (proto.num, proto.channels, proto.height, proto.width) == (1, 3, 2, 2)
    back = mio.load_mean_file(path)
    assert back.shape == (1, 3, 2, 2)
    np.testing.assert_array_equal(back[0], mean)
    with pytest.raises(ValueError, match=r"\(C, H, W\) or \(1, C, H, W\)"):
        mio.save_mean_file(path, np.zeros((2, 3, 2, 2)))


# ------------------------------------------------------------------- LMDB
def _write(path, n, shape=(1, 2, 2)):
    with mio.LMDBWriter(path) as db:
        for i in range(n):
            arr = np.full(shape, i, np.uint8)
            db.put(f"{i:08d}_item{i}", mio.array_to_datum(arr, i).SerializeToString())


def test_lmdb_round_trip_in_key_order(tmp_path):
    path = tmp_path / "db"
    with mio.LMDBWriter(path) as db:
        for i in (3, 1, 2, 0):  # written out of order; read in key order
            db.put(f"{i:08d}_x", mio.array_to_datum(np.full((1, 1, 2), i, np.uint8), i)
                   .SerializeToString())
    images, labels, keys = mio.read_lmdb_arrays(path)
    assert keys == [f"{i:08d}_x" for i in range(4)]
    assert labels.tolist() == [0, 1, 2, 3]
    assert images.shape == (4, 1, 1, 2) and images[:, 0, 0, 0].tolist() == [0, 1, 2, 3]
    with mio.LMDBReader(path) as db:
        assert len(db) == 4


def test_lmdb_cursor_wraps_around_like_caffe(tmp_path):
    path = tmp_path / "db"
    _write(path, 3)
    with mio.LMDBReader(path) as db:
        c = db.cursor()
        seen = []
        for _ in range(7):
            seen.append(mio.parse_datum(c.value()).label)
            c.advance_wrapping()
        assert seen == [0, 1, 2, 0, 1, 2, 0]
        assert c.wraps == 2
        c.seek_to_first()
        assert c.key() == b"00000000_item0"
        for _ in range(3):
            c.next()
        assert not c.valid
        with pytest.raises(ValueError, match="past the last record"):
            c.value()


def test_lmdb_writer_grows_the_map(tmp_path):
    path = tmp_path / "big"
    big = np.zeros((1, 100, 100), np.uint8)
    with mio.LMDBWriter(path, map_size=64 * 1024) as db:
        for i in range(40):  # ~400 KB of values into a 64 KB map
            db.put(f"{i:08d}", mio.array_to_datum(big, i).SerializeToString())
            if i % 10 == 9:
                db.commit()
    with mio.LMDBReader(path) as r:
        assert len(r) == 40


def test_lmdb_writer_refuses_existing_and_cleans_up_on_error(tmp_path):
    path = tmp_path / "db"
    _write(path, 1)
    with pytest.raises(FileExistsError, match="already exists"):
        mio.LMDBWriter(path)
    bad = tmp_path / "bad"
    with pytest.raises(RuntimeError):
        with mio.LMDBWriter(bad) as db:
            db.put("k", b"v")
            raise RuntimeError("conversion failed")
    assert not bad.exists()


def test_lmdb_two_readers_share_one_environment(tmp_path):
    # py-lmdb refuses to open one environment twice in a process; Caffe's train
    # and test nets may read one database: the readers share it.
    path = tmp_path / "db"
    _write(path, 2)
    a = mio.LMDBReader(path)
    b = mio.LMDBReader(str(path) + "/")
    ca, cb = a.cursor(), b.cursor()
    cb.next()
    assert mio.parse_datum(ca.value()).label == 0
    assert mio.parse_datum(cb.value()).label == 1
    a.close()
    assert mio.parse_datum(cb.value()).label == 1  # b still works after a closed
    b.close()
    b.close()  # idempotent
    with pytest.raises(ValueError, match="closed"):
        b.cursor()


def test_lmdb_rewritten_database_is_reopened(tmp_path):
    path = tmp_path / "db"
    _write(path, 2)
    old = mio.LMDBReader(path)
    shutil.rmtree(path)
    _write(path, 5)
    with mio.LMDBReader(path) as new:
        assert len(new) == 5
    old.close()


def test_lmdb_reader_errors(tmp_path):
    with pytest.raises(FileNotFoundError, match="not an LMDB database"):
        mio.LMDBReader(tmp_path / "missing")
    empty = tmp_path / "empty"
    with mio.LMDBWriter(empty):
        pass
    with pytest.raises(ValueError, match="holds no records"):
        mio.read_lmdb_arrays(empty)


# ------------------------------------------------------------------- paths
def test_resolve_path(tmp_path, monkeypatch):
    (tmp_path / "proto").mkdir()
    (tmp_path / "proto" / "mean.binaryproto").write_bytes(b"")
    monkeypatch.chdir(tmp_path)
    assert mio.resolve_path("proto/mean.binaryproto") == "proto/mean.binaryproto"
    got = mio.resolve_path("mean.binaryproto", source_dir=str(tmp_path / "proto"))
    assert os.path.samefile(got, tmp_path / "proto" / "mean.binaryproto")
    with pytest.raises(FileNotFoundError) as e:
        mio.resolve_path("nope.bin", source_dir=str(tmp_path / "proto"), what="mean_file",
                         where="layer 'data' (Data)")
    msg = str(e.value)
    assert "layer 'data' (Data)" in msg and "mean_file 'nope.bin' not found" in msg
    assert str(tmp_path / "proto" / "nope.bin") in msg


def test_resize_inter_linear_takes_two_taps_per_axis():
    """OpenCV's INTER_LINEAR: source x = (i + 0.5) * in / out - 0.5, clamped, two neighbours,
    also when shrinking (Pillow's BILINEAR would average the whole area)."""
    from minicaffe.io import resize_inter_linear
    row = np.array([[0, 100, 200, 40]], np.uint8)
    np.testing.assert_array_equal(resize_inter_linear(row, 1, 2), [[50, 120]])   # x = 0.5, 2.5
    np.testing.assert_array_equal(resize_inter_linear(row[:, :2], 1, 4), [[0, 25, 75, 100]])
    img = np.arange(24, dtype=np.uint8).reshape(2, 4, 3)
    assert resize_inter_linear(img, 5, 3).shape == (5, 3, 3)
    with pytest.raises(ValueError, match="uint8"):
        resize_inter_linear(img.astype(np.float32), 2, 2)


def test_resize_inter_linear_of_an_image_data_sized_image():
    """ImageData with new_height/new_width resizes every image of every batch: a 300x280
    image to 256x256 took 38 s as one three-operand einsum (Caffe's imagenet_val.prototxt
    of examples/feature_extraction never finished a batch of 50); as two GEMMs it takes
    milliseconds (no timing asserted here: speed is for benchmarks), and gives the pixels
    of the two-tap formula."""
    from minicaffe.io import resize_inter_linear
    rng = np.random.default_rng(0)
    a = rng.integers(0, 256, (300, 280, 3)).astype(np.uint8)
    got = resize_inter_linear(a, 256, 256)
    # spot-check pixels against the formula: two taps per axis, centres aligned
    for y, x in [(0, 0), (255, 255), (100, 37), (17, 201)]:
        sy = min(max((y + 0.5) * 300 / 256 - 0.5, 0), 299)
        sx = min(max((x + 0.5) * 280 / 256 - 0.5, 0), 279)
        y0, x0 = int(np.floor(sy)), int(np.floor(sx))
        y1, x1 = min(y0 + 1, 299), min(x0 + 1, 279)
        fy, fx = sy - y0, sx - x0
        f = a.astype(np.float64)
        ref = ((1 - fy) * ((1 - fx) * f[y0, x0] + fx * f[y0, x1])
               + fy * ((1 - fx) * f[y1, x0] + fx * f[y1, x1]))
        assert np.abs(got[y, x].astype(int) - np.rint(ref).astype(int)).max() <= 1


def test_resize_inter_linear_against_opencv():
    from minicaffe.io import resize_inter_linear
    cv2 = pytest.importorskip("cv2")
    rng = np.random.default_rng(0)
    for _ in range(50):
        h, w, oh, ow = (int(v) for v in rng.integers(1, 30, 4))
        a = rng.integers(0, 256, (h, w, 3)).astype(np.uint8)
        ref = cv2.resize(a, (ow, oh), interpolation=cv2.INTER_LINEAR)
        got = resize_inter_linear(a, oh, ow)
        assert np.abs(ref.astype(int) - got.astype(int)).max() <= 1     # OpenCV's fixed point
