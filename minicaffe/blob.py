"""Blob: an N-d array with data and diff, as in Caffe.

Storage is held in :class:`Storage` objects (one flat array each), so that
several blobs can share one (Caffe's ``ShareData``/``ShareDiff``: Split tops
share their bottom's data) and so that the memory manager of ``swap/`` can bind
a blob to a region of its arena, or release it, without the layers noticing:
layers always go through ``blob.data`` / ``blob.diff``, which are views of
whatever storage is bound at that moment.

Like Caffe's SyncedMemory, storage is allocated lazily, on first access: a
data blob whose diff nobody asks for never gets one.

``Blob()`` without a shape is Caffe's default-constructed ``Blob``: no axes and a count of
0 (a net's tops before their layer's Reshape); ``Blob(())`` is a 0-d blob of one element
(Caffe's ``Blob(vector<int>())``, a loss top).
"""
from __future__ import annotations

from math import prod

import numpy as np

MAX_BLOB_AXES = 32   # Caffe's kMaxBlobAxes (include/caffe/blob.hpp)


class Storage:
    """One flat buffer, possibly shared by several blobs.

    ``array`` is a 1-d array of at least the element count of every blob
    using it, or None while unallocated/released.  ``external`` marks a buffer
    handed in from outside (a view into the memory manager's arena).
    """

    __slots__ = ("array", "external", "__weakref__")

    def __init__(self):
        self.array = None
        self.external = False

    @property
    def capacity(self) -> int:
        return 0 if self.array is None else int(self.array.size)


