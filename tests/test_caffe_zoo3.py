"""A third sweep of public prototxt files (tests/data/zoo3/README.md lists them).

Each net is built in the phase its file is for (TEST for deploy files; TRAIN and TEST for
train_val files, with their data layers reading small stand-in data of the file's shape),
and every blob's and param's shape is checked against Caffe's rules (``caffe_shapes`` in
tests/zoo3_nets.py, written from Caffe's layer sources, not from minicaffe's).  Then one
forward (and on train_val nets one backward) runs, and the weights go through a
``.caffemodel`` into a fresh net, which must give the same outputs.  Files from Caffe forks
are refused with the file's line and the foreign type or field named.
"""
import os
import shutil

import numpy as np
import pytest

import minicaffe as caffe
from minicaffe.proto import (PrototxtError, caffe_pb2, parse_text, read_net_param, upgrade_net,
                             write_binary)

from zoo3_nets import (OPEN_NSFW_CHARS, RESNET152_PLACES365_CHARS, RESNEXT50_CHARS, SRCNN_NET,
                       caffe_shapes, open_nsfw_deploy, resnet152_places365_deploy,
                       resnext50_32x4d_deploy, vgg_face_deploy_v1)

ZOO = os.path.join(os.path.dirname(os.path.abspath(__file__)), "data", "zoo3")


def zoo(*parts):
    return os.path.join(ZOO, *parts)


# ------------------------------------------------------------------------------ helpers
def check_shapes(net, source, phase, given=None, input_shapes=None, stages=()):
    """Every blob and param of ``net`` has the shape Caffe gives it; returns Caffe's shapes.
    Split blobs (Caffe's own insertions) have their source's shape."""
    param = upgrade_net(read_net_param(source) if isinstance(source, str) else source)
    blobs, params = caffe_shapes(param, phase, given, input_shapes, stages)
    assert {n: tuple(net.blobs[n].data.shape) for n in blobs} == blobs
    for layer, name in zip(net.layers, net.layer_names):
        if layer.type == "Split":
            (bottom,), tops = net.bottom_names[name], net.top_names[name]
            assert all(net.blobs[t].data.shape == net.blobs[bottom].data.shape for t in tops)
    assert set(net.blobs) - set(blobs) == {t for layer, name in zip(net.layers, net.layer_names)
                                           if layer.type == "Split" for t in net.top_names[name]}
    got = {n: [tuple(p.data.shape) for p in ps] for n, ps in net.params.items()}
    assert got == params
    return blobs, params


def randomize(net, seed=0):
    """Parameters drawn so that a forward stays finite: weights ~ N(0, 1/fan_in), other
    blobs small; BatchNorm statistics a positive variance and a scale factor of 1."""
    rng = np.random.default_rng(seed)
    for layer in net.layers:
        blobs = layer.blobs
        if not blobs:
            continue
        if layer.type == "BatchNorm":
            c = blobs[0].data.shape
            blobs[0].data[...] = rng.normal(0, 0.1, c)
            blobs[1].data[...] = rng.uniform(0.5, 1.5, c)
            blobs[2].data[...] = 1
            continue
        for b in blobs:
            shape = b.data.shape
            if len(shape) > 1:
                b.data[...] = rng.normal(0, 1 / np.sqrt(np.prod(shape[1:])), shape)
            elif layer.type == "Scale":
                b.data[...] = 1 + rng.normal(0, 0.1, shape)
            else:
                b.data[...] = rng.normal(0, 0.1, shape)


def fill_inputs(net, seed=1):
    rng = np.random.default_rng(seed)
    arrays = {}
    for name in net.inputs:
        arrays[name] = rng.standard_normal(net.blobs[name].data.shape).astype(np.float32)
        net.blobs[name].data[...] = arrays[name]
    return arrays


def forward_outputs(net, arrays):
    for name, a in arrays.items():
        net.blobs[name].data[...] = a
    out = net.forward()
    return {k: np.array(v) for k, v in out.items()}


