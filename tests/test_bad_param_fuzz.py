"""A seeded fuzz of layer parameters: small nets written as prototxt files, each with one invalid
or edge value in one layer's parameters.  Where Caffe's LayerSetUp/Reshape CHECK-fails (or
divides by zero), minicaffe must raise a ValueError that names the file, the line of the layer's
block and the layer, with no raw Python exception (IndexError, ZeroDivisionError, KeyError,
AttributeError, TypeError) underneath; where Caffe accepts the value, minicaffe must build and run
the net, and match Caffe's result where a closed form checks it.  What Caffe does is cited per
template (BVLC/caffe src/caffe/layers/<name>_layer.cpp)."""
import numpy as np
import pytest

import minicaffe as caffe

SEED = 20250
N_CASES = 120
RAW = (IndexError, ZeroDivisionError, KeyError, AttributeError, TypeError)


def _dims(shape):
    return " ".join(f"dim: {d}" for d in shape)


def _net(inputs, ltype, bottoms, param, tops=("y",)):
    """(text, line of the layer under test): one Input layer a line, then layer 'L'."""
    lines = ['name: "fz"']
    for name, shape in inputs.items():
        lines.append(f'layer {{ name: "in_{name}" type: "Input" top: "{name}" '
                     f'input_param {{ shape {{ {_dims(shape)} }} }} }}')
    b = " ".join(f'bottom: "{x}"' for x in bottoms)
    t = " ".join(f'top: "{x}"' for x in tops)
    lines.append(f'layer {{ name: "L" type: "{ltype}" {b} {t} {param} }}')
    return "\n".join(lines) + "\n", len(lines)


X4 = {"x": (2, 4, 8, 8)}


# ---- templates: rng -> (label, inputs, type, bottoms, param, tops, expect, check)
# expect "err" (Caffe CHECK-fails) or "ok" (Caffe runs); check(x_inputs, net) for "ok" cases.

def conv_bad(rng):
    ltype = str(rng.choice(["Convolution", "Deconvolution", "Im2col"]))
    k = int(rng.integers(2, 4))
    no = "" if ltype == "Im2col" else "num_output: 4 "
    pname = "convolution_param"
    kinds = ["kernel 0", "stride 0", "negative pad", "both kernel_size and kernel_h",
             "3 kernel_size entries", "3 stride entries", "axis out of range", "kernel_h alone 3-d"]
    if ltype != "Im2col":
        kinds += ["num_output 0", "group vs channels", "group vs num_output"]
    if ltype != "Deconvolution":
        kinds += ["kernel > padded input"]
    kind = str(rng.choice(kinds))
    inputs = dict(X4)
    p = {"kernel 0": f"{no}kernel_size: 0",                  # CHECK_GT(kernel, 0)
         "stride 0": f"{no}kernel_size: {k} stride: 0",      # CHECK_GT(stride, 0)
         "negative pad": f"{no}kernel_size: {k} pad: -1",    # pad is uint32: a parse error
         "both kernel_size and kernel_h": f"{no}kernel_size: {k} kernel_h: {k} kernel_w: {k}",
         "3 kernel_size entries": f"{no}kernel_size: {k} kernel_size: {k} kernel_size: {k}",
         "3 stride entries": f"{no}kernel_size: {k} stride: 1 stride: 1 stride: 1",
         "axis out of range": f"{no}kernel_size: {k} axis: {int(rng.choice([4, -5]))}",
         "kernel_h alone 3-d": f"{no}kernel_h: {k} kernel_w: {k}",
         "num_output 0": f"num_output: 0 kernel_size: {k}",    # CHECK_GT(num_output_, 0)
         "group vs channels": f"num_output: 4 kernel_size: {k} group: 3",   # 4 % 3
         "group vs num_output": f"num_output: 3 kernel_size: {k} group: 2",
         # (8 + 2p - 11) / 1 + 1 < 0: Blob::Reshape CHECK_GE(dim, 0)
         "kernel > padded input": f"{no}kernel_size: 11 pad: {int(rng.integers(0, 2))}",
         }[kind]
    if kind == "kernel_h alone 3-d":            # CHECK_EQ(num_spatial_axes_, 2)
        inputs = {"x": (2, 4, 4, 4, 4)}
    return f"{ltype} {kind}", inputs, ltype, ["x"], f"{pname} {{ {p} }}", ("y",), "err", None


