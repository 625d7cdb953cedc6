"""ImageData: batches of image files named in a list file (Caffe's ``ImageDataLayer``).

Caffe's ``src/caffe/layers/image_data_layer.cpp`` on ``BasePrefetchingDataLayer``:

* ``image_data_param.source`` is a text file of ``path label`` lines, split at
  the *last* space, so paths may contain spaces; each image is read from
  ``root_folder + path`` (plain string concatenation, as Caffe does);
* images are read as Caffe's ``ReadImageToCVMat`` reads them: 3 channels in
  OpenCV's BGR order (``is_color``, the default) or 1 grey channel, resized to
  ``new_height`` x ``new_width`` when both are given; minicaffe reads and
  resizes with the same code as ``convert_imageset``
  (:func:`minicaffe.io.load_image_chw`), so ImageData and
  ``convert_imageset`` + Data give the same arrays (see that function for
  how its bilinear resize relates to OpenCV's ``INTER_LINEAR``);
* ``shuffle`` shuffles the list at setup and again each time the list has
  been read to its end (in place, so each epoch's order is a shuffle of the
  previous one); the shuffle draws from the layer's own generator, seeded
  from :func:`minicaffe.rng.host_rng` at setup (Caffe's ``prefetch_rng_``
  seeded with ``caffe_rng_rand()``);
* ``rand_skip`` starts at a random position in ``[0, rand_skip)`` of the
  (shuffled) list, which must be longer than the skip;
* a batch takes ``batch_size`` consecutive entries, going back to the start
  (reshuffled) at the end of the list; it is shaped after its first image,
  and every image goes through the :class:`~minicaffe.transform.DataTransformer`
  of ``transform_param`` as in the Data layer;
* ``data_param.prefetch`` batches (4 by default) are loaded ahead by a
  background thread (Caffe's ``BasePrefetchingDataLayer`` reads that field
  for every prefetching layer); 0 loads in forward, with identical results.

Random draws happen in this order at setup, as in Caffe: the transformer's
seed, the shuffle seed, the skip.

Tops: ``data`` ``(batch_size, C, crop or H, crop or W)`` and ``label``
``(batch_size,)``; ImageData needs both (Caffe's ``ExactNumTopBlobs() == 2``).
"""
from __future__ import annotations

import logging
import os
import warnings

import numpy as np

from ..io import resolve_path
from ..layer import register_layer
from ..rng import host_rng
from ..io import load_image_chw as load_image
from ..io import read_list
from ..transform import DataTransformer
from .data import _Batch, PrefetchingDataLayer

log = logging.getLogger(__name__)


class _ImageReader:
    """Reads one listed image as ``(C, H, W)`` uint8 (Caffe's ``ReadImageToCVMat``).

    A separate object, not a method of the layer: the prefetch thread calls
    it, and must hold no reference to the layer (see :class:`_Prefetcher`).
    """

    def __init__(self, root_folder, source_dir, is_color, new_height, new_width, source, where):
        self.root_folder = root_folder      # prepended as a string, as Caffe does
        self.source_dir = source_dir        # the prototxt's folder: the second place to look
        self.is_color = is_color
        self.new_height = new_height
        self.new_width = new_width
        self.source = source                # the list file, named in errors
        self.where = where

    def __call__(self, name: str) -> np.ndarray:
        what = f"image (listed in {self.source})"
        try:
            path = resolve_path(self.root_folder + name, self.source_dir, what, self.where)
        except FileNotFoundError as e:
            root = self.root_folder
            if root and not root.endswith("/") and os.path.exists(os.path.join(root, name)):
                raise FileNotFoundError(
                    f"{e}; root_folder {root!r} is put before each name as it is, as Caffe "
                    f"does: end it with '/' (root_folder: \"{root}/\")") from None
            raise
        try:
            return load_image(path, self.is_color, self.new_height, self.new_width)
        except (OSError, ValueError) as e:
            raise ValueError(f"{self.where}: could not load image {path!r} (listed in "
                             f"{self.source}): {e}") from e


