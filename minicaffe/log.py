"""Log lines in glog's shape, as Caffe prints them (``I1121 12:00:00.123 solver] ...``),
so existing log parsers (Caffe's ``parse_log.py``) keep working.

pycaffe's ``caffe.init_log`` and ``caffe.log`` live here too.  ``caffe.log`` is this
module (``from minicaffe import log`` has always given it), so the module is callable:
``caffe.log("text")`` logs one INFO line, as pycaffe's ``LOG(INFO) << s`` does.
"""
from __future__ import annotations

import sys
import time
import types

_state = {"stream": None, "quiet": False}
# glog's severities, in order; init_log(level) hides those below it (FLAGS_minloglevel)
LEVELS = "IWEF"


def set_stream(stream):
    _state["stream"] = stream


def set_quiet(quiet: bool):
    _state["quiet"] = quiet


def log(msg: str, level: str = "I", where: str = "solver"):
    if _state["quiet"] and level == "I":
        return
    if LEVELS.index(level) < _state.get("min_level", 0):
        return
    t = time.time()
    lt = time.localtime(t)
    stamp = time.strftime("%m%d %H:%M:%S", lt) + f".{int((t % 1) * 1e6):06d}"
    stream = _state["stream"] or sys.stderr
    print(f"{level}{stamp} {where}] {msg}", file=stream, flush=True)


def init_log(level: int = 0, stderr: bool = True):
    """pycaffe's ``caffe.init_log()``, ``init_log(level)`` and ``init_log(level, stderr)``:
    show messages of severity ``level`` and above (0 INFO, 1 WARNING, 2 ERROR, 3 FATAL;
    glog's FLAGS_minloglevel).  minicaffe's log always goes to its stream (stderr unless
    set_stream chose another), so ``stderr`` is accepted and has no effect."""
    level = int(level)
    if not 0 <= level < len(LEVELS):
        raise ValueError(f"init_log: level {level} is not a glog severity (0 INFO, 1 WARNING, "
                         "2 ERROR, 3 FATAL)")
    _state["min_level"] = level


class _CallableModule(types.ModuleType):
    def __call__(self, s: str):
        """pycaffe's ``caffe.log(s)``: one INFO line (``LOG(INFO) << s``)."""
        log(str(s), where="pycaffe")


sys.modules[__name__].__class__ = _CallableModule
