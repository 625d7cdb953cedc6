"""A seeded "reshape sequence" fuzz: one net serves inputs of changing shape.

In Caffe every ``Net::Forward`` calls each layer's ``Reshape`` (``Net::ForwardFromTo``), and
pycaffe users change the input's shape with ``net.blobs['data'].reshape(...)`` followed by
``net.reshape()`` or simply by the next ``net.forward()``.  Layers that cache something
shape-dependent at setup or at their first reshape (im2col buffers, pooling masks,
BatchNorm's sums, softmax/LRN scale buffers, Concat/Slice/Crop offsets, SPP's pooling
levels, the recurrent layers' per-stream state) must follow the new shape.

Each case is a random small float64 net (a trunk of Convolution/Deconvolution with pads and
strides, Pooling MAX/AVE incl. global, CEIL and FLOOR rounding, LRN in both regions,
BatchNorm in TRAIN and TEST (+ Scale), Scale, ReLU/PReLU in place, Eltwise residuals, Concat
and Slice branches, Crop of a padded branch against the trunk; then a head: Softmax on the
maps, Reshape with 0/-1 + InnerProduct over axis 2, Flatten + Softmax, global pooling or SPP
+ InnerProduct + SoftmaxWithLoss), or an LSTM net over (T, N, D) with InnerProducts on axis 2.
The net is built at the first shape; then a sequence of 3-5 input shapes (N, H and W change
for the maps, N for the LSTM nets, always one step with N = 1 and one step back to an earlier
shape) each goes through ``blobs[...].reshape`` + ``net.reshape()`` or through ``forward``
alone.  At each step a *fresh* net built directly at that shape, with the same parameters (and
the same BatchNorm statistics, copied just before the step), must give the same tops, the
same updated BatchNorm statistics, and after a backward (param diffs cleared first, the same
top diffs on the non-loss outputs) the same bottom, blob and param diffs: bit for bit.

The recurrent nets keep T: Caffe's ``RecurrentLayer::Reshape`` refuses a new number of time
steps (``CHECK_EQ(T_, bottom[0]->shape(0)) << "input number of timesteps changed"``), and so
must minicaffe (checked by ``test_recurrent_refuses_new_T``).
"""
import random

import numpy as np
import pytest

from minicaffe.net import TEST, TRAIN, Net
from minicaffe.proto import caffe_pb2
from minicaffe.proto.text import parse_text

SEED = 20250612
N_CASES = 80


def P(text):
    return parse_text(text, caffe_pb2.NetParameter, filename="<reshape fuzz net>")


def shape_text(shape):
    return "shape { " + " ".join(f"dim: {d}" for d in shape) + " }"


