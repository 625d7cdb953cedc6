"""ImageData: image files named in a list file, as BVLC Caffe's ImageDataLayer.

The images are small PNGs written with Pillow; what the layer must give is
computed from the pixels written (OpenCV's BGR order, Caffe's list order,
wrap-around and shuffles), from minicaffe's DataTransformer applied directly,
and, for resizing, from a NumPy reference of OpenCV's INTER_LINEAR."""
import gc

import numpy as np
import pytest

from minicaffe import io as mio
from minicaffe.backend import to_numpy
from minicaffe.blob import Blob
from minicaffe.proto import caffe_pb2, parse_text
from minicaffe.rng import set_random_seed
from minicaffe.testing import make_layer, sgd_solver, train_steps
from minicaffe.tools.convert_imageset import load_image
from minicaffe.transform import TEST, TRAIN, DataTransformer

Image = pytest.importorskip("PIL.Image")

H, W = 4, 5
N_COLOR = 5


def tops(n=2, xp=np, dtype=np.float32):
    return [Blob(xp=xp, dtype=dtype, name=f"top{i}") for i in range(n)]


def setup_layer(text, phase=None, xp=np, dtype=np.float32, source_dir=None):
    layer = make_layer(text, xp=xp, dtype=dtype, phase=phase)
    if source_dir is not None:
        layer.source_dir = source_dir
    t = tops(2, xp, dtype)
    layer.setup([], t)
    return layer, t


def image_text(source, batch=4, extra="", transform="", prefetch=None, root=""):
    pf = f"data_param {{ prefetch: {prefetch} }}" if prefetch is not None else ""
    rf = f'root_folder: "{root}"' if root else ""
    return (f'name: "data" type: "ImageData" top: "data" top: "label" '
            f'image_data_param {{ source: "{source}" batch_size: {batch} {rf} {extra} }} '
            f"transform_param {{ {transform} }} {pf}")


def bgr(rgb):
    """(H, W, 3) RGB as written -> (3, H, W) in OpenCV's BGR order."""
    return np.ascontiguousarray(rgb[:, :, ::-1].transpose(2, 0, 1))


# every test here ends with no prefetch thread left (tests/layers/conftest.py)
pytestmark = pytest.mark.usefixtures("no_leftover_prefetch_threads")


@pytest.fixture
def images(tmp_path):
    """Five colour PNGs and one grey PNG, all H x W, under tmp_path/imgs (one in a folder
    whose name has a space), listed in list.txt with labels 10..15.

    Returns (root folder with a trailing slash, list path, expected (6, 3, H, W) BGR
    arrays, the grey image (H, W), the colour images as written (5, H, W, 3) RGB)."""
    rng = np.random.default_rng(0)
    root = tmp_path / "imgs"
    (root / "sub dir").mkdir(parents=True)
    rgb = rng.integers(0, 256, (N_COLOR, H, W, 3), dtype=np.uint8)
    gray = rng.integers(0, 256, (H, W), dtype=np.uint8)
    names = [f"c{i}.png" for i in range(N_COLOR)] + ["g.png"]
    names[2] = "sub dir/c 2.png"  # spaces in the folder and the file name
    for name, im in zip(names[:N_COLOR], rgb):
        Image.fromarray(im, "RGB").save(root / name)
    Image.fromarray(gray, "L").save(root / names[-1])
    listfile = tmp_path / "list.txt"
    listfile.write_text("".join(f"{n} {10 + i}\n" for i, n in enumerate(names)))
    expect = np.stack([bgr(im) for im in rgb] + [np.repeat(gray[np.newaxis], 3, axis=0)])
    return str(root) + "/", str(listfile), expect, gray, rgb


def run(layer, t, n):
    out = []
    for _ in range(n):
        layer.forward([], t)
        out.append((to_numpy(t[0].data).copy(), to_numpy(t[1].data).copy()))
    return out


