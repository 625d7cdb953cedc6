"""A tenth sweep of public prototxt files (tests/data/zoo10/README.md lists them): the
SphereFace authors' 20-layer face net (deploy, train model and solver), Fast R-CNN's
VGG_CNN_M_1024 test net (py-faster-rcnn, and a fork's copy of it), and SegNet-Basic
(rebuilt by tests/zoo10_nets.py).

As in tests/test_caffe_zoo9.py: each net is built in the phase its file is for; every
blob's and param's shape is checked against Caffe's rules (``caffe_shapes`` in
tests/zoo3_nets.py); the shapes that tell the rules apart against numbers worked by hand in
the docstrings; one forward per net against NumPy.  Where a file needs what BVLC Caffe
lacks, the test checks that minicaffe refuses it where Caffe does (protobuf's text parser
first, then the layer factory in layer order), naming the file, the line, the layer and
the type, and then builds everything the file holds that BVLC Caffe can run.
"""
import os

import numpy as np
import pytest

import minicaffe as caffe
from minicaffe.layer import UnknownLayerTypeError
from minicaffe.proto import PrototxtError, caffe_pb2, parse_text, read_net_param, write_text

from test_caffe_zoo3 import check_shapes, randomize
from test_caffe_zoo9 import blank
from zoo10_nets import SEGNET_BASIC_CHARS, segnet_basic_inference

ZOO = os.path.join(os.path.dirname(os.path.abspath(__file__)), "data", "zoo10")


def zoo(*parts):
    return os.path.join(ZOO, *parts)


def read(path):
    with open(path, newline="") as f:
        return f.read()


SF_DEPLOY = zoo("sphereface", "sphereface_deploy.prototxt")
SF_MODEL = zoo("sphereface", "sphereface_model.prototxt")
SF_SOLVER = zoo("sphereface", "sphereface_solver.prototxt")
VGG_M = zoo("fast_rcnn", "vgg_cnn_m_1024_test.prototxt")
VGG_M_MODULE = zoo("fast_rcnn", "vgg_cnn_m_1024_fast_rcnn_test_module.prototxt")

MARGIN_PARAM = ('  margin_inner_product_param {\n    num_output: 10572\n    type: QUADRUPLE\n'
                '    weight_filler {\n      type: "xavier"\n    }\n    base: 1000\n'
                '    gamma: 0.12\n    power: 1\n    lambda_min: 5\n    iteration: 0\n  }\n')
ROI_PARAM = ('  roi_pooling_param {\n    pooled_w: 6\n    pooled_h: 6\n'
             '    spatial_scale: 0.0625 # 1/16\n  }\n')
MODULE_PARAM = ('  module_param {\n    module: "fasterrcnn"\n    type: "ROIPooling"\n'
                '    param_str: "{ \'pooled_w\': 6, \'pooled_h\': 6, \'spatial_scale\': 0.0625 }"\n'
                '  }\n')