# ------------------------------------------------------------------ the generator
class Gen:
    """Writes the layers of one random net; ``inputs`` maps an input name to a function of
    the step's (N, H, W) or (T, N) giving its shape."""

    def __init__(self, rng):
        self.rng = rng
        self.layers = []
        self.k = 0
        self.loss = False
        self.bn_train = None

    def name(self, base):
        self.k += 1
        return f"{base}{self.k}"

    def add(self, type_, bottom, top, body="", extra=""):
        bottom = [bottom] if isinstance(bottom, str) else bottom
        top = [top] if isinstance(top, str) else top
        name = self.name(type_.lower())
        out = [f"layer {{ name: '{name}' type: '{type_}'"]
        out += [f"bottom: '{b}'" for b in bottom] + [f"top: '{t}'" for t in top]
        out += [extra, body, "}"]
        self.layers.append(" ".join(out))
        return top[0] if len(top) == 1 else top

    # -- blocks on a (N, C, H, W) blob x of c channels; each returns (blob, channels)
    def conv(self, x, c, shape_preserving=False, pad_extra=0):
        r = self.rng
        n_out = r.randint(2, 4)
        if shape_preserving:
            geo = f"kernel_size: 3 pad: {1 + pad_extra} stride: 1"
        else:
            k = r.choice([1, 2, 3])
            if r.random() < 0.3:
                geo = (f"kernel_h: {k} kernel_w: {r.choice([1, 3])} pad_h: {r.randint(0, 2)} "
                       f"pad_w: {r.randint(0, 1)} stride_h: {r.choice([1, 2])} stride_w: 1")
            else:
                geo = f"kernel_size: {k} pad: {r.randint(0, 2)} stride: {r.choice([1, 1, 2])}"
                if k > 1 and r.random() < 0.2:
                    geo += " dilation: 2"
        group = ""
        if not shape_preserving and c % 2 == 0 and r.random() < 0.25:
            n_out = 2 * r.randint(1, 2)
            group = "group: 2"
        bias = "" if r.random() < 0.8 else "bias_term: false"
        y = self.add("Convolution", x, self.name("c"),
                     f"convolution_param {{ num_output: {n_out} {geo} {group} {bias} }}")
        return y, n_out

    def deconv(self, x, c):
        r = self.rng
        n_out = r.randint(2, 4)
        y = self.add("Deconvolution", x, self.name("d"),
                     f"convolution_param {{ num_output: {n_out} kernel_size: {r.choice([2, 3])} "
                     f"pad: {r.randint(0, 1)} stride: {r.choice([1, 2])} }}")
        return y, n_out

    def pool(self, x, c):
        r = self.rng
        method = r.choice(["MAX", "AVE"])
        k = r.choice([2, 3])
        rnd = "round_mode: FLOOR" if r.random() < 0.3 else ""
        y = self.add("Pooling", x, self.name("p"),
                     f"pooling_param {{ pool: {method} kernel_size: {k} stride: {r.choice([1, 2])} "
                     f"pad: {r.randint(0, k - 1)} {rnd} }}")
        return y, c

    def lrn(self, x, c):
        r = self.rng
        if r.random() < 0.5:
            body = f"lrn_param {{ local_size: {r.choice([3, 5])} alpha: 0.7 beta: 0.6 k: 1.5 }}"
        else:
            body = "lrn_param { local_size: 3 alpha: 0.5 beta: 0.75 norm_region: WITHIN_CHANNEL }"
        return self.add("LRN", x, self.name("l"), body), c

    def bn(self, x, c):
        r = self.rng
        gs = r.choice(["", "use_global_stats: true", "use_global_stats: false"])
        self.add("BatchNorm", x, x, f"batch_norm_param {{ moving_average_fraction: 0.9 eps: 0.001 "
                 f"{gs} }}")
        if r.random() < 0.7:
            self.add("Scale", x, x, "scale_param { bias_term: true }")
        return x, c

    def scale(self, x, c):
        bias = "bias_term: true" if self.rng.random() < 0.5 else ""
        return self.add("Scale", x, self.name("s"), f"scale_param {{ {bias} }}"), c

    def relu(self, x, c):
        r = self.rng
        if r.random() < 0.5:
            self.add("ReLU", x, x, "relu_param { negative_slope: 0.1 }" if r.random() < 0.3 else "")
        else:
            shared = "channel_shared: true" if r.random() < 0.3 else ""
            self.add("PReLU", x, x, f"prelu_param {{ {shared} }}")
        return x, c

    def residual(self, x, c):
        r = self.rng
        b = self.add("Convolution", x, self.name("rc"),
                     f"convolution_param {{ num_output: {c} kernel_size: 3 pad: 1 }}")
        if r.random() < 0.5:
            self.add("ReLU", b, b)
        op = r.choice(["SUM", "PROD", "MAX"])
        coeff = "coeff: 1 coeff: -0.5" if op == "SUM" and r.random() < 0.5 else ""
        return self.add("Eltwise", [x, b], self.name("e"),
                        f"eltwise_param {{ operation: {op} {coeff} }}"), c

    def concat(self, x, c):
        r = self.rng
        b1, c1 = self.conv(x, c, shape_preserving=True)
        b2 = self.add("Convolution", x, self.name("cc"),
                      f"convolution_param {{ num_output: 2 kernel_size: 1 }}")
        axis = r.choice([1, 1, 2, 3])
        y = self.add("Concat", [b1, b2] if r.random() < 0.5 else [b2, b1], self.name("cat"),
                     f"concat_param {{ axis: {axis} }}")
        if axis == 1:
            return y, c1 + 2
        # (N, c1, 2H, W) or (N, c1, H, 2W) needs equal channels: make both c1 wide
        return y, None

    def slice(self, x, c):
        if self.rng.random() < 0.3:     # along H or W: two parts, the first 2 rows/columns
            axis = self.rng.choice([2, 3])
            a, b = self.add("Slice", x, [self.name("sa"), self.name("sb")],
                            f"slice_param {{ axis: {axis} slice_point: 2 }}")
            return self.add("Concat", [b, a], self.name("roll"),
                            f"concat_param {{ axis: {axis} }}"), c
        if c < 2:
            return self.conv(x, c)
        p = self.rng.randint(1, c - 1)
        a, b = self.add("Slice", x, [self.name("sa"), self.name("sb")],
                        f"slice_param {{ axis: 1 slice_point: {p} }}")
        return self.add("Concat", [b, a], self.name("shuf")), c    # a channel shuffle

    def crop(self, x, c):
        r = self.rng
        big, cb = self.conv(x, c, shape_preserving=True, pad_extra=1)   # (N, cb, H+2, W+2)
        if r.random() < 0.5:
            body = "crop_param { axis: 2 offset: 1 }"
        else:
            body = f"crop_param {{ axis: 2 offset: {r.randint(0, 2)} offset: {r.randint(0, 2)} }}"
        return self.add("Crop", [big, x], self.name("cr"), body), cb

    BLOCKS = ("conv", "conv", "deconv", "pool", "lrn", "bn", "bn", "scale", "relu", "relu",
              "residual", "concat", "slice", "crop")

    def trunk(self, x, c):
        n_down = 0
        for _ in range(self.rng.randint(2, 6)):
            kind = self.rng.choice(self.BLOCKS)
            if kind in ("pool", "conv") and n_down >= 2:
                kind = "relu"
            if kind == "concat":
                y, c2 = self.concat(x, c)
                if c2 is None:      # a Concat on H or W: branches of equal channels
                    self.layers.pop()
                    self.layers.pop()
                    self.layers.pop()
                    y, c2 = self._concat_spatial(x, c)
                x, c = y, c2
                continue
            n_down += kind in ("pool", "conv")
            x, c = getattr(self, kind)(x, c)
        return x, c

    def _concat_spatial(self, x, c):
        b1 = self.add("Convolution", x, self.name("s1"),
                      "convolution_param { num_output: 3 kernel_size: 3 pad: 1 }")
        b2 = self.add("Convolution", x, self.name("s2"),
                      "convolution_param { num_output: 3 kernel_size: 1 }")
        return self.add("Concat", [b1, b2], self.name("cat"),
                        f"concat_param {{ axis: {self.rng.choice([2, 3])} }}"), 3

    def head(self, x, c):
        r = self.rng
        kind = r.choice(["softmax", "reshape_ip", "flatten", "global_loss", "spp_loss",
                         "maps_loss", "flatten_axis", "bn2d_loss"])
        if kind == "softmax":
            self.add("Softmax", x, self.name("prob"))
        elif kind == "reshape_ip":
            # (N, C, H, W) -> (N, H*W*?, C) read as rows of C: Reshape with 0 and -1, then an
            # InnerProduct over axis 2 (K = C fixed whatever H and W)
            y = self.add("Reshape", x, self.name("rs"),
                         f"reshape_param {{ shape {{ dim: 0 dim: -1 dim: {c} }} }}")
            y = self.add("InnerProduct", y, self.name("ip"),
                         "inner_product_param { num_output: 3 axis: 2 }")
            self.add("Softmax", y, self.name("prob"), "softmax_param { axis: 2 }")
        elif kind == "flatten":
            y = self.add("Flatten", x, self.name("fl"))
            self.add("Softmax", y, self.name("prob"))
        elif kind == "flatten_axis":
            # (N, C, H*W): Flatten from axis 2, or Reshape of one axis from axis 2
            if r.random() < 0.5:
                y = self.add("Flatten", x, self.name("fl"), "flatten_param { axis: 2 }")
            else:
                y = self.add("Reshape", x, self.name("rs"),
                             "reshape_param { shape { dim: -1 } axis: 2 }")
            self.add("Softmax", y, self.name("prob"), f"softmax_param {{ axis: {r.choice([1, 2])} }}")
        elif kind == "bn2d_loss":
            # BatchNorm on (N, K): m = N, so N = 1 has no bias correction (Caffe: m > 1 ? m/(m-1) : 1)
            y = self.add("Pooling", x, self.name("gp"), "pooling_param { pool: AVE global_pooling: true }")
            y = self.add("InnerProduct", y, self.name("ip"), "inner_product_param { num_output: 4 }")
            self.add("BatchNorm", y, y, "batch_norm_param { moving_average_fraction: 0.8 }")
            self.add("Scale", y, y, "scale_param { bias_term: true }")
            norm = r.choice(["FULL", "VALID", "BATCH_SIZE", "NONE"])
            self.add("SoftmaxWithLoss", [y, "label"], self.name("loss"),
                     f"loss_param {{ normalization: {norm} ignore_label: 1 }}")
            self.loss = True
        elif kind in ("global_loss", "spp_loss"):
            if kind == "global_loss":
                y = self.add("Pooling", x, self.name("gp"),
                             f"pooling_param {{ pool: {r.choice(['MAX', 'AVE'])} "
                             "global_pooling: true }")
            else:
                y = self.add("SPP", x, self.name("spp"),
                             f"spp_param {{ pyramid_height: 2 pool: {r.choice(['MAX', 'AVE'])} }}")
            y = self.add("InnerProduct", y, self.name("ip"),
                         "inner_product_param { num_output: 4 }")
            self.add("SoftmaxWithLoss", [y, "label"], self.name("loss"))
            self.loss = True
        else:   # softmax loss over the maps' channels: a label per position (N, 1, H', W')
            norm = r.choice(["", "normalization: FULL", "normalization: BATCH_SIZE",
                             "normalization: VALID ignore_label: 0"])
            self.add("SoftmaxWithLoss", [x, "label"], self.name("loss"),
                     f"loss_param {{ {norm} }}")
            self.loss = "maps"
        return kind


