"""Log lines in glog's shape, as Caffe prints them: ``I1121 12:00:00.123456 12345
solver.py:218] ...`` (severity and date, time, thread id, the calling file and line), so
existing log parsers keep working: Caffe's ``tools/extra/parse_log.py`` (its regexes and
the date in the first two fields) and ``parse_log.sh``, whose ``awk`` takes fields by their
position in that shape.

pycaffe's ``caffe.init_log`` and ``caffe.log`` live here too.  ``caffe.log`` is this
module (``from minicaffe import log`` has always given it), so the module is callable:
``caffe.log("text")`` logs one INFO line, as pycaffe's ``LOG(INFO) << s`` does.
"""
from __future__ import annotations

import os
import sys
import threading
import time
import types

# glog's severities, in order; init_log(level) hides those below it (FLAGS_minloglevel)
LEVELS = "IWEF"


def _env_min_level() -> int:
    """glog's FLAGS_minloglevel from the environment, as glog reads it when Caffe's library
    loads: scripts set ``os.environ['GLOG_minloglevel'] = '2'`` before ``import caffe`` to
    hide its INFO and WARNING lines.  Unset or not a severity: 0 (everything)."""
    try:
        level = int(os.environ.get("GLOG_minloglevel", "0"))
    except ValueError:
        return 0
    return min(max(level, 0), len(LEVELS) - 1)


_state = {"stream": None, "quiet": False, "min_level": _env_min_level()}


def set_stream(stream):
    _state["stream"] = stream


def set_quiet(quiet: bool):
    _state["quiet"] = quiet


def log(msg: str, level: str = "I", where: str | None = None):
    """One line of severity ``level`` ("I", "W", "E", "F").  ``where``: the ``file:line``
    glog names; by default the caller's own (the first frame outside this module)."""
    if _state["quiet"] and level == "I":
        return
    if LEVELS.index(level) < _state.get("min_level", 0):
        return
    t = time.time()
    lt = time.localtime(t)
    stamp = time.strftime("%m%d %H:%M:%S", lt) + f".{int((t % 1) * 1e6):06d}"
    stream = _state["stream"] or sys.stderr
    print(f"{level}{stamp} {threading.get_native_id():>5} {where or _caller()}] {msg}",
          file=stream, flush=True)


def _caller() -> str:
    """``basename:line`` of the first frame outside this module and outside the classes'
    own ``_log`` wrappers (Solver._log), as glog's prefix."""
    f = sys._getframe(2)
    while f is not None and (f.f_code.co_filename == __file__ or f.f_code.co_name == "_log"):
        f = f.f_back
    if f is None:
        return "minicaffe:0"
    return f"{os.path.basename(f.f_code.co_filename)}:{f.f_lineno}"


def init_log(level: int | None = None, stderr: bool = True):
    """pycaffe's ``caffe.init_log()``, ``init_log(level)`` and ``init_log(level, stderr)``:
    show messages of severity ``level`` and above (0 INFO, 1 WARNING, 2 ERROR, 3 FATAL;
    glog's FLAGS_minloglevel).  Without a level the threshold stays (pycaffe's InitLog
    sets no FLAGS_minloglevel: GLOG_minloglevel's, or 0).  minicaffe's log always goes to
    its stream (stderr unless set_stream chose another), so ``stderr`` is accepted and has
    no effect."""
    if level is None:
        return
    level = int(level)
    if not 0 <= level < len(LEVELS):
        raise ValueError(f"init_log: level {level} is not a glog severity (0 INFO, 1 WARNING, "
                         "2 ERROR, 3 FATAL)")
    _state["min_level"] = level


class _CallableModule(types.ModuleType):
    def __call__(self, s: str):
        """pycaffe's ``caffe.log(s)``: one INFO line (``LOG(INFO) << s``)."""
        log(str(s))


sys.modules[__name__].__class__ = _CallableModule
