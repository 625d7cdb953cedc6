"""A ninth sweep of public prototxt files (tests/data/zoo9/README.md lists them): the SENet
authors' SE-ResNet-50 (rebuilt by tests/zoo9_nets.py), whose ``Axpy`` layers are no BVLC
type, and py-faster-rcnn's ZF Faster R-CNN test net, whose ``ROIPooling`` layer and
``scale_train`` field are a fork's.

As in tests/test_caffe_zoo8.py: each net is built in the phase its file is for; every
blob's and param's shape is checked against Caffe's rules (``caffe_shapes`` in
tests/zoo3_nets.py); the shapes that tell the rules apart (pooling's ceil beside a
convolution's floor) against numbers worked by hand in the docstrings; one forward per net
against NumPy.  Where a file needs a layer BVLC Caffe lacks, the test checks that minicaffe
refuses it where Caffe does, naming the file, the line, the layer and the type, and then
builds everything the file holds that BVLC Caffe can run.
"""
import math
import os
import sys

import numpy as np
import pytest

import minicaffe as caffe
from minicaffe.layer import UnknownLayerTypeError
from minicaffe.proto import PrototxtError, caffe_pb2, read_net_param, write_text

from test_caffe_zoo3 import check_shapes, randomize
from test_caffe_zoo7 import max_pool
from test_caffe_zoo8 import conv2d
from zoo9_nets import SE_RESNET50_CHARS, se_resnet50_deploy

ZOO = os.path.join(os.path.dirname(os.path.abspath(__file__)), "data", "zoo9")


def zoo(*parts):
    return os.path.join(ZOO, *parts)


def sigmoid(x):
    return 1 / (1 + np.exp(-x))


# ---------------------------------------------------------------- SE-ResNet-50 (SENet)
# The stored copy's text on either side of each 16,000-character boundary of read_file
# (hujie-frank/SENet models/SE-ResNet-50.prototxt at 2c51ece0): offset -> (the text that
# ends there, the text that starts there).
SE_BOUNDARIES = {
    16000: ('layer {\n  name: "conv3_2_1x1_up"\n  type: "Convolution"\n'
            '  bottom: "conv3_2_1x1_down"\n  top: "conv3_2_1x1_up"\n  convolution_param {\n'
            '    num_output: 512\n    kernel_size: 1\n  ',
            '  stride: 1\n  }\n}\nlayer {\n  name: "conv3_2_prob"\n  type: "Sigmoid"\n'),
    32000: ('layer {\n  name: "conv4_4_3x3"\n  type: "Convolution"\n'
            '  bottom: "conv4_4_1x1_reduce"\n  top: "conv4_4_3x3"\n  convolution_param {\n'
            '    num_output: 256\n    bias_te',
            'rm: false\n    pad: 1\n    kernel_size: 3\n    stride: 1\n  }\n}\n'),
    48000: ('layer {\n  name: "conv5_3_global_pool"\n  type: "Pooling"\n'
            '  bottom: "conv5_3_1x1_increase"\n  top: "conv5_3_global_pool"\n'
            '  pooling_param {\n    po',
            'ol: AVE\n    engine: CAFFE\n    global_pooling: true\n  }\n}\n'),
}
# Pieces of the stored text: the head (comment, ``input_param: {``, trailing spaces), the
# stem's convolution, an SE branch's biased 1x1, a stride-2 reduce, the first two Axpy
# layers (projection and identity shortcut) and the tail.
SE_PIECES = (
    'name: "SE-ResNet-50"\n# mean_value: 104, 117, 123\nlayer { \n  name: "data"\n'
    '  type: "Input"\n  top: "data"\n  input_param: {\n    shape: {\n      dim: 1 \n'
    '      dim: 3 \n      dim: 224 \n      dim: 224\n    }\n  }\n}\n'
    'layer {\n  name: "conv1/7x7_s2"\n  type: "Convolution"\n  bottom: "data"\n'
    '  top: "conv1/7x7_s2"\n  convolution_param {\n    num_output: 64\n    bias_term: false\n'
    '    pad: 3\n    kernel_size: 7\n    stride: 2\n  }\n}\n',
    'layer {\n  name: "conv2_1_1x1_down"\n  type: "Convolution"\n'
    '  bottom: "conv2_1_global_pool"\n  top: "conv2_1_1x1_down"\n  convolution_param {\n'
    '    num_output: 16\n    kernel_size: 1\n    stride: 1\n  }\n}\n',
    'layer {\n  name: "conv3_1_1x1_reduce"\n  type: "Convolution"\n  bottom: "conv2_3"\n'
    '  top: "conv3_1_1x1_reduce"\n  convolution_param {\n    num_output: 128\n'
    '    bias_term: false\n    kernel_size: 1\n    stride: 2\n  }\n}\n',
    'layer {\n  name: "conv2_1"\n  type: "Axpy"\n  bottom: "conv2_1_1x1_up"\n'
    '  bottom: "conv2_1_1x1_increase"\n  bottom: "conv2_1_1x1_proj"\n  top: "conv2_1"\n}\n',
    'layer {\n  name: "conv2_2"\n  type: "Axpy"\n  bottom: "conv2_2_1x1_up"\n'
    '  bottom: "conv2_2_1x1_increase"\n  bottom: "conv2_1"\n  top: "conv2_2"\n}\n',
    'layer {\n  name: "pool5/7x7_s1"\n  type: "Pooling"\n  bottom: "conv5_3"\n'
    '  top: "pool5/7x7_s1"\n  pooling_param {\n    pool: AVE\n    kernel_size: 7\n'
    '    stride: 1\n  }\n}\nlayer {\n  name: "classifier"\n  type: "InnerProduct"\n'
    '  bottom: "pool5/7x7_s1"\n  top: "classifier"\n  inner_product_param {\n'
    '    num_output: 1000\n  }\n}\nlayer {\n  name: "prob"\n  type: "Softmax"\n'
    '  bottom: "classifier"\n  top: "prob"\n}\n',
)