def test_files_are_the_stored_copies():
    """Each kept file has the stored copy's length (``total_chars``) and its quirks; the
    SegNet generator's text has the stored length and the stored pieces."""
    deploy, model = read(SF_DEPLOY), read(SF_MODEL)
    assert (len(deploy), len(model), len(read(SF_SOLVER))) == (11090, 11858, 318)
    assert deploy.startswith('name: "SpherefaceNet-20"\ninput: "data"\ninput_dim: 1\n'
                             'input_dim: 3\ninput_dim: 112\ninput_dim: 96\n')
    assert not deploy.endswith("\n")                     # the stored copy has no last newline
    assert deploy.count("  eltwise_param { \n    operation: 1\n  }\n") == 8
    # the train model is the deploy's body between an ImageData layer and the A-Softmax
    body = deploy[deploy.index("############## CNN"):]
    assert model.count(body) == 1 and model.count(MARGIN_PARAM) == 1
    vgg, module = read(VGG_M), read(VGG_M_MODULE)
    assert (len(vgg), len(module)) == (4290, 4321)
    assert vgg.count(ROI_PARAM) == 1 and module.count(MODULE_PARAM) == 1
    # the fork's copy: rois given as (1, 5), and ROIPooling through its "Module" layer
    cut = 'layer {\n  name: "roi_pool5"'
    head, tail = vgg.split(cut)
    assert head.replace("  dim: 1\n  dim: 1\n}\nlayer", "}\nlayer", 1) == module.split(cut)[0]
    assert tail.split('name: "fc6"')[1] == module.split('name: "fc6"')[1]

    seg = segnet_basic_inference()
    assert len(seg) == SEGNET_BASIC_CHARS == 7024
    for piece in (
            'name: "segnet"\nlayer {\n  name: "data"\n  type: "DenseImageData"\n  top: "data"\n'
            '  top: "label"\n  dense_image_data_param {\n    source: "/SegNet/CamVid/test.txt"\t# '
            'Change this to the absolute path to your data file\n    batch_size: 1\n  }\n}\n',
            'layer {\n  bottom: "conv1"\n  top: "conv1"\n  name: "conv1_bn"\n  type: "BN"\n'
            '  bn_param {\n\tbn_mode: INFERENCE\n\tscale_filler {\n\t  type: "constant"\n'
            '\t  value: 1\n\t}\n\tshift_filler {\n\t  type: "constant"\n\t  value: 0.001\n\t}\n }\n}\n',
            '  name: "pool1"\n  type: "Pooling"\n  bottom: "conv1"\n  top: "pool1"\n'
            '  top: "pool1_mask"\n  pooling_param {\n    pool: MAX\n    kernel_size: 2\n'
            '    stride: 2\n  }\n}\n',
            '  name: "upsample4"\n  type: "Upsample"\n  bottom: "pool4"\n  bottom: "pool4_mask"\n'
            '  top: "upsample4"\n  upsample_param {\n    scale: 2\n    pad_out_h: true\n  }\n}\n',
            '  convolution_param {\n    num_output: 11\n    kernel_size: 1\n    weight_filler {\n'
            '      type: "msra"\n    }\n    bias_filler {\n      type: "constant"\n    }\n  }\n}\n'
            'layer {\n  name: "prob"\n  type: "Softmax"\n  bottom: "conv_classifier"\n'
            '  top: "prob"\n}\n'):
        assert seg.count(piece) == 1, piece[:40]
    assert seg.count('type: "BN"') == 8 and seg.count('type: "Upsample"') == 4


def conv2d(x, w, stride=1, pad=(0, 0)):
    """Caffe's convolution of one (C, H, W) image by hand, in float64 (as
    tests/test_caffe_zoo8.py's, through tensordot): zero padding, windows every ``stride``,
    (H + 2 pad - k) // stride + 1 (floor) per axis."""
    x = np.pad(x.astype(np.float64), ((0, 0), (pad[0], pad[0]), (pad[1], pad[1])))
    kh, kw = w.shape[2:]
    win = np.lib.stride_tricks.sliding_window_view(x, (kh, kw), axis=(1, 2))
    win = win[:, ::stride, ::stride]                      # (C, H_out, W_out, kh, kw)
    return np.tensordot(w.astype(np.float64), win, axes=([1, 2, 3], [0, 3, 4]))


# ---------------------------------------------------------------- SphereFace-20
def prelu(x, a):
    """PReLULayer::Forward_cpu: max(x, 0) + a[c] * min(x, 0), one slope per channel."""
    return np.maximum(x, 0) + a[:, None, None] * np.minimum(x, 0)


def sphereface_params():
    """SphereFace-20's learned parameters by hand (Liu et al. 2017, the 20-layer net): 3x3
    convolutions with biases, 1 + 2 + 4 + 1 residual units of two convolutions after each
    stage's stride-2 convolution, one PReLU slope per channel after every convolution, and
    fc5 from the 512 x 7 x 6 map of a 112 x 96 face to 512."""
    total, cin = 0, 3
    for c, units in ((64, 1), (128, 2), (256, 4), (512, 1)):
        for k in range(1 + 2 * units):
            total += 9 * (cin if k == 0 else c) * c + c + c
        cin = c
    return total + 512 * 7 * 6 * 512 + 512


def sf_map(i):
    """One axis through SphereFace's four stride-2 3x3 convolutions (pad 1): (i - 1) // 2 + 1
    each (ConvolutionLayer::compute_output_shape)."""
    for _ in range(4):
        i = (i - 1) // 2 + 1
    return i


