"""Seeded fuzz of the weight fillers against BVLC Caffe's include/caffe/filler.hpp (master).

From one seed, cases over blob shapes of 0 to 5 axes (0-d, 1-d biases, 2-d InnerProduct
weights, 4-d and 5-d convolution weights, empty blobs) and every filler type, each checked
against what filler.hpp computes:

- constant: every value is Dtype(value), exactly;
- uniform: values in [min, max] exactly, both ends reached to within 20/count of the range,
  moments within 6 sigma of the sample size;
- gaussian: moments within 6 sigma; with sparse >= 0 the Bernoulli mask keeps a weight with
  probability sparse / shape(0) (CHECK_GE(num_axes, 1): one axis is enough), the fraction kept
  within 6 sigma;
- positive_unitball: values in [0, 1]; each of the shape(0) rows of count / shape(0) sums to 1;
- xavier / msra: fan_in = count / shape(0), fan_out = num_axes > 1 ? count / shape(1) : count,
  n = fan_in, fan_out or their mean (variance_norm); xavier is U(-sqrt(3/n), sqrt(3/n)) (bound
  exact, reached to 20/count), msra N(0, 2/n) (moments within 6 sigma);
- bilinear: every value of Caffe's loop, exactly (CHECK 4 axes, square kernel);
- the CHECKs that abort Caffe: an empty blob (CHECK(count), all but bilinear), shape(0) of a 0-d
  blob, sparse on any filler but gaussian (and sparse < -1), min > max (caffe_rng_uniform
  CHECK_LE), std <= 0 (caffe_rng_gaussian CHECK_GT), sparse > shape(0) (caffe_rng_bernoulli
  CHECK_LE(p, 1)), unknown type names (GetFiller is case-sensitive).

Then the fillers through real layers, whose weight blob shapes decide the fans: Convolution
with group > 1 (M, C/G, k...), Deconvolution (C, M/G, kh, kw), InnerProduct with and without
transpose ((K, N) and (N, K): fan_in = count / shape(0) is N when transposed, K otherwise).
"""
import numpy as np
import pytest

from minicaffe.backend import to_numpy
from minicaffe.blob import Blob
from minicaffe.fillers import fill
from minicaffe.proto import caffe_pb2, parse_text
from minicaffe.rng import set_random_seed
from minicaffe.testing.gradient_check import make_blob, make_layer

SEED = 20250917
SIGMAS = 6.0            # statistical tolerance: a false failure has probability ~1e-9 per check
NORMS = ("FAN_IN", "FAN_OUT", "AVERAGE")


# ---------------------------------------------------------------- Caffe's arithmetic (filler.hpp)

def caffe_fans(shape):
    """XavierFiller / MSRAFiller: fan_in = count / shape(0); fan_out = num_axes > 1 ?
    count / shape(1) : count (integer division, as Caffe's ints)."""
    count = int(np.prod(shape))
    fan_in = count // shape[0]
    fan_out = count // shape[1] if len(shape) > 1 else count
    return fan_in, fan_out


def caffe_n(shape, norm):
    fan_in, fan_out = caffe_fans(shape)
    return {"FAN_IN": float(fan_in), "FAN_OUT": float(fan_out),
            "AVERAGE": (fan_in + fan_out) / 2.0}[norm]


