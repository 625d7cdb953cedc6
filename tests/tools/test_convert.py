"""convert_imageset, compute_image_mean, make_digits and the bundled digits."""
import os
import subprocess
import sys

import numpy as np
import pytest

from minicaffe import io as mio
from minicaffe.datasets import DIGITS_TEST_SIZE, load_digits, split_digits
from minicaffe.tools.compute_image_mean import compute_image_mean
from minicaffe.tools.compute_image_mean import main as mean_main
from minicaffe.tools.convert_imageset import convert_imageset, main as convert_main, read_list
from minicaffe.tools.make_digits import make_digits

pytest.importorskip("lmdb")
REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

try:
    from PIL import Image
except ImportError:  # the .npy path is tested instead
    Image = None


def write_image(path, hwc):
    """A PNG through Pillow when it is there, else a .npy in Caffe's (C, H, W) order (BGR)."""
    if Image is not None:
        Image.fromarray(hwc).save(path)
        return path
    path = os.path.splitext(path)[0] + ".npy"
    np.save(path, np.ascontiguousarray(hwc[:, :, ::-1].transpose(2, 0, 1)))
    return path


@pytest.fixture
def imageset(tmp_path):
    """Five small RGB images under root/, listed with labels; returns (root with its trailing
    '/', as Caffe's ROOTFOLDER/, list, rgb images, listed paths)."""
    rng = np.random.default_rng(0)
    root = tmp_path / "root"
    (root / "sub dir").mkdir(parents=True)
    rgb = [rng.integers(0, 256, (3, 4, 3), dtype=np.uint8) for _ in range(5)]
    lines = []
    for i, im in enumerate(rgb):
        p = write_image(str(root / "sub dir" / f"im{i}.png"), im)
        lines.append(f"{os.path.relpath(p, root)} {i % 3}")
    listfile = tmp_path / "list.txt"
    listfile.write_text("\n".join(lines) + "\n\n")
    return str(root) + "/", listfile, rgb, [ln.rpartition(" ")[0] for ln in lines]


def test_read_list_splits_at_the_last_space(tmp_path):
    f = tmp_path / "l.txt"
    f.write_text("a b/c d.png 3\n\nx.png 0\n")
    assert read_list(f) == [("a b/c d.png", 3), ("x.png", 0)]
    f.write_text("x.png\n")
    with pytest.raises(ValueError, match="l.txt:1: expected 'relative/path label'"):
        read_list(f)


def test_convert_imageset_round_trip(imageset, tmp_path):
    root, listfile, rgb, rels = imageset
    n = convert_imageset(str(root), listfile, tmp_path / "db", verbose=False)
    assert n == 5
    images, labels, keys = mio.read_lmdb_arrays(tmp_path / "db")
    assert keys == [f"{i:08d}_{rel}" for i, rel in enumerate(rels)]  # Caffe's "%08d_%s"
    assert labels.tolist() == [0, 1, 2, 0, 1]
    assert images.dtype == np.uint8 and images.shape == (5, 3, 3, 4)
    for im, src in zip(images, rgb):
        # Caffe stores OpenCV's BGR channel order, (C, H, W)
        np.testing.assert_array_equal(im, src[:, :, ::-1].transpose(2, 0, 1))
    with pytest.raises(FileExistsError):
        convert_imageset(str(root), listfile, tmp_path / "db", verbose=False)


def test_convert_imageset_shuffle_is_seeded(imageset, tmp_path):
    root, listfile, _, rels = imageset
    convert_imageset(str(root), listfile, tmp_path / "a", shuffle=True, seed=3, verbose=False)
    convert_imageset(str(root), listfile, tmp_path / "b", shuffle=True, seed=3, verbose=False)
    _, la, ka = mio.read_lmdb_arrays(tmp_path / "a")
    _, lb, kb = mio.read_lmdb_arrays(tmp_path / "b")
    assert ka == kb and la.tolist() == lb.tolist()
    order = np.random.default_rng(3).permutation(5)
    assert ka == [f"{i:08d}_{rels[j]}" for i, j in enumerate(order)]