# ------------------------------------------------------------ reading order
@pytest.mark.parametrize("prefetch", [0, 4, 1])
def test_bgr_labels_and_wrap_around(images, prefetch):
    root, listfile, expect, _, rgb = images
    layer, t = setup_layer(image_text(listfile, batch=4, prefetch=prefetch, root=root))
    assert t[0].shape == (4, 3, H, W) and t[1].shape == (4,)
    # Caffe goes back to the start of the list after its last line
    for idx in ([0, 1, 2, 3], [4, 5, 0, 1], [2, 3, 4, 5]):
        layer.forward([], t)
        np.testing.assert_array_equal(t[1].data, np.array(idx) + 10)
        np.testing.assert_array_equal(t[0].data, expect[idx].astype(np.float32))
    # channel 0 is blue, channel 2 red, as OpenCV's imread gives them
    np.testing.assert_array_equal(t[0].data[0, 0], rgb[2, :, :, 2])
    np.testing.assert_array_equal(t[0].data[0, 2], rgb[2, :, :, 0])
    layer.close()


def test_rand_skip_draws_from_the_seed(images):
    root, listfile, expect, _, _ = images
    set_random_seed(9)
    skip = int(np.random.default_rng(9).integers(0, 5))
    layer, t = setup_layer(image_text(listfile, batch=2, extra="rand_skip: 5", root=root))
    layer.forward([], t)
    np.testing.assert_array_equal(t[1].data, [10 + skip, 10 + (skip + 1) % 6])
    np.testing.assert_array_equal(t[0].data[0], expect[skip])
    layer.close()
    # a skip past the end of the list is an error (Caffe: "Not enough points to skip")
    seed = next(s for s in range(100) if np.random.default_rng(s).integers(0, 1000) >= 6)
    set_random_seed(seed)
    with pytest.raises(ValueError, match=r"layer 'data' \(ImageData\): not enough points to skip"):
        make_layer(image_text(listfile, extra="rand_skip: 1000", root=root)).setup([], tops())


def shuffled_orders(seed, n, epochs):
    """Caffe's shuffle: a seed from the process RNG, one shuffle at setup and one after each
    pass over the list, each shuffling the previous order in place."""
    g = np.random.default_rng(int(np.random.default_rng(seed).integers(0, 2**63 - 1)))
    order = np.arange(n)
    orders = []
    for _ in range(epochs):
        g.shuffle(order)
        orders.append(order.copy())
    return orders


def test_shuffle_is_seeded_reshuffles_each_epoch_and_ignores_prefetch(images):
    root, listfile, expect, _, _ = images
    runs = []
    for prefetch in (4, 0):
        set_random_seed(5)
        layer, t = setup_layer(image_text(listfile, batch=3, extra="shuffle: true",
                                          prefetch=prefetch, root=root))
        runs.append(run(layer, t, 4))
        layer.close()
    for (d0, l0), (d1, l1) in zip(*runs):
        np.testing.assert_array_equal(d0, d1)
        np.testing.assert_array_equal(l0, l1)
    labels = np.concatenate([lab for _, lab in runs[0]]).astype(int) - 10
    data = np.concatenate([d for d, _ in runs[0]])
    np.testing.assert_array_equal(labels, np.concatenate(shuffled_orders(5, 6, 2)))
    np.testing.assert_array_equal(data, expect[labels].astype(np.float32))
    assert not np.array_equal(labels[:6], labels[6:])  # a new order for the second epoch
    set_random_seed(6)
    layer, t = setup_layer(image_text(listfile, batch=6, extra="shuffle: true", root=root))
    layer.forward([], t)
    assert not np.array_equal(t[1].data.astype(int) - 10, labels[:6])
    layer.close()


def test_shuffle_seed_comes_before_the_skip(images):
    root, listfile, _, _, _ = images
    set_random_seed(11)
    host = np.random.default_rng(11)
    host.integers(0, 2**63 - 1)                 # the shuffle seed
    skip = int(host.integers(0, 4))
    order = shuffled_orders(11, 6, 1)[0]
    layer, t = setup_layer(image_text(listfile, batch=2, extra="shuffle: true rand_skip: 4",
                                      root=root))
    layer.forward([], t)
    np.testing.assert_array_equal(t[1].data.astype(int) - 10, order[skip:skip + 2])
    layer.close()


