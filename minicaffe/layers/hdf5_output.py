"""HDF5Output: write two bottoms to an HDF5 file (Caffe's ``HDF5OutputLayer``).

Caffe's ``src/caffe/layers/hdf5_output_layer.cpp`` with ``hdf5_save_nd_dataset`` of
``src/caffe/util/hdf5.cpp``:

* setup creates ``hdf5_output_param.file_name`` with ``H5F_ACC_TRUNC``: an existing
  file is emptied at once, before any forward; the file stays open until the layer
  is destroyed (here: :meth:`HDF5OutputLayer.close`, or when the layer is collected);
* forward copies bottom 0 and bottom 1 to the host and writes them as the datasets
  ``"data"`` and ``"label"`` (``H5LTmake_dataset_float``, or ``_double`` in a double
  net: the dataset's type is the net's, whatever the bottom holds);
* each dataset is written with the blob's *legacy* 4-axis shape, because Caffe
  copies the bottoms into blobs reshaped to ``(num, channels, height, width)``:
  a label of shape ``(N,)`` is written as ``(N, 1, 1, 1)``; bottoms of more than
  4 axes fail (``LegacyShape``'s ``CHECK_LE(num_axes(), 4)``);
* the two bottoms must have the same ``num`` (first axis);
* the datasets are *created*, never appended to or overwritten, so a second forward
  on the same layer fails: HDF5 refuses to create ``"data"`` again and Caffe aborts
  with "Failed to make float dataset data" (BVLC/caffe issue #1726).  minicaffe
  raises at that point, before writing anything, and the file keeps the first
  batch;
* no tops, and backward does nothing (bottom diffs are left as they are).
"""
from __future__ import annotations

import logging
import os
import weakref

from ..backend import to_numpy
from ..layer import Layer, register_layer
from .data import _require_h5py

log = logging.getLogger(__name__)

DATA_NAME = "data"     # Caffe's HDF5_DATA_DATASET_NAME
LABEL_NAME = "label"   # Caffe's HDF5_DATA_LABEL_NAME


def _close_file(handle):
    """Finalizer of an HDF5OutputLayer (Caffe's destructor): close the file."""
    if handle:
        handle.close()


def legacy_shape(shape, where: str, what: str) -> tuple:
    """``(num, channels, height, width)`` of a blob shape, missing axes as 1 (Caffe's
    ``LegacyShape``); more than 4 axes is an error, as in Caffe."""
    shape = tuple(int(d) for d in shape)
    if len(shape) > 4:
        raise ValueError(f"{where}: {what} has shape {shape}; HDF5Output writes blobs by "
                         "their legacy (num, channels, height, width) shape, which needs at "
                         "most 4 axes")
    return shape + (1,) * (4 - len(shape))


@register_layer
class HDF5OutputLayer(Layer):
    """Writes bottoms ``data`` and ``label`` to ``hdf5_output_param.file_name`` (module doc).

    Bottoms: any shape of at most 4 axes with a common first axis.  Tops: none.
    The file name is used as given (relative to the working directory), as Caffe
    does.  Call :meth:`close` to close the file before reading it back.
    """

    type = "HDF5Output"
    exact_num_bottom = 2
    exact_num_top = 0
    backward_reads_bottom = ()
    backward_reads_top = ()

    @property
    def where(self) -> str:
        return f"layer {self.name!r} ({self.type})"

    def layer_setup(self, bottom, top):
        h5py = _require_h5py()
        self.file_name = self.param.hdf5_output_param.file_name
        if not self.file_name:
            raise ValueError(f"{self.where}: hdf5_output_param.file_name is not set")
        try:
            # H5Fcreate(..., H5F_ACC_TRUNC): empties an existing file now
            self._file = h5py.File(self.file_name, "w")
        except OSError as e:
            raise OSError(f"{self.where}: failed to open HDF5 file {self.file_name!r} "
                          f"(absolute {os.path.abspath(self.file_name)}): {e}") from e
        self._finalizer = weakref.finalize(self, _close_file, self._file)

    def reshape(self, bottom, top):
        """Nothing to shape (Caffe's Reshape is empty): forward reads the shapes."""

    def forward_impl(self, bottom, top):
        if not self._file:
            raise RuntimeError(f"{self.where}: the file {self.file_name!r} was closed")
        data_shape = legacy_shape(bottom[0].shape, self.where, f"bottom 0 {bottom[0].name!r}")
        label_shape = legacy_shape(bottom[1].shape, self.where, f"bottom 1 {bottom[1].name!r}")
        if data_shape[0] != label_shape[0]:
            raise ValueError(f"{self.where}: data blob and label blob must have the same batch "
                             f"size: {bottom[0].name!r} has {data_shape[0]}, {bottom[1].name!r} "
                             f"has {label_shape[0]}")
        existing = [n for n in (DATA_NAME, LABEL_NAME) if n in self._file]
        if existing:
            raise RuntimeError(
                f"{self.where}: failed to make dataset {existing[0]!r} in {self.file_name!r}: it "
                "was written by an earlier forward; Caffe's HDF5Output creates its datasets "
                "once per file and aborts on a second forward (BVLC/caffe#1726)")
        log.info("%s: saving HDF5 file %s", self.where, self.file_name)
        # device -> host copies in GPU mode (they synchronize with the stream), then
        # Caffe's caffe_copy into data_blob_/label_blob_ of the net's Dtype
        data = to_numpy(bottom[0].data).astype(self.dtype, copy=False).reshape(data_shape)
        label = to_numpy(bottom[1].data).astype(self.dtype, copy=False).reshape(label_shape)
        self._file.create_dataset(DATA_NAME, data=data)
        self._file.create_dataset(LABEL_NAME, data=label)
        self._file.flush()
        log.info("%s: successfully saved %d rows", self.where, data_shape[0])

    def backward_impl(self, top, propagate_down, bottom):
        """Caffe's Backward_cpu returns at once: no bottom diff is written."""

    def flops(self, bottom, top):
        return 0.0, 0.0

    def close(self):
        """Close the file (Caffe's destructor); forward fails afterwards."""
        if getattr(self, "_finalizer", None) is not None:
            self._finalizer()