def conv_dilation0(rng):
    """Caffe's CAFFE engine has no CHECK on dilation (0 makes every tap read one pixel), but
    its cuDNN engine's cudnnSetConvolution2dDescriptor refuses it (CUDNN_STATUS_BAD_PARAM);
    minicaffe refuses it on every engine, as a cuDNN build of Caffe does.  A known departure
    from the CPU build, kept on purpose: see conv.conv_geometry."""
    k = int(rng.integers(2, 4))
    return (f"Convolution dilation 0 k{k}", dict(X4), "Convolution", ["x"],
            f"convolution_param {{ num_output: 4 kernel_size: {k} dilation: 0 }}",
            ("y",), "err", None)


def conv_trunc(rng):
    """(8 - 9) / 2 + 1 is 1 in C++ (division truncates toward 0): Caffe runs it, one window
    of 9 that overhangs the input by one zero."""
    def check(x, n):
        w = n.params["L"][0].data
        want = np.einsum("ocij,ncij->no", w[:, :, :8, :8], x["x"])
        assert n.blobs["y"].shape == (2, 4, 1, 1)
        np.testing.assert_allclose(n.blobs["y"].data[:, :, 0, 0], want, rtol=1e-4, atol=1e-4)
    return ("Convolution kernel 9 stride 2 on 8", dict(X4), "Convolution", ["x"],
            'convolution_param { num_output: 4 kernel_size: 9 stride: 2 bias_term: false '
            'weight_filler { type: "gaussian" std: 1 } }', ("y",), "ok", check)


def pool_bad(rng):
    pool = str(rng.choice(["MAX", "AVE"]))
    kind = str(rng.choice(["kernel 0", "stride 0", "pad >= kernel", "negative pad",
                           "kernel > input", "kernel_size and kernel_h", "global with kernel"]))
    k = int(rng.integers(2, 4))
    p = {"kernel 0": "kernel_size: 0",                    # CHECK_GT(kernel_h_, 0)
         "stride 0": f"kernel_size: {k} stride: 0",       # Caffe divides by stride_h_: SIGFPE
         "pad >= kernel": f"kernel_size: {k} pad: {k + int(rng.integers(0, 2))}",  # CHECK_LT
         "negative pad": f"kernel_size: {k} pad: -1",     # uint32: a parse error
         "kernel > input": "kernel_size: 11",             # ceil(-3) + 1 < 0: Blob CHECK_GE
         "kernel_size and kernel_h": f"kernel_size: {k} kernel_h: {k} kernel_w: {k}",
         "global with kernel": f"kernel_size: {k} global_pooling: true",
         }[kind]
    return (f"Pooling {pool} {kind}", dict(X4), "Pooling", ["x"],
            f"pooling_param {{ pool: {pool} {p} }}", ("y",), "err", None)


def pool_ok(rng):
    """ceil((8 - 9) / 2) + 1 = 1: one window over the whole input (Caffe runs it)."""
    pool = str(rng.choice(["MAX", "AVE"]))

    def check(x, n):
        assert n.blobs["y"].shape == (2, 4, 1, 1)
        want = (x["x"].max(axis=(2, 3)) if pool == "MAX"
                else x["x"].sum(axis=(2, 3)) / 64.0)    # AVE: the 8x8 the window clips to
        np.testing.assert_allclose(n.blobs["y"].data[:, :, 0, 0], want, rtol=1e-5, atol=1e-5)
    return (f"Pooling {pool} kernel 9 stride 2 on 8", dict(X4), "Pooling", ["x"],
            f"pooling_param {{ pool: {pool} kernel_size: 9 stride: 2 }}", ("y",), "ok", check)


def ip_bad(rng):
    kind = str(rng.choice(["num_output 0", "axis out of range"]))
    p = ("num_output: 0" if kind == "num_output 0"
         else f"num_output: 3 axis: {int(rng.choice([4, 5, -5]))}")
    return (f"InnerProduct {kind}", dict(X4), "InnerProduct", ["x"],
            f"inner_product_param {{ {p} }}", ("y",), "err", None)


def ip_axis_last(rng):
    def check(x, n):
        w, b = n.params["L"][0].data, n.params["L"][1].data
        assert n.blobs["y"].shape == (2, 4, 8, 3)
        np.testing.assert_allclose(n.blobs["y"].data, x["x"] @ w.T + b, rtol=1e-4, atol=1e-4)
    return ("InnerProduct axis -1", dict(X4), "InnerProduct", ["x"],
            'inner_product_param { num_output: 3 axis: -1 weight_filler { type: "gaussian" } '
            'bias_filler { type: "gaussian" } }', ("y",), "ok", check)


