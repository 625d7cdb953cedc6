"""Helpers of tests/test_caffe_zoo8.py: the text of public prototxt files too large to keep
under tests/data/zoo8/ (as tests/zoo3_nets.py and tests/zoo7_nets.py do for earlier sweeps).

Each generator returns the file character for character as it is stored in the public
repository named in its docstring; its length is the stored file's (``total_chars``), which
the test asserts, and tests/test_caffe_zoo8.py compares it with pieces of the stored text at
known offsets, so a slip in the generator shows.
"""


def inception_v4_deploy():
    """soeaver/caffe-model ``cls/inception/deploy_inception_v4.prototxt`` (commit fdee5138,
    114,747 characters; MIT, Copyright (c) 2017 soeaver Yang): Szegedy et al.'s Inception-v4
    (arXiv:1602.07261, figs. 3-9) converted from TensorFlow.  An ``input_shape`` of
    (1, 3, 299, 299); every convolution has no bias and is followed in place by BatchNorm
    (use_global_stats, eps 0.001), Scale (bias_term) and ReLU, named ``<conv>_bn``,
    ``_scale``, ``_relu``; 1x7/7x1 and 1x3/3x1 convolutions are written with
    ``kernel_h``/``kernel_w`` and ``pad_h``/``pad_w``; the stem's and the reductions' MAX
    pools (3/2, no pad) sit beside 3x3/2 convolutions (no pad) whose tops they are
    concatenated with; every block's pool is AVE 3/1 pad 1; four A, seven B and three C
    blocks; global AVE pooling, Dropout 0.2, a 1000-way InnerProduct, Softmax."""
    out = ['input: "data"\ninput_shape {\n  dim: 1\n  dim: 3\n  dim: 299\n  dim: 299\n}\n']

    def layer(name, typ, bottoms, top, body=""):
        s = f'layer {{\n  name: "{name}"\n  type: "{typ}"\n'
        s += "".join(f'  bottom: "{b}"\n' for b in bottoms)
        out.append(s + f'  top: "{top}"\n' + body + "}\n")

    def conv(name, bottom, n, k, pad=0, stride=1):
        """k and pad: an int (kernel_size, pad) or an (h, w) pair (kernel_h/_w, pad_h/_w)."""
        if isinstance(k, tuple):
            geom = (f"    stride: {stride}\n    pad_h: {pad[0]}\n    pad_w: {pad[1]}\n"
                    f"    kernel_h: {k[0]}\n    kernel_w: {k[1]}\n")
        else:
            geom = f"    pad: {pad}\n    kernel_size: {k}\n    stride: {stride}\n"
        layer(name, "Convolution", [bottom], name, "  convolution_param {\n    bias_term: false\n"
              f"    num_output: {n}\n" + geom + "  }\n")
        layer(f"{name}_bn", "BatchNorm", [name], name, "  batch_norm_param {\n"
              "    use_global_stats: true\n    eps: 0.001\n  }\n")
        layer(f"{name}_scale", "Scale", [name], name, "  scale_param {\n    bias_term: true\n"
              "  }\n")
        layer(f"{name}_relu", "ReLU", [name], name)
        return name

    def pool(name, bottom, kind):
        body = ("    pool: MAX\n    kernel_size: 3\n    stride: 2\n" if kind == "MAX" else
                "    pool: AVE\n    kernel_size: 3\n    stride: 1\n    pad: 1\n")
        layer(name, "Pooling", [bottom], name, "  pooling_param {\n" + body + "  }\n")
        return name

    def concat(name, bottoms):
        layer(name, "Concat", bottoms, name)
        return name

    def n7(p, bottom, suffix, n, horizontal):         # 1x7 (horizontal) or 7x1
        k, pad = ((1, 7), (0, 3)) if horizontal else ((7, 1), (3, 0))
        return conv(f"{p}_{'1x7' if horizontal else '7x1'}{suffix}", bottom, n, k, pad)

    def n3(p, bottom, suffix, n, horizontal):         # 1x3 (horizontal) or 3x1
        k, pad = ((1, 3), (0, 1)) if horizontal else ((3, 1), (1, 0))
        return conv(f"{p}_{'1x3' if horizontal else '3x1'}{suffix}", bottom, n, k, pad)

    # stem (fig. 3): 299 -> 149 -> 147 -> 147 -> 73 -> 71 -> 35
    x = conv("conv1_3x3_s2", "data", 32, 3, stride=2)
    x = conv("conv2_3x3_s1", x, 32, 3)
    x = conv("conv3_3x3_s1", x, 64, 3, pad=1)
    a = conv("inception_stem1_3x3_s2", x, 96, 3, stride=2)
    x = concat("inception_stem1", [pool("inception_stem1_pool", x, "MAX"), a])
    p = "inception_stem2"
    a = conv(f"{p}_3x3", conv(f"{p}_3x3_reduce", x, 64, 1), 96, 3)
    b = n7(p, conv(f"{p}_1x7_reduce", x, 64, 1), "", 64, True)
    b = conv(f"{p}_3x3_2", n7(p, b, "", 64, False), 96, 3)
    x = concat(p, [a, b])
    a = conv("inception_stem3_3x3_s2", x, 192, 3, stride=2)
    x = concat("inception_stem3", [a, pool("inception_stem3_pool", x, "MAX")])
    for i in range(1, 5):                             # Inception-A (fig. 4), 384 channels
        p = f"inception_a{i}"
        a = conv(f"{p}_1x1_2", x, 96, 1)
        b = conv(f"{p}_3x3", conv(f"{p}_3x3_reduce", x, 64, 1), 96, 3, pad=1)
        c = conv(f"{p}_3x3_2", conv(f"{p}_3x3_2_reduce", x, 64, 1), 96, 3, pad=1)
        c = conv(f"{p}_3x3_3", c, 96, 3, pad=1)
        d = conv(f"{p}_1x1", pool(f"{p}_pool_ave", x, "AVE"), 96, 1)
        x = concat(f"{p}_concat", [a, b, c, d])
    p = "reduction_a"                                 # Reduction-A (fig. 7): 35 -> 17
    a = conv(f"{p}_3x3", x, 384, 3, stride=2)
    b = conv(f"{p}_3x3_2", conv(f"{p}_3x3_2_reduce", x, 192, 1), 224, 3, pad=1)
    b = conv(f"{p}_3x3_3", b, 256, 3, stride=2)
    x = concat(f"{p}_concat", [a, b, pool(f"{p}_pool", x, "MAX")])
    for i in range(1, 8):                             # Inception-B (fig. 5), 1024 channels
        p = f"inception_b{i}"
        a = conv(f"{p}_1x1_2", x, 384, 1)
        b = n7(p, conv(f"{p}_1x7_reduce", x, 192, 1), "", 224, True)
        b = n7(p, b, "", 256, False)
        c = n7(p, conv(f"{p}_7x1_2_reduce", x, 192, 1), "_2", 192, False)
        c = n7(p, c, "_2", 224, True)
        c = n7(p, c, "_3", 224, False)
        c = n7(p, c, "_3", 256, True)
        d = conv(f"{p}_1x1", pool(f"{p}_pool_ave", x, "AVE"), 128, 1)
        x = concat(f"{p}_concat", [a, b, c, d])
    p = "reduction_b"                                 # Reduction-B (fig. 8): 17 -> 8
    a = conv(f"{p}_3x3", conv(f"{p}_3x3_reduce", x, 192, 1), 192, 3, stride=2)
    b = n7(p, conv(f"{p}_1x7_reduce", x, 256, 1), "", 256, True)
    b = conv(f"{p}_3x3_2", n7(p, b, "", 320, False), 320, 3, stride=2)
    x = concat(f"{p}_concat", [a, b, pool(f"{p}_pool", x, "MAX")])
    for i in range(1, 4):                             # Inception-C (fig. 6), 1536 channels
        p = f"inception_c{i}"
        a = conv(f"{p}_1x1_2", x, 256, 1)
        b = conv(f"{p}_1x1_3", x, 384, 1)
        b1, b2 = n3(p, b, "", 256, True), n3(p, b, "", 256, False)
        c = n3(p, conv(f"{p}_1x1_4", x, 384, 1), "_2", 448, False)
        c = n3(p, c, "_2", 512, True)
        c1, c2 = n3(p, c, "_3", 256, True), n3(p, c, "_3", 256, False)
        d = conv(f"{p}_1x1", pool(f"{p}_pool_ave", x, "AVE"), 256, 1)
        x = concat(f"{p}_concat", [a, b1, b2, c1, c2, d])
    layer("pool_8x8_s1", "Pooling", [x], "pool_8x8_s1",
          "  pooling_param {\n    pool: AVE\n    global_pooling: true\n  }\n")
    layer("pool_8x8_s1_drop", "Dropout", ["pool_8x8_s1"], "pool_8x8_s1_drop",
          "  dropout_param {\n    dropout_ratio: 0.2\n  }\n")
    layer("classifier", "InnerProduct", ["pool_8x8_s1_drop"], "classifier",
          "  param {\n    lr_mult: 1\n    decay_mult: 1\n  }\n"
          "  param {\n    lr_mult: 2\n    decay_mult: 0\n  }\n"
          "  inner_product_param {\n    num_output: 1000\n"
          '    weight_filler {\n      type: "xavier"\n    }\n'
          '    bias_filler {\n      type: "constant"\n      value: 0\n    }\n  }\n')
    layer("prob", "Softmax", ["classifier"], "prob")
    return "".join(out) + "\n"


