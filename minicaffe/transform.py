"""Caffe's DataTransformer (``src/caffe/data_transformer.cpp``), vectorized over a batch.

For every image of a batch, in this order:

1. mirror: when ``mirror`` is set, flip left-right with probability 1/2
   (Caffe's ``Rand(2)``), in TRAIN *and* TEST, as Caffe does;
2. crop to ``crop_size`` x ``crop_size``: TRAIN draws the offsets
   ``h_off = Rand(H - crop + 1)``, ``w_off = Rand(W - crop + 1)``; TEST takes
   the centre, ``((H - crop) // 2, (W - crop) // 2)``;
3. subtract the mean: the mean image of ``mean_file``, cropped (and mirrored)
   together with the image, i.e. each output pixel subtracts the mean at the
   source pixel it came from; or ``mean_value`` (one per channel, or one for
   all); not both;
4. multiply by ``scale`` (after the mean subtraction).

The arithmetic is Caffe's: ``(Dtype(pixel) - Dtype(mean)) * Dtype(scale)``.

Random draws come from a generator owned by the transformer and seeded from
:func:`minicaffe.rng.host_rng` when the transformer is built (Caffe's
``InitRand`` seeds the transformer's RNG from ``caffe_rng_rand()`` the same
way, and only when it needs one: ``mirror`` or a TRAIN crop).  The Data layer
transforms in its prefetch thread; a private generator keeps those draws
independent of what the main thread draws meanwhile, so a seed reproduces
every batch whatever the thread timing.

The transform runs on the host in NumPy; the Data layer copies the finished
batch to the device once per iteration.
"""
from __future__ import annotations

import logging

import numpy as np

from .io import datum_image, load_mean_file, resolve_path
from .rng import host_rng

log = logging.getLogger(__name__)

TRAIN, TEST = 0, 1


def _caffe_read_prefix(datum):
    """The Datum as Caffe's DataTransformer reads it: the first C*H*W elements of a raw
    ``data`` field, or of ``float_data`` when there are no bytes, neither of which it
    checks for length (``Transform(const Datum&, Dtype*)`` indexes ``data[data_index]`` or
    ``datum.float_data(data_index)`` with ``data_index < C*H*W``; Alexey-Kamenev/
    Benchmarks' createFakeImageNet.py stores float64 ``tostring()`` bytes, eight an
    element, and trains on them).  Shorter data stays an error (Caffe reads past its
    end)."""
    n = datum.channels * datum.height * datum.width
    if datum.encoded:
        return datum
    long_bytes = len(datum.data) > n
    long_floats = not len(datum.data) and len(datum.float_data) > n
    if not (long_bytes or long_floats):
        return datum
    cut = type(datum)()
    cut.CopyFrom(datum)
    if long_bytes:
        cut.data = datum.data[:n]
    else:
        del cut.float_data[n:]
    return cut


def _caffe_mean_image(mean, path, where):
    """The mean image Caffe's transformer reads from a mean_file blob of any shape.

    ``Blob::FromProto`` keeps the stored shape, and ``Transform`` CHECKs the image against
    ``data_mean_.channels()``, ``height()`` and ``width()``: axes 1, 2 and 3, padded with 1s
    (``Blob::LegacyShape``, which CHECK-fails beyond 4 axes), then reads the first C*H*W
    values.  So an ``(N, C, H, W)`` blob with N > 1 serves as its first image, and a
    3-axis ``(C, H, W)`` blob (pycaffe's ``array_to_blobproto`` of an image without its
    leading axis) reads as ``(H, W, 1)``, which no image of shape (C, H, W) matches.
    Returns ``(C, H, W)`` as Caffe reads it."""
    shape = mean.shape
    if mean.ndim > 4:
        raise ValueError(f"{where}: mean_file {path} holds a blob of shape {shape}; Caffe "
                         "reads a mean of at most 4 axes, (1, C, H, W)")
    padded = shape + (1,) * (4 - mean.ndim)
    if padded[0] < 1:
        raise ValueError(f"{where}: mean_file {path} holds a blob of shape {shape}, with no "
                         "image in it; expected (1, C, H, W)")
    chw = padded[1:]
    return mean.reshape(-1)[:int(np.prod(chw))].reshape(chw)


