"""Classify images from the command line (pycaffe's ``python/classify.py``).

Usage::

    python -m minicaffe.tools.classify INPUT_FILE OUTPUT_FILE --model_def deploy.prototxt
        --pretrained_model weights.caffemodel --mean_file mean.npy|''
        [--gpu] [--center_only] [--images_dim 256,256] [--input_scale S] [--raw_scale 255]
        [--channel_swap 2,1,0] [--ext jpg] [--print_results --labels_file synset_words.txt]

``INPUT_FILE`` is an image, a directory (every ``*.EXT`` file in it, ``--ext`` default
``jpg``) or a ``.npy`` array of images ``(N, H, W, K)``.  Images are loaded with
``caffe.io.load_image`` (RGB, values in [0, 1]) and classified by ``caffe.Classifier``:
resized to ``--images_dim``, then the 10 oversampled crops averaged, or with
``--center_only`` the centre crop alone.  The predictions ``(N, classes)`` are saved with
``np.save`` to ``OUTPUT_FILE`` (which gets ``.npy`` appended where it lacks it).

The defaults and the printed lines are pycaffe's (``CPU mode``, ``Loading file: ...``,
``Classifying N inputs.``, ``Done in X s.``, ``Saving results into ...``).  Where it
differs, on purpose:

* ``--model_def``, ``--pretrained_model`` and ``--mean_file`` are required: pycaffe's
  defaults are files of Caffe's source tree (``models/bvlc_reference_caffenet/`` and
  ``python/caffe/imagenet/ilsvrc_2012_mean.npy``); ``--mean_file ''`` still means no mean,
  as in pycaffe.  ``--labels_file`` likewise (pycaffe's is ``data/ilsvrc12/synset_words.txt``)
  where ``--print_results`` needs it.
* A directory's files are classified in sorted order (pycaffe's glob order is the file
  system's, so the rows of the output could not be matched to the files).
* ``--print_results`` prints the top 5 of the first image as pycaffe's Python 2 ``print
  meta`` did, without pandas: ``[(name, '0.12345'), ...]``, the names being the labels
  file's lines sorted by synset id, each without its id and cut at the first comma.
* Problems end with one line and status 1 (an empty directory, a missing file, ``--gpu``
  without a CUDA device), where pycaffe ends in a traceback.
"""
from __future__ import annotations

import argparse
import glob
import os
import sys
import time

import numpy as np

from .. import backend
from .. import io as caffe_io
from ..classifier import Classifier

CAFFE_TREE_DEFAULTS = {
    "model_def": "models/bvlc_reference_caffenet/deploy.prototxt",
    "pretrained_model": "models/bvlc_reference_caffenet/bvlc_reference_caffenet.caffemodel",
    "mean_file": "python/caffe/imagenet/ilsvrc_2012_mean.npy",
    "labels_file": "data/ilsvrc12/synset_words.txt",
}


def load_inputs(input_file: str, ext: str = "jpg"):
    """The images of ``input_file`` (a .npy of images, a directory's ``*.ext`` files in
    sorted order, or one image file), with pycaffe's "Loading ..." line."""
    input_file = os.path.expanduser(input_file)
    if input_file.endswith("npy"):
        print(f"Loading file: {input_file}")
        return np.load(input_file)
    if os.path.isdir(input_file):
        print(f"Loading folder: {input_file}")
        files = sorted(glob.glob(input_file + "/*." + ext))
        if not files:
            raise ValueError(f"{input_file}: no *.{ext} files to classify (--ext names the "
                             "extension)")
        return [caffe_io.load_image(f) for f in files]
    print(f"Loading file: {input_file}")
    return [caffe_io.load_image(input_file)]


def top5_labels(predictions: np.ndarray, labels_file) -> list[tuple[str, str]]:
    """pycaffe's ``--print_results``: the first image's 5 best classes as ``(name,
    '%.5f' % probability)``, the names from a synset_words file (``id name, other
    names``) sorted by synset id."""
    entries = []
    with open(labels_file) as f:
        for line in f:
            words = line.strip().split(" ")
            entries.append((words[0], " ".join(words[1:]).split(",")[0]))
    names = [name for _, name in sorted(entries, key=lambda e: e[0])]
    first = np.asarray(predictions[0])
    if len(names) < first.size:
        raise ValueError(f"{labels_file}: {len(names)} labels for {first.size} classes")
    return [(names[i], "%.5f" % first[i]) for i in (-first).argsort()[:5]]