def test_sphereface_deploy(tmp_path):
    """The deploy net: ``input_dim`` 1, 3, 112, 96 (a face, taller than wide); four stages
    of a stride-2 3x3 convolution (pad 1: (i + 2 - 3) // 2 + 1, so 56 x 48, 28 x 24,
    14 x 12, 7 x 6) and residual units; ``operation: 1``, the number of SUM in Caffe's
    EltwiseOp, which protobuf's text format takes for the enum; PReLU without a
    prelu_param: one slope per channel, filled with 0.25 (PReLULayer::LayerSetUp's
    default); the 2nd, 3rd, ... convolutions of a stage keep their bias blob though its
    lr_mult is 0.  fc5 (512, 21504): InnerProductLayer::Reshape then takes only inputs whose
    stage 4 is 7 x 6 (97..112 x 81..96; at 96 x 81 it is 6 x 6 and Caffe stops at fc5's
    "Input size incompatible").  Forward at 97 x 81 (49 x 41, 25 x 21, 13 x 11, 7 x 6)
    against NumPy, then through a .caffemodel into a fresh net."""
    net = caffe.Net(SF_DEPLOY, caffe.TEST)
    blobs, params = check_shapes(net, SF_DEPLOY, caffe.TEST)
    assert net.inputs == ["data"] and blobs["data"] == (1, 3, 112, 96)
    assert blobs["conv1_1"] == blobs["res1_3"] == (1, 64, 56, 48)
    assert blobs["res2_5"] == (1, 128, 28, 24) and blobs["res3_9"] == (1, 256, 14, 12)
    assert blobs["res4_3"] == (1, 512, 7, 6) and blobs["fc5"] == (1, 512)
    assert params["fc5"] == [(512, 21504), (512,)] and params["relu3_4"] == [(256,)]
    assert params["conv3_4"] == [(256, 256, 3, 3), (256,)]
    assert sum(int(np.prod(s)) for ps in params.values() for s in ps) == sphereface_params()
    ep = net.layer_dict["res3_7"].param.eltwise_param
    assert ep.operation == caffe_pb2.EltwiseParameter.SUM and not ep.coeff
    specs = dict(zip(net.layer_names, net.param_specs))
    assert [(s.lr_mult, s.decay_mult) for s in specs["conv1_1"]] == [(1, 1), (2, 0)]
    assert [(s.lr_mult, s.decay_mult) for s in specs["conv1_2"]] == [(1, 1), (0, 0)]
    assert np.all(net.params["relu2_4"][0].data == np.float32(0.25))
    assert not np.any(net.params["conv2_4"][1].data)     # bias_filler constant 0

    randomize(net, seed=41)
    for name, layer in net.layer_dict.items():
        if layer.type == "PReLU":                        # slopes that differ per channel
            a = layer.blobs[0].data
            a[...] = np.random.default_rng(len(name)).uniform(0.05, 0.5, a.shape)
    accepted = [(h, w) for h in range(90, 120) for w in range(75, 100)
                if sf_map(h) == 7 and sf_map(w) == 6]
    assert min(accepted) == (97, 81) and max(accepted) == (112, 96)
    net.blobs["data"].reshape(1, 3, 96, 81)
    with pytest.raises(ValueError, match="layer 'fc5'"):  # stage 4 gives 6 x 6
        net.reshape()
    net.blobs["data"].reshape(1, 3, 97, 81)
    net.reshape()
    small, _ = check_shapes(net, SF_DEPLOY, caffe.TEST, input_shapes={"data": (1, 3, 97, 81)})
    assert small["res1_3"] == (1, 64, 49, 41) and small["res3_9"] == (1, 256, 13, 11)
    assert small["res4_3"] == (1, 512, 7, 6)
    x = np.random.default_rng(42).standard_normal((1, 3, 97, 81)).astype(np.float32)
    fc5 = net.forward(data=x)["fc5"].copy()
    b, p = net.blobs, net.params

    def unit(inp, name):
        w, bias = (q.data for q in p[name])
        stride = 2 if name.endswith("_1") else 1
        y = conv2d(inp, w, stride=stride, pad=(1, 1)) + bias[:, None, None]
        return prelu(y, p["relu" + name[4:]][0].data.astype(np.float64))

    c1 = unit(x[0], "conv1_1")
    np.testing.assert_allclose(b["conv1_1"].data[0], c1, rtol=1e-4, atol=1e-5)
    c3 = unit(unit(c1, "conv1_2"), "conv1_3")
    np.testing.assert_allclose(b["res1_3"].data[0], c1 + c3, rtol=1e-4, atol=1e-4)
    # stage 3's second unit adds res3_3 to conv3_5 (res3_3 reaches both through a Split)
    r = b["res3_3"].data[0].astype(np.float64)
    np.testing.assert_allclose(b["res3_5"].data[0], r + unit(unit(r, "conv3_4"), "conv3_5"),
                               rtol=1e-4, atol=1e-4)
    w, bias = (q.data.astype(np.float64) for q in p["fc5"])
    np.testing.assert_allclose(fc5[0], w @ b["res4_3"].data[0].ravel() + bias, rtol=1e-4,
                               atol=1e-4)

    model = str(tmp_path / "sphereface.caffemodel")
    net.save(model)
    fresh = caffe.Net(SF_DEPLOY, caffe.TEST, weights=model)
    fresh.blobs["data"].reshape(1, 3, 97, 81)
    fresh.reshape()
    np.testing.assert_array_equal(fresh.forward(data=x)["fc5"], fc5)
    np.testing.assert_array_equal(fresh.params["relu4_2"][0].data, p["relu4_2"][0].data)


