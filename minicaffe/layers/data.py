"""Layers that produce the net's input: Input, DummyData, Data, HDF5Data, MemoryData.

They have no bottoms and no backward.  The data they make is assembled on the
host in NumPy and copied to the net's array module once per forward
(``top.data[...] = xp.asarray(batch)``, a host-to-device copy in GPU mode).

* ``Input``: tops the caller fills (pycaffe's ``net.blobs['data'].data[...]``).
* ``DummyData``: tops from fillers; constant fillers fill once, at setup, and
  every other filler refills on every forward (Caffe's ``refill_``).
* ``Data``: Datum records of an LMDB or a LevelDB (``data_param.backend``, LEVELDB by
  default as in Caffe; LevelDB through plyvel), read in key order and wrapping around at
  the end, transformed by :class:`~minicaffe.transform.DataTransformer`, with a
  background thread keeping ``data_param.prefetch`` batches ready (Caffe's
  ``BasePrefetchingDataLayer``).
* ``HDF5Data``: rows of the HDF5 datasets named like the tops, from the files
  listed in a text file, optionally shuffled.
* ``MemoryData``: arrays handed in with :meth:`MemoryDataLayer.reset`
  (pycaffe's ``net.set_input_arrays``).
"""
from __future__ import annotations

import logging
import os
import queue
import threading
import warnings
import weakref

import numpy as np

from ..fillers import fill
from ..hdf5_util import is_hdf5
from ..io import LevelDBReader, LMDBReader, parse_datum, resolve_path
from ..layer import Layer, register_layer
from ..proto import caffe_pb2
from ..rng import host_rng
from ..transform import DataTransformer

log = logging.getLogger(__name__)

LMDB = caffe_pb2.DataParameter.LMDB
LEVELDB = caffe_pb2.DataParameter.LEVELDB


class _SourcelessLayer(Layer):
    """Common declarations of layers with no bottoms: nothing to propagate."""

    exact_num_bottom = 0
    backward_reads_bottom = ()
    backward_reads_top = ()

    @property
    def where(self) -> str:
        return f"layer {self.name!r} ({self.type})"

    def flops(self, bottom, top):
        return 0.0, 0.0

    def backward_impl(self, top, propagate_down, bottom):
        """Data layers have no bottoms and no parameters: nothing to do."""


# ------------------------------------------------------------------- Input
@register_layer
class InputLayer(_SourcelessLayer):
    """Tops whose data the caller provides (Caffe's ``InputLayer``).

    ``input_param.shape``: none (the caller shapes the tops), one shared by
    every top, or one per top.  Forward does nothing, and neither does
    reshape: the caller may reshape the tops and then the net.
    """

    type = "Input"
    min_num_top = 1

    def layer_setup(self, bottom, top):
        shapes = self.param.input_param.shape
        if len(shapes) not in (0, 1, len(top)):
            raise ValueError(
                f"{self.where}: must specify 'shape' once, once per top blob, or not at all: "
                f"{len(top)} tops vs. {len(shapes)} shapes")
        for i, t in enumerate(top):
            if len(shapes):
                t.reshape(tuple(shapes[0 if len(shapes) == 1 else i].dim))

    def reshape(self, bottom, top):
        """The caller owns the tops' shapes."""

    def forward_impl(self, bottom, top):
        """The caller has written the tops' data."""


