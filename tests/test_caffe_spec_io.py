"""Image and Datum I/O against BVLC Caffe's own unit tests.

Mirrors ``src/caffe/test/test_io.cpp`` (IOTest): Caffe's ``util/io.cpp`` functions through
their minicaffe counterparts:

=============================  ==============================================================
Caffe                          minicaffe
=============================  ==============================================================
ReadImageToCVMat(f, h, w, c)   ``minicaffe.io.load_image_chw(f, c, h, w)`` ((C, H, W), BGR)
ReadImageToDatum(f, l, h, w,   ``minicaffe.tools.convert_imageset.read_image_to_datum`` (what
c, encoding)                   ``convert_imageset`` writes)
ReadFileToDatum(f, l)          the same with an ``encoding`` that the file already has, no resize
CVMatToDatum(img)              ``minicaffe.io.array_to_datum(chw)``
DecodeDatumToCVMat(d, c)       ``minicaffe.io.decode_image_bytes(d.data, force_color=c,
                               force_gray=not c)``
DecodeDatumToCVMatNative(d)    ``minicaffe.io.decode_image_bytes(d.data)`` (IMREAD_ANYCOLOR)
DecodeDatum(d, c) / ...Native  ``minicaffe.io.datum_image(d, ...)``, then ``array_to_datum``
=============================  ==============================================================

Caffe reads ``examples/images/cat.jpg`` (360 x 480, colour) and ``cat_gray.jpg``; the module
fixture writes JPEGs of those sizes.  The test's ``ReadImageToDatumReference`` (imread, an
optional cv::resize, then the channel-major copy) is rebuilt from Pillow's own decoding: the
BGR pixels of the RGB decode, the luma plane of a JPEG for grey (libjpeg's JCS_GRAYSCALE,
which OpenCV's IMREAD_GRAYSCALE asks for), and a separable np.interp for INTER_LINEAR.

The DecodeDatum tests also assert ``EXPECT_FALSE`` on a second decode (the datum is no longer
encoded): ``datum_image`` of a decoded datum gives its pixels back, which is what is checked.
Not ported: the ``min_dim``/``max_dim`` resizes and ReadVideoToCVMat of some stored copies of
this file (forks: upstream's ReadImageToCVMat has neither).
"""
import os

import numpy as np
import pytest

from minicaffe import io as mio
from minicaffe.tools.convert_imageset import read_image_to_datum

Image = pytest.importorskip("PIL.Image")

H, W = 360, 480          # examples/images/cat.jpg


@pytest.fixture(scope="module")
def images(tmp_path_factory):
    """cat.jpg (colour, 360 x 480) and cat_gray.jpg (one channel), made from a seeded RNG:
    smooth colour ramps with noise, saturated in places (where a grey image made from the
    decoded RGB would differ from the JPEG's luma plane)."""
    d = tmp_path_factory.mktemp("images")
    rng = np.random.default_rng(1701)
    y, x = np.mgrid[0:H, 0:W]
    rgb = np.stack([x * 300.0 / W - 20, y * 300.0 / H - 20,
                    128 + 90 * np.sin(x / 17.0) * np.cos(y / 23.0)], axis=-1)
    rgb = np.clip(rgb + rng.normal(0, 15, rgb.shape), 0, 255).astype(np.uint8)
    Image.fromarray(rgb).save(d / "cat.jpg", quality=90)
    Image.fromarray(rgb).convert("L").save(d / "cat_gray.jpg", quality=90)
    return str(d / "cat.jpg"), str(d / "cat_gray.jpg")


def interp_resize(hwc, height, width):
    """cv::resize INTER_LINEAR in floating point: each output pixel centre at source
    coordinate (i + 0.5) * in / out - 0.5, clamped, interpolated between its neighbours."""
    a = hwc.astype(np.float64)

    def along(arr, n_out, axis):
        n_in = arr.shape[axis]
        pos = np.clip((np.arange(n_out) + 0.5) * n_in / n_out - 0.5, 0, n_in - 1)
        return np.apply_along_axis(lambda v: np.interp(pos, np.arange(n_in), v), axis, arr)

    return np.clip(np.rint(along(along(a, height, 0), width, 1)), 0, 255)


