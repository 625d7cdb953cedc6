"""An eighth sweep of public prototxt files (tests/data/zoo8/README.md lists them):
soeaver's Inception-v4 and TF-ported Inception-v1 (GoogLeNet with BatchNorm) deploy files,
rebuilt character for character by tests/zoo8_nets.py.

As in tests/test_caffe_zoo7.py: the net is built in the phase its file is for; every blob's
and param's shape is checked against Caffe's rules (``caffe_shapes`` in tests/zoo3_nets.py,
written from Caffe's layer sources) and, for the shapes that tell the rules apart (a
convolution's floor beside a pooling's ceil, concatenated), against numbers worked out by
hand in the docstrings; the parameter counts against ones worked by hand from the papers'
figures (and published by timm and torchvision); one forward per net is checked against
NumPy (Inception-v4 at 75, the smallest input all of whose windows fit).
"""
import math

import numpy as np

import minicaffe as caffe

from test_caffe_zoo3 import check_shapes, randomize
from test_caffe_zoo7 import max_pool
from zoo8_nets import (INCEPTION_V1_TF_CHARS, INCEPTION_V4_CHARS, inception_v1_tf_deploy,
                       inception_v4_deploy)

# The stored copy's text on either side of each 16,000-character boundary of read_file
# (soeaver/caffe-model cls/inception/deploy_inception_v4.prototxt at fdee5138): offset ->
# (the text that ends there, the text that starts there).
V4_BOUNDARIES = {
    16000: ('layer {\n  name: "inception_a2_3x3_scale"\n  type: "Scale"\n  bottom: "in',
            'ception_a2_3x3"\n  top: "inception_a2_3x3"\n  scale_param {\n'),
    32000: ('layer {\n  name: "reduction_a_3x3_2_bn"\n  type: "BatchNorm"\n'
            '  bottom: "reduction_a_3x3_2"\n  top: "reduction_',
            'a_3x3_2"\n  batch_norm_param {\n    use_global_stats: true\n    eps: 0.001\n'),
    48000: ('layer {\n  name: "inception_b2_1x1"\n  type: "Convolution"\n'
            '  bottom: "inception_b2_pool_ave"\n  top: "inception_b2_1x1"\n'
            '  convolution_param {\n    bias_term: false\n    num_output: 128\n    pad: 0\n'
            '    kernel_size: 1\n    stride: 1\n  }\n}\nlayer {\n  na',
            'me: "inception_b2_1x1_bn"\n  type: "BatchNorm"\n'),
    64000: ('layer {\n  name: "inception_b5_1x1_2"\n  type: "Convolution"\n'
            '  bottom: "inception_b4_concat"\n  top: "i',
            'nception_b5_1x1_2"\n  convolution_param {\n    bias_term: false\n'
            '    num_output: 384\n'),
    80000: ('layer {\n  name: "inception_b7_1x7_reduce"\n  type: "Convolution"\n'
            '  bottom: "inception_b6_concat"\n  top: "inception_b7_1x7_reduce"\n'
            '  convolution_p',
            'aram {\n    bias_term: false\n    num_output: 192\n'),
    96000: ('layer {\n  name: "inception_c1_1x3_2_bn"\n  type: "BatchNorm"\n'
            '  bottom: "inception_c1_1x3_2"\n  top: "inception_c1_1x3_2"\n'
            '  batch_norm_param {\n    use_global_stat',
            's: true\n    eps: 0.001\n  }\n}\nlayer {\n  name: "inception_c1_1x3_2_scale"\n'),
    112000: ('layer {\n  name: "inception_c3_1x3_3_scale"\n  type: "Scale"\n'
             '  bottom: "inception_c3_1x3_3"\n  top: "inception_c3_1x3_3"\n'
             '  scale_param {\n    bias_term: true',
             '\n  }\n}\nlayer {\n  name: "inception_c3_1x3_3_relu"\n'),
}
# Pieces of the stored text whose order the shapes cannot show (Concat's bottoms).
V4_PIECES = (
    'input: "data"\ninput_shape {\n  dim: 1\n  dim: 3\n  dim: 299\n  dim: 299\n}\nlayer {\n'
    '  name: "conv1_3x3_s2"\n  type: "Convolution"\n  bottom: "data"\n',
    'layer {\n  name: "inception_stem1"\n  type: "Concat"\n  bottom: "inception_stem1_pool"\n'
    '  bottom: "inception_stem1_3x3_s2"\n  top: "inception_stem1"\n}\n',
    'layer {\n  name: "inception_stem3"\n  type: "Concat"\n  bottom: "inception_stem3_3x3_s2"\n'
    '  bottom: "inception_stem3_pool"\n  top: "inception_stem3"\n}\n',
    'layer {\n  name: "reduction_b_concat"\n  type: "Concat"\n  bottom: "reduction_b_3x3"\n'
    '  bottom: "reduction_b_3x3_2"\n  bottom: "reduction_b_pool"\n  top: "reduction_b_concat"\n}\n',
    'layer {\n  name: "inception_c1_concat"\n  type: "Concat"\n  bottom: "inception_c1_1x1_2"\n'
    '  bottom: "inception_c1_1x3"\n  bottom: "inception_c1_3x1"\n  bottom: "inception_c1_1x3_3"\n'
    '  bottom: "inception_c1_3x1_3"\n  bottom: "inception_c1_1x1"\n'
    '  top: "inception_c1_concat"\n}\n',
    'layer {\n  name: "prob"\n  type: "Softmax"\n  bottom: "classifier"\n  top: "prob"\n}\n\n',
)


