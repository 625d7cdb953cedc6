"""A training log as two CSV tables (Caffe's ``tools/extra/parse_log.py``, with its
``extract_seconds.py``).

Usage, with Caffe's arguments::

    python -m minicaffe.tools.parse_log LOGFILE OUTPUT_DIR [--delimiter ,] [--verbose]

writes ``OUTPUT_DIR/<basename of LOGFILE>.train`` and ``.test``.  Each row is one iteration
that logged net outputs: ``NumIters``, ``Seconds`` (since the ``Solving`` line),
``LearningRate``, then one column per output, named as the log names it, in the order the
log gives them.  It reads Caffe's logs and minicaffe's alike (``minicaffe train 2> log``):
glog's lines, ``I1128 23:43:49.437082  7456 solver.cpp:218] ...``, with the solver's
messages ``Iteration N, ...``, ``Train net output #k: name = v``, ``Test net output #k:
name = v (* w = x loss)`` and ``Iteration N, lr = x``.

As Caffe's script:

* lines before the first ``Iteration N`` are ignored, and so are lines whose first two
  fields are not glog's date and time (a resumed run's other output);
* the year is the log file's creation year (its ctime), and goes up by one where the month
  goes down (a run over New Year);
* a row takes the iteration, time and learning rate current at its first output line; the
  learning rate is the last ``lr = x`` seen, so a train row holds the rate logged at the
  previous display (Caffe logs ``lr`` after the outputs), and the first row, which has none
  yet, takes the second row's;
* a row is complete when it has as many columns as the first row; a row cut short (the log
  ends mid-test) is dropped;
* floats are written as Python writes them (``NumIters`` as ``100.0``), in the ``excel``
  CSV dialect (``\\r\\n`` line ends) with the chosen delimiter; a table without rows is not
  written (``--verbose`` says so).

Where it differs on purpose: a table of one row is written.  Caffe's script writes the
first row only when a second iteration's outputs begin, so a log with one test (or one
display) gives no ``.test`` (or ``.train``) file; here the row is kept.  A log without the
``Solving`` line, or with an unreadable date, stops with a message naming the line (Caffe's
stops on a TypeError or prints the line and exits 1).
"""
from __future__ import annotations

import argparse
import csv
import datetime
import os
import re
import sys

# Caffe's regexes (tools/extra/parse_log.py)
RE_ITERATION = re.compile(r"Iteration (\d+)")
RE_TRAIN_OUTPUT = re.compile(r"Train net output #(\d+): (\S+) = ([\.\deE+-]+)")
RE_TEST_OUTPUT = re.compile(r"Test net output #(\d+): (\S+) = ([\.\deE+-]+)")
RE_LEARNING_RATE = re.compile(r"lr = ([-+]?[0-9]*\.?[0-9]+([eE]?[-+]?[0-9]+)?)")


class LogFormatError(ValueError):
    """A log that parse_log cannot read (no Solving line, a date it cannot parse)."""


def extract_datetime_from_line(line: str, year: int) -> datetime.datetime:
    """The time of a glog line, ``I0210 13:39:22.381027 25210 solver.cpp:204] ...``, in
    ``year`` (glog leaves the year out).  Raises ValueError where the fields are not
    glog's (extract_seconds.py's parse)."""
    fields = line.strip().split()
    if len(fields) < 2:
        raise ValueError(f"not a glog line: {line.strip()!r}")
    month, day = int(fields[0][1:3]), int(fields[0][3:])
    stamp = fields[1]
    dot = stamp.rfind(".")
    hour, minute, second = (int(x) for x in stamp[:dot].split(":"))
    return datetime.datetime(year, month, day, hour, minute, second, int(stamp[dot + 1:]))


def get_log_created_year(path) -> int:
    """The year of the log file's ctime, which Caffe takes as the log's year."""
    return datetime.datetime.fromtimestamp(os.path.getctime(path)).year