def test_convert_imageset_gray_resize_and_check_size(imageset, tmp_path):
    if Image is None:
        pytest.skip("gray conversion and resizing need Pillow")
    root, listfile, rgb, _ = imageset
    convert_imageset(str(root), listfile, tmp_path / "g", gray=True, resize_height=6,
                     resize_width=2, check_size=True, verbose=False)
    images, _, _ = mio.read_lmdb_arrays(tmp_path / "g")
    assert images.shape == (5, 1, 6, 2)
    convert_imageset(str(root), listfile, tmp_path / "g2", gray=True, verbose=False)
    gray, _, _ = mio.read_lmdb_arrays(tmp_path / "g2")
    # OpenCV's IMREAD_GRAYSCALE of a PNG: libpng's rgb_to_gray, 15-bit weights, truncated
    r, g, b = (rgb[0][..., i].astype(np.uint32) for i in range(3))
    expect = (9797 * r + 19234 * g + 3737 * b) >> 15
    np.testing.assert_array_equal(gray[0, 0], expect)
    # a differently sized image fails --check_size, and nothing is left behind
    Image.fromarray(np.zeros((5, 5, 3), np.uint8)).save(root + "odd.png")
    with open(listfile, "a") as f:
        f.write("odd.png 1\n")
    with pytest.raises(ValueError, match="Incorrect data field size 75 "):
        convert_imageset(str(root), listfile, tmp_path / "c", check_size=True, verbose=False)
    assert not (tmp_path / "c").exists()


def test_convert_imageset_skips_unreadable_files(imageset, tmp_path, capsys):
    root, listfile, _, _ = imageset
    with open(listfile, "a") as f:
        f.write("missing.npy 2\n")
    n = convert_imageset(str(root), listfile, tmp_path / "db", verbose=False)
    assert n == 5
    # Caffe's ReadImageToCVMat: LOG(ERROR), and the line is skipped (its index keeps its key)
    errors = [ln for ln in capsys.readouterr().err.splitlines() if ln.startswith("E")]
    assert len(errors) == 1 and f"] Could not open or find file {root}missing.npy" in errors[0]


def test_convert_imageset_npy_float_arrays(tmp_path):
    arr = np.linspace(0, 1, 12, dtype=np.float32).reshape(1, 3, 4)
    np.save(tmp_path / "f.npy", arr)
    (tmp_path / "l.txt").write_text("f.npy 4\n")
    convert_imageset(f"{tmp_path}/", tmp_path / "l.txt", tmp_path / "db", verbose=False)
    images, labels, _ = mio.read_lmdb_arrays(tmp_path / "db")
    assert images.dtype == np.float32 and labels.tolist() == [4]
    np.testing.assert_array_equal(images[0], arr)


def test_convert_and_mean_command_lines(imageset, tmp_path, capsys):
    root, listfile, rgb, _ = imageset
    assert convert_main([str(root) + "/", str(listfile), str(tmp_path / "db"), "--shuffle",
                         "--seed", "1"]) == 0
    assert convert_main([str(root), str(listfile), str(tmp_path / "db")]) == 1
    assert "already exists" in capsys.readouterr().err
    assert mean_main([str(tmp_path / "db"), str(tmp_path / "mean.binaryproto")]) == 0
    err = capsys.readouterr().err
    assert "Number of channels: 3" in err and "mean_value channel [2]" in err
    mean = mio.load_mean_file(tmp_path / "mean.binaryproto")
    bgr = np.stack([im[:, :, ::-1].transpose(2, 0, 1) for im in rgb]).astype(np.float32)
    np.testing.assert_allclose(mean[0], bgr.mean(axis=0), rtol=1e-6)
    assert mean_main([str(tmp_path / "nowhere")]) == 1


def test_compute_image_mean_matches_caffe_float32_sum(tmp_path):
    with mio.LMDBWriter(tmp_path / "db") as w:
        for i, v in enumerate((1, 2, 4)):
            datum = mio.array_to_datum(np.full((1, 1, 2), v, np.uint8))
            w.put(f"{i:08d}", datum.SerializeToString())
    mean = compute_image_mean(tmp_path / "db", verbose=False)
    assert mean.shape == (1, 1, 1, 2) and mean.dtype == np.float32
    assert mean[0, 0, 0, 0] == np.float32(7) / np.float32(3)


# ------------------------------------------------------------------ digits
def test_load_digits_shape_and_label_counts():
    images, labels = load_digits()
    assert images.shape == (1797, 1, 8, 8) and images.dtype == np.uint8
    assert labels.shape == (1797,)
    assert np.bincount(labels).tolist() == [178, 182, 177, 183, 181, 182, 181, 179, 174, 180]
    assert images.min() == 0 and images.max() == 255
    # 16 grey levels scaled by 16: multiples of 16, and 16 * 16 clipped to 255
    assert set(np.unique(images).tolist()) <= set(range(0, 256, 16)) | {255}


