"""The mean image of an LMDB of Datums (Caffe's ``compute_image_mean``).

Usage::

    python -m minicaffe.tools.compute_image_mean INPUT_DB [OUTPUT_FILE]

Writes a ``.binaryproto`` (a legacy 4-d BlobProto ``(1, C, H, W)``) usable as
``transform_param { mean_file: ... }`` and prints the per-channel means
(usable as ``mean_value``).  As Caffe, the sum is kept in float32 and adds
one image at a time, then is divided by the count; byte and float Datums are
both accepted, encoded ones are decoded.
"""
from __future__ import annotations

import argparse
import sys

import numpy as np

from ..io import LevelDBReader, LMDBReader, datum_to_array, parse_datum, save_mean_file


def compute_image_mean(db_path, output=None, verbose: bool = True,
                       backend: str = "lmdb") -> np.ndarray:
    """The mean ``(1, C, H, W)`` float32 image of the LMDB (or LevelDB); written to ``output``
    if given."""
    total = None
    count = 0
    with (LevelDBReader if backend == "leveldb" else LMDBReader)(db_path) as db:
        for key, value in db.items():
            image = datum_to_array(parse_datum(value))
            if total is None:
                total = np.zeros(image.shape, dtype=np.float32)
            elif image.shape != total.shape:
                raise ValueError(f"{db_path}: record {key.decode('utf-8', 'replace')!r} has shape "
                                 f"{image.shape}, the first has {total.shape} (incorrect data "
                                 "field size)")
            total += image.astype(np.float32)  # float32 running sum, as Caffe's BlobProto
            count += 1
            if verbose and count % 10000 == 0:
                print(f"Processed {count} files.", file=sys.stderr)
    if count == 0:
        raise ValueError(f"{db_path}: the database holds no records")
    mean = (total / np.float32(count)).astype(np.float32)[np.newaxis]
    if output is not None:
        save_mean_file(output, mean)
        if verbose:
            print(f"Write to {output}", file=sys.stderr)
    if verbose:
        print(f"Processed {count} files.", file=sys.stderr)
        print(f"Number of channels: {mean.shape[1]}", file=sys.stderr)
        for c in range(mean.shape[1]):
            print(f"mean_value channel [{c}]: {float(mean[0, c].mean()):.6g}", file=sys.stderr)
    return mean


def main(argv=None):
    ap = argparse.ArgumentParser(prog="python -m minicaffe.tools.compute_image_mean",
                                 description="Compute the mean image of an LMDB of Datums.")
    ap.add_argument("db", metavar="INPUT_DB")
    ap.add_argument("output", metavar="OUTPUT_FILE", nargs="?", default=None)
    ap.add_argument("--backend", default="lmdb", choices=["lmdb", "leveldb"],
                    help="the database to read (LevelDB through plyvel)")
    args = ap.parse_args(argv)
    try:
        compute_image_mean(args.db, args.output, backend=args.backend)
    except (OSError, ValueError, ImportError) as e:
        print(f"compute_image_mean: {e}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