def map_net(rng, phase):
    g = Gen(rng)
    c0 = rng.randint(1, 3)
    x, c = g.trunk("data", c0)
    if c is None:
        c = 3
    kind = g.head(x, c)
    return g, c0, kind


def lstm_net(rng):
    g = Gen(rng)
    d = rng.randint(2, 4)
    x = "data"
    if rng.random() < 0.5:
        x = g.add("InnerProduct", x, "xin", "inner_product_param { num_output: 3 axis: 2 }")
    h = g.add("LSTM", [x, "cont"], "h",
              f"recurrent_param {{ num_output: {rng.randint(2, 4)} }}")
    y = g.add("InnerProduct", h, "yo", "inner_product_param { num_output: 3 axis: 2 }")
    if rng.random() < 0.5:
        g.add("Softmax", y, "prob", "softmax_param { axis: 2 }")
    return g, d


def net_text(g, inputs):
    head = "name: 'reshape_fuzz' force_backward: true "
    ins = " ".join(f"layer {{ name: 'in_{n}' type: 'Input' top: '{n}' input_param {{ "
                   f"{shape_text(s)} }} }}" for n, s in inputs.items())
    return head + ins + " " + " ".join(g.layers)


# ------------------------------------------------------------------ one case
def build(g, inputs, phase):
    return Net(P(net_text(g, inputs)), phase, dtype=np.float64)