def use_device(gpu: bool):
    """pycaffe's tools' mode switch: GPU mode (a RuntimeError where no device is visible) or
    CPU mode, announced as they print it."""
    if gpu:
        if not backend.gpu_available():
            raise RuntimeError("--gpu: no CUDA device is visible (leave out --gpu to run on "
                               "the CPU)")
        backend.set_mode_gpu()
        print("GPU mode")
    else:
        backend.set_mode_cpu()
        print("CPU mode")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m minicaffe.tools.classify",
                                 description="Classify images with a caffe.Classifier and "
                                             "save the predictions as .npy.")
    ap.add_argument("input_file", help="Input image, directory, or npy.")
    ap.add_argument("output_file", help="Output npy filename.")
    ap.add_argument("--model_def",
                    help="Model definition file (required: pycaffe's default is Caffe's "
                         f"{CAFFE_TREE_DEFAULTS['model_def']}).")
    ap.add_argument("--pretrained_model",
                    help="Trained model weights file (required: pycaffe's default is Caffe's "
                         f"{CAFFE_TREE_DEFAULTS['pretrained_model']}).")
    ap.add_argument("--gpu", action="store_true", help="Switch for gpu computation.")
    ap.add_argument("--center_only", action="store_true",
                    help="Switch for prediction from center crop alone instead of averaging "
                         "predictions across crops (default).")
    ap.add_argument("--images_dim", default="256,256",
                    help="Canonical 'height,width' dimensions of input images.")
    ap.add_argument("--mean_file",
                    help="Data set image mean of [Channels x Height x Width] dimensions "
                         "(numpy array). Set to '' for no mean subtraction. Required: "
                         f"pycaffe's default is Caffe's {CAFFE_TREE_DEFAULTS['mean_file']}.")
    ap.add_argument("--input_scale", type=float,
                    help="Multiply input features by this scale to finish preprocessing.")
    ap.add_argument("--raw_scale", type=float, default=255.0,
                    help="Multiply raw input by this scale before preprocessing.")
    ap.add_argument("--channel_swap", default="2,1,0",
                    help="Order to permute input channels. The default converts RGB -> BGR "
                         "since BGR is the Caffe default by way of OpenCV.")
    ap.add_argument("--ext", default="jpg",
                    help="Image file extension to take as input when a directory is given as "
                         "the input file.")
    ap.add_argument("--labels_file",
                    help="Readable label definition file (needed by --print_results; "
                         f"pycaffe's default is Caffe's {CAFFE_TREE_DEFAULTS['labels_file']}).")
    ap.add_argument("--print_results", action="store_true",
                    help="Write output text to stdout rather than serializing to a file.")
    args = ap.parse_args(argv)

    needed = ["model_def", "pretrained_model", "mean_file"]
    if args.print_results:
        needed.append("labels_file")
    missing = [n for n in needed if getattr(args, n) is None]
    if missing:
        ap.error("; ".join(f"--{n} is required: pycaffe's default, "
                           f"{CAFFE_TREE_DEFAULTS[n]}, is a file of Caffe's source tree"
                           for n in missing)
                 + (" (--mean_file '' classifies without a mean)"
                    if "mean_file" in missing else ""))
    prog = ap.prog
    try:
        image_dims = [int(s) for s in args.images_dim.split(",")]
        channel_swap = ([int(s) for s in args.channel_swap.split(",")]
                        if args.channel_swap else None)
    except ValueError:
        ap.error("--images_dim takes 'height,width' and --channel_swap comma-separated "
                 "integers")

    try:
        mean = np.load(args.mean_file).mean(1).mean(1) if args.mean_file else None
        use_device(args.gpu)
        classifier = Classifier(args.model_def, args.pretrained_model, image_dims=image_dims,
                                mean=mean, input_scale=args.input_scale,
                                raw_scale=args.raw_scale, channel_swap=channel_swap)
        inputs = load_inputs(args.input_file, args.ext)
        print(f"Classifying {len(inputs)} inputs.")
        start = time.time()
        predictions = classifier.predict(inputs, not args.center_only)
        print(f"Done in {time.time() - start:.2f} s.")
        if args.print_results:
            print(top5_labels(predictions, args.labels_file))
        print(f"Saving results into {args.output_file}")
        np.save(args.output_file, predictions)
    except (OSError, ValueError, RuntimeError, ImportError) as e:
        print(f"{prog}: {e}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
