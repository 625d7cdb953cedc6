"""HDF5 helpers that write what Caffe's ``src/caffe/util/hdf5.cpp`` writes, atomically.

Caffe's H5LT calls, and the h5py equivalent used here:

- ``hdf5_save_int``: ``H5LTmake_dataset_int`` of rank 1 and one element, a native
  ``int`` (int32, shape ``(1,)``); ``hdf5_load_int`` reads that one int back.
- ``hdf5_save_string``: ``H5LTmake_dataset_string``, a scalar dataset of a fixed-length
  string type of ``len + 1`` bytes, null-terminated (``H5T_STR_NULLTERM``).
- ``hdf5_save_nd_dataset<Dtype>``: ``H5LTmake_dataset_float`` / ``_double``, shaped as the
  blob, in the Dtype the net runs (float32, or float64 for a ``Net<double>``).

Files are built in memory and then written through a temporary file that is renamed
over the target (:func:`minicaffe.proto.text._atomic_write`), so a crash while
snapshotting leaves the last good file intact (Caffe's ``H5Fcreate(H5F_ACC_TRUNC)``
would not).
"""
from __future__ import annotations

import io
import os

import numpy as np

from .proto.text import _atomic_write


def is_hdf5(path) -> bool:
    """Whether ``path`` is an HDF5 file, as Caffe's H5Fis_hdf5 (h5py's check, which also
    finds the signature after a user block; without h5py, the signature at the start)."""
    try:
        import h5py
        return bool(h5py.is_hdf5(os.fspath(path)))
    except ImportError:
        pass
    except OSError:
        return False
    try:
        with open(os.fspath(path), "rb") as f:
            return f.read(8) == b"\x89HDF\r\n\x1a\n"
    except OSError:
        return False


def write_atomic(path, fill):
    """Build an HDF5 file with ``fill(h5py.File)`` in memory and write it to ``path``
    atomically. ``fill`` only sees host (NumPy) arrays: callers copy device arrays first."""
    import h5py
    buf = io.BytesIO()
    with h5py.File(buf, "w") as f:
        fill(f)
    _atomic_write(os.fspath(path), buf.getvalue())


def save_int(group, name: str, value: int):
    """Caffe's ``hdf5_save_int``: an int32 dataset of shape (1,)."""
    group.create_dataset(name, data=np.array([value], dtype=np.int32))


def load_int(group, name: str) -> int:
    """Caffe's ``hdf5_load_int``: the one integer of dataset ``name``."""
    values = np.asarray(group[name][()]).reshape(-1)
    if values.size != 1 or values.dtype.kind not in "iu":
        raise ValueError(f"dataset {name!r} should hold one integer, it holds "
                         f"{values.size} value(s) of type {values.dtype}")
    return int(values[0])


def save_string(group, name: str, value: str):
    """Caffe's ``hdf5_save_string`` (``H5LTmake_dataset_string``): a scalar, fixed-length,
    null-terminated string of ``len(value) + 1`` bytes."""
    import h5py
    raw = value.encode()
    tid = h5py.h5t.C_S1.copy()
    tid.set_size(len(raw) + 1)
    tid.set_strpad(h5py.h5t.STR_NULLTERM)
    space = h5py.h5s.create(h5py.h5s.SCALAR)
    dset = h5py.h5d.create(group.id, name.encode(), tid, space)
    dset.write(h5py.h5s.ALL, h5py.h5s.ALL, np.array(raw, dtype=f"S{len(raw) + 1}"))


def load_string(group, name: str) -> str:
    """Caffe's ``hdf5_load_string``: the text up to the first null byte."""
    value = group[name][()]
    if isinstance(value, np.ndarray):
        value = value.reshape(-1)[0] if value.size == 1 else None
    if not isinstance(value, (bytes, str)):
        raise ValueError(f"dataset {name!r} should hold one string")
    raw = value.encode() if isinstance(value, str) else value
    return raw.split(b"\0", 1)[0].decode()
