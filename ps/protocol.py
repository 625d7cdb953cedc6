"""Wire protocol of the parameter server: a fixed, validated header plus raw buffers.

Every message is a ZeroMQ multipart message made of *pairs* of frames::

    [header 0][buffer 0][header 1][buffer 1] ...

A header is one fixed C struct (:data:`HEADER`, 104 bytes, little endian)::

    magic      4s   b"MCPS"
    version    H    PROTOCOL_VERSION
    op         H    Op (INIT, PARAMS, PUSH, ABORT, ERROR, HELLO, NCCL_ID, BARRIER)
    iteration  q    the solver iteration the message belongs to
    rank       i    the worker rank (sender or addressee)
    shard      i    the server shard (-1 for NCCL rendezvous messages)
    blob_id    i    global index into ``net.learnable_params``; -1 for non-blob payloads
                    (-2: INIT's bucket table)
    dtype      B    DType code of the buffer
    ndim       B    0..MAX_NDIM
    flags      B    FLAG_SHM: the values are not in this message (the buffer frame is
                    empty) but in the sender's shared-memory segment, at this blob's
                    place (ps/shm.py, ``--ps-shm``); 0 otherwise
    (1 pad byte)
    shape      8q   the first ``ndim`` entries; the rest must be 0
    nbytes     Q    prod(shape) * itemsize, and exactly the length of the buffer frame

The buffer frame is the array's memory sent as is (``copy=False``); the
receiver maps it with ``np.frombuffer`` without copying.  With ``FLAG_SHM`` the frame is
empty and the receiver's ``placed`` function (given to :func:`decode`) maps the blob in
the sender's segment, after the same checks of the header.  Nothing is ever
pickled: a peer can only make us allocate what a header describes, and every
header is checked before its buffer is interpreted, so a malformed message
ends in a :class:`ProtocolError` with a reason, never in a crash or a
misinterpreted array (pyzmq's "serialization" guide, ps-lite's ``Message``).

All headers of one message share op, iteration, rank and shard; what the
pairs hold depends on the op (see :class:`Op`).
"""
from __future__ import annotations

import enum
import struct
from dataclasses import dataclass
from math import prod

import numpy as np

MAGIC = b"MCPS"
PROTOCOL_VERSION = 3   # 2: buckets (a shard's round is one PUSH and one PARAMS per bucket)
                       # 3: the flags byte (FLAG_SHM), INIT's and its answer's segment pair
MAX_NDIM = 8

HEADER = struct.Struct("<4sHHqiiiBBBx" + "q" * MAX_NDIM + "Q")
FLAG_SHM = 1
# INIT's pair, and the pair of INIT's answer, naming a shared-memory segment (uint8 text)
SEGMENT_BLOB = -3
assert HEADER.size == 104


class Op(enum.IntEnum):
    """Message kinds.

    INIT     worker -> shard at start: pair 0 is the worker's SolverParameter
             (protobuf binary, uint8, blob -1); optionally (``--ps-shm``) the
             name of the worker's gradient segment for this shard (uint8 text,
             blob -3); optionally the bucket of each blob of the shard (int64,
             blob -2, in the order the blobs follow; absent: one bucket, the
             whole shard); then for each blob of the shard its initial values
             (blob id, float) and its ParamSpec multipliers (same blob id,
             float64 ``[lr_mult, decay_mult]``).
    PARAMS   shard -> worker: parameters for ``iteration``: the whole shard
             (the answer to INIT, led by the shard's parameter segment's name,
             blob -3, when the workers use shared memory), or one bucket (the
             answer to its PUSH; with shared memory, headers only).
    PUSH     worker -> shard: the worker's gradients of ``iteration``, one
             bucket of the shard per message.
    ABORT    either way: the round failed; one uint8 pair holds the reason.
             The receiver stops (it names the sender in its own error).
    ERROR    shard -> sender: one message was rejected; uint8 reason.
    HELLO    NCCL rendezvous, rank r -> rank 0: "I am rank r" (no pairs but
             an empty uint8 one).
    NCCL_ID  rank 0 -> rank r: the NCCL unique id (uint8, 128 bytes).
    BARRIER  NCCL mode: rank r -> rank 0 "ready for iteration t", and rank 0
             -> rank r "everybody is": a named-failure barrier before the
             all-reduce, because NCCL itself cannot time out.
    """

    INIT = 1
    PARAMS = 2
    PUSH = 3
    ABORT = 4
    ERROR = 5
    HELLO = 6
    NCCL_ID = 7
    BARRIER = 8


class DType(enum.IntEnum):
    FLOAT32 = 1
    FLOAT64 = 2
    FLOAT16 = 3
    UINT8 = 4
    INT8 = 5
    INT64 = 6


