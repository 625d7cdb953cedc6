"""Data I/O in Caffe's formats: Datum records, BlobProto mean files, LMDB.

* Datum <-> NumPy: a Datum holds one image as ``(C, H, W)`` uint8 bytes in
  ``data``, or as floats in ``float_data``, plus an integer ``label``
  (``caffe/util/io.cpp``, pycaffe's ``caffe.io.array_to_datum``).  Encoded
  Datums (a PNG/JPEG file in ``data``) are decoded through Pillow, colour
  images into OpenCV's BGR channel order as Caffe's ``DecodeDatumToCVMat``.
* Mean files: a binary BlobProto of shape ``(1, C, H, W)`` (``.binaryproto``,
  written by ``compute_image_mean``).
* LMDB: read-only databases with a cursor that walks the records in key
  order and wraps around at the end, as Caffe's ``db_lmdb.cpp`` and
  ``DataLayer::Next``; a writer that commits in batches and grows the map
  when it fills.

``lmdb`` is imported lazily, so that the framework imports without it; the
error says which extra to install.

LMDB forbids opening one environment twice in a process (py-lmdb refuses
outright), while Caffe happily gives a train net and a test net two Data
layers on one database.  Read environments are therefore shared: one per
database directory, reference counted, each reader with its own read-only
transaction and cursor.
"""
from __future__ import annotations

import io as _pyio
import os
import shutil
import threading

import numpy as np

from .blob import proto_shape
from .proto import caffe_pb2, read_binary, write_binary

LMDB_HINT = "pip install 'minicaffe[data]'"


# ------------------------------------------------------------------ Datum
def array_to_datum(arr, label=None):
    """A Datum holding ``arr`` of shape ``(C, H, W)`` (or ``(H, W)``: one channel).

    uint8 arrays go to the ``data`` bytes, anything else to ``float_data``
    (as pycaffe's ``array_to_datum``).
    """
    arr = np.asarray(arr)
    if arr.ndim == 2:
        arr = arr[np.newaxis]
    if arr.ndim != 3:
        raise ValueError(f"array_to_datum: need a (C, H, W) or (H, W) array, got shape {arr.shape}")
    datum = caffe_pb2.Datum()
    datum.channels, datum.height, datum.width = (int(d) for d in arr.shape)
    if arr.dtype == np.uint8:
        datum.data = np.ascontiguousarray(arr).tobytes()
    else:
        datum.float_data.extend(np.asarray(arr, dtype=np.float32).ravel().tolist())
    if label is not None:
        datum.label = int(label)
    return datum


def datum_to_array(datum, force_color: bool = False, force_gray: bool = False) -> np.ndarray:
    """The ``(C, H, W)`` array of a Datum: uint8 for byte data, float32 for ``float_data``.

    Encoded Datums are decoded (Pillow); ``force_color``/``force_gray``
    choose 3 or 1 channels as TransformationParameter's fields of those names.
    """
    if datum.encoded:
        return decode_image_bytes(datum.data, force_color=force_color, force_gray=force_gray)
    c, h, w = datum.channels, datum.height, datum.width
    n = c * h * w
    if len(datum.data):
        if len(datum.data) != n:
            raise ValueError(
                f"Datum of shape ({c}, {h}, {w}) holds {len(datum.data)} bytes, expected {n}")
        return np.frombuffer(datum.data, dtype=np.uint8).reshape(c, h, w)
    if len(datum.float_data) != n:
        raise ValueError(
            f"Datum of shape ({c}, {h}, {w}) holds {len(datum.float_data)} float_data values "
            f"and no byte data, expected {n}")
    return np.asarray(datum.float_data, dtype=np.float32).reshape(c, h, w)


def parse_datum(value: bytes):
    """A Datum from its serialized bytes (an LMDB value)."""
    datum = caffe_pb2.Datum()
    datum.ParseFromString(value)
    return datum


# ------------------------------------------------------------------ images
def require_pillow():
    """The PIL.Image module, or an ImportError that says how to get it."""
    try:
        from PIL import Image
    except ImportError as e:  # pragma: no cover - depends on the environment
        raise ImportError(
            "reading or writing PNG/JPEG images needs Pillow: pip install pillow "
            f"(or {LMDB_HINT})") from e
    return Image