# --------------------------------------------------------------- DummyData
@register_layer
class DummyDataLayer(_SourcelessLayer):
    """Tops filled by fillers (Caffe's ``DummyDataLayer``).

    ``dummy_data_param``: ``shape`` (once or once per top) or the legacy
    ``num``/``channels``/``height``/``width`` (each once or once per top), and
    ``data_filler`` (none: constant 0; one for all tops; or one per top).

    Constant fillers fill their tops once, during setup; other fillers draw
    new values on every forward (Caffe's ``refill_``).  A constant top is thus
    state that lives across iterations: whoever manages device memory must
    keep its data (see :meth:`persistent_tops`).
    """

    type = "DummyData"
    min_num_top = 1

    def layer_setup(self, bottom, top):
        p = self.param.dummy_data_param
        n_top = len(top)
        n_fill = len(p.data_filler)
        if n_fill not in (0, 1, n_top):
            raise ValueError(
                f"{self.where}: number of data fillers must be 0, 1 or equal to the number of "
                f"tops: {n_top}; you specified {n_fill} data fillers")
        legacy = any(len(f) for f in (p.num, p.channels, p.height, p.width))
        if legacy:
            if len(p.shape):
                raise ValueError(f"{self.where}: both shape and legacy fields were specified")
            for field in ("num", "channels", "height", "width"):
                k = len(getattr(p, field))
                if k not in (1, n_top):
                    raise ValueError(
                        f"{self.where}: must specify '{field}' once, or once per top blob "
                        f"({n_top}); specified {k}")
        elif len(p.shape) not in (1, n_top):
            raise ValueError(
                f"{self.where}: must specify 'shape' once, or once per top blob ({n_top}); "
                f"specified {len(p.shape)}")

        if n_fill == 0:
            self.fillers = [caffe_pb2.FillerParameter(type="constant", value=0.0)]
        else:
            self.fillers = list(p.data_filler)
        # refill[k]: filler k draws again on every forward (it is not constant)
        self.refill = [f.type != "constant" for f in self.fillers]

        def pick(seq, i):
            return seq[0] if len(seq) == 1 else seq[i]

        for i, t in enumerate(top):
            if legacy:
                t.reshape(pick(p.num, i), pick(p.channels, i), pick(p.height, i), pick(p.width, i))
            else:
                t.reshape(tuple(pick(p.shape, i).dim))
        # Fill the constant tops now; they are never filled again.
        for i, t in enumerate(top):
            k = self._filler_index(i)
            if not self.refill[k]:
                fill(t, self.fillers[k], where=f"{self.where}: ")

    def _filler_index(self, top_index: int) -> int:
        return top_index if len(self.fillers) > 1 else 0

    def persistent_tops(self, n_top: int) -> tuple:
        """Indices of the tops filled once at setup, whose data must survive
        from one iteration to the next."""
        return tuple(i for i in range(n_top) if not self.refill[self._filler_index(i)])

    def reshape(self, bottom, top):
        """Shapes are fixed at setup (Caffe's DummyData reshape does nothing)."""

    def forward_impl(self, bottom, top):
        for i, t in enumerate(top):
            k = self._filler_index(i)
            if self.refill[k]:
                fill(t, self.fillers[k], where=f"{self.where}: ")


# -------------------------------------------------------------- prefetching
class _Batch:
    """One host batch: ``data`` (N, C, h, w) and ``label`` (N,) in the net's dtype."""

    __slots__ = ("data", "label", "resume")

    def __init__(self):
        self.data = None
        self.label = None
        self.resume = None  # the loader's state right after this batch (see DataLayer.state_dict)