# ---------------------------------------------------------------- resizing
def inter_linear(img, out_h, out_w):
    """OpenCV's cv::resize with INTER_LINEAR, in float: source coordinate
    (dst + 0.5) * in / out - 0.5, clamped to the image (replicated border), two taps per
    axis, no antialiasing; rounded to uint8.  img: (H, W) or (H, W, C) uint8."""
    a = img.astype(np.float64)
    if a.ndim == 2:
        a = a[:, :, np.newaxis]

    def taps(n_out, n_in):
        x = (np.arange(n_out) + 0.5) * (n_in / n_out) - 0.5
        x0 = np.floor(x).astype(int)
        f = x - x0
        f = np.where(x0 < 0, 0.0, f)
        x0 = np.maximum(x0, 0)
        f = np.where(x0 >= n_in - 1, 0.0, f)
        x0 = np.minimum(x0, n_in - 1)
        return x0, np.minimum(x0 + 1, n_in - 1), f

    y0, y1, fy = taps(out_h, a.shape[0])
    x0, x1, fx = taps(out_w, a.shape[1])
    fx = fx[np.newaxis, :, np.newaxis]
    rows0 = a[y0][:, x0] * (1 - fx) + a[y0][:, x1] * fx
    rows1 = a[y1][:, x0] * (1 - fx) + a[y1][:, x1] * fx
    out = rows0 * (1 - fy)[:, None, None] + rows1 * fy[:, None, None]
    out = np.clip(np.rint(out), 0, 255).astype(np.uint8)
    return out[:, :, 0] if img.ndim == 2 else out


def test_inter_linear_reference_by_hand():
    img = np.array([[0, 100], [200, 40]], np.uint8)
    # doubling: source x = (dst + 0.5) / 2 - 0.5 = -0.25, 0.25, 0.75, 1.25 -> clamped ends
    np.testing.assert_array_equal(inter_linear(img[:1], 1, 4), [[0, 25, 75, 100]])
    np.testing.assert_array_equal(inter_linear(img, 1, 1), [[85]])   # the centre: the mean
    # shrinking 8 -> 2 samples two pixels per output, no average over the span
    row = np.arange(8, dtype=np.uint8)[np.newaxis] * 10
    np.testing.assert_array_equal(inter_linear(row, 1, 2), [[15, 55]])


@pytest.fixture
def sized(tmp_path):
    """Colour PNGs of three sizes; returns (list path, [RGB arrays])."""
    rng = np.random.default_rng(1)
    arrays = [rng.integers(0, 256, s + (3,), dtype=np.uint8) for s in [(3, 4), (6, 7), (5, 2)]]
    for i, a in enumerate(arrays):
        Image.fromarray(a, "RGB").save(tmp_path / f"s{i}.png")
    listfile = tmp_path / "sized.txt"
    listfile.write_text("".join(f"{tmp_path}/s{i}.png {i}\n" for i in range(len(arrays))))
    return str(listfile), arrays


def test_resize_enlarging_is_opencv_inter_linear(sized):
    listfile, arrays = sized
    layer, t = setup_layer(image_text(listfile, batch=3, extra="new_height: 9 new_width: 11"))
    assert t[0].shape == (3, 3, 9, 11)
    layer.forward([], t)
    for got, a in zip(t[0].data, arrays):
        want = bgr(inter_linear(a, 9, 11)).astype(np.float32)
        # Pillow rounds its fixed-point weights differently from OpenCV's 11-bit ones
        np.testing.assert_allclose(got, want, rtol=0, atol=1)
    layer.close()


def test_resize_against_cv2_when_installed(sized):
    cv2 = pytest.importorskip("cv2")
    listfile, arrays = sized
    layer, t = setup_layer(image_text(listfile, batch=3, extra="new_height: 9 new_width: 11"))
    layer.forward([], t)
    for got, a in zip(t[0].data, arrays):
        ref = cv2.resize(np.ascontiguousarray(a[:, :, ::-1]), (11, 9),
                         interpolation=cv2.INTER_LINEAR)
        np.testing.assert_allclose(got, ref.transpose(2, 0, 1), rtol=0, atol=1)
        np.testing.assert_allclose(inter_linear(a, 9, 11).astype(int),
                                   ref[:, :, ::-1].astype(int), rtol=0, atol=1)
    layer.close()