def test_inception_v4_text_is_the_stored_copy():
    """The generator's text has the stored copy's length (``total_chars``), the stored text
    on both sides of every 16,000-character boundary, and the stored Concat blocks."""
    text = inception_v4_deploy()
    assert len(text) == INCEPTION_V4_CHARS == 114747
    for offset, (before, after) in V4_BOUNDARIES.items():
        assert text[offset - len(before):offset] == before, offset
        assert text[offset:offset + len(after)] == after, offset
    assert text.startswith(V4_PIECES[0]) and text.endswith(V4_PIECES[-1])
    for piece in V4_PIECES[1:-1]:
        assert text.count(piece) == 1, piece[:40]


def conv2d(x, w, stride=1, pad=(0, 0)):
    """Caffe's convolution of one (C, H, W) image by hand, in float64: zero padding, windows
    every ``stride``, output (H + 2 pad_h - k_h) // stride + 1 (floor) per axis."""
    x = np.pad(x.astype(np.float64), ((0, 0), (pad[0], pad[0]), (pad[1], pad[1])))
    kh, kw = w.shape[2:]
    win = np.lib.stride_tricks.sliding_window_view(x, (kh, kw), axis=(1, 2))
    win = win[:, ::stride, ::stride]                      # (C, H_out, W_out, kh, kw)
    return np.einsum("chwij,ocij->ohw", win, w.astype(np.float64))


def bn_scale_relu(y, net, name, eps):
    """``<name>_bn`` (use_global_stats: the stored sums over the scale factor, eps inside
    the root), ``<name>_scale`` (gamma, beta) and ``<name>_relu``, as Caffe applies them."""
    m, v, sf = (b.data.astype(np.float64) for b in net.params[f"{name}_bn"])
    gamma, beta = (b.data.astype(np.float64)[:, None, None] for b in net.params[f"{name}_scale"])
    y = (y - (m / sf)[:, None, None]) / np.sqrt(v / sf + eps)[:, None, None]
    return np.maximum(y * gamma + beta, 0)


