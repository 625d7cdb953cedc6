"""LMDB and LevelDB against BVLC Caffe's own unit tests.

Mirrors ``src/caffe/test/test_db.cpp`` (DBTest, typed over LevelDB and LMDB) through
minicaffe's database classes: Caffe's ``db::GetDB(backend)->Open(source, READ)`` is
``LMDBReader`` / ``LevelDBReader``, ``Open(source, NEW)`` and ``Open(source, WRITE)`` are
``LMDBWriter`` / ``LevelDBWriter`` with ``mode="new"`` (the default) or ``"write"``;
``NewCursor`` is ``reader.cursor()`` (``seek_to_first``, ``next``, ``valid``, ``key``,
``value``) and a writer's ``put`` then ``commit`` is a ``Transaction``'s Put and Commit.

The fixture writes, as Caffe's SetUp, two records keyed ``cat.jpg`` and ``fish-bike.jpg``:
ReadImageToDatum of images of examples/images/cat.jpg's and fish-bike.jpg's sizes (3 x 360 x
480 and 3 x 323 x 481), labels 0 and 1, in one transaction.  The further cases follow
src/caffe/util/db_lmdb.cpp and db_leveldb.cpp (bytewise key order, what NEW, WRITE and READ
do with a missing or an existing database, uncommitted records).

Not ported: a TestGet (``cursor->Get(key)``) that some stored copies of this file have: a
fork's; upstream's Cursor has no Get.
"""
import numpy as np
import pytest

from minicaffe import io as mio
from minicaffe.proto import caffe_pb2
from minicaffe.tools.compute_image_mean import compute_image_mean
from minicaffe.tools.convert_imageset import read_image_to_datum

Image = pytest.importorskip("PIL.Image")
pytest.importorskip("lmdb")
pytest.importorskip("plyvel")

BACKENDS = {"leveldb": (mio.LevelDBReader, mio.LevelDBWriter),
            "lmdb": (mio.LMDBReader, mio.LMDBWriter)}
SIZES = {"cat.jpg": (360, 480), "fish-bike.jpg": (323, 481)}


@pytest.fixture(scope="module")
def root(tmp_path_factory):
    """examples/images/: the two JPEGs, from a seeded RNG at Caffe's images' sizes."""
    d = tmp_path_factory.mktemp("images")
    rng = np.random.default_rng(1701)
    for name, (h, w) in SIZES.items():
        Image.fromarray(rng.integers(0, 256, (h, w, 3), dtype=np.uint8)).save(d / name)
    return d


@pytest.fixture(params=sorted(BACKENDS))
def backend(request):
    return request.param


@pytest.fixture
def source(backend, root, tmp_path):
    """DBTest::SetUp: a NEW database with both images as datums, labels 0 and 1."""
    path = str(tmp_path / "db")
    with BACKENDS[backend][1](path) as db:
        for label, key in enumerate(SIZES):
            datum = read_image_to_datum(str(root / key), label, 0, 0, True)
            db.put(key, datum.SerializeToString())
        db.commit()
    return path


def parse(value):
    datum = caffe_pb2.Datum()
    datum.ParseFromString(value)
    return datum


def test_get_db(backend):
    """test_db.cpp DBTest.TestGetDB: a database of either backend can be had (the readers and
    writers of both exist, and the tools take both names); db.cpp GetDB's unknown backend is
    an error naming the choices."""
    reader, writer = BACKENDS[backend]
    assert callable(reader) and callable(writer)
    with pytest.raises(ValueError, match="unknown backend 'rocksdb'; choose lmdb or leveldb"):
        compute_image_mean("nowhere", backend="rocksdb")


def test_next(backend, source):
    """test_db.cpp DBTest.TestNext: a new cursor is valid, stays valid after one Next, and
    is past the end after the second."""
    with BACKENDS[backend][0](source) as db:
        cursor = db.cursor()
        assert cursor.valid
        cursor.next()
        assert cursor.valid
        cursor.next()
        assert not cursor.valid


def test_seek_to_first(backend, source):
    """test_db.cpp DBTest.TestSeekToFirst: after Next, SeekToFirst is back at cat.jpg, a
    3 x 360 x 480 datum."""
    with BACKENDS[backend][0](source) as db:
        cursor = db.cursor()
        cursor.next()
        cursor.seek_to_first()
        assert cursor.valid and cursor.key() == b"cat.jpg"
        datum = parse(cursor.value())
        assert (datum.channels, datum.height, datum.width) == (3, 360, 480)


def test_key_value(backend, source):
    """test_db.cpp DBTest.TestKeyValue: the records in key order with their datums, then the
    end."""
    with BACKENDS[backend][0](source) as db:
        cursor = db.cursor()
        for label, (key, (h, w)) in enumerate(SIZES.items()):
            assert cursor.valid and cursor.key() == key.encode()
            datum = parse(cursor.value())
            assert (datum.channels, datum.height, datum.width, datum.label) == (3, h, w, label)
            cursor.next()
        assert not cursor.valid
        with pytest.raises(ValueError, match="cursor is past the last record"):
            cursor.key()


