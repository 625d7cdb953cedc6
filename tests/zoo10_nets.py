"""Helpers of tests/test_caffe_zoo10.py: the text of a public prototxt file whose repository
states no licence, rebuilt here rather than kept under tests/data/zoo10/ (as
tests/zoo7_nets.py and tests/zoo9_nets.py do).

``segnet_basic_inference()`` returns alexgkendall/SegNet-Tutorial
``Models/segnet_basic_inference.prototxt`` (63b77a90) character for character: its length
is the stored copy's (``SEGNET_BASIC_CHARS``, ``total_chars``), which the test asserts, and
the test compares its pieces with the stored text.  The file is for the SegNet authors'
Caffe fork (caffe-segnet): ``DenseImageData``, ``BN`` and ``Upsample`` layers with their
own parameter messages.
"""

SEGNET_BASIC_CHARS = 7024


def segnet_basic_inference():
    """SegNet-Basic (Badrinarayanan et al. 2015): four 7x7 encoders (Convolution, BN, ReLU,
    MAX pooling 2/2 with its mask as a second top) and four decoders (Upsample by the
    matching mask, Convolution, BN, no ReLU), a 1x1 classifier to CamVid's 11 classes and a
    Softmax; the data are normalized by an LRN first."""
    def conv(name, bottom, n=64, k=7, pad=3):
        pad_line = f"    pad: {pad}\n" if pad else ""
        return (f'layer {{\n  name: "{name}"\n  type: "Convolution"\n  bottom: "{bottom}"\n'
                f'  top: "{name}"\n  param {{\n    lr_mult: 1\n    decay_mult: 1\n  }}\n'
                '  param {\n    lr_mult: 2\n    decay_mult: 0\n  }\n'
                f'  convolution_param {{\n    num_output: {n}\n    kernel_size: {k}\n{pad_line}'
                '    weight_filler {\n      type: "msra"\n    }\n'
                '    bias_filler {\n      type: "constant"\n    }\n  }\n}\n')

    def bn(blob):
        return (f'layer {{\n  bottom: "{blob}"\n  top: "{blob}"\n  name: "{blob}_bn"\n'
                '  type: "BN"\n  bn_param {\n\tbn_mode: INFERENCE\n'
                '\tscale_filler {\n\t  type: "constant"\n\t  value: 1\n\t}\n'
                '\tshift_filler {\n\t  type: "constant"\n\t  value: 0.001\n\t}\n }\n}\n')

    def relu(i):
        return (f'layer {{\n  name: "relu{i}"\n  type: "ReLU"\n  bottom: "conv{i}"\n'
                f'  top: "conv{i}"\n}}\n')

    def pool(i):
        return (f'layer {{\n  name: "pool{i}"\n  type: "Pooling"\n  bottom: "conv{i}"\n'
                f'  top: "pool{i}"\n  top: "pool{i}_mask"\n  pooling_param {{\n'
                '    pool: MAX\n    kernel_size: 2\n    stride: 2\n  }\n}\n')

    def upsample(i, bottom, extra=""):
        return (f'layer {{\n  name: "upsample{i}"\n  type: "Upsample"\n  bottom: "{bottom}"\n'
                f'  bottom: "pool{i}_mask"\n  top: "upsample{i}"\n  upsample_param {{\n'
                f'    scale: 2\n{extra}  }}\n}}\n')

    text = ('name: "segnet"\nlayer {\n  name: "data"\n  type: "DenseImageData"\n'
            '  top: "data"\n  top: "label"\n  dense_image_data_param {\n'
            '    source: "/SegNet/CamVid/test.txt"\t# Change this to the absolute path to your '
            'data file\n    batch_size: 1\n  }\n}\n'
            'layer {\n  name: "norm"\n  type: "LRN"\n  bottom: "data"\n  top: "norm"\n'
            '  lrn_param {\n    local_size: 5\n    alpha: 0.0001\n    beta: 0.75\n  }\n}\n')
    bottom = "norm"
    for i in range(1, 5):
        text += conv(f"conv{i}", bottom) + bn(f"conv{i}") + relu(i) + pool(i)
        bottom = f"pool{i}"
    for i in range(4, 0, -1):
        text += upsample(i, bottom, "    pad_out_h: true\n" if i == 4 else "")
        text += conv(f"conv_decode{i}", f"upsample{i}") + bn(f"conv_decode{i}")
        bottom = f"conv_decode{i}"
    text += conv("conv_classifier", bottom, n=11, k=1, pad=0)
    text += ('layer {\n  name: "prob"\n  type: "Softmax"\n  bottom: "conv_classifier"\n'
             '  top: "prob"\n}\n')
    return text