def round_trip(net, source, phase, tmp_path, batch=None):
    """Save ``net``'s weights and load them into a fresh net of the same file: equal params
    and, on the same inputs, equal outputs."""
    path = str(tmp_path / "weights.caffemodel")
    net.save(path)
    fresh = caffe.Net(source, phase, weights=path)
    for name, blobs in net.params.items():
        for a, b in zip(blobs, fresh.params[name]):
            np.testing.assert_array_equal(a.data, b.data, err_msg=name)
    for other in (net, fresh):
        if batch is not None:
            for name in other.inputs:
                other.blobs[name].reshape(batch, *other.blobs[name].data.shape[1:])
            other.reshape()
    arrays = fill_inputs(net)
    expected = forward_outputs(net, arrays)
    got = forward_outputs(fresh, arrays)
    assert expected.keys() == got.keys()
    for k in expected:
        np.testing.assert_array_equal(expected[k], got[k], err_msg=k)
    return expected


def deploy_check(source, tmp_path, batch=None, **expect):
    """Build a deploy net in TEST, check every shape, run it and round-trip its weights."""
    net = caffe.Net(source, caffe.TEST)
    blobs, params = check_shapes(net, source, caffe.TEST)
    for name, shape in expect.items():                    # hand-derived anchors
        assert blobs[name] == shape, name
    randomize(net)
    out = round_trip(net, source, caffe.TEST, tmp_path, batch=batch)
    for k, v in out.items():
        assert np.isfinite(v).all(), k
    return net, blobs, params


# ------------------------------------------------------------------------ MTCNN (PReLU)
@pytest.mark.parametrize("name, expect", [
    # P-Net: 12 -> conv 10 -> pool (ceil) 5 -> 3 -> 1
    ("det1", {"pool1": (1, 10, 5, 5), "prob1": (1, 2, 1, 1), "conv4-2": (1, 4, 1, 1)}),
    # R-Net: 24 -> 22 -> pool 3/2 ceil 11 -> 9 -> 4 -> conv 2x2 3; fc 128
    ("det2", {"pool1": (1, 28, 11, 11), "pool2": (1, 48, 4, 4), "conv3": (1, 64, 3, 3),
              "prob1": (1, 2)}),
    # O-Net: 48 -> 46 -> 23 -> 21 -> 10 -> 8 -> 4 -> 3; fc 256, heads 2/4/10
    ("det3", {"pool1": (1, 32, 23, 23), "pool2": (1, 64, 10, 10), "pool3": (1, 64, 4, 4),
              "conv4": (1, 128, 3, 3), "conv6-3": (1, 10)}),
    # L-Net: 15 channels sliced into five 3-channel patches, concatenated back to 5 x 64
    ("det4", {"data243": (1, 3, 24, 24), "conv3": (1, 320, 3, 3), "fc4": (1, 256),
              "fc5_5": (1, 2)}),
])
def test_mtcnn_nets(name, expect, tmp_path):
    net, _, params = deploy_check(zoo("mtcnn", f"{name}.prototxt"), tmp_path, **expect)
    prelus = [l for l in net.layers if l.type == "PReLU"]
    assert prelus and all(len(l.blobs) == 1 for l in prelus)
    # PReLU's default filler is constant 0.25 (PReLUParameter.filler)
    fresh = caffe.Net(zoo("mtcnn", f"{name}.prototxt"), caffe.TEST)
    np.testing.assert_array_equal(fresh.layers[[l.type for l in fresh.layers].index("PReLU")]
                                  .blobs[0].data, 0.25)


