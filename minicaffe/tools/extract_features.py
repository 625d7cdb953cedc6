"""Features of a trained net's blobs, written to databases of Datums (Caffe's
``extract_features``).

Usage, with Caffe's arguments in Caffe's order::

    python -m minicaffe.tools.extract_features PRETRAINED_WEIGHTS FEATURE_EXTRACTION_PROTOTXT \\
        BLOB1[,BLOB2,...] DB1[,DB2,...] NUM_MINI_BATCHES DB_TYPE [CPU|GPU] [DEVICE_ID]

The net is built from the prototxt in the TEST phase, and its parameters are copied from
``PRETRAINED_WEIGHTS`` (a ``.caffemodel``, or an HDF5 ``.caffemodel.h5``).  It then runs
``NUM_MINI_BATCHES`` forward passes; its data layer decides which images each pass sees.
After each pass, every named blob of shape ``(N, ...)`` gives N Datums, one per image, to its
database: ``float_data`` holds the image's ``count / N`` values, and ``channels``, ``height``,
``width`` are the blob's legacy 4-d axes 1, 2 and 3 (1 where the blob has fewer axes, so an
``(N, D)`` feature is ``D x 1 x 1``).  No label is set.  The keys are the image's index in
that database, zero-padded to ten digits (``0000000000``, ``0000000001``, ...: Caffe's
``format_int(i, 10)``), so the key order is the extraction order.  ``DB_TYPE`` is ``lmdb`` or
``leveldb``.  As Caffe does, each database is committed every 1000 images and once more at
the end.

``GPU`` runs on the GPU (device ``DEVICE_ID``, default 0); where no CUDA device is visible
the tool says so and runs on the CPU.  Names are split at commas; there must be as many
databases as blobs, every blob must exist in the net, and no database may exist yet (Caffe
opens them as new).  A run that fails leaves no half-written database behind.
"""
from __future__ import annotations

import argparse
import contextlib
import sys

from ..backend import gpu_available, set_device, to_numpy
from ..io import LevelDBWriter, LMDBWriter, array_to_datum
from ..log import log
from . import _gflags

COMMIT_EVERY = 1000        # Caffe commits each database every 1000 images
KEY_DIGITS = 10            # caffe::format_int(index, 10)
DB_WRITERS = {"lmdb": LMDBWriter, "leveldb": LevelDBWriter}


def feature_key(index: int) -> str:
    """The key of the ``index``-th image in a feature database: ``0000000042``."""
    return f"{index:0{KEY_DIGITS}d}"


def split_names(names: str) -> list[str]:
    """Comma-separated names as Caffe's ``boost::split`` gives them (empty parts kept)."""
    return names.split(",")


def _legacy_shape(blob, name: str) -> tuple[int, int, int, int]:
    """``(num, channels, height, width)`` of a blob of at most 4 axes (Caffe's LegacyShape)."""
    if blob.ndim > 4:
        raise ValueError(f"feature blob {name!r} has {blob.ndim} axes {blob.shape}: a Datum "
                         "holds at most 4 (Caffe's legacy accessors refuse more)")
    return blob.num, blob.channels, blob.height, blob.width