def lrn_bad(rng):
    size = int(rng.choice([0, 2, 4, 6]))      # CHECK_EQ(size_ % 2, 1)
    region = str(rng.choice(["ACROSS_CHANNELS", "WITHIN_CHANNEL"]))
    return (f"LRN {region} local_size {size}", dict(X4), "LRN", ["x"],
            f"lrn_param {{ local_size: {size} norm_region: {region} }}", ("y",), "err", None)


def lrn_one(rng):
    def check(x, n):
        want = x["x"] / (1 + 0.5 * x["x"] ** 2) ** 0.75
        np.testing.assert_allclose(n.blobs["y"].data, want, rtol=1e-4, atol=1e-5)
    return ("LRN local_size 1", dict(X4), "LRN", ["x"],
            "lrn_param { local_size: 1 alpha: 0.5 }", ("y",), "ok", check)


def concat_bad(rng):
    kind = str(rng.choice(["axis out of range", "shapes differ"]))
    if kind == "axis out of range":          # CanonicalAxisIndex CHECK
        return ("Concat axis out of range", {"a": (2, 3, 4), "b": (2, 3, 4)}, "Concat",
                ["a", "b"], f"concat_param {{ axis: {int(rng.choice([3, -4, 7]))} }}",
                ("y",), "err", None)
    return ("Concat shapes differ off the axis", {"a": (2, 3, 4), "b": (2, 5, 5)}, "Concat",
            ["a", "b"], "concat_param { axis: 1 }", ("y",), "err", None)


def concat_last(rng):
    def check(x, n):
        np.testing.assert_array_equal(n.blobs["y"].data, np.concatenate([x["a"], x["b"]], -1))
    return ("Concat axis -1", {"a": (2, 3, 4), "b": (2, 3, 2)}, "Concat", ["a", "b"],
            "concat_param { axis: -1 }", ("y",), "ok", check)


def slice_bad(rng):
    kind = str(rng.choice(["axis out of range", "points out of order", "point equal",
                           "point beyond axis", "points vs tops"]))
    p, tops = {"axis out of range": ("axis: 3", ("y", "z")),
               "points out of order": ("axis: 1 slice_point: 4 slice_point: 2", ("y", "z", "w")),
               "point equal": ("axis: 1 slice_point: 2 slice_point: 2", ("y", "z", "w")),
               "point beyond axis": (f"axis: 1 slice_point: {int(rng.integers(7, 10))}",
                                     ("y", "z")),
               "points vs tops": ("axis: 1 slice_point: 2 slice_point: 3", ("y", "z")),
               }[kind]
    return (f"Slice {kind}", {"x": (2, 6, 3)}, "Slice", ["x"], f"slice_param {{ {p} }}",
            tops, "err", None)


def crop_bad(rng):
    kind = str(rng.choice(["offset too big", "too many offsets", "axes differ"]))
    if kind == "offset too big":         # CHECK_GE(bottom0.shape(i) - offset, bottom1.shape(i))
        return ("Crop offset past the input", {"x": (2, 3, 8, 8), "r": (2, 3, 5, 5)}, "Crop",
                ["x", "r"], f"crop_param {{ axis: 2 offset: {int(rng.integers(4, 7))} }}",
                ("y",), "err", None)
    if kind == "too many offsets":      # offset_size is 0, 1 or num_axes - axis
        return ("Crop three offsets from axis 2", {"x": (2, 3, 8, 8), "r": (2, 3, 5, 5)}, "Crop",
                ["x", "r"], "crop_param { axis: 2 offset: 1 offset: 1 offset: 1 }",
                ("y",), "err", None)
    return ("Crop bottoms of different axes", {"x": (2, 3, 8, 8), "r": (2, 3, 5)}, "Crop",
            ["x", "r"], "crop_param { axis: 2 }", ("y",), "err", None)


def crop_edge(rng):
    def check(x, n):
        np.testing.assert_array_equal(n.blobs["y"].data, x["x"][:, :, 3:8, 1:6])
    return ("Crop offsets to the edge", {"x": (2, 3, 8, 8), "r": (2, 3, 5, 5)}, "Crop",
            ["x", "r"], "crop_param { axis: 2 offset: 3 offset: 1 }", ("y",), "ok", check)