def test_resize_is_convert_imagesets_and_errors(sized):
    """Any size, shrinking included: the same arrays as convert_imageset's reader."""
    listfile, arrays = sized
    for hw, gray in (((2, 3), False), ((4, 6), True)):
        extra = f"new_height: {hw[0]} new_width: {hw[1]}" + ("" if not gray else
                                                             " is_color: false")
        layer, t = setup_layer(image_text(listfile, batch=3, extra=extra))
        layer.forward([], t)
        for got, path in zip(t[0].data, [ln.rsplit(" ", 1)[0] for ln in
                                         open(listfile).read().splitlines()]):
            np.testing.assert_array_equal(got, load_image(path, not gray, *hw))
        layer.close()
    for extra in ("new_height: 4", "new_width: 4"):
        with pytest.raises(ValueError, match=r"\(ImageData\): new_height and new_width must be "
                                             "set together"):
            make_layer(image_text(listfile, extra=extra)).setup([], tops())


def test_resize_shrinking_is_opencv_inter_linear(sized):
    listfile, arrays = sized
    layer, t = setup_layer(image_text(listfile, batch=3, extra="new_height: 2 new_width: 1",
                                      prefetch=0))
    layer.forward([], t)
    for got, a in zip(t[0].data, arrays):
        np.testing.assert_allclose(got, bgr(inter_linear(a, 2, 1)), rtol=0, atol=1)


def test_images_of_several_sizes_need_a_resize_or_a_crop(sized, tmp_path):
    listfile, arrays = sized
    # the first image shapes the tops; the second differs: Caffe's Transform check fails
    layer, t = setup_layer(image_text(listfile, batch=2))
    assert t[0].shape == (2, 3, 3, 4)
    with pytest.raises(RuntimeError, match=r"loading a batch failed.*s1\.png.* has shape "
                                           r"\(3, 6, 7\).*one size"):
        layer.forward([], t)
    layer.close()
    # cropped, each image gives its own centre window (TEST), as Caffe's Transform
    layer, t = setup_layer(image_text(listfile, batch=2, transform="crop_size: 2"), phase=TEST)
    layer.forward([], t)
    np.testing.assert_array_equal(t[0].data[0], bgr(arrays[0])[:, 0:2, 1:3])
    np.testing.assert_array_equal(t[0].data[1], bgr(arrays[1])[:, 2:4, 2:4])
    layer.close()


# -------------------------------------------------------------- grey images
def test_is_color_false_gives_one_grey_channel(images):
    root, listfile, _, gray, rgb = images
    layer, t = setup_layer(image_text(listfile, batch=6, extra="is_color: false", root=root))
    assert t[0].shape == (6, 1, H, W)
    layer.forward([], t)
    np.testing.assert_array_equal(t[0].data[5, 0], gray)
    # colour files are converted as OpenCV's IMREAD_GRAYSCALE: 0.299 R + 0.587 G + 0.114 B
    luma = rgb.astype(np.float64) @ np.array([0.299, 0.587, 0.114])
    np.testing.assert_allclose(t[0].data[:5, 0], luma, rtol=0, atol=1)
    layer.close()


# --------------------------------------------------------------- transform
def transformer(text, phase, seed, source_dir=None):
    set_random_seed(seed)
    p = parse_text(f"transform_param {{ {text} }}", caffe_pb2.LayerParameter,
                   filename="<test>").transform_param
    return DataTransformer(p, phase, np.float32, source_dir=source_dir)


def test_train_crop_mirror_mean_scale_as_the_transformer(images):
    root, listfile, expect, _, _ = images
    tr = "crop_size: 3 mirror: true scale: 0.5 mean_value: 10 mean_value: 20 mean_value: 30"
    set_random_seed(21)
    layer, t = setup_layer(image_text(listfile, batch=4, transform=tr, root=root), phase=TRAIN)
    got = run(layer, t, 3)
    layer.close()
    ref = transformer(tr, TRAIN, 21)
    for (data, labels), idx in zip(got, ([0, 1, 2, 3], [4, 5, 0, 1], [2, 3, 4, 5])):
        assert data.shape == (4, 3, 3, 3)
        np.testing.assert_array_equal(labels, np.array(idx) + 10)
        np.testing.assert_array_equal(data, ref.transform(expect[idx]))


