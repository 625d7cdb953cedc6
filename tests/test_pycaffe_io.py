"""pycaffe's caffe.io image helpers (python/caffe/io.py in BVLC Caffe):
Transformer, load_image, resize_image, oversample."""
import numpy as np
import pytest

import minicaffe as caffe
from minicaffe.io import Transformer, center_crop_bounds, load_image, oversample, resize_image

Image = pytest.importorskip("PIL.Image")


def rgb_image(h=4, w=5, seed=0):
    return np.random.default_rng(seed).random((h, w, 3)).astype(np.float32)


# -------------------------------------------------------------- Transformer
def imagenet_style_transformer(shape=(2, 3, 4, 5)):
    t = Transformer({"data": shape})
    t.set_transpose("data", (2, 0, 1))
    t.set_channel_swap("data", (2, 1, 0))
    t.set_raw_scale("data", 255.0)
    t.set_mean("data", np.array([104.0, 117.0, 123.0]))
    t.set_input_scale("data", 0.5)
    return t


def test_caffe_io_is_reachable_as_in_pycaffe():
    assert caffe.io.Transformer is Transformer
    assert caffe.io.load_image is load_image


def test_preprocess_order_of_operations():
    t = imagenet_style_transformer()
    img = rgb_image()
    out = t.preprocess("data", img)
    # transpose, RGB -> BGR, x255, minus the mean, x0.5 (pycaffe's order)
    chw = img.transpose(2, 0, 1)[[2, 1, 0]]
    expected = (chw * 255.0 - np.array([104.0, 117.0, 123.0])[:, None, None]) * 0.5
    assert out.dtype == np.float32 and out.shape == (3, 4, 5)
    np.testing.assert_allclose(out, expected, rtol=1e-6, atol=1e-4)


@pytest.mark.parametrize("batched", [False, True])
def test_preprocess_then_deprocess_round_trips(batched):
    t = imagenet_style_transformer()
    img = rgb_image()
    data = t.preprocess("data", img)
    back = t.deprocess("data", data[np.newaxis] if batched else data)
    assert back.shape == img.shape
    np.testing.assert_allclose(back, img, atol=1e-5)


def test_round_trip_full_mean_image_and_one_channel():
    rng = np.random.default_rng(1)
    t = Transformer({"data": (1, 3, 4, 5)})
    t.set_transpose("data", (2, 0, 1))
    mean = rng.random((3, 4, 5))
    t.set_mean("data", mean)
    img = rgb_image()
    np.testing.assert_allclose(t.preprocess("data", img), img.transpose(2, 0, 1) - mean,
                               rtol=1e-6, atol=1e-6)
    np.testing.assert_allclose(t.deprocess("data", t.preprocess("data", img)), img, atol=1e-6)
    # one channel: an (H, W) mean; deprocess keeps the channel axis of length 1
    g = Transformer({"gray": (1, 1, 4, 5)})
    g.set_transpose("gray", (2, 0, 1))
    g.set_mean("gray", mean[0])
    gray = img[:, :, :1]
    data = g.preprocess("gray", gray)
    np.testing.assert_allclose(data[0], gray[:, :, 0] - mean[0], rtol=1e-6, atol=1e-6)
    np.testing.assert_allclose(g.deprocess("gray", data[np.newaxis]), gray, atol=1e-6)


def test_each_setting_alone():
    img = rgb_image()
    t = Transformer({"data": (1, 3, 4, 5)})
    np.testing.assert_array_equal(t.preprocess("data", img), img)  # nothing set: as given
    t.set_transpose("data", (2, 0, 1))
    np.testing.assert_array_equal(t.preprocess("data", img), img.transpose(2, 0, 1))
    t.set_channel_swap("data", (2, 0, 1))  # channel k of the result is channel order[k]
    np.testing.assert_array_equal(t.preprocess("data", img), img.transpose(2, 0, 1)[[2, 0, 1]])
    t = Transformer({"data": (1, 3, 1, 1)})
    px = np.ones((1, 1, 3), np.float32)
    t.set_transpose("data", (2, 0, 1))
    t.set_raw_scale("data", 255.0)
    t.set_mean("data", np.array([128.0, 0.0, 55.0]))
    # raw_scale comes before the mean: 1 * 255 - 128
    np.testing.assert_allclose(t.preprocess("data", px).ravel(), [127.0, 255.0, 200.0])
    t.set_input_scale("data", 0.1)  # input_scale after it
    np.testing.assert_allclose(t.preprocess("data", px).ravel(), [12.7, 25.5, 20.0], rtol=1e-6)