class _Prefetcher:
    """A thread that keeps up to ``count`` batches loaded (Caffe's free/full queues).

    ``count`` batch buffers circulate: the thread takes a free one, fills it
    with ``load(batch)`` and queues it as full; the consumer takes full
    batches in order and gives them back.  Loading happens in one thread, in
    order, so the batches (and their random draws) do not depend on timing.

    The thread holds no reference to the layer, so a layer that is dropped is
    collected, and its finalizer stops the thread.  An exception in ``load``
    is handed to the consumer, which raises it.
    """

    _STOP = object()

    def __init__(self, load, count: int, name: str):
        self._load = load
        self._name = name
        self._free: queue.Queue = queue.Queue()
        self._full: queue.Queue = queue.Queue()
        for _ in range(count):
            self._free.put(_Batch())
        self._stop = threading.Event()
        self._thread = None
        self._lock = threading.Lock()

    @property
    def thread(self):
        return self._thread

    def start(self):
        with self._lock:
            if self._thread is None and not self._stop.is_set():
                self._thread = threading.Thread(target=self._run, daemon=True,
                                                name=f"minicaffe-prefetch[{self._name}]")
                self._thread.start()

    def _run(self):
        try:
            while True:
                batch = self._free.get()
                if batch is self._STOP or self._stop.is_set():
                    return
                self._load(batch)
                self._full.put(batch)
        except BaseException as e:  # hand it to the consumer
            self._full.put(e)

    def next(self) -> _Batch:
        """The next full batch, in order (blocks until the thread has loaded it)."""
        self.start()
        while True:
            try:
                item = self._full.get(timeout=1.0)
                break
            except queue.Empty:
                if self._thread is None or not self._thread.is_alive():
                    raise RuntimeError(f"{self._name}: the prefetch thread is not running")
        if isinstance(item, BaseException):
            self._full.put(item)  # every later call fails the same way
            text = str(item)
            if text.startswith(f"{self._name}: "):   # the loader named the layer already
                text = text[len(self._name) + 2:]
            raise RuntimeError(f"{self._name}: loading a batch failed: {text}") from item
        return item

    def give_back(self, batch: _Batch):
        self._free.put(batch)

    def stop(self, timeout: float = 10.0) -> bool:
        """Stop the thread; True when it has ended (or never started)."""
        self._stop.set()
        self._free.put(self._STOP)
        t = self._thread
        if t is not None and t is not threading.current_thread():
            t.join(timeout)
            return not t.is_alive()
        return True


def _shutdown(prefetcher, reader=None):
    """Finalizer of a prefetching layer: stop its thread, then close ``reader`` (the Data
    layer's database), if any."""
    ended = prefetcher.stop() if prefetcher is not None else True
    if ended and reader is not None:  # never pull the transaction from under a running thread
        reader.close()