def randomize_params(net, rng):
    for layer in net.layers:
        for i, b in enumerate(layer.blobs):
            v = rng.standard_normal(b.shape) * 0.5
            if layer.type == "BatchNorm":    # sums of a mean, of a variance, the scale factor
                v = (np.abs(v) + 0.2) * (3.0 if i == 2 else 1.0) if i else v * 3.0
                if i == 2:
                    v = np.array([rng.choice([0.0, 2.5])]) if rng.random() < 0.2 else v
            b.data[...] = v


def copy_params(src, dst):
    assert src.layer_names == dst.layer_names
    for a, b in zip(src.layers, dst.layers):
        for pa, pb in zip(a.blobs, b.blobs):
            pb.data[...] = pa.data


def input_arrays(shapes, label_classes, rng):
    out = {}
    for name, shape in shapes.items():
        if name == "label":
            out[name] = rng.integers(0, label_classes, size=shape).astype(np.float64)
        elif name == "cont":
            cont = (rng.random(shape) < 0.7).astype(np.float64)
            cont[0] = 0     # a sequence starts: the carried state of an earlier step is unread
            out[name] = cont
        else:
            out[name] = rng.standard_normal(shape)
    return out


def run_step(net, arrays, top_diffs, via_reshape):
    for name, a in arrays.items():
        net.blobs[name].reshape(*a.shape)
    if via_reshape:
        net.reshape()
    for name, a in arrays.items():
        net.blobs[name].data[...] = a
    net.forward()
    net.clear_param_diffs()
    for name, diff in top_diffs.items():
        net.blobs[name].diff[...] = diff
    net.backward()


