"""The mean image of an LMDB (or LevelDB) of Datums (Caffe's
``tools/compute_image_mean.cpp``).

Usage, with Caffe's flag and arguments::

    python -m minicaffe.tools.compute_image_mean [-backend lmdb|leveldb] INPUT_DB [OUTPUT_FILE]

Writes a ``.binaryproto`` (a legacy 4-d BlobProto ``(1, C, H, W)``) usable as
``transform_param { mean_file: ... }`` and logs Caffe's lines: ``Processed N files.`` every
10000 records and at the end, ``Write to OUTPUT_FILE``, ``Number of channels: C`` and, per
channel, ``mean_value channel [c]:v`` (usable as ``mean_value``).  As Caffe, the sum is kept
in float32 and adds one image at a time, then is divided by the count, and each channel's
value is a float32 sum over the mean image's pixels divided by their number; byte and float
Datums are both accepted, encoded ones are decoded with their own channels
(``DecodeDatumNative``).
"""
from __future__ import annotations

import argparse
import sys

import numpy as np

from ..io import LevelDBReader, LMDBReader, datum_image, parse_datum, save_mean_file
from ..log import log
from . import _gflags

LOG_EVERY = 10000          # Caffe logs "Processed N files." every 10000 records
READERS = {"lmdb": LMDBReader, "leveldb": LevelDBReader}


def channel_means(mean: np.ndarray) -> list[float]:
    """Caffe's per-channel ``mean_value`` of a ``(1, C, H, W)`` mean: a float32 sum of the
    channel's values in order, divided by H * W in float32."""
    flat = mean.reshape(mean.shape[1], -1).astype(np.float32)
    sums = np.add.accumulate(flat, axis=1, dtype=np.float32)[:, -1]   # sequential, as Caffe
    return [float(s / np.float32(flat.shape[1])) for s in sums]


def compute_image_mean(db_path, output=None, verbose: bool = True,
                       backend: str = "lmdb") -> np.ndarray:
    """The mean ``(1, C, H, W)`` float32 image of the LMDB (or LevelDB); written to ``output``
    if given."""
    say = log if verbose else (lambda *a, **k: None)
    if backend not in READERS:
        raise ValueError(f"unknown backend {backend!r}; choose lmdb or leveldb")
    total = None
    count = 0
    with READERS[backend](db_path) as db:
        say(f"Opened {backend} {db_path}")
        for key, value in db.items():
            datum = parse_datum(value)
            if total is None and datum.encoded:
                say("Decoding Datum")
            image = datum_image(datum)
            if total is None:
                total = np.zeros(image.shape, dtype=np.float32)
                say("Starting Iteration")
            elif image.size != total.size:
                raise ValueError(f"{db_path}: record {key.decode('utf-8', 'replace')!r}: "
                                 f"Incorrect data field size {image.size} (shape "
                                 f"{image.shape}; the first record has {total.shape})")
            elif image.shape != total.shape:
                raise ValueError(f"{db_path}: record {key.decode('utf-8', 'replace')!r} has "
                                 f"shape {image.shape}, the first has {total.shape}")
            total += image.astype(np.float32)  # float32 running sum, as Caffe's BlobProto
            count += 1
            if count % LOG_EVERY == 0:
                say(f"Processed {count} files.")
    if count == 0:
        raise ValueError(f"{db_path}: the database holds no records")
    if count % LOG_EVERY:
        say(f"Processed {count} files.")
    mean = (total / np.float32(count)).astype(np.float32)[np.newaxis]
    if output is not None:
        say(f"Write to {output}")
        save_mean_file(output, mean)
    say(f"Number of channels: {mean.shape[1]}")
    for c, value in enumerate(channel_means(mean)):
        say(f"mean_value channel [{c}]:{value:.6g}")     # glog's ostream: 6 digits
    return mean


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m minicaffe.tools.compute_image_mean",
                                 usage="%(prog)s [FLAGS] INPUT_DB [OUTPUT_FILE]",
                                 description="Compute the mean_image of a set of images given "
                                             "by a leveldb/lmdb.")
    ap.add_argument("db", metavar="INPUT_DB")
    ap.add_argument("output", metavar="OUTPUT_FILE", nargs="?", default=None)
    ap.add_argument("--backend", default="lmdb", choices=sorted(READERS),
                    help="The backend {leveldb, lmdb} containing the images (LevelDB through "
                         "plyvel)")
    try:
        args = _gflags.parse(ap, sys.argv[1:] if argv is None else list(argv),
                             set(), {"backend"})
    except SystemExit as e:          # usage (status 1, as Caffe) or --help
        return e.code
    try:
        compute_image_mean(args.db, args.output, backend=args.backend)
    except (OSError, ValueError, ImportError) as e:
        print(f"compute_image_mean: {e}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