def pil_to_array(img, is_color: bool = True) -> np.ndarray:
    """A Pillow image as a ``(C, H, W)`` uint8 array in Caffe's channel order.

    ``is_color``: 3 channels in BGR order (OpenCV's ``IMREAD_COLOR``, which
    Caffe uses), else 1 grey channel (``IMREAD_GRAYSCALE``).
    """
    if is_color:
        hwc = np.asarray(img.convert("RGB"), dtype=np.uint8)[:, :, ::-1]  # RGB -> BGR
        return np.ascontiguousarray(hwc.transpose(2, 0, 1))
    return np.asarray(img.convert("L"), dtype=np.uint8)[np.newaxis].copy()


def decode_image_bytes(data: bytes, force_color: bool = False, force_gray: bool = False):
    """Decode an encoded image (``Datum.encoded``) to ``(C, H, W)`` uint8.

    Without forcing, the image keeps its own channel count (OpenCV's
    ``IMREAD_ANYCOLOR``, Caffe's ``DecodeDatumToCVMatNative``).
    """
    if force_color and force_gray:
        raise ValueError("cannot set both force_color and force_gray")
    Image = require_pillow()
    img = Image.open(_pyio.BytesIO(data))
    if force_color:
        return pil_to_array(img, is_color=True)
    if force_gray:
        return pil_to_array(img, is_color=False)
    return pil_to_array(img, is_color=img.mode not in ("L", "1", "I", "I;16", "F"))


# --------------------------------------------------------------- BlobProto
def array_to_blobproto(arr, diff=None, legacy: bool = False):
    """A BlobProto holding ``arr`` (float32 data).

    ``legacy``: write the deprecated num/channels/height/width fields
    (padded to 4-d) instead of ``shape``, as Caffe's ``compute_image_mean``.
    """
    arr = np.asarray(arr)
    proto = caffe_pb2.BlobProto()
    if legacy:
        if arr.ndim > 4:
            raise ValueError(f"legacy BlobProto holds at most 4 axes, got shape {arr.shape}")
        n, c, h, w = (1,) * (4 - arr.ndim) + tuple(int(d) for d in arr.shape)
        proto.num, proto.channels, proto.height, proto.width = n, c, h, w
    else:
        proto.shape.dim.extend(int(d) for d in arr.shape)
    proto.data.extend(np.asarray(arr, dtype=np.float32).ravel().tolist())
    if diff is not None:
        proto.diff.extend(np.asarray(diff, dtype=np.float32).ravel().tolist())
    return proto


def blobproto_to_array(proto, return_diff: bool = False) -> np.ndarray:
    """The data (or diff) of a BlobProto as an array of its shape.

    float32, or float64 when the proto holds ``double_data``/``double_diff``.
    """
    shape = proto_shape(proto)
    doubles, floats = ((proto.double_diff, proto.diff) if return_diff
                       else (proto.double_data, proto.data))
    arr = (np.asarray(doubles, dtype=np.float64) if len(doubles)
           else np.asarray(floats, dtype=np.float32))
    count = int(np.prod(shape)) if shape else 1
    if arr.size != count:
        raise ValueError(f"BlobProto of shape {tuple(shape)} holds {arr.size} values, "
                         f"expected {count}")
    return arr.reshape(shape)


def read_blobproto(path):
    """Read a binary BlobProto file (``.binaryproto``)."""
    return read_binary(path, caffe_pb2.BlobProto)


def write_blobproto(path, proto):
    """Write a BlobProto in the binary wire format (atomically)."""
    write_binary(proto, path)


def load_mean_file(path) -> np.ndarray:
    """The mean image of a ``.binaryproto`` file as stored (usually ``(1, C, H, W)``)."""
    return blobproto_to_array(read_blobproto(path))


def save_mean_file(path, mean):
    """Write a mean image ``(C, H, W)`` or ``(1, C, H, W)`` as Caffe's
    ``compute_image_mean`` does: a legacy 4-d BlobProto, float32 data."""
    mean = np.asarray(mean)
    if mean.ndim == 3:
        mean = mean[np.newaxis]
    if mean.ndim != 4 or mean.shape[0] != 1:
        raise ValueError(f"a mean image is (C, H, W) or (1, C, H, W), got shape {mean.shape}")
    write_blobproto(path, array_to_blobproto(mean, legacy=True))


