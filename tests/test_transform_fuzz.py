"""A seeded fuzz of Caffe's data path against a NumPy reference written from Caffe's C++.

The reference below follows BVLC Caffe (master) statement by statement:

* ``src/caffe/data_transformer.cpp``: the constructor (mean_file xor mean_value, the mean
  read with ``Blob::FromProto``), ``InferBlobShape`` (Datum, cv::Mat), ``Transform`` of a
  Datum (into a Blob, then into ``Dtype*``), of a ``cv::Mat`` (HWC, BGR as stored), of a
  ``vector<Datum>`` and of a Blob (one draw for the whole blob, the mean subtracted in
  place before the crop, ``caffe_scal`` after it), ``Rand(n) = rng() % n``;
* ``src/caffe/blob.cpp``: ``FromProto`` (the legacy num/channels/height/width when any is
  set, else ``shape``; ``double_data`` over ``data``) and ``LegacyShape`` (``channels()``
  is axis 1 padded with 1s; more than 4 axes CHECK-fail);
* ``src/caffe/util/io.cpp``: ``DecodeDatumToCVMatNative`` (``IMREAD_ANYCOLOR``) and
  ``DecodeDatumToCVMat`` (``IMREAD_COLOR``/``IMREAD_GRAYSCALE``), whose PNG grey
  conversion is libpng's ``png_set_rgb_to_gray(png_ptr, 1, 0.299, 0.587)`` (OpenCV's
  ``grfmt_png.cpp``): 15-bit coefficients 9797, 19234, 3737, truncated;
* ``src/caffe/layers/data_layer.cpp`` (each batch shaped by ``InferBlobShape`` of its
  first Datum, every Datum then ``Transform``-ed into a ``(1, C, h, w)`` view of it) and
  ``memory_data_layer.cpp`` (``AddDatumVector``: ``Transform(vector<Datum>)`` into
  ``(num, channels, height, width)`` of ``memory_data_param``).

The random parts: Caffe draws ``Rand(2)`` for the mirror (only when ``mirror`` is set:
``param_.mirror() && Rand(2)`` short-circuits, in TRAIN *and* TEST), then, for a TRAIN
crop, ``h_off = Rand(H - crop + 1)`` and ``w_off = Rand(W - crop + 1)``.  minicaffe's
generator is not Caffe's mt19937, so the reference runs each image with every scripted
sequence of draws Caffe could make, and minicaffe's output must equal (bit for bit) one of
those; :func:`test_draws_cover_every_crop_and_mirror` checks that minicaffe's draws reach
all of them, about uniformly.  Where minicaffe takes the draws as an argument
(``DataTransformer.transform(..., draws=)``) the comparison is exact.

A CHECK that fails in Caffe must be an error in minicaffe that names the layer.
"""
import io as _pyio
import itertools
import re

import numpy as np
import pytest

import minicaffe.layers  # noqa: F401  (registers the layer types)
from minicaffe import io as mio
from minicaffe.blob import Blob
from minicaffe.layer import create_layer
from minicaffe.proto import caffe_pb2, parse_text, write_binary
from minicaffe.rng import set_random_seed
from minicaffe.testing import make_layer
from minicaffe.transform import TEST, TRAIN, DataTransformer

pytest.importorskip("lmdb")
Image = pytest.importorskip("PIL.Image")

WHERE = "layer 'fuzz' (Data)"


# =============================================================== the reference (Caffe)
class CaffeCheck(Exception):
    """A CHECK that fails in Caffe; ``args[0]`` is the kind of failure (a key of ERRORS)."""


def check(cond, kind):
    if not cond:
        raise CaffeCheck(kind)


def blob_from_proto(proto):
    """``Blob::FromProto`` then the legacy accessors the transformer reads: returns
    ``((channels(), height(), width()), flat data as float32, num())``."""
    if any(proto.HasField(f) for f in ("num", "channels", "height", "width")):
        shape = [proto.num, proto.channels, proto.height, proto.width]
    else:
        shape = [int(d) for d in proto.shape.dim]
    count = int(np.prod(shape)) if shape else 1
    if len(proto.double_data):
        check(len(proto.double_data) == count, "mean_count_mismatch")
        flat = np.asarray(proto.double_data, np.float64).astype(np.float32)
    else:
        check(len(proto.data) == count, "mean_count_mismatch")
        flat = np.asarray(proto.data, np.float32)
    # Blob::LegacyShape: CHECK_LE(num_axes(), 4); an axis past the last reads as 1
    check(len(shape) <= 4, "mean_axes")
    padded = shape + [1] * (4 - len(shape))
    return tuple(padded[1:4]), flat, padded[0]


def cv_decode(data, flag):
    """``cv::imdecode`` of the PNGs the fuzz writes (Pillow modes L and RGB) as an HWC uint8
    ``cv::Mat``: ``flag`` is "any" (IMREAD_ANYCOLOR), "color" or "gray"."""
    img = Image.open(_pyio.BytesIO(data))
    img.load()
    if img.mode == "L":
        g = np.asarray(img, np.uint8)[:, :, None]
        return np.repeat(g, 3, axis=2) if flag == "color" else g
    rgb = np.asarray(img.convert("RGB"), np.uint32)
    if flag == "gray":   # libpng's rgb_to_gray, coefficients 0.299 and 0.587 in 1/32768ths
        r, g, b = rgb[..., 0], rgb[..., 1], rgb[..., 2]
        return ((9797 * r + 19234 * g + 3737 * b) >> 15).astype(np.uint8)[:, :, None]
    return rgb[:, :, ::-1].astype(np.uint8)   # BGR, OpenCV's order


