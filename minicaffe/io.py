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

import importlib
import io as _pyio
import itertools
import os
import shutil
import threading

import numpy as np

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
    """pycaffe's ``caffe.io.datum_to_array``: the ``(C, H, W)`` array of a Datum, uint8 for
    byte data and float64 for ``float_data`` (pycaffe's ``np.array(datum.float_data)
    .astype(float)``).  Beyond pycaffe, an encoded Datum is decoded (:func:`datum_image`)."""
    a = datum_image(datum, force_color, force_gray)
    return a.astype(np.float64) if a.dtype == np.float32 else a


def datum_image(datum, force_color: bool = False, force_gray: bool = False) -> np.ndarray:
    """The ``(C, H, W)`` array of a Datum as Caffe's readers take it: uint8 for byte data,
    float32 for ``float_data`` (Caffe's Dtype).

    Encoded Datums are decoded (Pillow); ``force_color``/``force_gray``
    choose 3 or 1 channels as TransformationParameter's fields of those names.
    """
    _expect_message(datum, caffe_pb2.Datum, "a database value (datum = caffe_pb2.Datum(); "
                                            "datum.ParseFromString(value))")
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


def resize_inter_linear(img, height: int, width: int) -> np.ndarray:
    """OpenCV's ``cv::resize(src, dst, Size(width, height))`` with its default INTER_LINEAR,
    which Caffe's ``ReadImageToCVMat`` uses (convert_imageset, ImageData): each output
    pixel centre maps to the source coordinate ``(i + 0.5) * in / out - 0.5``, clamped to
    the image, and is interpolated from its two neighbours per axis, also when shrinking
    (no averaging over the area, unlike Pillow's BILINEAR).  ``img``: uint8 ``(H, W)`` or
    ``(H, W, C)``; returns the same layout, rounded.  OpenCV computes in 11-bit fixed
    point, so a value may differ from it by 1."""
    src = np.asarray(img)
    if src.dtype != np.uint8 or src.ndim not in (2, 3):
        raise ValueError(f"resize_inter_linear takes a uint8 (H, W) or (H, W, C) image, got "
                         f"{src.dtype} {src.shape}")
    if height < 1 or width < 1:
        raise ValueError(f"resize to {height}x{width}: both sizes must be positive")

    def matrix(n_out: int, n_in: int) -> np.ndarray:
        """(n_out, n_in) interpolation weights of one axis."""
        x = np.clip((np.arange(n_out) + 0.5) * (n_in / n_out) - 0.5, 0, n_in - 1)
        lo = np.floor(x).astype(np.int64)
        hi = np.minimum(lo + 1, n_in - 1)
        frac = x - lo
        m = np.zeros((n_out, n_in))
        np.add.at(m, (np.arange(n_out), lo), 1 - frac)
        np.add.at(m, (np.arange(n_out), hi), frac)
        return m

    a = src.astype(np.float64).reshape(src.shape[0], src.shape[1], -1)
    # one axis at a time, two GEMMs: a three-operand einsum without optimize= runs as one
    # nested loop over (y, x, h, w, c), 38 s for a 300x280 image to 256x256
    rows = np.tensordot(matrix(height, src.shape[0]), a, axes=(1, 0))          # (y, w, c)
    out = np.tensordot(rows, matrix(width, src.shape[1]), axes=(1, 1))         # (y, c, x)
    out = out.transpose(0, 2, 1)                                               # (y, x, c)
    out = np.clip(np.rint(out), 0, 255).astype(np.uint8)
    return out[:, :, 0] if src.ndim == 2 else out


def _is_16_bit_gray(img) -> bool:
    # Pillow opens a 16-bit grey PNG as "I;16" (older versions: "I")
    return img.mode.startswith("I;16") or (img.mode == "I" and img.format == "PNG")


def _gray_like_opencv(img) -> np.ndarray:
    """The ``(H, W)`` uint8 grey image that OpenCV's ``imread``/``imdecode`` with
    ``IMREAD_GRAYSCALE`` gives for ``img`` (a Pillow image as opened, ``format`` still set):

    * grey already: as it is (a grey+alpha PNG drops its alpha);
    * a colour JPEG: its luma plane, which libjpeg returns for ``JCS_GRAYSCALE`` output;
      :func:`open_image` asks Pillow for it with ``draft("L")`` before decoding (from the
      decoded RGB, the luma of clipped pixels is off by up to 10 levels);
    * a colour (or palette) PNG: libpng's ``png_set_rgb_to_gray(0.299, 0.587)``, 15-bit
      coefficients 9797, 19234, 3737, truncated;
    * anything else: the BGR-to-grey rule of OpenCV's BMP and TIFF readers, 14-bit
      coefficients 4899, 9617, 1868, rounded (Pillow's ``convert("L")`` uses 16-bit ones,
      off by one in places).  OpenCV's WebP reader goes through ``cvtColor``, whose rule
      changed between versions (4.x: 15-bit coefficients); a grey WebP may differ by one.
    """
    if img.mode in ("L", "LA"):
        return np.asarray(img.getchannel("L"), dtype=np.uint8)
    if img.mode == "1":
        return np.asarray(img.convert("L"), dtype=np.uint8)
    rgb = np.asarray(img.convert("RGB"), dtype=np.uint32)
    r, g, b = rgb[..., 0], rgb[..., 1], rgb[..., 2]
    if img.format == "PNG":
        return ((9797 * r + 19234 * g + 3737 * b) >> 15).astype(np.uint8)
    return ((4899 * r + 9617 * g + 1868 * b + (1 << 13)) >> 14).astype(np.uint8)


