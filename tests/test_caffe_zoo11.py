"""An eleventh sweep of public prototxt files (tests/data/zoo11/README.md lists them): DeepLab
v1's LargeFOV test net and solver (templates in V1 ``layers``, with the DeepLab fork's layer
types and fields), chuanqi305's MobileNet-SSD deploy net and RMSProp solver (SSD's fork),
BVLC's CaffeNet deploy net with its fully convolutional net-surgery twin, and Yu and
Koltun's dilated-convolution nets (the PASCAL VOC and Cityscapes deploy nets).

As in tests/test_caffe_zoo10.py: each net is built in the phase its file is for; every
blob's and param's shape is checked against Caffe's rules (``caffe_shapes`` in
tests/zoo3_nets.py); the shapes that tell the rules apart against numbers worked by hand in
the docstrings; a forward against NumPy and a ``.caffemodel`` round trip where the net's
size allows (else on the part named).  Shapes are read through ``Blob.shape``, which
allocates nothing, so the nets are built at their files' input sizes (900 x 900, 1396 x
1396) and run smaller.  Where a file needs what BVLC Caffe lacks, the test checks that
minicaffe refuses it where Caffe does (protobuf's text parser first, then the layer factory
in layer order), naming the file, the line, the layer and the type, and then builds
everything the file holds that BVLC Caffe can run.
"""
import os
import re

import numpy as np
import pytest

import minicaffe as caffe
from minicaffe.layer import UnknownLayerTypeError
from minicaffe.proto import (PrototxtError, caffe_pb2, parse_text, read_net_param, upgrade_net,
                             write_text)

from test_caffe_zoo7 import max_pool
from test_caffe_zoo10 import read
from test_caffe_zoo9 import blank
from zoo3_nets import caffe_shapes

ZOO = os.path.join(os.path.dirname(os.path.abspath(__file__)), "data", "zoo11")


def zoo(*parts):
    return os.path.join(ZOO, *parts)


DEEPLAB = zoo("deeplab", "largefov_test.prototxt")
DEEPLAB_SOLVER = zoo("deeplab", "largefov_solver.prototxt")
SSD = zoo("mobilenet_ssd", "MobileNetSSD_deploy.prototxt")
SSD_SOLVER = zoo("mobilenet_ssd", "solver_train.prototxt")
CAFFENET = zoo("caffenet", "deploy.prototxt")
FULL_CONV = zoo("caffenet", "bvlc_caffenet_full_conv.prototxt")
DIL_VOC = zoo("dilation", "dilation8_pascal_voc_deploy.prototxt")
DIL_CITY = zoo("dilation", "dilation10_cityscapes_deploy.prototxt")


def test_files_are_the_stored_copies():
    """Each file has the stored copy's length (``total_chars``) and the pieces named here;
    MobileNet-SSD's text on either side of read_file's 16,000-character boundary is the
    stored copy's."""
    lengths = {DEEPLAB: 7097, DEEPLAB_SOLVER: 294, SSD: 29352, SSD_SOLVER: 501,
               CAFFENET: 2832, FULL_CONV: 3019, DIL_VOC: 6630, DIL_CITY: 9819}
    assert {p: len(read(p)) for p in lengths} == lengths
    deeplab = read(DEEPLAB)
    assert deeplab.startswith("# VGG 16-layer network convolutional finetuning\n")
    assert 'name: "${NET_ID}"\n\nlayers {\n  name: "data"\n  type: IMAGE_SEG_DATA\n' in deeplab
    assert deeplab.count("    hole: 2\n") == 3 and deeplab.count("  strict_dim: false\n") == 3
    assert deeplab.endswith("    ignore_label: 255\n    #reset: false\n  } \n}\n\n")
    ssd = read(SSD)
    assert ssd[15960:16000] == 'er {\n  name: "conv17_1/relu"\n  type: "Re'
    assert ssd[16000:16040] == 'LU"\n  bottom: "conv17_1"\n  top: "conv17_'
    assert ssd.count("    engine: CAFFE\n") == 13 and ssd.count('type: "PriorBox"') == 6
    assert ssd.endswith("    keep_top_k: 100\n    confidence_threshold: 0.3\n  }\n}\n")
    assert read(SSD_SOLVER).endswith('type: "RMSProp"\neval_type: "detection"\n'
                                     'ap_version: "11point"\n\n')
    full = read(FULL_CONV)
    assert full.startswith("# Fully convolutional network version of CaffeNet.\n"
                           'name: "CaffeNetConv"\ninput: "data"\ninput_dim: 1\n')
    # the two CaffeNet files share conv1..pool5 character for character
    cut = 'layer {\n  name: "conv1"'
    body = read(CAFFENET)
    assert (body[body.index(cut):body.index('layer {\n  name: "fc6"')]
            == full[full.index(cut):full.index('layer {\n  name: "fc6-conv"')])
    city = read(DIL_CITY)
    assert city.count("    dilation: ") == 10 and "    pad: 64\n    kernel_size: 3\n    dilation: 64\n" in city
    assert ("  convolution_param {\n    num_output: 19\n    bias_term: false\n    pad: 4\n"
            "    kernel_size: 16\n    group: 19\n    stride: 8\n  }\n") in city
    assert "    num_output: 42\n    pad: 33\n    kernel_size: 3\n" in read(DIL_VOC)


# ------------------------------------------------------------------------------ helpers
def check_shapes(net, source, phase, input_shapes=None):
    """tests/test_caffe_zoo3.py's check_shapes through ``Blob.shape`` (no data allocated):
    every blob and param of ``net`` has the shape Caffe gives it; Split tops (Caffe's own)
    are the only other blobs.  Returns Caffe's shapes."""
    param = upgrade_net(read_net_param(source) if isinstance(source, str) else source)
    blobs, params = caffe_shapes(param, phase, input_shapes=input_shapes)
    assert {n: tuple(net.blobs[n].shape) for n in blobs} == blobs
    splits = {t for layer, name in zip(net.layers, net.layer_names) if layer.type == "Split"
              for t in net.top_names[name]}
    assert set(net.blobs) - set(blobs) == splits
    assert {n: [tuple(p.shape) for p in ps] for n, ps in net.params.items()} == params
    return blobs, params


def randomize(net, seed=0):
    """Weights ~ U(-1, 1) * sqrt(3 / fan_in) (unit variance through a layer), biases small;
    float32 draws (the nets here hold up to 138 M weights)."""
    rng = np.random.default_rng(seed)
    for layer in net.layers:
        for b in layer.blobs:
            shape = b.shape
            scale = np.float32(np.sqrt(3 / np.prod(shape[1:])) if len(shape) > 1 else 0.1)
            data = b.data
            rng.random(shape, dtype=np.float32, out=data)      # in place: no 0.5 GB temporaries
            data *= 2 * scale
            data -= scale