class RefTransformer:
    """Caffe's ``DataTransformer<Dtype>``; ``rand(n)`` stands for ``Rand(n)``."""

    def __init__(self, param, phase, dtype, mean_proto=None):
        self.p, self.phase, self.dt = param, phase, np.dtype(dtype).type
        if param.HasField("mean_file"):
            check(len(param.mean_value) == 0, "mean_both")
            self.mean_chw, self.mean, _ = blob_from_proto(mean_proto)
            self.mean = self.mean.astype(self.dt)      # data_mean_ is a Blob<Dtype>
        # mean_values_: Dtype copies of the proto's floats
        self.mean_values = [self.dt(v) for v in param.mean_value]

    # ---------------------------------------------------------------- shapes
    def decode(self, datum):
        """The cv::Mat of an encoded Datum, as Transform and InferBlobShape decode it."""
        p = self.p
        check(not (p.force_color and p.force_gray), "force_both")
        if p.force_color or p.force_gray:
            return cv_decode(datum.data, "color" if p.force_color else "gray")
        return cv_decode(datum.data, "any")

    def infer_shape(self, datum):
        """``InferBlobShape(const Datum&)`` (and, for encoded ones, of the cv::Mat)."""
        crop = self.p.crop_size
        if datum.encoded:
            mat = self.decode(datum)
            c, h, w = mat.shape[2], mat.shape[0], mat.shape[1]
        else:
            c, h, w = datum.channels, datum.height, datum.width
        check(c > 0, "channels")
        check(h >= crop and w >= crop, "crop")
        return (1, c, crop or h, crop or w)

    # ------------------------------------------------------------- transforms
    def _mean_checks(self, c, h, w):
        if self.p.HasField("mean_file"):
            check((c, h, w) == self.mean_chw, "mean_shape")
        if self.mean_values:
            check(len(self.mean_values) in (1, c), "mean_value_count")
            # (Caffe then pushes copies of the one value into mean_values_; a later image
            # with another channel count meets the longer list: not fuzzed here)

    def _offsets(self, h, w, rand):
        crop = self.p.crop_size
        if not crop:
            return 0, 0
        if self.phase == TRAIN:
            h_off = rand(h - crop + 1)
            w_off = rand(w - crop + 1)
            return h_off, w_off
        return (h - crop) // 2, (w - crop) // 2

    def _value(self, element, c, mean_index, channels):
        """``(element - mean) * scale``, or ``element * scale``, in Dtype."""
        scale = self.dt(self.p.scale)
        if self.p.HasField("mean_file"):
            return (element - self.mean[mean_index]) * scale
        if self.mean_values:
            # "Replicate the mean_value for simplicity" when there is one for C > 1
            mv = self.mean_values * (channels if len(self.mean_values) == 1 else 1)
            return (element - np.asarray(mv, self.dt)[c]) * scale
        return element * scale

    def transform_datum(self, datum, blob_shape, rand):
        """``Transform(const Datum&, Blob*)``: the decoded path for encoded Datums, else the
        checks against the blob, then ``Transform(const Datum&, Dtype*)``."""
        if datum.encoded:
            return self.transform_mat(self.decode(datum), blob_shape, rand)
        # (non-encoded with force_color/force_gray: LOG(ERROR) "... only for encoded datum")
        crop = self.p.crop_size
        _, channels, height, width = blob_shape
        dc, dh, dw = datum.channels, datum.height, datum.width
        check(channels == dc, "channels")
        check(height <= dh and width <= dw, blob_kind(crop, height, width))
        if crop:
            check(crop == height and crop == width, "size")
        else:
            check(dh == height and dw == width, "size")
        return self._transform_datum_raw(datum, rand)

    def _transform_datum_raw(self, datum, rand):
        """``Transform(const Datum&, Dtype* transformed_data)``, its index arithmetic as
        written, vectorized over (c, h, w)."""
        p = self.p
        data = datum.data
        datum_channels, datum_height, datum_width = datum.channels, datum.height, datum.width
        crop_size = p.crop_size
        do_mirror = bool(p.mirror) and bool(rand(2))
        has_uint8 = len(data) > 0
        check(datum_channels > 0, "channels")
        check(datum_height >= crop_size and datum_width >= crop_size, "crop")
        self._mean_checks(datum_channels, datum_height, datum_width)
        height, width = datum_height, datum_width
        h_off, w_off = self._offsets(datum_height, datum_width, rand)
        if crop_size:
            height = width = crop_size
        c, h, w = (a.ravel() for a in np.meshgrid(np.arange(datum_channels), np.arange(height),
                                                  np.arange(width), indexing="ij"))
        data_index = (c * datum_height + h_off + h) * datum_width + w_off + w
        top_index = (c * height + h) * width + np.where(do_mirror, width - 1 - w, w)
        if has_uint8:
            element = np.frombuffer(data, np.uint8)[data_index].astype(self.dt)
        else:
            element = np.asarray(datum.float_data, np.float32)[data_index].astype(self.dt)
        out = np.empty(datum_channels * height * width, self.dt)
        out[top_index] = self._value(element, c, data_index, datum_channels)
        return out.reshape(datum_channels, height, width)

    def transform_mat(self, mat, blob_shape, rand):
        """``Transform(const cv::Mat&, Blob*)``: ``mat`` is HWC uint8, channels as stored."""
        p = self.p
        crop_size = p.crop_size
        img_height, img_width, img_channels = mat.shape
        _, channels, height, width = blob_shape
        check(channels == img_channels, "channels")
        check(height <= img_height and width <= img_width, blob_kind(crop_size, height, width))
        do_mirror = bool(p.mirror) and bool(rand(2))
        check(img_channels > 0, "channels")
        check(img_height >= crop_size and img_width >= crop_size, "crop")
        self._mean_checks(img_channels, img_height, img_width)
        if crop_size:
            check(crop_size == height and crop_size == width, "size")
        else:
            check(img_height == height and img_width == width, "size")
        h_off, w_off = self._offsets(img_height, img_width, rand)
        cropped = mat[h_off:h_off + height, w_off:w_off + width]      # cv::Rect roi
        # for h: ptr = cropped.ptr(h); for w: for c: pixel = ptr[img_index++]
        h, w, c = (a.ravel() for a in np.meshgrid(np.arange(height), np.arange(width),
                                                  np.arange(img_channels), indexing="ij"))
        top_index = (c * height + h) * width + np.where(do_mirror, width - 1 - w, w)
        pixel = cropped.reshape(-1).astype(self.dt)
        mean_index = (c * img_height + h_off + h) * img_width + w_off + w
        out = np.empty(img_channels * height * width, self.dt)
        out[top_index] = self._value(pixel, c, mean_index, img_channels)
        return out.reshape(img_channels, height, width)

    def transform_blob(self, x, rand):
        """``Transform(Blob* input_blob, Blob* transformed_blob)`` into an empty blob:
        one mirror coin and one crop for the whole blob; the mean subtracted from the input
        (in place) before the crop; ``caffe_scal`` of the output when scale != 1."""
        p = self.p
        crop_size = p.crop_size
        x = x.astype(self.dt).copy()
        input_num, input_channels, input_height, input_width = x.shape
        height, width = (crop_size, crop_size) if crop_size else (input_height, input_width)
        check(input_height >= height and input_width >= width, "crop")
        scale = self.dt(p.scale)
        do_mirror = bool(p.mirror) and bool(rand(2))
        h_off, w_off = self._offsets(input_height, input_width, rand)
        if p.HasField("mean_file"):
            check((input_channels, input_height, input_width) == self.mean_chw, "mean_shape")
            m = self.mean[:input_channels * input_height * input_width]
            x -= m.reshape(1, input_channels, input_height, input_width)   # caffe_sub
        if self.mean_values:
            check(len(self.mean_values) in (1, input_channels), "mean_value_count")
            if len(self.mean_values) == 1:
                x += -self.mean_values[0]                                 # caffe_add_scalar
            else:
                for c in range(input_channels):
                    x[:, c] += -self.mean_values[c]
        out = x[:, :, h_off:h_off + height, w_off:w_off + width]
        if do_mirror:
            out = out[:, :, :, ::-1]
        out = np.ascontiguousarray(out)
        if scale != self.dt(1):
            out *= scale                                                  # caffe_scal
        return out

    # ---------------------------------------------------------- the draw sets
    def scripts(self, h, w):
        """Every sequence of ``Rand`` results Caffe can draw for an image of h x w, in its
        order: the mirror coin (when ``mirror``), then the TRAIN crop offsets."""
        p = self.p
        parts = []
        if p.mirror:
            parts.append(range(2))
        if p.crop_size and self.phase == TRAIN and h >= p.crop_size and w >= p.crop_size:
            parts += [range(h - p.crop_size + 1), range(w - p.crop_size + 1)]
        return list(itertools.product(*parts))

    def all_outputs(self, fn, h, w):
        """{draw script: output} of ``fn(rand)`` over :meth:`scripts`; a CaffeCheck of any
        script propagates."""
        outs = {}
        for script in self.scripts(h, w):
            it = iter(script)

            def rand(n, it=it):
                v = next(it)
                assert 0 <= v < n, "the script must follow Caffe's draws"
                return v
            outs[script] = fn(rand)
        return outs