def pil_to_array(img, is_color: bool = True) -> np.ndarray:
    """A Pillow image as a ``(C, H, W)`` uint8 array in Caffe's channel order, as OpenCV's
    8-bit ``imread`` (which Caffe's ReadImageToCVMat and DecodeDatumToCVMat use) gives it.

    ``is_color``: 3 channels in BGR order (``IMREAD_COLOR``), else 1 grey channel
    (``IMREAD_GRAYSCALE``: see :func:`_gray_like_opencv`).  A 16-bit grey image keeps its
    high byte (OpenCV reads PNGs through libpng's ``png_set_strip_16``; Pillow's own
    conversion would clip every value above 255 to 255).
    """
    if _is_16_bit_gray(img):
        high = (np.asarray(img).astype(np.uint32) >> 8).astype(np.uint8)
        return high[np.newaxis].repeat(3 if is_color else 1, axis=0)
    if is_color:
        hwc = np.asarray(img.convert("RGB"), dtype=np.uint8)[:, :, ::-1]  # RGB -> BGR
        return np.ascontiguousarray(hwc.transpose(2, 0, 1))
    return np.ascontiguousarray(_gray_like_opencv(img)[np.newaxis])


def open_image(source, is_color=None):
    """Open an image file (a path or a file object) with Pillow, decoded.  ``is_color``
    False: a colour JPEG is decoded to its luma plane alone, as OpenCV's
    ``IMREAD_GRAYSCALE`` asks libjpeg to (``draft("L")``; other formats ignore it)."""
    Image = require_pillow()
    img = Image.open(source)
    if is_color is False and img.format == "JPEG" and img.mode in ("RGB", "YCbCr"):
        img.draft("L", img.size)
    img.load()
    return img


def _is_gray_mode(img) -> bool:
    return img.mode in ("L", "1", "I", "F") or img.mode.startswith("I;16")


def decode_image_bytes(data: bytes, force_color: bool = False, force_gray: bool = False):
    """Decode an encoded image (``Datum.encoded``) to ``(C, H, W)`` uint8.

    Without forcing, the image keeps its own channel count (OpenCV's
    ``IMREAD_ANYCOLOR``, Caffe's ``DecodeDatumToCVMatNative``): 1 for a grey image, 3 for
    colour, palette and grey+alpha ones (OpenCV decodes those as 4 channels).
    """
    if force_color and force_gray:
        raise ValueError("cannot set both force_color and force_gray")
    img = open_image(_pyio.BytesIO(data), is_color=False if force_gray else None)
    if force_color:
        return pil_to_array(img, is_color=True)
    if force_gray:
        return pil_to_array(img, is_color=False)
    return pil_to_array(img, is_color=not _is_gray_mode(img))


# --------------------------------------------------------------- BlobProto
def read_list(listfile):
    """``[(path, label), ...]`` from a list file of ``path label`` lines (the label after
    the last space, as Caffe's ``find_last_of(' ')``; blank lines are skipped)."""
    lines = []
    with open(listfile) as f:
        for lineno, raw in enumerate(f, 1):
            line = raw.strip()
            if not line:
                continue
            path, sep, label = line.rpartition(" ")
            path = path.rstrip()
            try:
                if not sep or not path:
                    raise ValueError
                lines.append((path, int(label)))
            except ValueError:
                raise ValueError(f"{listfile}:{lineno}: expected 'relative/path label', got "
                                 f"{line!r}") from None
    return lines


def load_image_chw(path, is_color: bool = True, resize_height: int = 0,
                   resize_width: int = 0):
    """One image as a ``(C, H, W)`` array, as Caffe's ``ReadImageToCVMat`` gives it to
    convert_imageset, ImageData and WindowData: a file Pillow reads (colour as BGR, or one
    grey channel without ``is_color``; resized with OpenCV's INTER_LINEAR when both sizes are
    given), or a ``.npy`` array (C, H, W) or (H, W), used as it is."""
    if path.lower().endswith(".npy"):
        arr = np.load(path, allow_pickle=False)
        if arr.ndim == 2:
            arr = arr[np.newaxis]
        if arr.ndim != 3:
            raise ValueError(f"{path}: a .npy image must be (C, H, W) or (H, W), got {arr.shape}")
        if not is_color and arr.shape[0] != 1:
            raise ValueError(f"{path}: --gray needs 1-channel .npy arrays, got {arr.shape[0]} "
                             "channels")
        if resize_height > 0 and resize_width > 0 and arr.shape[1:] != (resize_height,
                                                                         resize_width):
            raise ValueError(f"{path}: .npy arrays are not resized; it is {arr.shape[1:]}, "
                             f"asked for {(resize_height, resize_width)}")
        return arr
    with open_image(path, is_color) as img:
        chw = pil_to_array(img, is_color=is_color)
    if resize_height > 0 and resize_width > 0:
        hwc = resize_inter_linear(chw.transpose(1, 2, 0), resize_height, resize_width)
        chw = np.ascontiguousarray(hwc.transpose(2, 0, 1))
    return chw


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


def _expect_message(obj, message_cls, parse_hint: str):
    """pycaffe's proto helpers read fields of a parsed message; given the bytes it was read
    from, or a file's path, they failed with an AttributeError ('bytes' object has no
    attribute 'encoded').  A TypeError that says what to pass instead."""
    full_name = getattr(getattr(obj, "DESCRIPTOR", None), "full_name", None)
    if full_name == message_cls.DESCRIPTOR.full_name:   # another build's caffe_pb2 too
        return
    name = message_cls.DESCRIPTOR.name
    if isinstance(obj, (str, os.PathLike)):
        how = (f"the path {os.fspath(obj)!r}: read the file first (blob = caffe_pb2.{name}(); "
               f"blob.ParseFromString(open(path, 'rb').read()))")
    elif isinstance(obj, (bytes, bytearray, memoryview)):
        how = f"bytes: parse {parse_hint}"
    else:
        how = f"a {type(obj).__name__}"
    raise TypeError(f"expected a caffe_pb2.{name}, got {how}")