def reshape_bad(rng):
    kind = str(rng.choice(["two -1", "0 beyond the input", "count mismatch"]))
    p = {"two -1": "dim: -1 dim: -1",
         "0 beyond the input": "dim: 0 dim: 0 dim: 0 dim: -1",   # input has 2 axes
         "count mismatch": f"dim: {int(rng.choice([5, 7]))} dim: 5"}[kind]
    return (f"Reshape {kind}", {"x": (2, 12)}, "Reshape", ["x"],
            f"reshape_param {{ shape {{ {p} }} }}", ("y",), "err", None)


def flatten_case(rng):
    """Caffe: top = shape[:start] + [count(start, end + 1)] + shape[end + 1:]; count(a, b)
    CHECKs a <= b, so end = start - 1 inserts a 1 and runs, end = start - 2 fails."""
    gap = int(rng.choice([1, 2]))
    if gap == 1:
        def check(x, n):
            assert n.blobs["y"].shape == (2, 4, 1, 8, 8)
            np.testing.assert_array_equal(n.blobs["y"].data.reshape(x["x"].shape), x["x"])
        return ("Flatten end_axis = axis - 1", dict(X4), "Flatten", ["x"],
                "flatten_param { axis: 2 end_axis: 1 }", ("y",), "ok", check)
    return ("Flatten end_axis = axis - 2", dict(X4), "Flatten", ["x"],
            "flatten_param { axis: 2 end_axis: 0 }", ("y",), "err", None)


def eltwise_bad(rng):
    kind = str(rng.choice(["coeff count", "coeff with PROD", "shapes differ"]))
    ins = {"a": (2, 3, 4), "b": (2, 3, 4)}
    p = {"coeff count": "operation: SUM coeff: 1 coeff: 2 coeff: 3",
         "coeff with PROD": "operation: PROD coeff: 1 coeff: 1",
         "shapes differ": f"operation: {str(rng.choice(['SUM', 'PROD', 'MAX']))}"}[kind]
    if kind == "shapes differ":
        ins["b"] = (2, 4, 3)            # same count, other shape
    return (f"Eltwise {kind}", ins, "Eltwise", ["a", "b"], f"eltwise_param {{ {p} }}",
            ("y",), "err", None)


def eltwise_neg(rng):
    def check(x, n):
        np.testing.assert_allclose(n.blobs["y"].data, x["a"] - 0.5 * x["b"], rtol=1e-5)
    return ("Eltwise SUM coeff 1 -0.5", {"a": (2, 3, 4), "b": (2, 3, 4)}, "Eltwise", ["a", "b"],
            "eltwise_param { operation: SUM coeff: 1 coeff: -0.5 }", ("y",), "ok", check)


def scale_bias_bad(rng):
    ltype = str(rng.choice(["Scale", "Bias"]))
    pname = "scale_param" if ltype == "Scale" else "bias_param"
    kind = str(rng.choice(["second bottom shape", "num_axes past the input", "num_axes -2",
                           "axis out of range"]))
    if kind == "second bottom shape":   # CHECK_EQ(bottom[0]->shape(axis_ + i), scale->shape(i))
        return (f"{ltype} {kind}", {"x": (2, 4, 8, 8), "s": (4, 7)}, ltype, ["x", "s"],
                f"{pname} {{ axis: 1 }}", ("y",), "err", None)
    p = {"num_axes past the input": "axis: 2 num_axes: 3",
         "num_axes -2": "axis: 1 num_axes: -2",
         "axis out of range": "axis: 4"}[kind]
    return (f"{ltype} {kind}", dict(X4), ltype, ["x"], f"{pname} {{ {p} }}", ("y",), "err", None)


def embed_bad(rng):
    p = str(rng.choice(["input_dim: 0 num_output: 3", "input_dim: 5 num_output: 0"]))
    return (f"Embed {p}", {"x": (4,)}, "Embed", ["x"], f"embed_param {{ {p} }}",
            ("y",), "err", None)


def tile_bad(rng):
    p = str(rng.choice(["tiles: 0", "tiles: -2", "tiles: 2 axis: 4", "axis: 1"]))
    return (f"Tile {p}", dict(X4), "Tile", ["x"], f"tile_param {{ {p} }}", ("y",), "err", None)


def reduction_case(rng):
    axis = int(rng.choice([4, -5, -1]))
    if axis == -1:
        def check(x, n):
            assert n.blobs["y"].shape == (2, 4, 8)
            np.testing.assert_allclose(n.blobs["y"].data, x["x"].sum(-1), rtol=1e-5, atol=1e-5)
        return ("Reduction axis -1", dict(X4), "Reduction", ["x"],
                "reduction_param { axis: -1 }", ("y",), "ok", check)
    return (f"Reduction axis {axis}", dict(X4), "Reduction", ["x"],
            f"reduction_param {{ axis: {axis} }}", ("y",), "err", None)