def test_se_resnet50_text_is_the_stored_copy():
    """The generator's text has the stored copy's length (``total_chars``), the stored text
    on both sides of every 16,000-character boundary, its head and tail, and the stored
    blocks in between."""
    text = se_resnet50_deploy()
    assert len(text) == SE_RESNET50_CHARS == 49272
    for offset, (before, after) in SE_BOUNDARIES.items():
        assert text[offset - len(before):offset] == before, offset
        assert text[offset:offset + len(after)] == after, offset
    assert text.startswith(SE_PIECES[0]) and text.endswith(SE_PIECES[-1])
    for piece in SE_PIECES[1:-1]:
        assert text.count(piece) == 1, piece[:40]


def test_se_resnet50_axpy_is_refused_naming_file_line_layer_and_type(tmp_path):
    """Every field of the file is BVLC's, so Caffe parses it (as minicaffe does: all 309
    layers, 16 of them ``Axpy``) and sets layers up in order until the first Axpy, conv2_1,
    where its layer factory stops: "Unknown layer type: Axpy (known types: ...)".  minicaffe
    stops there too, naming the file, the line its block opens on (242), the layer, the type
    and the types it knows."""
    path = tmp_path / "SE-ResNet-50.prototxt"
    path.write_text(se_resnet50_deploy())
    param = read_net_param(str(path))
    types = [l.type for l in param.layer]
    assert len(types) == 309 and types.count("Axpy") == 16
    assert param.layer[0].input_param.shape[0].dim == [1, 3, 224, 224]
    assert se_resnet50_deploy().splitlines()[241:243] == ['layer {', '  name: "conv2_1"']
    with pytest.raises(UnknownLayerTypeError) as e:
        caffe.Net(str(path), caffe.TEST)
    msg = str(e.value)
    assert msg.startswith(f"{path}:242: layer 'conv2_1': unknown layer type 'Axpy' (known "
                          "types: ")
    assert "Eltwise" in msg and "Scale" in msg
    assert (e.value.layer_name, e.value.layer_type) == ("conv2_1", "Axpy")