def test_preprocess_resizes_to_the_input_and_leaves_the_caller_array_alone():
    t = imagenet_style_transformer()
    big = rgb_image(8, 10, seed=3)
    kept = big.copy()
    out = t.preprocess("data", big)
    assert out.shape == (3, 4, 5)
    np.testing.assert_array_equal(big, kept)
    np.testing.assert_allclose(out, t.preprocess("data", resize_image(big, (4, 5))), atol=1e-4)
    same = rgb_image(4, 5)
    kept = same.copy()
    t.preprocess("data", same)  # float32 of the input's size: pycaffe would scale it in place
    np.testing.assert_array_equal(same, kept)


def test_transformer_errors():
    t = Transformer({"data": (1, 3, 4, 5)})
    with pytest.raises(ValueError, match="not one of the net inputs"):
        t.set_raw_scale("label", 2.0)
    with pytest.raises(ValueError, match="not one of the net inputs"):
        t.preprocess("label", rgb_image())
    with pytest.raises(ValueError, match="transpose order"):
        t.set_transpose("data", (1, 0))
    with pytest.raises(ValueError, match="channel swap"):
        t.set_channel_swap("data", (1, 0))
    with pytest.raises(ValueError, match="mean channels incompatible"):
        t.set_mean("data", np.zeros(4))
    with pytest.raises(ValueError, match="mean shape .* invalid"):
        t.set_mean("data", np.zeros((1, 3, 4, 5)))
    with pytest.raises(ValueError, match="incompatible with input shape"):
        t.set_mean("data", np.zeros((3, 8, 8)))
    with pytest.raises(ValueError, match="incompatible with input shape"):
        t.set_mean("data", np.zeros((4, 5)))  # an (H, W) mean is for one channel


# --------------------------------------------------------------- load_image
def save(tmp_path, name, arr):
    path = str(tmp_path / name)
    Image.fromarray(arr).save(path)
    return path


def test_load_image_color_file(tmp_path):
    rgb = np.random.default_rng(0).integers(0, 256, (4, 6, 3), dtype=np.uint8)
    rgb[0, 0] = (255, 0, 0)
    path = save(tmp_path, "c.png", rgb)
    img = load_image(path)
    assert img.dtype == np.float32 and img.shape == (4, 6, 3)
    np.testing.assert_array_equal(img, (rgb / 255.0).astype(np.float32))
    np.testing.assert_array_equal(img[0, 0], [1.0, 0.0, 0.0])  # RGB order, as skimage
    # color=False reads it grey, as pycaffe's imread(as_grey=True) (skimage's rgb2gray)
    grey = load_image(path, color=False)
    assert grey.shape == (4, 6, 1) and grey.dtype == np.float32
    want = (rgb / 255.0) @ np.array([0.2125, 0.7154, 0.0721])
    np.testing.assert_allclose(grey[:, :, 0], want, rtol=1e-6)
    assert grey[0, 0, 0] == pytest.approx(0.2125)


def test_load_image_gray_file(tmp_path):
    gray = np.arange(20, dtype=np.uint8).reshape(4, 5) * 12
    path = save(tmp_path, "g.png", gray)
    color = load_image(path)
    assert color.shape == (4, 5, 3)
    for c in range(3):
        np.testing.assert_array_equal(color[:, :, c], (gray / 255.0).astype(np.float32))
    single = load_image(path, color=False)
    assert single.shape == (4, 5, 1) and single.dtype == np.float32
    np.testing.assert_array_equal(single[:, :, 0], (gray / 255.0).astype(np.float32))


def test_load_image_drops_alpha_and_reads_16_bit(tmp_path):
    rgba = np.random.default_rng(2).integers(0, 256, (3, 4, 4), dtype=np.uint8)
    img = load_image(save(tmp_path, "a.png", rgba))
    np.testing.assert_array_equal(img, (rgba[:, :, :3] / 255.0).astype(np.float32))
    deep = (np.arange(12, dtype=np.uint16).reshape(3, 4) * 5000)
    path = str(tmp_path / "d.png")
    Image.fromarray(deep).save(path)
    np.testing.assert_allclose(load_image(path, color=False)[:, :, 0], deep / 65535.0,
                               rtol=1e-6)


