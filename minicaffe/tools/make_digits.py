"""Write the bundled 8x8 digits as Caffe databases.

Usage::

    python -m minicaffe.tools.make_digits --out data/digits [--force]

Creates, in ``--out``:

* ``train_lmdb`` (1437 images) and ``test_lmdb`` (360 images): Datums with
  ``channels=1, height=8, width=8``, uint8 pixels 0..255 and the digit as
  label, keyed ``%08d_digit%04d`` (record index, row of the source file);
* ``mean.binaryproto``: the mean image of the training set, as
  ``compute_image_mean`` writes it.

The split is stratified by class and fixed (:func:`minicaffe.datasets.split_digits`),
so every run on every machine writes the same records.  Existing outputs are
kept (the command only reports them) unless ``--force`` is given; a partial
set is rebuilt.  The three outputs take about half a megabyte.
"""
from __future__ import annotations

import argparse
import os
import shutil
import sys

from ..datasets import DIGITS_TEST_SIZE, load_digits, split_digits
from ..io import LMDBWriter, array_to_datum
from .compute_image_mean import compute_image_mean

OUTPUTS = ("train_lmdb", "test_lmdb", "mean.binaryproto")


def _write_lmdb(path, images, labels, rows):
    with LMDBWriter(path) as db:
        for i, row in enumerate(rows):
            datum = array_to_datum(images[row], int(labels[row]))
            db.put(f"{i:08d}_digit{int(row):04d}", datum.SerializeToString())


def make_digits(out, force: bool = False, test_size: int = DIGITS_TEST_SIZE, seed: int = 0,
                verbose: bool = True) -> dict:
    """Write the digits databases and mean into ``out``; return the output paths.

    Skips the work when all outputs exist and ``force`` is false.
    """
    paths = {name: os.path.join(out, name) for name in OUTPUTS}
    if not force and all(os.path.exists(p) for p in paths.values()):
        if verbose:
            print(f"{out}: digits databases already present (use --force to rewrite)",
                  file=sys.stderr)
        return paths
    os.makedirs(out, exist_ok=True)
    for p in paths.values():
        if os.path.isdir(p):
            shutil.rmtree(p)
        elif os.path.exists(p):
            os.remove(p)
    images, labels = load_digits()
    train, test = split_digits(labels, test_size=test_size, seed=seed)
    _write_lmdb(paths["train_lmdb"], images, labels, train)
    _write_lmdb(paths["test_lmdb"], images, labels, test)
    compute_image_mean(paths["train_lmdb"], paths["mean.binaryproto"], verbose=False)
    if verbose:
        print(f"{out}: wrote {len(train)} training and {len(test)} test images and the mean "
              "image", file=sys.stderr)
    return paths


def main(argv=None):
    ap = argparse.ArgumentParser(prog="python -m minicaffe.tools.make_digits",
                                 description="Write the bundled 8x8 digits as train/test LMDBs "
                                             "and a mean.binaryproto.")
    ap.add_argument("--out", default=os.path.join("data", "digits"),
                    help="output folder (default: data/digits)")
    ap.add_argument("--force", action="store_true", help="rewrite existing outputs")
    ap.add_argument("--test_size", type=int, default=DIGITS_TEST_SIZE,
                    help=f"images in the test set (default {DIGITS_TEST_SIZE})")
    ap.add_argument("--seed", type=int, default=0, help="seed of the split (default 0)")
    args = ap.parse_args(argv)
    try:
        make_digits(args.out, force=args.force, test_size=args.test_size, seed=args.seed)
    except (OSError, ValueError, ImportError) as e:
        print(f"make_digits: {e}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