class PrefetchingDataLayer(_SourcelessLayer):
    """Caffe's ``BasePrefetchingDataLayer``: batches loaded on a thread, ahead of forward.

    A subclass's ``layer_setup`` sets ``batch_size``, ``_top_shape`` (the data top's),
    ``output_labels``, ``prefetch_count`` and ``_loader`` (a callable that fills a
    :class:`_Batch` and whose ``state()`` says where the next batch starts), then calls
    :meth:`_begin`.  Forward copies the next batch into the tops (the data top reshaped like
    the batch, as Caffe's Forward does); :meth:`state_dict` is the loader's state after the
    last batch forward consumed, so that a resumed run reads the batches the uninterrupted
    one would (the thread runs ahead; its batches are loaded again after a resume).
    """

    output_labels = True

    def _begin(self, reader=None):
        """Start prefetching (the thread starts with the first forward); ``reader``: closed
        after the thread stops, when the layer is collected or closed."""
        self._closed = False
        self._reader_to_close = reader
        self._start_prefetcher()
        self._sync_batch = _Batch()
        self._resume = self._loader.state()  # where the next unconsumed batch starts

    def _start_prefetcher(self):
        self._prefetcher = (_Prefetcher(self._loader, self.prefetch_count, self.where)
                            if self.prefetch_count > 0 else None)
        # Stops the thread (and closes the reader) when the layer is collected or at exit;
        # close() runs it early.  It holds no reference to self.
        self._finalizer = weakref.finalize(self, _shutdown, self._prefetcher,
                                           self._reader_to_close)

    def _refuse_once_started(self, what: str):
        if self._prefetcher is not None and self._prefetcher.thread is not None:
            raise RuntimeError(f"{self.where}: cannot restore the {what} once prefetching "
                               "has started")

    def reshape(self, bottom, top):
        top[0].reshape(self._top_shape)
        if self.output_labels:
            top[1].reshape((self.batch_size,))

    def forward_impl(self, bottom, top):
        if self._closed:
            raise RuntimeError(f"{self.where}: the layer was closed")
        if self._prefetcher is not None:
            batch = self._prefetcher.next()
        else:
            batch = self._sync_batch
            self._loader(batch)
        try:
            if batch.data.shape != top[0].shape:
                top[0].reshape(batch.data.shape)  # Caffe: top reshapes like each batch
            # host -> device copy in GPU mode (synchronous for pageable memory)
            top[0].data[...] = self.xp.asarray(batch.data)
            if self.output_labels:
                top[1].data[...] = self.xp.asarray(batch.label)
            self._resume = batch.resume
        finally:
            if self._prefetcher is not None:
                self._prefetcher.give_back(batch)

    def state_dict(self) -> dict:
        """The loader's state after the last batch that forward consumed (saved in the
        solver state)."""
        return dict(self._resume)

    def _resize(self, new_size: int):
        """``set_batch_size``'s common part: batches read ahead at the old size are dropped
        and reading resumes where forward left it (the net must be reshaped afterwards)."""
        if new_size <= 0:
            raise ValueError(f"{self.where}: batch_size must be positive, got {new_size}")
        if self._closed:
            raise RuntimeError(f"{self.where}: the layer was closed")
        resume = self.state_dict()
        self._finalizer.detach()
        if self._prefetcher is not None and not self._prefetcher.stop():
            raise RuntimeError(f"{self.where}: the prefetch thread did not stop")
        self.batch_size = self._loader.batch_size = int(new_size)
        self._top_shape = (self.batch_size,) + tuple(self._top_shape[1:])
        self._start_prefetcher()
        self.load_state_dict(resume)

    def prefetch_nbytes(self) -> int:
        """Bytes of the batches Caffe keeps prefetched (on the GPU in GPU mode).

        Here they stay on the host; a model of Caffe's device memory adds this.
        """
        per = int(np.prod(self._top_shape)) + (self.batch_size if self.output_labels else 0)
        return max(self.prefetch_count, 0) * per * self.dtype.itemsize

    @property
    def prefetch_thread(self):
        """The prefetch thread (None before the first forward or without prefetch)."""
        return self._prefetcher.thread if self._prefetcher is not None else None

    def close(self):
        """Stop the prefetch thread (and close the reader); forward fails afterwards."""
        if getattr(self, "_finalizer", None) is not None:
            self._finalizer()
            self._closed = True


class _LMDBBatchLoader:
    """Reads ``batch_size`` Datums in order from a wrapping cursor and transforms them.

    Runs in the prefetch thread (or in forward when prefetch is 0).
    """

    def __init__(self, cursor, transformer, batch_size, dtype, with_labels):
        self.cursor = cursor
        self.transformer = transformer
        self.batch_size = batch_size
        self.dtype = dtype
        self.with_labels = with_labels
        self.records_read = 0

    def __call__(self, batch: _Batch):
        datums = []
        for _ in range(self.batch_size):
            datums.append(parse_datum(self.cursor.value()))
            self.cursor.advance_wrapping()
            self.records_read += 1
        first = datums[0]
        # Caffe reshapes each batch after its first datum.
        shape = (self.batch_size,) + self.transformer.output_shape(self.datum_shape(first))
        if batch.data is None or batch.data.shape != shape:
            batch.data = np.empty(shape, dtype=self.dtype)
        _, labels = self.transformer.transform_datums(datums, out=batch.data)
        batch.label = labels if self.with_labels else None
        batch.resume = self.state()

    def state(self) -> dict:
        """Records read so far and the transform RNG's state: enough to resume here."""
        rng = self.transformer.rng
        return {"records_read": self.records_read,
                "rng": rng.bit_generator.state if rng is not None else None}

    def datum_shape(self, datum) -> tuple:
        """``(C, H, W)`` of a Datum (decoding it when it is encoded)."""
        if datum.encoded:    # InferBlobShape decodes it (and CHECKs the force fields)
            return self.transformer.datum_image(datum).shape
        return (datum.channels, datum.height, datum.width)