# ------------------------------------------------------------- resize_image
def test_resize_bilinear_by_hand():
    # (pycaffe's own call is mode='constant': test_resize_matches_pycaffe_with_skimage)
    # a linear ramp x[i, j] = 2i + j + 5, 2x2 -> 4x4; output positions (o + 0.5)/2 - 0.5 =
    # -0.25, 0.25, 0.75, 1.25; 'reflect' reads x[-1] = x[1] and x[2] = x[0], so each axis of
    # [a, b] gives [.75a + .25b, .75a + .25b, .25a + .75b, .25a + .75b]
    im = (2 * np.arange(2)[:, None] + np.arange(2)[None, :] + 5.0)[:, :, None]
    out = resize_image(im, (4, 4), mode="reflect")
    rows = 2 * np.array([0.25, 0.25, 0.75, 0.75])
    cols = np.array([0.25, 0.25, 0.75, 0.75])
    assert out.shape == (4, 4, 1) and out.dtype == np.float32
    np.testing.assert_allclose(out[:, :, 0], rows[:, None] + cols[None, :] + 5.0, rtol=1e-6)
    # 'edge' clamps instead: [a, .75a + .25b, .25a + .75b, b]
    edge = resize_image(im, (4, 4), mode="edge")
    ramp = np.array([0.0, 0.25, 0.75, 1.0])
    np.testing.assert_allclose(edge[:, :, 0], 2 * ramp[:, None] + ramp[None, :] + 5.0, rtol=1e-6)


def test_resize_shrink_with_and_without_anti_aliasing():
    im = np.tile(np.array([0.0, 1.0, 2.0, 3.0])[None, :, None], (2, 1, 3))
    # no blur: positions (o + 0.5) * 2 - 0.5 = 0.5, 2.5: pair averages
    plain = resize_image(im, (2, 2), mode="reflect", anti_aliasing=False)
    np.testing.assert_allclose(plain[0, :, 0], [0.5, 2.5], rtol=1e-6)
    # skimage's default blurs first (sigma (4/2 - 1)/2 = 0.5 along the shrunk axis only)
    blurred = resize_image(im, (2, 2), mode="reflect")
    taps = np.exp(-0.5 * (np.arange(-2, 3) / 0.5) ** 2)
    taps /= taps.sum()
    padded = np.array([2, 1, 0, 1, 2, 3, 2, 1], float)  # 'reflect' padding by 2
    smooth = np.convolve(padded, taps, mode="valid")
    np.testing.assert_allclose(blurred[0, :, 0], [smooth[0:2].mean(), smooth[2:4].mean()],
                               rtol=1e-6)


def test_resize_nearest_and_constant_image():
    im = np.array([[0.0, 9.0]])[:, :, None]   # (1, 2, 1)
    out = resize_image(im, (1, 4), interp_order=0)
    np.testing.assert_array_equal(out[0, :, 0], [0.0, 0.0, 9.0, 9.0])
    flat = np.full((3, 3, 3), 7.5)
    out = resize_image(flat, (5, 2))
    assert out.shape == (5, 2, 3) and out.dtype == np.float32
    np.testing.assert_array_equal(out, 7.5)


def test_resize_other_channel_counts_align_corners():
    # pycaffe gives K not in {1, 3} to scipy.ndimage.zoom: corner pixels stay put
    im = np.stack([np.arange(3.0), 10 * np.arange(3.0)], axis=-1)[None]  # (1, 3, 2)
    out = resize_image(im, (1, 5))
    np.testing.assert_allclose(out[0, :, 0], [0, 0.5, 1, 1.5, 2])
    np.testing.assert_allclose(out[0, :, 1], [0, 5, 10, 15, 20])


def test_resize_errors():
    with pytest.raises(ValueError, match="interp_order 3"):
        resize_image(rgb_image(), (2, 2), interp_order=3)
    with pytest.raises(ValueError, match=r"\(H, W, K\)"):
        resize_image(np.zeros((4, 4)), (2, 2))
    with pytest.raises(ValueError, match="unknown mode"):
        resize_image(rgb_image(), (2, 2), mode="wrap")


