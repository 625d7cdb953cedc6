"""WindowData: foreground and background windows of images, warped (Caffe's ``WindowDataLayer``).

The R-CNN data layer of Caffe's ``src/caffe/layers/window_data_layer.cpp`` (a
``BasePrefetchingDataLayer``, deprecated upstream and kept for the original R-CNN).

The window file (``window_data_param.source``) is a stream of whitespace-separated
records, one per image::

    # image_index
    img_path
    channels
    height
    width
    num_windows
    class_index overlap x1 y1 x2 y2      (num_windows lines; corners inclusive, 0-based)

* the image is read from ``root_folder + img_path`` (string concatenation); the
  declared channels/height/width are not checked against the file (Caffe only logs
  them), except that the *last* record's channel count shapes the data top;
* a window is foreground when ``overlap >= fg_threshold`` (its class must be > 0),
  background when ``overlap < bg_threshold`` (its label is forced to 0), and is
  dropped otherwise; ``image_index`` is the position of its image in the file;
* ``cache_images`` keeps every image file's bytes in memory from setup on and
  decodes them per window (Caffe's ``ReadFileToDatum`` + ``DecodeDatumToCVMat``);
  otherwise the image is read for every window; both read 3 channels in OpenCV's
  BGR order (``IMREAD_COLOR``).

Each batch (Caffe's ``load_batch``) is zeroed, then filled with
``batch_size - num_fg`` background windows followed by ``num_fg`` foreground ones,
``num_fg = int(float(batch_size) * fg_fraction)``.  Each window draws one 32-bit
number ``r`` and takes window ``r % len(list)``; with ``transform_param.mirror`` a
second draw flips it when odd (in TRAIN and TEST).  The window is then cut out and
warped to ``crop_size`` x ``crop_size`` (``transform_param.crop_size``, required):

* ``crop_mode: "warp"`` and ``context_pad: 0``: the window itself, resized;
* otherwise the window is grown about its centre by ``crop / (crop - 2 * pad)``
  (first made square, the larger half-side on both axes, for ``"square"``), so that
  after warping ``pad`` pixels of context surround it; the part outside the image
  is clipped and becomes zero padding of the size it would have had when warped,
  mirrored with the window (see :func:`warp_window`);
* the resize is OpenCV's ``INTER_LINEAR`` (:func:`minicaffe.io.resize_inter_linear`);
* each warped pixel becomes ``(pixel - mean) * scale``, where the mean is
  ``transform_param.mean_file``'s image at the same position inside its centred
  ``crop`` x ``crop`` square (offset ``(mean_width - crop) // 2`` on both axes),
  or ``transform_param.mean_value``; the zero padding is not mean-subtracted.

``scale`` is ``window_data_param.scale``: Caffe's WindowData ignores
``transform_param.scale`` (and the deprecated ``window_data_param`` fields
``mean_file``, ``crop_size`` and ``mirror``, which Caffe's V1 upgrade moves into
``transform_param``).

Randomness: Caffe's layer owns ``prefetch_rng_``, a ``boost::mt19937`` seeded with
``caffe_rng_rand()`` at setup.  minicaffe's is the same Mersenne Twister
(``numpy.random.RandomState``, whose 32-bit seeding and raw 32-bit outputs are
mt19937's), seeded with 32 bits from :func:`minicaffe.rng.host_rng`: given that
seed the windows and flips are exactly Caffe's; the seed itself differs from
Caffe's for the same ``random_seed``, since minicaffe's process generator is not
Caffe's.  Random draws happen at setup in Caffe's order: the transformer's seed
(``mirror``, or TRAIN with a crop), then the layer's.

Tops: ``data`` ``(batch_size, channels, crop_size, crop_size)`` and ``label``
``(batch_size,)``.  ``data_param.prefetch`` batches (4 by default) are loaded
ahead by a background thread; 0 loads in forward, with identical results.
"""
from __future__ import annotations

import logging
import math
import warnings

import numpy as np