def parse_log(path) -> tuple[list[dict], list[dict]]:
    """``(train_rows, test_rows)`` of a training log: dicts of NumIters, Seconds,
    LearningRate and the outputs, keys in column order."""
    year = get_log_created_year(path)
    iteration = -1.0
    learning_rate = float("nan")
    train_rows: list[dict] = []
    test_rows: list[dict] = []
    train_row = test_row = None
    with open(path, errors="replace") as f:
        start_time = None
        for lineno, line in enumerate(f, 1):      # extract_seconds.get_start_time
            if "Solving" in line:
                try:
                    start_time = extract_datetime_from_line(line, year)
                except ValueError:
                    raise LogFormatError(f"{path}:{lineno}: the Solving line has no glog "
                                         f"date: {line.strip()!r}") from None
                break
        if start_time is None:
            raise LogFormatError(f"{path}: no 'Solving' line, which starts the clock; is it "
                                 "a training log (minicaffe train 2> LOG)?")
        last_time = start_time
        for line in f:
            match = RE_ITERATION.search(line)
            if match:
                iteration = float(match.group(1))
            if iteration == -1:
                continue                       # nothing counts before the first iteration
            try:
                when = extract_datetime_from_line(line, year)
            except ValueError:
                continue                       # not a glog line (e.g. a resumed run's output)
            if when.month < last_time.month:   # the log went over New Year
                year += 1
                when = extract_datetime_from_line(line, year)
            last_time = when
            seconds = (when - start_time).total_seconds()
            match = RE_LEARNING_RATE.search(line)
            if match:
                learning_rate = float(match.group(1))
            train_row = _add_output(RE_TRAIN_OUTPUT, train_row, train_rows, line, iteration,
                                    seconds, learning_rate)
            test_row = _add_output(RE_TEST_OUTPUT, test_row, test_rows, line, iteration,
                                   seconds, learning_rate)
    for rows, row in ((train_rows, train_row), (test_rows, test_row)):
        if row and not rows:
            rows.append(row)                   # the only row (Caffe's script drops it)
        if len(rows) > 1:                      # fix_initial_nan_learning_rate
            rows[0]["LearningRate"] = rows[1]["LearningRate"]
    return train_rows, test_rows


def _add_output(regex, row, rows, line, iteration, seconds, learning_rate):
    """Caffe's parse_line_for_net_output: add the output on ``line`` (if any) to the row of
    ``iteration``, starting a new row (and keeping the last) where the iteration changed;
    a row that has the first row's number of columns is complete and joins ``rows``.
    Returns the row still being filled (or None)."""
    match = regex.search(line)
    if match:
        if not row or row["NumIters"] != iteration:
            if row:
                rows.append(row)
            row = {"NumIters": iteration, "Seconds": seconds, "LearningRate": learning_rate}
        row[match.group(2)] = float(match.group(3))
    if row and rows and len(row) == len(rows[0]):
        rows.append(row)
        row = None
    return row


def write_csv(path, rows, delimiter: str = ",", verbose: bool = False) -> None:
    """One table, columns as the first row's keys; nothing is written for no rows."""
    if not rows:
        if verbose:
            print(f"Not writing {path}; no lines to write")
        return
    with open(path, "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=list(rows[0]), dialect=csv.excel,
                                delimiter=delimiter)
        writer.writeheader()
        writer.writerows(rows)
    if verbose:
        print(f"Wrote {path}")


def save_csv_files(logfile_path, output_dir, train_rows, test_rows, delimiter: str = ",",
                   verbose: bool = False) -> None:
    """``<output_dir>/<log basename>.train`` and ``.test`` (``caffe.INFO`` gives
    ``caffe.INFO.train`` and ``caffe.INFO.test``)."""
    base = os.path.join(output_dir, os.path.basename(logfile_path))
    write_csv(base + ".train", train_rows, delimiter, verbose)
    write_csv(base + ".test", test_rows, delimiter, verbose)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(
        prog="python -m minicaffe.tools.parse_log",
        description="Parse a Caffe training log into two CSV files containing training and "
                    "testing information")
    ap.add_argument("logfile_path", help="Path to log file")
    ap.add_argument("output_dir", help="Directory in which to place output CSV files")
    ap.add_argument("--verbose", action="store_true",
                    help="Print some extra info (e.g., output filenames)")
    ap.add_argument("--delimiter", default=",",
                    help="Column delimiter in output files (default: '%(default)s')")
    args = ap.parse_args(argv)
    try:
        train_rows, test_rows = parse_log(args.logfile_path)
        save_csv_files(args.logfile_path, args.output_dir, train_rows, test_rows,
                       delimiter=args.delimiter, verbose=args.verbose)
    except (OSError, ValueError, TypeError) as e:   # csv: a delimiter of several characters
        print(f"parse_log: {e}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
