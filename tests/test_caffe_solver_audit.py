"""Solvers against BVLC Caffe's sources, where the earlier audits (test_caffe_spec_solver.py,
test_solver.py, test_resume.py, test_hdf5_snapshot.py) left gaps.

Each expected value is written from Caffe's code: src/caffe/solver.cpp,
src/caffe/solvers/sgd_solver.cpp (GetLearningRate, ApplyUpdate, ClipGradients, the solver
state's binary and HDF5 forms) and the subclasses' extra history.
"""
import math
import os

import numpy as np
import pytest

from minicaffe.proto import caffe_pb2, parse_text, write_binary
from minicaffe.solver import Solver, learning_rate

# a deterministic net: constant data, so that a state without minicaffe's own extras (the RNG
# and data positions, which Caffe never writes) resumes exactly
NET = """
name: "tiny"
layer { name: "data" type: "DummyData" top: "data" top: "target"
        dummy_data_param { shape { dim: 8 dim: 4 } shape { dim: 8 dim: 2 }
                           data_filler { type: "constant" value: 0.5 }
                           data_filler { type: "constant" value: -1 } } }
layer { name: "ip1" type: "InnerProduct" bottom: "data" top: "ip1"
        inner_product_param { num_output: 6 weight_filler { type: "gaussian" std: 0.3 }
                              bias_filler { type: "constant" value: 0.1 } } }
layer { name: "ip2" type: "InnerProduct" bottom: "ip1" top: "ip2"
        inner_product_param { num_output: 2 weight_filler { type: "gaussian" std: 0.3 } } }
layer { name: "loss" type: "EuclideanLoss" bottom: "ip2" bottom: "target" top: "loss" }
"""


def solver_param(**kw):
    p = caffe_pb2.SolverParameter(base_lr=0.05, lr_policy="fixed", max_iter=10, display=0,
                                  random_seed=7, solver_mode=caffe_pb2.SolverParameter.CPU)
    p.net_param.CopyFrom(parse_text(NET, caffe_pb2.NetParameter))
    for k, v in kw.items():
        setattr(p, k, v)
    return p


# ------------------------------------------------------------------ lr policies
def test_sigmoid_rate_far_past_stepsize_is_zero_as_cs_exp_overflows():
    """sgd_solver.cpp: base_lr * (1 / (1 + exp(-gamma * (iter - stepsize)))); a decaying
    sigmoid (gamma < 0) far past stepsize overflows exp to inf, and the rate is 0 (Caffe
    trains on); Python's math.exp raised OverflowError instead."""
    p = caffe_pb2.SolverParameter(base_lr=0.1, lr_policy="sigmoid", gamma=-0.1, stepsize=10)
    assert learning_rate(p, 10010) == 0.0
    assert learning_rate(p, 10) == pytest.approx(0.05)


def test_exp_rate_overflowing_is_inf_as_cs_pow():
    """"exp": base_lr * pow(gamma, iter); C's pow overflows to inf where Python's ** raised."""
    p = caffe_pb2.SolverParameter(base_lr=0.1, lr_policy="exp", gamma=1.01)
    assert learning_rate(p, 100000) == math.inf
    p.gamma = 0.99
    assert learning_rate(p, 100) == pytest.approx(0.1 * 0.99 ** 100)