def inception_v4_params():
    """Inception-v4's learned parameters by hand, from Szegedy et al. 2016 (arXiv:1602.07261)
    figs. 3-8: every convolution has no bias and is followed by BatchNorm's gamma and beta
    (Scale's two blobs here, BatchNorm's affine pair in timm's ``inception_v4``, whose
    model card gives 42.7M parameters)."""
    def c(cin, cout, kh, kw=None):
        return cin * cout * kh * (kh if kw is None else kw) + 2 * cout

    stem = (c(3, 32, 3) + c(32, 32, 3) + c(32, 64, 3) + c(64, 96, 3)
            + c(160, 64, 1) + c(64, 96, 3)
            + c(160, 64, 1) + c(64, 64, 1, 7) + c(64, 64, 7, 1) + c(64, 96, 3)
            + c(192, 192, 3))
    block_a = (c(384, 96, 1) + c(384, 64, 1) + c(64, 96, 3) + c(384, 64, 1) + c(64, 96, 3)
               + c(96, 96, 3) + c(384, 96, 1))
    red_a = c(384, 384, 3) + c(384, 192, 1) + c(192, 224, 3) + c(224, 256, 3)
    block_b = (c(1024, 384, 1) + c(1024, 192, 1) + c(192, 224, 1, 7) + c(224, 256, 7, 1)
               + c(1024, 192, 1) + c(192, 192, 7, 1) + c(192, 224, 1, 7) + c(224, 224, 7, 1)
               + c(224, 256, 1, 7) + c(1024, 128, 1))
    red_b = (c(1024, 192, 1) + c(192, 192, 3) + c(1024, 256, 1) + c(256, 256, 1, 7)
             + c(256, 320, 7, 1) + c(320, 320, 3))
    block_c = (c(1536, 256, 1) + c(1536, 384, 1) + c(384, 256, 1, 3) + c(384, 256, 3, 1)
               + c(1536, 384, 1) + c(384, 448, 3, 1) + c(448, 512, 1, 3) + c(512, 256, 1, 3)
               + c(512, 256, 3, 1) + c(1536, 256, 1))
    return stem + 4 * block_a + red_a + 7 * block_b + red_b + 3 * block_c + 1536 * 1000 + 1000


def v4_accepts(h):
    """Whether Caffe sets Inception-v4 up on an h x h input with every unpadded 3x3 window
    inside its input (a smaller map gives empty blobs), by its rules along one axis:
    conv1 3x3/2 floors, conv2 takes 2, conv3 (pad 1) keeps the size; each of stem1, stem3,
    reduction A and B concatenates a 3x3/2 convolution, (i - 3) // 2 + 1, with a MAX 3/2
    pooling, ceil((i - 3) / 2) + 1, so i - 3 must be even; stem2's unpadded 3x3s take 2."""
    size = (h - 3) // 2 + 1 - 2
    for stage in ("stem1", "stem3", "reduction_a", "reduction_b"):
        if size < 3:
            return False
        conv, pool = (size - 3) // 2 + 1, math.ceil((size - 3) / 2) + 1
        if conv != pool:
            return False
        size = conv - 2 if stage == "stem1" else conv
    return True


