"""Layers against the hand-written values of BVLC Caffe's unit tests.

* ``src/caffe/test/test_pooling_layer.cpp``: TestSetup, TestSetupPadded, the MAX
  forwards of a 2x2 square, a 3x2 and a 2x3 window over MATLAB's magic(6) with their
  index tops (TestForwardMax, TestForwardMaxTopMask, TestForwardMaxRectHigh/Wide via
  TestForwardSquare/RectHigh/RectWide), TestForwardMaxPadded and TestForwardAve.
* ``src/caffe/test/test_softmax_with_loss_layer.cpp``: TestForwardIgnoreLabel (with
  ``normalize: false``, ignoring each of the 5 labels in turn sums to 4 times the loss
  that ignores none).
"""
import numpy as np
import pytest

import minicaffe.layers  # noqa: F401  (registers the layer types)
from minicaffe.blob import Blob
from minicaffe.testing.gradient_check import make_blob, make_layer


def forward(text, x, n_top=1, bottoms=()):
    bottom = [make_blob(x, name="in")] + [make_blob(b, name=f"in{i}")
                                          for i, b in enumerate(bottoms, 1)]
    top = [Blob(dtype=np.float64, name=f"out{i}") for i in range(n_top)]
    layer = make_layer(text)
    layer.setup(bottom, top)
    layer.forward(bottom, top)
    return [t.data.copy() for t in top]


def pool(body):
    return f'name: "pool" type: "Pooling" pooling_param {{ {body} }}'


def tiled(image, num=2, channels=2):
    """The fixture's num x channels copies of one image."""
    return np.broadcast_to(np.asarray(image, np.float64), (num, channels) + np.shape(image))


@pytest.mark.parametrize("body, shape", [
    ("kernel_size: 3 stride: 2", (2, 3, 3, 2)),                   # TestSetup
    ("kernel_size: 3 stride: 2 pad: 1 pool: AVE", (2, 3, 4, 3)),  # TestSetupPadded
])
def test_setup_shapes(body, shape):
    x = np.random.default_rng(0).standard_normal((2, 3, 6, 5))
    assert forward(pool(body), x)[0].shape == shape


SQUARE_IN = [[1, 2, 5, 2, 3],
             [9, 4, 1, 4, 8],
             [1, 2, 5, 2, 3]]
MAGIC6 = [[35, 1, 6, 26, 19, 24],
          [3, 32, 7, 21, 23, 25],
          [31, 9, 2, 22, 27, 20],
          [8, 28, 33, 17, 10, 15],
          [30, 5, 34, 12, 14, 16],
          [4, 36, 29, 13, 18, 11]]

MAX_CASES = {
    "square": ("kernel_size: 2", SQUARE_IN,
               [[9, 5, 5, 8],
                [9, 5, 5, 8]],
               [[5, 2, 2, 9],
                [5, 12, 12, 9]]),
    "rect_high": ("kernel_h: 3 kernel_w: 2", MAGIC6,
                  [[35, 32, 26, 27, 27],
                   [32, 33, 33, 27, 27],
                   [31, 34, 34, 27, 27],
                   [36, 36, 34, 18, 18]],
                  [[0, 7, 3, 16, 16],
                   [7, 20, 20, 16, 16],
                   [12, 26, 26, 16, 16],
                   [31, 31, 26, 34, 34]]),
    "rect_wide": ("kernel_h: 2 kernel_w: 3", MAGIC6,
                  [[35, 32, 26, 26],
                   [32, 32, 27, 27],
                   [33, 33, 33, 27],
                   [34, 34, 34, 17],
                   [36, 36, 34, 18]],
                  [[0, 7, 3, 3],
                   [7, 7, 16, 16],
                   [20, 20, 20, 16],
                   [26, 26, 26, 21],
                   [31, 31, 26, 34]]),
}


@pytest.mark.parametrize("n_top", [1, 2], ids=["top", "top_mask"])
@pytest.mark.parametrize("case", sorted(MAX_CASES))
def test_max_forward_hand_values(case, n_top):
    kernel, image, want, mask = MAX_CASES[case]
    tops = forward(pool(f"{kernel} pool: MAX"), tiled(image), n_top=n_top)
    np.testing.assert_array_equal(tops[0], tiled(want))
    if n_top == 2:     # the flat index h * W + w of each maximum within its channel
        np.testing.assert_array_equal(tops[1], tiled(mask))


def test_max_padded():
    """TestForwardMaxPadded: kernel 3, stride 2, pad 2 over a 3x3 image gives 3x3."""
    x = np.array([[[[1, 2, 4], [2, 3, 2], [4, 2, 1]]]], np.float64)
    top = forward(pool("kernel_size: 3 stride: 2 pad: 2 pool: MAX"), x)[0]
    np.testing.assert_array_equal(top[0, 0], [[1, 4, 4], [4, 4, 4], [4, 4, 1]])


def test_ave_padded_divides_by_the_padded_window():
    """TestForwardAve: kernel 3, stride 1, pad 1 over a 3x3 image of 2s: every window
    divides by 9, the padding counted."""
    x = np.full((1, 1, 3, 3), 2.0)
    top = forward(pool("kernel_size: 3 stride: 1 pad: 1 pool: AVE"), x)[0]
    e, s = 8.0 / 9, 4.0 / 3
    np.testing.assert_allclose(top[0, 0], [[e, s, e], [s, 2, s], [e, s, e]], rtol=1e-12)


# ------------------------------------------------------------------ SoftmaxWithLoss
def test_softmax_loss_ignoring_each_label_in_turn_sums_to_four_times_the_loss():
    rng = np.random.default_rng(1701)
    x = rng.standard_normal((10, 5, 2, 3))
    label = rng.integers(0, 5, size=(10, 1, 2, 3)).astype(np.float64)
    text = ('name: "loss" type: "SoftmaxWithLoss" loss_param {{ normalize: false {} }}')
    full = forward(text.format(""), x, bottoms=[label])[0]
    ignored = sum(forward(text.format(f"ignore_label: {k}"), x, bottoms=[label])[0]
                  for k in range(5))
    np.testing.assert_allclose(ignored, 4 * full, rtol=1e-12)
