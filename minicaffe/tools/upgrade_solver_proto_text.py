"""Rewrite a solver prototxt in the current format (Caffe's ``upgrade_solver_proto_text``).

Usage::

    python -m minicaffe.tools.upgrade_solver_proto_text OLD_solver.prototxt NEW_solver.prototxt

The solver is read as written and upgraded as Caffe's ``UpgradeSolverAsNeeded`` does
(:func:`minicaffe.proto.upgrade_solver`): the deprecated ``solver_type`` enum (``NESTEROV``)
becomes the ``type`` string (``"Nesterov"``).  Nets given inline are left as written, and
``snapshot_prefix`` is not touched (Caffe's tool does neither).  A solver already in the
current format is written back unchanged, with a note saying so.

Exit status, as Caffe's tool: 0 when the solver is written; 1 on a wrong command line (the
usage is printed) and when it cannot be upgraded (both ``solver_type`` and ``type`` given:
Caffe aborts there, and nothing is written); 2 when the input does not parse as a
SolverParameter.
"""
from __future__ import annotations

import sys

from ..log import log
from ..proto import write_text
from ..proto.text import read_solver_param
from ..proto.upgrade import solver_needs_upgrade, upgrade_solver
from .upgrade_net_proto_text import UPGRADE_FAILED, parse_args

PROG = "upgrade_solver_proto_text"


def upgrade_solver_proto(in_path, out_path) -> int:
    """Read the SolverParameter prototxt ``in_path``, upgrade it and write it to ``out_path``;
    return the tool's exit status (see the module doc) after logging what was done."""
    try:
        solver = read_solver_param(in_path, upgrade=False)
    except (OSError, ValueError) as e:
        log(f"Failed to parse input text file as SolverParameter: {in_path} ({e})", level="E",
            where=PROG)
        return 2
    if solver_needs_upgrade(solver):
        log("Attempting to upgrade input file specified using deprecated 'solver_type' field "
            f"(enum): {in_path}", where=PROG)
        try:
            solver = upgrade_solver(solver)
        except ValueError as e:
            log(f"{in_path}: {e}", level="E", where=PROG)
            log(f"{UPGRADE_FAILED} Nothing was written to {out_path}.", level="E", where=PROG)
            return 1
    else:
        log(f"File already in latest proto format: {in_path}", level="E", where=PROG)
    try:
        write_text(solver, out_path)
    except OSError as e:
        log(f"cannot write {out_path}: {e}", level="E", where=PROG)
        return 1
    log(f"Wrote upgraded SolverParameter text proto to {out_path}", where=PROG)
    return 0


def main(argv=None) -> int:
    try:
        args = parse_args(argv, PROG, "solver prototxt")
    except SystemExit as e:          # usage (status 1, as Caffe) or --help
        return e.code
    return upgrade_solver_proto(args.input, args.output)


if __name__ == "__main__":
    sys.exit(main())