def caffe_bilinear(shape):
    """BilinearFiller's loop over the flat blob: f = ceil(w / 2), c = (w - 1) / (2f)."""
    w = shape[3]
    f = int(np.ceil(w / 2.0))
    c = (w - 1) / (2.0 * f)
    i = np.arange(int(np.prod(shape)))
    x, y = i % w, (i // w) % shape[2]
    return ((1 - np.abs(x / f - c)) * (1 - np.abs(y / f - c))).reshape(shape)


# ---------------------------------------------------------------- statistical checks

def check_moments(v, mean, var, mu4):
    """Sample mean and variance of ``v`` within SIGMAS standard errors of (mean, var); mu4 is
    the distribution's fourth central moment (the variance of (x - mean)^2 is mu4 - var^2)."""
    x = v.astype(np.float64).ravel()
    n = x.size
    assert abs(x.mean() - mean) <= SIGMAS * np.sqrt(var / n) + 1e-12, (x.mean(), mean)
    s2 = ((x - mean) ** 2).mean()
    assert abs(s2 - var) <= SIGMAS * np.sqrt((mu4 - var ** 2) / n) + 1e-12, (s2, var)


def check_uniform(v, lo, hi, dtype):
    """U(lo, hi): inside [lo, hi] exactly (in the blob's type), both ends reached to within
    20/count of the range (missing by more has probability e^-20), moments within SIGMAS."""
    x = v.astype(np.float64)
    assert x.min() >= np.dtype(dtype).type(lo) and x.max() <= np.dtype(dtype).type(hi)
    n, r = x.size, hi - lo
    if n >= 200:
        assert x.min() <= lo + r * 20.0 / n and x.max() >= hi - r * 20.0 / n, (x.min(), x.max())
        check_moments(x, (lo + hi) / 2, r ** 2 / 12, r ** 4 / 80)


def check_gaussian(v, mean, std):
    if v.size >= 200:
        check_moments(v, mean, std ** 2, 3 * std ** 4)


# ---------------------------------------------------------------- the seeded cases

def _shape(rng, axes, target):
    """A shape of ``axes`` axes (each >= 1) with a count near ``target``."""
    if axes == 0:
        return ()
    dims = [int(rng.integers(1, 7)) for _ in range(axes - 1)]
    rest = max(1, target // int(np.prod(dims)))
    return tuple([rest] + dims) if rng.random() < 0.5 else tuple(dims + [rest])


def make_cases():
    """(id, filler prototxt, shape, dtype, expected): expected is "ok" or "error"."""
    rng = np.random.default_rng(SEED)
    cases = []

    def add(kind_id, text, shape, expected="ok", dtype=None):
        dtype = dtype or (np.float32 if rng.random() < 0.5 else np.float64)
        cases.append((f"{len(cases):02d}-{kind_id}-{'x'.join(map(str, shape)) or '0d'}",
                      text, shape, dtype, expected))

    def big(axes=None):
        return _shape(rng, int(rng.integers(1, 6)) if axes is None else axes,
                      int(rng.integers(2000, 12000)))

    for _ in range(3):
        v = float(np.round(rng.normal(0, 3), 3))
        add("constant", f'type: "constant" value: {v}', big(int(rng.integers(0, 6))))
    add("constant-default", "", big())
    add("constant-0d", 'type: "constant" value: -2', ())             # count 1: Caffe fills it
    add("uniform-0d", 'type: "uniform" min: -1 max: 1', ())
    for _ in range(4):
        lo = float(np.round(rng.normal(0, 2), 2))
        hi = lo + float(np.round(rng.uniform(0.01, 4), 2))
        add("uniform", f'type: "uniform" min: {lo} max: {hi}', big())
    add("uniform-min=max", 'type: "uniform" min: 0.5 max: 0.5', big())
    for _ in range(4):
        m, s = float(np.round(rng.normal(0, 2), 2)), float(np.round(rng.uniform(0.01, 3), 2))
        add("gaussian", f'type: "gaussian" mean: {m} std: {s}', big())
    for axes in (1, 2, 4, 5):
        shape = big(axes)
        sparse = int(rng.integers(0, shape[0] + 1))
        add("sparse", f'type: "gaussian" std: 0.5 sparse: {sparse}', shape)
    add("sparse-all", 'type: "gaussian" sparse: 20', (20, 300))            # p = 1: a dense draw
    for axes in (1, 2, 3, 4, 5):
        add("unitball", 'type: "positive_unitball"', big(axes))
    for kind in ("xavier", "msra"):
        for norm in NORMS:
            for axes in {"FAN_IN": (1, 4, 5), "FAN_OUT": (1, 2, 5), "AVERAGE": (2, 4, 5)}[norm]:
                add(f"{kind}-{norm}", f'type: "{kind}" variance_norm: {norm}', big(axes))
    for k in (1, 2, 3, 4, 5, 6, 7, 16):
        shape = (int(rng.integers(1, 4)), int(rng.integers(1, 4)), k, k)
        add(f"bilinear-k{k}", 'type: "bilinear"', shape, dtype=np.float64)
    add("bilinear-empty", 'type: "bilinear"', (0, 3, 4, 4))         # no CHECK(count) in Caffe

    # what Caffe CHECKs (aborts on): minicaffe raises a ValueError
    for kind in ("constant", "uniform", "gaussian", "xavier", "msra", "positive_unitball"):
        add(f"{kind}-empty", f'type: "{kind}"', ((0, 3), (4, 0, 2), (0,))[len(cases) % 3],
            "error")
    for kind in ("xavier", "msra", "positive_unitball"):
        add(f"{kind}-0d", f'type: "{kind}"', (), "error")                # shape(0) of 0 axes
    add("sparse-0d", 'type: "gaussian" sparse: 1', (), "error")
    add("bilinear-3d", 'type: "bilinear"', (2, 4, 4), "error")
    add("bilinear-5d", 'type: "bilinear"', (1, 1, 4, 4, 4), "error")
    add("bilinear-rect", 'type: "bilinear"', (2, 1, 4, 3), "error")
    for kind in ("constant", "uniform", "xavier", "msra", "positive_unitball", "bilinear"):
        add(f"{kind}-sparse", f'type: "{kind}" sparse: 2', (4, 1, 4, 4), "error")
    add("sparse<-1", 'type: "gaussian" sparse: -2', (4, 4), "error")
    add("sparse>shape0", 'type: "gaussian" sparse: 5', (4, 10), "error")  # p = 5/4 > 1
    add("uniform-min>max", 'type: "uniform" min: 1 max: 0', (4, 4), "error")
    add("gaussian-std0", 'type: "gaussian" std: 0', (4, 4), "error")
    add("gaussian-std<0", 'type: "gaussian" std: -1', (4, 4), "error")
    for name in ("Xavier", "glorot", "MSRA", ""):
        add(f"unknown-{name or 'empty'}", f'type: "{name}"', (3, 3), "error")
    return cases


CASES = make_cases()


def filled(text, shape, dtype, seed):
    set_random_seed(seed)
    blob = Blob(shape, dtype=dtype, name="w")
    fill(blob, parse_text(text, caffe_pb2.FillerParameter))
    v = to_numpy(blob.data)
    assert v.shape == tuple(shape) and v.dtype == dtype
    return v


def test_case_count():
    assert 40 <= len(CASES) <= 80
    assert any(len(s) == 5 for _, _, s, _, _ in CASES)


@pytest.mark.parametrize("case_id,text,shape,dtype,expected", CASES, ids=[c[0] for c in CASES])
def test_filler_against_caffe(case_id, text, shape, dtype, expected):
    param = parse_text(text, caffe_pb2.FillerParameter)
    seed = SEED + int(case_id[:2])
    if expected == "error":
        with pytest.raises(ValueError, match="filler"):
            filled(text, shape, dtype, seed)
        return
    v = filled(text, shape, dtype, seed)
    kind = param.type
    if kind == "constant":
        np.testing.assert_array_equal(v, np.full(shape, np.dtype(dtype).type(param.value)))
    elif kind == "uniform":
        check_uniform(v, param.min, param.max, dtype)
    elif kind == "gaussian" and param.sparse < 0:
        check_gaussian(v, param.mean, param.std)
    elif kind == "gaussian":
        p = param.sparse / float(shape[0])
        kept = float((v != 0).mean())
        assert abs(kept - p) <= SIGMAS * np.sqrt(p * (1 - p) / v.size) + 1e-12, (kept, p)
        if p > 0:
            check_gaussian(v[v != 0], param.mean, param.std)   # the kept values: N(mean, std)
    elif kind == "positive_unitball":
        assert (v >= 0).all() and (v <= 1).all()
        rows = v.astype(np.float64).reshape(shape[0], -1).sum(axis=1)
        np.testing.assert_allclose(rows, 1.0, rtol=1e-5 if dtype == np.float32 else 1e-12)
    elif kind in ("xavier", "msra"):
        norm = caffe_pb2.FillerParameter.VarianceNorm.Name(param.variance_norm)
        n = caffe_n(shape, norm)
        if kind == "xavier":
            a = float(np.sqrt(3.0 / n))
            check_uniform(v, -a, a, dtype)
        else:
            check_gaussian(v, 0.0, float(np.sqrt(2.0 / n)))
    elif kind == "bilinear":
        np.testing.assert_array_equal(v, caffe_bilinear(shape).astype(dtype))
    else:
        raise AssertionError(f"no check for {kind!r}")


def test_same_seed_same_values():
    for case_id, text, shape, dtype, expected in CASES:
        if expected == "ok":
            a, b = filled(text, shape, dtype, 5), filled(text, shape, dtype, 5)
            np.testing.assert_array_equal(a, b, case_id)


# ---------------------------------------------------------------- through real layers

def layer_weight(text, bottom_shape):
    set_random_seed(SEED)
    layer = make_layer(text)
    bottom = [make_blob(np.zeros(bottom_shape))]
    layer.setup(bottom, [Blob(name="top")])
    return to_numpy(layer.blobs[0].data)


def check_scale(kind, v, n):
    if kind == "xavier":
        a = float(np.sqrt(3.0 / n))
        check_uniform(v, -a, a, np.float64)
    else:
        check_gaussian(v, 0.0, float(np.sqrt(2.0 / n)))


@pytest.mark.parametrize("kind", ["xavier", "msra"])
@pytest.mark.parametrize("norm", NORMS)
def test_convolution_group_weight_fans(kind, norm):
    """Convolution's weight is (M, C/G, kh, kw): fan_in = C/G*kh*kw, fan_out = M*kh*kw."""
    text = ('name: "c" type: "Convolution" convolution_param { num_output: 48 group: 4 '
            f'kernel_h: 3 kernel_w: 5 weight_filler {{ type: "{kind}" variance_norm: {norm} }} }}')
    v = layer_weight(text, (1, 20, 8, 8))
    assert v.shape == (48, 5, 3, 5)
    assert caffe_fans(v.shape) == (5 * 15, 48 * 15)
    check_scale(kind, v, caffe_n(v.shape, norm))


def test_convolution_3d_weight_is_5d():
    """An N-d convolution's weight (M, C/G, kd, kh, kw): the fans of its 5-d blob."""
    text = ('name: "c" type: "Convolution" convolution_param { num_output: 32 group: 2 '
            'kernel_size: 3 weight_filler { type: "xavier" variance_norm: FAN_OUT } }')
    v = layer_weight(text, (1, 6, 5, 5, 5))
    assert v.shape == (32, 3, 3, 3, 3)
    check_scale("xavier", v, 32 * 27)


@pytest.mark.parametrize("kind", ["xavier", "msra"])
@pytest.mark.parametrize("norm", NORMS)
def test_deconvolution_weight_fans(kind, norm):
    """Deconvolution's weight is (C, M/G, kh, kw) (reverse_dimensions): fan_in = M/G*kh*kw,
    fan_out = C*kh*kw, the other way round from a Convolution of the same C and M."""
    text = ('name: "d" type: "Deconvolution" convolution_param { num_output: 60 group: 3 '
            f'kernel_size: 4 stride: 2 weight_filler {{ type: "{kind}" variance_norm: {norm} }} }}')
    v = layer_weight(text, (1, 12, 5, 5))
    assert v.shape == (12, 20, 4, 4)
    assert caffe_fans(v.shape) == (20 * 16, 12 * 16)
    check_scale(kind, v, caffe_n(v.shape, norm))


def test_deconvolution_bilinear_upsampling():
    """FCN's upsampling: Deconvolution group = C, bilinear weight (C, 1, 2s, 2s), exact."""
    text = ('name: "up" type: "Deconvolution" convolution_param { num_output: 5 group: 5 '
            'kernel_size: 4 stride: 2 bias_term: false weight_filler { type: "bilinear" } }')
    v = layer_weight(text, (1, 5, 3, 3))
    np.testing.assert_array_equal(v, caffe_bilinear((5, 1, 4, 4)))


@pytest.mark.parametrize("transpose", [False, True])
@pytest.mark.parametrize("kind", ["xavier", "msra"])
@pytest.mark.parametrize("norm", NORMS)
def test_inner_product_weight_fans(transpose, kind, norm):
    """InnerProduct's weight is (N, K), or (K, N) with transpose: Caffe's generic rule gives
    fan_in = count / shape(0) = K, or N when transposed (filler.hpp does not know the layer)."""
    text = ('name: "ip" type: "InnerProduct" inner_product_param { num_output: 40 '
            f'transpose: {str(transpose).lower()} weight_filler {{ type: "{kind}" '
            f'variance_norm: {norm} }} }}')
    v = layer_weight(text, (2, 3, 10, 10))           # K = 300, N = 40
    assert v.shape == ((300, 40) if transpose else (40, 300))
    assert caffe_fans(v.shape) == ((40, 300) if transpose else (300, 40))
    check_scale(kind, v, caffe_n(v.shape, norm))


def test_layer_errors_name_the_layer():
    text = ('name: "ip7" type: "InnerProduct" inner_product_param { num_output: 4 '
            'weight_filler { type: "gaussian" std: 0 } }')
    with pytest.raises(ValueError, match="ip7.*std"):
        layer_weight(text, (2, 3))