def conv2d(x, w, stride=1, pad=0, dilation=1, group=1):
    """Caffe's convolution of one (C, H, W) image by hand, in float64: zero padding, the
    kernel's taps ``dilation`` apart (an effective kernel of dilation * (k - 1) + 1), windows
    every ``stride``, output (H + 2 pad - (dilation (k - 1) + 1)) // stride + 1 per axis;
    ``group`` splits input and output channels into that many independent convolutions."""
    w = np.asarray(w, np.float64)
    span = [dilation * (k - 1) + 1 for k in w.shape[2:]]
    x = np.pad(np.asarray(x, np.float64), ((0, 0), (pad, pad), (pad, pad)))
    cg, og = x.shape[0] // group, w.shape[0] // group
    out = []
    for g in range(group):
        win = np.lib.stride_tricks.sliding_window_view(x[g * cg:(g + 1) * cg], span, axis=(1, 2))
        win = win[:, ::stride, ::stride, ::dilation, ::dilation]   # (C, H_out, W_out, kh, kw)
        out.append(np.tensordot(w[g * og:(g + 1) * og], win, axes=([1, 2, 3], [0, 3, 4])))
    return np.concatenate(out)


def relu(x):
    return np.maximum(x, 0)


def round_trip(net, source, tmp_path, feeds):
    """Save ``net``'s weights to a .caffemodel and load them into a fresh net of ``source``
    (Net(..., weights=)), reshaped to ``feeds``' shapes: equal params and, on ``feeds``
    (the inputs of ``net``'s last forward), the outputs ``net`` gave."""
    expected = {k: net.blobs[k].data.copy() for k in net.outputs}
    path = str(tmp_path / "weights.caffemodel")
    net.save(path)
    fresh = caffe.Net(source, caffe.TEST, weights=path)
    for name, blobs in net.params.items():
        for a, b in zip(blobs, fresh.params[name]):
            assert np.array_equal(a.data, b.data), name
    for n, a in feeds.items():
        fresh.blobs[n].reshape(*a.shape)
    fresh.reshape()
    got = fresh.forward(**feeds)
    assert expected.keys() == got.keys()
    for k in expected:
        np.testing.assert_array_equal(expected[k], got[k], err_msg=k)


def conv_layer(net, name, x, **kw):
    w, b = (p.data for p in net.params[name])
    return conv2d(x, w, **kw) + b.astype(np.float64)[:, None, None]


def check_refusals(tmp_path, name, text, steps):
    """Caffe's text parser stops at the first fork piece left in the file: ``steps`` is a
    list of (line, column, what the message holds (one string or several), layer, that
    layer's line, fix) where ``fix`` takes the text past that stop; returns the text past
    the last one."""
    path = tmp_path / name
    for line, column, what, layer, block, fix in steps:
        path.write_text(text)
        with pytest.raises(PrototxtError) as e:
            caffe.Net(str(path), caffe.TEST)
        msg = str(e.value)
        assert msg.startswith(f"{path}:{line}:{column}: "), msg
        assert all(w in msg for w in ((what,) if isinstance(what, str) else what)), msg
        assert f"layer '{layer}' (line {block})" in msg, msg
        text = fix(text) if fix is not None else text
    return text


# ------------------------------------------------------------------ DeepLab v1 LargeFOV
# The placeholders DeepLab's run scripts fill with sed before Caffe reads the files
# (run_pascal.sh: ``sed "$(eval echo $(cat sub.sed))" test.prototxt > test_val.prototxt``),
# with the values for PASCAL VOC 2012 (EXP=voc12 gives NUM_LABELS=21).
DEEPLAB_VALUES = {"${NET_ID}": "DeepLab-LargeFOV", "${EXP}": "voc12", "${NUM_LABELS}": "21",
                  "${DATA_ROOT}": "VOCdevkit/VOC2012", "${TEST_SET}": "val",
                  "${FEATURE_DIR}": "voc12/features/DeepLab-LargeFOV",
                  "${TRAIN_SET}": "train_aug", "${MODEL}": "init"}


def fill(text):
    for key, value in DEEPLAB_VALUES.items():
        text = text.replace(key, value)
    assert "${" not in text
    return text


def test_deeplab_largefov_is_refused_where_caffe_stops(tmp_path):
    """The file as stored: protobuf's parser stops at line 13, column 9, at the V1 type enum
    IMAGE_SEG_DATA (DeepLab's fork added it to V1LayerParameter.LayerType), before it reaches
    the ``${...}`` placeholders (``num_output: ${NUM_LABELS}`` would stop it at line 400).
    Filled in as DeepLab's scripts do, the parser then stops at each fork piece in file order
    as the one before is taken out: ``has_label`` (ImageDataParameter), ``hole`` (the atrous
    rate, BVLC's ``dilation``), V1's ``strict_dim``, and the V1 types INTERP, MAT_WRITE and
    SEG_ACCURACY.  Each message names the layer block and its line (a V1 block's ``type`` is
    an enum, so the error is an unknown enum value, not an unknown field)."""
    raw = read(DEEPLAB)
    assert raw.splitlines()[10:13] == ["layers {", '  name: "data"', "  type: IMAGE_SEG_DATA"]
    with pytest.raises(PrototxtError) as e:
        caffe.Net(DEEPLAB, caffe.TEST)
    msg = str(e.value)
    assert msg.startswith(f"{DEEPLAB}:13:9: ") and "has no value named IMAGE_SEG_DATA" in msg
    assert "in layer 'data' (line 11)" in msg and "no V1 layer type of BVLC Caffe" in msg
    assert raw.splitlines()[399] == "    num_output: ${NUM_LABELS}"

    def drop(*pieces):
        def fix(text):
            for piece in pieces:
                text = blank(text, piece)
            return text
        return fix

    filled = fill(raw)
    mat_write = filled[filled.index("  mat_write_param {"):filled.index("  include: { phase: TEST }\n}\n\n\n")]
    text = check_refusals(tmp_path, "test_val.prototxt", filled, [
        (13, 9, "has no value named IMAGE_SEG_DATA", "data", 11,
         drop("  type: IMAGE_SEG_DATA\n")),
        (21, 5, 'ImageDataParameter" has no field named "has_label"', "data", 11,
         drop("    has_label: false\n")),
        (263, 5, 'has no field named "hole"', "conv5_1", 254,
         lambda t: t.replace("    hole: ", "    dilation: ")),
        (344, 3, 'V1LayerParameter" has no field named "strict_dim"', "fc6", 339,
         drop("  strict_dim: false\n")),
        (408, 9, "has no value named INTERP", "fc8_interp", 404,
         drop("  type: INTERP\n", "  interp_param {\n    zoom_factor: 8\n  }\n")),
        (416, 9, "has no value named MAT_WRITE", "fc8_mat", 414,
         drop("  type: MAT_WRITE\n", mat_write)),
        (469, 9, "has no value named SEG_ACCURACY", "accuracy", 467,
         drop("  type: SEG_ACCURACY\n",
              "  seg_accuracy_param {\n    ignore_label: 255\n    #reset: false\n  } \n")),
    ])
    # no fork piece left: the file parses
    parse_text(text, caffe_pb2.NetParameter)


def deeplab_bvlc(size=513):
    """The filled-in test net in BVLC's terms: the data layer (DeepLab's IMAGE_SEG_DATA) an
    ``input`` of 1 x 3 x size x size as V1-era nets give it, ``hole`` written ``dilation``,
    no ``strict_dim``, and the net ending at fc8 (INTERP, MAT_WRITE and SEG_ACCURACY are the
    fork's)."""
    text = fill(read(DEEPLAB)).replace("    hole: ", "    dilation: ")
    text = text.replace("  strict_dim: false\n", "")
    head = text[:text.index('layers {\n  name: "data"')]
    body = text[text.index("### NETWORK ###"):text.index('layers {\n  bottom: "fc8_voc12"')]
    dims = "".join(f"input_dim: {d}\n" for d in (1, 3, size, size))
    return parse_text(head + 'input: "data"\n' + dims + "\n" + body, caffe_pb2.NetParameter)