def test_mtcnn_pnet_runs_on_any_image_size():
    """P-Net is fully convolutional; MTCNN reshapes its input per image pyramid level."""
    path = zoo("mtcnn", "det1.prototxt")
    net = caffe.Net(path, caffe.TEST)
    net.blobs["data"].reshape(1, 3, 97, 131)
    net.forward()
    blobs, _ = check_shapes(net, path, caffe.TEST, input_shapes={"data": (1, 3, 97, 131)})
    # 97 -> 95 -> pool ceil((95-2)/2)+1 = 48 -> 46 -> 44; 131 -> 129 -> 65 -> 63 -> 61
    assert blobs["prob1"] == (1, 2, 44, 61)
    np.testing.assert_allclose(net.blobs["prob1"].data.sum(axis=1), 1, rtol=1e-5)


def test_prelu_in_place_backward_matches_out_of_place():
    """The MTCNN nets apply PReLU in place; its backward then reads the saved input, as
    Caffe's bottom_memory_ copy, and must give the gradients of the out-of-place layer."""
    base = open(zoo("mtcnn", "det1.prototxt")).read()
    prelu1 = 'name: "PReLU1"\n  type: "PReLU"\n  bottom: "conv1"\n  top: '
    out_of_place = base.replace(prelu1 + '"conv1"', prelu1 + '"p1"')
    out_of_place = out_of_place.replace('name: "pool1"\n  type: "Pooling"\n  bottom: "conv1"',
                                        'name: "pool1"\n  type: "Pooling"\n  bottom: "p1"')
    assert out_of_place != base
    params = [parse_text(text, caffe_pb2.NetParameter) for text in (base, out_of_place)]
    for param in params:
        param.force_backward = True       # a deploy net has no loss: nothing would need backward
    nets = [caffe.Net(param, caffe.TRAIN) for param in params]
    for net in nets:
        randomize(net, seed=3)
        net.layer_dict["PReLU1"].blobs[0].data[...] = np.linspace(-0.5, 0.5, 10)
        fill_inputs(net, seed=4)
        net.forward()
        net.blobs["prob1"].diff[...] = np.random.default_rng(5).standard_normal((1, 2, 1, 1))
        net.blobs["conv4-2"].diff[...] = 0
        net.clear_param_diffs()
        net.backward()
    for name in ("PReLU1", "conv1", "conv2"):
        for a, b in zip(nets[0].params[name], nets[1].params[name]):
            np.testing.assert_allclose(a.diff, b.diff, rtol=1e-5, atol=1e-7, err_msg=name)
    assert np.abs(nets[0].params["PReLU1"][0].diff).max() > 0


# ------------------------------------------------------------------------ Places365
def test_places365_vgg16_deploy():
    """Legacy ``input_dim`` (batch 10), fc8a with 365 classes; shapes at the file's batch,
    a forward at batch 1 (VGG-16's 138 M weights make a round trip slow; the ResNets below
    take that path)."""
    path = zoo("places365", "deploy_vgg16_places365.prototxt")
    net = caffe.Net(path, caffe.TEST)
    blobs, params = check_shapes(net, path, caffe.TEST)
    assert blobs["pool5"] == (10, 512, 7, 7) and blobs["prob"] == (10, 365)
    assert params["fc6"] == [(4096, 25088), (4096,)] and params["fc8a"] == [(365, 4096), (365,)]
    net.blobs["data"].reshape(1, 3, 224, 224)
    net.reshape()
    out = net.forward()
    assert out["prob"].shape == (1, 365)


def test_places365_resnet152_deploy(tmp_path):
    text = resnet152_places365_deploy()
    assert len(text) == RESNET152_PLACES365_CHARS
    path = tmp_path / "deploy_resnet152_places365.prototxt"
    path.write_text(text)
    net, blobs, params = deploy_check(
        str(path), tmp_path, batch=1, conv1=(10, 64, 112, 112), pool1=(10, 64, 56, 56),
        res3b7=(10, 512, 28, 28), res4b35=(10, 1024, 14, 14), res5c=(10, 2048, 7, 7),
        pool5=(10, 2048, 1, 1), prob=(10, 365))
    assert params["bn_conv1"] == [(64,), (64,), (1,)] and params["scale_conv1"] == [(64,), (64,)]
    kinds = [l.type for l in net.layers]
    assert kinds.count("Convolution") == 155 and kinds.count("Eltwise") == 50
    # the three param { lr_mult: 0.0 } of each BatchNorm keep the statistics out of learning
    for i, layer in enumerate(net.layers):
        if layer.type == "BatchNorm":
            assert [p.lr_mult for p in net.param_specs[i]] == [0, 0, 0]