# -------------------------------------------------------------------- Data
@register_layer
class DataLayer(PrefetchingDataLayer):
    """Batches of Datums from an LMDB (Caffe's ``DataLayer``).

    ``data_param``: ``source`` (the database folder), ``batch_size``,
    ``backend`` (LEVELDB, Caffe's default, or LMDB), ``prefetch`` (batches loaded
    ahead by a background thread, 4 by default; 0 loads in forward, with identical
    results); ``transform_param`` as :class:`DataTransformer`.  Reading starts at
    the first record: ``rand_skip`` is ignored, as upstream Caffe's Data layer
    ignores it (the net warns, :mod:`minicaffe.proto.coverage`).

    Tops: ``data`` ``(batch_size, C, crop or H, crop or W)`` and optionally
    ``label`` ``(batch_size,)``.

    The source is looked up relative to the working directory, as Caffe does,
    then relative to the prototxt's folder (``self.source_dir``, set by the
    Net).  Call :meth:`close` to stop the thread and close the database early;
    otherwise that happens when the layer is collected or at exit.
    """

    type = "Data"
    min_num_top = 1
    max_num_top = 2

    def layer_setup(self, bottom, top):
        dp = self.param.data_param
        where = self.where
        if dp.batch_size <= 0:
            raise ValueError(f"{where}: data_param.batch_size must be positive")
        legacy = [f for f in ("scale", "mean_file", "crop_size", "mirror") if dp.HasField(f)]
        if legacy:
            warnings.warn(f"{where}: data_param.{', '.join(legacy)} are deprecated and ignored "
                          "(as by Caffe for `layer` definitions); use transform_param",
                          stacklevel=2)
        self.batch_size = int(dp.batch_size)
        self.output_labels = len(top) == 2
        source_dir = getattr(self, "source_dir", None)
        self.source = resolve_path(dp.source, source_dir, "data source", where)
        self.transformer = DataTransformer(self.param.transform_param, self.phase, self.dtype,
                                           source_dir=source_dir, where=where)

        self._closed = False
        if dp.backend == LMDB:
            reader = LMDBReader(self.source)
        else:      # LEVELDB, Caffe's default backend
            try:
                reader = LevelDBReader(self.source)
            except ValueError as e:
                raise ValueError(f"{where}: data_param.backend is LEVELDB (Caffe's default), "
                                 f"but {e}: if it is an LMDB, set `backend: LMDB`") from None
        self._reader = reader
        try:
            if len(reader) == 0:
                raise ValueError(f"{where}: the database {self.source} holds no records")
            # data_layer.cpp: the cursor starts at the first record; data_param.rand_skip is
            # not read (upstream dropped it with the 2015 DataReader; ImageData still skips)
            cursor = reader.cursor()
            self._loader = _LMDBBatchLoader(cursor, self.transformer, self.batch_size,
                                            self.dtype, self.output_labels)
            first = parse_datum(cursor.value())
            self._top_shape = (self.batch_size,) + self.transformer.output_shape(
                self._loader.datum_shape(first))
        except BaseException:
            reader.close()
            raise
        self.prefetch_count = int(dp.prefetch)
        self._begin(reader)

    def load_state_dict(self, state: dict):
        """Move to a position saved by :meth:`state_dict` (the read position and the
        transform RNG's state); before the first forward only."""
        self._refuse_once_started("read position")
        cursor = self._loader.cursor
        cursor.seek_to_first()
        for _ in range(int(state["records_read"]) % len(self._reader)):
            cursor.advance_wrapping()
        self._loader.records_read = int(state["records_read"])
        if state.get("rng") is not None and self.transformer.rng is not None:
            self.transformer.rng.bit_generator.state = state["rng"]
        self._resume = self._loader.state()