def blobproto_to_array(proto, return_diff: bool = False) -> np.ndarray:
    """The data (or diff) of a BlobProto as an array of its shape.

    float64, as pycaffe's ``np.array(blob.data)`` of the proto's (Python float) values;
    from ``double_data``/``double_diff`` where the proto holds those (pycaffe reads only
    ``data``/``diff``).
    """
    _expect_message(proto, caffe_pb2.BlobProto, "them (blob = caffe_pb2.BlobProto(); "
                                                "blob.ParseFromString(data))")
    # pycaffe's blobproto_to_array (python/caffe/io.py): the legacy 4-D fields where any
    # is set, else ``shape.dim``, which is empty for a proto without a shape: one value then
    # gives a 0-d array and more values are refused (numpy's reshape raises ValueError)
    if any(proto.HasField(f) for f in ("num", "channels", "height", "width")):
        shape = (proto.num, proto.channels, proto.height, proto.width)
    else:
        shape = tuple(int(d) for d in proto.shape.dim)
    doubles, floats = ((proto.double_diff, proto.diff) if return_diff
                       else (proto.double_data, proto.data))
    arr = np.asarray(doubles if len(doubles) else floats, dtype=np.float64)
    count = int(np.prod(shape))  # 1 for the 0-d shape ()
    if arr.size != count:
        raise ValueError(f"BlobProto of shape {tuple(shape)} holds {arr.size} values, "
                         f"expected {count}")
    return arr.reshape(shape)


def arraylist_to_blobprotovector_str(arraylist) -> bytes:
    """pycaffe's ``arraylist_to_blobprotovector_str``: the arrays as one serialized
    BlobProtoVector (each a BlobProto with ``shape``, as :func:`array_to_blobproto`)."""
    vec = caffe_pb2.BlobProtoVector()
    vec.blobs.extend(array_to_blobproto(arr) for arr in arraylist)
    return vec.SerializeToString()


def blobprotovector_str_to_arraylist(s: bytes) -> list[np.ndarray]:
    """pycaffe's ``blobprotovector_str_to_arraylist``: the arrays of a serialized
    BlobProtoVector, in order (each as :func:`blobproto_to_array` reads it)."""
    vec = caffe_pb2.BlobProtoVector()
    vec.ParseFromString(s)
    return [blobproto_to_array(blob) for blob in vec.blobs]


def read_blobproto(path):
    """Read a binary BlobProto file (``.binaryproto``)."""
    return read_binary(path, caffe_pb2.BlobProto)


def write_blobproto(path, proto):
    """Write a BlobProto in the binary wire format (atomically)."""
    write_binary(proto, path)


def load_mean_file(path) -> np.ndarray:
    """The mean image of a ``.binaryproto`` file as stored (usually ``(1, C, H, W)``),
    float32 as Caffe's C++ readers (Blob::FromProto) hold it."""
    return blobproto_to_array(read_blobproto(path)).astype(np.float32)


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
            env = _open_read_env(lmdb, key)
            shared = _READ_ENVS[key] = _SharedEnv(env, key, _file_id(key))
        shared.refs += 1
        return shared


_READER_IDS = itertools.count()


def _open_read_env(lmdb, key: str):
    """A read-only, lock-free environment on the database folder ``key``, invisible to the
    lmdb package's "already open in this process" guard.

    The script itself may hold that database open with the lmdb package, before the net
    reads it (it wrote the records with ``array_to_datum`` and never closed ``env``) or
    after (it reads the labels back while the net runs).  Caffe's C++ reader is unknown to
    the Python package, so both work with Caffe; recent lmdb packages (py-lmdb >= 2)
    refuse a second environment on the same files in one process, a guard against two
    environments sharing the POSIX locks of the lock file.  Ours takes no locks
    (``lock=False``: it never opens the lock file), so that hazard does not apply: it is
    opened with the package's file identity (``lmdb._envid.env_keys``) answering a key
    of this environment alone, so that it neither meets the script's environment nor
    keeps the script from opening its own.  Without a writer it reads what the script
    committed; a write that the script makes while the net reads is not seen
    consistently, as with any lock-free reader."""
    def open_env():
        return lmdb.open(key, readonly=True, lock=False, readahead=False, subdir=True,
                         max_readers=512)
    try:
        envid = importlib.import_module(lmdb.__name__ + "._envid")
    except ImportError:                  # an lmdb package without that guard
        envid = None
    if not callable(getattr(envid, "env_keys", None)):
        return open_env()
    own_key = ("minicaffe-lock-free-reader", key, next(_READER_IDS))
    shared_keys = envid.env_keys
    envid.env_keys = lambda path, subdir: (own_key,)
    try:
        return open_env()
    finally:
        envid.env_keys = shared_keys


def _release_read_env(shared: _SharedEnv, registry=None):
    """One user fewer of a shared database handle (LMDB's, or with ``registry`` LevelDB's);
    the last closes it."""
    registry = _READ_ENVS if registry is None else registry
    with _ENV_LOCK:
        shared.refs -= 1
        if shared.refs <= 0:
            if registry.get(shared.key) is shared:
                del registry[shared.key]
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


WRITE_MODES = ("new", "write")     # Caffe's db::Mode NEW and WRITE (READ: the readers)