def ave_pool(x, k, s, pad, out):
    """Caffe's AVE pooling of (C, H, W) by hand: each window divided by its size clipped to
    the padded input (hend = min(hstart + k, H + pad)): the padding counts, zeros."""
    c, h, w = x.shape
    y = np.empty((c, out, out))
    for i in range(out):
        for j in range(out):
            h0, w0 = i * s - pad, j * s - pad
            h1, w1 = min(h0 + k, h + pad), min(w0 + k, w + pad)
            size = (h1 - h0) * (w1 - w0)
            y[:, i, j] = x[:, max(h0, 0):min(h1, h), max(w0, 0):min(w1, w)].sum(axis=(1, 2)) / size
    return y


def test_deeplab_largefov_in_bvlc_layers(tmp_path):
    """DeepLab-LargeFOV (Chen et al. 2015): VGG-16 whose pools are 3x3 with pad 1 (stride 2,
    then 1 for pool4 and pool5), conv5 dilated by 2 (pad 2), an AVE pool5a and fc6 a 3x3
    convolution dilated by 12 (pad 12, 1024 outputs).  Caffe's upgrade turns the V1 blocks
    into layers and keeps ``dilation`` in convolution_param.

    At 513: pool1 ceil((513 + 2 - 3) / 2) + 1 = 257, pool2 129, pool3 65, then 65 to fc8
    (a dilated 3x3 with pad = dilation keeps the size: 65 + 2 d - (2 d + 1) + 1).  The
    forward runs at 49 (pool1 25, pool2 13, pool3 7): MAX with pad (windows clipped to the
    input), conv5's taps 2 apart, pool5a's AVE with pad 1 dividing every window by 9 (the
    padding counts), and fc6 on a 7 x 7 map, where taps 12 apart leave only the centre one
    inside: fc6 = W[:, :, 1, 1] . pool5a + b at every position."""
    param = deeplab_bvlc()
    path = tmp_path / "deeplab_largefov_bvlc.prototxt"
    write_text(param, str(path))
    net = caffe.Net(str(path), caffe.TEST)
    blobs, params = check_shapes(net, str(path), caffe.TEST)
    assert net.inputs == ["data"] and net.outputs == ["fc8_voc12"]
    assert blobs["pool1"] == (1, 64, 257, 257) and blobs["pool2"] == (1, 128, 129, 129)
    assert blobs["pool3"] == (1, 256, 65, 65) and blobs["pool4"] == (1, 512, 65, 65)
    assert blobs["conv5_3"] == blobs["pool5a"] == (1, 512, 65, 65)
    assert blobs["fc6"] == (1, 1024, 65, 65) and blobs["fc8_voc12"] == (1, 21, 65, 65)
    assert params["fc6"] == [(1024, 512, 3, 3), (1024,)] and params["fc8_voc12"] == [(21, 1024, 1, 1), (21,)]
    cps = {lp.name: lp.convolution_param for lp in upgrade_net(read_net_param(str(path))).layer}
    assert (list(cps["conv5_2"].dilation), list(cps["fc6"].dilation)) == ([2], [12])

    randomize(net, seed=11)
    net.blobs["data"].reshape(1, 3, 49, 49)
    net.reshape()
    small, _ = check_shapes(net, str(path), caffe.TEST, input_shapes={"data": (1, 3, 49, 49)})
    assert (small["pool1"][2], small["pool2"][2], small["pool3"][2], small["fc8_voc12"][2]) == (25, 13, 7, 7)
    x = 20 * np.random.default_rng(12).standard_normal((1, 3, 49, 49)).astype(np.float32)
    out = net.forward(data=x)["fc8_voc12"].copy()
    b = net.blobs
    np.testing.assert_array_equal(b["pool1"].data[0], max_pool(b["conv1_2"].data[0], 3, 2, 1, 25))
    np.testing.assert_array_equal(b["pool4"].data[0], max_pool(b["conv4_3"].data[0], 3, 1, 1, 7))
    c51 = relu(conv_layer(net, "conv5_1", b["pool4"].data[0], pad=2, dilation=2))
    np.testing.assert_allclose(b["conv5_1"].data[0], c51, rtol=1e-4, atol=1e-4)
    p5a = ave_pool(b["pool5"].data[0].astype(np.float64), 3, 1, 1, 7)
    np.testing.assert_allclose(b["pool5a"].data[0], p5a, rtol=1e-5, atol=1e-6)
    corner = b["pool5"].data[0, :, :2, :2].astype(np.float64).sum(axis=(1, 2)) / 9
    np.testing.assert_allclose(b["pool5a"].data[0, :, 0, 0], corner, rtol=1e-5, atol=1e-6)
    w6, b6 = (p.data.astype(np.float64) for p in net.params["fc6"])
    fc6 = relu(np.einsum("oc,chw->ohw", w6[:, :, 1, 1], p5a) + b6[:, None, None])
    np.testing.assert_allclose(b["fc6"].data[0], fc6, rtol=1e-4, atol=1e-4)
    np.testing.assert_allclose(b["fc6"].data[0], relu(conv_layer(net, "fc6", p5a, pad=12, dilation=12)),
                               rtol=1e-4, atol=1e-4)

    model = str(tmp_path / "deeplab.caffemodel")
    net.save(model)
    fresh = caffe.Net(str(path), caffe.TEST, weights=model)
    fresh.blobs["data"].reshape(1, 3, 49, 49)
    fresh.reshape()
    np.testing.assert_array_equal(fresh.forward(data=x)["fc8_voc12"], out)


TINY_TRAIN = """name: "tiny"
layer { name: "data" type: "DummyData" top: "data" top: "label"
  dummy_data_param { shape { dim: 2 dim: 3 dim: 9 dim: 9 } shape { dim: 2 }
    data_filler { type: "constant" value: 0.5 } data_filler { type: "constant" value: 3 } } }
%s
layer { name: "fc" type: "InnerProduct" bottom: "%s" top: "fc"
  inner_product_param { num_output: 21 weight_filler { type: "gaussian" std: 0.1 } } }
layer { name: "loss" type: "SoftmaxWithLoss" bottom: "fc" bottom: "label" top: "loss" }
"""