def reference_chw(filename, height=0, width=0, is_color=True):
    """Caffe's ReadImageToDatumReference, as (C, H, W): imread (BGR, or the JPEG's luma),
    resized when both sizes are given."""
    img = Image.open(filename)
    if is_color:
        hwc = np.asarray(img.convert("RGB"))[:, :, ::-1]
    else:
        img.draft("YCbCr", img.size)            # the decoder's own planes: Y is the luma
        hwc = np.asarray(img.getchannel(0))[:, :, np.newaxis]
    if height > 0 and width > 0:
        hwc = interp_resize(hwc, height, width)
    return hwc.transpose(2, 0, 1)


def datum_chw(datum):
    assert not datum.encoded
    return np.frombuffer(datum.data, np.uint8).reshape(datum.channels, datum.height,
                                                       datum.width)


def read_datum(filename, label=0, height=0, width=0, is_color=True, encoding=""):
    return read_image_to_datum(filename, label, height, width, is_color, encoding)


def read_file_to_datum(filename, label=-1):
    """Caffe's ReadFileToDatum (label -1 by default): the file's bytes, encoded; minicaffe's
    ReadImageToDatum takes that path for an encoding the file has and no resize."""
    return read_datum(filename, label, encoding=os.path.splitext(filename)[1][1:])


# ----------------------------------------------------------------- ReadImageToDatum
@pytest.mark.parametrize("height, width, is_color, shape", [
    (0, 0, True, (3, H, W)),          # TestReadImageToDatum
    (100, 200, True, (3, 100, 200)),  # TestReadImageToDatumResized
    (256, 256, True, (3, 256, 256)),  # TestReadImageToDatumResizedSquare
    (0, 0, False, (1, H, W)),         # TestReadImageToDatumGray
    (256, 256, False, (1, 256, 256)),  # TestReadImageToDatumResizedGray
    (100, 0, True, (3, H, W)),        # one size alone resizes nothing (height > 0 && width > 0)
])
def test_read_image_to_datum_shapes(images, height, width, is_color, shape):
    """test_io.cpp IOTest.TestReadImageToDatum, ...Resized, ...ResizedSquare, ...Gray,
    ...ResizedGray: channels, height and width of the datum; the label is kept."""
    datum = read_datum(images[0], 7, height, width, is_color)
    assert (datum.channels, datum.height, datum.width) == shape
    assert datum.label == 7 and not datum.encoded and len(datum.data) == np.prod(shape)


@pytest.mark.parametrize("height, width", [(0, 0), (100, 200)])
def test_read_image_to_datum_reference(images, height, width):
    """test_io.cpp IOTest.TestReadImageToDatumReference and ...ReferenceResized: the datum
    against the reference read, byte for byte unresized; resized, within one level (OpenCV
    interpolates in 11-bit fixed point, the reference in floating point)."""
    datum = read_datum(images[0], 0, height, width, True)
    ref = reference_chw(images[0], height, width)
    assert (datum.channels, datum.height, datum.width) == ref.shape
    assert len(datum.data) == ref.size
    got = datum_chw(datum).astype(np.int64)
    if height:
        assert np.abs(got - ref).max() <= 1
    else:
        np.testing.assert_array_equal(got, ref)


@pytest.mark.parametrize("is_color", [True, False])
def test_read_image_to_datum_content(images, is_color):
    """test_io.cpp IOTest.TestReadImageToDatumContent and ...ContentGray: the datum holds
    ReadImageToCVMat's pixels channel by channel; grey is the JPEG's luma plane."""
    datum = read_datum(images[0], 0, 0, 0, is_color)
    img = mio.load_image_chw(images[0], is_color)
    assert (datum.channels, datum.height, datum.width) == img.shape
    np.testing.assert_array_equal(datum_chw(datum), img)
    np.testing.assert_array_equal(img, reference_chw(images[0], is_color=is_color))


def test_gray_of_a_colour_jpeg_is_its_luma_plane_not_a_conversion_of_rgb(images):
    """OpenCV's IMREAD_GRAYSCALE has libjpeg output the luma plane; converting the decoded
    (clipped) RGB to grey, as minicaffe did through Pillow's ``convert("L")``, differs by
    several levels where the colours saturate."""
    gray = mio.load_image_chw(images[0], is_color=False)[0].astype(np.int64)
    via_rgb = np.asarray(Image.open(images[0]).convert("RGB").convert("L"), dtype=np.int64)
    assert np.abs(gray - via_rgb).max() > 1