# ---------------------------------------------------------------- HDF5Data
def _require_h5py():
    try:
        import h5py
    except ImportError as e:  # pragma: no cover - depends on the environment
        raise ImportError("HDF5Data needs h5py: pip install 'minicaffe[data]'") from e
    return h5py


@register_layer
class HDF5DataLayer(_SourcelessLayer):
    """Rows of HDF5 datasets (Caffe's ``HDF5DataLayer``).

    ``hdf5_data_param.source`` is a text file listing ``.h5`` files
    (whitespace separated); each file holds one dataset per top, named like
    the top, all with the same number of rows.  Batches take ``batch_size``
    consecutive rows, moving on to the next file at the end of one and back to
    the first after the last.  ``shuffle`` shuffles the file order at setup
    and after each pass over the files, and the rows of a file whenever it is
    loaded and after each pass over it (files are not interleaved).

    Each file is loaded whole, as in Caffe.  Tops: ``(batch_size,) + the
    dataset's shape[1:]``.
    """

    type = "HDF5Data"
    min_num_top = 1

    def layer_setup(self, bottom, top):
        hp = self.param.hdf5_data_param
        where = self.where
        if hp.batch_size <= 0:
            raise ValueError(f"{where}: hdf5_data_param.batch_size must be positive")
        self.batch_size = int(hp.batch_size)
        self.shuffle = bool(hp.shuffle)
        self.top_names = list(self.param.top)
        if len(self.top_names) != len(top):
            raise ValueError(f"{where}: the datasets are named after the tops, but the layer "
                             f"parameter names {len(self.top_names)} tops for {len(top)} blobs")
        source_dir = getattr(self, "source_dir", None)
        source = resolve_path(hp.source, source_dir, "HDF5 source list", where)
        if is_hdf5(source):     # Caffe reads its bytes as file names, and fails on the first
            raise ValueError(
                f"{where}: hdf5_data_param.source {hp.source!r} is an HDF5 file; the source is "
                "a text file that lists HDF5 files, one per line: write the .h5 file's path "
                f"into a .txt file (e.g. `echo {hp.source} > list.txt`) and name that")
        with open(source, encoding="utf-8", errors="replace") as f:
            names = f.read().split()
        if not names:
            raise ValueError(f"{where}: must have at least 1 HDF5 filename listed in {source}")
        list_dir = os.path.dirname(os.path.abspath(source))
        self.files = [resolve_path(n, list_dir, "HDF5 file", where) for n in names]
        self.file_permutation = np.arange(len(self.files))
        if self.shuffle:
            host_rng().shuffle(self.file_permutation)
        self.current_file = 0
        self.arrays = None  # one (rows, ...) array per top, from the current file
        self._load(self.files[self.file_permutation[0]])
        self.current_row = 0

    def _load(self, path):
        """Load every top's dataset of one file (Caffe's ``LoadHDF5FileData``)."""
        h5py = _require_h5py()
        arrays = []
        try:
            f = h5py.File(path, "r")
        except OSError as e:    # Caffe's LoadHDF5FileData: "Failed opening HDF5 file"
            what = "not an HDF5 file" if not is_hdf5(path) else "an HDF5 file h5py cannot open"
            raise ValueError(f"{self.where}: failed opening HDF5 file {path} (listed in "
                             f"{self.param.hdf5_data_param.source}): {what} ({e})") from None
        with f:
            for name in self.top_names:
                if name not in f:
                    raise ValueError(f"{self.where}: {path} has no dataset {name!r} (it has "
                                     f"{', '.join(sorted(f.keys())) or 'none'})")
                a = np.asarray(f[name], dtype=self.dtype)
                if a.ndim < 1:
                    raise ValueError(f"{self.where}: dataset {name!r} of {path} must have at "
                                     "least 1 axis")
                arrays.append(a)
        num = arrays[0].shape[0]
        for name, a in zip(self.top_names, arrays):
            if a.shape[0] != num:
                raise ValueError(f"{self.where}: {path}: the datasets have different numbers of "
                                 f"rows ({self.top_names[0]!r}: {num}, {name!r}: {a.shape[0]})")
        if num == 0:
            raise ValueError(f"{self.where}: {path} holds no rows")
        if self.arrays is not None:
            for name, old, a in zip(self.top_names, self.arrays, arrays):
                if old.shape[1:] != a.shape[1:]:
                    raise ValueError(f"{self.where}: dataset {name!r} has rows of shape "
                                     f"{a.shape[1:]} in {path}, {old.shape[1:]} before")
        self.arrays = arrays
        self.data_permutation = np.arange(num)
        if self.shuffle:
            host_rng().shuffle(self.data_permutation)

    def reshape(self, bottom, top):
        for t, a in zip(top, self.arrays):
            t.reshape((self.batch_size,) + a.shape[1:])

    def _advance(self, k: int):
        """Move ``k`` rows on; at the end of a file, load the next (Caffe's ``Next``)."""
        self.current_row += k
        if self.current_row == self.arrays[0].shape[0]:
            if len(self.files) > 1:
                self.current_file += 1
                if self.current_file == len(self.files):
                    self.current_file = 0
                    if self.shuffle:
                        host_rng().shuffle(self.file_permutation)
                self._load(self.files[self.file_permutation[self.current_file]])
            self.current_row = 0
            if self.shuffle:
                host_rng().shuffle(self.data_permutation)

    def forward_impl(self, bottom, top):
        out = [np.empty((self.batch_size,) + a.shape[1:], dtype=self.dtype) for a in self.arrays]
        filled = 0
        while filled < self.batch_size:
            # consecutive rows of the current file, up to its end
            k = min(self.batch_size - filled, self.arrays[0].shape[0] - self.current_row)
            rows = self.data_permutation[self.current_row:self.current_row + k]
            for o, a in zip(out, self.arrays):
                o[filled:filled + k] = a[rows]
            filled += k
            self._advance(k)
        for t, o in zip(top, out):
            t.data[...] = self.xp.asarray(o)  # host -> device in GPU mode


