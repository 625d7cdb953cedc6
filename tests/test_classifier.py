"""pycaffe's batched passes (Net.forward_all, forward_backward_all, _batch), its
read-only Net conveniences, and caffe.Classifier (python/caffe/pycaffe.py and
python/caffe/classifier.py in BVLC Caffe)."""
import numpy as np
import pytest

import minicaffe as caffe
from minicaffe.io import oversample, resize_image
from minicaffe.net import Net
from minicaffe.proto import caffe_pb2, parse_text

IP = """
name: "ip"
force_backward: true
layer { name: "data" type: "Input" top: "data" input_param { shape { dim: 4 dim: 3 } } }
layer { name: "ip" type: "InnerProduct" bottom: "data" top: "ip"
        inner_product_param { num_output: 5 weight_filler { type: "gaussian" std: 0.5 }
                              bias_filler { type: "gaussian" std: 0.5 } } }
"""

DEPLOY = """
name: "tiny"
layer { name: "data" type: "Input" top: "data"
        input_param { shape { dim: 2 dim: 3 dim: 6 dim: 6 } } }
layer { name: "conv" type: "Convolution" bottom: "data" top: "conv"
        convolution_param { num_output: 4 kernel_size: 3
                            weight_filler { type: "gaussian" std: 0.3 }
                            bias_filler { type: "gaussian" std: 0.1 } } }
layer { name: "relu" type: "ReLU" bottom: "conv" top: "conv" }
layer { name: "fc" type: "InnerProduct" bottom: "conv" top: "fc"
        inner_product_param { num_output: 3 weight_filler { type: "gaussian" std: 0.3 } } }
layer { name: "prob" type: "Softmax" bottom: "fc" top: "prob" }
"""


def net_param(text):
    return parse_text(text, caffe_pb2.NetParameter, filename="<test net>")


def ip_params(net):
    w, b = (np.asarray(p.data, dtype=np.float64) for p in net.params["ip"])
    return w, b


# -------------------------------------------------------------- forward_all
def test_forward_all_batches_pads_and_trims():
    net = Net(net_param(IP), caffe.TEST)
    x = np.random.default_rng(0).standard_normal((10, 3)).astype(np.float32)  # 4 + 4 + 2
    out = net.forward_all(data=x)
    assert set(out) == {"ip"}
    w, b = ip_params(net)
    assert out["ip"].shape == (10, 5)
    np.testing.assert_allclose(out["ip"], x @ w.T + b, rtol=1e-5, atol=1e-5)
    # extra blobs come back too, trimmed likewise; the last batch was zero padded
    out = net.forward_all(blobs=["data"], data=x)
    np.testing.assert_array_equal(out["data"], x)
    np.testing.assert_array_equal(net.blobs["data"].data[2:], 0)


def test_batch_yields_full_batches_then_a_padded_one():
    net = Net(net_param(IP), caffe.TEST)
    x = np.arange(9 * 3, dtype=np.float32).reshape(9, 3)
    batches = list(net._batch({"data": x}))
    assert [len(b["data"]) for b in batches] == [4, 4, 4]
    np.testing.assert_array_equal(batches[2]["data"][0], x[8])
    np.testing.assert_array_equal(batches[2]["data"][1:], 0)
    assert list(net._batch({})) == []
    assert len(list(net._batch({"data": x[:8]}))) == 2  # no padded batch when it divides


def test_forward_all_errors():
    net = Net(net_param(IP), caffe.TEST)
    with pytest.raises(ValueError, match="needs the inputs by name"):
        net.forward_all()
    mlp = Net(net_param("""
    layer { name: "in" type: "Input" top: "a" top: "b"
            input_param { shape { dim: 2 dim: 3 } shape { dim: 2 dim: 3 } } }
    layer { name: "sum" type: "Eltwise" bottom: "a" bottom: "b" top: "s" }
    """), caffe.TEST)
    with pytest.raises(ValueError, match="different lengths"):
        mlp.forward_all(a=np.zeros((3, 3)), b=np.zeros((4, 3)))
    out = mlp.forward_all(a=np.ones((3, 3)), b=np.full((3, 3), 2.0))
    np.testing.assert_array_equal(out["s"], 3.0)