def test_inception_v4_deploy(tmp_path):
    """soeaver's deploy_inception_v4.prototxt (rebuilt by tests/zoo8_nets.py): ``input_shape``
    (1, 3, 299, 299); 149 convolutions (11 in the stem, 7 per A block, 4 in reduction A, 10
    per B block, 6 in reduction B, 10 per C block), each with BatchNorm (use_global_stats,
    eps 0.001), Scale and ReLU in place; ``kernel_h``/``kernel_w`` with ``pad_h``/``pad_w``
    for the 1x7, 7x1, 1x3 and 3x1 convolutions; 19 Concats (3 in the stem, one per block).

    Shapes at 299: conv1 (299 - 3) // 2 + 1 = 149; conv2 147; conv3 147; stem1: conv
    (147 - 3) // 2 + 1 = 73 and pool ceil(144 / 2) + 1 = 73, 64 + 96 = 160 channels; stem2
    71, 96 + 96 = 192; stem3 35, 192 + 192 = 384; A blocks 4 x 96 = 384; reduction A 17,
    384 + 256 + 384 = 1024; B blocks 384 + 256 + 256 + 128 = 1024; reduction B 8, 192 + 320
    + 1024 = 1536; C blocks 256 + 4 x 256 + 256 = 1536; global pool 1; classifier (1, 1000).
    Parameters: 42,679,816 (``inception_v4_params``, by hand).  The net is set up at 299
    (shapes only); the forward runs at 75, the smallest input whose windows all fit
    (``v4_accepts``)."""
    path = tmp_path / "deploy_inception_v4.prototxt"
    path.write_text(inception_v4_deploy())
    net = caffe.Net(str(path), caffe.TEST)
    blobs, params = check_shapes(net, str(path), caffe.TEST)
    assert blobs["conv1_3x3_s2"] == (1, 32, 149, 149) and blobs["conv3_3x3_s1"] == \
        (1, 64, 147, 147)
    assert blobs["inception_stem1_pool"] == (1, 64, 73, 73)
    assert blobs["inception_stem1"] == (1, 160, 73, 73)
    assert blobs["inception_stem2"] == (1, 192, 71, 71)
    assert blobs["inception_stem3"] == (1, 384, 35, 35)
    assert blobs["inception_a4_concat"] == (1, 384, 35, 35)
    assert blobs["reduction_a_concat"] == (1, 1024, 17, 17)
    assert blobs["inception_b7_concat"] == (1, 1024, 17, 17)
    assert blobs["reduction_b_concat"] == (1, 1536, 8, 8)
    assert blobs["inception_c3_concat"] == (1, 1536, 8, 8)
    assert blobs["pool_8x8_s1"] == (1, 1536, 1, 1) and blobs["prob"] == (1, 1000)
    assert params["inception_stem2_1x7"] == [(64, 64, 1, 7)]
    assert params["inception_b1_7x1_2"] == [(192, 192, 7, 1)]
    assert params["inception_c1_3x1_2"] == [(448, 384, 3, 1)]
    assert params["inception_c1_1x3_2"] == [(512, 448, 1, 3)]
    assert params["inception_c3_1x1_bn"] == [(256,), (256,), (1,)]
    assert params["classifier"] == [(1000, 1536), (1000,)]
    types = [l.type for l in net.layers]
    assert types.count("Convolution") == types.count("BatchNorm") == types.count("Scale") == 149
    assert types.count("Concat") == 3 + 4 + 1 + 7 + 1 + 3 == 19
    learned = sum(int(np.prod(s)) for n, ps in params.items() for s in ps
                  if net.layer_dict[n].type != "BatchNorm")
    assert learned == inception_v4_params() == 42_679_816
    assert net.layer_dict["conv1_3x3_s2_bn"].param.batch_norm_param.eps == np.float32(0.001)

    # which inputs Caffe takes: 75 is the smallest; at 73 and 77 stem1's pool is one
    # larger than its convolution and the Concat refuses, naming both bottoms
    accepted = [h for h in range(1, 300) if v4_accepts(h)]
    assert accepted[0] == 75 and 299 in accepted and 76 in accepted
    for h, (pool, conv) in ((73, (17, 16)), (77, (18, 17))):
        assert not v4_accepts(h)
        net.blobs["data"].reshape(1, 3, h, h)
        try:
            net.reshape()
        except ValueError as e:
            msg = str(e)
        else:
            raise AssertionError(f"{h}: Concat took unequal bottoms")
        assert "'inception_stem1'" in msg
        assert f"'inception_stem1_pool' has shape (1, 64, {pool}, {pool})" in msg
        assert f"'inception_stem1_3x3_s2' has shape (1, 96, {conv}, {conv})" in msg

    # a forward at 75: conv1 37, conv2 35, conv3 35, stem1 17, stem2 15, stem3 7, A 7,
    # reduction A (7 - 3) // 2 + 1 = 3, B 3, reduction B 1, C 1
    randomize(net, seed=11)
    net.blobs["data"].reshape(1, 3, 75, 75)
    net.reshape()
    small, _ = check_shapes(net, str(path), caffe.TEST, input_shapes={"data": (1, 3, 75, 75)})
    assert small["inception_stem1"] == (1, 160, 17, 17)
    assert small["inception_stem3"] == (1, 384, 7, 7)
    assert small["reduction_a_concat"] == (1, 1024, 3, 3)
    assert small["reduction_b_concat"] == (1, 1536, 1, 1)
    x = np.random.default_rng(12).standard_normal((1, 3, 75, 75)).astype(np.float32)
    prob = net.forward(data=x)["prob"]
    b, p = net.blobs, net.params

    # conv1: 3x3/2 without bias, then BatchNorm with the file's eps 0.001 (not the default
    # 1e-5, which gives values that differ here), Scale and ReLU in place
    c1 = conv2d(x[0], p["conv1_3x3_s2"][0].data, stride=2)
    got = b["conv1_3x3_s2"].data[0]
    np.testing.assert_allclose(got, bn_scale_relu(c1, net, "conv1_3x3_s2", 1e-3),
                               rtol=1e-4, atol=1e-5)
    assert not np.allclose(got, bn_scale_relu(c1, net, "conv1_3x3_s2", 1e-5),
                           rtol=1e-4, atol=1e-5)
    # a 7x1 convolution with pad_h 3 on a 3x3 map: kernel_h, pad_h, kernel_w, pad_w apart
    b7 = conv2d(b["inception_b1_1x7"].data[0], p["inception_b1_7x1"][0].data, pad=(3, 0))
    assert b7.shape == (256, 3, 3)
    np.testing.assert_allclose(b["inception_b1_7x1"].data[0],
                               bn_scale_relu(b7, net, "inception_b1_7x1", 1e-3),
                               rtol=1e-4, atol=1e-5)
    # stem1: the pool's 64 channels first, then the 3x3/2 convolution's 96
    stem1 = b["inception_stem1"].data[0]
    np.testing.assert_array_equal(stem1[:64], max_pool(b["conv3_3x3_s1"].data[0], 3, 2, 0, 17))
    np.testing.assert_array_equal(stem1[64:], b["inception_stem1_3x3_s2"].data[0])
    # AVE 3/1 pad 1 divides by 9 everywhere, the padding included (the window is clipped
    # to the padded input only), so a corner is the sum of 4 values over 9
    s3 = np.pad(b["inception_stem3"].data[0].astype(np.float64), ((0, 0), (1, 1), (1, 1)))
    ave = np.lib.stride_tricks.sliding_window_view(s3, (3, 3), axis=(1, 2)).sum((3, 4)) / 9
    np.testing.assert_allclose(b["inception_a1_pool_ave"].data[0], ave, rtol=1e-5, atol=1e-6)
    # reduction B at 3x3: the convolutions' 192 + 320 channels, then the MAX pool of all 9
    rb = b["reduction_b_concat"].data[0, :, 0, 0]
    np.testing.assert_array_equal(rb[:192], b["reduction_b_3x3"].data[0, :, 0, 0])
    np.testing.assert_array_equal(rb[192:512], b["reduction_b_3x3_2"].data[0, :, 0, 0])
    np.testing.assert_array_equal(rb[512:], b["inception_b7_concat"].data[0].max(axis=(1, 2)))
    # global pool of a 1x1 map, Dropout passes it in TEST, classifier, Softmax
    pooled = b["inception_c3_concat"].data[0, :, 0, 0].astype(np.float64)
    np.testing.assert_array_equal(b["pool_8x8_s1_drop"].data[0, :, 0, 0],
                                  b["inception_c3_concat"].data[0, :, 0, 0])
    w, bias = (blob.data.astype(np.float64) for blob in p["classifier"])
    logits = w @ pooled + bias
    e = np.exp(logits - logits.max())
    np.testing.assert_allclose(prob[0], e / e.sum(), rtol=1e-4, atol=1e-8)