_NP = {DType.FLOAT32: np.dtype("<f4"), DType.FLOAT64: np.dtype("<f8"),
       DType.FLOAT16: np.dtype("<f2"), DType.UINT8: np.dtype("u1"),
       DType.INT8: np.dtype("i1"), DType.INT64: np.dtype("<i8")}
_CODE = {v: k for k, v in _NP.items()}

# Default ceiling on one buffer frame: large enough for VGG-16's fc6 weights
# (25088 x 4096 float32 = 411 MB), small enough to refuse absurd allocations.
DEFAULT_MAX_FRAME_BYTES = 1 << 30
# Blobs a message may carry (x2 frames, +1 for INIT's solver pair). ResNet-152
# has ~470 parameter blobs; this leaves a wide margin.
DEFAULT_MAX_PAIRS = 8192


class ProtocolError(ValueError):
    """A message that does not follow this protocol; ``str()`` is the reason."""


def dtype_code(dtype) -> DType:
    dt = np.dtype(dtype)
    if dt.byteorder == ">":   # the wire is little endian, and buffers are sent as they are
        raise ProtocolError(f"big-endian {dt} cannot be sent as is: convert it with astype()")
    try:
        return _CODE[dt]
    except KeyError:
        raise ProtocolError(f"dtype {np.dtype(dtype)} cannot be sent "
                            f"(known: {', '.join(str(d) for d in _NP.values())})") from None


def numpy_dtype(code: int) -> np.dtype:
    try:
        return _NP[DType(code)]
    except ValueError:
        known = ", ".join(f"{int(c)}={d}" for c, d in _NP.items())
        raise ProtocolError(f"unknown dtype code {code} (known: {known})") from None


# ------------------------------------------------------------------ encoding
@dataclass(frozen=True)
class Payload:
    """One decoded pair: ``array`` is a read-only view of the received frame
    (no copy); it stays valid while the message's frames are referenced."""

    blob_id: int
    array: np.ndarray


class InShm:
    """An array to send by its place in this process's shared-memory segment (``FLAG_SHM``):
    its header goes, its bytes do not."""

    __slots__ = ("array",)

    def __init__(self, array):
        self.array = array


@dataclass(frozen=True)
class Message:
    op: Op
    iteration: int
    rank: int
    shard: int
    payloads: tuple

    def text(self) -> str:
        """The uint8 reason of ABORT/ERROR (or any text pair), decoded."""
        if not self.payloads:
            return ""
        return bytes(self.payloads[0].array).decode("utf-8", "replace")


def pack_header(op, iteration, rank, shard, blob_id, array, flags: int = 0) -> bytes:
    """The header describing ``array`` (which must be C-contiguous)."""
    if array.ndim > MAX_NDIM:
        raise ProtocolError(f"blob {blob_id}: {array.ndim} dimensions, at most {MAX_NDIM}")
    shape = tuple(array.shape) + (0,) * (MAX_NDIM - array.ndim)
    return HEADER.pack(MAGIC, PROTOCOL_VERSION, int(op), int(iteration), int(rank), int(shard),
                       int(blob_id), int(dtype_code(array.dtype)), array.ndim, int(flags),
                       *shape, int(array.nbytes))


def encode(op, iteration, rank, shard, payloads=()) -> list:
    """Frames of one message: ``payloads`` are (blob id, array) pairs.

    The arrays' memory is referenced, not copied (send with ``copy=False``):
    the caller must not modify them until the message has left, which BSP
    guarantees here (a sender reuses a buffer only after the round's answer).
    """
    frames = []
    for blob_id, array in payloads:
        in_shm = isinstance(array, InShm)
        if in_shm:
            array = array.array
        if not array.flags.c_contiguous:
            raise ProtocolError(f"blob {blob_id}: only C-contiguous arrays are sent")
        frames.append(pack_header(op, iteration, rank, shard, blob_id, array,
                                  FLAG_SHM if in_shm else 0))
        frames.append(memoryview(array.reshape(-1).view(np.uint8))
                      if array.size and not in_shm else b"")
    if not frames:  # every message has at least one pair, so headers always carry op/rank
        frames = [pack_header(op, iteration, rank, shard, -1, np.empty(0, np.uint8)), b""]
    return frames


def encode_text(op, iteration, rank, shard, text: str) -> list:
    """An ABORT/ERROR/HELLO message carrying ``text`` as one uint8 pair."""
    data = np.frombuffer(text.encode("utf-8"), dtype=np.uint8)
    return encode(op, iteration, rank, shard, [(-1, data)])


