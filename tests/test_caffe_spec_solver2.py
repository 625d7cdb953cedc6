"""Solver set-up against BVLC Caffe's own unit tests.

Mirrors ``src/caffe/test/test_solver.cpp`` (SolverTest.TestInitTrainTestNets: which layers
the train net and each test net get from ``test_state`` stages) and
``src/caffe/test/test_solver_factory.cpp`` (SolverFactoryTest.TestCreateSolver: every
registered solver type is created and reports its type), each for float and double as
Caffe's TestDtypesAndDevices (the CPU half; the devices do not change the set-up).  The
further cases follow ``Solver::InitTrainNet`` / ``InitTestNets`` in src/caffe/solver.cpp:
the order of the test nets (test_net_param, then test_net files, then the general net's
copies) that test_iter and test_state index, and the CHECKs on the counts.
"""
import numpy as np
import pytest

import minicaffe as caffe
from minicaffe.proto import caffe_pb2, parse_text
from minicaffe.solver import UPDATE_RULES, Solver, get_solver

DTYPES = [np.float32, np.float64]

# test_solver.cpp's TestNetwork: the accuracy layer only in TEST, the loss in TRAIN and in a
# TEST net with the stage 'with-softmax'
TEST_NETWORK = """
name: 'TestNetwork'
layer { name: 'data' type: 'DummyData'
        dummy_data_param { shape { dim: 5 dim: 2 dim: 3 dim: 4 } shape { dim: 5 } }
        top: 'data' top: 'label' }
layer { name: 'innerprod' type: 'InnerProduct' inner_product_param { num_output: 10 }
        bottom: 'data' top: 'innerprod' }
layer { name: 'accuracy' type: 'Accuracy' bottom: 'innerprod' bottom: 'label'
        top: 'accuracy' exclude: { phase: TRAIN } }
layer { name: 'loss' type: 'SoftmaxWithLoss' bottom: 'innerprod' bottom: 'label'
        include: { phase: TRAIN } include: { phase: TEST stage: 'with-softmax' } }
"""


def solver(text, dtype=np.float32):
    param = parse_text(text, caffe_pb2.SolverParameter, filename="<caffe test solver>")
    param.solver_mode = caffe_pb2.SolverParameter.CPU
    return Solver(param, dtype=dtype, verbose=False)


def net_block(field, name, extra=""):
    """``field { <TestNetwork renamed> }``, with extra layers appended."""
    return f"{field} {{ {TEST_NETWORK.replace('TestNetwork', name)} {extra} }}"


@pytest.mark.parametrize("dtype", DTYPES)
def test_init_train_test_nets(dtype):
    """test_solver.cpp SolverTest.TestInitTrainTestNets: net_param with two test_iter and two
    test_state; the train net has the loss but no accuracy, test net #0 (stage
    'with-softmax') both, test net #1 (no stage) the accuracy alone."""
    s = solver("test_interval: 10 test_iter: 10 test_state: { stage: 'with-softmax' } "
               "test_iter: 10 test_state: {} " + net_block("net_param", "TestNetwork"), dtype)
    assert s.net is not None
    assert "loss" in s.net.layer_names and "accuracy" not in s.net.layer_names
    assert len(s.test_nets) == 2
    assert {"loss", "accuracy"} <= set(s.test_nets[0].layer_names)
    assert "loss" not in s.test_nets[1].layer_names
    assert "accuracy" in s.test_nets[1].layer_names
    assert s.net.phase == caffe.TRAIN and all(t.phase == caffe.TEST for t in s.test_nets)
    assert list(s.test_nets[0].state.stage) == ["with-softmax"]
    assert not s.test_nets[1].state.stage


def test_test_nets_are_numbered_test_net_param_then_test_net_then_the_general_net(tmp_path):
    """solver.cpp InitTestNets: test net ids go to every test_net_param, then every test_net
    file, then one copy of the general net (net / net_param) per remaining test_iter; the
    i-th test_state and test_iter belong to test net #i of that order."""
    (tmp_path / "file.prototxt").write_text(TEST_NETWORK.replace("TestNetwork", "FromFile"))
    s = solver(f"test_interval: 1 test_net: '{tmp_path / 'file.prototxt'}' "
               + net_block("test_net_param", "Inline") + " "
               + net_block("net_param", "General")
               + " test_iter: 1 test_iter: 2 test_iter: 3"
               + " test_state { stage: 'with-softmax' } test_state { } test_state { }")
    assert [t.name for t in s.test_nets] == ["Inline", "FromFile", "General"]
    assert "loss" in s.test_nets[0].layer_names            # test_state[0]: 'with-softmax'
    assert "loss" not in s.test_nets[1].layer_names
    assert s.net.name == "General"
    out = s.test(1)          # test_iter[1] = 2 batches of test net #1 (the file's)
    assert set(out) == {"accuracy"}