from ..io import decode_image_bytes, resize_inter_linear, resolve_path
from ..layer import register_layer
from ..rng import host_rng
from ..io import load_image_chw as load_image
from ..transform import DataTransformer
from .data import _Batch, PrefetchingDataLayer

log = logging.getLogger(__name__)

# Fields of a window, as Caffe's WindowField enum.
IMAGE_INDEX, LABEL, OVERLAP, X1, Y1, X2, Y2 = range(7)


def c_round(x) -> int:
    """C's ``round()``: halves go away from zero (NumPy's ``round`` goes to even)."""
    x = float(x)
    return int(math.copysign(math.floor(abs(x) + 0.5), x))


# ----------------------------------------------------------------- window file
class _Tokens:
    """Whitespace-separated tokens of a file with their line numbers (C++ ``>>``)."""

    def __init__(self, path, where):
        self.path = path
        self.where = where
        with open(path) as f:
            self.tokens = [(tok, n) for n, line in enumerate(f, 1) for tok in line.split()]
        self.i = 0

    def at_end(self) -> bool:
        return self.i >= len(self.tokens)

    def next(self, kind, what: str):
        """The next token as ``kind`` (str, int or np.float32); errors say file and line."""
        if self.at_end():
            last = self.tokens[-1][1] if self.tokens else 1
            raise ValueError(f"{self.where}: window file {self.path}:{last}: ended where "
                             f"{what} was expected")
        tok, line = self.tokens[self.i]
        self.i += 1
        try:
            return tok if kind is str else kind(tok)
        except ValueError:
            name = "an integer" if kind is int else "a number"
            raise ValueError(f"{self.where}: window file {self.path}:{line}: expected {name} "
                             f"for {what}, got {tok!r}") from None

    @property
    def line(self) -> int:
        return self.tokens[self.i - 1][1]


def read_window_file(path, root_folder, fg_threshold, bg_threshold, where):
    """Parse a window file (module doc) as Caffe's ``DataLayerSetUp`` does.

    Returns ``(images, fg_windows, bg_windows)``: ``images`` a list of
    ``(root_folder + path, (channels, height, width))`` in file order; the windows
    ``(image_index, label, overlap, x1, y1, x2, y2)`` tuples, background ones with
    label and overlap 0.  ``fg_threshold``/``bg_threshold`` are compared in float32,
    as the proto's floats are.
    """
    toks = _Tokens(path, where)
    if toks.at_end():
        raise ValueError(f"{where}: window file {path} is empty")
    fg_t, bg_t = np.float32(fg_threshold), np.float32(bg_threshold)
    images, fg, bg = [], [], []
    while not toks.at_end():
        tag = toks.next(str, "'#'")
        if tag != "#":
            raise ValueError(f"{where}: window file {path}:{toks.line}: expected '#' to start "
                             f"an image record, got {tag!r}")
        image_index = toks.next(int, "the image index")
        image_path = root_folder + toks.next(str, "the image path")
        size = tuple(toks.next(int, f"the image {name}")
                     for name in ("channels", "height", "width"))
        images.append((image_path, size))
        for k in range(toks.next(int, "the number of windows")):
            label = toks.next(int, f"the class of window {k}")
            overlap = toks.next(np.float32, f"the overlap of window {k}")
            box = tuple(toks.next(int, f"{c} of window {k}") for c in ("x1", "y1", "x2", "y2"))
            if overlap >= fg_t:
                if label <= 0:
                    raise ValueError(f"{where}: window file {path}:{toks.line}: foreground window "
                                     f"(overlap {overlap:g} >= fg_threshold {fg_t:g}) has class "
                                     f"{label}; it must be > 0")
                fg.append((image_index, label, float(overlap)) + box)
            elif overlap < bg_t:
                bg.append((image_index, 0, 0.0) + box)  # background: label and overlap 0
    return images, fg, bg


