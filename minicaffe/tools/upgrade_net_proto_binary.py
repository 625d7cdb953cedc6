"""Rewrite a binary net (``.caffemodel``) in the current format (Caffe's
``upgrade_net_proto_binary``).

Usage::

    python -m minicaffe.tools.upgrade_net_proto_binary OLD.caffemodel NEW.caffemodel

The same upgrade and exit status as ``upgrade_net_proto_text`` (see its module doc), on a
binary NetParameter: the layers keep their blobs, so the weights of an old model load into a
net that names its layers the same way.
"""
from __future__ import annotations

import sys

from .upgrade_net_proto_text import parse_args, upgrade_net_proto


def main(argv=None) -> int:
    try:
        args = parse_args(argv, "upgrade_net_proto_binary", "binary net (.caffemodel)")
    except SystemExit as e:          # usage (status 1, as Caffe) or --help
        return e.code
    return upgrade_net_proto(args.input, args.output, binary=True,
                             prog="upgrade_net_proto_binary")


if __name__ == "__main__":
    sys.exit(main())