def test_train_net_param_with_its_own_test_net_param():
    """solver.cpp InitTrainNet / InitTestNets with train_net_param: no general net, so each
    test_iter needs its test net; the train net is TRAIN whatever the test nets are."""
    s = solver(net_block("train_net_param", "Train") + " "
               + net_block("test_net_param", "Test") + " test_iter: 1 test_interval: 5")
    assert s.net.name == "Train" and [t.name for t in s.test_nets] == ["Test"]
    assert "accuracy" not in s.net.layer_names and "loss" not in s.test_nets[0].layer_names


@pytest.mark.parametrize("text, message", [
    # CHECK_EQ(test_iter_size, num_test_nets) without a general net
    (net_block("train_net_param", "T") + " test_iter: 1 test_iter: 1 test_interval: 1 "
     + net_block("test_net_param", "A"),
     "test_iter must be specified for each test network"),
    # CHECK_GE(test_iter_size, num_test_nets) with one
    (net_block("net_param", "N") + " test_iter: 1 test_interval: 1 "
     + net_block("test_net_param", "A") + " " + net_block("test_net_param", "B"),
     "test_iter must be specified for each test network"),
    # CHECK_EQ(test_state_size, num_test_net_instances)
    (net_block("net_param", "N") + " test_iter: 1 test_iter: 1 test_interval: 1 test_state {}",
     r"test_state must be unspecified or specified once per test net \(1 test_state for 2"),
    # InitTrainNet: CHECK_GE / CHECK_LE on the number of train nets
    ("base_lr: 0.1", "give exactly one of net, net_param, train_net, train_net_param"),
    (net_block("net_param", "N") + " " + net_block("train_net_param", "T"),
     "give exactly one of net, net_param, train_net, train_net_param"),
])
def test_init_checks(text, message):
    with pytest.raises(ValueError, match=message):
        solver(text)


# ------------------------------------------------------------------ SolverFactoryTest
SIMPLE_SOLVER = ("train_net_param { layer { name: 'data' type: 'DummyData' top: 'data' "
                 "dummy_data_param { shape { dim: 1 } } } }")


@pytest.mark.parametrize("dtype", DTYPES)
def test_create_solver(dtype):
    """test_solver_factory.cpp SolverFactoryTest.TestCreateSolver: for each registered type,
    a solver of a one-blob DummyData net is created and reports that type (pycaffe's
    ``get_solver`` also hands back that type's class)."""
    classes = {"SGD": caffe.SGDSolver, "Nesterov": caffe.NesterovSolver,
               "AdaGrad": caffe.AdaGradSolver, "RMSProp": caffe.RMSPropSolver,
               "AdaDelta": caffe.AdaDeltaSolver, "Adam": caffe.AdamSolver}
    assert set(UPDATE_RULES) == set(classes)
    for kind in UPDATE_RULES:
        param = parse_text(SIMPLE_SOLVER, caffe_pb2.SolverParameter)
        param.type = kind
        param.solver_mode = caffe_pb2.SolverParameter.CPU
        s = get_solver(param, dtype=dtype, verbose=False)
        assert s.type == kind and type(s) is classes[kind]
        assert s.net.blobs["data"].shape == (1,) and not s.test_nets


def test_unknown_solver_type_names_the_known_ones():
    """solver_factory.hpp CreateSolver: ``CHECK_EQ(registry.count(type), 1) << "Unknown
    solver type: " << type << " (known types: " ...``."""
    param = parse_text(SIMPLE_SOLVER + " type: 'Adamax'", caffe_pb2.SolverParameter)
    with pytest.raises(ValueError, match=r"unknown solver type 'Adamax' \(known: AdaDelta, "
                                         r"AdaGrad, Adam, Nesterov, RMSProp, SGD\)"):
        Solver(param, verbose=False)