@pytest.mark.parametrize("shape", [(7, 5, 3), (8, 8, 1), (13, 9, 3), (4, 6, 3)])
@pytest.mark.parametrize("dims", [(11, 3), (4, 4), (3, 9), (20, 20), (1, 1)])
@pytest.mark.parametrize("order", [0, 1])
def test_resize_matches_pycaffe_with_skimage(shape, dims, order):
    sk = pytest.importorskip("skimage.transform")
    im = np.random.default_rng(0).random(shape).astype(np.float32) * 200 - 50
    # pycaffe's resize_image, as written there (upstream passes mode='constant')
    lo, hi = im.min(), im.max()
    ref = sk.resize((im - lo) / (hi - lo), dims, order=order, mode="constant") * (hi - lo) + lo
    np.testing.assert_allclose(resize_image(im, dims, order), ref.astype(np.float32),
                               atol=1e-3)
    for mode in ("reflect", "edge", "symmetric"):
        got = resize_image(im, dims, order, mode=mode, anti_aliasing=False)
        ref = sk.resize((im - lo) / (hi - lo), dims, order=order, mode=mode,
                        anti_aliasing=False) * (hi - lo) + lo
        np.testing.assert_allclose(got, ref.astype(np.float32), atol=1e-3)


# --------------------------------------------------------------- oversample
def test_oversample_positions_and_order():
    im = np.arange(5 * 6 * 2, dtype=np.float32).reshape(5, 6, 2)
    other = -im
    crops = oversample([im, other], (3, 4))
    assert crops.shape == (20, 3, 4, 2) and crops.dtype == np.float32
    # corners TL, TR, BL, BR; the centre (5/2 - 3/2 = 1, 6/2 - 4/2 = 1); then their mirrors
    boxes = [(0, 0), (0, 2), (2, 0), (2, 2), (1, 1)]
    for n, src in enumerate((im, other)):
        for k, (y, x) in enumerate(boxes):
            np.testing.assert_array_equal(crops[10 * n + k], src[y:y + 3, x:x + 4])
            np.testing.assert_array_equal(crops[10 * n + 5 + k], src[y:y + 3, x:x + 4][:, ::-1])
    # a 4-d array of images works too
    np.testing.assert_array_equal(oversample(np.stack([im, other]), (3, 4)), crops)


def test_center_crop_bounds_and_oversample_errors():
    # pycaffe truncates centre +- half crop: the crop keeps its size for odd and even sizes
    for size in range(4, 10):
        for crop in range(1, size + 1):
            ((y0, y1),) = center_crop_bounds((size,), (crop,))
            assert y1 - y0 == crop and 0 <= y0 and y1 <= size
    assert center_crop_bounds((256, 256), (227, 227)) == ((14, 241), (14, 241))
    with pytest.raises(ValueError, match="larger than the image"):
        oversample([np.zeros((4, 4, 3))], (5, 4))
    with pytest.raises(ValueError, match="image 1 has shape"):
        oversample([np.zeros((4, 4, 3)), np.zeros((5, 4, 3))], (2, 2))


def test_load_image_palette_and_gray_alpha(tmp_path):
    rgb = np.random.default_rng(4).integers(0, 256, (3, 4, 3), dtype=np.uint8)
    path = str(tmp_path / "p.png")
    Image.fromarray(rgb).convert("P", palette=Image.Palette.ADAPTIVE, colors=8).save(path)
    with Image.open(path) as p:
        expected = np.asarray(p.convert("RGB")) / 255.0
    np.testing.assert_array_equal(load_image(path), expected.astype(np.float32))
    # grey with alpha: the alpha is dropped and the grey kept (imageio would give 2 channels)
    la = np.stack([np.full((3, 4), 51, np.uint8), np.zeros((3, 4), np.uint8)], axis=-1)
    path = str(tmp_path / "la.png")
    Image.fromarray(la).save(path)  # (H, W, 2) uint8: mode LA
    np.testing.assert_allclose(load_image(path, color=False), np.full((3, 4, 1), 0.2), rtol=1e-6)