def blob_kind(crop, height, width):
    """The kind of a failed ``CHECK_LE(height, datum_height)``: the crop is larger than the
    image where the blob is the crop's size, else the blob (MemoryData's) does not fit."""
    return "crop" if crop and height == width == crop else "size"


def datum_hw(ref, datum):
    if datum.encoded:
        mat = ref.decode(datum)
        return mat.shape[0], mat.shape[1]
    return datum.height, datum.width


# ========================================================= what minicaffe must say
ERRORS = {   # kind of Caffe CHECK -> what minicaffe's message must contain
    "crop": r"crop_size \d+ is larger than the image",
    "mean_shape": r"mean image has shape|mean_file .* holds a blob",
    "mean_value_count": r"1 mean_value or as many as channels",
    "mean_both": r"cannot specify mean_file and mean_value",
    "force_both": r"both force_color and force_gray",
    "channels": r"shape|channel",
    "size": r"shape|size",
    "mean_axes": r"at most 4 axes",
    "mean_count_mismatch": r"holds \d+ values",
}


def expect_error(kind, err):
    text = str(err)
    assert re.search(r"layer 'fuzz' \((Data|MemoryData)\)", text), \
        f"the message does not name the layer: {text}"
    assert re.search(ERRORS[kind], text), f"expected a {kind!r} error, got: {text}"


def assert_one_of(out, outs, hits=None, what=""):
    """``out`` equals, bit for bit, the reference output of some allowed draw script."""
    for script, ref in outs.items():
        if out.shape == ref.shape and out.dtype == ref.dtype and np.array_equal(out, ref):
            if hits is not None:
                hits.add(script)
            return script
    shapes = {r.shape for r in outs.values()}
    raise AssertionError(f"{what}: minicaffe's output {out.shape} {out.dtype} matches none of "
                         f"the {len(outs)} outputs Caffe can draw (shapes {shapes})\n{out}\n"
                         f"first candidate:\n{next(iter(outs.values()), None)}")


# ===================================================================== the cases
PATHS = ("datums", "images", "data_lmdb", "memory_data")
KINDS = ("uint8", "float", "encoded", "uint8_long", "float_long", "uint8_and_float")
MEANS = ("none", "value1", "valueC", "value_bad", "file", "file_shape", "file_double",
         "file_n2", "file_3d", "file_bad_hw", "file_bad_c", "file_cropped", "both")
N_CASES = 96


