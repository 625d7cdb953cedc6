"""Windowed detection from the command line (pycaffe's ``python/detect.py``).

Usage::

    python -m minicaffe.tools.detect windows.csv out.csv --model_def deploy.prototxt
        --pretrained_model weights.caffemodel --crop_mode list
        [--mean_file mean.npy] [--raw_scale 255] [--channel_swap 2,1,0] [--context_pad 16]

Input: with ``--crop_mode list``, a CSV whose header names the columns
``filename``, ``ymin``, ``xmin``, ``ymax``, ``xmax`` (any order, other columns
ignored), one window a row; with ``--crop_mode selective_search`` (needs the
``selective_search_ijcv_with_python`` package), a ``.txt`` list of image
filenames, one a line.

Output: a CSV with a header ``filename,ymin,xmin,ymax,xmax,class0,...`` and one
row per window, in input order (images in order of first appearance, windows
as listed), the classes being the net's first output.

Differences from pycaffe's script: it builds a pandas DataFrame and writes
``.csv`` or HDF5 through ``DataFrame.to_hdf`` (pandas' HDFStore, PyTables);
minicaffe has neither dependency, so only CSV is written and any other
extension is refused.  pycaffe's CSV branch cannot run (it reads an undefined
``NUM_OUTPUT`` and a ``'feat'`` column that detections do not have); the CSV
here has the columns that code names.  The model files have no defaults
(pycaffe's point into its source tree), and there is no mean by default.
"""
from __future__ import annotations

import argparse
import csv
import sys
import time

import numpy as np

from ..detector import Detector
from .classify import use_device

CROP_MODES = ["list", "selective_search"]
COORD_COLS = ["ymin", "xmin", "ymax", "xmax"]


def read_window_csv(path) -> list:
    """(filename, [window, ...]) pairs from a window CSV, filenames in order of
    first appearance; each window an int64 (4,) array (ymin, xmin, ymax, xmax)."""
    grouped: dict = {}
    with open(path, newline="") as f:
        reader = csv.DictReader(f, skipinitialspace=True)
        missing = [c for c in ["filename"] + COORD_COLS if c not in (reader.fieldnames or [])]
        if missing:
            raise ValueError(f"{path}: the header lacks the column(s) {missing}; it needs "
                             f"filename, {', '.join(COORD_COLS)}")
        for line, row in enumerate(reader, start=2):
            try:
                window = np.array([float(row[c]) for c in COORD_COLS])
            except (TypeError, ValueError):
                raise ValueError(f"{path}:{line}: window coordinates must be numbers, got "
                                 f"{[row[c] for c in COORD_COLS]}") from None
            grouped.setdefault(row["filename"], []).append(window.astype(np.int64))
    return list(grouped.items())


def write_detections_csv(path, detections) -> None:
    """One row per detection: filename, the window's coordinates, class0..."""
    n_classes = np.asarray(detections[0]["prediction"]).size if detections else 0
    with open(path, "w", newline="") as f:
        out = csv.writer(f)
        out.writerow(["filename"] + COORD_COLS + [f"class{i}" for i in range(n_classes)])
        for d in detections:
            prediction = np.asarray(d["prediction"]).ravel()
            out.writerow([d["filename"]] + [int(c) for c in d["window"]]
                         + [repr(float(p)) for p in prediction])


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m minicaffe.tools.detect",
                                 description="Classify windows of images with a Detector.")
    ap.add_argument("input_file", help="Input .csv of windows (header: filename, ymin, xmin, "
                                       "ymax, xmax) or, for selective_search, a .txt list of "
                                       "image filenames.")
    ap.add_argument("output_file", help="Output .csv (HDF5 is not supported).")
    ap.add_argument("--model_def", required=True, help="Model definition file.")
    ap.add_argument("--pretrained_model", required=True, help="Trained model weights file.")
    ap.add_argument("--crop_mode", default="selective_search", choices=CROP_MODES,
                    help="How to generate windows for detection.")
    ap.add_argument("--gpu", action="store_true", help="Switch for gpu computation.")
    ap.add_argument("--mean_file", default="",
                    help="Data set image mean of K x H x W dimensions (numpy array), "
                         "averaged per channel. Empty (the default) for no mean subtraction.")
    ap.add_argument("--input_scale", type=float,
                    help="Multiply input features by this scale to finish preprocessing.")
    ap.add_argument("--raw_scale", type=float, default=255.0,
                    help="Multiply raw input by this scale before preprocessing.")
    ap.add_argument("--channel_swap", default="2,1,0",
                    help="Order to permute input channels. The default converts RGB -> BGR "
                         "since BGR is the Caffe default by way of OpenCV.")
    ap.add_argument("--context_pad", type=int, default=16,
                    help="Amount of surrounding context to collect in input window.")
    args = ap.parse_args(argv)
    prog = ap.prog

    if not args.output_file.lower().endswith("csv"):
        print(f"{prog}: output {args.output_file!r}: only .csv is written (pycaffe's HDF5 "
              "output is pandas' DataFrame.to_hdf, not available here)", file=sys.stderr)
        return 1
    try:
        channel_swap = ([int(s) for s in args.channel_swap.split(",")]
                        if args.channel_swap else None)
    except ValueError:
        ap.error("--channel_swap takes comma-separated integers")
    try:        # a wrong file, device, pad or window: one line and status 1, as classify
        mean = None
        if args.mean_file:
            mean = np.load(args.mean_file)
            if mean.ndim == 3:
                mean = mean.mean(1).mean(1)        # (K, H, W) -> per channel (K,)
        use_device(args.gpu)

        detector = Detector(args.model_def, args.pretrained_model, mean=mean,
                            input_scale=args.input_scale, raw_scale=args.raw_scale,
                            channel_swap=channel_swap, context_pad=args.context_pad)

        t = time.time()
        print("Loading input...")
        if args.crop_mode == "list":
            if not args.input_file.lower().endswith("csv"):
                raise ValueError(f"{args.input_file}: crop_mode list needs a .csv of windows")
            detections = detector.detect_windows(read_window_csv(args.input_file))
        else:
            with open(args.input_file) as f:
                fnames = [line.strip() for line in f if line.strip()]
            detections = detector.detect_selective_search(fnames)
    except (OSError, ValueError, RuntimeError, ImportError) as e:
        print(f"{prog}: {e}", file=sys.stderr)
        return 1
    print(f"Processed {len(detections)} windows in {time.time() - t:.3f} s.")

    t = time.time()
    write_detections_csv(args.output_file, detections)
    print(f"Saved to {args.output_file} in {time.time() - t:.3f} s.")
    return 0


if __name__ == "__main__":
    sys.exit(main())