def axpy_in_bvlc_layers(param, flatten=True):
    """``param`` with each Axpy (top = a * x + y; a (N, C, 1, 1), x and y (N, C, H, W): the
    SENet fork's axpy_layer.cpp) spelled in BVLC layers: ``<name>/flat`` (Flatten: a as
    (N, C)), ``<name>/se`` (Scale of x by that second bottom with ``axis: 0``: its shape
    (N, C) matches x's first two axes, and each value scales H*W of x) and ``<name>`` (Eltwise
    SUM with y).  ``flatten=False`` leaves a as (N, C, 1, 1)."""
    new = caffe_pb2.NetParameter()
    new.CopyFrom(param)
    del new.layer[:]
    for lp in param.layer:
        if lp.type != "Axpy":
            new.layer.add().CopyFrom(lp)
            continue
        a, x, y = lp.bottom
        if flatten:
            new.layer.add(name=f"{lp.name}/flat", type="Flatten", bottom=[a],
                          top=[f"{lp.name}/flat"])
            a = f"{lp.name}/flat"
        se = new.layer.add(name=f"{lp.name}/se", type="Scale", bottom=[x, a],
                           top=[f"{lp.name}/se"])
        se.scale_param.axis = 0
        new.layer.add(name=lp.name, type="Eltwise", bottom=[f"{lp.name}/se", y], top=[lp.name])
    return new