def sphereface_layout(root, rng, n=4, h=24, w=20):
    """The files the train model reads, relative to where Caffe runs: the image list
    ``data/CASIA-WebFace-112X96.txt`` ("path label" lines) and ``n`` colour images of
    ``h`` x ``w`` (aligned faces are 112 x 96; ImageData keeps an image's size when
    new_height/new_width are not set, so small stand-ins make a small net).  Returns the
    images in BGR order, as Caffe decodes them, and their labels."""
    from PIL import Image
    os.makedirs(root / "data" / "faces")
    images, labels, lines = [], [], []
    for i in range(n):
        rgb = rng.integers(0, 256, (h, w, 3), dtype=np.uint8)
        Image.fromarray(rgb).save(root / "data" / "faces" / f"{i}.png")
        images.append(rgb[:, :, ::-1].transpose(2, 0, 1).astype(np.float64))
        labels.append(7 * i + 3)
        lines.append(f"data/faces/{i}.png {7 * i + 3}\n")
    (root / "data" / "CASIA-WebFace-112X96.txt").write_text("".join(lines))
    return images, labels


def test_sphereface_model_is_refused_where_caffe_stops(tmp_path, monkeypatch):
    """The train model's A-Softmax layer fc6 is the SphereFace fork's ``MarginInnerProduct``
    with its own ``margin_inner_product_param``: protobuf's text parser stops at that
    field (line 813, column 3; the block opens at line 802) before any layer is made.
    Without the field the file parses, and Caffe sets layers up in order: ImageData first
    (reading its list, ``data/CASIA-WebFace-112X96.txt`` relative to where Caffe runs),
    then every BVLC layer, then the layer factory stops at fc6's type."""
    model = read(SF_MODEL)
    assert model.splitlines()[801:803] == ["layer {", '  name: "fc6"']
    with pytest.raises(PrototxtError) as e:
        caffe.Net(SF_MODEL, caffe.TRAIN)
    msg = str(e.value)
    assert msg.startswith(f"{SF_MODEL}:813:3: ") and '"margin_inner_product_param"' in msg
    assert "layer 'fc6' (line 802)" in msg and '"MarginInnerProduct"' in msg

    monkeypatch.chdir(tmp_path)
    sphereface_layout(tmp_path, np.random.default_rng(50))
    path = tmp_path / "model.prototxt"
    path.write_text(blank(model, MARGIN_PARAM))
    param = read_net_param(str(path))
    param.layer[0].image_data_param.batch_size = 2
    write_text(param, str(path))                          # the same layers, 2 images a batch
    with pytest.raises(UnknownLayerTypeError) as e:
        caffe.Net(str(path), caffe.TRAIN)
    assert "layer 'fc6': unknown layer type 'MarginInnerProduct'" in str(e.value)
    assert (e.value.layer_name, e.value.layer_type) == ("fc6", "MarginInnerProduct")