class _NewDatabase:
    """What Caffe's LMDB and LevelDB writers share.  ``mode`` is Caffe's ``db::Mode``:
    ``"new"`` (NEW, the tools' mode: the path must not exist) or ``"write"`` (WRITE: records
    are added to an existing database, a key already there is overwritten).  ``put`` buffers
    records and ``commit`` writes them (a subclass's: Caffe's Transaction), ``close``
    commits, and a ``with`` block that fails leaves no half-written new database behind (a
    database opened with ``"write"`` keeps what it had; the block's records are dropped)."""

    def __init__(self, path, mode: str = "new"):
        self.path = os.fspath(path)
        if mode not in WRITE_MODES:
            raise ValueError(f"{self.path}: unknown database mode {mode!r} (choose "
                             f"{' or '.join(WRITE_MODES)}; readers open for reading)")
        self.mode = mode
        if mode == "new" and os.path.exists(self.path):
            raise FileExistsError(f"{self.path}: already exists (Caffe refuses to overwrite a "
                                  "database; remove it first, or open it with mode 'write')")
        self._pending: list[tuple[bytes, bytes]] = []
        self.count = 0

    @staticmethod
    def _bytes(x) -> bytes:
        return x.encode("utf-8") if isinstance(x, str) else bytes(x)

    def put(self, key, value):
        self._pending.append((self._bytes(key), self._bytes(value)))

    def __enter__(self):
        return self

    def __exit__(self, exc_type, *exc):
        if exc_type is None:
            self.close()
            return
        # a failed conversion leaves no half-written database behind
        self._pending.clear()
        self.close()
        if self.mode == "new":
            shutil.rmtree(self.path, ignore_errors=True)


class LMDBWriter(_NewDatabase):
    """Create a new LMDB database (Caffe's ``db::LMDB`` opened with ``NEW``), or with
    ``mode="write"`` add to the one in the existing folder ``path`` (``WRITE``).

    ``put`` buffers records; ``commit`` writes them in one transaction (the
    tools commit every 1000 records, as Caffe's).  The map starts small and
    doubles whenever a transaction does not fit (Caffe's ``LMDBTransaction``
    does the same since 2016), so the file on disk stays as small as the data.
    """

    def __init__(self, path, map_size: int = 1 << 24, mode: str = "new"):
        lmdb = require_lmdb()
        super().__init__(path, mode)
        if mode == "new":
            os.makedirs(self.path)          # Caffe: mkdir, which fails on an existing path
        elif not os.path.isdir(self.path):  # Caffe: mdb_env_open fails, ENOENT
            raise FileNotFoundError(f"{self.path}: no such LMDB folder to open for writing "
                                    "(mode 'new' creates one)")
        self._lmdb = lmdb
        self._env = lmdb.open(self.path, map_size=int(map_size), subdir=True, readahead=False)

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


# ------------------------------------------------------------------ LevelDB
def require_plyvel():
    """The plyvel module (LevelDB), or an ImportError that says how to install it."""
    try:
        import plyvel
    except ImportError as e:  # pragma: no cover - depends on the environment
        raise ImportError("LevelDB support needs the plyvel package: pip install "
                          "'minicaffe[leveldb]'") from e
    return plyvel


class LevelDBCursor:
    """A cursor over a LevelDB (Caffe's ``LevelDBCursor``: an iterator from the first key, in
    the database's bytewise key order), with :class:`LMDBCursor`'s interface."""

    def __init__(self, db, path: str = ""):
        self.path = path
        self._db = db
        self._it = None
        self._item = None
        self.wraps = 0
        self.seek_to_first()

    def seek_to_first(self):
        if self._it is not None:
            self._it.close()
        self._it = self._db.iterator()
        self.next()

    def next(self):
        self._item = next(self._it, None)

    @property
    def valid(self) -> bool:
        return self._item is not None

    def key(self) -> bytes:
        self._check()
        return self._item[0]

    def value(self) -> bytes:
        self._check()
        return self._item[1]

    def _check(self):
        if self._item is None:
            raise ValueError(f"LevelDB {self.path}: cursor is past the last record (or the "
                             "database is empty)")

    def advance_wrapping(self):
        """Step to the next record, restarting from the first after the last."""
        self.next()
        if self._item is None:
            self.seek_to_first()
            self.wraps += 1

    def close(self):
        if self._it is not None:
            self._it.close()
            self._it = None
            self._item = None


_READ_LEVELDBS: dict = {}  # realpath of the database folder -> _SharedEnv of a plyvel.DB


def _acquire_leveldb(path) -> _SharedEnv:
    """The handle of the LevelDB ``path`` shared in this process (one more user): LevelDB locks
    a database to one handle per process, so two Data layers (a TRAIN and a TEST net) on one
    database share it."""
    plyvel = require_plyvel()
    key = _env_key(path)
    with _ENV_LOCK:
        shared = _READ_LEVELDBS.get(key)
        if shared is None:
            try:
                db = plyvel.DB(key, create_if_missing=False)
            except plyvel.Error as e:
                hint = (" (it holds an LMDB database: data.mdb)"
                        if os.path.exists(os.path.join(key, "data.mdb")) else f" ({e})")
                raise ValueError(f"{path} is not a LevelDB database{hint}") from None
            shared = _READ_LEVELDBS[key] = _SharedEnv(db, key, None)
        shared.refs += 1
        return shared


class LevelDBReader:
    """A LevelDB database opened for reading (Caffe's ``db::LevelDB`` with ``READ``), with
    :class:`LMDBReader`'s interface.  ``len()`` counts the records once (LevelDB keeps no
    count)."""

    def __init__(self, path):
        self.path = os.fspath(path)
        self._shared = _acquire_leveldb(self.path)
        self._db = self._shared.env
        self._cursors: list[LevelDBCursor] = []
        self._len = None

    def __len__(self) -> int:
        if self._len is None:
            self._len = sum(1 for _ in self._db.iterator(include_value=False))
        return self._len

    def cursor(self) -> LevelDBCursor:
        if self._db is None:
            raise ValueError(f"LevelDB {self.path} is closed")
        c = LevelDBCursor(self._db, self.path)
        self._cursors.append(c)
        return c

    def items(self):
        """Every (key, value) pair in key order."""
        yield from self._db.iterator()

    def close(self):
        if self._db is None:
            return
        for c in self._cursors:
            c.close()
        self._cursors.clear()
        self._db = None
        shared, self._shared = self._shared, None
        _release_read_env(shared, _READ_LEVELDBS)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