def test_test_phase_mean_file_relative_to_prototxt(images, tmp_path, monkeypatch):
    root, listfile, expect, _, _ = images
    mean = expect.astype(np.float32).mean(axis=0, keepdims=True)
    mio.save_mean_file(tmp_path / "mean.binaryproto", mean)
    monkeypatch.chdir(tmp_path.parent)  # the list and the mean are found next to the prototxt
    tr = 'crop_size: 2 mean_file: "mean.binaryproto" scale: 0.25'
    layer, t = setup_layer(image_text("list.txt", batch=3, transform=tr, root=root),
                           phase=TEST, source_dir=str(tmp_path))
    layer.forward([], t)
    ref = transformer(tr, TEST, 0, source_dir=str(tmp_path))
    np.testing.assert_array_equal(t[0].data, ref.transform(expect[:3]))
    # TEST centre crop of H = 4, W = 5: offsets (1, 1), the mean cropped alike
    np.testing.assert_allclose(t[0].data, (expect[:3, :, 1:3, 1:3] - mean[:, :, 1:3, 1:3])
                               * np.float32(0.25), rtol=0, atol=1e-5)
    layer.close()


def test_same_batches_as_convert_imageset_and_data(images, tmp_path):
    """ImageData reads and resizes as convert_imageset does, and its transform draws as the
    Data layer's: with one seed, the two paths give the same batches."""
    pytest.importorskip("lmdb")
    from minicaffe.tools.convert_imageset import convert_imageset
    root, listfile, _, _, _ = images
    db = tmp_path / "db_lmdb"
    convert_imageset(root, listfile, str(db), resize_height=6, resize_width=7, verbose=False)
    tr = "crop_size: 5 mirror: true mean_value: 100 scale: 0.5"
    outs = []
    for text in (image_text(listfile, batch=4, root=root, transform=tr,
                            extra="new_height: 6 new_width: 7"),
                 f'name: "data" type: "Data" top: "data" top: "label" data_param {{ source: '
                 f'"{db}" batch_size: 4 backend: LMDB }} transform_param {{ {tr} }}'):
        set_random_seed(4)
        layer, t = setup_layer(text, phase=TRAIN)
        outs.append(run(layer, t, 3))
        layer.close()
    for (d0, l0), (d1, l1) in zip(*outs):
        np.testing.assert_array_equal(d0, d1)
        np.testing.assert_array_equal(l0, l1)


# ------------------------------------------------------------------- errors
def test_errors_name_the_layer_and_the_file(images, tmp_path):
    root, listfile, _, _, _ = images
    layer = make_layer(image_text(str(tmp_path / "nowhere.txt")))
    layer.source_dir = str(tmp_path / "proto")
    with pytest.raises(FileNotFoundError, match=r"layer 'data' \(ImageData\): image list "
                                                r"\(image_data_param.source\) .*nowhere\.txt"):
        layer.setup([], tops())

    bad = tmp_path / "bad.txt"
    bad.write_text("c0.png 1\nc1.png\n")
    with pytest.raises(ValueError, match=r"layer 'data' \(ImageData\): .*bad\.txt:2: expected "
                                         r"'relative/path label', got 'c1\.png'"):
        make_layer(image_text(str(bad), root=root)).setup([], tops())
    bad.write_text("c0.png one\n")
    with pytest.raises(ValueError, match=r"bad\.txt:1: expected"):
        make_layer(image_text(str(bad), root=root)).setup([], tops())
    bad.write_text("\n\n")
    with pytest.raises(ValueError, match=r"\(ImageData\): the image list .*bad\.txt lists no "):
        make_layer(image_text(str(bad), root=root)).setup([], tops())

    # the first image is read at setup (to shape the tops), the others when loaded
    missing = tmp_path / "missing.txt"
    missing.write_text("gone.png 0\n")
    with pytest.raises(FileNotFoundError, match=r"layer 'data' \(ImageData\): image \(listed "
                                                r"in .*missing\.txt\) '.*imgs/gone\.png' not "
                                                "found"):
        make_layer(image_text(str(missing), root=root)).setup([], tops())
    missing.write_text("c0.png 0\ngone.png 1\n")
    layer, t = setup_layer(image_text(str(missing), batch=2, root=root))
    with pytest.raises(RuntimeError, match=r"^layer 'data' \(ImageData\): loading a batch failed"
                                           r": image \(listed in .*missing\.txt\) .*gone\.png"):
        layer.forward([], t)
    layer.close()

    (tmp_path / "imgs" / "junk.png").write_bytes(b"not a png")
    missing.write_text("junk.png 0\n")
    with pytest.raises(ValueError, match=r"\(ImageData\): could not load image .*junk\.png.* "
                                         r"\(listed in .*missing\.txt\)"):
        make_layer(image_text(str(missing), root=root)).setup([], tops())

    with pytest.raises(ValueError, match="batch_size must be positive"):
        make_layer(image_text(listfile, batch=0, root=root)).setup([], tops())
    with pytest.raises(ValueError, match="exactly 2 top"):
        make_layer(image_text(listfile, root=root)).setup([], tops(1))