class DataTransformer:
    """Transform batches of ``(N, C, H, W)`` images as a TransformationParameter says.

    Args:
        param: a ``caffe_pb2.TransformationParameter``.
        phase: TRAIN (0) or TEST (1); decides random or centre crops.
        dtype: the output element type (the net's).
        source_dir: folder of the prototxt, to find a relative ``mean_file``.
        where: prefix for error messages (``layer 'data' (Data)``).
    """

    def __init__(self, param, phase: int, dtype=np.float32, source_dir=None, where: str = ""):
        self.param = param
        self.phase = int(phase)
        self.dtype = np.dtype(dtype)
        self.where = where
        self.crop_size = int(param.crop_size)
        self.mirror = bool(param.mirror)
        self.scale = float(param.scale)
        self.mean = None          # (C, H, W) mean image from mean_file
        self.mean_values = None   # (k,) with k == 1 or C
        if param.HasField("mean_file"):
            if len(param.mean_value):
                raise ValueError(
                    f"{where}: cannot specify mean_file and mean_value at the same time")
            path = resolve_path(param.mean_file, source_dir, "mean_file", where)
            stored = load_mean_file(path)
            self.mean_blob_shape = stored.shape
            self.mean = _caffe_mean_image(stored, path, where).astype(self.dtype)
            self.mean_file = param.mean_file
        elif len(param.mean_value):
            self.mean_values = np.asarray(param.mean_value, dtype=self.dtype)
        # force_color with force_gray: Caffe CHECK-fails only when it decodes an encoded
        # Datum (Transform, InferBlobShape), and for raw Datums logs an error and goes on;
        # see datum_image
        self._warned_force = False
        # Caffe's InitRand: a generator only where the transform is random.
        needs_rand = self.mirror or (self.phase == TRAIN and self.crop_size > 0)
        self.rng = (np.random.default_rng(int(host_rng().integers(0, 2**63 - 1)))
                    if needs_rand else None)

    # ---------------------------------------------------------------- shapes
    def output_shape(self, chw) -> tuple:
        """The ``(C, h, w)`` an input image of shape ``chw`` transforms to
        (Caffe's ``InferBlobShape``)."""
        c, h, w = (int(d) for d in chw)
        if c <= 0:
            raise ValueError(
                f"{self.where}: images need at least one channel, got shape {tuple(chw)}")
        crop = self.crop_size
        if crop and (h < crop or w < crop):
            raise ValueError(f"{self.where}: crop_size {crop} is larger than the image "
                             f"({h} x {w})")
        # Caffe CHECKs the mean against the datum at the first Transform, in the prefetch
        # thread; the layers call output_shape at setup, so a wrong mean fails there
        self._check_mean(c, h, w)
        return (c, crop, crop) if crop else (c, h, w)

    def _check_mean(self, c, h, w):
        if self.mean is not None and self.mean.shape != (c, h, w):
            where = f"{self.where}: " if self.where else ""
            stored = self.mean_blob_shape
            how = ("" if len(stored) == 4 else
                   f", read as Caffe reads the blob of shape {stored} it holds (axes 1 to 3: "
                   "store the mean as (1, C, H, W))")
            raise ValueError(f"{where}the mean image has shape {self.mean.shape} (mean_file "
                             f"{self.mean_file!r}{how}) but the images have shape {(c, h, w)}; "
                             "the mean must have the images' shape, before any crop")
        if self.mean_values is not None and self.mean_values.size not in (1, c):
            raise ValueError(f"{self.where}: specify either 1 mean_value or as many as channels: "
                             f"{c} (got {self.mean_values.size})")

    # ------------------------------------------------------------- transform
    def draw(self, n: int, height: int, width: int):
        """Draw the random choices of ``n`` images of size ``height`` x ``width``.

        Returns ``(do_mirror (n,) bool, h_off (n,) int, w_off (n,) int)``.
        The mirror coins are drawn before the crop offsets, as in Caffe.
        """
        crop = self.crop_size
        if self.mirror:
            do_mirror = self.rng.integers(0, 2, size=n).astype(bool)
        else:
            do_mirror = np.zeros(n, dtype=bool)
        if crop and self.phase == TRAIN:
            h_off = self.rng.integers(0, height - crop + 1, size=n)
            w_off = self.rng.integers(0, width - crop + 1, size=n)
        elif crop:
            h_off = np.full(n, (height - crop) // 2)
            w_off = np.full(n, (width - crop) // 2)
        else:
            h_off = np.zeros(n, dtype=np.int64)
            w_off = np.zeros(n, dtype=np.int64)
        return do_mirror, h_off, w_off

    def transform(self, images, out=None, draws=None) -> np.ndarray:
        """Transform a batch ``(N, C, H, W)`` (uint8 or float) to ``(N, C, h, w)``.

        Args:
            images: the batch; a single ``(C, H, W)`` image is accepted too.
            out: optional preallocated output of the right shape and dtype.
            draws: optional ``(do_mirror, h_off, w_off)`` to use instead of
                drawing (tests, replay).
        """
        images = np.asarray(images)
        single = images.ndim == 3
        if single:
            images = images[np.newaxis]
        if images.ndim != 4:
            raise ValueError(f"{self.where}: transform needs (N, C, H, W) images, got shape "
                             f"{images.shape}")
        n, c, height, width = images.shape
        oc, oh, ow = self.output_shape((c, height, width))
        self._check_mean(c, height, width)
        do_mirror, h_off, w_off = draws if draws is not None else self.draw(n, height, width)
        do_mirror = np.asarray(do_mirror, dtype=bool)
        h_off = np.asarray(h_off, dtype=np.int64)
        w_off = np.asarray(w_off, dtype=np.int64)

        dt = self.dtype.type
        if not do_mirror.any() and not self.crop_size:
            # the common case of no geometry: plain arithmetic, no gather
            pixels = images.astype(self.dtype, copy=False)
            mean = self.mean[np.newaxis] if self.mean is not None else None
        elif not do_mirror.any() and np.all(h_off == h_off[0]) and np.all(w_off == w_off[0]):
            # one window for the whole batch (TEST centre crop): a slice
            hs = slice(int(h_off[0]), int(h_off[0]) + oh)
            ws = slice(int(w_off[0]), int(w_off[0]) + ow)
            pixels = images[:, :, hs, ws].astype(self.dtype)
            mean = self.mean[np.newaxis, :, hs, ws] if self.mean is not None else None
        else:
            # per-image windows and flips: gather the source pixel of every
            # output pixel; top[w] = source[w_off + w], or [w_off + ow-1-w] flipped
            span_h, span_w = np.arange(oh), np.arange(ow)
            rows = h_off[:, None] + span_h                                  # (N, oh)
            cols = w_off[:, None] + np.where(do_mirror[:, None], span_w[::-1], span_w)  # (N, ow)
            ci = np.arange(c)[None, :, None, None]
            ri = rows[:, None, :, None]
            wi = cols[:, None, None, :]
            pixels = images[np.arange(n)[:, None, None, None], ci, ri, wi].astype(self.dtype)
            mean = self.mean[ci, ri, wi] if self.mean is not None else None  # (N, C, oh, ow)

        if mean is not None:
            result = (pixels - mean) * dt(self.scale)
        elif self.mean_values is not None:
            mv = np.broadcast_to(self.mean_values, (c,)).reshape(1, c, 1, 1)
            result = (pixels - mv) * dt(self.scale)
        else:
            result = pixels * dt(self.scale)
        result = result.astype(self.dtype, copy=False)
        if out is not None:
            if out.shape != (n, oc, oh, ow):
                raise ValueError(f"{self.where}: output buffer of shape {out.shape}, need "
                                 f"{(n, oc, oh, ow)}")
            out[...] = result
            result = out
        return result[0] if single else result

    def datum_image(self, datum) -> np.ndarray:
        """The ``(C, H, W)`` image of a Datum as Caffe's ``Transform`` reads it: an encoded one
        decoded with ``force_color``/``force_gray`` (both set: Caffe's CHECK), a raw one as
        stored (the first C*H*W elements; the force fields only draw Caffe's LOG(ERROR))."""
        p = self.param
        if datum.encoded and p.force_color and p.force_gray:
            raise ValueError(f"{self.where}: cannot set both force_color and force_gray "
                             "(transform_param) to decode an encoded Datum")
        if not datum.encoded and (p.force_color or p.force_gray) and not self._warned_force:
            log.error("%s: force_color and force_gray only for encoded datum", self.where)
            self._warned_force = True
        try:
            return datum_image(_caffe_read_prefix(datum), p.force_color, p.force_gray)
        except ValueError as e:    # too few bytes or floats (Caffe would read past them)
            if self.where and not str(e).startswith(self.where):
                raise ValueError(f"{self.where}: {e}") from None
            raise

    def transform_datums(self, datums, out=None, expect=None):
        """Transform a list of Datums; returns ``(data, labels)``.

        The batch takes the shape of the first Datum, as Caffe's Data layer and
        ``Transform(const vector<Datum>&, Blob*)`` shape it.  With ``crop_size`` the other
        Datums may be of other sizes (at least the crop, with the first's channels):
        ``Transform(const Datum&, Blob*)`` only checks ``channels == datum_channels`` and
        ``crop <= datum_height, datum_width`` then; without a crop they must match it.

        ``expect``: the ``(C, h, w)`` of the blob the caller transforms into (MemoryData's
        ``memory_data_param``), checked against every Datum first, as that ``Transform``
        checks it before it reads the image.
        """
        if not datums:
            raise ValueError(f"{self.where}: there is no datum to transform")
        arrays = [self.datum_image(d) for d in datums]
        shape = arrays[0].shape
        if expect is not None:
            for i, a in enumerate(arrays):
                self._check_fits(i, a.shape, tuple(expect))
        labels = np.asarray([d.label for d in datums], dtype=self.dtype)
        if all(a.shape == shape for a in arrays):
            return self.transform(np.stack(arrays), out=out), labels
        for i, a in enumerate(arrays):
            if a.shape != shape and (a.shape[0] != shape[0] or not self.crop_size):
                raise ValueError(
                    f"{self.where}: datum {i} of the batch has shape {a.shape}, the first has "
                    f"{shape}; a batch needs images of one shape, or of one channel count "
                    "when transform_param.crop_size crops them")
        n = len(arrays)
        oshape = (n,) + self.output_shape(shape)
        if out is None:
            out = np.empty(oshape, dtype=self.dtype)
        elif out.shape != oshape:
            raise ValueError(f"{self.where}: output buffer of shape {out.shape}, need {oshape}")
        for i, a in enumerate(arrays):     # one by one: each Datum draws for its own size
            out[i] = self.transform(a)
        return out, labels

    def _check_fits(self, i, chw, blob_chw):
        """``Transform(const Datum&, Blob*)``'s checks of a Datum against the blob: the
        same channels, a blob no larger than the image, and the blob the crop's size (with
        crop_size) or the image's (without)."""
        (c, h, w), (bc, bh, bw) = chw, blob_chw
        crop = self.crop_size
        fits = c == bc and ((crop == bh == bw and h >= crop and w >= crop) if crop
                            else (h, w) == (bh, bw))
        if not fits:
            if crop and crop == bh == bw and c == bc:
                raise ValueError(f"{self.where}: crop_size {crop} is larger than the image "
                                 f"({h} x {w}) of datum {i}")
            after = f"cropped to {crop} x {crop}" if crop else "not cropped"
            raise ValueError(f"{self.where}: datum {i} has shape {chw}, {after}; the blob it "
                             f"goes to takes (C, H, W) = {blob_chw}")