def assert_same(what, a, b):
    a, b = np.asarray(a), np.asarray(b)
    assert a.shape == b.shape, f"{what}: shape {a.shape} != fresh net's {b.shape}"
    assert np.array_equal(a, b, equal_nan=True), (
        f"{what}: differs from the fresh net (max |d| {np.nanmax(np.abs(a - b)):.3g})")


def compare(net, ref, where):
    for name in ref.blobs:
        assert_same(f"{where}: blob {name!r} data", net.blobs[name].data, ref.blobs[name].data)
        if ref.blob_need_backward.get(name):
            assert_same(f"{where}: blob {name!r} diff", net.blobs[name].diff,
                        ref.blobs[name].diff)
    assert_same(f"{where}: data diff", net.blobs["data"].diff, ref.blobs["data"].diff)
    for ln, a, b in zip(ref.layer_names, net.layers, ref.layers):
        for i, (pa, pb) in enumerate(zip(a.blobs, b.blobs)):
            assert_same(f"{where}: layer {ln!r} param {i} data", pa.data, pb.data)
            assert_same(f"{where}: layer {ln!r} param {i} diff", pa.diff, pb.diff)


def shape_sequence(rng, recurrent):
    """3-5 steps of (N, H, W) (recurrent: (N,) with T fixed): one with N = 1, one a return
    to an earlier step's shape, the rest new."""
    steps = rng.randint(3, 5)
    seq = []
    for _ in range(steps):
        n = rng.randint(1, 4)
        seq.append((n,) if recurrent else (n, rng.randint(5, 11), rng.randint(5, 11)))
    j = rng.randrange(1, steps)
    seq[j] = (1,) + seq[j][1:]
    back = rng.randrange(2, steps) if steps > 2 else 1
    seq[back] = seq[rng.randrange(0, back - 1)]
    if all(s[0] != 1 for s in seq):
        seq[1] = (1,) + seq[1][1:]
    return seq


def _last_top(g):
    """The maps a SoftmaxWithLoss over the maps reads (its first bottom)."""
    return g.layers[-1].split("bottom: '")[1].split("'")[0]


def make_case(i):
    rng = random.Random(SEED * 1000 + i)
    for _attempt in range(20):
        recurrent = rng.random() < 0.15
        phase = rng.choice([TRAIN, TEST])
        if recurrent:
            g, d = lstm_net(rng)
            T = rng.randint(2, 4)
            seq = shape_sequence(rng, True)
            shapes = [{"data": (T, n, d), "cont": (T, n)} for (n,) in seq]
            kind = "lstm"
        else:
            g, c0, kind = map_net(rng, phase)
            seq = shape_sequence(rng, False)
            shapes = [{"data": (n, c0, h, w)} for n, h, w in seq]
        try:
            if g.loss == "maps":    # a label per position of the maps: (N, 1, H', W')
                probe = Gen(rng)
                probe.layers = g.layers[:-1]
                for s in shapes:
                    maps = build(probe, s, phase).blobs[probe.layers and _last_top(g)].shape
                    s["label"] = (maps[0], 1) + tuple(maps[2:])
            elif g.loss:
                for s in shapes:
                    s["label"] = (s["data"][0],)
            for s in shapes:
                build(g, s, phase)
        except ValueError:      # a shape too small for this net (Caffe refuses it as well)
            continue
        return g, shapes, phase, kind, rng
    raise AssertionError(f"case {i}: no valid net in 20 attempts")