# ---------------------------------------------------- resume, resize, threads
def test_state_dict_resumes_and_set_batch_size_keeps_the_position(images):
    root, listfile, _, _, _ = images
    text = image_text(listfile, batch=4, extra="shuffle: true", root=root,
                      transform="crop_size: 3 mirror: true")
    set_random_seed(2)
    layer, t = setup_layer(text, phase=TRAIN)
    full = run(layer, t, 4)
    layer.close()

    set_random_seed(2)
    a, ta = setup_layer(text, phase=TRAIN)
    run(a, ta, 2)
    state = a.state_dict()
    a.close()
    set_random_seed(99)                           # another seed: the state decides
    b, tb = setup_layer(text, phase=TRAIN)
    b.load_state_dict(state)
    for (d0, l0), (d1, l1) in zip(full[2:], run(b, tb, 2)):
        np.testing.assert_array_equal(d0, d1)
        np.testing.assert_array_equal(l0, l1)
    b.close()

    # set_batch_size drops the batches read ahead and goes on from the next image
    set_random_seed(2)
    c, tc = setup_layer(image_text(listfile, batch=4, extra="shuffle: true", root=root))
    first = run(c, tc, 1)[0][1]
    c.set_batch_size(8)
    c.reshape([], tc)
    assert tc[0].shape == (8, 3, H, W) and tc[1].shape == (8,)
    second = run(c, tc, 1)[0][1]
    orders = np.concatenate(shuffled_orders(2, 6, 2)) + 10
    np.testing.assert_array_equal(np.concatenate([first, second]), orders[:12])
    assert c.prefetch_nbytes() == 4 * (8 * 3 * H * W + 8) * 4
    with pytest.raises(ValueError, match="batch_size must be positive"):
        c.set_batch_size(0)
    c.close()


def test_prefetch_thread_shutdown_and_declarations(images):
    root, listfile, _, _, _ = images
    layer, t = setup_layer(image_text(listfile, batch=2, prefetch=3, root=root))
    assert layer.prefetch_thread is None  # started by the first forward
    assert layer.flops([], t) == (0.0, 0.0)
    assert layer.backward_reads().bottom == ()
    layer.forward([], t)
    thread = layer.prefetch_thread
    assert thread.is_alive() and thread.daemon
    layer.close()
    assert not thread.is_alive()
    with pytest.raises(RuntimeError, match="closed"):
        layer.forward([], t)
    layer, t = setup_layer(image_text(listfile, batch=2, root=root))
    layer.forward([], t)
    thread = layer.prefetch_thread
    del layer
    gc.collect()
    thread.join(5)
    assert not thread.is_alive()


# ------------------------------------------------------------------ training
NET = """
name: "imagenet_tiny"
layer {{ name: "data" type: "ImageData" top: "data" top: "label"
  image_data_param {{ source: "{source}" root_folder: "{root}" batch_size: 3 shuffle: true
                     new_height: 6 new_width: 6 }}
  transform_param {{ crop_size: 5 mirror: true scale: 0.00390625 mean_value: 128 }} }}
layer {{ name: "ip" type: "InnerProduct" bottom: "data" top: "ip"
  inner_product_param {{ num_output: 16 weight_filler {{ type: "xavier" }} }} }}
layer {{ name: "loss" type: "SoftmaxWithLoss" bottom: "ip" bottom: "label" top: "loss" }}
"""