def test_write(backend, source, root):
    """test_db.cpp DBTest.TestWrite: Open(WRITE) on the database, Put both keys with
    ReadFileToDatum's encoded datums, Commit; reading back, the records are replaced."""
    with BACKENDS[backend][1](source, mode="write") as db:
        for label, key in enumerate(SIZES):
            datum = caffe_pb2.Datum(data=(root / key).read_bytes(), label=label, encoded=True)
            db.put(key, datum.SerializeToString())
        db.commit()
    with BACKENDS[backend][0](source) as db:
        records = [(k, parse(v)) for k, v in db.items()]
    assert [k for k, _ in records] == [b"cat.jpg", b"fish-bike.jpg"]
    assert all(d.encoded for _, d in records) and [d.label for _, d in records] == [0, 1]
    assert [mio.datum_image(d).shape for _, d in records] == [(3, 360, 480), (3, 323, 481)]


def test_write_adds_records_and_a_failed_block_keeps_the_database(backend, source):
    """db::WRITE adds to the database; a ``with`` block that fails drops its own records only
    (a NEW database that fails is removed instead: test_io.py)."""
    with BACKENDS[backend][1](source, mode="write") as db:
        db.put("dog.jpg", b"x")
    with pytest.raises(RuntimeError, match="stop"):
        with BACKENDS[backend][1](source, mode="write") as db:
            db.put("emu.jpg", b"y")
            raise RuntimeError("stop")
    with BACKENDS[backend][0](source) as db:
        assert [k for k, _ in db.items()] == [b"cat.jpg", b"dog.jpg", b"fish-bike.jpg"]


def test_keys_come_back_in_bytewise_order(backend, tmp_path):
    """LMDB's default comparison and LevelDB's BytewiseComparator: keys in memcmp order
    (upper case before lower, a prefix before its extensions), whatever the Put order."""
    keys = [b"b", b"a", b"ab", b"B", b"00000010", b"00000002", b"\xff", b"a\x00"]
    path = str(tmp_path / "db")
    with BACKENDS[backend][1](path) as db:
        for i, k in enumerate(keys):
            db.put(k, bytes([i]))
    with BACKENDS[backend][0](path) as db:
        got = list(db.items())
        assert len(db) == len(keys)
    assert [k for k, _ in got] == sorted(keys)
    assert [v[0] for _, v in got] == [keys.index(k) for k in sorted(keys)]


@pytest.mark.parametrize("mode", ["new", "write"])
def test_open_modes_on_missing_and_existing_paths(backend, source, tmp_path, mode):
    """db_lmdb.cpp / db_leveldb.cpp Open: NEW refuses an existing path (LMDB's mkdir, LevelDB's
    error_if_exists); WRITE needs LMDB's folder but creates a missing LevelDB
    (create_if_missing = mode != READ); READ of a missing database is an error naming it."""
    reader, writer = BACKENDS[backend]
    missing = str(tmp_path / "missing")
    if mode == "new":
        with pytest.raises(FileExistsError, match="already exists"):
            writer(source)
        return
    if backend == "lmdb":
        with pytest.raises(FileNotFoundError, match="no such LMDB folder"):
            writer(missing, mode="write")
    else:
        writer(missing, mode="write").close()
        with reader(missing) as db:
            assert len(db) == 0 and not db.cursor().valid
    with pytest.raises((FileNotFoundError, ValueError), match="nope"):
        reader(str(tmp_path / "nope"))
    with pytest.raises(ValueError, match="unknown database mode 'read'"):
        writer(str(tmp_path / "x"), mode="read")


def test_uncommitted_records_are_not_in_the_database(tmp_path):
    """An LMDB Transaction's Puts are seen by readers only after Commit (LevelDB takes one
    handle per process, so a reader cannot open it while the writer is open)."""
    path = str(tmp_path / "db")
    db = mio.LMDBWriter(path)
    db.put("a", b"1")
    with mio.LMDBReader(path) as r:
        assert len(r) == 0 and not r.cursor().valid
    db.commit()
    db.put("b", b"2")
    with mio.LMDBReader(path) as r:
        assert list(r.items()) == [(b"a", b"1")]
    db.close()                      # close commits the rest
    with mio.LMDBReader(path) as r:
        assert list(r.items()) == [(b"a", b"1"), (b"b", b"2")]


def test_leveldb_write_while_a_reader_is_open_names_the_database(tmp_path):
    """LevelDB locks a database to one handle per process (Caffe's "Failed to open leveldb");
    the error says so.  (LMDB readers and writers may share a database.)"""
    path = str(tmp_path / "db")
    with mio.LevelDBWriter(path) as db:
        db.put("a", b"1")
    with mio.LevelDBReader(path):
        with pytest.raises(ValueError, match="Failed to open leveldb .*db for writing"):
            mio.LevelDBWriter(path, mode="write")