def se_resnet50_params():
    """SE-ResNet-50's learned parameters by hand: ResNet-50's 25,557,032 (He et al. 2016,
    table 1, every convolution without bias and with BatchNorm's gamma and beta, here
    Scale's two blobs; torchvision's ``resnet50`` publishes the same count) plus each
    block's SE branch (Hu et al. 2018, fig. 3, r = 16): C x C/16 + C/16 down, C/16 x C + C
    up, both with biases."""
    def c(cin, cout, k=1):
        return cin * cout * k * k + 2 * cout

    total = c(3, 64, 7)
    cin = 64
    for mid, n in ((64, 3), (128, 4), (256, 6), (512, 3)):
        for i in range(n):
            total += c(cin, mid) + c(mid, mid, 3) + c(mid, 4 * mid)
            total += c(cin, 4 * mid) if i == 0 else 0
            cin = 4 * mid
    resnet50 = total + 2048 * 1000 + 1000
    assert resnet50 == 25_557_032
    se = sum(n * (2 * ch * (ch // 16) + ch // 16 + ch)
             for ch, n in ((256, 3), (512, 4), (1024, 6), (2048, 3)))
    return resnet50 + se


def se_accepts(h):
    """Whether Caffe reshapes the built SE-ResNet-50 to an h x h input, by its rules along
    one axis: conv1 7x7/2 pad 3 floors, (h - 1) // 2 + 1; pool1 MAX 3/2 without pad takes
    Caffe's ceil, ceil((i - 3) / 2) + 1; the 1x1/2 reduce and projection of stages 3, 4 and
    5 give (i - 1) // 2 + 1; pool5 AVE 7/1 gives i - 6 windows, and the classifier's weights
    take 2048 inputs, so pool5 must give exactly 1 (at 0 or less Caffe stops at pool5's
    negative shape or at the classifier's "Input size incompatible", as it does above 1)."""
    i = math.ceil(((h - 1) // 2 + 1 - 3) / 2) + 1
    for _ in range(3):
        i = (i - 1) // 2 + 1
    return i - 6 == 1


def test_se_resnet50_in_bvlc_layers(tmp_path):
    """The file with each Axpy spelled in BVLC layers (``axpy_in_bvlc_layers``) builds.

    Shapes at 224: conv1 (224 + 6 - 7) // 2 + 1 = 112; pool1 ceil(109 / 2) + 1 = 56 (floor:
    55); conv2_x (1, 256, 56, 56); conv3_x 28 (512); conv4_x 14 (1024); conv5_x 7 (2048);
    an SE branch: global pool (1, C, 1, 1), down (1, C/16, 1, 1), up (1, C, 1, 1), flat
    (1, C); pool5 (1, 2048, 1, 1); prob (1, 1000).  Parameters: 28,088,024
    (``se_resnet50_params``).  Without the Flatten, Scale's second bottom (1, 256, 1, 1)
    must match x's axes 0..3 and x's H is 56, so Caffe's ScaleLayer refuses ("dimension
    mismatch between bottom[0]->shape(2) and scale->shape(2)"), as minicaffe does.

    Inputs Caffe takes: 195 to 226 (``se_accepts``); the forward runs at 195, the smallest,
    where pool1's ceil gives 49 windows (floor: 48, and conv5 would be 6): conv1 98, conv3
    25, conv4 13, conv5 7."""
    src = tmp_path / "SE-ResNet-50.prototxt"
    src.write_text(se_resnet50_deploy())
    param = read_net_param(str(src))

    bad = tmp_path / "unflattened.prototxt"
    write_text(axpy_in_bvlc_layers(param, flatten=False), str(bad))
    with pytest.raises(ValueError) as e:
        caffe.Net(str(bad), caffe.TEST)
    msg = str(e.value)
    assert "layer 'conv2_1/se'" in msg and "conv2_1_1x1_up (1, 256, 1, 1)" in msg
    assert "shape[2] = 56" in msg and "scale.shape[2] = 1" in msg

    path = tmp_path / "se_bvlc.prototxt"
    write_text(axpy_in_bvlc_layers(param), str(path))
    net = caffe.Net(str(path), caffe.TEST)
    blobs, params = check_shapes(net, str(path), caffe.TEST)
    assert blobs["conv1/7x7_s2"] == (1, 64, 112, 112)
    assert blobs["pool1/3x3_s2"] == (1, 64, 56, 56)
    assert blobs["conv2_3"] == (1, 256, 56, 56) and blobs["conv3_1"] == (1, 512, 28, 28)
    assert blobs["conv4_6"] == (1, 1024, 14, 14) and blobs["conv5_3"] == (1, 2048, 7, 7)
    assert blobs["conv4_2_global_pool"] == (1, 1024, 1, 1)
    assert blobs["conv4_2_1x1_down"] == (1, 64, 1, 1)
    assert blobs["conv4_2/flat"] == (1, 1024) and blobs["conv4_2/se"] == (1, 1024, 14, 14)
    assert blobs["pool5/7x7_s1"] == (1, 2048, 1, 1) and blobs["prob"] == (1, 1000)
    assert params["conv5_1_1x1_down"] == [(128, 2048, 1, 1), (128,)]
    assert params["conv5_1_1x1_proj"] == [(2048, 1024, 1, 1)]
    learned = sum(int(np.prod(s)) for n, ps in params.items() for s in ps
                  if net.layer_dict[n].type != "BatchNorm")
    assert learned == se_resnet50_params() == 28_088_024

    accepted = [h for h in range(1, 300) if se_accepts(h)]
    assert accepted == list(range(195, 227))
    for h, where in ((194, "layer 'pool5/7x7_s1'"), (227, "layer 'classifier'")):
        net.blobs["data"].reshape(1, 3, h, h)
        with pytest.raises(ValueError, match=where):
            net.reshape()

    randomize(net, seed=21)
    net.blobs["data"].reshape(1, 3, 195, 195)
    net.reshape()
    small, _ = check_shapes(net, str(path), caffe.TEST,
                            input_shapes={"data": (1, 3, 195, 195)})
    assert small["pool1/3x3_s2"] == (1, 64, 49, 49) and small["conv3_1"] == (1, 512, 25, 25)
    assert small["conv5_3"] == (1, 2048, 7, 7) and small["pool5/7x7_s1"] == (1, 2048, 1, 1)
    x = np.random.default_rng(22).standard_normal((1, 3, 195, 195)).astype(np.float32)
    prob = net.forward(data=x)["prob"]
    b, p = net.blobs, net.params

    # pool1: 49 windows, the last starting at 96 and clipped to rows 96 and 97
    np.testing.assert_array_equal(b["pool1/3x3_s2"].data[0],
                                  max_pool(b["conv1/7x7_s2"].data[0], 3, 2, 0, 49))
    # the first block's SE branch: mean over H and W, down + ReLU, up + Sigmoid in place
    for blk, shortcut in (("conv2_1", "conv2_1_1x1_proj"), ("conv4_3", "conv4_2")):
        inc = b[f"{blk}_1x1_increase"].data[0].astype(np.float64)        # (C, H, W)
        (wd, bd), (wu, bu) = ([q.data.astype(np.float64)[..., 0, 0] if q.data.ndim == 4
                               else q.data.astype(np.float64) for q in p[f"{blk}_1x1_{s}"]]
                              for s in ("down", "up"))
        s = sigmoid(wu @ np.maximum(wd @ inc.mean(axis=(1, 2)) + bd, 0) + bu)
        np.testing.assert_allclose(b[f"{blk}_1x1_up"].data[0, :, 0, 0], s, rtol=1e-4,
                                   atol=1e-6)
        # the block's output: ReLU(s * increase + shortcut), the ReLU in place
        y = b[shortcut].data[0].astype(np.float64)
        np.testing.assert_allclose(b[blk].data[0],
                                   np.maximum(s[:, None, None] * inc + y, 0),
                                   rtol=1e-4, atol=1e-5)
    # pool5 over the whole 7x7 map, the classifier, Softmax
    pooled = b["conv5_3"].data[0].astype(np.float64).mean(axis=(1, 2))
    np.testing.assert_allclose(b["pool5/7x7_s1"].data[0, :, 0, 0], pooled, rtol=1e-5,
                               atol=1e-6)
    w, bias = (q.data.astype(np.float64) for q in p["classifier"])
    logits = w @ pooled + bias
    e = np.exp(logits - logits.max())
    np.testing.assert_allclose(prob[0], e / e.sum(), rtol=1e-4, atol=1e-8)


# ---------------------------------------------------------------- ZF Faster R-CNN (py-faster-rcnn)
ZF = zoo("faster_rcnn", "zf_faster_rcnn_end2end_test.prototxt")
ROI_POOLING_PARAM = ("  roi_pooling_param {\n    pooled_w: 6\n    pooled_h: 6\n"
                     "    spatial_scale: 0.0625 # 1/16\n  }\n")
SCALE_TRAIN = "    scale_train: false\n"

PROPOSAL_PY = '''
"""A stand-in for py-faster-rcnn's rpn/proposal_layer.py: the same class, param_str and
tops; one roi, the feat_stride cell of the anchor with the highest foreground score."""
import numpy as np
import caffe


class ProposalLayer(caffe.Layer):
    def setup(self, bottom, top):
        self.feat_stride = eval("{" + self.param_str + "}")["feat_stride"]   # a YAML map
        self.num_anchors = bottom[0].data.shape[1] // 2
        top[0].reshape(1, 5)

    def reshape(self, bottom, top):
        pass

    def forward(self, bottom, top):
        fg = bottom[0].data[0, self.num_anchors:]          # py-faster-rcnn's scores
        _, y, x = np.unravel_index(np.argmax(fg), fg.shape)
        s = self.feat_stride
        h, w = bottom[2].data[0, :2]
        top[0].data[0] = (0, x * s, y * s, min(x * s + s - 1, w - 1), min(y * s + s - 1, h - 1))

    def backward(self, top, propagate_down, bottom):
        pass
'''


def blank(text, piece):
    """``text`` with ``piece`` (whole lines, found once or more) replaced by as many empty
    lines, so that the other lines keep the stored file's numbers."""
    assert piece in text and piece.endswith("\n")
    return text.replace(piece, "\n" * piece.count("\n"))


def install_rpn(where, monkeypatch):
    """py-faster-rcnn's ``rpn.proposal_layer`` (a stand-in) on sys.path."""
    (where / "rpn").mkdir()
    (where / "rpn" / "__init__.py").write_text("")
    (where / "rpn" / "proposal_layer.py").write_text(PROPOSAL_PY)
    monkeypatch.syspath_prepend(str(where))
    for name in ("rpn", "rpn.proposal_layer"):
        monkeypatch.delitem(sys.modules, name, raising=False)


@pytest.fixture
def rpn_module(tmp_path, monkeypatch):
    install_rpn(tmp_path, monkeypatch)
    yield tmp_path
    for name in ("rpn", "rpn.proposal_layer"):
        sys.modules.pop(name, None)


def test_zf_faster_rcnn_file_is_the_stored_copy():
    """The stored copy's length (``total_chars``) and its quirks: tabs, single-quoted
    strings, a comment after a value, three fields on one line."""
    with open(ZF, newline="") as f:
        text = f.read()
    assert len(text) == 5992
    assert "\tlrn_param {\n\t\tlocal_size: 3\n" in text
    assert "  name: 'proposal'\n  type: 'Python'\n" in text
    assert "    num_output: 18   # 2(bg/fg) * 9(anchors)\n" in text
    assert text.count(ROI_POOLING_PARAM) == 1 and text.count(SCALE_TRAIN) == 2


def test_zf_faster_rcnn_fork_layers_are_refused_where_caffe_stops(tmp_path, monkeypatch):
    """BVLC Caffe reads the file with protobuf's text parser, which stops at the first field
    caffe.proto lacks: ``roi_pooling_param`` (line 290, column 3) of layer roi_pool_conv5
    (line 284), a ROIPooling.  Without it, the next is drop6's ``scale_train`` (line 318;
    the block opens at line 311), a field of py-faster-rcnn's Caffe fork.  Without both, the
    file parses and Caffe sets layers up in order: the Python layer imports
    ``rpn.proposal_layer`` (not on the path: Caffe's python layer raises ImportError), and
    with the module on the path the layer factory stops at ROIPooling, an unknown type."""
    with open(ZF, newline="") as f:
        text = f.read()
    with pytest.raises(PrototxtError) as e:
        caffe.Net(ZF, caffe.TEST)
    msg = str(e.value)
    assert msg.startswith(f"{ZF}:290:3: ") and '"roi_pooling_param"' in msg
    assert "layer 'roi_pool_conv5' (line 284)" in msg and '"ROIPooling"' in msg

    path = tmp_path / "test.prototxt"
    path.write_text(blank(text, ROI_POOLING_PARAM))
    with pytest.raises(PrototxtError) as e:
        caffe.Net(str(path), caffe.TEST)
    msg = str(e.value)
    assert msg.startswith(f"{path}:318:5: ") and '"scale_train"' in msg
    assert "layer 'drop6' (line 311)" in msg and '"Dropout"' in msg

    path.write_text(blank(blank(text, ROI_POOLING_PARAM), SCALE_TRAIN))
    for name in ("rpn", "rpn.proposal_layer"):
        monkeypatch.delitem(sys.modules, name, raising=False)
    with pytest.raises(ImportError, match=r":268: layer 'proposal'.*rpn\.proposal_layer"):
        caffe.Net(str(path), caffe.TEST)
    install_rpn(tmp_path, monkeypatch)
    with pytest.raises(UnknownLayerTypeError) as e:
        caffe.Net(str(path), caffe.TEST)
    assert str(e.value).startswith(f"{path}:284: layer 'roi_pool_conv5': unknown layer type "
                                   "'ROIPooling'")


def test_zf_faster_rcnn_up_to_the_proposals(tmp_path, rpn_module):
    """Everything before ROIPooling (the file up to its ``#===== RCNN`` line): ZF's five
    convolutions, LRN WITHIN_CHANNEL (``engine: CAFFE``), the RPN and the Python proposal
    layer; two ``input``s, data (1, 3, 224, 224) and im_info (1, 3).

    Shapes at 224: conv1 7x7/2 pad 3: (224 + 6 - 7) // 2 + 1 = 112; pool1 MAX 3/2 pad 1:
    ceil((112 + 2 - 3) / 2) + 1 = 57 (floor: 56; the last window starts at 112 - 1 = 111,
    inside the input, so Caffe keeps it); conv2 5x5/2 pad 2: (57 + 4 - 5) // 2 + 1 = 29;
    pool2 ceil(28 / 2) + 1 = 15; conv3..conv5 and rpn/output (1, 256, 15, 15);
    rpn_cls_score (1, 18, 15, 15), reshaped (0, 2, -1, 0) to (1, 2, 9 * 15 = 135, 15);
    rpn_cls_prob_reshape (1, 18, 15, 15); rpn_bbox_pred (1, 36, 15, 15); rois (1, 5).

    LRN WITHIN_CHANNEL (Caffe's sub-net: square, AVE 3x3 pad 1 stride 1, power with scale
    alpha and shift 1): x / (1 + alpha / 9 * sum over the zero-padded 3x3 window of x^2)^beta,
    the pooling dividing by 9 everywhere (the window never passes H + pad)."""
    with open(ZF, newline="") as f:
        text = f.read()
    head = text[:text.index("#========= RCNN")]
    path = tmp_path / "rpn_test.prototxt"
    path.write_text(head)
    net = caffe.Net(str(path), caffe.TEST)
    blobs, params = check_shapes(net, str(path), caffe.TEST, given={"proposal": [(1, 5)]})
    assert net.inputs == ["data", "im_info"] and blobs["im_info"] == (1, 3)
    assert blobs["conv1"] == (1, 96, 112, 112) and blobs["pool1"] == (1, 96, 57, 57)
    assert blobs["conv2"] == (1, 256, 29, 29) and blobs["pool2"] == (1, 256, 15, 15)
    assert blobs["conv5"] == blobs["rpn/output"] == (1, 256, 15, 15)
    assert blobs["rpn_cls_score_reshape"] == blobs["rpn_cls_prob"] == (1, 2, 135, 15)
    assert blobs["rpn_cls_prob_reshape"] == (1, 18, 15, 15)
    assert blobs["rpn_bbox_pred"] == (1, 36, 15, 15) and blobs["rois"] == (1, 5)
    assert params["conv2"] == [(256, 96, 5, 5), (256,)]
    lrn = net.layer_dict["norm1"].param.lrn_param
    assert lrn.norm_region == caffe_pb2.LRNParameter.WITHIN_CHANNEL
    assert lrn.engine == caffe_pb2.LRNParameter.CAFFE and lrn.alpha == np.float32(5e-5)
    assert net.layer_dict["proposal"].param.python_param.param_str == "'feat_stride': 16"

    randomize(net, seed=31)
    # larger pixels, so that alpha / 9 * sum(x^2) is not negligible beside 1
    x = 30 * np.random.default_rng(32).standard_normal((1, 3, 224, 224)).astype(np.float32)
    out = net.forward(data=x, im_info=np.array([[224, 224, 1]], np.float32))
    b, p = net.blobs, net.params

    c1 = b["conv1"].data[0].astype(np.float64)              # after ReLU, in place
    sq = np.pad(c1 ** 2, ((0, 0), (1, 1), (1, 1)))
    window = np.lib.stride_tricks.sliding_window_view(sq, (3, 3), axis=(1, 2)).sum((3, 4))
    scale = 1 + 5e-5 / 9 * window
    assert scale.max() > 1.05                               # the normalization shows
    np.testing.assert_allclose(b["norm1"].data[0], c1 * scale ** -0.75, rtol=1e-5, atol=1e-6)
    np.testing.assert_array_equal(b["pool1"].data[0], max_pool(b["norm1"].data[0], 3, 2, 1, 57))
    # conv2 5x5/2 pad 2 on pool1's 57 (its first 32 filters: enough to show the geometry)
    w2, b2 = (q.data[:32] for q in p["conv2"])
    c2 = conv2d(b["pool1"].data[0], w2, stride=2, pad=(2, 2)) + b2[:, None, None]
    np.testing.assert_allclose(b["conv2"].data[0, :32], np.maximum(c2, 0), rtol=1e-4,
                               atol=1e-4)

    # the RPN's softmax pairs channel a (background) with 9 + a (foreground) of each anchor
    score = b["rpn_cls_score"].data[0].astype(np.float64)  # (18, 15, 15)
    bg, fg = score[:9], score[9:]
    prob = b["rpn_cls_prob_reshape"].data[0]
    np.testing.assert_allclose(prob[9:], sigmoid(fg - bg), rtol=1e-5, atol=1e-7)
    np.testing.assert_allclose(prob[:9] + prob[9:], 1, rtol=1e-6)
    # the stand-in proposal: the 16 x 16 cell of the best foreground anchor
    _, yy, xx = np.unravel_index(np.argmax(prob[9:]), (9, 15, 15))
    np.testing.assert_array_equal(out["rois"][0], [0, 16 * xx, 16 * yy, 16 * xx + 15,
                                                   16 * yy + 15])
