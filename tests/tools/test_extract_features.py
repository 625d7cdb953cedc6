"""extract_features: the features it writes are those of a direct forward of the same batches,
under Caffe's keys, in Caffe's Datum layout and commit cadence; its argument checks."""
import os
import subprocess
import sys

import numpy as np
import pytest

from minicaffe import io as mio
from minicaffe.net import TEST, Net
from minicaffe.tools import extract_features as ef

pytest.importorskip("lmdb")
REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

NET = """name: "features"
layer {{ name: "data" type: "Data" top: "data" top: "label"
  transform_param {{ scale: 0.00390625 }}
  data_param {{ source: "{source}" batch_size: 4 backend: LMDB }} }}
layer {{ name: "conv" type: "Convolution" bottom: "data" top: "conv"
  convolution_param {{ num_output: 2 kernel_size: 3 weight_filler {{ type: "gaussian" }} }} }}
layer {{ name: "ip" type: "InnerProduct" bottom: "conv" top: "ip"
  inner_product_param {{ num_output: 3 weight_filler {{ type: "gaussian" }} }} }}
layer {{ name: "relu" type: "ReLU" bottom: "ip" top: "ip" }}
"""

DUMMY = """name: "dummy"
layer { name: "x" type: "DummyData" top: "x"
  dummy_data_param { shape { dim: 500 dim: 2 } data_filler { type: "constant" value: 1 } } }
"""


@pytest.fixture
def trained(tmp_path):
    """(prototxt, .caffemodel): the net above over a 10-image LMDB, with weights saved by
    minicaffe that its fillers would not give."""
    rng = np.random.default_rng(0)
    with mio.LMDBWriter(tmp_path / "images") as db:
        for i in range(10):
            image = rng.integers(0, 256, (1, 4, 4), dtype=np.uint8)
            db.put(f"{i:08d}", mio.array_to_datum(image, i % 3).SerializeToString())
    proto = tmp_path / "net.prototxt"
    proto.write_text(NET.format(source=tmp_path / "images"))
    net = Net(str(proto), TEST)
    for blobs in net.params.values():
        for blob in blobs:
            blob.data[...] = rng.normal(size=blob.shape)
    weights = tmp_path / "net.caffemodel"
    net.save(str(weights))
    return proto, weights


def reference(proto, weights, batches, blobs):
    """Each blob's data after each of ``batches`` forward passes, stacked: (batches * N, ...)."""
    net = Net(str(proto), TEST, weights=str(weights))
    out = {b: [] for b in blobs}
    for _ in range(batches):
        net.forward()
        for b in blobs:
            out[b].append(np.array(net.blobs[b].data))
    return {b: np.concatenate(v) for b, v in out.items()}


def read_db(path, backend="lmdb"):
    """[(key, Datum), ...] in key order."""
    reader = mio.LevelDBReader if backend == "leveldb" else mio.LMDBReader
    with reader(path) as db:
        return [(k.decode(), mio.parse_datum(v)) for k, v in db.items()]


def check_db(path, expected, backend="lmdb"):
    """The database holds one Datum per image of ``expected`` (N, ...), keyed as Caffe keys
    them, with the blob's legacy axes and its values in float_data."""
    records = read_db(path, backend)
    assert [k for k, _ in records] == [f"{i:010d}" for i in range(len(expected))]
    shape = (expected.shape[1:] + (1, 1, 1))[:3]
    for (_, datum), image in zip(records, expected):
        assert (datum.channels, datum.height, datum.width) == shape
        assert not datum.data and not datum.HasField("label") and not datum.encoded
        np.testing.assert_array_equal(np.asarray(datum.float_data, np.float32), image.ravel())


@pytest.mark.parametrize("backend", ["lmdb", "leveldb"])
def test_features_equal_a_direct_forward_of_the_same_batches(trained, tmp_path, backend):
    if backend == "leveldb":
        pytest.importorskip("plyvel")
    proto, weights = trained
    dbs = [str(tmp_path / f"conv_{backend}"), str(tmp_path / f"ip_{backend}")]
    # 3 batches of 4 from 10 images: the third wraps around to the first two, as Caffe's
    counts = ef.extract_features(str(weights), str(proto), "conv,ip", ",".join(dbs), 3,
                                 backend, verbose=False)
    assert counts == [12, 12]
    want = reference(proto, weights, 3, ["conv", "ip"])
    assert want["conv"].shape == (12, 2, 2, 2) and want["ip"].shape == (12, 3)
    assert not np.array_equal(want["ip"][0], want["ip"][4])   # the passes saw other images
    check_db(dbs[0], want["conv"], backend)                   # (C, H, W) = (2, 2, 2)
    check_db(dbs[1], want["ip"], backend)                     # (3, 1, 1), after the ReLU


def test_weights_are_copied_from_the_caffemodel_and_from_hdf5(trained, tmp_path):
    pytest.importorskip("h5py")
    proto, weights = trained
    h5 = tmp_path / "net.caffemodel.h5"
    Net(str(proto), TEST, weights=str(weights)).save_hdf5(str(h5))
    assert ef.main([str(h5), str(proto), "ip", str(tmp_path / "ip"), "2", "lmdb"]) == 0
    check_db(tmp_path / "ip", reference(proto, weights, 2, ["ip"])["ip"])
    # without the weights the fillers' parameters would give other features
    plain = Net(str(proto), TEST)
    plain.forward()
    assert not np.allclose(plain.blobs["ip"].data, reference(proto, weights, 1, ["ip"])["ip"])