# ----------------------------------------------------------------- ReadImageToCVMat
@pytest.mark.parametrize("height, width, is_color, shape", [
    (0, 0, True, (3, H, W)),            # TestReadImageToCVMat
    (100, 200, True, (3, 100, 200)),    # TestReadImageToCVMatResized
    (256, 256, True, (3, 256, 256)),    # TestReadImageToCVMatResizedSquare
    (0, 0, False, (1, H, W)),           # TestReadImageToCVMatGray
    (256, 256, False, (1, 256, 256)),   # TestReadImageToCVMatResizedGray
])
def test_read_image_to_cvmat(images, height, width, is_color, shape):
    """test_io.cpp IOTest.TestReadImageToCVMat and its Resized, ResizedSquare, Gray and
    ResizedGray variants: channels, rows and columns (a cv::Mat's (H, W, C) is (C, H, W))."""
    img = mio.load_image_chw(images[0], is_color, height, width)
    assert img.shape == shape and img.dtype == np.uint8


def test_read_image_to_cvmat_of_a_missing_file_names_it(tmp_path):
    """io.cpp ReadImageToCVMat: "Could not open or find file " and the name (convert_imageset
    logs that and skips the file)."""
    with pytest.raises(FileNotFoundError, match="nope.jpg"):
        mio.load_image_chw(str(tmp_path / "nope.jpg"))


# ---------------------------------------------------------------------- CVMatToDatum
def test_cvmat_to_datum(images):
    """test_io.cpp IOTest.TestCVMatToDatum: the datum of a colour image is 3 x 360 x 480."""
    datum = mio.array_to_datum(mio.load_image_chw(images[0]))
    assert (datum.channels, datum.height, datum.width) == (3, H, W) and not datum.encoded


def test_cvmat_to_datum_content_and_reference(images):
    """test_io.cpp IOTest.TestCVMatToDatumContent and TestCVMatToDatumReference: the same bytes
    as ReadImageToDatum and as the reference read."""
    datum = mio.array_to_datum(mio.load_image_chw(images[0]))
    assert datum.data == read_datum(images[0]).data
    np.testing.assert_array_equal(datum_chw(datum), reference_chw(images[0]))


# -------------------------------------------------------------------- ReadFileToDatum
def test_read_file_to_datum(images):
    """test_io.cpp IOTest.TestReadFileToDatum: encoded, label -1, the file's bytes (Caffe's
    cat.jpg has 140391); no channels, height or width."""
    datum = read_file_to_datum(images[0])
    assert datum.encoded and datum.label == -1
    assert len(datum.data) == os.path.getsize(images[0])
    with open(images[0], "rb") as f:
        assert datum.data == f.read()
    assert (datum.channels, datum.height, datum.width) == (0, 0, 0)


def test_read_image_to_datum_encoded_keeps_or_reencodes_the_file(images):
    """io.cpp ReadImageToDatum with an encoding: the file's own bytes where it has that
    extension and no resize is asked (whatever is_color: Caffe's ``(channels == 3) ==
    is_color`` holds for every image it reads), else the image re-encoded; the label set."""
    with open(images[0], "rb") as f:
        raw = f.read()
    gray_flag = read_datum(images[0], 3, 0, 0, False, "jpg")
    assert gray_flag.encoded and gray_flag.label == 3 and gray_flag.data == raw
    resized = read_datum(images[0], 4, 100, 200, True, "jpg")
    assert resized.encoded and resized.label == 4 and resized.data != raw
    assert mio.decode_image_bytes(resized.data).shape == (3, 100, 200)
    png = read_datum(images[0], 5, 0, 0, True, "png")
    assert png.data.startswith(b"\x89PNG")
    np.testing.assert_array_equal(mio.decode_image_bytes(png.data), mio.load_image_chw(images[0]))


# ------------------------------------------------------------------------ DecodeDatum
def test_decode_datum(images):
    """test_io.cpp IOTest.TestDecodeDatum: DecodeDatum(datum, is_color true) of a file datum
    gives the reference pixels; decoding the decoded datum changes nothing."""
    datum = read_file_to_datum(images[0])
    decoded = mio.array_to_datum(mio.datum_image(datum, force_color=True))
    np.testing.assert_array_equal(datum_chw(decoded), reference_chw(images[0]))
    np.testing.assert_array_equal(mio.datum_image(decoded), datum_chw(decoded))