# ------------------------------------------------------------------- LMDB
def require_lmdb():
    """The lmdb module, or an ImportError that says which extra installs it."""
    try:
        import lmdb
    except ImportError as e:  # pragma: no cover - depends on the environment
        raise ImportError(f"LMDB support needs the lmdb package: {LMDB_HINT}") from e
    return lmdb


_ENV_LOCK = threading.Lock()
_READ_ENVS: dict = {}  # realpath of the database folder -> _SharedEnv


def _env_key(path) -> str:
    return os.path.realpath(os.fspath(path))


def _file_id(key: str):
    st = os.stat(os.path.join(key, "data.mdb"))
    return (st.st_dev, st.st_ino)


class _SharedEnv:
    """A read-only environment shared by every reader of one database in this process."""

    def __init__(self, env, key, file_id):
        self.env = env
        self.key = key
        self.file_id = file_id
        self.refs = 0


def _acquire_read_env(path) -> _SharedEnv:
    """The shared read-only environment of the database folder ``path`` (one more user)."""
    lmdb = require_lmdb()
    key = _env_key(path)
    if not os.path.isdir(key) or not os.path.exists(os.path.join(key, "data.mdb")):
        raise FileNotFoundError(f"{path}: not an LMDB database (no data.mdb in that folder)")
    with _ENV_LOCK:
        shared = _READ_ENVS.get(key)
        # A database rewritten since it was opened is new files: open it afresh
        # (readers of the old files keep theirs until they close).
        if shared is None or shared.file_id != _file_id(key):
            # lock=False: nobody writes the database while we read it, and
            # without lock files a read-only folder works and two environments
            # cannot fight over POSIX locks.
            env = lmdb.open(key, readonly=True, lock=False, readahead=False, subdir=True,
                            max_readers=512)
            shared = _READ_ENVS[key] = _SharedEnv(env, key, _file_id(key))
        shared.refs += 1
        return shared


def _release_read_env(shared: _SharedEnv):
    with _ENV_LOCK:
        shared.refs -= 1
        if shared.refs <= 0:
            if _READ_ENVS.get(shared.key) is shared:
                del _READ_ENVS[shared.key]
            shared.env.close()


class LMDBCursor:
    """A cursor over one read-only transaction (Caffe's ``LMDBCursor``).

    ``seek_to_first``/``next``/``valid``/``key``/``value`` follow Caffe;
    :meth:`advance_wrapping` is ``DataLayer::Next``: step, and restart from
    the first record at the end.  A cursor may move between threads (py-lmdb
    opens environments with ``MDB_NOTLS``), but only one thread may use it at
    a time: the Data layer hands it to its prefetch thread.
    """

    def __init__(self, env, path: str = ""):
        self.path = path
        self._txn = env.begin(write=False, buffers=False)
        self._cursor = self._txn.cursor()
        self._valid = False
        self.wraps = 0  # times the cursor restarted from the first record
        self.seek_to_first()

    def seek_to_first(self):
        self._valid = self._cursor.first()

    def next(self):
        self._valid = self._cursor.next()

    @property
    def valid(self) -> bool:
        return self._valid

    def key(self) -> bytes:
        self._check()
        return self._cursor.key()

    def value(self) -> bytes:
        self._check()
        return self._cursor.value()

    def _check(self):
        if not self._valid:
            raise ValueError(f"LMDB {self.path}: cursor is past the last record (or the database "
                             "is empty)")

    def advance_wrapping(self):
        """Step to the next record, restarting from the first after the last."""
        self.next()
        if not self._valid:
            self.seek_to_first()
            self.wraps += 1

    def close(self):
        if self._txn is not None:
            self._cursor.close()
            self._txn.abort()
            self._txn = None


class LMDBReader:
    """A read-only LMDB database (Caffe's ``db::LMDB`` opened with ``READ``).

    Usage::

        with LMDBReader("data/digits/train_lmdb") as db:
            cursor = db.cursor()
            datum = parse_datum(cursor.value())
    """

    def __init__(self, path):
        self.path = os.fspath(path)
        self._shared = _acquire_read_env(self.path)
        self._cursors: list[LMDBCursor] = []

    def __len__(self) -> int:
        return int(self._shared.env.stat()["entries"])

    def cursor(self) -> LMDBCursor:
        if self._shared is None:
            raise ValueError(f"LMDB {self.path} is closed")
        c = LMDBCursor(self._shared.env, self.path)
        self._cursors.append(c)
        return c

    def items(self):
        """Every (key, value) pair in key order, each value as bytes."""
        c = self.cursor()
        try:
            while c.valid:
                yield c.key(), c.value()
                c.next()
        finally:
            c.close()

    def close(self):
        """Close the cursors made here and release the shared environment."""
        if self._shared is None:
            return
        for c in self._cursors:
            c.close()
        self._cursors.clear()
        shared, self._shared = self._shared, None
        _release_read_env(shared)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