class Blob:
    """Caffe's Blob: ``data`` and ``diff`` of one shape, in one array module.

    Args:
        shape: initial shape, e.g. ``(N, C, H, W)``; None (the default): no shape yet, a
            count of 0, and no data until :meth:`reshape` gives it one (Caffe's ``Blob()``).
        xp: numpy or cupy.
        dtype: element type (float32 normally, float64 for gradient checks).
        name: for error messages and the memory manager.
    """

    def __init__(self, shape=None, xp=np, dtype=np.float32, name: str = ""):
        self.xp = xp
        self.dtype = np.dtype(dtype)
        self.name = name
        self._data = Storage()
        self._diff = Storage()
        # "data"|"diff" -> (source array, view) of the last access; ("data"|"diff", id(array))
        # -> the same for the arrays before it (a memory plan binds a storage to a few arena
        # regions in turn within an iteration)
        self._views = {}
        self._shape = ()
        self._count = 0         # Caffe's count_: 0 until the first reshape, then prod(shape)
        if shape is not None:
            self.reshape(shape)

    # ----------------------------------------------------------------- shape
    @property
    def shape(self) -> tuple:
        return self._shape

    @property
    def count(self) -> int:
        return self._count

    @property
    def ndim(self) -> int:
        return len(self._shape)

    @property
    def nbytes(self) -> int:
        """Bytes of one of data or diff at the current shape."""
        return self.count * self.dtype.itemsize

    def shape_at(self, axis: int) -> int:
        return self._shape[self.canonical_axis(axis)]

    def canonical_axis(self, axis: int) -> int:
        """Caffe's CanonicalAxisIndex: negative axes count from the end; -num_axes <= axis
        < num_axes, so a 0-d blob has none."""
        n = len(self._shape)
        if not -n <= axis < n:
            raise IndexError(
                f"axis {axis} out of range for blob {self.name!r} of shape {self._shape}")
        return axis + n if axis < 0 else axis

    def count_range(self, start: int, end: int | None = None) -> int:
        """Caffe's ``count(start_axis, end_axis)``: the product of the axes start..end-1
        (``end`` None: to the last axis), with Caffe's checks that
        ``0 <= start <= end <= num_axes``."""
        n = len(self._shape)
        end = n if end is None else end
        if not 0 <= start <= end <= n:
            raise IndexError(f"count({start}, {end}) of blob {self.name!r} of shape "
                             f"{self._shape}: Caffe needs 0 <= start <= end <= num_axes ({n})")
        return prod(self._shape[start:end])

    # legacy 4-d accessors (pycaffe and old prototxt talk in these)
    def legacy_shape(self, index: int) -> int:
        """Caffe's ``LegacyShape``: axis ``index`` (-4..3), 1 past the blob's axes (the
        one-padding of legacy 4-d blobs); a blob of more than 4 axes has none (Caffe's
        CHECK, which pycaffe's ``num``/``channels``/``height``/``width`` reach)."""
        n = len(self._shape)
        if n > 4:
            raise ValueError(f"blob {self.name!r} of shape {self._shape}: Cannot use legacy "
                             "accessors (num, channels, height, width) on Blobs with > 4 "
                             "axes; use shape[i]")
        if not -4 <= index < 4:
            raise IndexError(f"legacy axis {index} of blob {self.name!r}: Caffe's legacy "
                             "accessors take -4 <= index < 4")
        if index >= n or index < -n:
            return 1
        return self._shape[index]

    @property
    def num(self):
        return self.legacy_shape(0)

    @property
    def channels(self):
        return self.legacy_shape(1)

    @property
    def height(self):
        return self.legacy_shape(2)

    @property
    def width(self):
        return self.legacy_shape(3)

    def reshape(self, *shape):
        """Change the shape; storage grows only when the count exceeds it.

        Accepts ``reshape(2, 3)``, ``reshape((2, 3))`` or a list.
        """
        if len(shape) == 1 and not np.isscalar(shape[0]):
            shape = tuple(shape[0])
        for d in shape:
            # pycaffe's reshape takes ints only; int() would cut 8.5 to 8 without a word
            # (h / 2 is a float in Python 3); a whole float (8.0) is taken as its int
            if isinstance(d, (float, np.floating)) and not float(d).is_integer():
                raise TypeError(f"blob {self.name!r}: reshape takes integer dimensions, got "
                                f"{d!r} in {shape!r} (h / 2 is a float in Python 3: use h // 2)")
        shape = tuple(int(d) for d in shape)
        if len(shape) > MAX_BLOB_AXES:
            raise ValueError(f"blob {self.name!r}: shape {shape} has {len(shape)} axes; Caffe's "
                             f"blobs have at most {MAX_BLOB_AXES} (kMaxBlobAxes)")
        for d in shape:
            if d < 0:
                raise ValueError(f"blob {self.name!r}: negative dimension in shape {shape}")
        self._shape = shape
        self._count = n = prod(shape)
        self._views.clear()
        for st in (self._data, self._diff):
            if st.array is not None and st.capacity < n:
                if st.external:
                    raise ValueError(
                        f"blob {self.name!r} reshaped to {shape} ({n} elements) beyond its bound "
                        f"storage of {st.capacity} elements")
                st.array = None  # reallocated lazily at the new size
        return self

    def reshape_like(self, other: "Blob"):
        return self.reshape(other.shape)

    # --------------------------------------------------------------- storage
    def _view(self, which: str, st: Storage):
        # the hot path (thousands of accesses per iteration on the host's critical path): a
        # view cached from this very array is valid, since reshape clears the cache and an
        # array's size never changes (a released storage holds None, never the cached array)
        cached = self._views.get(which)
        if cached is not None and cached[0] is st.array:
            return cached[1]
        return self._view_miss(which, st, cached)

    # views kept per blob besides the last one of data and diff (a swap plan's storage visits
    # a few regions per iteration: ResNet-152 at 16 under the dynamic plan re-made 426 views
    # per iteration, 4.5 of its 74 ms of host time, without them)
    _MORE_VIEWS = 8

    def _view_miss(self, which: str, st: Storage, cached):
        if cached is not None:          # the last view stays, under its array's identity
            self._views[(which, id(cached[0]))] = cached
        arr = st.array
        if arr is not None:
            older = self._views.get((which, id(arr)))
            if older is not None and older[0] is arr:
                self._views[which] = older
                return older[1]
        if self._unshaped():
            raise RuntimeError(
                f"blob {self.name!r}: {which} accessed before the blob has a shape (reshape it "
                "first; Caffe's default-constructed Blob has no memory)")
        if arr is None or st.capacity < self.count:
            if st.external:
                raise RuntimeError(
                    f"blob {self.name!r}: {which} accessed while its storage is released "
                    "(the memory plan did not bring it onto the device)")
            st.array = self.xp.zeros(self.count, dtype=self.dtype)
        view = st.array[: self.count].reshape(self._shape)
        if len(self._views) > 2 + self._MORE_VIEWS:
            self._views = {k: v for k, v in self._views.items() if isinstance(k, str)}
        self._views[which] = (st.array, view)
        return view

    def _unshaped(self) -> bool:
        """No reshape yet (Caffe's ``Blob()``): no axes and a count of 0, where a 0-d blob
        has one element."""
        return self._count == 0 and not self._shape

    @property
    def data(self):
        return self._view("data", self._data)

    @data.setter
    def data(self, value):
        self._assign(self.data, value, "data")

    @property
    def diff(self):
        return self._view("diff", self._diff)

    @diff.setter
    def diff(self, value):
        self._assign(self.diff, value, "diff")

    def _assign(self, target, value, which: str):
        """``blob.data = array`` writes into the blob (pycaffe's ``blob.data[...] = array``);
        an array that does not broadcast to the blob's shape is refused naming the blob."""
        try:
            target[...] = value
        except ValueError as e:
            raise ValueError(f"blob {self.name!r}: cannot set its {which} of shape "
                             f"{self.shape} from an array of shape {np.shape(value)} ({e}); "
                             "reshape the blob first (blob.reshape(*shape)) to change its "
                             "shape") from None

    @property
    def has_data(self) -> bool:
        return self._data.array is not None

    @property
    def has_diff(self) -> bool:
        return self._diff.array is not None

    @property
    def diff_placeable(self) -> bool:
        """Whether writing ``diff`` may proceed: False only where a memory plan holds the
        diff's storage (``external``) and has not placed it, because the net asked no
        layer for this diff.  Layers that write a diff nobody asked for, as some of
        Caffe's do (BatchNorm, the recurrent layers), check this first."""
        return not (self._diff.external and self._diff.array is None)

    @property
    def data_storage(self) -> Storage:
        return self._data

    @property
    def diff_storage(self) -> Storage:
        return self._diff

    def share_data(self, other: "Blob"):
        """Use ``other``'s data storage (Caffe's ShareData); counts must match."""
        if other.count != self.count:
            raise ValueError(
                f"share_data: blob {self.name!r} has {self.count} elements, {other.name!r} {other.count}")
        self._data = other._data
        self._views.clear()

    def share_diff(self, other: "Blob"):
        if other.count != self.count:
            raise ValueError(
                f"share_diff: blob {self.name!r} has {self.count} elements, {other.name!r} {other.count}")
        self._diff = other._diff
        self._views.clear()

    @staticmethod
    def _bind(st: Storage, flat, count: int, name: str, which: str):
        if flat.ndim != 1 or flat.size < count:
            raise ValueError(
                f"blob {name!r}: {which} storage of shape {flat.shape} is smaller than {count} elements")
        st.array = flat
        st.external = True

    def bind_data(self, flat):
        """Bind data to an outside 1-d buffer (a view into an arena)."""
        self._bind(self._data, flat, self.count, self.name, "data")

    def bind_diff(self, flat):
        self._bind(self._diff, flat, self.count, self.name, "diff")

    def drop_views(self):
        """Forget the cached shaped views of data and diff.  Each holds its source array,
        so a view cached before a memory manager re-homed the storage would keep the old
        buffer (an arena) alive; the next access makes a fresh one."""
        self._views.clear()

    def release_data(self):
        """Drop the data buffer; an external binding stays external (access raises)."""
        self._data.array = None

    def release_diff(self):
        self._diff.array = None

    # ------------------------------------------------------------- utilities
    def to_proto(self, proto, write_diff: bool = False):
        """Fill a caffe BlobProto (shape + data, optionally diff): ``data``/``diff`` as float,
        or ``double_data``/``double_diff`` for a float64 blob, as Caffe's
        ``Blob<double>::ToProto`` (whose ``FromProto`` reads either)."""
        from .backend import to_numpy
        wide = self.dtype == np.float64
        dtype = np.dtype("<f8" if wide else "<f4")
        # The message is parsed from its wire bytes: the values go in as one packed field
        # each (a copy of the array's bytes) instead of one Python float per value, which
        # took VGG-16's 138 M parameters 16 s and gigabytes to save.
        parts = []
        if self._shape:     # BlobShape dim=1 (packed int64); Caffe writes none for 0-d
            dims = b"".join(_varint(int(d)) for d in self._shape)
            parts.append(_length_delimited(7, _length_delimited(1, dims)))
        arrays = [(8 if wide else 5, self.data)]
        if write_diff:
            arrays.append((9 if wide else 6, self.diff))
        for number, values in arrays:    # host copies: each syncs with a device
            raw = np.ascontiguousarray(to_numpy(values), dtype=dtype).tobytes()
            if raw:
                parts.append(_length_delimited(number, raw))
        proto.Clear()
        proto.MergeFromString(b"".join(parts))
        return proto

    def from_proto(self, proto, reshape: bool = True, layer: str = ""):
        """Load a BlobProto's data (and diff if present), like Caffe's FromProto."""
        if reshape:
            self.reshape(proto_shape(proto))
        self.check_proto(proto, layer)
        return self.assign_proto(proto)

    def assign_proto(self, proto):
        """Copy a BlobProto's values (and diff if present) in, without :meth:`check_proto`'s
        checks: for a caller that has run them (``Net.copy_from`` checks every layer first)."""
        values, diff = proto_values(proto)
        self.data[...] = self.xp.asarray(values.reshape(self._shape), dtype=self.dtype)
        if diff is not None:
            self.diff[...] = self.xp.asarray(diff.reshape(self._shape), dtype=self.dtype)
        return self

    def check_proto(self, proto, layer: str = ""):
        """Raise ValueError unless ``proto`` fits this blob as it is (Caffe's FromProto with
        reshape false: ``ShapeEquals``, then one value per element in ``double_data`` if it
        has any, else in ``data``, and likewise for a diff)."""
        who = f"layer {layer!r}: " if layer else ""
        shape = proto_shape(proto)
        if not shape_equals(proto, self._shape):
            raise ValueError(f"{who}cannot copy param blob of shape {shape} into blob of "
                             f"shape {self._shape}")
        for wide, narrow in (("double_data", "data"), ("double_diff", "diff")):
            field = wide if len(getattr(proto, wide)) else narrow
            n = len(getattr(proto, field))
            if n != self.count and (n or narrow == "data"):
                raise ValueError(f"{who}blob proto of shape {shape} holds "
                                 f"{n} values in {field}, expected {self.count}")

    def __repr__(self):
        return f"Blob({self.name!r}, shape={self._shape}, dtype={self.dtype.name})"