def extract_features(weights, proto, blob_names, db_names, num_mini_batches: int,
                     db_type: str = "lmdb", mode: str = "CPU", device_id: int = 0,
                     verbose: bool = True) -> list[int]:
    """Run ``num_mini_batches`` forward passes of the TEST net ``proto`` with ``weights`` and
    write the features of each blob in ``blob_names`` to the new database of the same index in
    ``db_names`` (lists, or comma-separated strings); return the number of images written to
    each database."""
    from ..net import TEST, Net
    if isinstance(blob_names, str):
        blob_names = split_names(blob_names)
    if isinstance(db_names, str):
        db_names = split_names(db_names)
    blob_names, db_names = list(blob_names), list(db_names)
    # the checks that need no net come first, so a typo does not wait for the weights
    if len(blob_names) != len(db_names):
        raise ValueError(f"the number of blob names ({len(blob_names)}: "
                         f"{','.join(blob_names)}) and dataset names ({len(db_names)}: "
                         f"{','.join(db_names)}) must be equal")
    if db_type not in DB_WRITERS:
        raise ValueError(f"unknown database backend {db_type!r} (known: "
                         f"{', '.join(DB_WRITERS)})")
    if num_mini_batches < 0:
        raise ValueError(f"NUM_MINI_BATCHES must be 0 or more, got {num_mini_batches}")
    say = log if verbose else (lambda *a, **k: None)
    mode = str(mode).upper()
    if mode == "GPU":
        if device_id < 0:
            raise ValueError(f"DEVICE_ID must be 0 or more, got {device_id}")
        if gpu_available():
            say("Using GPU", level="E", where="extract_features")
            say(f"Using Device_id={device_id}", level="E", where="extract_features")
            set_device(device_id)
        else:
            say("GPU mode asked for, but no CUDA device is visible: running on the CPU",
                level="W", where="extract_features")
            mode = "CPU"
    if mode == "CPU":
        say("Using CPU", level="E", where="extract_features")

    net = Net(proto, TEST, mode=mode)
    net.copy_from(weights)
    for name in blob_names:
        if name not in net.blobs:
            raise ValueError(f"Unknown feature blob name {name!r} in the network {proto} "
                             f"(its blobs: {', '.join(net.blobs)})")

    counts = [0] * len(blob_names)
    with contextlib.ExitStack() as stack:
        dbs = []
        for db_name in db_names:
            say(f"Opening dataset {db_name}", where="extract_features")
            dbs.append(stack.enter_context(DB_WRITERS[db_type](db_name)))
        say("Extracting Features", level="E", where="extract_features")
        for _ in range(num_mini_batches):
            net.forward_from_to()
            for i, (name, db) in enumerate(zip(blob_names, dbs)):
                blob = net.blobs[name]
                num, channels, height, width = _legacy_shape(blob, name)
                # one device-to-host copy per blob and pass (a sync on the GPU)
                features = to_numpy(blob.data).reshape(num, channels, height, width)
                for image in features:
                    # a float array fills float_data, as Caffe's add_float_data loop
                    db.put(feature_key(counts[i]), array_to_datum(image).SerializeToString())
                    counts[i] += 1
                    if counts[i] % COMMIT_EVERY == 0:
                        db.commit()
                        say(f"Extracted features of {counts[i]} query images for feature "
                            f"blob {name}", level="E", where="extract_features")
        for name, db, count in zip(blob_names, dbs, counts):
            if count % COMMIT_EVERY:
                db.commit()
            say(f"Extracted features of {count} query images for feature blob {name}",
                level="E", where="extract_features")
    say("Successfully extracted the features!", level="E", where="extract_features")
    return counts


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(
        prog="python -m minicaffe.tools.extract_features",
        description="Run a trained net over its input data layer and write the features of "
                    "the named blobs, one Datum per image, to new databases.  Several blobs "
                    "go to several databases in one pass: give the names separated by commas, "
                    "as many databases as blobs.")
    ap.add_argument("weights", metavar="PRETRAINED_WEIGHTS",
                    help="the trained parameters (.caffemodel or .caffemodel.h5)")
    ap.add_argument("proto", metavar="FEATURE_EXTRACTION_PROTOTXT",
                    help="the net, built in the TEST phase, with an input data layer")
    ap.add_argument("blobs", metavar="BLOB1[,BLOB2,...]", help="the blobs to extract")
    ap.add_argument("dbs", metavar="DB1[,DB2,...]", help="the new databases, one per blob")
    ap.add_argument("num_mini_batches", metavar="NUM_MINI_BATCHES", type=int,
                    help="forward passes to run (images: this times the batch size)")
    ap.add_argument("db_type", metavar="DB_TYPE", help="lmdb or leveldb")
    ap.add_argument("mode", metavar="CPU|GPU", nargs="?", default="CPU",
                    choices=["CPU", "GPU"], help="default CPU")
    ap.add_argument("device_id", metavar="DEVICE_ID", nargs="?", type=int, default=0,
                    help="the GPU with GPU (default 0)")
    try:   # a wrong command line: the usage and status 1, as Caffe's (argc < 7: return 1)
        args = _gflags.parse(ap, sys.argv[1:] if argv is None else list(argv), set(), set())
    except SystemExit as e:
        return e.code
    try:
        extract_features(args.weights, args.proto, args.blobs, args.dbs, args.num_mini_batches,
                         args.db_type, args.mode, args.device_id)
    except (OSError, ValueError, KeyError, RuntimeError, ImportError) as e:
        print(f"extract_features: {e}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