def test_forward_backward_all_batches_and_trims():
    net = Net(net_param(IP), caffe.TEST)
    rng = np.random.default_rng(1)
    x = rng.standard_normal((6, 3)).astype(np.float32)
    top = rng.standard_normal((6, 5)).astype(np.float32)
    outs, diffs = net.forward_backward_all(data=x, ip=top)
    w, b = ip_params(net)
    assert outs["ip"].shape == (6, 5) and diffs["data"].shape == (6, 3)
    np.testing.assert_allclose(outs["ip"], x @ w.T + b, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(diffs["data"], top @ w, rtol=1e-5, atol=1e-5)
    with pytest.raises(ValueError, match="inputs .* and outputs"):
        net.forward_backward_all(data=x, label=top)


# ------------------------------------------------- read-only conveniences
def test_pycaffe_name_lists_and_loss_weights():
    net = Net(net_param("""
    layer { name: "data" type: "Input" top: "data" top: "label"
            input_param { shape { dim: 2 dim: 3 } shape { dim: 2 } } }
    layer { name: "ip" type: "InnerProduct" bottom: "data" top: "ip"
            inner_product_param { num_output: 4 } }
    layer { name: "loss" type: "SoftmaxWithLoss" bottom: "ip" bottom: "label" top: "loss"
            loss_weight: 0.5 }
    """), caffe.TRAIN)
    assert net._layer_names == ["data", "ip", "loss"]
    assert net._blob_names == ["data", "label", "ip", "loss"]
    assert [b for b in net._blobs] == list(net.blobs.values())
    assert net._inputs == [0, 1] and net._outputs == [3]
    assert dict(net.blob_loss_weights) == {"data": 0.0, "label": 0.0, "ip": 0.0, "loss": 0.5}
    # pycaffe's {layer name: blob names}; by layer index: layer_top_names / layer_bottom_names
    assert net.top_names == {"data": ["data", "label"], "ip": ["ip"], "loss": ["loss"]}
    assert list(net.bottom_names) == ["data", "ip", "loss"]
    assert net.bottom_names["loss"] == ["ip", "label"] and net.bottom_names["data"] == []


# --------------------------------------------------------------- Classifier
@pytest.fixture
def tiny_model(tmp_path):
    proto = tmp_path / "deploy.prototxt"
    proto.write_text(DEPLOY)
    weights = str(tmp_path / "tiny.caffemodel")
    Net(str(proto), caffe.TEST).save(weights)
    return str(proto), weights


MEAN = np.array([0.1, 0.2, 0.3])


def manual_probs(model, crops):
    """Class probabilities of (h, w, 3) RGB crops, one forward per crop, with the
    preprocessing written out: CHW, RGB -> BGR, x2, minus MEAN, x0.5."""
    net = Net(model[0], caffe.TEST, weights=model[1])
    probs = []
    for crop in crops:
        x = (crop.transpose(2, 0, 1)[[2, 1, 0]] * 2.0 - MEAN[:, None, None]) * 0.5
        net.blobs["data"].data[...] = 0
        net.blobs["data"].data[0] = x
        probs.append(np.array(net.forward()["prob"][0]))
    return np.array(probs)


@pytest.mark.parametrize("over", [True, False])
def test_classifier_predict_matches_a_manual_forward(tiny_model, over):
    clf = caffe.Classifier(*tiny_model, image_dims=(8, 8), mean=MEAN, input_scale=0.5,
                           raw_scale=2.0, channel_swap=(2, 1, 0))
    assert clf.phase == caffe.TEST
    assert tuple(clf.crop_dims) == (6, 6)
    images = [np.random.default_rng(s).random((10, 9, 3)).astype(np.float32) for s in range(3)]
    probs = clf.predict(images, oversample=over)
    assert probs.shape == (3, 3)
    np.testing.assert_allclose(probs.sum(1), 1.0, rtol=1e-5)
    scaled = np.stack([resize_image(im, (8, 8)) for im in images])
    if over:
        expected = manual_probs(tiny_model, oversample(scaled, (6, 6))).reshape(3, 10, 3).mean(1)
    else:
        expected = manual_probs(tiny_model, scaled[:, 1:7, 1:7])  # centre: 4 - 3 .. 4 + 3
    np.testing.assert_allclose(probs, expected, rtol=1e-5, atol=1e-6)


def test_classifier_defaults_to_the_input_size(tiny_model):
    clf = caffe.Classifier(*tiny_model)
    assert tuple(clf.image_dims) == (6, 6)
    image = np.random.default_rng(5).random((6, 6, 3)).astype(np.float32)
    net = Net(tiny_model[0], caffe.TEST, weights=tiny_model[1])
    net.blobs["data"].data[...] = image.transpose(2, 0, 1)  # no other preprocessing set
    expected = np.array(net.forward()["prob"][0])
    np.testing.assert_allclose(clf.predict([image], oversample=False)[0], expected, rtol=1e-5,
                               atol=1e-6)
