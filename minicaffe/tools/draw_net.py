"""Draw a graph of a net (pycaffe's ``python/draw_net.py``).

Usage::

    python -m minicaffe.tools.draw_net NET.prototxt OUT.png [--rankdir LR] [--phase TRAIN]
                                       [--display_lrm]

The output's extension names the format: png, svg, pdf... run Graphviz's ``dot``;
``.dot`` and ``.raw`` write the DOT text and need only pydot.  Unlike pycaffe's
script, which merges the text as written, the net is read as ``caffe.Net`` reads
it: a legacy (V0/V1) net is upgraded first, so its layers are drawn, and a syntax
error names the file, line and column.
"""
from __future__ import annotations

import argparse
import sys

from .. import draw
from ..proto import caffe_pb2
from ..proto.text import PrototxtError, read_net_param


def add_arguments(ap: argparse.ArgumentParser) -> None:
    """pycaffe draw_net.py's arguments (shared with ``minicaffe draw``)."""
    ap.add_argument("input_net_proto_file", help="Input network prototxt file")
    ap.add_argument("output_image_file",
                    help="Output image file; its extension names the format (png, svg, pdf, "
                         "or dot/raw for the DOT text)")
    ap.add_argument("--rankdir", default="LR",
                    help="One of TB (top-bottom, i.e., vertical), RL (right-left, i.e., "
                         "horizontal), or another valid dot option; see "
                         "http://www.graphviz.org/doc/info/attrs.html#k:rankdir")
    ap.add_argument("--phase", default="ALL", choices=["TRAIN", "TEST", "ALL"],
                    help="Which network phase to draw: TRAIN, TEST, or ALL (every layer, "
                         "whatever its phase)")
    ap.add_argument("--display_lrm", action="store_true",
                    help="Show the learning rate multipliers, when non-zero, of the learning "
                         "layers (Convolution, Deconvolution, InnerProduct)")


def run(args, prog: str = "draw_net") -> int:
    """Draw ``args.input_net_proto_file``; 0, or 1 with one error line on stderr."""
    try:
        net = read_net_param(args.input_net_proto_file)
    except (OSError, PrototxtError) as e:
        print(f"{prog}: {e}", file=sys.stderr)
        return 1
    phase = None if args.phase == "ALL" else caffe_pb2.Phase.Value(args.phase)
    print("Drawing net to %s" % args.output_image_file)
    try:
        draw.draw_net_to_file(net, args.output_image_file, args.rankdir, phase,
                              args.display_lrm)
    except (ImportError, OSError, ValueError, RuntimeError) as e:
        print(f"{prog}: {e}", file=sys.stderr)
        return 1
    return 0


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m minicaffe.tools.draw_net",
                                 description="Draw a graph of the net architecture.",
                                 formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    add_arguments(ap)
    return run(ap.parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())