# ---------------------------------------------------------------- Inception-v1, TF port
# The stored copy's text (cls/inception/deploy_inception_v1_tf.prototxt at b71c16bc) at its
# read_file boundaries, as above.
V1_BOUNDARIES = {
    16000: ('layer {\n  name: "inception_b1_3x3_a_scale"\n  type: "Scale"\n'
            '  bottom: "inception_b1_3x3_a"\n  top: "inception_b1_3x3_a"\n'
            '  scale_param {\n    bias_term: true\n  }\n}\nlayer {\n  na',
            'me: "inception_b1_3x3_a_relu"\n  type: "ReLU"\n'),
    32000: ('layer {\n  name: "inception_b4_3x3_a_bn"\n  type: "Batch',
            'Norm"\n  bottom: "inception_b4_3x3_a"\n  top: "inception_b4_3x3_a"\n'),
    48000: ('layer {\n  name: "inception_c2_3x3_a_reduce_relu"\n  type: "ReLU"\n  bott',
            'om: "inception_c2_3x3_a_reduce"\n  top: "inception_c2_3x3_a_reduce"\n}\n'),
}
V1_PIECES = (
    'input: "data"\ninput_shape {\n  dim: 1\n  dim: 3\n  dim: 224 \n  dim: 224\n}\nlayer {\n'
    '  name: "conv1_7x7_s2"\n',
    'layer {\n  name: "conv1_7x7_s2_relu"\n  type: "ReLU"\n  bottom: "conv1_7x7_s2"\n'
    '  top: "conv1_7x7_s2"\n}\n\nlayer {\n  name: "pool1_3x3_s2"\n',
    'layer {\n  name: "conv2_3x3relu"\n  type: "ReLU"\n  bottom: "conv2_3x3"\n'
    '  top: "conv2_3x3"\n}\nlayer {\n  name: "pool2_3x3_s2"\n',
    '  top: "inception_a1_output"\n}\nlayer {\n  name: "inception_a2_1x1"\n',
    'layer {\n  name: "inception_a1_output"\n  type: "Concat"\n  bottom: "inception_a1_1x1"\n'
    '  bottom: "inception_a1_3x3_a"\n  bottom: "inception_a1_3x3_b"\n'
    '  bottom: "inception_a1_pool_proj"\n  top: "inception_a1_output"\n}\n',
    '  top: "pool3_3x3_s2"\n  pooling_param {\n    pool: MAX\n    kernel_size: 3\n'
    '    stride: 2\n  }\n}\n\nlayer {\n  name: "inception_b1_1x1"\n',
    '  convolution_param {\n    bias_term: true\n    num_output: 1000\n    pad: 0\n'
    '    kernel_size: 1\n    stride: 1\n    weight_filler {\n      type: "xavier"\n'
    '      std: 0.01\n    }\n  }\n}\n\nlayer {\n  name: "reshape"\n',
    '  reshape_param {\n    shape {\n      dim: 0\n      dim: 0\n    }\n  }\n}\n\nlayer {\n'
    '  name: "prob"\n  type: "Softmax"\n  bottom: "reshape"\n  top: "prob"\n}',
)