def test_sphereface_solver_trains_the_bvlc_part(tmp_path, monkeypatch):
    """The solver file (``net: "code/sphereface_model.prototxt"``, relative to where Caffe
    runs; multistep at 16000, 24000, 28000; momentum 0.9, weight_decay 0.0005;
    ``solver_mode: GPU``, run here on the CPU) on the train model with fc6 a BVLC
    InnerProduct of the file's 10572 outputs (A-Softmax's margin is the fork's), 2 images
    a batch of 24 x 20 stand-ins: conv stages 12 x 10, 6 x 5, 3 x 3, 2 x 2; fc5 (512,
    2048).

    ImageData with ``shuffle``, ``mirror`` and three mean values: each item is one of the
    images, maybe mirrored, as (BGR - 127.5) * 0.0078125, with its own label.  One step:
    the convolutions' biases with lr_mult 0 stay 0 (no update, and their decay_mult 0
    gives no decay); PReLU slopes (no param spec: lr_mult 1) move.  The learning rate:
    0.1 * 0.1^k, k counting the stepvalues the iteration has reached
    (SGDSolver::GetLearningRate)."""
    monkeypatch.chdir(tmp_path)
    images, labels = sphereface_layout(tmp_path, np.random.default_rng(51))
    model = read(SF_MODEL)
    tail = model[model.index("############### A-Softmax"):]
    bvlc = ('layer {\n  name: "fc6"\n  type: "InnerProduct"\n  bottom: "fc5"\n  top: "fc6"\n'
            '  inner_product_param {\n    num_output: 10572\n'
            '    weight_filler {\n      type: "xavier"\n    }\n  }\n}\n'
            'layer {\n  name: "softmax_loss"\n  type: "SoftmaxWithLoss"\n  bottom: "fc6"\n'
            '  bottom: "label"\n  top: "softmax_loss"\n}\n')
    os.makedirs("code")
    param = parse_text(model.replace(tail, bvlc), caffe_pb2.NetParameter)
    param.layer[0].image_data_param.batch_size = 2
    write_text(param, "code/sphereface_model.prototxt")
    with open("solver.prototxt", "w") as f:
        f.write(read(SF_SOLVER))

    solver = caffe.SGDSolver("solver.prototxt", mode="CPU")
    net = solver.net
    blobs, params = check_shapes(net, param, caffe.TRAIN,
                                 given={"data": [(2, 3, 24, 20), (2,)]})
    assert blobs["conv1_1"] == (2, 64, 12, 10) and blobs["res4_3"] == (2, 512, 2, 2)
    assert params["fc5"] == [(512, 2048), (512,)] and params["fc6"] == [(10572, 512), (10572,)]
    before = {n: [q.data.copy() for q in ps] for n, ps in net.params.items()}
    solver.step(1)
    data, label = net.blobs["data"].data, net.blobs["label"].data
    for n in range(2):
        i = labels.index(int(label[n]))
        img = (images[i] - 127.5) * 0.0078125
        assert (np.allclose(data[n], img, atol=1e-6)
                or np.allclose(data[n], img[:, :, ::-1], atol=1e-6))
    assert np.isfinite(net.blobs["softmax_loss"].data).all()
    assert not np.any(net.params["conv2_2"][1].data)     # lr_mult 0, decay_mult 0
    assert not np.array_equal(net.params["relu2_2"][0].data, before["relu2_2"][0])
    assert not np.array_equal(net.params["conv1_1"][1].data, before["conv1_1"][1])

    rates = {}
    for it in (0, 15999, 16000, 23999, 24000, 27999, 28000):
        solver.iter = it
        rates[it] = solver.get_learning_rate()
    np.testing.assert_allclose(list(rates.values()),
                               [0.1, 0.1, 0.01, 0.01, 0.001, 0.001, 0.0001], rtol=1e-6)