# ------------------------------------------------------------------ decoding
def _buffer(frame):
    """A memoryview of a zmq.Frame (recv copy=False), bytes or memoryview."""
    buf = getattr(frame, "buffer", None)
    return buf if buf is not None else memoryview(frame)


def decode(frames, max_frame_bytes: int = DEFAULT_MAX_FRAME_BYTES,
           max_pairs: int = DEFAULT_MAX_PAIRS, placed=None) -> Message:
    """Validate and decode the frames of one message (routing frames removed).

    ``placed(rank, shard, blob_id, dtype, shape)``: the array of a ``FLAG_SHM`` pair in the
    sender's segment (raising ProtocolError when there is none such); None: such pairs are
    refused.  Raises ProtocolError with the first problem found; nothing is copied.
    """
    n = len(frames)
    if n == 0:
        raise ProtocolError("empty message")
    if n % 2:
        raise ProtocolError(f"{n} frames: a message is header/buffer pairs (an even count)")
    if n // 2 > max_pairs:
        raise ProtocolError(f"{n // 2} header/buffer pairs, at most {max_pairs}")
    first = None
    payloads = []
    for i in range(0, n, 2):
        head = _buffer(frames[i])
        if len(head) != HEADER.size:
            raise ProtocolError(f"frame {i}: header of {len(head)} bytes, expected {HEADER.size}")
        magic, version, op, iteration, rank, shard, blob_id, code, ndim, flags, *rest = \
            HEADER.unpack(head)
        shape_all, nbytes = rest[:MAX_NDIM], rest[MAX_NDIM]
        if magic != MAGIC:
            raise ProtocolError(f"frame {i}: bad magic {magic!r} (expected {MAGIC!r}): "
                                "not a minicaffe parameter-server message")
        if version != PROTOCOL_VERSION:
            raise ProtocolError(f"frame {i}: protocol version {version}, this side speaks "
                                f"{PROTOCOL_VERSION}")
        try:
            op = Op(op)
        except ValueError:
            known = ", ".join(f"{o.name}={o.value}" for o in Op)
            raise ProtocolError(f"frame {i}: unknown op {op} (known: {known})") from None
        if first is None:
            first = (op, iteration, rank, shard)
        elif (op, iteration, rank, shard) != first:
            raise ProtocolError(
                f"frame {i}: header (op {op.name}, iteration {iteration}, rank {rank}, shard "
                f"{shard}) differs from the message's first (op {first[0].name}, iteration "
                f"{first[1]}, rank {first[2]}, shard {first[3]})")
        dt = numpy_dtype(code)
        if ndim > MAX_NDIM:
            raise ProtocolError(f"frame {i}: ndim {ndim} > {MAX_NDIM}")
        shape = tuple(shape_all[:ndim])
        if any(d < 0 for d in shape) or any(shape_all[ndim:]):
            raise ProtocolError(f"frame {i}: invalid shape {tuple(shape_all)} for ndim {ndim}")
        if nbytes > max_frame_bytes:
            raise ProtocolError(f"frame {i + 1}: buffer of {nbytes} bytes exceeds the maximum "
                                f"of {max_frame_bytes} bytes (--max-message-bytes)")
        expect = prod(shape) * dt.itemsize
        if nbytes != expect:
            raise ProtocolError(f"frame {i}: byte count {nbytes} does not match shape {shape} of "
                                f"{dt} ({expect} bytes)")
        if flags & ~FLAG_SHM:
            raise ProtocolError(f"frame {i}: unknown flags {flags:#x}")
        buf = _buffer(frames[i + 1])
        if flags & FLAG_SHM:
            if len(buf):
                raise ProtocolError(f"frame {i + 1}: {len(buf)} bytes after a shared-memory "
                                    "header (its values are in the segment; the frame must be "
                                    "empty)")
            if placed is None:
                raise ProtocolError(f"frame {i}: blob {blob_id} is in a shared-memory segment, "
                                    "and none is mapped for this peer")
            payloads.append(Payload(blob_id, placed(rank, shard, blob_id, dt, shape)))
            continue
        if len(buf) != nbytes:
            raise ProtocolError(f"frame {i + 1}: buffer of {len(buf)} bytes, the header says "
                                f"{nbytes}")
        array = np.frombuffer(buf, dtype=dt).reshape(shape) if nbytes else np.empty(shape, dt)
        payloads.append(Payload(blob_id, array))
    op, iteration, rank, shard = first
    return Message(op, iteration, rank, shard, tuple(payloads))


def frames_nbytes(frames) -> int:
    """Bytes of a message on the wire (for bandwidth emulation and statistics)."""
    return sum(len(_buffer(f)) for f in frames)