def test_inception_v1_tf_text_is_the_stored_copy():
    """As for Inception-v4: length, boundaries, and the pieces that hold the file's quirks
    (the trailing space after 224, ``conv2_3x3relu``, where blank lines stand, no newline
    at the end)."""
    text = inception_v1_tf_deploy()
    assert len(text) == INCEPTION_V1_TF_CHARS == 52708
    for offset, (before, after) in V1_BOUNDARIES.items():
        assert text[offset - len(before):offset] == before, offset
        assert text[offset:offset + len(after)] == after, offset
    assert text.startswith(V1_PIECES[0]) and text.endswith(V1_PIECES[-1])
    for piece in V1_PIECES[1:-1]:
        assert text.count(piece) == 1, piece[:40]


def inception_v1_params():
    """GoogLeNet's learned parameters by hand (Szegedy et al. 2014, table 1, with the 5x5
    branch a 3x3 as in TF-Slim and torchvision's ``googlenet``, whose published count
    without the auxiliary classifiers is 6,624,904): bias-free convolutions with gamma and
    beta each, a 1000-way classifier with a bias on 1024 channels."""
    def c(cin, cout, k):
        return cin * cout * k * k + 2 * cout

    total = c(3, 64, 7) + c(64, 64, 1) + c(64, 192, 3)
    cin = 192
    for n1, r3a, n3a, r3b, n3b, proj in ((64, 96, 128, 16, 32, 32), (128, 128, 192, 32, 96, 64),
                                         (192, 96, 208, 16, 48, 64), (160, 112, 224, 24, 64, 64),
                                         (128, 128, 256, 24, 64, 64), (112, 144, 288, 32, 64, 64),
                                         (256, 160, 320, 32, 128, 128),
                                         (256, 160, 320, 32, 128, 128),
                                         (384, 192, 384, 48, 128, 128)):
        total += (c(cin, n1, 1) + c(cin, r3a, 1) + c(r3a, n3a, 3) + c(cin, r3b, 1)
                  + c(r3b, n3b, 3) + c(cin, proj, 1))
        cin = n1 + n3a + n3b + proj
    assert cin == 1024
    return total + 1024 * 1000 + 1000