# ------------------------------------------------------------------ ResNeXt (soeaver)
def test_resnext50_with_a_fork_pooling_field_is_refused_with_bvlcs_spelling(tmp_path):
    text = resnext50_32x4d_deploy()
    assert len(text) == RESNEXT50_CHARS
    path = tmp_path / "deploy_resnext50_32x4d.prototxt"
    path.write_text(text)
    with pytest.raises(PrototxtError) as e:
        caffe.Net(str(path), caffe.TEST)
    msg = str(e.value)
    assert f"{path}:55:" in msg and "ceil_mode" in msg and "round_mode: FLOOR" in msg


def test_resnext50_with_round_mode_floor(tmp_path):
    """With BVLC's spelling of ``ceil_mode: false`` the net builds; pool1 floors
    (112 + 2 - 3) / 2 + 1 = 56, where the default CEIL would give 57."""
    path = tmp_path / "deploy_resnext50_32x4d.prototxt"
    path.write_text(resnext50_32x4d_deploy("    round_mode: FLOOR\n"))
    net, blobs, params = deploy_check(
        str(path), tmp_path, pool1=(1, 64, 56, 56), resx3_elewise=(1, 256, 56, 56),
        resx4_conv2=(1, 256, 28, 28), resx16_elewise=(1, 2048, 7, 7), pool_ave=(1, 2048, 1, 1),
        prob=(1, 1000))
    assert params["resx1_conv2"] == [(128, 4, 3, 3)]          # 128 channels in 32 groups
    assert params["resx14_conv2"] == [(1024, 32, 3, 3)]
    ceil = tmp_path / "ceil.prototxt"
    ceil.write_text(resnext50_32x4d_deploy(""))
    assert caffe.Net(str(ceil), caffe.TEST).blobs["pool1"].data.shape == (1, 64, 57, 57)


# ----------------------------------------------------------------------- open_nsfw
def test_open_nsfw_resnet_50_1by2(tmp_path):
    text = open_nsfw_deploy()
    assert len(text) == OPEN_NSFW_CHARS
    path = tmp_path / "deploy.prototxt"
    path.write_text(text)
    net = caffe.Net(str(path), caffe.TEST)
    # the bias's xavier filler: fan_in = count / shape[0] = 1, so U(-sqrt 3, sqrt 3)
    bias = net.params["fc_nsfw"][1].data
    assert bias.shape == (2,) and np.abs(bias).max() <= np.sqrt(3) and np.abs(bias).max() > 0
    deploy_check(str(path), tmp_path, pool1=(1, 64, 56, 56),
                 eltwise_stage0_block2=(1, 128, 56, 56), eltwise_stage3_block2=(1, 1024, 7, 7),
                 pool=(1, 1024, 1, 1), prob=(1, 2))


# ------------------------------------------------------------------------ VGG-Face (V1)
def test_vgg_face_v1_deploy(tmp_path):
    path = tmp_path / "VGG_FACE_deploy.prototxt"
    path.write_text(vgg_face_deploy_v1())
    net = caffe.Net(str(path), caffe.TEST)
    blobs, params = check_shapes(net, str(path), caffe.TEST)
    assert net.inputs == ["data"] and blobs["prob"] == (1, 2622)
    assert params["fc8"] == [(2622, 4096), (2622,)]
    assert [l.type for l in net.layers][:3] == ["Input", "Convolution", "ReLU"]