class LevelDBWriter(_NewDatabase):
    """Create a new LevelDB database (Caffe's ``db::LevelDB`` with ``NEW``; Caffe's options:
    64 KiB blocks, a 256 MiB write buffer), or with ``mode="write"`` open one to add to,
    created where it is missing (``WRITE``: create_if_missing, not error_if_exists);
    ``commit`` writes one batch."""

    def __init__(self, path, mode: str = "new"):
        plyvel = require_plyvel()
        super().__init__(path, mode)
        try:
            self._db = plyvel.DB(self.path, create_if_missing=True,
                                 error_if_exists=mode == "new", block_size=65536,
                                 write_buffer_size=268435456)
        except plyvel.Error as e:   # Caffe: "Failed to open leveldb " << source
            raise ValueError(f"Failed to open leveldb {self.path} for writing ({e}; LevelDB "
                             "takes one handle per process: close its readers first)") from None

    def commit(self):
        if not self._pending:
            return
        with self._db.write_batch() as batch:
            for k, v in self._pending:
                batch.put(k, v)
        self.count += len(self._pending)
        self._pending.clear()

    def close(self):
        if self._db is not None:
            self.commit()
            self._db.close()
            self._db = None


def read_lmdb_arrays(path, limit: int | None = None):
    """All Datums of an LMDB as ``(images (N, C, H, W), labels (N,) int64, keys)``.

    For small databases (tests, the digits set); the Data layer streams instead.
    """
    images, labels, keys = [], [], []
    with LMDBReader(path) as db:
        for k, v in db.items():
            d = parse_datum(v)
            images.append(datum_image(d))
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
        if os.path.abspath(alt) not in tried:
            tried.append(os.path.abspath(alt))
    prefix = f"{where}: " if where else ""
    raise FileNotFoundError(f"{prefix}{what} {path!r} not found (looked at {', '.join(tried)})")


# ------------------------------------------------- pycaffe preprocessing
# pycaffe's caffe.io image helpers (python/caffe/io.py in BVLC Caffe): images
# are (H, W, K) float arrays, RGB in [0, 1] as skimage loads them; a
# Transformer turns one into the (K, H, W) array that a net's input expects.
RESIZE_MODES = ("reflect", "symmetric", "edge", "constant")


def _boundary_index(idx, n: int, mode: str):
    """Integer sample positions ``idx`` (possibly outside ``[0, n)``) mapped into
    an axis of length ``n`` as ``numpy.pad``'s ``mode`` extends it; under
    ``"constant"`` a position outside the axis becomes -1 (it reads ``cval``)."""
    if mode == "constant":
        return np.where((idx < 0) | (idx >= n), -1, idx)
    if mode == "edge":
        return np.clip(idx, 0, n - 1)
    if n == 1:
        return np.zeros_like(idx)
    if mode == "reflect":    # mirrored about the edge pixels: a b c | b a
        period = 2 * (n - 1)
        idx = np.mod(idx, period)
        return np.where(idx >= n, period - idx, idx)
    period = 2 * n           # symmetric: the edge pixels repeat: a b c | c b a
    idx = np.mod(idx, period)
    return np.where(idx >= n, period - 1 - idx, idx)


def _take(x, idx, axis: int, cval: float):
    """``x`` sampled at ``idx`` along ``axis`` (-1 entries read ``cval``)."""
    out = np.take(x, np.maximum(idx, 0), axis=axis)
    outside = idx < 0
    if outside.any():
        shape = [1] * x.ndim
        shape[axis] = -1
        out = np.where(outside.reshape(shape), cval, out)
    return out


def _resample_axis(x, n_out: int, axis: int, order: int, mode: str, cval: float = 0.0,
                   align_corners: bool = False):
    """``x`` resampled to ``n_out`` samples along ``axis`` by nearest (order 0)
    or linear (order 1) interpolation.

    Pixel-centre mapping (skimage's ``resize``, ``ndimage.zoom(grid_mode=True)``):
    output pixel i reads input position ``(i + 0.5) * n_in / n_out - 0.5``.
    ``align_corners`` (``ndimage.zoom``'s default ``grid_mode=False``): the first
    and last pixel centres meet, position ``i * (n_in - 1) / (n_out - 1)``.
    Nearest rounds halves up, ``floor(p + 0.5)``, as ndimage does.
    """
    n_in = x.shape[axis]
    i = np.arange(n_out, dtype=np.float64)
    if align_corners:
        pos = i * ((n_in - 1) / (n_out - 1)) if n_out > 1 else np.zeros(1)
    else:
        pos = (i + 0.5) * (n_in / n_out) - 0.5
    if order == 0:
        idx = np.floor(pos + 0.5).astype(np.intp)
        return _take(x, _boundary_index(idx, n_in, mode), axis, cval)
    lo = np.floor(pos)
    shape = [1] * x.ndim
    shape[axis] = -1
    w = (pos - lo).reshape(shape)  # weight of the upper neighbour
    lo = lo.astype(np.intp)
    below = _take(x, _boundary_index(lo, n_in, mode), axis, cval)
    above = _take(x, _boundary_index(lo + 1, n_in, mode), axis, cval)
    return below * (1.0 - w) + above * w


def _gaussian_axis(x, sigma: float, axis: int, mode: str, cval: float = 0.0):
    """``scipy.ndimage.gaussian_filter1d`` (kernel truncated at 4 sigma) with
    ``numpy.pad``'s ``mode`` at the edges."""
    radius = int(4.0 * sigma + 0.5)
    taps = np.arange(-radius, radius + 1)
    kernel = np.exp(-0.5 * (taps / sigma) ** 2)
    kernel /= kernel.sum()
    n = x.shape[axis]
    out = np.zeros_like(x)
    for t, k in zip(taps, kernel):
        out += k * _take(x, _boundary_index(np.arange(n) + t, n, mode), axis, cval)
    return out


