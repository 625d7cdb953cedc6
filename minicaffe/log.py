"""Log lines in glog's shape, as Caffe prints them (``I1121 12:00:00.123 solver] ...``),
so existing log parsers (Caffe's ``parse_log.py``) keep working."""
from __future__ import annotations

import sys
import time

_state = {"stream": None, "quiet": False}


def set_stream(stream):
    _state["stream"] = stream


def set_quiet(quiet: bool):
    _state["quiet"] = quiet


def log(msg: str, level: str = "I", where: str = "solver"):
    if _state["quiet"] and level == "I":
        return
    t = time.time()
    lt = time.localtime(t)
    stamp = time.strftime("%m%d %H:%M:%S", lt) + f".{int((t % 1) * 1e6):06d}"
    stream = _state["stream"] or sys.stderr
    print(f"{level}{stamp} {where}] {msg}", file=stream, flush=True)