# ------------------------------------------------------ colorization (dilation, deconv)
def test_colorization_deploy_v2(tmp_path):
    """Zhang et al.'s colorization net: dilated 3x3 convolutions (pad 2, dilation 2), a
    stride-2 Deconvolution, BatchNorm without Scale, a Scale with a constant filler and
    ``bias_term: False`` (capitalised), and a Silence layer eating the last blob."""
    path = zoo("colorization", "colorization_deploy_v2.prototxt")
    net = caffe.Net(path, caffe.TEST)
    np.testing.assert_array_equal(net.params["conv8_313_rh"][0].data, np.float32(2.606))
    assert len(net.params["conv8_313_rh"]) == 1                       # bias_term: False
    # Caffe's BatchNorm with use_global_stats and a zero scale factor: mean 0, variance 0
    fill_inputs(net)
    net.forward()
    np.testing.assert_allclose(net.blobs["conv1_2norm"].data,
                               net.blobs["conv1_2"].data / np.sqrt(np.float32(1e-5)), rtol=1e-5)
    deploy_check(path, tmp_path, conv1_2=(1, 64, 112, 112), conv3_3norm=(1, 256, 28, 28),
                 conv5_3=(1, 512, 28, 28), conv7_3norm=(1, 512, 28, 28),
                 conv8_1=(1, 256, 56, 56), conv8_313=(1, 313, 56, 56),
                 class8_ab=(1, 2, 56, 56))
    assert net.outputs == []                  # Silence consumes class8_ab
    assert net.params["conv5_1"][0].data.shape == (512, 512, 3, 3)


# ---------------------------------------------- CIFAR-10 ResNet-20 train_val (BatchNorm)
def write_cifar_lmdb(path, n, rng):
    from minicaffe.io import LMDBWriter, array_to_datum
    with LMDBWriter(path) as w:
        for i in range(n):
            img = rng.integers(0, 256, (3, 32, 32)).astype(np.uint8)
            w.put(f"{i:08d}", array_to_datum(img, int(i % 10)).SerializeToString())


def test_resnet20_cifar10_train_and_test(tmp_path, monkeypatch):
    """ethanhe42/resnet-cifar10-caffe: Data layers (LMDB, mean_value 128, TRAIN crop 32 and
    mirror), BatchNorm with moving_average_fraction 0.9 followed by Scale with bias_term,
    projection shortcuts, global average pooling.  TRAIN: forward and backward update the
    BatchNorm statistics; those weights give a finite TEST net."""
    shutil.copy(zoo("resnet_cifar10", "resnet-20_trainval.prototxt"),
                tmp_path / "trainval.prototxt")
    monkeypatch.chdir(tmp_path)
    rng = np.random.default_rng(0)
    os.mkdir("cifar-10-batches-py")
    write_cifar_lmdb("cifar-10-batches-py/train", 130, rng)
    write_cifar_lmdb("cifar-10-batches-py/test", 100, rng)

    train = caffe.Net("trainval.prototxt", caffe.TRAIN)
    blobs, params = check_shapes(train, "trainval.prototxt", caffe.TRAIN,
                                 given={"data": [(128, 3, 32, 32), (128,)]})
    assert blobs["group1_block0_sum"] == (128, 32, 16, 16)
    assert blobs["global_avg_pool"] == (128, 64, 1, 1) and blobs["loss"] == ()
    assert params["first_conv"] == [(16, 3, 3, 3), (16,)]
    assert params["group2_block0_proj"] == [(64, 32, 1, 1)]
    assert params["first_conv_bn"] == [(16,), (16,), (1,)]
    train.forward()
    train.backward()
    assert np.isfinite(float(train.blobs["loss"].data))
    factor = train.params["first_conv_bn"][2].data
    np.testing.assert_array_equal(factor, [1.0])       # 0.9 * 0 + 1 after one pass
    assert (train.params["first_conv_bn"][1].data > 0).all()
    for name in ("first_conv", "group0_block0_conv0_scale", "fc"):
        assert np.abs(train.params[name][0].diff).max() > 0, name
    for b in train.params["first_conv_bn"]:
        assert not np.any(b.diff)                       # statistics take no gradient

    weights = str(tmp_path / "trained.caffemodel")
    train.save(weights)
    test = caffe.Net("trainval.prototxt", caffe.TEST, weights=weights)
    check_shapes(test, "trainval.prototxt", caffe.TEST, given={"data": [(100, 3, 32, 32), (100,)]})
    out = test.forward()
    assert np.isfinite(out["loss"]) and 0 <= out["Accuracy"] <= 1
    np.testing.assert_array_equal(test.params["first_conv_bn"][1].data,
                                  train.params["first_conv_bn"][1].data)