def _skimage_resize(x, new_dims, order: int, mode: str, anti_aliasing, cval: float = 0.0):
    """``skimage.transform.resize(x, new_dims, order)`` of a float (H, W, K)
    image (skimage >= 0.19: ``ndimage.zoom(grid_mode=True)`` after an optional
    Gaussian; ``clip=True``), for orders 0 and 1, in float64."""
    out_shape = tuple(new_dims) + x.shape[2:]
    factors = [n_in / n_out for n_in, n_out in zip(x.shape, out_shape)]
    if anti_aliasing is None:  # skimage: on when any axis shrinks (float input)
        anti_aliasing = any(f > 1 for f in factors)
    y = x
    if anti_aliasing:
        for axis, f in enumerate(factors):
            sigma = max(0.0, (f - 1) / 2)  # skimage's default anti_aliasing_sigma
            if sigma > 0:
                y = _gaussian_axis(y, sigma, axis, mode, cval)
    for axis in (0, 1):
        if y.shape[axis] != out_shape[axis]:
            y = _resample_axis(y, out_shape[axis], axis, order, mode, cval)
    if order > 0:  # clip=True: no value outside the input's range (and cval's)
        lo, hi = x.min(), x.max()
        if mode == "constant":
            lo, hi = min(lo, cval), max(hi, cval)
        y = np.clip(y, lo, hi)
    return y


def resize_image(im, new_dims, interp_order=1, *, mode="constant", anti_aliasing=None):
    """pycaffe's ``caffe.io.resize_image``: an (H, W, K) image resized to
    ``new_dims`` = (height, width), float32 (K kept).

    As pycaffe: a 1- or 3-channel image is scaled to [0, 1], resized as
    ``skimage.transform.resize(im, new_dims, order=interp_order,
    mode='constant')`` (upstream's call) with skimage's other defaults, and
    scaled back; a constant image comes back filled
    with its value (no division by zero); other channel counts go through
    ``scipy.ndimage.zoom(im, ..., order)``, whose grid puts the corner pixel
    centres on each other.

    Implemented in NumPy (skimage is not a dependency), for ``interp_order``
    0 (nearest) and 1 (bilinear) only; pycaffe passes higher orders to the
    splines of skimage/scipy.  The 1/3-channel path reproduces
    skimage >= 0.19 (checked against 0.25): pixel-centre mapping, ``mode``
    ``'constant'`` with cval 0 at the edges, as pycaffe asks (numpy.pad's
    names ``'reflect'``, skimage's own default, ``'symmetric'`` and
    ``'edge'`` are accepted too), and, when the image
    shrinks, a Gaussian blur of sigma ``(in/out - 1)/2`` per axis before
    sampling (``anti_aliasing``; None = skimage's rule).  skimage < 0.15,
    current when pycaffe was written, had no blur: pass
    ``anti_aliasing=False`` for that output.
    ``mode`` and ``anti_aliasing`` are extensions; pycaffe has neither.
    Values agree with skimage's to float32 rounding (skimage filters a
    float32 input in float32, this code works in float64).
    """
    im = np.asarray(im)
    if im.ndim != 3:
        raise ValueError(f"resize_image: need an (H, W, K) image, got shape {im.shape}")
    new_dims = tuple(int(d) for d in new_dims)
    if len(new_dims) != 2 or min(new_dims) < 1:
        raise ValueError(f"resize_image: new_dims must be (height, width) >= 1, got {new_dims}")
    if interp_order not in (0, 1):
        raise ValueError(f"resize_image: interp_order {interp_order} is not supported; "
                         "0 (nearest) and 1 (bilinear) are")
    if mode not in RESIZE_MODES:
        raise ValueError(f"resize_image: unknown mode {mode!r}; choose one of {RESIZE_MODES}")
    x = im.astype(np.float64)
    if im.shape[-1] not in (1, 3):
        # pycaffe: scipy.ndimage.zoom(im, scale + (1,), order), corners aligned
        for axis in (0, 1):
            x = _resample_axis(x, new_dims[axis], axis, interp_order, "edge",
                               align_corners=True)
        return x.astype(np.float32)
    im_min, im_max = x.min(), x.max()
    if not im_max > im_min:  # a constant image: avoid dividing by zero
        return np.full(new_dims + (im.shape[-1],), im_min, dtype=np.float32)
    std = (x - im_min) / (im_max - im_min)  # skimage wants [0, 1]
    resized = _skimage_resize(std, new_dims, interp_order, mode, anti_aliasing)
    return (resized * (im_max - im_min) + im_min).astype(np.float32)


def _pil_to_float(img) -> np.ndarray:
    """A Pillow image as skimage's ``img_as_float(io.imread(...))`` gives it:
    (H, W) or (H, W, C) float64, integers divided by their type's maximum."""
    mode = img.mode
    if mode == "1":
        return np.asarray(img, dtype=bool).astype(np.float64)
    if mode == "F":
        return np.asarray(img, dtype=np.float64)
    if mode.startswith("I;16"):
        return np.asarray(img).astype(np.float64) / 65535.0
    if mode == "I":
        return np.asarray(img, dtype=np.int32).astype(np.float64) / 2147483647.0
    if mode in ("L", "LA", "La"):
        return np.asarray(img.convert("L"), dtype=np.uint8) / 255.0
    if mode in ("RGBA", "RGBa"):
        return np.asarray(img.convert("RGBA"), dtype=np.uint8) / 255.0
    # RGB; palette images as imageio gives them (RGB); CMYK, YCbCr, ... as RGB
    return np.asarray(img.convert("RGB"), dtype=np.uint8) / 255.0


