"""Convert a set of images to an LMDB (or LevelDB) of Datum records (Caffe's
``tools/convert_imageset.cpp``).

Usage, with Caffe's flags and argument order::

    python -m minicaffe.tools.convert_imageset [FLAGS] ROOTFOLDER/ LISTFILE DB_NAME

    -gray            read images as 1 grey channel (default: 3 colour channels, BGR)
    -shuffle         shuffle the order of the images and their labels
    -backend lmdb    the database to write: lmdb or leveldb
    -resize_width W -resize_height H   resize to H x W (only when both are given, > 0)
    -check_size      check that every image has the size of the first
    -encoded         store each image's file bytes (PNG/JPEG...), not its pixels
    -encode_type T   re-encode as T (png, jpg, ...); implies -encoded
    -seed S          minicaffe's: a reproducible -shuffle (Caffe's order is random)

Flags are spelt as gflags takes them: ``-gray`` or ``--gray``, ``-gray=false``,
``-nogray``, ``-backend leveldb`` or ``--backend=leveldb``, before or after the arguments.

``LISTFILE`` has one ``path label`` per line; the label is the text after the last space,
so paths may contain spaces.  Each image is read from ``ROOTFOLDER + path``, the two
joined as strings, as Caffe does: ROOTFOLDER needs its trailing ``/`` (or is a prefix such
as ``""`` for absolute paths).

* PNG, JPEG and whatever else Pillow reads (Pillow is needed for them): 3 channels in BGR
  order, as Caffe's OpenCV reader gives them, or 1 grey channel with ``-gray``; resized as
  OpenCV's INTER_LINEAR does (:func:`minicaffe.io.resize_inter_linear`);
* ``.npy`` arrays of shape ``(C, H, W)`` or ``(H, W)`` (minicaffe's addition), stored as
  they are (uint8 as bytes, other types as ``float_data``).

Records are keyed ``"%08d_%s" % (line index, path)`` as Caffe's tool, so the database's key
order is the list's order (after ``-shuffle``).  A file that cannot be read is skipped with
Caffe's ERROR line ``Could not open or find file ...``.  The databases are committed every
1000 images, each time with the line ``Processed N files.``, and once more at the end.

With ``-encoded`` a Datum holds the encoded file (``encoded: true``, no channels, height or
width), as Caffe's ``ReadImageToDatum``: the file's own bytes where it is not resized and
its extension is the encoding (``-encode_type``, else the file's own extension; ``jpg``
also takes ``.jpeg``), else the image re-encoded through Pillow (JPEG at quality 95,
OpenCV's default).  The Data layer decodes them (``minicaffe.io.datum_image``).
"""
from __future__ import annotations

import argparse
import io as _pyio
import os
import sys

import numpy as np

from ..io import LevelDBWriter, LMDBWriter, array_to_datum, read_list
from ..io import load_image_chw as load_image
from ..io import require_pillow
from ..log import log
from ..proto import caffe_pb2
from . import _gflags

COMMIT_EVERY = 1000        # Caffe commits its transaction every 1000 images
JPEG_QUALITY = 95          # cv::imencode's default IMWRITE_JPEG_QUALITY
WRITERS = {"lmdb": LMDBWriter, "leveldb": LevelDBWriter}


def guess_encoding(path: str) -> str:
    """The encoding ``-encoded`` gives a file without ``-encode_type``: its extension, lower
    case (Caffe: the text after the last '.', warning where there is none)."""
    dot = path.rfind(".")
    if dot < 0:
        log(f"Failed to guess the encoding of '{path}'", level="W")
    return path[dot + 1:].lower()


def matches_extension(path: str, encoding: str) -> bool:
    """Caffe's ``matchExt``: the file's extension (lower case) is ``encoding``, or
    ``jpeg`` for ``jpg``."""
    dot = path.rfind(".")
    ext = (path[dot + 1:] if dot >= 0 else path).lower()
    encoding = encoding.lower()
    return ext == encoding or (encoding == "jpg" and ext == "jpeg")


def encode_image(image: np.ndarray, encoding: str) -> bytes:
    """A ``(C, H, W)`` uint8 image (BGR or grey) encoded as ``encoding`` (``png``, ``jpg``,
    ...), as ``cv::imencode("." + encoding, ...)``."""
    Image = require_pillow()
    writable = {ext[1:]: fmt for ext, fmt in Image.registered_extensions().items()
                if fmt in Image.SAVE}
    fmt = writable.get(encoding.lower())
    if fmt is None:
        raise ValueError(f"cannot encode images as {encoding!r}; Pillow writes "
                         f"{', '.join(sorted(writable))}")
    if image.shape[0] == 3:
        pil = Image.fromarray(np.ascontiguousarray(image.transpose(1, 2, 0)[:, :, ::-1]), "RGB")
    else:
        pil = Image.fromarray(np.ascontiguousarray(image[0]), "L")
    buf = _pyio.BytesIO()
    pil.save(buf, format=fmt, **({"quality": JPEG_QUALITY} if fmt == "JPEG" else {}))
    return buf.getvalue()


def read_image_to_datum(path, label: int, resize_height: int, resize_width: int,
                        is_color: bool, encoding: str = ""):
    """Caffe's ``ReadImageToDatum``: the image as a Datum of its pixels, or with an
    ``encoding`` as an encoded Datum (the file's own bytes where it needs no resizing and
    already has that encoding).  Raises OSError or ValueError where it cannot be read."""
    if encoding and path.lower().endswith(".npy"):
        raise ValueError(".npy arrays are not images and cannot be stored encoded")
    image = load_image(path, is_color, resize_height, resize_width)
    if not encoding:
        return array_to_datum(image, label)
    datum = caffe_pb2.Datum()
    if not resize_height and not resize_width and matches_extension(path, encoding):
        with open(path, "rb") as f:     # Caffe's ReadFileToDatum
            datum.data = f.read()
    else:
        datum.data = encode_image(image, encoding)
    datum.label = int(label)
    datum.encoded = True
    return datum


