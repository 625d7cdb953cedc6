"""Crop: Caffe's axis and offset rules against an element-by-element reference, gradient
checks, the backward's zeros, declarations, errors, GPU."""
import itertools

import numpy as np
import pytest

from minicaffe.backend import to_numpy
from minicaffe.blob import Blob
from minicaffe.testing.gradient_check import check_gradient, make_blob, make_layer


def crop_text(body="", name="crop"):
    return f'name: "{name}" type: "Crop" crop_param {{ {body} }}'


def setup(layer, x_shape, ref_shape, rng, xp=np, dtype=np.float64):
    x = rng.standard_normal(x_shape)
    bottom = [make_blob(x, xp=xp, dtype=dtype, name="x"),
              make_blob(np.zeros(ref_shape), xp=xp, dtype=dtype, name="ref")]
    top = [Blob(xp=xp, dtype=dtype, name="y")]
    layer.setup(bottom, top)
    return x, bottom, top


def reference(x, ref_shape, start, offsets):
    """Caffe's crop_copy, one element at a time: top[i] = bottom0[i + offset] on the axes
    from ``start`` on (sizes from bottom 1), whole axes before."""
    shape = tuple(x.shape[i] if i < start else ref_shape[i] for i in range(x.ndim))
    out = np.empty(shape)
    for idx in itertools.product(*(range(s) for s in shape)):
        out[idx] = x[tuple(i + o for i, o in zip(idx, offsets))]
    return out