def make_cases(seed=20250611):
    rng = np.random.default_rng(seed)
    cases = []
    for i in range(N_CASES):
        path = PATHS[i % len(PATHS)]
        kinds = ("uint8", "float") if path == "images" else KINDS
        kind = str(rng.choice(kinds))
        c = int(rng.choice([1, 3]))
        h, w = (int(v) for v in rng.integers(1, 10, 2))
        # no crop; the crop equal to H or W (the smaller side); any crop that fits; the
        # larger side (too large unless H == W); one past the smaller side (too large)
        crop = int(rng.choice([0, 0, min(h, w), min(h, w), int(rng.integers(1, min(h, w) + 1)),
                               int(rng.integers(1, min(h, w) + 1)), max(h, w), min(h, w) + 1]))
        mean = str(rng.choice(MEANS, p=[.16, .12, .16, .04, .14, .06, .05, .06, .05, .04, .03,
                                        .05, .04]))
        if i < len(MEANS):      # every kind of mean at least once
            mean = MEANS[(5 * i) % len(MEANS)]
        force = str(rng.choice(["", "", "color", "gray", "both"], p=[.5, .2, .12, .12, .06]))
        mixed = bool(path == "data_lmdb" and rng.random() < 0.4)
        if mixed and mean.startswith("file") and rng.random() < 0.75:
            mean = str(rng.choice(["none", "value1", "valueC"]))   # a mean_file fits one size
        cases.append(dict(
            i=i, path=path, kind=kind, c=c, h=h, w=w, crop=crop, mean=mean, force=force,
            phase=int(rng.choice([TRAIN, TEST])), mirror=bool(rng.integers(2)),
            scale=float(rng.choice([1.0, 0.00390625, 0.017, -0.5, 2.0])),
            dtype=str(rng.choice(["float32", "float32", "float64"])),
            # Data: records of several sizes (>= crop) in one database
            mixed=mixed,
            batch=int(rng.integers(1, 5)), prefetch=int(rng.choice([0, 2])),
            mem_off=bool(path == "memory_data" and rng.random() < 0.15),
            seed=int(rng.integers(2**31))))
    return cases


CASES = make_cases()


def case_id(k):
    return (f"{k['i']:02d}-{k['path']}-{k['kind']}-C{k['c']}-{k['h']}x{k['w']}-crop{k['crop']}-"
            f"{'TRAIN' if k['phase'] == TRAIN else 'TEST'}{'-mirror' if k['mirror'] else ''}-"
            f"{k['mean']}{'-force_' + k['force'] if k['force'] else ''}"
            f"{'-mixed' if k['mixed'] else ''}")


# ----------------------------------------------------------------- inputs
def png_bytes(hwc):
    """A PNG of an HWC uint8 image in Caffe's channel order (BGR): Pillow writes RGB."""
    buf = _pyio.BytesIO()
    if hwc.shape[2] == 1:
        Image.fromarray(hwc[:, :, 0], "L").save(buf, "PNG")
    else:
        Image.fromarray(np.ascontiguousarray(hwc[:, :, ::-1]), "RGB").save(buf, "PNG")
    return buf.getvalue()


def make_datum(rng, kind, c, h, w, label):
    d = caffe_pb2.Datum(label=label)
    if kind == "encoded":
        d.encoded = True     # convert_imageset --encoded leaves channels/height/width unset
        d.data = png_bytes(rng.integers(0, 256, (h, w, c), dtype=np.uint8))
        return d
    d.channels, d.height, d.width = c, h, w
    n = c * h * w
    if kind in ("uint8", "uint8_long", "uint8_and_float"):
        extra = int(rng.integers(1, 9)) if kind == "uint8_long" else 0
        d.data = rng.integers(0, 256, n + extra, dtype=np.uint8).tobytes()
        if kind == "uint8_and_float":   # Caffe reads data (has_uint8) and ignores float_data
            d.float_data.extend(rng.uniform(-9, 9, n).astype(np.float32).tolist())
    else:
        extra = int(rng.integers(1, 9)) if kind == "float_long" else 0
        d.float_data.extend(rng.uniform(-20, 300, n + extra).astype(np.float32).tolist())
    return d


def make_mean_proto(rng, how, c, h, w, crop):
    """The BlobProto of the case's mean_file."""
    shape = {"file": (1, c, h, w), "file_shape": (1, c, h, w), "file_double": (1, c, h, w),
             "file_n2": (2, c, h, w), "file_3d": (c, h, w), "file_bad_hw": (1, c, h + 1, w),
             "file_bad_c": (1, 4 - c, h, w), "file_cropped": (1, c, crop or h, crop or w),
             "both": (1, c, h, w)}[how]
    values = rng.uniform(0, 200, int(np.prod(shape))).astype(np.float32)
    p = caffe_pb2.BlobProto()
    if how in ("file", "file_double", "file_n2", "file_bad_hw", "file_bad_c", "file_cropped",
               "both"):
        p.num, p.channels, p.height, p.width = shape     # compute_image_mean's legacy dims
    else:
        p.shape.dim.extend(shape)                        # pycaffe's array_to_blobproto
    if how == "file_double":
        p.double_data.extend(values.astype(np.float64) + 1e-9)   # rounds to the float
    else:
        p.data.extend(values.tolist())
    return p


def make_param(k, tmp_path, rng):
    p = caffe_pb2.TransformationParameter(scale=k["scale"], mirror=k["mirror"])
    if k["crop"]:
        p.crop_size = k["crop"]
    mean_proto = None
    if k["mean"].startswith("file") or k["mean"] == "both":
        mean_proto = make_mean_proto(rng, k["mean"], k["c"], k["h"], k["w"], k["crop"])
        path = tmp_path / "mean.binaryproto"
        write_binary(mean_proto, str(path))
        p.mean_file = str(path)
    vals = rng.uniform(0, 150, 3).astype(np.float32).tolist()
    n_vals = {"value1": 1, "valueC": k["c"], "value_bad": 2 if k["c"] == 3 else 3,
              "both": 1}.get(k["mean"], 0)
    p.mean_value.extend(vals[:n_vals])
    if k["force"] in ("color", "both"):
        p.force_color = True
    if k["force"] in ("gray", "both"):
        p.force_gray = True
    return p, mean_proto