# -------------------------------------------------------------- MemoryData
@register_layer
class MemoryDataLayer(_SourcelessLayer):
    """Batches from arrays in memory (Caffe's ``MemoryDataLayer``).

    ``memory_data_param``: ``batch_size``, ``channels``, ``height``,
    ``width``.  Hand in data with :meth:`reset` (``(n, C, H, W)`` data and
    ``n`` labels, ``n`` a multiple of the batch size; pycaffe's
    ``net.set_input_arrays``) or :meth:`add_datum_vector` (Datums, through the
    transformer).  Each forward emits the next ``batch_size`` rows, cycling.

    Tops: data ``(batch_size, C, H, W)`` and label ``(batch_size,)`` at setup; from the first
    forward on the label is ``(batch_size, 1, 1, 1)``, as Caffe's ``Forward_cpu`` reshapes it.
    """

    type = "MemoryData"
    exact_num_top = 2

    def layer_setup(self, bottom, top):
        mp = self.param.memory_data_param
        self.batch_size = int(mp.batch_size)
        self.channels, self.height, self.width = int(mp.channels), int(mp.height), int(mp.width)
        if self.batch_size * self.channels * self.height * self.width <= 0:
            raise ValueError(f"{self.where}: batch_size, channels, height, and width must be "
                             "specified and positive in memory_data_param")
        # Caffe's BaseDataLayer builds a transformer for every data layer (used
        # by AddDatumVector only).
        self.transformer = DataTransformer(self.param.transform_param, self.phase, self.dtype,
                                           source_dir=getattr(self, "source_dir", None),
                                           where=self.where)
        self._data = None
        self._labels = None
        self._n = 0
        self._pos = 0
        self.has_new_data = False
        self._forwarded = False   # Caffe: label (N,) from DataLayerSetUp, (N, 1, 1, 1) from Forward

    def reshape(self, bottom, top):
        top[0].reshape(self.batch_size, self.channels, self.height, self.width)
        top[1].reshape((self.batch_size, 1, 1, 1) if self._forwarded else (self.batch_size,))

    def reset(self, data, labels):
        """Use ``data`` ``(n, C, H, W)`` and ``labels`` ``(n,)`` (or ``(n, 1, 1, 1)``).

        Copies them (as the net's dtype). No transformation is applied.
        """
        data = np.asarray(data)
        labels = np.asarray(labels)
        where = self.where
        expect = (self.channels, self.height, self.width)
        if data.ndim != 4:
            raise ValueError(
                f"{where}: data array must be 4-d (n, C, H, W), got shape {data.shape}")
        if data.shape[1:] != expect:
            raise ValueError(f"{where}: data array has items of shape {data.shape[1:]}, the layer "
                             f"takes (C, H, W) = {expect}")
        if labels.ndim == 4 and labels.shape[1:] == (1, 1, 1):
            labels = labels.reshape(-1)
        if labels.ndim != 1:
            raise ValueError(f"{where}: labels array must be (n,) or (n, 1, 1, 1), got shape "
                             f"{labels.shape}")
        n = data.shape[0]
        if labels.shape[0] != n:
            raise ValueError(f"{where}: data and labels must have the same first dimension "
                             f"({n} vs {labels.shape[0]})")
        if n == 0 or n % self.batch_size:
            raise ValueError(f"{where}: n must be a non-zero multiple of batch size "
                             f"{self.batch_size}, got n = {n}")
        if self.param.HasField("transform_param"):
            log.warning("%s does not transform array data on reset()", where)
        self._data = np.array(data, dtype=self.dtype)
        self._labels = np.array(labels, dtype=self.dtype)
        self._n = n
        self._pos = 0

    set_input_arrays = reset

    def add_datum_vector(self, datums):
        """Transform Datums (a multiple of the batch size) and use them (Caffe's AddDatumVector)."""
        if self.has_new_data:
            raise RuntimeError(f"{self.where}: can't add data until current data has been consumed")
        if not len(datums):
            raise ValueError(f"{self.where}: there is no datum to add")
        if len(datums) % self.batch_size:
            raise ValueError(f"{self.where}: the added data must be a multiple of the batch size "
                             f"{self.batch_size}, got {len(datums)}")
        # Caffe: Transform(datum_vector, &added_data_), a (num, channels, height, width)
        # blob of memory_data_param, checks every Datum against it first
        data, labels = self.transformer.transform_datums(
            list(datums), expect=(self.channels, self.height, self.width))
        self._data, self._labels, self._n, self._pos = data, labels, len(datums), 0
        self.has_new_data = True

    def set_batch_size(self, new_size: int):
        """Change the batch size (the net must be reshaped afterwards)."""
        if self.has_new_data:
            raise RuntimeError(f"{self.where}: can't change batch_size until current data has "
                               "been consumed")
        if new_size <= 0:
            raise ValueError(f"{self.where}: batch_size must be positive, got {new_size}")
        self.batch_size = int(new_size)

    def forward_impl(self, bottom, top):
        if self._data is None:
            raise RuntimeError(f"{self.where} needs data: call reset(data, labels) "
                               "(pycaffe: net.set_input_arrays) first")
        if self._n % self.batch_size:
            raise RuntimeError(f"{self.where}: {self._n} rows are not a multiple of the batch "
                               f"size {self.batch_size}")
        self._forwarded = True
        self.reshape(bottom, top)
        b, p = self.batch_size, self._pos
        top[0].data[...] = self.xp.asarray(self._data[p:p + b])  # host -> device in GPU mode
        top[1].data[...] = self.xp.asarray(self._labels[p:p + b]).reshape(top[1].shape)
        self._pos = (p + b) % self._n
        if self._pos == 0:
            self.has_new_data = False