# ---------------------------------------------------------------- Fast R-CNN VGG_CNN_M_1024
def lrn_across(x, n, alpha, beta, k):
    """LRNLayer::CrossChannelForward_cpu for (C, H, W): x / (k + alpha / n * sum of x^2 over
    the n channels centred on c, zero beyond the edges)^beta."""
    sq = np.pad(x.astype(np.float64) ** 2, (((n - 1) // 2, n // 2), (0, 0), (0, 0)))
    window = np.lib.stride_tricks.sliding_window_view(sq, n, axis=0).sum(-1)
    return x / (k + alpha / n * window) ** beta


def max_pool_mask(x, k, s, out_h, out_w):
    """Caffe's MAX pooling of (C, H, W) without pad, with its mask (PoolingLayer::
    Forward_cpu): windows start at i * s and are clipped to the input; the mask holds
    h * W + w of the first maximum (a strict ``>`` in row-major order)."""
    c, h, w = x.shape
    y, mask = np.empty((c, out_h, out_w), x.dtype), np.empty((c, out_h, out_w))
    for i in range(out_h):
        for j in range(out_w):
            win = x[:, i * s:min(i * s + k, h), j * s:min(j * s + k, w)]
            flat = win.reshape(c, -1)
            arg = flat.argmax(axis=1)                    # the first maximum
            y[:, i, j] = flat[np.arange(c), arg]
            mask[:, i, j] = (i * s + arg // win.shape[2]) * w + j * s + arg % win.shape[2]
    return y, mask


def test_vgg_cnn_m_1024_fast_rcnn_is_refused_where_caffe_stops(tmp_path):
    """Both copies need ROI pooling, which BVLC Caffe lacks; its text parser stops at the
    first field caffe.proto does not have: py-faster-rcnn's ``roi_pooling_param`` (line
    194; block at 188) and, in the fork's copy, ``module_param`` of its ``Module`` layer
    (line 192; block at 186: the fork gives rois as (1, 5), two lines fewer).  Without the
    field, the layer factory stops at the type, after the layers before it are set up."""
    for path, piece, line, block, typ in ((VGG_M, ROI_PARAM, 194, 188, "ROIPooling"),
                                          (VGG_M_MODULE, MODULE_PARAM, 192, 186, "Module")):
        with pytest.raises(PrototxtError) as e:
            caffe.Net(path, caffe.TEST)
        field = piece.split()[0]
        msg = str(e.value)
        assert msg.startswith(f"{path}:{line}:3: ") and f'"{field}"' in msg, msg
        assert f"layer 'roi_pool5' (line {block})" in msg and f'"{typ}"' in msg
        bare = tmp_path / os.path.basename(path)
        bare.write_text(blank(read(path), piece))
        with pytest.raises(UnknownLayerTypeError) as e:
            caffe.Net(str(bare), caffe.TEST)
        assert str(e.value).startswith(f"{bare}:{block}: layer 'roi_pool5': unknown layer "
                                       f"type '{typ}'")


def test_vgg_cnn_m_1024_up_to_the_roi_pooling(tmp_path):
    """Chatfield et al.'s VGG-CNN-M (2014), the file up to roi_pool5: two ``input``s with
    ``input_shape``, data (1, 3, 224, 224) and rois (1, 5, 1, 1) (no layer reads rois here,
    so it is a net output, as in Caffe).

    Shapes at 224: conv1 7x7/2 without pad: (224 - 7) // 2 + 1 = 109; pool1 MAX 3/2:
    ceil(106 / 2) + 1 = 54; conv2 5x5/2 pad 1: (54 + 2 - 5) // 2 + 1 = 26; pool2: ceil(23 /
    2) + 1 = 13 (floor: 12); conv3..conv5 (1, 512, 13, 13).  conv1's params have lr_mult 0
    (frozen) and are still made.  LRN ACROSS_CHANNELS with k 2 (not the default 1):
    x / (2 + 0.0005 / 5 * sum x^2)^0.75.  Forward at 99: conv1 47, pool1 23, conv2 11,
    pool2 5 (the last window clipped to rows 8..10 of 11)."""
    text = read(VGG_M)
    path = tmp_path / "vgg_cnn_m_head.prototxt"
    path.write_text(text[:text.index('layer {\n  name: "roi_pool5"')])
    net = caffe.Net(str(path), caffe.TEST)
    blobs, params = check_shapes(net, str(path), caffe.TEST)
    assert net.inputs == ["data", "rois"] and blobs["rois"] == (1, 5, 1, 1)
    assert "rois" in net.outputs and "conv5" in net.outputs
    assert blobs["conv1"] == (1, 96, 109, 109) and blobs["pool1"] == (1, 96, 54, 54)
    assert blobs["conv2"] == (1, 256, 26, 26) and blobs["pool2"] == (1, 256, 13, 13)
    assert blobs["conv5"] == (1, 512, 13, 13) and params["conv2"] == [(256, 96, 5, 5), (256,)]
    assert [s.lr_mult for s in dict(zip(net.layer_names, net.param_specs))["conv1"]] == [0, 0]
    lrn = net.layer_dict["norm1"].param.lrn_param
    assert (lrn.local_size, lrn.k, lrn.norm_region) == (5, 2, caffe_pb2.LRNParameter.ACROSS_CHANNELS)

    randomize(net, seed=61)
    net.blobs["data"].reshape(1, 3, 99, 99)
    net.reshape()
    small, _ = check_shapes(net, str(path), caffe.TEST, input_shapes={"data": (1, 3, 99, 99)})
    assert small["pool1"] == (1, 96, 23, 23) and small["pool2"] == (1, 256, 5, 5)
    x = 40 * np.random.default_rng(62).standard_normal((1, 3, 99, 99)).astype(np.float32)
    rois = np.array([[[[0]], [[0]], [[0]], [[98]], [[98]]]], np.float32)
    net.forward(data=x, rois=rois)          # pycaffe's forward wants every input named
    b, p = net.blobs, net.params
    c1 = b["conv1"].data[0].astype(np.float64)           # after ReLU, in place
    norm = lrn_across(c1, 5, 0.0005, 0.75, 2)
    assert (2 + 0.0001 * (c1 ** 2).max()) > 2.5           # the sum shows beside k
    np.testing.assert_allclose(b["norm1"].data[0], norm, rtol=1e-5, atol=1e-6)
    np.testing.assert_array_equal(b["pool1"].data[0],
                                  max_pool_mask(b["norm1"].data[0], 3, 2, 23, 23)[0])
    w2, b2 = (q.data[:32] for q in p["conv2"])
    c2 = conv2d(b["pool1"].data[0], w2, stride=2, pad=(1, 1)) + b2[:, None, None]
    np.testing.assert_allclose(b["conv2"].data[0, :32], np.maximum(c2, 0), rtol=1e-4, atol=1e-4)
    np.testing.assert_array_equal(b["pool2"].data[0],
                                  max_pool_mask(b["norm2"].data[0], 3, 2, 5, 5)[0])


# ---------------------------------------------------------------- SegNet-Basic
def segnet_fork_pieces(text):
    """The fork's parameter blocks in SegNet-Basic's text: the data layer's
    ``dense_image_data_param``, the (identical) ``bn_param`` of the eight BN layers and the
    two spellings of ``upsample_param`` (upsample4's has ``pad_out_h``)."""
    def blocks(opening, closing):
        found, i = [], text.find(opening)
        while i >= 0:
            found.append(text[i:text.index(closing, i) + len(closing)])
            i = text.find(opening, i + 1)
        return found
    dense, = blocks("  dense_image_data_param {", "\n  }\n")
    bn, up = blocks("  bn_param {", "\n }\n"), blocks("  upsample_param {", "\n  }\n")
    assert len(bn) == 8 and len(set(bn)) == 1 and len(up) == 4 and len(set(up)) == 2
    return dense, bn[0], up[0], up[1]


def test_segnet_basic_is_refused_field_by_field(tmp_path):
    """SegNet-Basic uses three of its fork's layers, each with a parameter message
    caffe.proto lacks, so protobuf's text parser stops at the first one left:
    ``dense_image_data_param`` (line 7; the data layer opens at line 2), then conv1_bn's
    ``bn_param`` (line 53; the block opens at 48), then upsample4's ``upsample_param``
    (line 269; block 263).  With no fork field left the file parses, and Caffe's layer
    factory stops at the first layer, of type ``DenseImageData``."""
    text = segnet_basic_inference()
    dense, bn, up4, up = segnet_fork_pieces(text)
    path = tmp_path / "segnet_basic_inference.prototxt"
    for line, field, layer, block, typ, gone in (
            (7, "dense_image_data_param", "data", 2, "DenseImageData", ()),
            (53, "bn_param", "conv1_bn", 48, "BN", (dense,)),
            (269, "upsample_param", "upsample4", 263, "Upsample", (dense, bn))):
        current = text
        for piece in gone:
            current = blank(current, piece)
        path.write_text(current)
        with pytest.raises(PrototxtError) as e:
            caffe.Net(str(path), caffe.TEST)
        msg = str(e.value)
        assert msg.startswith(f"{path}:{line}:3: ") and f'"{field}"' in msg, msg
        assert f"layer '{layer}' (line {block})" in msg and f'"{typ}"' in msg
    path.write_text(blank(blank(blank(blank(text, dense), bn), up4), up))
    with pytest.raises(UnknownLayerTypeError) as e:
        caffe.Net(str(path), caffe.TEST)
    assert str(e.value).startswith(f"{path}:2: layer 'data': unknown layer type "
                                   "'DenseImageData'")


def test_segnet_basic_encoder_with_pooling_masks(tmp_path):
    """The encoder in BVLC layers (the data an Input of (1, 3, 40, 48); each BN, whose
    INFERENCE mode normalizes by stored statistics, a BatchNorm with use_global_stats):
    MAX pooling 2/2 with two tops gives the mask, the index h * W + w of each window's
    maximum in its input plane (PoolingLayer::Forward_cpu), which the fork's Upsample
    reads.  Shapes: the 7x7 pad 3 convolutions keep the size; pools 20 x 24, 10 x 12,
    5 x 6, then ceil(3 / 2) + 1 = 3 x 3 (floor: 2 x 3), the last row window clipped to row
    4 alone: this is why upsample4 carries ``pad_out_h: true`` (3 x 2 = 6 rows, one more
    than conv4's 5).  The LRN's window of 5 covers all 3 channels: x / (1 + 0.0001 / 5 *
    sum of x^2 over the channels)^0.75."""
    text = segnet_basic_inference()
    for piece in segnet_fork_pieces(text):
        text = blank(text, piece)
    param = parse_text(text[:text.index('layer {\n  name: "upsample4"')], caffe_pb2.NetParameter)
    data = param.layer[0]
    data.type = "Input"
    data.ClearField("top")
    data.top.append("data")
    data.input_param.shape.add(dim=[1, 3, 40, 48])
    for lp in param.layer:
        if lp.type == "BN":
            lp.type = "BatchNorm"
            lp.batch_norm_param.use_global_stats = True
    path = tmp_path / "segnet_encoder.prototxt"
    write_text(param, str(path))
    net = caffe.Net(str(path), caffe.TEST)
    blobs, params = check_shapes(net, str(path), caffe.TEST)
    assert blobs["conv1"] == (1, 64, 40, 48) and blobs["pool1"] == blobs["pool1_mask"] == (1, 64, 20, 24)
    assert blobs["pool3_mask"] == (1, 64, 5, 6) and blobs["pool4_mask"] == (1, 64, 3, 3)
    assert params["conv1"] == [(64, 3, 7, 7), (64,)] and params["conv1_bn"] == [(64,), (64,), (1,)]

    randomize(net, seed=71)
    x = 30 * np.random.default_rng(72).standard_normal((1, 3, 40, 48)).astype(np.float32)
    net.forward(data=x)
    b = net.blobs
    np.testing.assert_allclose(b["norm"].data[0], lrn_across(x[0], 5, 0.0001, 0.75, 1),
                               rtol=1e-5, atol=1e-6)
    for i, (h, w) in ((1, (20, 24)), (4, (3, 3))):
        y, mask = max_pool_mask(b[f"conv{i}"].data[0], 2, 2, h, w)
        np.testing.assert_array_equal(b[f"pool{i}"].data[0], y)
        np.testing.assert_array_equal(b[f"pool{i}_mask"].data[0], mask)
    assert set(np.unique(b["pool4_mask"].data[0, :, 2] // 6)) <= {4}   # the clipped last row
