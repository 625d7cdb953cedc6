"""Convert a set of images to an LMDB of Datum records (Caffe's ``convert_imageset``).

Usage::

    python -m minicaffe.tools.convert_imageset [--gray] [--shuffle] [--seed S]
        [--resize_height H --resize_width W] [--check_size] ROOTFOLDER/ LISTFILE DB_NAME

``LISTFILE`` has one ``relative/path label`` per line (the label is the text
after the last space, so paths may contain spaces).  Images are read from
``ROOTFOLDER/relative/path``:

* PNG, JPEG and whatever else Pillow reads (Pillow is needed for them), as
  3 channels in BGR order, as Caffe's OpenCV reader gives them, or 1 grey
  channel with ``--gray``; resized as OpenCV's INTER_LINEAR does
  (:func:`minicaffe.io.resize_inter_linear`) when both ``--resize_height`` and
  ``--resize_width`` are given;
* ``.npy`` arrays of shape ``(C, H, W)`` or ``(H, W)``, stored as they are
  (uint8 as bytes, other types as ``float_data``).

Records are keyed ``"%08d_%s" % (line index, path)`` as Caffe's tool, so the
database's key order is the list's order (after ``--shuffle``).  Files that
cannot be read are skipped with a warning, as Caffe does.  Encoded Datums
(``--encoded``) are not written.
"""
from __future__ import annotations

import argparse
import os
import sys
import warnings

import numpy as np

from ..io import (LevelDBWriter, LMDBWriter, array_to_datum, pil_to_array, require_pillow,
                  resize_inter_linear)

COMMIT_EVERY = 1000


def read_list(listfile):
    """``[(path, label), ...]`` from a list file of ``path label`` lines."""
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


def load_image(path, is_color: bool = True, resize_height: int = 0, resize_width: int = 0):
    """One image as a ``(C, H, W)`` array (see the module doc for the formats)."""
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
    Image = require_pillow()
    with Image.open(path) as img:
        img.load()
        if resize_height > 0 and resize_width > 0:
            img = img.convert("RGB" if is_color else "L")
            img = Image.fromarray(resize_inter_linear(np.asarray(img), resize_height,
                                                      resize_width))
        return pil_to_array(img, is_color=is_color)


def convert_imageset(root, listfile, db_path, gray: bool = False, shuffle: bool = False,
                     resize_height: int = 0, resize_width: int = 0, check_size: bool = False,
                     seed: int | None = None, verbose: bool = True, backend: str = "lmdb") -> int:
    """Write the images of ``listfile`` under ``root`` to a new LMDB (or LevelDB); return the
    record count."""
    lines = read_list(listfile)
    if not lines:
        raise ValueError(f"{listfile}: no images listed")
    if shuffle:
        # Caffe shuffles with its own RNG (unseeded: a new order each run);
        # give --seed for a reproducible order.
        order = np.random.default_rng(seed).permutation(len(lines))
        lines = [lines[i] for i in order]
        if verbose:
            print("Shuffling data", file=sys.stderr)
    if any(not p.lower().endswith(".npy") for p, _ in lines):
        require_pillow()  # fail once, up front, rather than skip every file
    if verbose:
        print(f"A total of {len(lines)} images.", file=sys.stderr)
    first_size = None
    with (LevelDBWriter if backend == "leveldb" else LMDBWriter)(db_path) as db:
        count = 0
        for line_id, (rel, label) in enumerate(lines):
            full = os.path.join(root, rel)
            try:
                image = load_image(full, not gray, resize_height, resize_width)
            except (OSError, ValueError) as e:
                warnings.warn(f"could not read {full}: {e}; skipped", stacklevel=2)
                continue
            datum = array_to_datum(image, label)
            if check_size:
                size = image.size
                if first_size is None:
                    first_size = size
                elif size != first_size:
                    raise ValueError(f"{full}: incorrect data field size {size}, the first image "
                                     f"has {first_size}")
            db.put(f"{line_id:08d}_{rel}", datum.SerializeToString())
            count += 1
            if count % COMMIT_EVERY == 0:
                db.commit()
                if verbose:
                    print(f"Processed {count} files.", file=sys.stderr)
        if count == 0:
            raise ValueError(f"{listfile}: none of the {len(lines)} images could be read")
    if verbose and count % COMMIT_EVERY:
        print(f"Processed {count} files.", file=sys.stderr)
    return count


def main(argv=None):
    ap = argparse.ArgumentParser(
        prog="python -m minicaffe.tools.convert_imageset",
        description="Convert a set of images to an LMDB of Datum records. LISTFILE holds "
                    "'relative/path label' lines; paths are relative to ROOTFOLDER.")
    ap.add_argument("root", metavar="ROOTFOLDER/")
    ap.add_argument("listfile", metavar="LISTFILE")
    ap.add_argument("db", metavar="DB_NAME")
    ap.add_argument("--gray", action="store_true", help="read images as 1 grey channel")
    ap.add_argument("--shuffle", action="store_true", help="shuffle the order of the images")
    ap.add_argument("--seed", type=int, default=None, help="seed of --shuffle (default: random)")
    ap.add_argument("--resize_height", type=int, default=0)
    ap.add_argument("--resize_width", type=int, default=0)
    ap.add_argument("--check_size", action="store_true",
                    help="check that all the images have the same size")
    ap.add_argument("--backend", default="lmdb", choices=["lmdb", "leveldb"],
                    help="the database to write (LevelDB through plyvel)")
    args = ap.parse_args(argv)
    try:
        convert_imageset(args.root, args.listfile, args.db, gray=args.gray, shuffle=args.shuffle,
                         resize_height=args.resize_height, resize_width=args.resize_width,
                         check_size=args.check_size, seed=args.seed, backend=args.backend)
    except (OSError, ValueError, ImportError) as e:
        print(f"convert_imageset: {e}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