def test_key_format_is_caffes_zero_padded_index():
    assert ef.feature_key(0) == "0000000000"
    assert ef.feature_key(42) == "0000000042"
    assert ef.feature_key(1234567890) == "1234567890"
    assert ef.split_names("a,b") == ["a", "b"] and ef.split_names("fc7") == ["fc7"]


@pytest.mark.parametrize("batches, commits", [(5, [1000, 1000, 500]), (4, [1000, 1000])])
def test_commits_every_1000_images_and_the_rest_at_the_end(tmp_path, monkeypatch, batches,
                                                           commits):
    proto = tmp_path / "dummy.prototxt"
    proto.write_text(DUMMY)
    Net(str(proto), TEST).save(str(tmp_path / "w.caffemodel"))
    sizes = []
    commit = mio.LMDBWriter.commit

    def counting(self):
        sizes.append(len(self._pending))
        commit(self)

    monkeypatch.setattr(mio.LMDBWriter, "commit", counting)
    ef.extract_features(str(tmp_path / "w.caffemodel"), str(proto), "x", str(tmp_path / "x"),
                        batches, "lmdb", verbose=False)
    assert [s for s in sizes if s] == commits
    records = read_db(tmp_path / "x")
    assert len(records) == 500 * batches and records[-1][0] == f"{500 * batches - 1:010d}"
    assert list(records[0][1].float_data) == [1.0, 1.0]


def test_unknown_blob_is_named_and_no_database_is_made(trained, tmp_path, capsys):
    proto, weights = trained
    with pytest.raises(ValueError, match=r"Unknown feature blob name 'fc7' in the network "
                                         r".*net.prototxt \(its blobs: data, label, conv, ip\)"):
        ef.extract_features(str(weights), str(proto), "ip,fc7", "a,b", 1, "lmdb",
                            verbose=False)
    assert ef.main([str(weights), str(proto), "fc7", str(tmp_path / "a"), "1", "lmdb"]) == 1
    assert "Unknown feature blob name 'fc7'" in capsys.readouterr().err
    assert not os.path.exists(tmp_path / "a")


def test_blob_and_database_counts_must_match(trained, tmp_path, capsys):
    proto, weights = trained
    assert ef.main([str(weights), str(proto), "conv,ip", str(tmp_path / "a"), "1", "lmdb"]) == 1
    err = capsys.readouterr().err
    assert "the number of blob names (2: conv,ip) and dataset names (1:" in err
    assert "must be equal" in err and not os.path.exists(tmp_path / "a")


def test_unknown_database_type(trained, tmp_path, capsys):
    proto, weights = trained
    assert ef.main([str(weights), str(proto), "ip", str(tmp_path / "a"), "1", "rocksdb"]) == 1
    assert "unknown database backend 'rocksdb' (known: lmdb, leveldb)" in capsys.readouterr().err


def test_databases_are_new_and_a_failed_run_leaves_none(trained, tmp_path):
    proto, weights = trained
    (tmp_path / "taken").mkdir()
    with pytest.raises(FileExistsError, match="taken: already exists"):
        ef.extract_features(str(weights), str(proto), "conv,ip",
                            f"{tmp_path / 'fresh'},{tmp_path / 'taken'}", 1, "lmdb",
                            verbose=False)
    assert not os.path.exists(tmp_path / "fresh") and os.path.isdir(tmp_path / "taken")


def test_gpu_without_a_device_runs_on_the_cpu(trained, tmp_path, monkeypatch, capsys):
    proto, weights = trained
    monkeypatch.setattr(ef, "gpu_available", lambda: False)
    assert ef.main([str(weights), str(proto), "ip", str(tmp_path / "ip"), "1", "lmdb",
                    "GPU", "0"]) == 0
    err = capsys.readouterr().err
    assert "GPU mode asked for, but no CUDA device is visible: running on the CPU" in err
    assert "Successfully extracted the features!" in err
    check_db(tmp_path / "ip", reference(proto, weights, 1, ["ip"])["ip"])


def test_module_runs_with_caffes_argument_order(trained, tmp_path):
    proto, weights = trained
    r = subprocess.run([sys.executable, "-m", "minicaffe.tools.extract_features", str(weights),
                        str(proto), "ip", str(tmp_path / "ip"), "1", "lmdb", "CPU"],
                       capture_output=True, text=True, cwd=REPO)
    assert r.returncode == 0, r.stderr
    assert "Using CPU" in r.stderr
    assert "Extracted features of 4 query images for feature blob ip" in r.stderr
    assert len(read_db(tmp_path / "ip")) == 4


def test_a_wrong_command_line_is_status_1(tmp_path, capsys):
    """Caffe's extract_features: fewer than six arguments print the usage and return 1."""
    assert ef.main(["w.caffemodel", "net.prototxt", "ip", str(tmp_path / "ip"), "1"]) == 1
    assert "usage:" in capsys.readouterr().err
    assert not os.listdir(tmp_path)