# ----------------------------------------------------------- Caffe's own examples
def test_hdf5_classification_nonlinear_train_val(tmp_path, monkeypatch):
    import h5py
    shutil.copy(zoo("caffe_examples", "nonlinear_train_val.prototxt"), tmp_path / "net.prototxt")
    monkeypatch.chdir(tmp_path)
    d = "examples/hdf5_classification/data"
    os.makedirs(d)
    rng = np.random.default_rng(0)
    for split in ("train", "test"):
        with h5py.File(f"{d}/{split}.h5", "w") as f:
            f["data"] = rng.standard_normal((25, 4)).astype(np.float32)
            f["label"] = rng.integers(0, 2, 25).astype(np.float32)
        with open(f"{d}/{split}.txt", "w") as f:
            f.write(f"{d}/{split}.h5\n")
    given = {"data": [(10, 4), (10,)]}
    train = caffe.Net("net.prototxt", caffe.TRAIN)
    check_shapes(train, "net.prototxt", caffe.TRAIN, given=given)
    train.forward()
    train.backward()
    assert np.abs(train.params["fc1"][0].diff).max() > 0
    test = caffe.Net("net.prototxt", caffe.TEST)
    blobs, _ = check_shapes(test, "net.prototxt", caffe.TEST, given=given)
    assert blobs["accuracy"] == () and "label_data_1_split_0" in test.blobs
    out = test.forward()
    assert set(out) == {"accuracy", "loss"}


def test_pycaffe_linreg_with_its_python_loss(monkeypatch):
    """examples/pycaffe/linreg.prototxt: DummyData, InnerProduct on 3-d blobs, and the
    EuclideanLossLayer of examples/pycaffe/layers/pyloss.py with loss_weight 1."""
    monkeypatch.syspath_prepend(zoo("caffe_examples"))
    path = zoo("caffe_examples", "linreg.prototxt")
    net = caffe.Net(path, caffe.TRAIN)
    blobs, params = check_shapes(net, path, caffe.TRAIN, given={"loss": [(1,)]})
    assert blobs["x"] == (10, 3, 2) and blobs["ipx"] == (10, 10)
    assert params["ipx"] == [(10, 6), (10,)]
    net.forward()
    net.backward()
    x, y = (net.blobs[k].data.reshape(10, -1) for k in "xy")
    (wx, bx), (wy, by) = ((p.data for p in net.params[k]) for k in ("ipx", "ipy"))
    d = (x @ wx.T + bx) - (y @ wy.T + by)
    np.testing.assert_allclose(net.blobs["loss"].data, [np.sum(d ** 2) / 10 / 2], rtol=1e-5)
    np.testing.assert_allclose(net.params["ipx"][0].diff, d.T @ x / 10, rtol=1e-4, atol=1e-6)
    np.testing.assert_allclose(net.params["ipy"][0].diff, -d.T @ y / 10, rtol=1e-4, atol=1e-6)


