"""Small nets for the memory manager's tests: LeNet-like and ResNet-like, from prototxt text."""
import pytest

from minicaffe.net import TRAIN, Net
from minicaffe.proto import caffe_pb2, parse_text
from minicaffe.solver import Solver

LENET = """
name: "lenet_like"
layer { name: "data" type: "DummyData" top: "data" top: "label"
  dummy_data_param { shape { dim: BATCH dim: 1 dim: 12 dim: 12 } shape { dim: BATCH }
    data_filler { type: "gaussian" std: 1 } data_filler { type: "uniform" min: 0 max: 4.99 } } }
layer { name: "conv1" type: "Convolution" bottom: "data" top: "conv1"
  convolution_param { num_output: 4 kernel_size: 3 weight_filler { type: "xavier" } } }
layer { name: "pool1" type: "Pooling" bottom: "conv1" top: "pool1"
  pooling_param { pool: MAX kernel_size: 2 stride: 2 } }
layer { name: "conv2" type: "Convolution" bottom: "pool1" top: "conv2"
  convolution_param { num_output: 6 kernel_size: 3 weight_filler { type: "xavier" } } }
layer { name: "relu2" type: "ReLU" bottom: "conv2" top: "conv2" }
layer { name: "ip1" type: "InnerProduct" bottom: "conv2" top: "ip1"
  inner_product_param { num_output: 10 weight_filler { type: "xavier" } } }
layer { name: "relu3" type: "ReLU" bottom: "ip1" top: "ip1" }
layer { name: "drop" type: "Dropout" bottom: "ip1" top: "ip1" }
layer { name: "ip2" type: "InnerProduct" bottom: "ip1" top: "ip2"
  inner_product_param { num_output: 5 weight_filler { type: "xavier" } } }
layer { name: "loss" type: "SoftmaxWithLoss" bottom: "ip2" bottom: "label" top: "loss" }
layer { name: "acc" type: "Accuracy" bottom: "ip2" bottom: "label" top: "acc" }
"""


def _unit(name, bottom, c, k, stride, relu):
    """conv -> BatchNorm -> Scale (-> ReLU), all in place after the convolution."""
    t = f"""
layer {{ name: "{name}" type: "Convolution" bottom: "{bottom}" top: "{name}"
  convolution_param {{ num_output: {c} kernel_size: {k} stride: {stride} pad: {k // 2}
    bias_term: false weight_filler {{ type: "msra" }} }} }}
layer {{ name: "bn_{name}" type: "BatchNorm" bottom: "{name}" top: "{name}" }}
layer {{ name: "scale_{name}" type: "Scale" bottom: "{name}" top: "{name}"
  scale_param {{ bias_term: true }} }}"""
    if relu:
        t += f"""
layer {{ name: "relu_{name}" type: "ReLU" bottom: "{name}" top: "{name}" }}"""
    return t


def _block(name, bottom, c, stride=1, project=False):
    """A basic residual block; the input is read twice, so Caffe inserts a Split."""
    t = _unit(f"{name}_a", bottom, c, 3, stride, True) + _unit(f"{name}_b", f"{name}_a", c, 3, 1,
                                                                False)
    short = bottom
    if project:
        t += _unit(f"{name}_p", bottom, c, 1, stride, False)
        short = f"{name}_p"
    return t + f"""
layer {{ name: "{name}" type: "Eltwise" bottom: "{short}" bottom: "{name}_b" top: "{name}" }}
layer {{ name: "relu_{name}" type: "ReLU" bottom: "{name}" top: "{name}" }}"""


RESNET = """
name: "resnet_like"
layer { name: "data" type: "DummyData" top: "data" top: "label"
  dummy_data_param { shape { dim: BATCH dim: 3 dim: 8 dim: 8 } shape { dim: BATCH }
    data_filler { type: "gaussian" std: 1 } data_filler { type: "uniform" min: 0 max: 2.99 } } }
""" + _unit("conv1", "data", 4, 3, 1, True) + _block("res2", "conv1", 4) \
    + _block("res3", "res2", 6, 2, True) + """
layer { name: "pool" type: "Pooling" bottom: "res3" top: "pool"
  pooling_param { pool: AVE global_pooling: true } }
layer { name: "fc" type: "InnerProduct" bottom: "pool" top: "fc"
  inner_product_param { num_output: 3 weight_filler { type: "xavier" } } }
layer { name: "loss" type: "SoftmaxWithLoss" bottom: "fc" bottom: "label" top: "loss" }
"""

NETS = {"lenet": LENET, "resnet": RESNET}


def net_text(which: str, batch: int = 4) -> str:
    return NETS[which].replace("BATCH", str(batch))


def net_param(which: str, batch: int = 4):
    return parse_text(net_text(which, batch), caffe_pb2.NetParameter)


@pytest.fixture
def build_net():
    """build_net("lenet" | "resnet", batch=4) -> a TRAIN Net on the CPU."""
    def make(which, batch=4, seed=1):
        from minicaffe.rng import set_random_seed
        set_random_seed(seed)
        return Net(net_param(which, batch), TRAIN, mode="CPU")
    return make


@pytest.fixture
def make_solver():
    """make_solver("lenet" | "resnet", batch=4, type="SGD", mode="CPU") -> a seeded Solver."""
    def make(which, batch=4, type="SGD", seed=3, mode="CPU"):
        p = caffe_pb2.SolverParameter()
        p.net_param.CopyFrom(net_param(which, batch))
        p.base_lr = 0.05
        p.momentum = 0.9
        p.weight_decay = 1e-3
        p.lr_policy = "fixed"
        p.max_iter = 20
        p.display = 0
        p.random_seed = seed
        p.type = type
        if type == "Adam":
            p.base_lr = 0.01
            p.momentum2 = 0.999
            p.delta = 1e-8
        p.solver_mode = caffe_pb2.SolverParameter.CPU
        return Solver(p, mode=mode, verbose=False)
    return make


@pytest.fixture
def net_file(tmp_path):
    """net_file("lenet" | "resnet", batch=4) -> path of the net's prototxt."""
    def make(which, batch=4):
        f = tmp_path / f"{which}_{batch}.prototxt"
        f.write_text(net_text(which, batch))
        return f
    return make