def record_shapes(k, rng, n):
    """(C, H, W) of each of ``n`` records: the case's, or sizes around it (``mixed``)."""
    if not k["mixed"]:
        return [(k["c"], k["h"], k["w"])] * n
    lo = max(k["crop"], 1)
    return [(k["c"], int(rng.integers(lo, lo + 4)), int(rng.integers(lo, lo + 4)))
            for _ in range(n)]


# ------------------------------------------------------------ the harness
def reference_batches(ref, datums, batch_size, n_batches):
    """What Caffe's Data layer makes of ``n_batches`` batches read in order, wrapping:
    per batch, [(datum index, {draw script: output})]; or raises CaffeCheck."""
    ref.infer_shape(datums[0])                                    # DataLayerSetUp
    batches, pos = [], 0
    for _ in range(n_batches):
        items = []
        for item in range(batch_size):
            d = datums[pos % len(datums)]
            if item == 0:
                blob_shape = ref.infer_shape(d)                   # load_batch: first datum
            h, w = datum_hw(ref, d)
            outs = ref.all_outputs(lambda rand, d=d: ref.transform_datum(d, blob_shape, rand),
                                   h, w)
            items.append((pos % len(datums), outs))
            pos += 1
        batches.append(items)
    return batches


def run_case(k, tmp_path):
    rng = np.random.default_rng(k["seed"])
    dtype = np.dtype(k["dtype"])
    param, mean_proto = make_param(k, tmp_path, rng)
    phase = k["phase"]
    try:
        ref = RefTransformer(param, phase, dtype, mean_proto)
        expected_error = None
    except CaffeCheck as e:
        ref, expected_error = None, e.args[0]
    set_random_seed(k["seed"] % 1000)
    runner = {"datums": run_datums, "images": run_images, "data_lmdb": run_data_layer,
              "memory_data": run_memory_data}[k["path"]]
    runner(k, tmp_path, rng, param, ref, expected_error, dtype)


def minicaffe_must_refuse(kind, fn):
    with pytest.raises((ValueError, RuntimeError)) as info:
        fn()
    expect_error(kind, info.value)


def run_datums(k, tmp_path, rng, param, ref, expected_error, dtype):
    """DataTransformer.transform_datums: Caffe's Transform(vector<Datum>, Blob*) into the
    blob InferBlobShape makes of the first Datum (what MemoryData and Data do)."""
    datums = [make_datum(rng, k["kind"], k["c"], k["h"], k["w"], i) for i in range(4)]
    if expected_error is None:
        try:
            batches = reference_batches(ref, datums, len(datums), 1)
        except CaffeCheck as e:
            expected_error = e.args[0]

    def build():
        return DataTransformer(param, phase=k["phase"], dtype=dtype, where=WHERE)
    if expected_error is not None:
        minicaffe_must_refuse(expected_error, lambda: build().transform_datums(datums))
        return
    t = build()
    for _ in range(6):
        data, labels = t.transform_datums(datums)
        assert data.dtype == dtype and labels.tolist() == list(range(len(datums)))
        for out, (_, outs) in zip(data, batches[0]):
            assert_one_of(out, outs, what=case_id(k))


def run_images(k, tmp_path, rng, param, ref, expected_error, dtype):
    """DataTransformer.transform of (N, C, H, W) arrays: uint8 ones against Caffe's cv::Mat
    path (ImageData's), float ones against the float_data Datum path; then, with the draws
    given, exactly, and against the Blob path with one draw shared by the batch."""
    n = 3
    if k["kind"] == "uint8":
        x = rng.integers(0, 256, (n, k["c"], k["h"], k["w"]), dtype=np.uint8)
    else:
        x = rng.uniform(-20, 300, (n, k["c"], k["h"], k["w"])).astype(np.float32)

    def ref_one(img, blob_shape, rand):
        if img.dtype == np.uint8:
            return ref.transform_mat(img.transpose(1, 2, 0), blob_shape, rand)
        d = mio.array_to_datum(img)
        return ref.transform_datum(d, blob_shape, rand)

    if expected_error is None:
        try:
            shape = (1, k["c"], k["crop"] or k["h"], k["crop"] or k["w"])
            check(k["h"] >= k["crop"] and k["w"] >= k["crop"], "crop")
            outs = [ref.all_outputs(lambda rand, im=im: ref_one(im, shape, rand), k["h"], k["w"])
                    for im in x]
        except CaffeCheck as e:
            expected_error = e.args[0]

    def build():
        return DataTransformer(param, phase=k["phase"], dtype=dtype, where=WHERE)
    if expected_error is not None:
        minicaffe_must_refuse(expected_error, lambda: build().transform(x))
        return
    t = build()
    for _ in range(6):
        y = t.transform(x)
        for out, o in zip(y, outs):
            assert_one_of(out, o, what=case_id(k))
    # exact: the draws handed in, per image, and one draw for the batch (the Blob path)
    scripts = list(outs[0])
    for script in scripts[:4]:
        mirror, h_off, w_off = script_to_draws(ref, script, k["h"], k["w"])
        y = t.transform(x, draws=([mirror] * n, [h_off] * n, [w_off] * n))
        for out, o in zip(y, outs):
            np.testing.assert_array_equal(out, o[script])
        it = iter(script)
        blob = ref.transform_blob(x, lambda m: next(it))
        np.testing.assert_array_equal(y, blob)