def test_a_net_with_image_data_trains(images):
    root, listfile, _, _, _ = images

    def solver():
        return sgd_solver(parse_text(NET.format(source=listfile, root=root),
                                     caffe_pb2.NetParameter), seed=7, base_lr=0.1)

    s = solver()
    assert s.net.blobs["data"].shape == (3, 3, 5, 5)
    before = [to_numpy(p.data).copy() for p in s.net.learnable_params]
    params, _, losses, _ = train_steps(s, 8)
    assert all(np.isfinite(losses))
    assert losses[-1] < losses[0]
    assert any(not np.array_equal(a, b) for a, b in zip(before, params))
    # the same seed trains the same way
    params2, _, losses2, _ = train_steps(solver(), 8)
    assert losses2 == losses
    for a, b in zip(params, params2):
        np.testing.assert_array_equal(a, b)


def test_memory_plans_and_the_tuners_resize_accept_image_data(images):
    """ImageData feeds the net from the host like Data: the `none` and `naive` plans train
    bit-identically to the plain run, and the tuner's set_batch_size resizes it."""
    from swap.profiler import set_batch_size
    root, listfile, _, _, _ = images

    def solver():
        return sgd_solver(parse_text(NET.format(source=listfile, root=root),
                                     caffe_pb2.NetParameter), seed=7)

    base = train_steps(solver(), 4)
    for strategy in ("none", "naive"):
        params, _, losses, ex = train_steps(solver(), 4, strategy)
        assert ex.iterations == 4 and losses == base[2]
        for a, b in zip(params, base[0]):
            np.testing.assert_array_equal(a, b)
    s = solver()
    s.step(1)
    set_batch_size(s.net, 5)
    s.step(1)
    assert s.net.blobs["data"].shape == (5, 3, 5, 5) and s.net.blobs["label"].shape == (5,)
    # Caffe's accounting holds the batches read ahead beyond the tops, as for Data
    from swap.gmap import build_gmap
    net = solver().net
    layer = net.layers[net.layer_index("data")]
    extra = {b.name: b.nbytes(net.blobs["data"].shape[0]) for b in build_gmap(net).buffers}
    top_bytes = net.blobs["data"].nbytes + net.blobs["label"].nbytes
    assert extra["caffe:data/prefetch"] == layer.prefetch_nbytes() - top_bytes > 0


def test_in_a_net_the_list_is_found_next_to_the_prototxt(images, tmp_path, monkeypatch):
    from minicaffe.net import Net
    root, _, expect, _, _ = images
    proto = tmp_path / "net.prototxt"
    proto.write_text('name: "n" layer { name: "data" type: "ImageData" top: "data" '
                     'top: "label" image_data_param { source: "list.txt" root_folder: "imgs/" '
                     "batch_size: 5 } }")
    monkeypatch.chdir(tmp_path.parent)
    net = Net(str(proto), TRAIN)
    out = net.forward()
    np.testing.assert_array_equal(out["label"], [10, 11, 12, 13, 14])
    np.testing.assert_array_equal(out["data"], expect[:5].astype(np.float32))
    net.layers[0].close()


# ---------------------------------------------------------------------- GPU
@pytest.mark.gpu
def test_image_data_gpu_matches_cpu(cp, images):
    root, listfile, _, _, _ = images
    tr = "crop_size: 3 mirror: true mean_value: 5 scale: 0.25"
    results = []
    for xp in (np, cp):
        set_random_seed(3)
        layer, t = setup_layer(image_text(listfile, batch=4, transform=tr, root=root,
                                          extra="shuffle: true"), phase=TRAIN, xp=xp)
        results.append(run(layer, t, 2))
        layer.close()
    for (d0, l0), (d1, l1) in zip(*results):
        np.testing.assert_allclose(d1, d0, rtol=1e-5, atol=0)
        np.testing.assert_array_equal(l1, l0)