class LMDBWriter:
    """Create a new LMDB database (Caffe's ``db::LMDB`` opened with ``NEW``).

    ``put`` buffers records; ``commit`` writes them in one transaction (the
    tools commit every 1000 records, as Caffe's).  The map starts small and
    doubles whenever a transaction does not fit (Caffe's ``LMDBTransaction``
    does the same since 2016), so the file on disk stays as small as the data.
    """

    def __init__(self, path, map_size: int = 1 << 24):
        lmdb = require_lmdb()
        self.path = os.fspath(path)
        if os.path.exists(self.path):
            raise FileExistsError(f"{self.path}: already exists (Caffe refuses to overwrite a "
                                  "database; remove it first)")
        os.makedirs(self.path)
        self._lmdb = lmdb
        self._env = lmdb.open(self.path, map_size=int(map_size), subdir=True, readahead=False)
        self._pending: list[tuple[bytes, bytes]] = []
        self.count = 0

    @staticmethod
    def _bytes(x) -> bytes:
        return x.encode("utf-8") if isinstance(x, str) else bytes(x)

    def put(self, key, value):
        self._pending.append((self._bytes(key), self._bytes(value)))

    def commit(self):
        if not self._pending:
            return
        while True:
            try:
                with self._env.begin(write=True) as txn:
                    for k, v in self._pending:
                        txn.put(k, v)
                break
            except self._lmdb.MapFullError:
                # the transaction was aborted; grow the map and redo it
                self._env.set_mapsize(self._env.info()["map_size"] * 2)
        self.count += len(self._pending)
        self._pending.clear()

    def close(self):
        if self._env is not None:
            self.commit()
            self._env.close()
            self._env = None

    def __enter__(self):
        return self

    def __exit__(self, exc_type, *exc):
        if exc_type is None:
            self.close()
            return
        # a failed conversion leaves no half-written database behind
        self._pending.clear()
        self.close()
        shutil.rmtree(self.path, ignore_errors=True)


def read_lmdb_arrays(path, limit: int | None = None):
    """All Datums of an LMDB as ``(images (N, C, H, W), labels (N,) int64, keys)``.

    For small databases (tests, the digits set); the Data layer streams instead.
    """
    images, labels, keys = [], [], []
    with LMDBReader(path) as db:
        for k, v in db.items():
            d = parse_datum(v)
            images.append(datum_to_array(d))
            labels.append(d.label)
            keys.append(k.decode("utf-8", "replace"))
            if limit is not None and len(keys) >= limit:
                break
    if not images:
        raise ValueError(f"LMDB {path} holds no records")
    shapes = {a.shape for a in images}
    if len(shapes) != 1:
        raise ValueError(f"LMDB {path}: records have different shapes {sorted(shapes)}")
    return np.stack(images), np.asarray(labels, dtype=np.int64), keys


# ------------------------------------------------------------------- paths
def resolve_path(path, source_dir=None, what: str = "file", where: str = "") -> str:
    """Find a file named in a prototxt as Caffe does, relative to the working
    directory, else relative to the prototxt's folder ``source_dir``.

    Raises FileNotFoundError naming ``where`` (e.g. ``layer 'data' (Data)``)
    and every place looked at.
    """
    path = os.fspath(path)
    if not path:
        raise ValueError(f"{where}: no {what} given")
    if os.path.exists(path):
        return path
    tried = [os.path.abspath(path)]
    if source_dir and not os.path.isabs(path):
        alt = os.path.join(source_dir, path)
        if os.path.exists(alt):
            return alt
        tried.append(os.path.abspath(alt))
    prefix = f"{where}: " if where else ""
    raise FileNotFoundError(f"{prefix}{what} {path!r} not found (looked at {', '.join(tried)})")