def test_inception_v1_tf_deploy(tmp_path):
    """soeaver's deploy_inception_v1_tf.prototxt (rebuilt by tests/zoo8_nets.py): an
    ``input_shape`` (1, 3, 224, 224), 57 bias-free convolutions with BatchNorm (eps 0.001),
    Scale and ReLU in place, nine Inception blocks whose pool branch is MAX 3/1 pad 1, MAX
    3/2 pools without pad between stages, a 1x1 convolution as classifier and a Reshape
    (``dim: 0  dim: 0``) to (N, 1000) before Softmax.

    Shapes at 224: conv1 (224 + 6 - 7) // 2 + 1 = 112; pool1 ceil(109 / 2) + 1 = 56 (floor:
    55); conv2 56; pool2 ceil(53 / 2) + 1 = 28 (floor 27); inception_a1 64 + 128 + 32 + 32 =
    256, a2 480; pool3 ceil(25 / 2) + 1 = 14 (floor 13); b1..b3 512, b4 528, b5 832; pool4
    ceil(11 / 2) + 1 = 7 (floor 6); c1 832, c2 1024; pool_7x7_s1 (1, 1024, 1, 1);
    classifier (1, 1000, 1, 1); reshape and prob (1, 1000).  Parameters: 6,624,904
    (``inception_v1_params``)."""
    path = tmp_path / "deploy_inception_v1_tf.prototxt"
    path.write_text(inception_v1_tf_deploy())
    net = caffe.Net(str(path), caffe.TEST)
    blobs, params = check_shapes(net, str(path), caffe.TEST)
    assert blobs["conv1_7x7_s2"] == (1, 64, 112, 112) and blobs["pool1_3x3_s2"] == \
        (1, 64, 56, 56)
    assert blobs["pool2_3x3_s2"] == (1, 192, 28, 28)
    assert blobs["inception_a1_output"] == (1, 256, 28, 28)
    assert blobs["inception_a2_output"] == (1, 480, 28, 28)
    assert blobs["pool3_3x3_s2"] == (1, 480, 14, 14)
    assert blobs["inception_b4_output"] == (1, 528, 14, 14)
    assert blobs["inception_b5_output"] == (1, 832, 14, 14)
    assert blobs["pool4_3x3_s2"] == (1, 832, 7, 7)
    assert blobs["inception_c2_output"] == (1, 1024, 7, 7)
    assert blobs["classifier"] == (1, 1000, 1, 1)
    assert blobs["reshape"] == blobs["prob"] == (1, 1000)
    assert params["inception_b1_3x3_b"] == [(48, 16, 3, 3)]
    assert params["classifier"] == [(1000, 1024, 1, 1), (1000,)]
    types = [l.type for l in net.layers]
    assert types.count("Convolution") == 58 and types.count("BatchNorm") == 57
    learned = sum(int(np.prod(s)) for n, ps in params.items() for s in ps
                  if net.layer_dict[n].type != "BatchNorm")
    assert learned == inception_v1_params() == 6_624_904

    randomize(net, seed=13)
    x = np.random.default_rng(14).standard_normal((1, 3, 224, 224)).astype(np.float32)
    prob = net.forward(data=x)["prob"]
    b, p = net.blobs, net.params
    c1 = conv2d(x[0], p["conv1_7x7_s2"][0].data, stride=2, pad=(3, 3))
    np.testing.assert_allclose(b["conv1_7x7_s2"].data[0],
                               bn_scale_relu(c1, net, "conv1_7x7_s2", 1e-3), rtol=1e-4,
                               atol=1e-5)
    # pool1's 56th window (ceil's; floor stops at 55) starts at 110, clipped to 110..111
    np.testing.assert_array_equal(b["pool1_3x3_s2"].data[0],
                                  max_pool(b["conv1_7x7_s2"].data[0], 3, 2, 0, 56))
    # a block's pool branch: MAX 3/1 pad 1 (the padding never wins), and the Concat order
    np.testing.assert_array_equal(b["inception_a1_pool"].data[0],
                                  max_pool(b["pool2_3x3_s2"].data[0], 3, 1, 1, 28))
    out = b["inception_a1_output"].data[0]
    for name, lo, hi in (("1x1", 0, 64), ("3x3_a", 64, 192), ("3x3_b", 192, 224),
                         ("pool_proj", 224, 256)):
        np.testing.assert_array_equal(out[lo:hi], b[f"inception_a1_{name}"].data[0])
    pooled = b["inception_c2_output"].data[0].astype(np.float64).mean(axis=(1, 2))
    w, bias = (blob.data.astype(np.float64) for blob in p["classifier"])
    logits = w[:, :, 0, 0] @ pooled + bias
    np.testing.assert_allclose(b["reshape"].data[0], logits, rtol=1e-4, atol=1e-5)
    e = np.exp(logits - logits.max())
    np.testing.assert_allclose(prob[0], e / e.sum(), rtol=1e-4, atol=1e-8)