# ------------------------------------------------------------------------ warp
def warp_window(image, box, crop_size, context_pad, square, do_mirror, dtype=np.float32):
    """Cut a window out of ``image`` and warp it as Caffe's ``load_batch`` does.

    Args:
        image: ``(C, H, W)`` uint8.
        box: ``(x1, y1, x2, y2)``, inclusive corners.
        crop_size, context_pad: ``transform_param.crop_size``, ``window_data_param``'s.
        square: ``crop_mode == "square"``.
        do_mirror: flip the warped window (and its padding) left-right.
        dtype: the net's; Caffe computes the context geometry in it.

    Returns ``(patch, pad_h, pad_w)``: ``patch`` ``(C, h, w)`` uint8 goes at rows
    ``pad_h:pad_h+h`` and columns ``pad_w:pad_w+w`` of the ``crop`` x ``crop`` output,
    whose other pixels stay 0.  Raises ValueError for a window Caffe cannot cut
    (OpenCV's ROI or resize assertions).
    """
    x1, y1, x2, y2 = (int(v) for v in box)
    _, rows, cols = image.shape
    out_h = out_w = crop_size
    pad_h = pad_w = 0
    if context_pad > 0 or square:
        D = np.dtype(dtype).type
        # grow the window so that, warped to crop x crop, context_pad pixels of
        # context surround it on each side
        context_scale = D(crop_size) / D(crop_size - 2 * context_pad)
        half_height = D(y2 - y1 + 1) / D(2)
        half_width = D(x2 - x1 + 1) / D(2)
        center_x = D(x1) + half_width
        center_y = D(y1) + half_height
        if square:
            half_height = half_width = max(half_height, half_width)
        x1 = c_round(center_x - half_width * context_scale)
        x2 = c_round(center_x + half_width * context_scale)
        y1 = c_round(center_y - half_height * context_scale)
        y2 = c_round(center_y + half_height * context_scale)
        # clip to the image, remembering how far the grown window stuck out
        unclipped_height, unclipped_width = y2 - y1 + 1, x2 - x1 + 1
        pad_x1, pad_y1 = max(0, -x1), max(0, -y1)
        pad_x2, pad_y2 = max(0, x2 - cols + 1), max(0, y2 - rows + 1)
        x1, x2, y1, y2 = x1 + pad_x1, x2 - pad_x2, y1 + pad_y1, y2 - pad_y2
        # the clipped part and the padding, scaled as the whole grown window would be
        scale_x = D(crop_size) / D(unclipped_width)
        scale_y = D(crop_size) / D(unclipped_height)
        out_w = c_round(D(x2 - x1 + 1) * scale_x)
        out_h = c_round(D(y2 - y1 + 1) * scale_y)
        pad_x1 = c_round(D(pad_x1) * scale_x)
        pad_x2 = c_round(D(pad_x2) * scale_x)
        pad_y1 = c_round(D(pad_y1) * scale_y)
        pad_h = pad_y1
        pad_w = pad_x2 if do_mirror else pad_x1  # the padding is mirrored too
        # rounding may overflow the crop: shrink the warped part
        out_h = min(out_h, crop_size - pad_h)
        out_w = min(out_w, crop_size - pad_w)
    if not (0 <= x1 <= x2 < cols and 0 <= y1 <= y2 < rows):
        raise ValueError(f"window (x1 {x1}, y1 {y1}, x2 {x2}, y2 {y2}) does not lie inside the "
                         f"{rows} x {cols} image")
    if out_h <= 0 or out_w <= 0:
        raise ValueError(f"window (x1 {x1}, y1 {y1}, x2 {x2}, y2 {y2}) warps to {out_h} x "
                         f"{out_w} pixels")
    roi = np.ascontiguousarray(image[:, y1:y2 + 1, x1:x2 + 1].transpose(1, 2, 0))  # (h, w, C)
    patch = resize_inter_linear(roi, out_h, out_w).reshape(out_h, out_w, -1)
    if do_mirror:
        patch = patch[:, ::-1]
    return np.ascontiguousarray(patch.transpose(2, 0, 1)), pad_h, pad_w


