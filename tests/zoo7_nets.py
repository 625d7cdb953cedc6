"""Helpers of tests/test_caffe_zoo7.py: the text of public prototxt files whose licence does
not allow a copy under tests/data/zoo7/ (as tests/zoo3_nets.py does for the third sweep).

Each generator returns the file character for character as it is stored in the public
repository named in its docstring; its length is the stored file's (``total_chars``), which
the test asserts, so a slip in the generator shows.
"""


def densenet121_deploy():
    """shicai/DenseNet-Caffe DenseNet_121.prototxt (commit ba9e0fc3, 76,475 characters; the
    repository states no licence): Huang et al.'s DenseNet-121 (k = 32) converted from Torch.
    Legacy ``input_dim``; every BatchNorm (``eps: 1e-5``, no use_global_stats) writes a new
    blob ``<name>/bn`` that its Scale and ReLU then update in place; dense layers are
    BN-ReLU-1x1 conv (128) - BN-ReLU-3x3 conv (32), each concatenated to its input; blocks of
    6, 12, 24 and 16 layers; transitions halve the channels (1x1 conv) and pool AVE 2/2;
    pool1 is MAX 3/2 pad 1 with ``round_mode: FLOOR``; the classifier fc6 is a 1x1
    convolution with a bias on the global average pool."""
    def conv(name, bottom, n, k, pad=0, stride=None, bias=False):
        lines = [f"    num_output: {n}"]
        if not bias:
            lines.append("    bias_term: false")
        if pad:
            lines.append(f"    pad: {pad}")
        lines.append(f"    kernel_size: {k}")
        if stride:
            lines.append(f"    stride: {stride}")
        return (f'layer {{\n  name: "{name}"\n  type: "Convolution"\n  bottom: "{bottom}"\n'
                f'  top: "{name}"\n  convolution_param {{\n' + "\n".join(lines) + "\n  }\n}\n")

    def bn_scale_relu(prefix, bottom, relu):
        top = f"{prefix}/bn"
        return (f'layer {{\n  name: "{top}"\n  type: "BatchNorm"\n  bottom: "{bottom}"\n'
                f'  top: "{top}"\n  batch_norm_param {{\n    eps: 1e-5\n  }}\n}}\n'
                f'layer {{\n  name: "{prefix}/scale"\n  type: "Scale"\n  bottom: "{top}"\n'
                f'  top: "{top}"\n  scale_param {{\n    bias_term: true\n  }}\n}}\n'
                f'layer {{\n  name: "{relu}"\n  type: "ReLU"\n  bottom: "{top}"\n'
                f'  top: "{top}"\n}}\n')

    def pool(name, bottom, body):
        return (f'layer {{\n  name: "{name}"\n  type: "Pooling"\n  bottom: "{bottom}"\n'
                f'  top: "{name}"\n  pooling_param {{\n{body}  }}\n}}\n')

    s = ('name: "DENSENET_121"\ninput: "data"\ninput_dim: 1\ninput_dim: 3\ninput_dim: 224\n'
         'input_dim: 224\n')
    s += conv("conv1", "data", 64, 7, pad=3, stride=2)
    s += bn_scale_relu("conv1", "conv1", "relu1")
    s += pool("pool1", "conv1/bn", "    pool: MAX\n    kernel_size: 3\n    stride: 2\n"
              "    pad: 1\n    round_mode: FLOOR\n")
    bottom, channels = "pool1", 64
    for b, n in zip((2, 3, 4, 5), (6, 12, 24, 16)):
        for i in range(1, n + 1):
            x = f"conv{b}_{i}"
            s += bn_scale_relu(f"{x}/x1", bottom, f"relu{b}_{i}/x1")
            s += conv(f"{x}/x1", f"{x}/x1/bn", 128, 1)
            s += bn_scale_relu(f"{x}/x2", f"{x}/x1", f"relu{b}_{i}/x2")
            s += conv(f"{x}/x2", f"{x}/x2/bn", 32, 3, pad=1)
            top = f"concat_{b}_{i}"
            s += (f'layer {{\n  name: "{top}"\n  type: "Concat"\n  bottom: "{bottom}"\n'
                  f'  bottom: "{x}/x2"\n  top: "{top}"\n}}\n')
            bottom, channels = top, channels + 32
        s += bn_scale_relu(f"conv{b}_blk", bottom, f"relu{b}_blk")
        if b < 5:                                   # transition: 1x1 conv to half, AVE 2/2
            channels //= 2
            s += conv(f"conv{b}_blk", f"conv{b}_blk/bn", channels, 1)
            s += pool(f"pool{b}", f"conv{b}_blk", "    pool: AVE\n    kernel_size: 2\n"
                      "    stride: 2\n")
            bottom = f"pool{b}"
    s += pool("pool5", "conv5_blk/bn", "    pool: AVE\n    global_pooling: true\n")
    return s + conv("fc6", "pool5", 1000, 1, bias=True)


DENSENET121_CHARS = 76475