def test_feature_extraction_imagenet_val(tmp_path, monkeypatch):
    """The stored examples/feature_extraction/imagenet_val.prototxt starts with
    ``version: 1``, no NetParameter field: refused at 1:1, as Caffe's parser does.  Without
    that line it is a V1 net whose IMAGE_DATA layer keeps mean_file, crop_size and mirror
    in image_data_param; the upgrade moves them to transform_param, and the net reads a
    list of images at '$CAFFE_DIR/...' (Caffe expands no variables), resized to 256x256
    and cropped to 227."""
    src = zoo("caffe_examples", "imagenet_val_v1fork.prototxt")
    with pytest.raises(PrototxtError, match=r"imagenet_val_v1fork.prototxt:1:1: .*\"version\""):
        caffe.Net(src, caffe.TEST)

    from PIL import Image
    monkeypatch.chdir(tmp_path)
    with open(src) as f:
        first, rest = f.readline(), f.read()
    assert first == "version: 1\n"
    (tmp_path / "imagenet_val.prototxt").write_text(rest)
    base = tmp_path / "$CAFFE_DIR"
    (base / "examples" / "_temp").mkdir(parents=True)
    (base / "data" / "ilsvrc12").mkdir(parents=True)
    rng = np.random.default_rng(0)
    lines = []
    for i in range(3):
        name = f"$CAFFE_DIR/examples/_temp/im{i}.png"
        Image.fromarray(rng.integers(0, 256, (300, 280, 3), dtype=np.uint8)).save(name)
        lines.append(f"{name} {i}\n")
    (base / "examples" / "_temp" / "file_list.txt").write_text("".join(lines))
    mean = caffe_pb2.BlobProto(num=1, channels=3, height=256, width=256)
    mean.data.extend((rng.random(3 * 256 * 256) * 100).astype(np.float32))
    write_binary(mean, str(base / "data" / "ilsvrc12" / "imagenet_mean.binaryproto"))

    param = read_net_param("imagenet_val.prototxt")
    tp = param.layer[0].transform_param
    assert (param.layer[0].type, tp.crop_size, tp.mirror) == ("ImageData", 227, False)
    assert tp.mean_file == "$CAFFE_DIR/data/ilsvrc12/imagenet_mean.binaryproto"
    net = caffe.Net("imagenet_val.prototxt", caffe.TEST)
    blobs, params = check_shapes(net, "imagenet_val.prototxt", caffe.TEST,
                                 given={"data": [(50, 3, 227, 227), (50,)]})
    assert blobs["pool5"] == (50, 256, 6, 6) and params["conv2"] == [(256, 48, 5, 5), (256,)]
    out = net.forward()
    np.testing.assert_array_equal(net.blobs["label"].data[:6], [0, 1, 2, 0, 1, 2])
    assert 0 <= out["accuracy"] <= 1


def test_fork_batchnorm_layer_is_refused_with_its_line_and_type():
    """The stored cifar10_full_sigmoid_train_test_bn.prototxt is a fork's: type "BN" with a
    bn_param.  Caffe stops at the unknown field; minicaffe names the layer, its line and
    its type."""
    path = zoo("caffe_examples", "cifar10_full_sigmoid_train_test_bn_fork.prototxt")
    with pytest.raises(PrototxtError) as e:
        caffe.Net(path, caffe.TRAIN)
    msg = str(e.value)
    assert ":78:3:" in msg and "'bn1' (line 73)" in msg and 'type "BN"' in msg