def _has_legacy_shape(proto) -> bool:
    return any(proto.HasField(f) for f in ("num", "channels", "height", "width"))


def proto_shape(proto) -> tuple:
    """Shape of a BlobProto as Caffe's ``Blob::FromProto`` reads it: the legacy
    num/channels/height/width when any of them is set (they win over ``shape``; an unset one
    is 0), else ``shape.dim`` ((), a 0-d blob, when there is no shape either)."""
    if _has_legacy_shape(proto):
        return (proto.num, proto.channels, proto.height, proto.width)
    return tuple(int(d) for d in proto.shape.dim)


def shape_equals(proto, shape) -> bool:
    """Caffe's ``Blob::ShapeEquals``: a legacy 4-d proto matches a blob of <= 4 axes whose
    shape, left-padded with ones, is (num, channels, height, width) (an InnerProduct weight
    (1,1,M,K) is (M, K), its bias (1,1,1,M) is (M,)); a ``shape.dim`` proto only its exact
    shape."""
    if _has_legacy_shape(proto):
        return _legacy_equal(proto_shape(proto), shape)
    return proto_shape(proto) == tuple(shape)


def proto_values(proto):
    """(data, diff or None) of a BlobProto as flat host arrays: ``double_data`` where it has
    any values, else ``data`` (float32); the same for ``double_diff`` and ``diff``."""
    data = (np.asarray(proto.double_data, dtype=np.float64) if len(proto.double_data)
            else np.asarray(proto.data, dtype=np.float32))
    diff = None
    if len(proto.double_diff):
        diff = np.asarray(proto.double_diff, dtype=np.float64)
    elif len(proto.diff):
        diff = np.asarray(proto.diff, dtype=np.float32)
    return data, diff


def _varint(n: int) -> bytes:
    """A protobuf base-128 varint of ``n`` >= 0."""
    out = bytearray()
    while True:
        low, n = n & 0x7F, n >> 7
        if not n:
            out.append(low)
            return bytes(out)
        out.append(low | 0x80)


def _length_delimited(number: int, payload: bytes) -> bytes:
    """Field ``number`` with wire type 2 (a message, or a packed repeated scalar)."""
    return _varint(number << 3 | 2) + _varint(len(payload)) + payload


def _legacy_equal(a, b) -> bool:
    """Caffe accepts a legacy 4-d proto shape for a blob of <= 4 axes when they agree
    after left-padding with ones (for example an InnerProduct bias (1,1,1,N) vs (N,))."""
    if len(a) > 4 or len(b) > 4:
        return False
    pa = (1,) * (4 - len(a)) + tuple(a)
    pb = (1,) * (4 - len(b)) + tuple(b)
    return pa == pb
