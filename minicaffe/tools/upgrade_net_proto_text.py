"""Rewrite a net prototxt in the current format (Caffe's ``upgrade_net_proto_text``).

Usage::

    python -m minicaffe.tools.upgrade_net_proto_text OLD.prototxt NEW.prototxt

The net is read as written and upgraded as Caffe's ``UpgradeNetAsNeeded`` does
(:func:`minicaffe.proto.upgrade_net`): V0 ``layers { layer { ... } }`` and V1 ``layers { }``
become ``layer { }``, data-layer transformation fields move to ``transform_param``, legacy
``input``/``input_dim`` become an Input layer, and old BatchNorm param specs are frozen.  A
net already in the current format is written back unchanged, with a note saying so.

Exit status, as Caffe's tool: 0 when the upgraded net is written; 1 on a wrong command line
(not IN and OUT: the usage is printed), and when the upgrade found problems (a V0 field that
does not apply to its layer's type is dropped: the net is written anyway, as Caffe writes
it) or could not be done (nothing is written: where Caffe aborts, or would index past a
list, minicaffe names the layer and the field instead); 2 when the input does not parse as
a NetParameter.  ``upgrade_net_proto_binary`` does the same for binary
files (``.caffemodel``).
"""
from __future__ import annotations

import argparse
import contextlib
import logging
import sys

from ..log import log
from ..proto import caffe_pb2, read_binary, write_binary, write_text
from ..proto.text import read_net_param
from ..proto.upgrade import (net_needs_batch_norm_upgrade, net_needs_data_upgrade,
                             net_needs_input_upgrade, net_needs_upgrade, net_needs_v0_upgrade,
                             net_needs_v1_upgrade, upgrade_net)
from . import _gflags

# what UpgradeNetAsNeeded says before each step it takes, as (check, the deprecated form)
_STEPS = (
    (net_needs_v0_upgrade, "V0LayerParameter"),
    (net_needs_data_upgrade, "transformation parameters"),
    (net_needs_v1_upgrade, "V1LayerParameter"),
    (net_needs_input_upgrade, "input fields"),
    (net_needs_batch_norm_upgrade, "BatchNorm layers"),
)
UPGRADE_FAILED = "Encountered error(s) while upgrading prototxt; see details above."


@contextlib.contextmanager
def upgrade_warnings_logged(prog: str):
    """The upgrade's own warnings (``minicaffe.proto.upgrade``'s logger) as this tool's log
    lines, in glog's shape like the rest, instead of bare lines from Python's logging."""
    class Forward(logging.Handler):
        def emit(self, record):
            log(record.getMessage(), level="W", where=prog)

    logger = logging.getLogger("minicaffe.proto.upgrade")
    handler, propagate = Forward(logging.WARNING), logger.propagate
    logger.addHandler(handler)
    logger.propagate = False
    try:
        yield
    finally:
        logger.removeHandler(handler)
        logger.propagate = propagate


def upgrade_net_proto(in_path, out_path, binary: bool = False,
                      prog: str = "upgrade_net_proto_text") -> int:
    """Read the NetParameter ``in_path`` (text, or binary with ``binary``), upgrade it and
    write it to ``out_path`` in the same form; return the tool's exit status (see the module
    doc) after logging what was done."""
    kind = "binary" if binary else "text"
    try:
        if binary:
            net = read_binary(in_path, caffe_pb2.NetParameter)
        else:
            net = read_net_param(in_path, upgrade=False)
    except (OSError, ValueError) as e:
        log(f"Failed to parse input {kind} file as NetParameter: {in_path} ({e})", level="E",
            where=prog)
        return 2
    success = True
    if net_needs_upgrade(net):
        for needs, what in _STEPS:
            if needs(net):
                log(f"Attempting to upgrade input file specified using deprecated {what}: "
                    f"{in_path}", where=prog)
        problems: list[str] = []
        try:
            with upgrade_warnings_logged(prog):
                net = upgrade_net(net, problems=problems)
        except ValueError as e:
            log(f"{in_path}: {e}", level="E", where=prog)
            log(f"{UPGRADE_FAILED} Nothing was written to {out_path}.", level="E", where=prog)
            return 1
        for problem in problems:
            log(f"{in_path}: {problem}", level="E", where=prog)
        if problems:
            success = False
            log(UPGRADE_FAILED, level="E", where=prog)
    else:
        log(f"File already in latest proto format: {in_path}", level="E", where=prog)
    try:
        (write_binary if binary else write_text)(net, out_path)
    except OSError as e:
        log(f"cannot write {out_path}: {e}", level="E", where=prog)
        return 1
    log(f"Wrote upgraded NetParameter {kind} proto to {out_path}", where=prog)
    return 0 if success else 1


def parse_args(argv, prog: str, what: str):
    """IN and OUT; a wrong command line prints the usage and exits with status 1, as Caffe's
    tools (``argc != 3``: return 1), so that 2 keeps meaning an input that does not parse."""
    ap = argparse.ArgumentParser(prog=f"python -m minicaffe.tools.{prog}",
                                 description=f"Upgrade a {what} to the current format.")
    ap.add_argument("input", metavar="IN", help=f"the {what} to upgrade")
    ap.add_argument("output", metavar="OUT", help="where to write the upgraded one")
    return _gflags.parse(ap, sys.argv[1:] if argv is None else list(argv), set(), set())


def main(argv=None) -> int:
    try:
        args = parse_args(argv, "upgrade_net_proto_text", "net prototxt (V0, V1 or current)")
    except SystemExit as e:          # usage (status 1, as Caffe) or --help
        return e.code
    return upgrade_net_proto(args.input, args.output)


if __name__ == "__main__":
    sys.exit(main())
