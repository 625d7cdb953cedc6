"""The process-wide settings of Caffe's ``Caffe`` singleton that pycaffe exposes for
multi-GPU training (include/caffe/common.hpp), and pycaffe's ``NCCL`` stand-in.

Caffe trains on several GPUs by running one solver per GPU: ``solver_count`` solvers,
this one being ``solver_rank`` (0 is the root solver).  pycaffe's ``python/train.py`` sets
both in each process it starts, together with ``set_multiprocess(True)``.  The rank
decides, as in Caffe:

* only the root solver builds test nets, tests, logs its progress and snapshots
  (``Caffe::root_solver()`` in src/caffe/solver.cpp);
* a solver's ``random_seed`` is offset by its rank;
* a Python layer in a TRAIN net refuses to run when there are several solvers in one
  process (``solver_count > 1`` without ``multiprocess``), as Caffe's PythonLayer does.

minicaffe's own multi-GPU training is the parameter server (``ps/``); these settings
exist so that scripts written for pycaffe behave as they would there.  The gradient
exchange itself, Caffe's ``NCCL`` class, is what a Caffe built without ``USE_NCCL``
gives: ``has_nccl()`` is False and :class:`NCCL` does nothing.
"""
from __future__ import annotations

_state = {"solver_count": 1, "solver_rank": 0, "multiprocess": False}


def solver_count() -> int:
    """How many solvers train together (Caffe::solver_count; 1 by default)."""
    return _state["solver_count"]


def set_solver_count(count: int):
    _state["solver_count"] = int(count)


def solver_rank() -> int:
    """This process's solver among them (Caffe::solver_rank; 0, the root, by default)."""
    return _state["solver_rank"]


def set_solver_rank(rank: int):
    _state["solver_rank"] = int(rank)


def multiprocess() -> bool:
    """Whether the solvers run one per process (Caffe::multiprocess), as train.py runs them."""
    return _state["multiprocess"]


def set_multiprocess(value: bool):
    _state["multiprocess"] = bool(value)


def root_solver() -> bool:
    """Caffe::root_solver(): rank 0 tests, logs and snapshots."""
    return _state["solver_rank"] == 0


def has_nccl() -> bool:
    """pycaffe's ``caffe.has_nccl()``: whether Caffe was built with ``USE_NCCL``.  minicaffe
    is such a build without it (see the module doc)."""
    return False


class NCCL:
    """pycaffe's ``caffe.NCCL(solver, uid)`` in a Caffe built without ``USE_NCCL``
    (python/caffe/_caffe.cpp defines an empty class there): the constructor takes a solver
    and a uid string and does nothing; ``new_uid`` and ``bcast`` do not exist, and a solver
    or net cannot take it as a callback (``has_nccl()`` says so beforehand)."""

    def __init__(self, solver, uid: str):
        if not isinstance(uid, str):
            raise TypeError(f"NCCL(solver, uid): uid must be a str, got {type(uid).__name__}")
        self.solver = solver
        self.uid = uid