def test_deeplab_largefov_solver(tmp_path, monkeypatch):
    """The solver names its net by a placeholder (``train_net:
    "${EXP}/config/${NET_ID}/train_${TRAIN_SET}.prototxt"``), which as stored is a file that
    does not exist: Caffe stops there, and so does minicaffe, naming the solver file and
    the field.  Filled in (a stand-in train net at that path, relative to where Caffe runs):
    SGD, ``step`` with gamma 1/sqrt(10) every 2000 iterations (so 0.001, 3.16e-4, 1e-4 over
    the 6000), momentum 0.9, weight_decay 0.0005, no test net, snapshots every 2000 under
    the filled prefix (Caffe's ``<prefix>_iter_<n>.caffemodel``)."""
    monkeypatch.chdir(tmp_path)
    with pytest.raises(FileNotFoundError) as e:
        caffe.get_solver(DEEPLAB_SOLVER)
    assert str(e.value).startswith(f"{DEEPLAB_SOLVER}: train_net: File not found: "
                                   "${EXP}/config/${NET_ID}/train_${TRAIN_SET}.prototxt")
    os.makedirs("voc12/config/DeepLab-LargeFOV")
    os.makedirs("voc12/model/DeepLab-LargeFOV")      # the run script's mkdir -p ${MODEL_DIR}
    conv = ('layer { name: "conv5_1" type: "Convolution" bottom: "data" top: "conv5_1"\n'
            '  convolution_param { num_output: 4 pad: 2 dilation: 2 kernel_size: 3\n'
            '    weight_filler { type: "gaussian" std: 0.1 } } }')
    with open("voc12/config/DeepLab-LargeFOV/train_train_aug.prototxt", "w") as f:
        f.write(TINY_TRAIN % (conv, "conv5_1"))
    with open("solver_train_aug.prototxt", "w") as f:
        f.write(fill(read(DEEPLAB_SOLVER)))
    solver = caffe.get_solver("solver_train_aug.prototxt")
    p = solver.param
    assert type(solver) is caffe.SGDSolver and solver.test_nets == []
    assert (p.lr_policy, p.stepsize, p.max_iter, p.display, p.snapshot) == ("step", 2000, 6000, 10, 2000)
    assert p.gamma == np.float32(0.31622776601683794) and p.base_lr == np.float32(0.001)
    assert (p.momentum, p.weight_decay) == (np.float32(0.9), np.float32(0.0005))
    assert p.snapshot_prefix == "voc12/model/DeepLab-LargeFOV/init_train"
    assert solver.net.blobs["conv5_1"].shape == (2, 4, 9, 9)   # pad = dilation keeps 9
    rates = []
    for it in (0, 1999, 2000, 3999, 4000, 5999):
        solver.iter = it
        rates.append(solver.get_learning_rate())
    gamma = np.float64(np.float32(0.31622776601683794))
    np.testing.assert_allclose(rates, [0.001 * gamma ** (it // 2000)
                                       for it in (0, 1999, 2000, 3999, 4000, 5999)], rtol=1e-6)
    np.testing.assert_allclose(rates[-1], 1e-4, rtol=1e-6)
    solver.iter = 0
    solver.step(1)
    model, state = solver.snapshot()
    assert model == "voc12/model/DeepLab-LargeFOV/init_train_iter_1.caffemodel"
    assert os.path.exists(model) and os.path.exists(state)


# ---------------------------------------------------------------------- MobileNet-SSD
PERMUTE = "  permute_param {\n    order: 0\n    order: 2\n    order: 3\n    order: 1\n  }\n"


def drop_prior_boxes(text):
    """``text`` with every ``prior_box_param`` block blanked (their sizes differ)."""
    for piece in set(re.findall(r"  prior_box_param \{\n(?:    .*\n)+?  \}\n", text)):
        text = blank(text, piece)
    return text


def ssd_without_fork_fields(text):
    """MobileNet-SSD with SSD's parameter blocks (permute_param, prior_box_param,
    detection_output_param) blanked, line numbers kept."""
    text = drop_prior_boxes(blank(text, PERMUTE))
    start = text.index("  detection_output_param {")
    return blank(text, text[start:text.index("  }\n}\n", start) + 4])


def test_mobilenet_ssd_is_refused_where_caffe_stops(tmp_path):
    """SSD's layers carry parameter blocks that caffe.proto lacks, so the parser stops at
    the first one left: the first Permute's ``permute_param`` (line 1177; the block opens at
    1172), then the first PriorBox's ``prior_box_param`` (1245; 1239), then
    ``detection_output_param`` (1900; 1890).  Without them the file parses, and the layer
    factory stops at the first of SSD's types in layer order, the Permute at line 1172."""
    text = read(SSD)
    check_refusals(tmp_path, "ssd.prototxt", text, [
        (1177, 3, ('"permute_param"', '"Permute"'), "conv11_mbox_loc_perm", 1172,
         lambda t: blank(t, PERMUTE)),
        (1245, 3, ('"prior_box_param"', '"PriorBox"'), "conv11_mbox_priorbox", 1239,
         drop_prior_boxes),
        (1900, 3, ('"detection_output_param"', '"DetectionOutput"'), "detection_out", 1890,
         None),
    ])
    path = tmp_path / "ssd.prototxt"
    assert ssd_without_fork_fields(text).count("\n") == text.count("\n")
    path.write_text(ssd_without_fork_fields(text))
    with pytest.raises(UnknownLayerTypeError) as e:
        caffe.Net(str(path), caffe.TEST)
    assert str(e.value).startswith(f"{path}:1172: layer 'conv11_mbox_loc_perm': unknown layer "
                                   "type 'Permute'")


HEADS = ("conv11", "conv13", "conv14_2", "conv15_2", "conv16_2", "conv17_2")


def ssd_param(keep, first=None):
    """The file's layers that ``keep`` selects (SSD's fields blanked), after ``first``."""
    param = parse_text(ssd_without_fork_fields(read(SSD)), caffe_pb2.NetParameter)
    if first is not None:                   # ``first`` feeds the layers instead of data
        param.ClearField("input")
        param.ClearField("input_shape")
    layers = ([first] if first is not None else []) + [lp for lp in param.layer if keep(lp)]
    del param.layer[:]
    param.layer.extend(layers)
    return param


def test_mobilenet_ssd_in_bvlc_layers(tmp_path):
    """Every Convolution and ReLU of the file: MobileNet (Howard et al. 2017) with biased
    convolutions (its BatchNorms merged), the depthwise 3x3s as ``group`` = channels with
    ``engine: CAFFE``, SSD's extra layers conv14..17 and the 1x1 heads.  Nine stride-2
    convolutions take 300 to 150, 75, 38, 19 (conv11), 10 (conv13), 5, 3, 2, 1, each
    (i + 2 - 3) // 2 + 1.  The heads: conv11 has 3 priors a cell (min_size only, aspect 2
    flipped: 1, 2, 1/2), the others 6 (with max_size, aspects 2 and 3 flipped): loc 4 and
    conf 21 numbers each, so 19^2 * 3 + (10^2 + 5^2 + 3^2 + 2^2 + 1) * 6 = 1917 priors.
    The forward runs at 129 (65, 33, 17, 9, 5, 3, 2, 1, 1) against NumPy."""
    param = ssd_param(lambda lp: lp.type in ("Convolution", "ReLU"))
    path = tmp_path / "ssd_bvlc.prototxt"
    write_text(param, str(path))
    net = caffe.Net(str(path), caffe.TEST)
    blobs, params = check_shapes(net, str(path), caffe.TEST)
    sizes = [blobs[h][2] for h in HEADS]
    assert sizes == [19, 10, 5, 3, 2, 1] and blobs["conv0"] == (1, 32, 150, 150)
    assert blobs["conv11"][1] == 512 and blobs["conv13"][1] == 1024
    assert params["conv1/dw"] == [(32, 1, 3, 3), (32,)] and params["conv13/dw"] == [(1024, 1, 3, 3), (1024,)]
    assert params["conv13"] == [(1024, 1024, 1, 1), (1024,)]
    priors = [blobs[h + "_mbox_loc"][1] // 4 for h in HEADS]
    assert priors == [3, 6, 6, 6, 6, 6]
    assert [blobs[h + "_mbox_conf"][1] for h in HEADS] == [21 * k for k in priors]
    assert sum(k * s * s for k, s in zip(priors, sizes)) == 1917
    cps = {lp.name: lp.convolution_param for lp in param.layer if lp.type == "Convolution"}
    assert cps["conv5/dw"].engine == caffe_pb2.ConvolutionParameter.CAFFE
    assert cps["conv5/dw"].group == 256 and cps["conv5"].group == 1

    randomize(net, seed=21)
    net.blobs["data"].reshape(1, 3, 129, 129)
    net.reshape()
    small, _ = check_shapes(net, str(path), caffe.TEST, input_shapes={"data": (1, 3, 129, 129)})
    assert [small[h][2] for h in HEADS] == [9, 5, 3, 2, 1, 1]
    x = np.random.default_rng(22).standard_normal((1, 3, 129, 129)).astype(np.float32)
    net.forward(data=x)
    b = net.blobs
    np.testing.assert_allclose(b["conv0"].data[0], relu(conv_layer(net, "conv0", x[0], stride=2, pad=1)),
                               rtol=1e-4, atol=1e-4)
    dw = relu(conv_layer(net, "conv2/dw", b["conv1"].data[0], stride=2, pad=1, group=64))
    np.testing.assert_allclose(b["conv2/dw"].data[0], dw, rtol=1e-4, atol=1e-4)
    np.testing.assert_allclose(b["conv13/dw"].data[0],
                               relu(conv_layer(net, "conv13/dw", b["conv12"].data[0], pad=1, group=1024)),
                               rtol=1e-4, atol=1e-4)
    np.testing.assert_allclose(b["conv11_mbox_conf"].data[0],
                               conv_layer(net, "conv11_mbox_conf", b["conv11"].data[0]),
                               rtol=1e-4, atol=1e-4)
    np.testing.assert_allclose(b["conv17_2"].data[0],
                               relu(conv_layer(net, "conv17_2", b["conv17_1"].data[0], stride=2, pad=1)),
                               rtol=1e-4, atol=1e-4)
    round_trip(net, str(path), tmp_path, {"data": x})


def test_mobilenet_ssd_head_tail_in_bvlc_layers(tmp_path):
    """The file's Flatten, Concat, Reshape, Softmax and Flatten after SSD's Permutes, fed
    with the permuted head outputs (N, H, W, C) as inputs named like the Permutes' tops:
    each Flatten (axis 1) makes a row of H * W * C, ``mbox_loc`` and ``mbox_conf`` join
    them along axis 1 (1917 * 4 and 1917 * 21 at 300), the Reshape's 0 keeps N and its -1
    is the prior count, and the Softmax with ``axis: 2`` normalizes each prior's 21
    scores; the last Flatten gives DetectionOutput its (N, priors * 21)."""
    tail_types = ("Flatten", "Concat", "Reshape", "Softmax")
    tops = [f"{h}_mbox_{k}_perm" for h in HEADS for k in ("loc", "conf")]
    at300 = {"conv11": 19, "conv13": 10, "conv14_2": 5, "conv15_2": 3, "conv16_2": 2, "conv17_2": 1}

    def perm_shapes(size):
        return [(1, size[h], size[h], (12 if h == "conv11" else 24) if k == "loc"
                 else (63 if h == "conv11" else 126)) for h in HEADS for k in ("loc", "conf")]
    inp = caffe_pb2.LayerParameter(name="perm", type="Input", top=tops)
    for shape in perm_shapes(at300):
        inp.input_param.shape.add(dim=shape)
    param = ssd_param(lambda lp: lp.type in tail_types and lp.name != "mbox_priorbox", inp)
    path = tmp_path / "ssd_tail.prototxt"
    write_text(param, str(path))
    net = caffe.Net(str(path), caffe.TEST)
    blobs, _ = check_shapes(net, str(path), caffe.TEST)
    assert blobs["mbox_loc"] == (1, 1917 * 4) and blobs["mbox_conf"] == (1, 1917 * 21)
    assert blobs["mbox_conf_reshape"] == blobs["mbox_conf_softmax"] == (1, 1917, 21)
    assert blobs["mbox_conf_flatten"] == (1, 1917 * 21)

    rng = np.random.default_rng(31)
    at129 = dict(zip(HEADS, (9, 5, 3, 2, 1, 1)))
    feeds = {t: rng.standard_normal(s).astype(np.float32) for t, s in zip(tops, perm_shapes(at129))}
    for t, a in feeds.items():
        net.blobs[t].reshape(*a.shape)
    net.reshape()
    out = net.forward(**feeds)
    loc = np.concatenate([feeds[f"{h}_mbox_loc_perm"].reshape(1, -1) for h in HEADS], axis=1)
    conf = np.concatenate([feeds[f"{h}_mbox_conf_perm"].reshape(1, -1) for h in HEADS], axis=1)
    assert loc.shape == (1, 483 * 4)                  # 9^2 * 3 + (25 + 9 + 4 + 1 + 1) * 6 priors
    np.testing.assert_array_equal(net.blobs["mbox_loc"].data, loc)
    scores = conf.reshape(1, -1, 21).astype(np.float64)
    soft = np.exp(scores - scores.max(axis=2, keepdims=True))
    soft /= soft.sum(axis=2, keepdims=True)
    np.testing.assert_allclose(net.blobs["mbox_conf_softmax"].data, soft, rtol=1e-5, atol=1e-7)
    np.testing.assert_allclose(out["mbox_conf_flatten"], soft.reshape(1, -1), rtol=1e-5, atol=1e-7)


def test_mobilenet_ssd_rmsprop_solver(tmp_path, monkeypatch):
    """solver_train.prototxt: SSD's solver fields stop the parser, ``eval_type`` at line 22
    and then ``ap_version`` at 23.  Without them: RMSProp (``type: "RMSProp"``) with
    rms_decay and delta at caffe.proto's defaults (0.99, 1e-8) and no momentum (which
    RMSPropSolver refuses), multistep at 20000 and 40000 halving 0.0005, weight_decay 5e-5;
    ``test_initialization: false``, so no test at iteration 0.

    The first update (RMSPropSolver::ComputeUpdateValue): history = 0.01 g^2, so each
    weight moves by lr_local * g / (0.1 |g| + 1e-8), i.e. 10 lr_local against the sign of
    its gradient: 0.005 for weights (lr_mult 1, g with 5e-5 w of decay), 0.01 for biases
    (lr_mult 2, decay_mult 0)."""
    monkeypatch.chdir(tmp_path)
    text = read(SSD_SOLVER)
    for line, field, fix in ((22, "eval_type", 'eval_type: "detection"\n'),
                             (23, "ap_version", 'ap_version: "11point"\n')):
        with open("solver.prototxt", "w") as f:
            f.write(text)
        with pytest.raises(PrototxtError) as e:
            caffe.get_solver("solver.prototxt")
        msg = str(e.value)
        assert msg.startswith(f"solver.prototxt:{line}:1: ") and f'"{field}"' in msg
        assert "SSD's Caffe fork" in msg
        text = blank(text, fix)
    with open("solver.prototxt", "w") as f:
        f.write(text)
    ssd = read(SSD)
    conv0 = ssd[ssd.index('layer {\n  name: "conv0"\n'):ssd.index('layer {\n  name: "conv0/relu"')]
    os.makedirs("example")
    for name in ("MobileNetSSD_train.prototxt", "MobileNetSSD_test.prototxt"):
        with open(os.path.join("example", name), "w") as f:
            f.write(TINY_TRAIN % (conv0, "conv0"))
    solver = caffe.get_solver("solver.prototxt")
    p = solver.param
    assert type(solver) is caffe.RMSPropSolver and len(solver.test_nets) == 1
    assert (p.rms_decay, p.delta, p.momentum) == (np.float32(0.99), np.float32(1e-8), 0)
    assert (p.lr_policy, list(p.stepvalue), p.gamma) == ("multistep", [20000, 40000], 0.5)
    assert (p.base_lr, p.weight_decay) == (np.float32(0.0005), np.float32(5e-5))
    assert (list(p.test_iter), p.test_interval, p.test_initialization) == ([673], 10000, False)
    assert (p.average_loss, p.iter_size, p.max_iter, p.snapshot) == (10, 1, 120000, 1000)
    assert p.snapshot_after_train and not p.debug_info and p.snapshot_prefix == "snapshot/mobilenet"

    tested = []
    monkeypatch.setattr(solver, "test_all", lambda: tested.append(solver.iter))
    net = solver.net
    w0, b0 = (q.data.copy() for q in net.params["conv0"])
    net.forward()
    net.backward()                    # the gradient the step will see (constant dummy data)
    gw = net.params["conv0"][0].diff.astype(np.float64) + 5e-5 * w0
    gb = net.params["conv0"][1].diff.astype(np.float64)
    solver.step(1)
    assert tested == []
    w1, b1 = (q.data for q in net.params["conv0"])
    for before, after, g, rate in ((w0, w1, gw, 0.0005), (b0, b1, gb, 0.001)):
        expected = rate * g / (np.sqrt(0.01 * g * g) + 1e-8)
        np.testing.assert_allclose(before - after, expected, rtol=1e-4, atol=1e-9)
        moved = np.abs(g) > 1e-4
        assert moved.any()
        np.testing.assert_allclose(np.abs(before - after)[moved], 10 * rate, rtol=1e-3)
    np.testing.assert_allclose(solver.history[0], 0.01 * gw * gw, rtol=1e-4, atol=1e-14)
    rates = []
    for it in (0, 19999, 20000, 39999, 40000, 119999):
        solver.iter = it
        rates.append(solver.get_learning_rate())
    np.testing.assert_allclose(rates, [5e-4, 5e-4, 2.5e-4, 2.5e-4, 1.25e-4, 1.25e-4], rtol=1e-6)
    # Caffe's RMSPropSolver checks momentum == 0
    with open("momentum.prototxt", "w") as f:
        f.write(text + "momentum: 0.9\n")
    with pytest.raises(ValueError, match="momentum cannot be used with RMSProp"):
        caffe.get_solver("momentum.prototxt")


# ------------------------------------------------------------------ CaffeNet, net surgery
@pytest.fixture(scope="module")
def caffenet():
    """The deploy net with random weights (61 M of them: drawn once for both tests), and a
    net of its conv1..pool5 (the file cut before fc6) holding the same conv weights."""
    net = caffe.Net(CAFFENET, caffe.TEST)
    randomize(net, seed=42)
    net.blobs["data"].reshape(1, 3, 227, 227)
    net.reshape()
    text = read(CAFFENET)
    part = caffe.Net(parse_text(text[:text.index('layer {\n  name: "fc6"')],
                                caffe_pb2.NetParameter), caffe.TEST)
    for name, ps in part.params.items():
        for a, q in zip(ps, net.params[name]):
            a.data[...] = q.data
    return net, part


def test_caffenet_deploy(tmp_path, caffenet):
    """BVLC's CaffeNet deploy net (``input_shape`` 10 x 3 x 227 x 227): conv1 (227 - 11) / 4
    + 1 = 55, pool1 ceil((55 - 3) / 2) + 1 = 27, conv2 (pad 2, group 2) 27, pool2 13,
    conv3..5 13, pool5 6, fc6 from 256 * 6 * 6 = 9216.  ``group: 2`` halves each weight's
    input channels (conv2 (256, 48, 5, 5)) and splits the outputs: the first 128 read only
    the first 48 channels of norm1.  No layer has a weight_filler: caffe.proto's default is
    ``constant`` 0, so a fresh net gives every class 1/1000 (whatever pool5 holds).  The round
    trip covers conv1 to
    pool5 (the three fully connected layers alone are 58.6 M weights)."""
    fresh = caffe.Net(CAFFENET, caffe.TEST)
    blobs, params = check_shapes(fresh, CAFFENET, caffe.TEST)
    assert blobs["conv1"] == (10, 96, 55, 55) and blobs["pool1"] == (10, 96, 27, 27)
    assert blobs["pool2"] == (10, 256, 13, 13) and blobs["pool5"] == (10, 256, 6, 6)
    assert blobs["prob"] == (10, 1000)
    assert params["conv2"] == [(256, 48, 5, 5), (256,)] and params["conv4"] == [(384, 192, 3, 3), (384,)]
    assert params["fc6"] == [(4096, 9216), (4096,)]
    assert not any(np.any(q.data) for ps in fresh.params.values() for q in ps)
    fresh.blobs["data"].reshape(1, 3, 227, 227)       # a batch of one before any allocation
    fresh.reshape()
    fresh.blobs["pool5"].data[...] = 1
    np.testing.assert_allclose(fresh.forward(start="fc6")["prob"], np.full((1, 1000), 1e-3), rtol=1e-6)
    del fresh

    net, part = caffenet
    x = 50 * np.random.default_rng(41).standard_normal((1, 3, 227, 227)).astype(np.float32)
    net.forward(data=x)
    b = net.blobs
    c2 = relu(conv_layer(net, "conv2", b["norm1"].data[0], pad=2, group=2))
    np.testing.assert_allclose(b["conv2"].data[0], c2, rtol=1e-4, atol=1e-4)
    w2 = net.params["conv2"][0].data
    half = conv2d(b["norm1"].data[0, :48], w2[:128], pad=2) + net.params["conv2"][1].data[:128, None, None]
    np.testing.assert_allclose(b["conv2"].data[0, :128], relu(half), rtol=1e-4, atol=1e-4)
    np.testing.assert_allclose(b["prob"].data.sum(), 1, rtol=1e-5)

    conv_part = tmp_path / "caffenet_conv.prototxt"
    text = read(CAFFENET)
    conv_part.write_text(text[:text.index('layer {\n  name: "fc6"')])
    part.blobs["data"].reshape(1, 3, 227, 227)
    part.reshape()
    part.forward(data=x)
    np.testing.assert_array_equal(part.blobs["pool5"].data, b["pool5"].data)
    round_trip(part, str(conv_part), tmp_path, {"data": x})


def test_caffenet_full_conv_net_surgery(tmp_path, caffenet):
    """examples/net_surgery's fully convolutional CaffeNet (``input_dim`` 1, 3, 451, 451):
    fc6-conv is a 6x6 convolution over pool5 (4096, 256, 6, 6), fc7-conv and fc8-conv 1x1;
    at 451: conv1 111, pool1 55, pool2 27, pool5 13, so fc6-conv (13 - 6) + 1 = 8 and an
    8 x 8 map of class scores, the Softmax over axis 1 at each place.  The notebook's
    surgery: weights copied by layer name from the classifier's .caffemodel (conv1..conv5;
    Caffe ignores the source's fc6..fc8, whose names the target lacks), then each fc
    layer's weights assigned to its conv twin through ``.flat`` (the same numbers in C
    order).  Then output place (i, j) is the classifier's fc6..prob on pool5's 6 x 6 window
    at (i, j), the 227 x 227 crop at (32 i, 32 j) (4 * 2 * 2 * 2) but for the zero padding
    of conv2..conv5 at the crop's edges.  Run at 259 (pool5 7, a 2 x 2 map)."""
    full = caffe.Net(FULL_CONV, caffe.TEST)
    blobs, params = check_shapes(full, FULL_CONV, caffe.TEST)
    assert full.inputs == ["data"] and blobs["data"] == (1, 3, 451, 451)
    assert blobs["conv1"] == (1, 96, 111, 111) and blobs["pool1"] == (1, 96, 55, 55)
    assert blobs["pool2"] == (1, 256, 27, 27) and blobs["pool5"] == (1, 256, 13, 13)
    assert blobs["fc6-conv"] == (1, 4096, 8, 8) and blobs["prob"] == (1, 1000, 8, 8)
    assert params["fc6-conv"] == [(4096, 256, 6, 6), (4096,)]
    assert params["fc7-conv"] == [(4096, 4096, 1, 1), (4096,)]

    net, part = caffenet
    weights = str(tmp_path / "caffenet_conv.caffemodel")
    part.save(weights)
    full.copy_from(weights)
    for name in ("conv1", "conv5"):
        np.testing.assert_array_equal(full.params[name][0].data, net.params[name][0].data)
    assert not np.any(full.params["fc6-conv"][0].data)            # not in the weights: 0
    for fc, conv in (("fc6", "fc6-conv"), ("fc7", "fc7-conv"), ("fc8", "fc8-conv")):
        full.params[conv][0].data.flat = net.params[fc][0].data.flat
        full.params[conv][1].data[...] = net.params[fc][1].data
    assert np.array_equal(full.params["fc6-conv"][0].data[7, 200], net.params["fc6"][0].data[7, 7200:7236].reshape(6, 6))

    full.blobs["data"].reshape(1, 3, 259, 259)
    full.reshape()
    small, _ = check_shapes(full, FULL_CONV, caffe.TEST, input_shapes={"data": (1, 3, 259, 259)})
    assert small["pool5"] == (1, 256, 7, 7) and small["prob"] == (1, 1000, 2, 2)
    image = 50 * np.random.default_rng(52).standard_normal((1, 3, 259, 259)).astype(np.float32)
    prob = full.forward(data=image)["prob"].copy()
    np.testing.assert_allclose(prob.sum(axis=1), 1, rtol=1e-5)
    # the classifier's fc6..prob on pool5's 6 x 6 windows at (0, 0) and (1, 1)
    pool5 = full.blobs["pool5"].data[0]
    net.blobs["data"].reshape(2, 3, 227, 227)
    net.reshape()
    net.blobs["pool5"].data[...] = np.stack([pool5[:, :6, :6], pool5[:, 1:, 1:]])
    ref = net.forward(start="fc6")["prob"]
    np.testing.assert_allclose(prob[0, :, 0, 0], ref[0], rtol=1e-4, atol=1e-7)
    np.testing.assert_allclose(prob[0, :, 1, 1], ref[1], rtol=1e-4, atol=1e-7)
    # the crop at (0, 0) differs near its edge: conv2..conv5 pad with zeros where the larger
    # image has data, so the classifier on the crop is not the map's place (0, 0) exactly
    crop = image[:, :, :227, :227]
    net.blobs["data"].reshape(1, 3, 227, 227)
    net.reshape()
    net.forward(data=crop)
    np.testing.assert_allclose(net.blobs["pool2"].data[0, :, :11, :11],
                               full.blobs["pool2"].data[0, :, :11, :11], rtol=1e-4, atol=1e-4)
    assert not np.allclose(net.blobs["pool5"].data[0], pool5[:, :6, :6], rtol=1e-3, atol=1e-3)


# ------------------------------------------------------------------ dilated convolutions
def ctx_param(source, first, shape):
    """The context module of a dilation deploy net, from layer ``first`` on, fed by an
    Input of ``shape`` named as the front end's last blob."""
    param = read_net_param(source)
    names = [lp.name for lp in param.layer]
    layers = list(param.layer)[names.index(first):]
    out = caffe_pb2.NetParameter(name="context")
    inp = out.layer.add(name="input", type="Input", top=[layers[0].bottom[0]])
    inp.input_param.shape.add(dim=shape)
    out.layer.extend(layers)
    return out


def test_dilation8_pascal_voc(tmp_path):
    """Yu and Koltun's Dilation8 for PASCAL VOC (ICLR 2016): the front end is VGG-16 with no
    padding, pool4 and pool5 removed, conv5 dilated by 2 and fc6 a 7x7 convolution dilated
    by 4; the context module pads its first 3x3 by 33 and then shrinks the map by 2, 2, 4,
    8, 16, 32 and 2 (dilations 1, 1, 2, 4, 8, 16, then ct_fc1), 66 in all, so ct_final
    is as large as fc-final.  At 900: 898, 896, pool 448, 446, 444, 222, 220, 218, 216,
    108, 106, 104, 102, conv5 98, 94, 90, fc6 90 - 24 = 66, then 130, 128, 124, 116, 100,
    68, 66.  The front end (134 M weights) is only built; the context module runs on a
    4 x 4 fc-final (68, 66, 62, 54, 38, 6, 4) against NumPy and round-trips."""
    net = caffe.Net(DIL_VOC, caffe.TEST)
    blobs, params = check_shapes(net, DIL_VOC, caffe.TEST)
    walk = [blobs[n][2] for n in ("conv1_2", "pool1", "pool3", "conv4_3", "conv5_3", "fc6",
                                  "ct_conv1_1", "ct_conv2_1", "ct_conv5_1", "ct_final")]
    assert walk == [896, 448, 108, 102, 90, 66, 130, 124, 68, 66]
    assert blobs["prob"] == (1, 21, 66, 66) and params["fc6"] == [(4096, 512, 7, 7), (4096,)]
    assert params["ct_conv1_1"] == [(42, 21, 3, 3), (42,)] and params["ct_conv5_1"] == [(672, 336, 3, 3), (672,)]
    specs = dict(zip(net.layer_names, net.param_specs))
    assert [(s.lr_mult, s.decay_mult) for s in specs["ct_conv1_2"]] == [(1, 1), (2, 1)]
    del net

    ctx = ctx_param(DIL_VOC, "ct_conv1_1", (1, 21, 4, 4))
    path = tmp_path / "dilation8_context.prototxt"
    write_text(ctx, str(path))
    net = caffe.Net(str(path), caffe.TEST)
    small, _ = check_shapes(net, str(path), caffe.TEST)
    assert [small[n][2] for n in ("ct_conv1_1", "ct_conv1_2", "ct_conv2_1", "ct_conv3_1",
                                  "ct_conv4_1", "ct_conv5_1", "ct_final")] == [68, 66, 62, 54, 38, 6, 4]
    randomize(net, seed=61)
    x = np.random.default_rng(62).standard_normal((1, 21, 4, 4)).astype(np.float32)
    net.forward(**{"fc-final": x})
    b = net.blobs
    c11 = relu(conv_layer(net, "ct_conv1_1", x[0], pad=33))
    np.testing.assert_allclose(b["ct_conv1_1"].data[0], c11, rtol=1e-4, atol=1e-5)
    # far from the 4 x 4 input a 3x3 sees only padding: the bias, through the ReLU
    np.testing.assert_allclose(b["ct_conv1_1"].data[0, :, 0, 0],
                               relu(net.params["ct_conv1_1"][1].data), rtol=1e-6)
    c31 = relu(conv_layer(net, "ct_conv3_1", b["ct_conv2_1"].data[0], dilation=4))
    np.testing.assert_allclose(b["ct_conv3_1"].data[0], c31, rtol=1e-4, atol=1e-4)
    c51 = relu(conv_layer(net, "ct_conv5_1", b["ct_conv4_1"].data[0], dilation=16))
    np.testing.assert_allclose(b["ct_conv5_1"].data[0], c51, rtol=1e-4, atol=1e-4)
    probs = b["prob"].data[0]
    np.testing.assert_allclose(probs.sum(axis=0), 1, rtol=1e-5)
    round_trip(net, str(path), tmp_path, {"fc-final": x})


def bilinear(k):
    """The bilinear upsampling kernel (Caffe's BilinearFiller for a k x k blob): f =
    ceil(k / 2), c = (k - 1) / (2 f), w(x, y) = (1 - |x / f - c|) (1 - |y / f - c|)."""
    f = int(np.ceil(k / 2))
    c = (k - 1) / (2 * f)
    t = 1 - np.abs(np.arange(k) / f - c)
    return np.outer(t, t)


def deconv_per_channel(x, w, stride, pad):
    """Caffe's Deconvolution with group = channels for (C, H, W) by hand: each input place
    (i, j) adds x[c, i, j] * w[c, 0] at (i stride - pad, j stride - pad) of channel c;
    output s (H - 1) + k - 2 pad per axis."""
    c, h, wd = x.shape
    k = w.shape[-1]
    full = np.zeros((c, stride * (h - 1) + k, stride * (wd - 1) + k))
    for i in range(h):
        for j in range(wd):
            full[:, i * stride:i * stride + k, j * stride:j * stride + k] += \
                x[:, i, j, None, None] * w[:, 0]
    return full[:, pad:full.shape[1] - pad, pad:full.shape[2] - pad]


def test_dilation10_cityscapes(tmp_path):
    """Dilation10 for Cityscapes: the same front end (1396 -> final 128: 1396 - 4 = 1392,
    696, 692, 346, 340, 170, 164, 152 after conv5, fc6 128) with every convolution's bias
    at lr_mult 2, decay_mult 0; a context module of 19 channels whose 3x3s are padded as
    much as they are dilated (1, 1, 2, 4, 8, 16, 32, 64, then 1), so 128 throughout; then
    ``ctx_upsample``, a Deconvolution with ``group: 19`` (weights (19, 1, 16, 16): input
    channels, num_output / group), stride 8, pad 4, no bias and lr_mult 0: 8 (128 - 1) + 16
    - 8 = 1024.  It has no weight_filler, so a fresh net's upsampling is all zeros (the
    deploy's weights are bilinear kernels).  The context module and the upsampling run on
    a 16 x 16 ``final`` (16 throughout, 128 after) against NumPy and round-trip."""
    net = caffe.Net(DIL_CITY, caffe.TEST)
    blobs, params = check_shapes(net, DIL_CITY, caffe.TEST)
    walk = [blobs[n][2] for n in ("conv1_2", "pool1", "pool2", "pool3", "conv5_3", "final",
                                  "ctx_conv7_1", "ctx_final", "ctx_upsample")]
    assert walk == [1392, 696, 346, 170, 152, 128, 128, 128, 1024]
    assert blobs["prob"] == (1, 19, 1024, 1024)
    assert params["ctx_upsample"] == [(19, 1, 16, 16)] and params["ctx_conv7_1"] == [(19, 19, 3, 3), (19,)]
    specs = dict(zip(net.layer_names, net.param_specs))
    assert [(s.lr_mult, s.decay_mult) for s in specs["ctx_upsample"]] == [(0, 0)]
    assert [(s.lr_mult, s.decay_mult) for s in specs["fc6"]] == [(1, 1), (2, 0)]
    del net

    ctx = ctx_param(DIL_CITY, "ctx_conv1_1", (1, 19, 16, 16))
    path = tmp_path / "dilation10_context.prototxt"
    write_text(ctx, str(path))
    net = caffe.Net(str(path), caffe.TEST)
    small, _ = check_shapes(net, str(path), caffe.TEST)
    assert small["ctx_conv7_1"] == (1, 19, 16, 16) and small["prob"] == (1, 19, 128, 128)
    x = np.random.default_rng(71).standard_normal((1, 19, 16, 16)).astype(np.float32)
    np.testing.assert_allclose(net.forward(final=x)["prob"], 1 / 19, rtol=1e-6)
    assert not np.any(net.blobs["ctx_upsample"].data)           # no weight_filler: zeros
    randomize(net, seed=72)
    up = net.params["ctx_upsample"][0].data
    up[...] = bilinear(16)
    net.forward(final=x)
    b = net.blobs
    for name, d in (("ctx_conv3_1", 4), ("ctx_conv7_1", 64)):
        bottom = b[net.bottom_names[name][0]].data[0]
        np.testing.assert_allclose(b[name].data[0], relu(conv_layer(net, name, bottom, pad=d, dilation=d)),
                                   rtol=1e-4, atol=1e-5)
    # dilation 64 on a 16 x 16 map: only the centre tap lands inside
    w7, b7 = (q.data.astype(np.float64) for q in net.params["ctx_conv7_1"])
    bottom = b["ctx_conv6_1"].data[0].astype(np.float64)
    np.testing.assert_allclose(b["ctx_conv7_1"].data[0],
                               relu(np.einsum("oc,chw->ohw", w7[:, :, 1, 1], bottom) + b7[:, None, None]),
                               rtol=1e-4, atol=1e-5)
    final = b["ctx_final"].data[0]
    upsampled = deconv_per_channel(final.astype(np.float64), bilinear(16)[None, None].repeat(19, 0), 8, 4)
    np.testing.assert_allclose(b["ctx_upsample"].data[0], upsampled, rtol=1e-4, atol=1e-5)
    # output row 7 is row 11 of the uncropped map: 11 into input row 0's kernel (weight
    # 1 - |11/8 - 15/16| = 9/16) and 3 into row 1's (7/16); likewise for columns
    mix = np.array([9, 7]) / 16
    np.testing.assert_allclose(b["ctx_upsample"].data[0, :, 7, 7],
                               np.einsum("i,j,cij->c", mix, mix, final[:, :2, :2]), rtol=1e-4, atol=1e-5)
    round_trip(net, str(path), tmp_path, {"final": x})

