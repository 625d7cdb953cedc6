"""Caffe's C++ tools read their flags with gflags; these helpers let an argparse parser take
the same command lines.

gflags accepts ``-flag`` and ``--flag`` alike, a value after ``=`` or as the next word, and
for a boolean ``-flag``, ``-flag=true|false`` (also 1/0, yes/no, t/f, y/n) and
``-noflag``.  A boolean never takes the next word (``-gray true`` leaves ``true`` a
positional argument).  ``--`` ends the flags.  On a wrong command line Caffe's tools print
their usage and exit with status 1 (``ShowUsageWithFlagsRestrict``; gflags' own errors,
such as an unknown flag, also exit 1), where argparse exits 2.

:func:`add_bool` defines a boolean as ``--flag`` (store_true) and a hidden ``--noflag``
(store_false); :func:`parse` rewrites the gflags spellings into those and parses.
"""
from __future__ import annotations

import argparse

TRUE = ("true", "t", "yes", "y", "1")
FALSE = ("false", "f", "no", "n", "0")


def add_bool(ap: argparse.ArgumentParser, name: str, help: str) -> None:
    """A gflags boolean ``name`` (default false): ``--name`` and a hidden ``--noname``."""
    ap.add_argument(f"--{name}", dest=name, action="store_true", default=False, help=help)
    ap.add_argument(f"--no{name}", dest=name, action="store_false", help=argparse.SUPPRESS)


def normalize(argv: list[str], bools: set[str], values: set[str]) -> list[str]:
    """``argv`` with gflags' spellings of the named flags rewritten as argparse's
    ``--name``, ``--noname`` and ``--name=value``.  Anything else is left for argparse
    (which names an unknown flag)."""
    out: list[str] = []
    for i, arg in enumerate(argv):
        if arg == "--":
            return out + argv[i:]
        if not arg.startswith("-") or arg in ("-", "-h", "--help"):
            out.append(arg)
            continue
        name, eq, value = arg.lstrip("-").partition("=")
        if name in bools:
            if not eq or value.lower() in TRUE:
                out.append(f"--{name}")
            elif value.lower() in FALSE:
                out.append(f"--no{name}")
            else:
                out.append(arg)        # argparse refuses it ("ignored explicit argument")
        elif name.startswith("no") and name[2:] in bools and not eq:
            out.append(f"--{name}")
        elif name in values:
            out.append(f"--{name}{eq}{value}")
        else:
            out.append(arg)
    return out


def parse(ap: argparse.ArgumentParser, argv: list[str], bools: set[str],
          values: set[str]) -> argparse.Namespace:
    """Parse a gflags command line; a usage error exits with status 1, as Caffe's tools."""
    try:
        return ap.parse_args(normalize(argv, bools, values))
    except SystemExit as e:
        if e.code == 2:
            raise SystemExit(1) from None
        raise