def script_to_draws(ref, script, h, w):
    """minicaffe's ``(do_mirror, h_off, w_off)`` for a Caffe draw script."""
    it = iter(script)
    mirror = bool(next(it)) if ref.p.mirror else False
    crop = ref.p.crop_size
    if crop and ref.phase == TRAIN:
        return mirror, next(it), next(it)
    if crop:
        return mirror, (h - crop) // 2, (w - crop) // 2
    return mirror, 0, 0


def data_layer_text(source, k):
    return (f'name: "fuzz" type: "Data" top: "data" top: "label" '
            f'data_param {{ source: "{source}" batch_size: {k["batch"]} backend: LMDB '
            f'prefetch: {k["prefetch"]} }}')


def run_data_layer(k, tmp_path, rng, param, ref, expected_error, dtype):
    """The Data layer over an LMDB of Datums, forwarded past one wrap-around."""
    n_rec = 5
    shapes = record_shapes(k, rng, n_rec)
    datums = [make_datum(rng, k["kind"], c, h, w, i) for i, (c, h, w) in enumerate(shapes)]
    source = tmp_path / "lmdb"
    with mio.LMDBWriter(source) as wr:
        for i, d in enumerate(datums):
            wr.put(f"{i:08d}", d.SerializeToString())
    n_batches = -(-n_rec // k["batch"]) + 1
    if expected_error is None:
        try:
            batches = reference_batches(ref, datums, k["batch"], n_batches)
        except CaffeCheck as e:
            expected_error = e.args[0]
    lp = parse_text(data_layer_text(source, k), caffe_pb2.LayerParameter)
    lp.transform_param.CopyFrom(param)
    lp.phase = k["phase"]

    def run():
        layer = create_layer(lp, xp=np, dtype=dtype)
        top = [Blob(xp=np, dtype=dtype, name="data"), Blob(xp=np, dtype=dtype, name="label")]
        try:
            layer.setup([], top)
            got = []
            for _ in range(n_batches):
                layer.forward([], top)
                got.append((top[0].data.copy(), top[1].data.copy()))
            return got
        finally:
            layer.close()
    if expected_error is not None:
        minicaffe_must_refuse(expected_error, run)
        return
    got = run()
    for (data, labels), items in zip(got, batches):
        assert labels.astype(int).tolist() == [i for i, _ in items]
        for out, (_, outs) in zip(data, items):
            assert_one_of(out, outs, what=case_id(k))


def run_memory_data(k, tmp_path, rng, param, ref, expected_error, dtype):
    """MemoryData.add_datum_vector (Caffe's AddDatumVector), three rounds, each forwarded."""
    b = k["batch"]
    oc, oh, ow = k["c"], k["crop"] or k["h"], k["crop"] or k["w"]
    if k["mem_off"]:
        ow += 1
    text = (f'name: "fuzz" type: "MemoryData" top: "data" top: "label" memory_data_param {{ '
            f'batch_size: {b} channels: {oc} height: {oh} width: {ow} }}')
    lp = parse_text(text, caffe_pb2.LayerParameter)
    lp.transform_param.CopyFrom(param)
    lp.phase = k["phase"]
    rounds = [[make_datum(rng, k["kind"], k["c"], k["h"], k["w"], 10 * r + i)
               for i in range(2 * b)] for r in range(3)]
    expected = []
    if expected_error is None:
        try:
            for datums in rounds:
                # added_data_.Reshape(num, channels_, height_, width_); Transform per datum
                expected.append([ref.all_outputs(
                    lambda rand, d=d: ref.transform_datum(d, (1, oc, oh, ow), rand),
                    *datum_hw(ref, d)) for d in datums])
        except CaffeCheck as e:
            expected_error = e.args[0]

    def run():
        layer = create_layer(lp, xp=np, dtype=dtype)
        top = [Blob(xp=np, dtype=dtype, name="data"), Blob(xp=np, dtype=dtype, name="label")]
        layer.setup([], top)
        got = []
        for datums in rounds:
            layer.add_datum_vector(datums)
            for _ in range(2):
                layer.forward([], top)
                got.append((top[0].data.copy(), top[1].data.copy()))
        return got
    if expected_error is not None:
        minicaffe_must_refuse(expected_error, run)
        return
    got = run()
    flat = [(d.label, outs) for datums, outs in zip(rounds, expected)
            for d, outs in zip(datums, outs)]
    pos = 0
    for data, labels in got:
        for out, lab in zip(data, labels.ravel()):
            assert int(lab) == flat[pos][0]
            assert_one_of(out, flat[pos][1], what=case_id(k))
            pos += 1


@pytest.mark.parametrize("k", CASES, ids=case_id)
def test_fuzz_case(k, tmp_path):
    run_case(k, tmp_path)


def test_fuzz_covers_what_it_claims():
    """The seeded cases vary what the brief says they vary."""
    seen = {f: {k[f] for k in CASES} for f in ("path", "kind", "c", "phase", "mean", "force",
                                                "mirror", "dtype", "mixed")}
    assert seen["path"] == set(PATHS) and seen["c"] == {1, 3} and seen["phase"] == {0, 1}
    assert set(MEANS) <= seen["mean"] and set(KINDS) <= seen["kind"]
    assert {True, False} <= seen["mirror"] and {True, False} <= seen["mixed"]
    crops = [(k["crop"], k["h"], k["w"]) for k in CASES]
    assert any(c == h for c, h, _ in crops) and any(c == w for c, _, w in crops)
    assert any(c > min(h, w) for c, h, w in crops) and any(c == 0 for c, _, _ in crops)


# ================================================== the draws: coverage and order
@pytest.mark.parametrize("phase", [TRAIN, TEST])
def test_draws_cover_every_crop_and_mirror(phase):
    """Over many images, minicaffe's draws take every (mirror, h_off, w_off) Caffe can
    draw, each about equally often (Caffe's ``rng() % n`` is uniform up to 2^-32)."""
    c, h, w, crop = 2, 6, 5, 3
    x = np.arange(c * h * w, dtype=np.uint8).reshape(1, c, h, w)   # unique pixels
    param = caffe_pb2.TransformationParameter(crop_size=crop, mirror=True)
    ref = RefTransformer(param, phase, np.float32)
    outs = ref.all_outputs(lambda rand: ref.transform_mat(x[0].transpose(1, 2, 0),
                                                          (1, c, crop, crop), rand), h, w)
    assert len(outs) == (2 * (h - crop + 1) * (w - crop + 1) if phase == TRAIN else 2)
    set_random_seed(5)
    t = DataTransformer(param, phase, where=WHERE)
    n = 150 * len(outs)
    y = t.transform(np.repeat(x, n, axis=0))
    counts = {}
    for out in y:
        s = assert_one_of(out, outs, what="coverage")
        counts[s] = counts.get(s, 0) + 1
    assert set(counts) == set(outs)
    assert min(counts.values()) > 0.6 * n / len(outs) and max(counts.values()) < 1.4 * n / len(outs)


def test_data_layer_draws_cover_every_crop_and_mirror(tmp_path):
    """The same through the Data layer (its prefetch thread owns the draws)."""
    c, h, w, crop, n_rec = 1, 4, 5, 3, 8
    pixels = [((np.arange(c * h * w) + 20 * i) % 256).astype(np.uint8) for i in range(n_rec)]
    datums = [caffe_pb2.Datum(channels=c, height=h, width=w, label=i, data=x.tobytes())
              for i, x in enumerate(pixels)]
    with mio.LMDBWriter(tmp_path / "db") as wr:
        for i, d in enumerate(datums):
            wr.put(f"{i:08d}", d.SerializeToString())
    param = caffe_pb2.TransformationParameter(crop_size=crop, mirror=True, scale=0.5)
    ref = RefTransformer(param, TRAIN, np.float32)
    outs = [ref.all_outputs(lambda rand, d=d: ref.transform_datum(d, (1, c, crop, crop), rand),
                            h, w) for d in datums]
    set_random_seed(9)
    layer = make_layer(f'name: "fuzz" type: "Data" top: "data" top: "label" data_param {{ '
                       f'source: "{tmp_path / "db"}" batch_size: 8 backend: LMDB }} '
                       f'transform_param {{ crop_size: {crop} mirror: true scale: 0.5 }}',
                       dtype=np.float32, phase=TRAIN)
    top = [Blob(xp=np, dtype=np.float32), Blob(xp=np, dtype=np.float32)]
    layer.setup([], top)
    hits = set()
    try:
        for _ in range(40):
            layer.forward([], top)
            for out, lab in zip(top[0].data, top[1].data.astype(int)):
                hits.add(assert_one_of(out, outs[lab], what="Data coverage"))
    finally:
        layer.close()
    assert hits == set(outs[0])     # 2 * 2 * 3 = 12 scripts, 320 images


# ============================================ regressions: departures found and fixed
def legacy_mean(tmp_path, arr):
    p = caffe_pb2.BlobProto()
    p.num, p.channels, p.height, p.width = arr.shape
    p.data.extend(arr.astype(np.float32).ravel().tolist())
    write_binary(p, str(tmp_path / "mean.binaryproto"))
    return str(tmp_path / "mean.binaryproto")


def test_float_data_longer_than_the_image_reads_its_first_elements(tmp_path):
    """Caffe reads ``datum.float_data(data_index)`` for data_index < C*H*W and never checks
    the length (as for the bytes of ``data``); minicaffe refused a longer float_data."""
    d = caffe_pb2.Datum(channels=1, height=2, width=2, label=3)
    d.float_data.extend([1.5, 2.5, 3.5, 4.5, 99.0])
    t = DataTransformer(caffe_pb2.TransformationParameter(scale=2), TEST, where=WHERE)
    data, labels = t.transform_datums([d])
    np.testing.assert_array_equal(data, [[[[3, 5], [7, 9]]]])
    mem = make_layer('name: "fuzz" type: "MemoryData" top: "data" top: "label" '
                     'memory_data_param { batch_size: 1 channels: 1 height: 2 width: 2 }',
                     dtype=np.float32)
    top = [Blob(xp=np, dtype=np.float32), Blob(xp=np, dtype=np.float32)]
    mem.setup([], top)
    mem.add_datum_vector([d])
    mem.forward([], top)
    np.testing.assert_array_equal(top[0].data, [[[[1.5, 2.5], [3.5, 4.5]]]])


def test_data_shorter_than_the_image_is_refused_naming_the_layer():
    """Fewer bytes (or floats) than C*H*W: Caffe reads past them; minicaffe refuses, and
    says which layer (the Data layer's prefetch thread named it, MemoryData did not)."""
    d = caffe_pb2.Datum(channels=1, height=2, width=2, data=b"abc")
    mem = make_layer('name: "fuzz" type: "MemoryData" top: "data" top: "label" '
                     'memory_data_param { batch_size: 1 channels: 1 height: 2 width: 2 }')
    mem.setup([], [Blob(xp=np), Blob(xp=np)])
    with pytest.raises(ValueError, match=r"^layer 'fuzz' \(MemoryData\): Datum of shape "
                                         r"\(1, 2, 2\) holds 3 bytes, expected 4"):
        mem.add_datum_vector([d])


def test_mean_file_of_several_images_serves_as_its_first(tmp_path):
    """Caffe CHECKs the image against the mean blob's channels(), height(), width() and
    reads its first C*H*W values: a (2, C, H, W) mean works; minicaffe refused it."""
    mean = np.stack([np.full((1, 2, 3), 10.0), np.full((1, 2, 3), 77.0)])
    p = caffe_pb2.TransformationParameter(mean_file=legacy_mean(tmp_path, mean), scale=0.5)
    x = np.full((1, 1, 2, 3), 30, np.uint8)
    np.testing.assert_array_equal(DataTransformer(p, TEST, where=WHERE).transform(x),
                                  np.full((1, 1, 2, 3), 10.0))


def test_a_mean_blob_without_the_image_axis_is_refused_as_caffe_reads_it(tmp_path):
    """A 3-axis (C, H, W) mean blob reads in Caffe as channels H, height W, width 1, which
    the (C, H, W) images do not match (Caffe: CHECK_EQ(datum_channels,
    data_mean_.channels())); minicaffe used it as (C, H, W)."""
    p = caffe_pb2.BlobProto()
    p.shape.dim.extend([3, 4, 5])
    p.data.extend([1.0] * 60)
    path = str(tmp_path / "m.binaryproto")
    param = caffe_pb2.TransformationParameter(mean_file=path)
    write_binary(p, path)
    t = DataTransformer(param, TEST, where=WHERE)
    with pytest.raises(ValueError, match=r"layer 'fuzz' \(Data\): the mean image has shape "
                                         r"\(4, 5, 1\).*\(3, 4, 5\).*\(1, C, H, W\)"):
        t.transform(np.zeros((1, 3, 4, 5), np.uint8))
    p.ClearField("shape")
    p.shape.dim.extend([1, 1, 3, 4, 5])      # Blob::LegacyShape: at most 4 axes
    write_binary(p, path)
    with pytest.raises(ValueError, match=r"layer 'fuzz' \(Data\): mean_file .* at most 4 axes"):
        DataTransformer(param, TEST, where=WHERE)


def test_force_color_and_force_gray_fail_only_on_encoded_datums(caplog):
    """Caffe CHECKs !(force_color && force_gray) where it decodes an encoded Datum; for raw
    Datums it logs "force_color and force_gray only for encoded datum" and transforms them.
    minicaffe refused both flags when the transformer was built."""
    p = caffe_pb2.TransformationParameter(force_color=True, force_gray=True)
    t = DataTransformer(p, TEST, where=WHERE)
    raw = mio.array_to_datum(np.arange(6, dtype=np.uint8).reshape(1, 2, 3), 1)
    data, _ = t.transform_datums([raw, raw])
    np.testing.assert_array_equal(data[1, 0], np.arange(6).reshape(2, 3))
    assert "only for encoded datum" in caplog.text
    enc = caffe_pb2.Datum(encoded=True, data=png_bytes(np.zeros((2, 3, 3), np.uint8)))
    with pytest.raises(ValueError, match=r"layer 'fuzz' \(Data\): cannot set both force_color "
                                         "and force_gray"):
        t.transform_datums([enc])


def test_data_layer_batch_of_datums_of_several_sizes_when_cropping(tmp_path):
    """With crop_size, Caffe's Data layer transforms each Datum of a batch from its own
    size (Transform(const Datum&, Blob*) checks channels and crop <= size only; TEST crops
    each at its own centre); without a crop the sizes must match.  minicaffe refused any
    batch of mixed sizes."""
    sizes = [(4, 5), (6, 3), (3, 3), (5, 7)]
    datums = [mio.array_to_datum(np.arange(2 * h * w, dtype=np.uint8).reshape(2, h, w), i)
              for i, (h, w) in enumerate(sizes)]
    with mio.LMDBWriter(tmp_path / "db") as wr:
        for i, d in enumerate(datums):
            wr.put(f"{i:08d}", d.SerializeToString())

    def layer(transform):
        lay = make_layer(f'name: "fuzz" type: "Data" top: "data" top: "label" data_param {{ '
                         f'source: "{tmp_path / "db"}" batch_size: 4 backend: LMDB prefetch: 0 }} '
                         f'transform_param {{ {transform} }}', dtype=np.float32, phase=TEST)
        top = [Blob(xp=np, dtype=np.float32), Blob(xp=np, dtype=np.float32)]
        lay.setup([], top)
        return lay, top
    lay, top = layer("crop_size: 3 mean_value: 1 mean_value: 2")
    try:
        lay.forward([], top)
    finally:
        lay.close()
    for out, d, (h, w) in zip(top[0].data, datums, sizes):
        img = np.frombuffer(d.data, np.uint8).reshape(2, h, w).astype(np.float32)
        ho, wo = (h - 3) // 2, (w - 3) // 2
        np.testing.assert_array_equal(out, img[:, ho:ho + 3, wo:wo + 3]
                                      - np.array([1, 2], np.float32).reshape(2, 1, 1))
    lay, top = layer("")
    try:
        with pytest.raises(ValueError, match=r"layer 'fuzz' \(Data\): .*datum 1 of the batch "
                                               r"has shape \(2, 6, 3\)"):
            lay.forward([], top)
    finally:
        lay.close()


def test_memory_data_checks_its_blob_before_the_mean(tmp_path):
    """AddDatumVector transforms into (num, channels, height, width) of memory_data_param;
    Transform(const Datum&, Blob*) checks the Datum against that blob before it reads the
    image (and the mean): a blob wider than the image is reported as such."""
    p = legacy_mean(tmp_path, np.zeros((1, 1, 4, 4)))
    mem = make_layer('name: "fuzz" type: "MemoryData" top: "data" top: "label" '
                     'memory_data_param { batch_size: 1 channels: 1 height: 4 width: 5 } '
                     f'transform_param {{ mean_file: "{p}" }}', dtype=np.float32)
    top = [Blob(xp=np, dtype=np.float32), Blob(xp=np, dtype=np.float32)]
    mem.setup([], top)
    d = mio.array_to_datum(np.zeros((1, 4, 4), np.uint8))
    with pytest.raises(ValueError, match=r"layer 'fuzz' \(MemoryData\): datum 0 has shape "
                                         r"\(1, 4, 4\), not cropped; the blob it goes to takes "
                                         r"\(C, H, W\) = \(1, 4, 5\)"):
        mem.add_datum_vector([d])