def test_consolidated_lenet_solver_with_v1_nets_inline(tmp_path, monkeypatch, capsys):
    """Caffe's 2014 lenet_consolidated_solver.prototxt gives its train net and two test nets
    inline, as V1 nets, reading LevelDB (Caffe's default backend) with data_param.scale.
    BVLC Caffe copies inline nets without upgrading them (Solver::InitTrainNet), so its nets
    would have no layers; minicaffe upgrades them (scale goes to transform_param) and logs
    a warning for each."""
    from minicaffe import log
    from minicaffe.io import LevelDBWriter, array_to_datum
    shutil.copy(zoo("caffe_examples", "lenet_consolidated_solver_v1.prototxt"),
                tmp_path / "solver.prototxt")
    monkeypatch.chdir(tmp_path)
    monkeypatch.setitem(log._state, "stream", None)
    rng = np.random.default_rng(0)
    for name in ("mnist-train-leveldb", "mnist-test-leveldb"):
        with LevelDBWriter(name) as w:
            for i in range(100):
                img = rng.integers(0, 256, (1, 28, 28)).astype(np.uint8)
                w.put(f"{i:08d}", array_to_datum(img, int(i % 10)).SerializeToString())
    solver = caffe.get_solver("solver.prototxt")
    warned = capsys.readouterr().err
    for name in ("train_net_param 'LeNet'", "test_net_param 'LeNet-test'",
                 "test_net_param 'LeNet-test-on-train'"):
        assert name in warned
    assert "does not upgrade nets given inline" in warned
    assert list(solver.param.test_iter) == [100, 600] and len(solver.test_nets) == 2
    train = solver.net
    assert train.layers[0].param.transform_param.scale == np.float32(0.00390625)
    blobs, params = check_shapes(train, solver.param.train_net_param, caffe.TRAIN,
                                 given={"mnist": [(64, 1, 28, 28), (64,)]})
    assert blobs["pool2"] == (64, 50, 4, 4) and params["ip1"] == [(500, 800), (500,)]
    assert "(automatic)" in train.blobs                      # SOFTMAX_LOSS without a top
    for tn, tp in zip(solver.test_nets, solver.param.test_net_param):
        check_shapes(tn, tp, caffe.TEST, given={"mnist": [(100, 1, 28, 28), (100,)]})
    solver.param.test_initialization = False   # 100 + 600 test batches otherwise
    solver.step(1)
    assert solver.iter == 1
    assert 0.5 < train.blobs["data"].data.max() < 1.0     # bytes scaled by 1/256


def test_srcnn_train_and_test(tmp_path, monkeypatch):
    """Dong et al.'s SRCNN: 33x33 patches through 9x9, 1x1 and 5x5 convolutions without
    padding give 21x21, compared with the 21x21 label by EuclideanLoss."""
    import h5py
    monkeypatch.chdir(tmp_path)
    (tmp_path / "SRCNN_net.prototxt").write_text(SRCNN_NET)
    os.makedirs("examples/SRCNN")
    rng = np.random.default_rng(0)
    for split, n in (("train", 130), ("test", 4)):
        with h5py.File(f"examples/SRCNN/{split}.h5", "w") as f:
            f["data"] = rng.random((n, 1, 33, 33)).astype(np.float32)
            f["label"] = rng.random((n, 1, 21, 21)).astype(np.float32)
        with open(f"examples/SRCNN/{split}.txt", "w") as f:
            f.write(f"examples/SRCNN/{split}.h5\n")
    train = caffe.Net("SRCNN_net.prototxt", caffe.TRAIN)
    blobs, params = check_shapes(train, "SRCNN_net.prototxt", caffe.TRAIN,
                                 given={"data": [(128, 1, 33, 33), (128, 1, 21, 21)]})
    assert blobs["conv1"] == (128, 64, 25, 25) and blobs["conv3"] == (128, 1, 21, 21)
    assert params["conv1"] == [(64, 1, 9, 9), (64,)] and params["conv3"] == [(1, 32, 5, 5), (1,)]
    train.forward()
    train.backward()
    d = train.blobs["conv3"].data - train.blobs["label"].data
    np.testing.assert_allclose(train.blobs["loss"].data, np.sum(d ** 2) / 128 / 2, rtol=1e-5)
    test = caffe.Net("SRCNN_net.prototxt", caffe.TEST)
    check_shapes(test, "SRCNN_net.prototxt", caffe.TEST,
                 given={"data": [(2, 1, 33, 33), (2, 1, 21, 21)]})
    assert np.isfinite(test.forward()["loss"])