def test_split_digits_is_fixed_stratified_and_disjoint():
    _, labels = load_digits()
    train, test = split_digits(labels)
    assert len(train) == 1437 and len(test) == DIGITS_TEST_SIZE == 360
    assert not set(train.tolist()) & set(test.tolist())
    counts = np.bincount(labels[test], minlength=10)
    assert counts.sum() == 360 and counts.min() >= 34 and counts.max() <= 37
    train2, test2 = split_digits(labels)
    np.testing.assert_array_equal(train, train2)
    np.testing.assert_array_equal(test, test2)
    assert not np.array_equal(np.sort(split_digits(labels, seed=1)[1]), np.sort(test))
    assert not (np.diff(train) > 0).all()  # shuffled, not in file order


def test_make_digits_is_idempotent_and_forceable(tmp_path, capsys):
    out = tmp_path / "digits"
    paths = make_digits(out)
    images, labels = load_digits()
    train, test = split_digits(labels)
    tr_x, tr_y, tr_keys = mio.read_lmdb_arrays(paths["train_lmdb"])
    te_x, te_y, _ = mio.read_lmdb_arrays(paths["test_lmdb"])
    assert tr_x.shape == (1437, 1, 8, 8) and te_x.shape == (360, 1, 8, 8)
    np.testing.assert_array_equal(tr_x, images[train])
    np.testing.assert_array_equal(tr_y, labels[train])
    np.testing.assert_array_equal(te_y, labels[test])
    assert tr_keys[0] == f"00000000_digit{train[0]:04d}"
    mean = mio.load_mean_file(paths["mean.binaryproto"])
    np.testing.assert_allclose(mean[0], images[train].mean(axis=0), rtol=1e-5)
    size = sum(os.path.getsize(os.path.join(d, f)) for d, _, fs in os.walk(out) for f in fs)
    assert size < 1 << 20

    stamp = os.stat(os.path.join(paths["train_lmdb"], "data.mdb")).st_mtime_ns
    capsys.readouterr()
    make_digits(out)
    assert "already present" in capsys.readouterr().err
    assert os.stat(os.path.join(paths["train_lmdb"], "data.mdb")).st_mtime_ns == stamp
    os.remove(paths["mean.binaryproto"])  # a partial set is rebuilt
    make_digits(out, verbose=False)
    assert os.path.exists(paths["mean.binaryproto"])
    make_digits(out, force=True, verbose=False)
    np.testing.assert_array_equal(mio.read_lmdb_arrays(paths["train_lmdb"])[1], labels[train])