# name: (crop_param body, bottom 0 shape, bottom 1 shape, first cropped axis, offsets per axis)
CASES = {
    "default_axis_no_offset": ("", (2, 3, 7, 6), (1, 1, 4, 5), 2, (0, 0, 0, 0)),
    "fcn32s": ("axis: 2 offset: 19", (1, 2, 44, 45), (1, 3, 24, 25), 2, (0, 0, 19, 19)),
    "one_offset_all_axes": ("axis: 1 offset: 1", (2, 4, 5, 6), (9, 2, 3, 4), 1, (0, 1, 1, 1)),
    "offset_per_axis": ("axis: 1 offset: 0 offset: 2 offset: 1", (2, 4, 5, 6), (2, 3, 3, 4), 1,
                        (0, 0, 2, 1)),
    "axis_zero": ("axis: 0 offset: 1 offset: 0 offset: 2 offset: 3", (3, 2, 5, 6), (2, 2, 2, 3),
                  0, (1, 0, 2, 3)),
    "negative_axis": ("axis: -1 offset: 2", (2, 3, 4, 7), (1, 1, 1, 3), 3, (0, 0, 0, 2)),
    "negative_axis_two": ("axis: -2 offset: 1 offset: 3", (2, 3, 5, 7), (5, 5, 3, 4), 2,
                          (0, 0, 1, 3)),
    "three_axes": ("axis: 1 offset: 1", (4, 6, 5), (1, 3, 2), 1, (0, 1, 1)),
    "no_crop": ("", (2, 3, 4, 4), (2, 3, 4, 4), 2, (0, 0, 0, 0)),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_forward_matches_reference(case, rng):
    body, xs, rs, start, offsets = CASES[case]
    layer = make_layer(crop_text(body))
    x, bottom, top = setup(layer, xs, rs, rng)
    layer.forward(bottom, top)
    assert layer.start_axis == start and layer.offsets == offsets
    np.testing.assert_array_equal(top[0].data, reference(x, rs, start, offsets))


@pytest.mark.parametrize("case", sorted(CASES))
def test_gradient(case, rng):
    body, xs, rs, _, _ = CASES[case]
    layer = make_layer(crop_text(body))
    bottom = [make_blob(rng.standard_normal(xs)), make_blob(rng.standard_normal(rs))]
    # both bottoms: bottom 1's gradient is zero (only its shape is read)
    check_gradient(layer, bottom)


def test_backward_overwrites_with_zeros_outside_the_window(rng):
    layer = make_layer(crop_text("axis: 2 offset: 1 offset: 2"))
    _, bottom, top = setup(layer, (2, 3, 6, 7), (1, 1, 3, 4), rng)
    layer.forward(bottom, top)
    dy = rng.standard_normal(top[0].shape)
    top[0].diff[...] = dy
    bottom[0].diff[...] = np.nan       # overwritten, never accumulated
    bottom[1].diff[...] = np.nan
    layer.backward(top, [True, True], bottom)
    want = np.zeros((2, 3, 6, 7))
    want[:, :, 1:4, 2:6] = dy
    np.testing.assert_array_equal(bottom[0].diff, want)
    assert not bottom[1].diff.any()     # no gradient for the shape-giving bottom
    # without propagate_down a bottom's diff is left alone
    bottom[0].diff[...] = 5
    bottom[1].diff[...] = 7
    layer.backward(top, [False, False], bottom)
    assert (bottom[0].diff == 5).all() and (bottom[1].diff == 7).all()


def test_reshape_follows_the_bottoms(rng):
    layer = make_layer(crop_text("offset: 1"))
    _, bottom, top = setup(layer, (2, 3, 8, 8), (1, 1, 5, 5), rng)
    assert top[0].shape == (2, 3, 5, 5)
    bottom[0].reshape(4, 3, 10, 9)
    bottom[1].reshape(1, 1, 7, 6)
    layer.reshape(bottom, top)
    assert top[0].shape == (4, 3, 7, 6)
    bottom[0].data[...] = rng.standard_normal(bottom[0].shape)
    layer.forward(bottom, top)
    np.testing.assert_array_equal(top[0].data, bottom[0].data[:, :, 1:8, 1:7])


def test_declarations(rng):
    layer = make_layer(crop_text("offset: 1"))
    _, bottom, top = setup(layer, (2, 3, 8, 8), (1, 1, 5, 5), rng)
    reads = layer.backward_reads()
    assert reads.bottom == () and reads.top == () and reads.internals == ()
    assert layer.internals == {} and layer.blobs == []
    # copies: the window forward; backward zeroes the bottom's diff and copies the window
    assert layer.flops(bottom, top) == (2 * 3 * 5 * 5.0, 2 * 3 * 8 * 8.0 + 2 * 3 * 5 * 5.0)


# --------------------------------------------------------------- errors
@pytest.mark.parametrize("body,xs,rs,message", [
    ("axis: 4", (2, 3, 4, 4), (2, 3, 2, 2), "crop axis 4 out of range"),
    ("axis: -5", (2, 3, 4, 4), (2, 3, 2, 2), "crop axis -5 out of range"),
    ("axis: 2 offset: 1 offset: 1 offset: 1", (2, 3, 4, 4), (2, 3, 2, 2),
     "number of offset values specified must be equal"),
    ("axis: 1 offset: 1 offset: 1", (2, 3, 4, 4), (2, 3, 2, 2),
     "number of offset values specified must be equal"),
    ("offset: 3", (2, 3, 4, 4), (2, 3, 2, 2), "dimension 2 is out-of-bounds with size 2"),
    ("", (2, 3, 4, 4), (2, 3, 5, 2), "dimension 2 is out-of-bounds with size 5"),
    ("offset: 0 offset: 2", (2, 3, 4, 4), (2, 3, 2, 3), "dimension 3 is out-of-bounds"),
    ("", (2, 3, 4, 4), (4, 4), "fewer axes"),
])
def test_bad_params_raise_clear_errors(body, xs, rs, message, rng):
    layer = make_layer(crop_text(body, name="bad"))
    with pytest.raises(ValueError, match=message) as err:
        setup(layer, xs, rs, rng)
    assert "'bad' (Crop)" in str(err.value)


def test_needs_two_bottoms_and_no_in_place(rng):
    layer = make_layer(crop_text(name="bad"))
    with pytest.raises(ValueError, match="exactly 2 bottom"):
        layer.setup([make_blob(np.zeros((1, 1, 2, 2)))], [Blob(dtype=np.float64)])
    layer = make_layer(crop_text(name="bad"))
    x = make_blob(np.zeros((1, 1, 4, 4)))
    with pytest.raises(ValueError, match="in-place"):
        layer.setup([x, make_blob(np.zeros((1, 1, 2, 2)))], [x])


def test_net_reports_the_layer_and_bottoms():
    from minicaffe.net import TEST, Net
    from minicaffe.proto import caffe_pb2, parse_text
    text = """
    name: "c"
    layer { name: "data" type: "Input" top: "a" top: "b"
            input_param { shape { dim: 1 dim: 2 dim: 4 dim: 4 } shape { dim: 1 dim: 2 dim: 6 dim: 6 } } }
    layer { name: "cut" type: "Crop" bottom: "a" bottom: "b" top: "c" }
    """
    with pytest.raises(ValueError, match=r"layer 'cut' \(type Crop, bottoms: a \(1, 2, 4, 4\)"):
        Net(parse_text(text, caffe_pb2.NetParameter), TEST)


# ------------------------------------------------------------------ GPU
@pytest.mark.gpu
@pytest.mark.parametrize("case", sorted(CASES))
def test_gpu_matches_numpy(cp, case, rng):
    body, xs, rs, _, _ = CASES[case]
    cpu, gpu = make_layer(crop_text(body)), make_layer(crop_text(body), xp=cp, dtype=np.float32)
    x, cb, ct = setup(cpu, xs, rs, rng, dtype=np.float32)
    gb = [make_blob(x, xp=cp, dtype=np.float32), make_blob(np.zeros(rs), xp=cp, dtype=np.float32)]
    gt = [Blob(xp=cp, dtype=np.float32)]
    gpu.setup(gb, gt)
    cpu.forward(cb, ct)
    gpu.forward(gb, gt)
    dy = rng.standard_normal(ct[0].shape).astype(np.float32)
    ct[0].diff[...] = dy
    gt[0].diff[...] = cp.asarray(dy)
    gb[0].diff[...] = cp.nan
    gb[1].diff[...] = cp.nan
    cpu.backward(ct, [True, True], cb)
    gpu.backward(gt, [True, True], gb)
    for g, c in [(gt[0].data, ct[0].data), (gb[0].diff, cb[0].diff), (gb[1].diff, cb[1].diff)]:
        np.testing.assert_array_equal(to_numpy(g), c)