def load_image(filename, color=True) -> np.ndarray:
    """pycaffe's ``caffe.io.load_image``: an image file as float32 in [0, 1],
    (H, W, 3) RGB, or (H, W, 1) grey when ``color`` is False.

    As pycaffe: a grey file is tiled to 3 channels when ``color``; an alpha
    channel is dropped (not composited); ``color=False`` reads a colour file grey,
    as pycaffe's ``skimage.io.imread(filename, as_grey=True)`` did with the skimage
    Caffe was written against (``rgb2gray``: 0.2125 R + 0.7154 G + 0.0721 B of the
    first three channels; newer skimage dropped ``as_grey``).  Note the RGB order:
    Caffe's ImageNet models want BGR (``Transformer.set_channel_swap(in_, (2, 1, 0))``).

    Decoded with Pillow instead of skimage/imageio; differences: a grey file
    with alpha (``LA``) becomes grey (imageio gives 2 channels, which pycaffe
    passes on), and CMYK/YCbCr files are converted to RGB (imageio gives the
    raw channels).  Like imageio, the EXIF orientation is not applied.
    """
    Image = require_pillow()
    with Image.open(filename) as img:
        img.load()
        arr = _pil_to_float(img)
    if not color and arr.ndim == 3:
        arr = arr[:, :, :3] @ np.array([0.2125, 0.7154, 0.0721])    # skimage's rgb2gray
    if arr.ndim == 2:
        arr = arr[:, :, np.newaxis]
        if color:
            arr = np.tile(arr, (1, 1, 3))
    elif arr.shape[2] == 4:
        arr = arr[:, :, :3]
    return arr.astype(np.float32)


def center_crop_bounds(image_dims, crop_dims):
    """((y0, y1), (x0, x1)) of pycaffe's centre crop: the image centre minus
    and plus half the crop, truncated to integers (``y1 - y0`` is the crop height)."""
    bounds = []
    for size, crop in zip(image_dims, crop_dims):
        size, crop = int(size), int(crop)
        if crop > size:
            raise ValueError(f"crop {tuple(int(c) for c in crop_dims)} is larger than the image "
                             f"{tuple(int(s) for s in image_dims)}")
        bounds.append((int(size / 2.0 - crop / 2.0), int(size / 2.0 + crop / 2.0)))
    return tuple(bounds)


def oversample(images, crop_dims) -> np.ndarray:
    """pycaffe's ``caffe.io.oversample``: 10 crops of each (H, W, K) image,
    as a (10 N, h, w, K) float32 array.

    Per image, in pycaffe's order: the top-left, top-right, bottom-left and
    bottom-right corners, the centre (:func:`center_crop_bounds`), then the
    same five mirrored left to right.  All images must have one shape.
    """
    if len(images) == 0:
        raise ValueError("oversample: no images given")
    im_shape = np.shape(images[0])
    if len(im_shape) != 3:
        raise ValueError(f"oversample: need (H, W, K) images, got shape {im_shape}")
    h, w = (int(c) for c in crop_dims)
    (cy0, _), (cx0, _) = center_crop_bounds(im_shape[:2], (h, w))
    H, W = im_shape[:2]
    corners = [(0, 0), (0, W - w), (H - h, 0), (H - h, W - w), (cy0, cx0)]
    crops = np.empty((10 * len(images), h, w, im_shape[2]), dtype=np.float32)
    for n, im in enumerate(images):
        if np.shape(im) != im_shape:
            raise ValueError(f"oversample: image {n} has shape {np.shape(im)}, image 0 "
                             f"{im_shape}; resize them to one shape first")
        base = 10 * n
        for k, (y, x) in enumerate(corners):
            crops[base + k] = im[y:y + h, x:x + w, :]
        crops[base + 5:base + 10] = crops[base:base + 5, :, ::-1, :]  # mirrors
    return crops