def test_make_digits_command_line(tmp_path):
    env = dict(os.environ, PYTHONPATH=REPO + os.pathsep + os.environ.get("PYTHONPATH", ""))
    cmd = [sys.executable, "-m", "minicaffe.tools.make_digits", "--out", str(tmp_path / "d")]
    r = subprocess.run(cmd, capture_output=True, text=True, env=env, cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    assert "wrote 1437 training and 360 test images" in r.stderr
    r = subprocess.run(cmd, capture_output=True, text=True, env=env, cwd=tmp_path)
    assert r.returncode == 0 and "already present" in r.stderr


def test_digits_train_a_data_layer(tmp_path):
    import minicaffe.layers  # noqa: F401  (registers the layer types)
    from minicaffe.blob import Blob
    from minicaffe.testing import make_layer
    paths = make_digits(tmp_path / "digits", verbose=False)
    layer = make_layer(
        f'name: "data" type: "Data" top: "data" top: "label" data_param {{ source: '
        f'"{paths["test_lmdb"]}" batch_size: 100 backend: LMDB }} transform_param {{ '
        f'scale: 0.00390625 mean_file: "{paths["mean.binaryproto"]}" }}', phase=1)
    tops = [Blob(name="data"), Blob(name="label")]
    layer.setup([], tops)
    for _ in range(4):  # 400 > 360: wraps around
        layer.forward([], tops)
    layer.close()
    assert tops[0].shape == (100, 1, 8, 8) and tops[1].shape == (100,)
    assert np.abs(tops[0].data).max() <= 1.0


def test_convert_and_mean_with_the_leveldb_backend(imageset, tmp_path, capsys):
    """-backend leveldb (Caffe's tools write and read it too): the same records in the same
    order as the LMDB, and the same mean."""
    pytest.importorskip("plyvel")
    root, listfile, _, _ = imageset
    for backend in ("lmdb", "leveldb"):
        assert convert_main([str(root), str(listfile), str(tmp_path / backend), "--seed", "1",
                             "--shuffle", "--backend", backend]) == 0
        assert mean_main([str(tmp_path / backend), str(tmp_path / f"{backend}.binaryproto"),
                          "--backend", backend]) == 0
    with mio.LMDBReader(tmp_path / "lmdb") as a, mio.LevelDBReader(tmp_path / "leveldb") as b:
        assert list(a.items()) == list(b.items())
    np.testing.assert_array_equal(mio.load_mean_file(tmp_path / "lmdb.binaryproto"),
                                  mio.load_mean_file(tmp_path / "leveldb.binaryproto"))
    assert mean_main([str(tmp_path / "lmdb"), "--backend", "leveldb"]) == 1
    assert "is not a LevelDB database (it holds an LMDB database: data.mdb)" in \
        capsys.readouterr().err


# ------------------------------------------- Caffe's flags, messages and encoded Datums
def glog_messages(err: str) -> list[str]:
    """The messages of the glog-shaped lines in ``err`` (the text after the ']')."""
    return [ln.split("] ", 1)[1] for ln in err.splitlines() if "] " in ln]


def test_convert_takes_gflags_spellings_and_exits_1_on_usage(imageset, tmp_path, capsys):
    """tools/convert_imageset.cpp reads gflags: -flag or --flag, =value or the next word,
    -flag=false and -noflag for booleans, flags after the arguments; a wrong argument count
    prints the usage and returns 1."""
    if Image is None:
        pytest.skip("resizing needs Pillow")
    root, listfile, _, rels = imageset
    assert convert_main(["-gray", "-resize_width=2", str(root), "--resize_height", "6",
                         str(listfile), str(tmp_path / "db"), "-shuffle=false", "-backend=lmdb",
                         "--check_size=true"]) == 0
    images, _, keys = mio.read_lmdb_arrays(tmp_path / "db")
    assert images.shape == (5, 1, 6, 2)
    assert keys == [f"{i:08d}_{rel}" for i, rel in enumerate(rels)]  # -shuffle=false
    assert convert_main(["-gray", "-nogray", str(root), str(listfile), str(tmp_path / "c")]) == 0
    assert mio.read_lmdb_arrays(tmp_path / "c")[0].shape == (5, 3, 3, 4)
    capsys.readouterr()
    assert convert_main([str(root), str(listfile)]) == 1              # argc != 4
    assert convert_main([str(root), str(listfile), str(tmp_path / "d"), "-nosuch"]) == 1
    assert "usage:" in capsys.readouterr().err


def test_convert_logs_caffes_lines(imageset, tmp_path, capsys):
    root, listfile, _, _ = imageset
    assert convert_main(["-shuffle", "-seed", "2", str(root), str(listfile),
                         str(tmp_path / "db")]) == 0
    err = capsys.readouterr().err
    assert glog_messages(err) == ["Shuffling data", "A total of 5 images.",
                                  f"Opened lmdb {tmp_path / 'db'}", "Processed 5 files."]
    assert all(ln[0] == "I" for ln in err.splitlines())               # LOG(INFO)


def test_convert_joins_rootfolder_as_a_string(imageset, tmp_path):
    """Caffe reads root_folder + path: a root without its '/' finds nothing (the error says
    why), and an empty root takes the list's paths as they are."""
    root, listfile, _, rels = imageset
    with pytest.raises(ValueError, match="joined to each path as a string.*end it with '/'"):
        convert_imageset(root.rstrip("/"), listfile, tmp_path / "a", verbose=False)
    absolute = tmp_path / "abs.txt"
    absolute.write_text("".join(f"{root}{rel} {i}\n" for i, rel in enumerate(rels)))
    assert convert_imageset("", absolute, tmp_path / "b", verbose=False) == 5
    _, _, keys = mio.read_lmdb_arrays(tmp_path / "b")
    assert keys[0] == f"00000000_{root}{rels[0]}"


def test_convert_encoded_stores_the_files_and_decodes_to_the_same_pixels(imageset, tmp_path,
                                                                          capsys):
    """-encoded: each Datum holds the PNG file's own bytes (encoded: true, no shape), as
    Caffe's ReadFileToDatum; the Data layer's decoding gives the pixels of the plain
    conversion, and compute_image_mean the same mean ("Decoding Datum" first)."""
    if Image is None:
        pytest.skip("encoded images need Pillow")
    root, listfile, _, rels = imageset
    assert convert_main(["-encoded", str(root), str(listfile), str(tmp_path / "enc")]) == 0
    convert_imageset(root, listfile, tmp_path / "raw", verbose=False)
    with mio.LMDBReader(tmp_path / "enc") as db:
        datums = [mio.parse_datum(v) for _, v in db.items()]
    for datum, rel in zip(datums, rels):
        assert datum.encoded and (datum.channels, datum.height, datum.width) == (0, 0, 0)
        assert datum.data == open(root + rel, "rb").read()
    raw, labels, _ = mio.read_lmdb_arrays(tmp_path / "raw")
    np.testing.assert_array_equal(np.stack([mio.datum_to_array(d) for d in datums]), raw)
    assert [d.label for d in datums] == labels.tolist()
    capsys.readouterr()
    assert mean_main([str(tmp_path / "enc"), str(tmp_path / "enc.binaryproto")]) == 0
    assert "Decoding Datum" in glog_messages(capsys.readouterr().err)
    mean_main([str(tmp_path / "raw"), str(tmp_path / "raw.binaryproto")])
    np.testing.assert_array_equal(mio.load_mean_file(tmp_path / "enc.binaryproto"),
                                  mio.load_mean_file(tmp_path / "raw.binaryproto"))


def test_convert_encode_type_reencodes(imageset, tmp_path, capsys):
    """-encode_type implies -encoded (with Caffe's line); a resized image, or one whose
    extension is not the encoding, is re-encoded; -check_size cannot check encoded data."""
    if Image is None:
        pytest.skip("encoded images need Pillow")
    root, listfile, _, _ = imageset
    assert convert_main(["-encode_type", "png", "-gray", "-resize_height", "6",
                         "-resize_width", "2", root, str(listfile), str(tmp_path / "p")]) == 0
    assert "encode_type specified, assuming encoded=true." in capsys.readouterr().err
    with mio.LMDBReader(tmp_path / "p") as db:
        datums = [mio.parse_datum(v) for _, v in db.items()]
    convert_imageset(root, listfile, tmp_path / "raw", gray=True, resize_height=6,
                     resize_width=2, verbose=False)
    raw, _, _ = mio.read_lmdb_arrays(tmp_path / "raw")
    assert all(d.encoded and d.data.startswith(b"\x89PNG") for d in datums)
    np.testing.assert_array_equal(np.stack([mio.datum_to_array(d) for d in datums]), raw)
    assert convert_main(["-encode_type=jpg", root, str(listfile), str(tmp_path / "j")]) == 0
    with mio.LMDBReader(tmp_path / "j") as db:
        assert all(mio.parse_datum(v).data.startswith(b"\xff\xd8") for _, v in db.items())
    capsys.readouterr()
    assert convert_main(["-encoded", "-check_size", root, str(listfile),
                         str(tmp_path / "c")]) == 1
    assert "-check_size cannot check encoded images" in capsys.readouterr().err


def test_compute_image_mean_logs_caffes_lines(tmp_path, capsys):
    """Caffe's order and words: Processed, Write to, Number of channels, then per channel
    'mean_value channel [c]:v' (no space after the colon) with a float32 sum over the
    channel divided by H * W; -backend as gflags spells it."""
    values = np.array([[[[0.1, 7.0], [200.3, 1e-3]], [[1.0, 2.0], [3.0, 4.0]]]], np.float32)
    with mio.LMDBWriter(tmp_path / "db") as w:
        for i in range(2):
            w.put(f"{i:08d}", mio.array_to_datum(values[0] * (i + 1)).SerializeToString())
    out = tmp_path / "m.binaryproto"
    assert mean_main(["-backend=lmdb", str(tmp_path / "db"), str(out)]) == 0
    msgs = glog_messages(capsys.readouterr().err)
    mean = mio.load_mean_file(out)
    sums = [np.float32(0)] * 2
    for c in range(2):
        for v in mean[0, c].ravel():
            sums[c] = np.float32(sums[c] + v)
    assert msgs == [f"Opened lmdb {tmp_path / 'db'}", "Starting Iteration",
                    "Processed 2 files.", f"Write to {out}", "Number of channels: 2",
                    f"mean_value channel [0]:{float(sums[0] / np.float32(4)):.6g}",
                    f"mean_value channel [1]:{float(sums[1] / np.float32(4)):.6g}"]
    assert msgs[-1] == "mean_value channel [1]:3.75"
    assert mean_main([str(tmp_path / "db"), str(out), "extra"]) == 1    # argc > 3: usage
