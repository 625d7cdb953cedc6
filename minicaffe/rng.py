"""Random number generators, seeded like Caffe's ``random_seed``.

Caffe keeps one process-wide RNG that ``Caffe::set_random_seed`` reseeds; the
solver seeds it from ``SolverParameter.random_seed`` before building nets, so a
run with a fixed seed is reproducible.  We do the same with a NumPy Generator
(fillers, data shuffling, crops and mirrors are drawn on the host, so a CPU and
a GPU run with the same seed get the same weights and the same batches) and a
CuPy generator for per-element device randomness (dropout masks).
"""
from __future__ import annotations

import numpy as np

_state = {"seed": None, "host": np.random.default_rng(), "device": None}


def set_random_seed(seed: int | None):
    """Reseed both generators; ``None`` or a negative seed means nondeterministic."""
    if seed is not None and seed < 0:
        seed = None
    _state["seed"] = seed
    _state["host"] = np.random.default_rng(seed)
    _state["device"] = None


def host_rng() -> np.random.Generator:
    return _state["host"]


def rng_for(xp):
    """A generator that makes arrays of module ``xp`` (numpy or cupy)."""
    if xp is np:
        return _state["host"]
    if _state["device"] is None:
        seed = _state["seed"]
        if seed is None:
            seed = int(_state["host"].integers(0, 2**31 - 1))
        _state["device"] = xp.random.default_rng(seed)
    return _state["device"]


def current_seed():
    return _state["seed"]
