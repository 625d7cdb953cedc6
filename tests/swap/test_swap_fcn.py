"""The memory manager on an FCN-like net (Deconvolution and Crop): the GMAP is built, and
swapping plans train it bit for bit like the plain net, with released memory poisoned."""
import numpy as np
import pytest

from minicaffe.proto import caffe_pb2, parse_text
from minicaffe.testing import sgd_solver, train_steps
from swap.gmap import BACKWARD, DATA, build_gmap
from swap.plan import make_plan, min_budget

# An FCN-16s-like head: a deconvolution upsamples the coarse scores past the image, a Crop
# cuts them to the fine scores (bottom 1 needs its own gradient: Caffe inserts a Split, and
# the Crop writes zeros into that split top's diff), a second deconvolution with bilinear
# weights and lr_mult 0 (FCN's fixed upsampling) feeds a Crop by the data, the loss is per pixel.
FCN = """
name: "fcn_like"
layer { name: "data" type: "DummyData" top: "data" top: "label"
  dummy_data_param { shape { dim: BATCH dim: 3 dim: 12 dim: 12 } shape { dim: BATCH dim: 1 dim: 12 dim: 12 }
    data_filler { type: "gaussian" std: 1 } data_filler { type: "uniform" min: 0 max: 2.99 } } }
layer { name: "conv1" type: "Convolution" bottom: "data" top: "conv1"
  convolution_param { num_output: 4 kernel_size: 3 stride: 2 pad: 1 weight_filler { type: "xavier" } } }
layer { name: "relu1" type: "ReLU" bottom: "conv1" top: "conv1" }
layer { name: "pool1" type: "Pooling" bottom: "conv1" top: "pool1"
  pooling_param { pool: MAX kernel_size: 2 stride: 2 } }
layer { name: "score_pool1" type: "Convolution" bottom: "pool1" top: "score_pool1"
  convolution_param { num_output: 3 kernel_size: 1 weight_filler { type: "xavier" } } }
layer { name: "score_conv1" type: "Convolution" bottom: "conv1" top: "score_conv1"
  convolution_param { num_output: 3 kernel_size: 1 weight_filler { type: "xavier" } } }
layer { name: "upscore2" type: "Deconvolution" bottom: "score_pool1" top: "upscore2"
  convolution_param { num_output: 3 kernel_size: 4 stride: 2 pad: 0
    weight_filler { type: "gaussian" std: 0.3 } bias_filler { type: "constant" value: 0.1 } } }
layer { name: "score_conv1c" type: "Crop" bottom: "upscore2" bottom: "score_conv1"
  top: "score_conv1c" crop_param { axis: 2 offset: 1 } }
layer { name: "fuse" type: "Eltwise" bottom: "score_conv1c" bottom: "score_conv1" top: "fuse" }
layer { name: "upscore" type: "Deconvolution" bottom: "fuse" top: "upscore" param { lr_mult: 0 }
  convolution_param { num_output: 3 kernel_size: 4 stride: 2 group: 3 bias_term: false
    weight_filler { type: "bilinear" } } }
layer { name: "score" type: "Crop" bottom: "upscore" bottom: "data" top: "score"
  crop_param { offset: 1 } }
layer { name: "loss" type: "SoftmaxWithLoss" bottom: "score" bottom: "label" top: "loss" }
"""


def make_solver(batch=4, seed=3):
    return sgd_solver(parse_text(FCN.replace("BATCH", str(batch)), caffe_pb2.NetParameter),
                      seed=seed, max_iter=12)


def train(iters=12, strategy=None, budget=None, lowering=None):
    return train_steps(make_solver(), iters, strategy, budget, lowering)


def same(a, b):
    return len(a) == len(b) and all(np.array_equal(x, y) for x, y in zip(a, b))


def test_gmap_of_the_fcn_net():
    net = make_solver().net
    assert net.blobs["upscore2"].shape == (4, 3, 8, 8)   # (3 - 1)*2 + 4
    assert net.blobs["score"].shape == (4, 3, 12, 12)
    assert "score_conv1_score_conv1_0_split" in net.layer_names
    gmap = build_gmap(net)
    names = {b.name for b in gmap.buffers}
    # the deconvolutions' column scratch is declared, as the convolutions' is
    assert any("upscore2/col" in n for n in names) and any("upscore/col" in n for n in names)
    # a crop's backward reads no feature map; a deconvolution's reads its bottom (weights)
    crop_bwd = [s for s in gmap.steps if s.name == "score_conv1c" and s.phase == BACKWARD]
    assert crop_bwd and not any(gmap.buffers[b].kind == DATA for b in crop_bwd[0].reads)
    up2_bwd = [s for s in gmap.steps if s.name == "upscore2" and s.phase == BACKWARD]
    assert [gmap.buffers[b].name for b in up2_bwd[0].reads
            if gmap.buffers[b].kind == DATA] == ["data:score_pool1"]
    for strategy in ("none", "naive", "vdnn"):
        assert make_plan(gmap, strategy).arena_bytes > 0


@pytest.mark.parametrize("lowering", ["chunked", "caffe"])
def test_swapping_trains_the_fcn_net_bit_identically(lowering):
    """12 iterations under none, naive (just in time and with room to prefetch early) and
    vdnn give exactly the parameters, solver history and losses of the plain run."""
    base = train(lowering=lowering)
    assert all(np.isfinite(base[2]))
    need = min_budget(build_gmap(make_solver().net), "naive")
    for strategy, budget in [("none", None), ("naive", None), ("naive", 3 * need),
                             ("vdnn", None)]:
        params, history, losses, ex = train(strategy=strategy, budget=budget,
                                            lowering=lowering)
        assert same(params, base[0]), (strategy, budget)
        assert same(history, base[1]), (strategy, budget)
        assert losses == base[2], (strategy, budget)
        assert ex.iterations == 12
        assert ex.high_water == ex.plan.arena_bytes <= ex.device.capacity
        if strategy != "none":
            assert ex.plan.offloaded