def softmax_loss_bad(rng):
    kind = str(rng.choice(["label count", "axis out of range"]))
    if kind == "label count":    # CHECK_EQ(outer_num_ * inner_num_, bottom[1]->count())
        return ("SoftmaxWithLoss label count", {"x": (4, 3), "lab": (5,)}, "SoftmaxWithLoss",
                ["x", "lab"], "", ("y",), "err", None)
    return ("SoftmaxWithLoss axis out of range", {"x": (4, 3), "lab": (4,)}, "SoftmaxWithLoss",
            ["x", "lab"], f"softmax_param {{ axis: {int(rng.choice([2, -3]))} }}", ("y",),
            "err", None)


def batchnorm_ok(rng):
    """Caffe's CPU BatchNorm CHECKs neither eps nor moving_average_fraction."""
    eps, frac = [(0, 0.999), (1e-5, 1.5), (1e-5, -0.5)][int(rng.integers(0, 3))]

    def check(x, n):
        v = x["x"]
        mean = v.mean(axis=(0, 2, 3), keepdims=True)
        var = ((v - mean) ** 2).mean(axis=(0, 2, 3), keepdims=True)
        np.testing.assert_allclose(n.blobs["y"].data, (v - mean) / np.sqrt(var + eps),
                                   rtol=1e-3, atol=1e-4)
    return (f"BatchNorm eps {eps} fraction {frac}", dict(X4), "BatchNorm", ["x"],
            f"batch_norm_param {{ use_global_stats: false eps: {eps} "
            f"moving_average_fraction: {frac} }}", ("y",), "ok", check)


def dropout_bad(rng):
    """Caffe: DCHECK(threshold_ < 1.) -- a debug-build CHECK; a release build takes
    scale 1 / (1 - ratio) (inf or negative).  minicaffe refuses ratio >= 1 (a documented
    choice in neuron.py), as a debug Caffe does."""
    r = float(rng.choice([1, 1.5, 2]))
    return (f"Dropout ratio {r}", dict(X4), "Dropout", ["x"],
            f"dropout_param {{ dropout_ratio: {r} }}", ("y",), "err", None)


def exp_log_case(rng):
    ltype = str(rng.choice(["Exp", "Log"]))
    pname = "exp_param" if ltype == "Exp" else "log_param"
    base = float(rng.choice([0, -2, -0.5, -1, 2]))
    if base in (-1.0, 2.0):             # -1 means e; if (base != -1) CHECK_GT(base, 0)
        def check(x, n):
            v = x["x"]             # made positive by the test
            f = np.exp if ltype == "Exp" else np.log
            want = (f(v) if base == -1 else (2 ** v if ltype == "Exp" else np.log2(v)))
            np.testing.assert_allclose(n.blobs["y"].data, want, rtol=1e-4, atol=1e-5)
        return (f"{ltype} base {base}", dict(X4), ltype, ["x"],
                f"{pname} {{ base: {base} }}", ("y",), "ok", check)
    return (f"{ltype} base {base}", dict(X4), ltype, ["x"], f"{pname} {{ base: {base} }}",
            ("y",), "err", None)


def neuron_ok(rng):
    """Power, Threshold and ELU CHECK nothing in Caffe."""
    kind = str(rng.choice(["Power 0", "Power -1", "Threshold", "ELU"]))
    ltype, p, f = {
        "Power 0": ("Power", "power_param { power: 0 scale: 3 shift: 1 }",
                    lambda v: np.ones_like(v)),
        "Power -1": ("Power", "power_param { power: -1 }", lambda v: 1 / v),
        "Threshold": ("Threshold", "threshold_param { threshold: -0.25 }",
                      lambda v: (v > -0.25).astype(v.dtype)),
        "ELU": ("ELU", "elu_param { alpha: -2 }",
                lambda v: np.where(v > 0, v, -2 * (np.exp(v) - 1))),
    }[kind]

    def check(x, n):
        np.testing.assert_allclose(n.blobs["y"].data, f(x["x"]), rtol=1e-4, atol=1e-5)
    return (kind, dict(X4), ltype, ["x"], p, ("y",), "ok", check)


def prelu_1d(rng):
    """CHECK_GE(bottom[0]->num_axes(), 2) before the channel count is read."""
    shared = str(rng.choice(["true", "false"]))
    return (f"PReLU 1-d channel_shared {shared}", {"x": (6,)}, "PReLU", ["x"],
            f"prelu_param {{ channel_shared: {shared} }}", ("y",), "err", None)