# ---------------------------------------------------------------- batch loader
class _WindowBatchLoader:
    """Samples, reads and warps one batch (Caffe's ``load_batch``).

    Runs in the prefetch thread (or in forward when prefetch is 0).  It owns the
    sampling generator, so the batches depend on the seed only.  It holds no
    reference to the layer (see :class:`~minicaffe.layers.data._Prefetcher`).
    """

    def __init__(self, layer, seed):
        self.where = layer.where
        self.source = layer.source
        self.images = layer.images             # [(path, (C, H, W) as declared)]
        self.cache = layer.cache               # None, or the image files' bytes
        self.fg, self.bg = layer.fg_windows, layer.bg_windows
        self.batch_size = layer.batch_size
        self.channels = layer.channels
        self.crop_size = layer.crop_size
        self.context_pad = layer.context_pad
        self.square = layer.square
        self.mirror = layer.mirror
        self.fg_fraction = layer.fg_fraction
        self.scale = layer.dtype.type(layer.scale)
        self.mean = layer.mean                 # (C, mh, mw) or None
        self.mean_values = layer.mean_values   # (C,) or None
        self.dtype = layer.dtype
        # Caffe's prefetch_rng_: a Mersenne Twister (mt19937) with a 32-bit seed
        self.rng = np.random.RandomState(seed)

    def rand(self) -> int:
        """One raw 32-bit output of the generator (Caffe's ``PrefetchRand``)."""
        return int(self.rng.randint(0, 2**32, dtype=np.uint32))

    def num_samples(self, batch_size=None):
        """``(background, foreground)`` windows per batch; float32 product, truncated."""
        b = self.batch_size if batch_size is None else batch_size
        num_fg = int(np.float32(b) * np.float32(self.fg_fraction))
        return b - num_fg, num_fg

    def read_image(self, index):
        """``(3, H, W)`` uint8 BGR of image ``index`` of the window file."""
        if not 0 <= index < len(self.images):
            raise ValueError(f"{self.where}: a window names image index {index}, the window "
                             f"file {self.source} has {len(self.images)} images")
        path = self.images[index][0]
        try:
            if self.cache is not None:
                return decode_image_bytes(self.cache[index], force_color=True)
            return load_image(path, is_color=True)
        except (OSError, ValueError) as e:
            raise ValueError(f"{self.where}: could not open or find image {path!r} (listed in "
                             f"window file {self.source}): {e}") from e

    def __call__(self, batch: _Batch):
        c, crop = self.channels, self.crop_size
        shape = (self.batch_size, c, crop, crop)
        if batch.data is None or batch.data.shape != shape:
            batch.data = np.empty(shape, dtype=self.dtype)
        batch.data[...] = 0                    # Caffe zeroes the batch first
        labels = np.empty(self.batch_size, dtype=self.dtype)
        item = 0
        for windows, count in zip((self.bg, self.fg), self.num_samples()):  # bg, then fg
            for _ in range(count):
                window = windows[self.rand() % len(windows)]
                do_mirror = self.mirror and self.rand() % 2 == 1
                image = self.read_image(window[IMAGE_INDEX])
                try:
                    patch, pad_h, pad_w = warp_window(image, window[X1:], crop, self.context_pad,
                                                      self.square, do_mirror, self.dtype)
                except ValueError as e:
                    raise ValueError(f"{self.where}: image {self.images[window[IMAGE_INDEX]][0]!r}"
                                     f" (window file {self.source}): {e}") from None
                _, h, w = patch.shape
                rows, cols = slice(pad_h, pad_h + h), slice(pad_w, pad_w + w)
                pixels = patch.astype(self.dtype)
                if self.mean is not None:
                    off = (self.mean.shape[2] - crop) // 2  # centred, from the width
                    mean = self.mean[:c, off + pad_h:off + pad_h + h, off + pad_w:off + pad_w + w]
                    pixels = (pixels - mean) * self.scale
                elif self.mean_values is not None:
                    pixels = (pixels - self.mean_values[:, None, None]) * self.scale
                else:
                    pixels = pixels * self.scale
                batch.data[item, :, rows, cols] = pixels
                labels[item] = window[LABEL]
                item += 1
        batch.label = labels
        batch.resume = self.state()

    def state(self) -> dict:
        """The generator's state (JSON-friendly): enough to resume here."""
        s = self.rng.get_state(legacy=False)
        return {"rng": {"key": s["state"]["key"].tolist(), "pos": int(s["state"]["pos"])}}

    def load_state(self, state: dict):
        s = self.rng.get_state(legacy=False)
        s["state"] = {"key": np.asarray(state["rng"]["key"], dtype=np.uint32),
                      "pos": int(state["rng"]["pos"])}
        self.rng.set_state(s)