INCEPTION_V4_CHARS = 114747


def inception_v1_tf_deploy():
    """soeaver/caffe-model ``cls/inception/deploy_inception_v1_tf.prototxt`` (commit
    b71c16bc, 52,708 characters; MIT, as above): GoogLeNet as TensorFlow-Slim's
    inception_v1 has it (converted from TensorFlow), with BatchNorm (use_global_stats, eps
    0.001), Scale and ReLU in place after every bias-free convolution and a 3x3 convolution
    (``_3x3_b``) where Szegedy et al. 2014 have the 5x5.  Its text has quirks kept here: the
    input's third dim is written ``224 `` (a trailing space), conv2_3x3's ReLU is named
    ``conv2_3x3relu``, blank lines stand before each block's pool branch, after every
    block's Concat but the first and around pool1, pool3, pool4, the classifier and the
    Reshape, and the file ends without a newline.  Branch pools are MAX 3/1 pad 1; the
    classifier is a 1x1 convolution with a bias, reshaped to (N, 1000) for Softmax."""
    out = ['input: "data"\ninput_shape {\n  dim: 1\n  dim: 3\n  dim: 224 \n  dim: 224\n}\n']

    def layer(name, typ, bottom, top, body="", blank=False):
        out.append(("\n" if blank else "") + f'layer {{\n  name: "{name}"\n  type: "{typ}"\n'
                   f'  bottom: "{bottom}"\n  top: "{top}"\n' + body + "}\n")

    def conv(name, bottom, n, k, pad=0, stride=1, relu=None, bias=False, blank=False):
        layer(name, "Convolution", bottom, name,
              "  param {\n    lr_mult: 1\n    decay_mult: 1\n  }\n  convolution_param {\n"
              f"    bias_term: {'true' if bias else 'false'}\n    num_output: {n}\n"
              f"    pad: {pad}\n    kernel_size: {k}\n    stride: {stride}\n"
              '    weight_filler {\n      type: "xavier"\n      std: 0.01\n    }\n  }\n',
              blank=blank)
        if bias:                                      # the classifier: no BatchNorm
            return name
        layer(f"{name}_bn", "BatchNorm", name, name, "  batch_norm_param {\n"
              "    use_global_stats: true\n    eps: 0.001\n  }\n")
        layer(f"{name}_scale", "Scale", name, name, "  scale_param {\n    bias_term: true\n"
              "  }\n")
        layer(relu or f"{name}_relu", "ReLU", name, name)
        return name

    def max_pool(name, bottom, stride, pad, blank):
        layer(name, "Pooling", bottom, name, "  pooling_param {\n    pool: MAX\n"
              f"    kernel_size: 3\n    stride: {stride}\n" + (f"    pad: {pad}\n" if pad else "")
              + "  }\n", blank=blank)
        return name

    x = conv("conv1_7x7_s2", "data", 64, 7, pad=3, stride=2)
    x = max_pool("pool1_3x3_s2", x, 2, 0, blank=True)
    x = conv("conv2_3x3_reduce", x, 64, 1)
    x = conv("conv2_3x3", x, 192, 3, pad=1, relu="conv2_3x3relu")
    x = max_pool("pool2_3x3_s2", x, 2, 0, blank=False)
    # (1x1, 3x3_a reduce, 3x3_a, 3x3_b reduce, 3x3_b, pool_proj): Szegedy et al. table 1
    blocks = {"a1": (64, 96, 128, 16, 32, 32), "a2": (128, 128, 192, 32, 96, 64),
              "b1": (192, 96, 208, 16, 48, 64), "b2": (160, 112, 224, 24, 64, 64),
              "b3": (128, 128, 256, 24, 64, 64), "b4": (112, 144, 288, 32, 64, 64),
              "b5": (256, 160, 320, 32, 128, 128), "c1": (256, 160, 320, 32, 128, 128),
              "c2": (384, 192, 384, 48, 128, 128)}
    for name, (n1, r3a, n3a, r3b, n3b, proj) in blocks.items():
        p = f"inception_{name}"
        first = conv(f"{p}_1x1", x, n1, 1, blank=name not in ("a1", "a2"))
        a = conv(f"{p}_3x3_a", conv(f"{p}_3x3_a_reduce", x, r3a, 1), n3a, 3, pad=1)
        b = conv(f"{p}_3x3_b", conv(f"{p}_3x3_b_reduce", x, r3b, 1), n3b, 3, pad=1)
        d = conv(f"{p}_pool_proj", max_pool(f"{p}_pool", x, 1, 1, blank=True), proj, 1)
        out.append(f'layer {{\n  name: "{p}_output"\n  type: "Concat"\n  bottom: "{first}"\n'
                   f'  bottom: "{a}"\n  bottom: "{b}"\n  bottom: "{d}"\n'
                   f'  top: "{p}_output"\n}}\n')
        x = f"{p}_output"
        if name in ("a2", "b5"):
            x = max_pool(f"pool{3 if name == 'a2' else 4}_3x3_s2", x, 2, 0, blank=True)
    layer("pool_7x7_s1", "Pooling", x, "pool_7x7_s1",
          "  pooling_param {\n    pool: AVE\n    global_pooling: true\n  }\n", blank=True)
    layer("pool_7x7_s1_drop", "Dropout", "pool_7x7_s1", "pool_7x7_s1_drop",
          "  dropout_param {\n    dropout_ratio: 0.2\n  }\n")
    conv("classifier", "pool_7x7_s1_drop", 1000, 1, bias=True, blank=True)
    layer("reshape", "Reshape", "classifier", "reshape",
          "  reshape_param {\n    shape {\n      dim: 0\n      dim: 0\n    }\n  }\n", blank=True)
    layer("prob", "Softmax", "reshape", "prob", blank=True)
    return "".join(out)[:-1]                          # no newline at the end


INCEPTION_V1_TF_CHARS = 52708