def test_decode_datum_to_cvmat(images):
    """test_io.cpp IOTest.TestDecodeDatumToCVMat: is_color true gives 3 x 360 x 480, false
    1 x 360 x 480 (the JPEG's luma)."""
    data = read_file_to_datum(images[0]).data
    assert mio.decode_image_bytes(data, force_color=True).shape == (3, H, W)
    gray = mio.decode_image_bytes(data, force_gray=True)
    assert gray.shape == (1, H, W)
    np.testing.assert_array_equal(gray, reference_chw(images[0], is_color=False))


@pytest.mark.parametrize("native", [False, True])
def test_decode_datum_to_cvmat_content(images, native):
    """test_io.cpp IOTest.TestDecodeDatumToCVMatContent and ...ContentNative: a datum from
    ReadImageToDatum(filename, 0, "jpg") decodes to ReadImageToCVMat's pixels."""
    datum = read_datum(images[0], 0, encoding="jpg")
    img = (mio.decode_image_bytes(datum.data) if native
           else mio.decode_image_bytes(datum.data, force_color=True))
    np.testing.assert_array_equal(img, mio.load_image_chw(images[0]))


@pytest.mark.parametrize("which, is_color", [(0, True), (1, False)])
def test_decode_datum_native(images, which, is_color):
    """test_io.cpp IOTest.TestDecodeDatumNative and ...NativeGray: IMREAD_ANYCOLOR keeps the
    file's channels (3 for cat.jpg, 1 for cat_gray.jpg) and gives the reference pixels."""
    datum = read_file_to_datum(images[which])
    decoded = mio.array_to_datum(mio.datum_image(datum))
    ref = reference_chw(images[which], is_color=is_color)
    assert (decoded.channels, decoded.height, decoded.width) == ref.shape
    np.testing.assert_array_equal(datum_chw(decoded), ref)
    np.testing.assert_array_equal(mio.datum_image(decoded), ref)


@pytest.mark.parametrize("which, channels", [(0, 3), (1, 1)])
def test_decode_datum_to_cvmat_native(images, which, channels):
    """test_io.cpp IOTest.TestDecodeDatumToCVMatNative and ...NativeGray."""
    img = mio.decode_image_bytes(read_file_to_datum(images[which]).data)
    assert img.shape == (channels, H, W)


# ------------------------------------------- io.cpp's OpenCV reads beyond the JPEG cases
def test_gray_png_is_libpngs_rgb_to_gray(tmp_path):
    """OpenCV reads a colour PNG as grey through libpng's ``png_set_rgb_to_gray(0.299,
    0.587)``: 15-bit weights 9797, 19234, 3737, truncated (Pillow's ``convert("L")`` rounds
    16-bit ones, one level off for about half the pixels)."""
    rng = np.random.default_rng(7)
    rgb = rng.integers(0, 256, (40, 50, 3), dtype=np.uint8)
    Image.fromarray(rgb).save(tmp_path / "c.png")
    r, g, b = (rgb[..., i].astype(np.uint32) for i in range(3))
    expect = (9797 * r + 19234 * g + 3737 * b) >> 15
    np.testing.assert_array_equal(mio.load_image_chw(str(tmp_path / "c.png"), False)[0], expect)
    data = (tmp_path / "c.png").read_bytes()
    np.testing.assert_array_equal(mio.decode_image_bytes(data, force_gray=True)[0], expect)


def test_16_bit_gray_png_keeps_its_high_byte(tmp_path):
    """OpenCV's 8-bit read of a 16-bit PNG strips each value to its high byte (libpng's
    png_set_strip_16), in grey and in colour; Pillow's own conversion clipped every value
    above 255 to 255."""
    rng = np.random.default_rng(8)
    a16 = rng.integers(0, 65536, (12, 9)).astype(np.uint16)
    Image.fromarray(a16).save(tmp_path / "d.png")
    high = (a16 >> 8).astype(np.uint8)
    path = str(tmp_path / "d.png")
    np.testing.assert_array_equal(mio.load_image_chw(path, False), high[np.newaxis])
    np.testing.assert_array_equal(mio.load_image_chw(path, True), np.stack([high] * 3))
    native = mio.decode_image_bytes((tmp_path / "d.png").read_bytes())
    np.testing.assert_array_equal(native, high[np.newaxis])