# ----------------------------------------------------------------------- layer
@register_layer
class WindowDataLayer(PrefetchingDataLayer):
    """Batches of warped foreground and background windows (module doc).

    ``window_data_param``: ``source``, ``root_folder``, ``batch_size``,
    ``fg_threshold``, ``bg_threshold``, ``fg_fraction``, ``context_pad``,
    ``crop_mode`` ("warp" or "square"), ``cache_images``, ``scale``;
    ``transform_param``: ``crop_size`` (required), ``mirror``, ``mean_file`` or
    ``mean_value``; ``data_param.prefetch``.

    The window file is looked up relative to the working directory, then to the
    prototxt's folder; image paths are used as ``root_folder + path``, as Caffe
    does.  Call :meth:`close` to stop the prefetch thread early.
    """

    type = "WindowData"
    exact_num_top = 2

    def layer_setup(self, bottom, top):
        wp = self.param.window_data_param
        tp = self.param.transform_param
        where = self.where
        legacy = [f for f in ("mean_file", "crop_size", "mirror") if wp.HasField(f)]
        if legacy:
            warnings.warn(f"{where}: window_data_param.{', '.join(legacy)} are deprecated and "
                          "ignored (as by Caffe for `layer` definitions); use transform_param",
                          stacklevel=2)
        if tp.HasField("scale"):
            warnings.warn(f"{where}: WindowData ignores transform_param.scale, as Caffe does; "
                          "it scales by window_data_param.scale", stacklevel=2)
        source_dir = getattr(self, "source_dir", None)
        # Caffe's BaseDataLayer builds (and seeds) the transformer first; WindowData
        # uses only its mean, read from mean_file or mean_value.
        self.transformer = DataTransformer(tp, self.phase, self.dtype, source_dir=source_dir,
                                           where=where)
        seed = int(host_rng().integers(0, 2**32))  # Caffe's caffe_rng_rand() for prefetch_rng_

        self.batch_size = int(wp.batch_size)
        if self.batch_size <= 0:
            raise ValueError(f"{where}: window_data_param.batch_size must be positive")
        self.crop_size = int(tp.crop_size)
        if self.crop_size <= 0:
            raise ValueError(f"{where}: WindowData needs transform_param.crop_size > 0 (the "
                             "size windows are warped to)")
        self.context_pad = int(wp.context_pad)
        if 2 * self.context_pad >= self.crop_size:
            raise ValueError(f"{where}: context_pad {self.context_pad} leaves nothing of a "
                             f"{self.crop_size}-pixel crop for the window (need 2 * context_pad "
                             "< crop_size)")
        if wp.crop_mode not in ("warp", "square"):
            raise ValueError(f"{where}: crop_mode must be \"warp\" or \"square\", got "
                             f"{wp.crop_mode!r}")
        self.square = wp.crop_mode == "square"
        self.mirror = bool(tp.mirror)
        self.fg_fraction = float(wp.fg_fraction)
        self.scale = float(wp.scale)

        self.source = resolve_path(wp.source, source_dir, "window file (window_data_param."
                                   "source)", where)
        self.images, self.fg_windows, self.bg_windows = read_window_file(
            self.source, wp.root_folder, wp.fg_threshold, wp.bg_threshold, where)
        self._log_windows(wp)
        # the last record's channel count shapes the data top (images are read as 3)
        self.channels = self.images[-1][1][0]
        if self.channels != 3:
            raise ValueError(f"{where}: the last image of window file {self.source} declares "
                             f"{self.channels} channels; images are read in colour (3 channels)")
        for windows in (self.fg_windows, self.bg_windows):
            for w in windows:
                if not 0 <= w[IMAGE_INDEX] < len(self.images):
                    raise ValueError(f"{where}: window file {self.source}: image index "
                                     f"{w[IMAGE_INDEX]} is not the position of an image (the "
                                     f"file has {len(self.images)})")
        self._check_mean()

        self.cache = None
        if wp.cache_images:
            self.cache = []
            for path, _ in self.images:
                try:
                    with open(path, "rb") as f:
                        self.cache.append(f.read())
                except OSError as e:
                    raise ValueError(f"{where}: could not open or find image {path!r} (listed in "
                                     f"window file {self.source}): {e}") from e

        self._loader = _WindowBatchLoader(self, seed)
        for name, windows, count in zip(("background", "foreground"),
                                        (self.bg_windows, self.fg_windows),
                                        self._loader.num_samples()):
            if count and not windows:
                raise ValueError(
                    f"{where}: a batch takes {count} {name} windows but window file "
                    f"{self.source} has none (fg_threshold {wp.fg_threshold}, bg_threshold "
                    f"{wp.bg_threshold}, fg_fraction {wp.fg_fraction})")
        self.prefetch_count = int(self.param.data_param.prefetch)
        self._top_shape = (self.batch_size, self.channels, self.crop_size, self.crop_size)
        self._begin()

    def _log_windows(self, wp):
        hist = {0: len(self.bg_windows)}
        for w in self.fg_windows:
            hist[w[LABEL]] = hist.get(w[LABEL], 0) + 1
        log.info("%s: %d images, fg_threshold %g, bg_threshold %g, fg_fraction %g, "
                 "context_pad %d, crop_mode %s", self.where, len(self.images), wp.fg_threshold,
                 wp.bg_threshold, wp.fg_fraction, wp.context_pad, wp.crop_mode)
        for label in sorted(hist):
            log.info("%s: class %d has %d samples", self.where, label, hist[label])

    def _check_mean(self):
        """The mean that Caffe reads for each warped pixel must exist."""
        c, crop = self.channels, self.crop_size
        self.mean = self.transformer.mean
        self.mean_values = None
        if self.mean is not None:
            mc, mh, mw = self.mean.shape
            off = (mw - crop) // 2
            if mc < c or off < 0 or off + crop > mh:
                raise ValueError(
                    f"{self.where}: the mean image has shape {self.mean.shape}; WindowData "
                    f"takes {c} channels from its centred {crop} x {crop} square (offset "
                    "(width - crop_size) // 2 on both axes), which must lie inside it")
        elif self.transformer.mean_values is not None:
            mv = self.transformer.mean_values
            if mv.size not in (1, c):
                raise ValueError(f"{self.where}: specify either 1 mean_value or as many as "
                                 f"channels: {c} (got {mv.size})")
            self.mean_values = np.broadcast_to(mv, (c,)).astype(self.dtype)

    # ------------------------------------------------------ resume and resize
    def load_state_dict(self, state: dict):
        """Restore the sampling generator's state saved by :meth:`state_dict`; before the
        first forward only."""
        self._refuse_once_started("sampling state")
        self._loader.load_state(state)
        self._resume = self._loader.state()

    def set_batch_size(self, new_size: int):
        """Change the batch size (the net must be reshaped afterwards); batches read
        ahead at the old size are dropped and sampling resumes where forward left it."""
        if new_size <= 0:
            raise ValueError(f"{self.where}: batch_size must be positive, got {new_size}")
        if self._closed:
            raise RuntimeError(f"{self.where}: the layer was closed")
        for name, windows, count in zip(("background", "foreground"),
                                        (self.bg_windows, self.fg_windows),
                                        self._loader.num_samples(new_size)):
            if count and not windows:
                raise ValueError(f"{self.where}: a batch of {new_size} takes {count} {name} "
                                 "windows but the window file has none")
        self._resize(new_size)