@pytest.mark.parametrize("case", range(N_CASES))
def test_reshape_sequence(case):
    g, shapes, phase, kind, rng = make_case(case)
    nrng = np.random.default_rng(case)
    net = build(g, shapes[0], phase)
    randomize_params(net, nrng)
    for step, s in enumerate(shapes):
        ref = build(g, s, phase)
        copy_params(net, ref)          # the weights and the BatchNorm statistics as they are now
        label_classes = 4
        if g.loss == "maps":
            label_classes = ref.bottom_vecs[-1][0].shape[1]
        arrays = input_arrays(s, label_classes, nrng)
        top_diffs = {n: nrng.standard_normal(ref.blobs[n].shape) for n in ref.outputs
                     if not ref.blob_loss_weights[n]}
        via_reshape = step == 0 or nrng.random() < 0.5
        where = (f"case {case} ({kind}, {'TRAIN' if phase == TRAIN else 'TEST'}) step {step} "
                 f"shapes {s} via {'reshape' if via_reshape else 'forward'}")
        run_step(ref, arrays, top_diffs, True)
        try:
            run_step(net, arrays, top_diffs, via_reshape)
        except Exception as e:
            raise AssertionError(f"{where}: {type(e).__name__}: {e}\nnet: {net_text(g, s)}") from e
        try:
            compare(net, ref, where)
        except AssertionError as e:
            raise AssertionError(f"{e}\nnet: {net_text(g, s)}") from None


def test_recurrent_refuses_new_T():
    """Caffe's RecurrentLayer::Reshape: CHECK_EQ(T_, bottom[0]->shape(0)) "input number of
    timesteps changed"; N may change."""
    text = ("force_backward: true layer { name: 'd' type: 'Input' top: 'data' top: 'cont' "
            "input_param { shape { dim: 3 dim: 2 dim: 4 } shape { dim: 3 dim: 2 } } } "
            "layer { name: 'lstm' type: 'LSTM' bottom: 'data' bottom: 'cont' top: 'h' "
            "recurrent_param { num_output: 3 } }")
    net = Net(P(text), TEST, dtype=np.float64)
    net.blobs["data"].reshape(4, 2, 4)
    net.blobs["cont"].reshape(4, 2)
    with pytest.raises(ValueError, match="time steps cannot change"):
        net.reshape()


@pytest.mark.parametrize("layer, new_shape", [
    ("layer { name: 'c' type: 'Convolution' bottom: 'data' top: 'c' "
     "convolution_param { num_output: 2 kernel_size: 3 } }", (2, 4, 7, 7)),
    ("layer { name: 'ip' type: 'InnerProduct' bottom: 'data' top: 'ip' "
     "inner_product_param { num_output: 2 } }", (2, 3, 6, 7)),
    ("layer { name: 'bn' type: 'BatchNorm' bottom: 'data' top: 'data' }", (2, 4, 7, 7)),
])
def test_reshape_refuses_what_the_weights_cannot_take(layer, new_shape):
    """Caffe's Reshape checks what its parameters fix: BaseConvolutionLayer "Input size
    incompatible with convolution kernel." (channels), InnerProductLayer "Input size
    incompatible with inner product parameters." (K), BatchNorm's channels (its blobs)."""
    text = ("force_backward: true layer { name: 'd' type: 'Input' top: 'data' "
            "input_param { shape { dim: 2 dim: 3 dim: 7 dim: 7 } } } " + layer)
    net = Net(P(text), TEST, dtype=np.float64)
    net.blobs["data"].reshape(*new_shape)
    with pytest.raises(ValueError):
        net.reshape()