def spp_case(rng):
    """SPP gives level l kernel ceil(h / 2^l), pad (kernel * 2^l - h + 1) / 2; the Pooling
    layer it builds CHECKs pad < kernel: on 8x8 a height of 4 runs, 5 fails; on 6x6 3 runs,
    4 fails."""
    h, height = [(8, 4), (8, 5), (6, 3), (6, 4)][int(rng.integers(0, 4))]
    ok = (h, height) in ((8, 4), (6, 3))
    bins = sum(4 ** l for l in range(height))

    def check(x, n):
        assert n.blobs["y"].shape == (2, 4 * bins)
    return (f"SPP pyramid_height {height} on {h}x{h}", {"x": (2, 4, h, h)}, "SPP", ["x"],
            f"spp_param {{ pyramid_height: {height} }}", ("y",), "ok" if ok else "err",
            check if ok else None)


def argmax_bad(rng):
    p = str(rng.choice(["top_k: 5 axis: 1", "top_k: 257", "top_k: 0", "axis: 4"]))
    return (f"ArgMax {p}", dict(X4), "ArgMax", ["x"], f"argmax_param {{ {p} }}", ("y",),
            "err", None)


def accuracy_bad(rng):
    k = int(rng.integers(4, 7))        # CHECK_LE(top_k_, count / label count) = 3
    return (f"Accuracy top_k {k}", {"x": (4, 3), "lab": (4,)}, "Accuracy", ["x", "lab"],
            f"accuracy_param {{ top_k: {k} }}", ("y",), "err", None)


TEMPLATES = [conv_bad, conv_bad, conv_bad, conv_dilation0, conv_trunc, pool_bad, pool_bad,
             pool_ok, ip_bad, ip_axis_last, lrn_bad, lrn_one, concat_bad, concat_last,
             slice_bad, crop_bad, crop_edge, reshape_bad, flatten_case, eltwise_bad,
             eltwise_neg, scale_bias_bad, embed_bad, tile_bad, reduction_case,
             softmax_loss_bad, batchnorm_ok, dropout_bad, exp_log_case, neuron_ok, prelu_1d,
             spp_case, argmax_bad, accuracy_bad]


def _cases():
    rng = np.random.default_rng(SEED)
    out = [t(rng) for t in TEMPLATES]          # every template at least once
    while len(out) < N_CASES:
        out.append(TEMPLATES[int(rng.integers(0, len(TEMPLATES)))](rng))
    return [pytest.param(c, id=f"{i:03d}-{c[0]}") for i, c in enumerate(out)]


@pytest.mark.parametrize("case", _cases())
def test_one_bad_or_edge_parameter(tmp_path, monkeypatch, case):
    label, inputs, ltype, bottoms, param, tops, expect, check = case
    text, line = _net(inputs, ltype, bottoms, param, tops)
    monkeypatch.chdir(tmp_path)
    (tmp_path / "n.prototxt").write_text(text)
    if expect == "err":
        with pytest.raises(Exception) as e:
            n = caffe.Net("n.prototxt", caffe.TEST)
            n.forward()
        msg = str(e.value)
        assert isinstance(e.value, ValueError), (type(e.value), msg)   # PrototxtError is one
        assert f"n.prototxt:{line}" in msg, msg
        parse_error = "-1" in param and "pad" in param
        if not parse_error:                    # a parse error comes before the layer exists
            assert "'L'" in msg, msg
        c = e.value
        while c is not None:
            # an IndexError the axis helper raised on purpose names the axis and the blob
            purposeful = isinstance(c, IndexError) and "out of range for blob" in str(c)
            assert purposeful or not isinstance(c, RAW), (type(c), msg)
            assert "broadcast" not in str(c) and "out of bounds" not in str(c), msg
            c = c.__cause__ or c.__context__
        return
    n = caffe.Net("n.prototxt", caffe.TEST)
    rng = np.random.default_rng(0)
    x = {}
    for name, shape in inputs.items():
        v = rng.standard_normal(shape)
        if ltype in ("Exp", "Log", "Power"):    # inside every base's and power's domain
            v = np.abs(v) + 0.5
        n.blobs[name].data[...] = v
        x[name] = n.blobs[name].data.astype(np.float64)
    n.forward()
    assert np.isfinite(n.blobs[tops[0]].data).all()
    if check is not None:
        check(x, n)
