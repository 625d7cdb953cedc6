"""Helpers of tests/test_caffe_zoo9.py: the text of a public prototxt file whose repository
states no licence, so that it is not copied under tests/data/zoo9/ (as tests/zoo7_nets.py
does for the seventh sweep).

The generator returns the file character for character as it is stored in the public
repository named in its docstring; its length is the stored file's (``total_chars``), and
tests/test_caffe_zoo9.py compares it with the stored text at the 16,000-character
boundaries of the stored copy, so a slip in the generator shows.
"""


def se_resnet50_deploy():
    """hujie-frank/SENet ``models/SE-ResNet-50.prototxt`` (commit 2c51ece0, 49,272
    characters; the repository states no licence): Hu et al.'s SE-ResNet-50 (CVPR 2018),
    the ILSVRC 2017 winners' own Caffe file.

    A comment line after ``name``; an ``Input`` layer written ``input_param: {`` and
    ``shape: {`` (a colon before a message, which text format allows) with trailing spaces
    after ``layer {`` and three of the dims; a 7x7/2 stem and MAX 3/2 pool1 without pad
    (Caffe's ceil: 56 at 224); bottlenecks with the stride on the first 1x1 (ResNet v1), each
    convolution without bias and followed in place by BatchNorm (use_global_stats) and
    Scale (``<conv>/bn``, ``<conv>/bn/scale``) and, but for the 1x1 increase, a ReLU; the SE
    branch of every block: global AVE pooling (``engine: CAFFE``), a 1x1 convolution down to
    C/16 with a bias and ReLU, a 1x1 convolution back up to C and a Sigmoid in place
    (``<block>_prob``); the block's output is an ``Axpy`` layer (the authors' own type, not
    BVLC's: top = prob * increase + shortcut, prob broadcast over H and W) with a ReLU in
    place; the first block of every stage has a projection shortcut ``<block>_1x1_proj``.
    Stages of 3, 4, 6 and 3 blocks; AVE 7/1 pooling, a 1000-way InnerProduct, Softmax."""
    out = ['name: "SE-ResNet-50"\n# mean_value: 104, 117, 123\nlayer { \n  name: "data"\n'
           '  type: "Input"\n  top: "data"\n  input_param: {\n    shape: {\n      dim: 1 \n'
           '      dim: 3 \n      dim: 224 \n      dim: 224\n    }\n  }\n}\n']

    def layer(name, typ, bottoms, top, body=""):
        s = f'layer {{\n  name: "{name}"\n  type: "{typ}"\n'
        s += "".join(f'  bottom: "{b}"\n' for b in bottoms)
        out.append(s + f'  top: "{top}"\n' + body + "}\n")

    def conv(name, bottom, n, k, stride=1, pad=0, bias=False):
        body = f"  convolution_param {{\n    num_output: {n}\n"
        body += "" if bias else "    bias_term: false\n"
        body += f"    pad: {pad}\n" if pad else ""
        layer(name, "Convolution", [bottom], name,
              body + f"    kernel_size: {k}\n    stride: {stride}\n  }}\n")
        return name

    def bn_scale(name):
        layer(f"{name}/bn", "BatchNorm", [name], name,
              "  batch_norm_param {\n    use_global_stats: true\n  }\n")
        layer(f"{name}/bn/scale", "Scale", [name], name,
              "  scale_param {\n    bias_term: true\n  }\n")

    def relu(name, blob):
        layer(name, "ReLU", [blob], blob)

    x = conv("conv1/7x7_s2", "data", 64, 7, stride=2, pad=3)
    bn_scale(x)
    relu("conv1/relu_7x7_s2", x)
    layer("pool1/3x3_s2", "Pooling", [x], "pool1/3x3_s2",
          "  pooling_param {\n    pool: MAX\n    kernel_size: 3\n    stride: 2\n  }\n")
    x = "pool1/3x3_s2"
    for stage, (mid, n) in enumerate(((64, 3), (128, 4), (256, 6), (512, 3)), start=2):
        for i in range(1, n + 1):
            p, stride = f"conv{stage}_{i}", 2 if i == 1 and stage > 2 else 1
            r = conv(f"{p}_1x1_reduce", x, mid, 1, stride=stride)
            bn_scale(r)
            relu(f"{r}/relu", r)
            m = conv(f"{p}_3x3", r, mid, 3, pad=1)
            bn_scale(m)
            relu(f"{m}/relu", m)
            inc = conv(f"{p}_1x1_increase", m, 4 * mid, 1)
            bn_scale(inc)
            layer(f"{p}_global_pool", "Pooling", [inc], f"{p}_global_pool",
                  "  pooling_param {\n    pool: AVE\n    engine: CAFFE\n"
                  "    global_pooling: true\n  }\n")
            down = conv(f"{p}_1x1_down", f"{p}_global_pool", mid // 4, 1, bias=True)
            relu(f"{down}/relu", down)
            up = conv(f"{p}_1x1_up", down, 4 * mid, 1, bias=True)
            layer(f"{p}_prob", "Sigmoid", [up], up)
            shortcut = x
            if i == 1:
                shortcut = conv(f"{p}_1x1_proj", x, 4 * mid, 1, stride=stride)
                bn_scale(shortcut)
            layer(p, "Axpy", [up, inc, shortcut], p)
            relu(f"{p}/relu", p)
            x = p
    layer("pool5/7x7_s1", "Pooling", [x], "pool5/7x7_s1",
          "  pooling_param {\n    pool: AVE\n    kernel_size: 7\n    stride: 1\n  }\n")
    layer("classifier", "InnerProduct", ["pool5/7x7_s1"], "classifier",
          "  inner_product_param {\n    num_output: 1000\n  }\n")
    layer("prob", "Softmax", ["classifier"], "prob")
    return "".join(out)


SE_RESNET50_CHARS = 49272