def convert_imageset(root, listfile, db_path, gray: bool = False, shuffle: bool = False,
                     resize_height: int = 0, resize_width: int = 0, check_size: bool = False,
                     seed: int | None = None, verbose: bool = True, backend: str = "lmdb",
                     encoded: bool = False, encode_type: str = "") -> int:
    """Write the images of ``listfile``, each read from ``root + path``, to a new LMDB (or
    LevelDB) as Caffe's tool; return the record count."""
    say = log if verbose else (lambda *a, **k: None)
    if backend not in WRITERS:
        raise ValueError(f"unknown backend {backend!r}; choose lmdb or leveldb")
    root = os.fspath(root)
    lines = read_list(listfile)
    if not lines:
        raise ValueError(f"{listfile}: no images listed")
    if shuffle:
        # Caffe shuffles with its own RNG (unseeded: a new order each run);
        # give seed for a reproducible order.
        say("Shuffling data")
        order = np.random.default_rng(seed).permutation(len(lines))
        lines = [lines[i] for i in order]
    say(f"A total of {len(lines)} images.")
    if encode_type and not encoded:
        say("encode_type specified, assuming encoded=true.")
        encoded = True
    if encoded and check_size:
        # Caffe compares each datum's data size with channels * height * width of the
        # first, which an encoded datum leaves 0: its check fails on the second image
        raise ValueError("-check_size cannot check encoded images (they have no pixel "
                         "size); leave out one of -check_size and -encoded")
    resize_height, resize_width = max(0, resize_height), max(0, resize_width)
    if any(not p.lower().endswith(".npy") for p, _ in lines):
        require_pillow()  # fail once, up front, rather than skip every file
    data_size = None
    count = 0
    with WRITERS[backend](db_path) as db:
        say(f"Opened {backend} {os.fspath(db_path)}")
        for line_id, (rel, label) in enumerate(lines):
            full = root + rel                 # string concatenation, as Caffe's tool
            encoding = encode_type or (guess_encoding(rel) if encoded else "")
            try:
                datum = read_image_to_datum(full, label, resize_height, resize_width,
                                            not gray, encoding)
            except (OSError, ValueError) as e:
                log(f"Could not open or find file {full} ({e})", level="E")
                continue
            if check_size:
                size = max(len(datum.data), len(datum.float_data))
                if data_size is None:
                    data_size = datum.channels * datum.height * datum.width
                elif size != data_size:
                    raise ValueError(f"{full}: Incorrect data field size {size} (the first "
                                     f"image has {data_size})")
            db.put(f"{line_id:08d}_{rel}", datum.SerializeToString())
            count += 1
            if count % COMMIT_EVERY == 0:
                db.commit()
                say(f"Processed {count} files.")
        if count == 0:
            hint = ("; ROOTFOLDER is joined to each path as a string, as Caffe does: end it "
                    "with '/'" if root and not root.endswith(("/", os.sep)) else "")
            raise ValueError(f"{listfile}: none of the {len(lines)} images could be read{hint}")
    if count % COMMIT_EVERY:
        say(f"Processed {count} files.")
    return count


BOOLS = {"gray", "shuffle", "check_size", "encoded"}
VALUES = {"backend", "resize_width", "resize_height", "encode_type", "seed"}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(
        prog="python -m minicaffe.tools.convert_imageset",
        usage="%(prog)s [FLAGS] ROOTFOLDER/ LISTFILE DB_NAME",
        description="Convert a set of images to the leveldb/lmdb format used as input for "
                    "Caffe. LISTFILE holds 'path label' lines; each image is read from "
                    "ROOTFOLDER + path (joined as strings: keep the trailing '/').")
    ap.add_argument("root", metavar="ROOTFOLDER/")
    ap.add_argument("listfile", metavar="LISTFILE")
    ap.add_argument("db", metavar="DB_NAME")
    _gflags.add_bool(ap, "gray", "When this option is on, treat images as grayscale ones")
    _gflags.add_bool(ap, "shuffle", "Randomly shuffle the order of images and their labels")
    ap.add_argument("--backend", default="lmdb", choices=sorted(WRITERS),
                    help="The backend {lmdb, leveldb} for storing the result (LevelDB "
                         "through plyvel)")
    ap.add_argument("--resize_width", type=int, default=0, help="Width images are resized to")
    ap.add_argument("--resize_height", type=int, default=0,
                    help="Height images are resized to")
    _gflags.add_bool(ap, "check_size",
                     "When this option is on, check that all the datum have the same size")
    _gflags.add_bool(ap, "encoded",
                     "When this option is on, the encoded image will be save in datum")
    ap.add_argument("--encode_type", default="",
                    help="Optional: What type should we encode the image as ('png','jpg',...).")
    ap.add_argument("--seed", type=int, default=None,
                    help="minicaffe's: the seed of -shuffle (default: a new order each run)")
    try:
        args = _gflags.parse(ap, sys.argv[1:] if argv is None else list(argv),
                             BOOLS, VALUES)
    except SystemExit as e:          # usage (status 1, as Caffe) or --help
        return e.code
    try:
        convert_imageset(args.root, args.listfile, args.db, gray=args.gray, shuffle=args.shuffle,
                         resize_height=args.resize_height, resize_width=args.resize_width,
                         check_size=args.check_size, seed=args.seed, backend=args.backend,
                         encoded=args.encoded, encode_type=args.encode_type)
    except (OSError, ValueError, ImportError) as e:
        print(f"convert_imageset: {e}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