class _ImageBatchLoader:
    """Reads ``batch_size`` images in list order, wrapping (and reshuffling) at the end.

    Runs in the prefetch thread (or in forward when prefetch is 0); it owns the
    shuffle generator and the transformer's, so the batches depend on the seed
    only, never on thread timing.

    ``records_read`` counts the list positions passed since the first entry of
    the first order (the skip included); with ``shuffle_seed`` it determines
    the whole state, so :meth:`seek` can rebuild any position exactly.
    """

    def __init__(self, lines, read_image, transformer, batch_size, dtype, shuffle_seed, where):
        self.where = where                  # the layer, named in errors
        self.lines = lines                  # [(path as listed, label)] in list-file order
        self.read_image = read_image        # path as listed -> (C, H, W) uint8
        self.transformer = transformer
        self.batch_size = batch_size
        self.dtype = dtype
        self.shuffle_seed = shuffle_seed    # None: no shuffling
        self.seek(0)

    def seek(self, records_read: int):
        """Go to the position after ``records_read`` list positions: replay the
        setup shuffle and one shuffle per completed pass over the list."""
        n = len(self.lines)
        self.order = np.arange(n)           # order[pos]: the list index read at pos
        self.shuffle_rng = None
        if self.shuffle_seed is not None:
            self.shuffle_rng = np.random.default_rng(self.shuffle_seed)
            for _ in range(1 + records_read // n):
                self.shuffle_rng.shuffle(self.order)
        self.pos = records_read % n
        self.records_read = records_read

    def current(self) -> int:
        """The list index of the next image to read."""
        return int(self.order[self.pos])

    def _advance(self):
        """Caffe's ``lines_id_++``: back to the start, reshuffled, after the last entry."""
        self.pos += 1
        self.records_read += 1
        if self.pos == len(self.lines):
            self.pos = 0
            if self.shuffle_rng is not None:
                self.shuffle_rng.shuffle(self.order)

    def __call__(self, batch: _Batch):
        indices, images = [], []
        for _ in range(self.batch_size):
            i = self.current()
            indices.append(i)
            images.append(self.read_image(self.lines[i][0]))
            self._advance()
        # Caffe reshapes each batch after its first image.
        shape = (self.batch_size,) + self.transformer.output_shape(images[0].shape)
        if batch.data is None or batch.data.shape != shape:
            batch.data = np.empty(shape, dtype=self.dtype)
        if all(im.shape == images[0].shape for im in images):
            self.transformer.transform(np.stack(images), out=batch.data)
        else:
            self._transform_one_by_one(indices, images, batch.data)
        batch.label = np.asarray([self.lines[i][1] for i in indices], dtype=self.dtype)
        batch.resume = self.state()

    def _transform_one_by_one(self, indices, images, out):
        """Images of different sizes in one batch: Caffe's ``Transform`` accepts
        them when it crops (each image at least ``crop_size``, the first image's
        channel count), and otherwise fails."""
        c0, h0, w0 = images[0].shape
        first = self.lines[indices[0]][0]
        for k, (i, im) in enumerate(zip(indices, images)):
            if im.shape != images[0].shape and (im.shape[0] != c0
                                                or not self.transformer.crop_size):
                raise ValueError(
                    f"{self.where}: image {self.lines[i][0]!r} has shape {im.shape}, the "
                    f"batch's first image {first!r} has {(c0, h0, w0)}; a batch needs images "
                    "of one size unless transform_param.crop_size crops them (or "
                    "new_height/new_width resize them)")
            out[k] = self.transformer.transform(im)

    def state(self) -> dict:
        """Positions read so far, the shuffle seed and the transform RNG's state:
        enough to resume here."""
        rng = self.transformer.rng
        return {"records_read": self.records_read, "shuffle_seed": self.shuffle_seed,
                "rng": rng.bit_generator.state if rng is not None else None}


@register_layer
class ImageDataLayer(PrefetchingDataLayer):
    """Batches of image files listed with their labels (module doc).

    ``image_data_param``: ``source``, ``root_folder``, ``batch_size``,
    ``rand_skip``, ``shuffle``, ``new_height``/``new_width`` (both or
    neither), ``is_color``; ``transform_param`` as
    :class:`~minicaffe.transform.DataTransformer`; ``data_param.prefetch``.

    The list file, and each image, is looked up relative to the working
    directory, as Caffe does, then relative to the prototxt's folder
    (``self.source_dir``, set by the Net).  PNG, JPEG and whatever else
    Pillow reads are accepted, and ``.npy`` arrays as ``convert_imageset``
    takes them.  Call :meth:`close` to stop the prefetch thread early;
    otherwise that happens when the layer is collected or at exit.
    """

    type = "ImageData"
    exact_num_top = 2

    def layer_setup(self, bottom, top):
        ip = self.param.image_data_param
        where = self.where
        if ip.batch_size <= 0:
            raise ValueError(f"{where}: image_data_param.batch_size must be positive")
        self.new_height, self.new_width = int(ip.new_height), int(ip.new_width)
        if (self.new_height > 0) != (self.new_width > 0):
            raise ValueError(f"{where}: new_height and new_width must be set together (got "
                             f"new_height {self.new_height}, new_width {self.new_width})")
        legacy = [f for f in ("scale", "mean_file", "crop_size", "mirror") if ip.HasField(f)]
        if legacy:
            warnings.warn(f"{where}: image_data_param.{', '.join(legacy)} are deprecated and "
                          "ignored (as by Caffe for `layer` definitions); use transform_param",
                          stacklevel=2)
        self.batch_size = int(ip.batch_size)
        self.is_color = bool(ip.is_color)
        source_dir = getattr(self, "source_dir", None)
        # Caffe's BaseDataLayer builds the transformer (and seeds it) before
        # the layer's own setup draws the shuffle seed and the skip.
        self.transformer = DataTransformer(self.param.transform_param, self.phase, self.dtype,
                                           source_dir=source_dir, where=where)

        self.source = resolve_path(ip.source, source_dir, "image list (image_data_param.source)",
                                   where)
        try:
            self.lines = read_list(self.source)
        except ValueError as e:
            raise ValueError(f"{where}: {e}") from None
        if not self.lines:
            raise ValueError(f"{where}: the image list {self.source} lists no images")
        shuffle_seed = None
        if ip.shuffle:
            shuffle_seed = int(host_rng().integers(0, 2**63 - 1))
            log.info("%s: shuffling data", where)
        log.info("%s: a total of %d images", where, len(self.lines))
        self._read_image = _ImageReader(ip.root_folder, source_dir, self.is_color,
                                        self.new_height, self.new_width, self.source, where)
        self._loader = _ImageBatchLoader(self.lines, self._read_image, self.transformer,
                                         self.batch_size, self.dtype, shuffle_seed, where)
        if ip.rand_skip:
            skip = int(host_rng().integers(0, ip.rand_skip))
            log.info("%s: skipping first %d data points", where, skip)
            if skip >= len(self.lines):
                raise ValueError(f"{where}: not enough points to skip: rand_skip drew {skip}, "
                                 f"the list {self.source} has {len(self.lines)} images")
            self._loader.seek(skip)
        # Caffe reads the first image to shape the tops.
        first = self._read_image(self.lines[self._loader.current()][0])
        self._top_shape = (self.batch_size,) + self.transformer.output_shape(first.shape)

        self.prefetch_count = int(self.param.data_param.prefetch)
        self._begin()

    # --------------------------------------------------- resume and resize
    def load_state_dict(self, state: dict):
        """Move to a position saved by :meth:`state_dict` (the read position, the shuffle
        seed and the transform RNG's state); before the first forward only."""
        self._refuse_once_started("read position")
        self._loader.shuffle_seed = state.get("shuffle_seed")
        self._loader.seek(int(state["records_read"]))
        if state.get("rng") is not None and self.transformer.rng is not None:
            self.transformer.rng.bit_generator.state = state["rng"]
        self._resume = self._loader.state()

    def set_batch_size(self, new_size: int):
        """Change the batch size (the net must be reshaped afterwards; the tuner's
        :func:`swap.profiler.set_batch_size`).  The batches read ahead at the old
        size are dropped: reading resumes at the first image not yet consumed."""
        self._resize(new_size)