class Transformer:
    """pycaffe's ``caffe.io.Transformer``: turns (H, W, K) images into a net's
    (K, H, W) inputs and back.

    ``inputs``: {input blob name: its shape (N, K, H, W)}, e.g.
    ``{"data": net.blobs["data"].data.shape}``.  :meth:`preprocess` runs, as
    pycaffe: convert to float32; resize to the input's (H, W) if the image's
    first two axes differ (:func:`resize_image`); transpose; channel swap;
    multiply by raw_scale; subtract the mean; multiply by input_scale.  So
    ``raw_scale`` applies before the mean (a [0, 1] image times 255 for a
    mean given in [0, 255]) and ``input_scale`` after it.  :meth:`deprocess`
    undoes the steps in reverse (not the resize).

    Differences from pycaffe: ``preprocess`` never writes into the caller's
    array (pycaffe's in-place scaling does when it is float32 of the input's
    size and needs no resize); ``deprocess`` drops only leading axes of length
    1 (pycaffe's ``squeeze()`` also drops a channel axis of length 1, and its
    transpose then fails); errors are ValueError (pycaffe raises Exception
    for the unknown-input, transpose and channel-swap checks).
    """

    def __init__(self, inputs):
        self.inputs = {name: tuple(int(d) for d in shape) for name, shape in dict(inputs).items()}
        self.transpose = {}
        self.channel_swap = {}
        self.raw_scale = {}
        self.mean = {}
        self.input_scale = {}

    def _check_input(self, in_):
        if in_ not in self.inputs:
            raise ValueError(f"{in_!r} is not one of the net inputs: {list(self.inputs)}")

    def preprocess(self, in_, data) -> np.ndarray:
        """An (H', W', K) image as the (K, H, W) float32 array for input ``in_``."""
        self._check_input(in_)
        caffe_in = np.array(data, dtype=np.float32)  # a copy: the steps below work in place
        in_dims = self.inputs[in_][2:]
        if caffe_in.shape[:2] != in_dims:
            caffe_in = resize_image(caffe_in, in_dims)
        transpose = self.transpose.get(in_)
        channel_swap = self.channel_swap.get(in_)
        raw_scale = self.raw_scale.get(in_)
        mean = self.mean.get(in_)
        input_scale = self.input_scale.get(in_)
        if transpose is not None:
            caffe_in = caffe_in.transpose(transpose)
            channels = self.inputs[in_][1] if len(self.inputs[in_]) > 1 else None
            # one channel broadcasts over the input's (a grey image), unless swapped
            fits = (channels,) if channel_swap is not None else (channels, 1)
            if channels is not None and caffe_in.shape[0] not in fits:
                # an image given as (K, H, W): pycaffe resized it as (H, W) = (K, H) and ran
                # on, into a broadcast error at the net's input, or a channel swap that picks
                # 3 of the H planes without a word
                raise ValueError(
                    f"input {in_!r}: the image of shape {np.shape(data)} has "
                    f"{caffe_in.shape[0]} channels after transpose {tuple(transpose)}, the "
                    f"input {tuple(self.inputs[in_])} takes {channels}; preprocess takes an "
                    "(H, W, K) image, as caffe.io.load_image returns")
        if channel_swap is not None:
            caffe_in = caffe_in[list(channel_swap), :, :]
        if raw_scale is not None:
            caffe_in *= raw_scale
        if mean is not None:
            caffe_in -= mean
        if input_scale is not None:
            caffe_in *= input_scale
        return caffe_in

    def deprocess(self, in_, data) -> np.ndarray:
        """Undo :meth:`preprocess` (but the resize): (1, K, H, W) or (K, H, W) -> (H, W, K).

        pycaffe squeezes every axis of length 1 first (``data.copy().squeeze()``), so that
        without a transpose, channel swap or mean a one-channel (1, 1, H, W) gives (H, W),
        as here.  With one of those, pycaffe fails on a squeezed one-channel image (the
        axes no longer match); here only leading batch axes of length 1 go, and the
        result keeps its channel axis: (H, W, 1)."""
        self._check_input(in_)
        decaf_in = np.array(data, dtype=np.float32)
        transpose = self.transpose.get(in_)
        channel_swap = self.channel_swap.get(in_)
        raw_scale = self.raw_scale.get(in_)
        mean = self.mean.get(in_)
        input_scale = self.input_scale.get(in_)
        if transpose is None and channel_swap is None and mean is None:
            decaf_in = decaf_in.squeeze()
        while decaf_in.ndim > 3 and decaf_in.shape[0] == 1:
            decaf_in = decaf_in[0]
        if input_scale is not None:
            decaf_in /= input_scale
        if mean is not None:
            decaf_in += mean
        if raw_scale is not None:
            decaf_in /= raw_scale
        if channel_swap is not None:
            decaf_in = decaf_in[np.argsort(channel_swap), :, :]
        if transpose is not None:
            decaf_in = decaf_in.transpose(np.argsort(transpose))
        return decaf_in

    def set_transpose(self, in_, order):
        """The axis order that takes an image to the input's, e.g. (2, 0, 1)
        for (H, W, K) -> (K, H, W); one entry per input axis but the batch's."""
        self._check_input(in_)
        shape = self.inputs[in_]
        if len(order) != len(shape) - 1:
            raise ValueError(f"input {in_!r}: transpose order {tuple(order)} needs "
                             f"{len(shape) - 1} axes, as many as the input {shape} has "
                             "without the batch axis")
        self.transpose[in_] = tuple(int(a) for a in order)

    def set_channel_swap(self, in_, order):
        """The channel order to take after the transpose, e.g. (2, 1, 0) for RGB -> BGR."""
        self._check_input(in_)
        shape = self.inputs[in_]
        if len(order) != shape[1]:
            raise ValueError(f"input {in_!r}: channel swap {tuple(order)} needs one entry per "
                             f"input channel ({shape[1]} in shape {shape})")
        self.channel_swap[in_] = tuple(int(c) for c in order)

    def set_raw_scale(self, in_, scale):
        """Multiply the raw image by ``scale`` before the mean (255 for models
        trained on [0, 255] pixels, such as CaffeNet and AlexNet)."""
        self._check_input(in_)
        self.raw_scale[in_] = scale

    def set_mean(self, in_, mean):
        """The mean to subtract: a (K,) vector (per channel) or an image of the
        input's (K, H, W) shape ((H, W) for one channel), in the input's units
        (after raw_scale)."""
        self._check_input(in_)
        mean = np.asarray(mean)
        shape = self.inputs[in_]
        if mean.ndim == 1:
            if mean.shape[0] != shape[1]:
                raise ValueError(f"input {in_!r}: mean channels incompatible with input: the "
                                 f"mean has {mean.shape[0]}, the input {shape} has {shape[1]}")
            mean = mean[:, np.newaxis, np.newaxis]
        else:
            ms = (1,) + mean.shape if mean.ndim == 2 else mean.shape
            if len(ms) != 3:
                raise ValueError(f"input {in_!r}: mean shape {mean.shape} invalid; give a (K,) "
                                 "vector or a (K, H, W) image")
            if ms != shape[1:]:
                raise ValueError(f"input {in_!r}: mean shape {mean.shape} incompatible with "
                                 f"input shape {shape} (need {shape[1:]}; for a per-channel "
                                 "mean, average the image: mean.mean(1).mean(1))")
        self.mean[in_] = mean

    def set_input_scale(self, in_, scale):
        """Multiply the input by ``scale`` after the mean subtraction."""
        self._check_input(in_)
        self.input_scale[in_] = scale
