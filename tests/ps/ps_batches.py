"""The batches the parameter-server tests feed their workers.

Apart from ps_helpers.py so that the worker processes (worker_proc.py) do not import pytest:
it was 0.2 of the 0.55 s each one took to start, and the tests start about a hundred.
"""
import numpy as np


def hook_batch(iteration, total):
    """The big batch of an iteration: a deterministic function of (iteration, size)."""
    rng = np.random.default_rng(1000 + iteration)
    return (rng.normal(size=(total, 4)).astype(np.float32),
            rng.normal(size=(total, 2)).astype(np.float32))
