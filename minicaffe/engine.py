"""Engine selection, as Caffe's ``engine:`` field (``DEFAULT``, ``CAFFE``, ``CUDNN``).

Convolution, Pooling, LRN, Softmax and SoftmaxWithLoss read the ``engine`` of
their ``*_param`` once, in ``layer_setup``, through :func:`resolve`, and keep
the answer as ``layer.engine`` ("CAFFE" or "CUDNN"):

* ``CAFFE`` (1): minicaffe's own maths (NumPy; im2col + cuBLAS and the RawKernels
  of :mod:`minicaffe.kernels.cuda_vision` on a GPU).
* ``CUDNN`` (2): the cuDNN 9 binding of :mod:`minicaffe.cudnn`.  Only possible
  in GPU mode (the layer's ``xp`` is CuPy) with a cuDNN that loads; otherwise
  the layer runs ``CAFFE`` and a warning naming the layer is issued once
  (Caffe would refuse to build the net; we prefer to run).
* ``DEFAULT`` (0, what a prototxt without the field gets): the net-wide default,
  in this order of precedence:

  1. :func:`set_default_engine` (the ``--engine`` flag of the CLI);
  2. the environment variable ``MINICAFFE_ENGINE`` = ``CAFFE`` | ``CUDNN``
     (empty, ``DEFAULT`` or ``AUTO``: no override; anything else is an error);
  3. automatic: ``CUDNN`` when the net is in GPU mode and cuDNN loads, else
     ``CAFFE`` (as a Caffe built with ``USE_CUDNN``).

  A default forced to ``CUDNN`` where it cannot run (CPU mode, no cuDNN) gives
  ``CAFFE`` with one warning for the whole process, not one per layer.

A layer may still fall back from ``CUDNN`` to ``CAFFE`` for a configuration that
cuDNN cannot compute as Caffe defines it (a pooling geometry, an LRN parameter,
no convolution algorithm within the workspace limit...): the layer decides that
once, when it is set up or first shaped, through :func:`fall_back`, which records
the reason as ``layer.engine_fallback`` and logs it (Caffe's layer factory does
the same, with an INFO line, for a pooling layer with a mask top).  The decision
never flips back, and nothing is decided per iteration.

cuDNN options, read once per layer at setup (:func:`cudnn_options`):
``MINICAFFE_DETERMINISTIC=1`` (deterministic convolution algorithms and
deterministic max pooling), ``MINICAFFE_TF32=1`` (let float32 convolutions use
TF32 tensor cores; off by default, Caffe is FP32), ``MINICAFFE_CUDNN_FIND``
(default 1: choose convolution algorithms by timing them, ``cudnnFind*``, as
PyTorch's ``cudnn.benchmark``; the search synchronizes and allocates temporary
operands once per shape; 0: cuDNN's heuristics, as Caffe), and
``MINICAFFE_CUDNN_WORKSPACE_LIMIT`` (bytes per convolution, default 4 GiB; under a
memory manager ``MINICAFFE_CUDNN_WORKSPACE_PER_IMAGE`` bytes per image of the call,
default 8 MiB, at most a quarter of the budget; see :mod:`minicaffe.cudnn.ops`).
On an H200 the timed search with the large limit made the convolutions of
VGG-16, AlexNet and ResNet-34 2.2 to 3.3 times faster than the heuristics within
64 MiB (``scripts/conv_algos.py``, docs/RESULTS.md).
"""
from __future__ import annotations

import os
import warnings
from dataclasses import dataclass

CAFFE = "CAFFE"
CUDNN = "CUDNN"
ENGINES = (CAFFE, CUDNN)
ENV_ENGINE = "MINICAFFE_ENGINE"
ENV_DETERMINISTIC = "MINICAFFE_DETERMINISTIC"
ENV_TF32 = "MINICAFFE_TF32"
ENV_FIND = "MINICAFFE_CUDNN_FIND"

# Caffe's Engine enum, identical in every *_param that has one
_ENUM = {0: None, 1: CAFFE, 2: CUDNN}
_AUTO_WORDS = ("", "DEFAULT", "AUTO")

_state = {"default": None, "default_source": None}
_warned: set = set()


class EngineWarning(UserWarning):
    """An engine asked for cannot run here; the layer runs the CAFFE engine instead."""


# ------------------------------------------------------------ the default
def _parse(value, where: str) -> str | None:
    """'CAFFE'/'CUDNN' (any case) -> the name; '', 'DEFAULT', 'AUTO', None -> None."""
    if value is None:
        return None
    s = str(value).strip().upper()
    if s in _AUTO_WORDS:
        return None
    if s not in ENGINES:
        raise ValueError(f"{where}: unknown engine {value!r}; choose CAFFE or CUDNN (or DEFAULT "
                         "for the automatic choice: CUDNN in GPU mode when cuDNN loads, else "
                         "CAFFE)")
    return s


def set_default_engine(name: str | None):
    """Override the engine of every ``DEFAULT``-engine layer in nets built afterwards.

    ``"CAFFE"`` or ``"CUDNN"``; ``None``, ``""``, ``"DEFAULT"`` or ``"AUTO"``
    remove the override.  Takes precedence over ``$MINICAFFE_ENGINE``; a
    layer's explicit ``engine:`` field takes precedence over both.
    """
    _state["default"] = _parse(name, "set_default_engine")
    _state["default_source"] = "set_default_engine" if _state["default"] else None


def get_default_engine() -> str | None:
    """The override set by :func:`set_default_engine` (None: no override)."""
    return _state["default"]


def requested_default() -> tuple[str | None, str]:
    """(engine or None for automatic, where it came from)."""
    if _state["default"] is not None:
        return _state["default"], _state["default_source"]
    env = os.environ.get(ENV_ENGINE)
    if env is not None:
        v = _parse(env, f"${ENV_ENGINE}")
        if v is not None:
            return v, f"${ENV_ENGINE}"
    return None, "automatic"


def is_gpu_module(xp) -> bool:
    """True when ``xp`` is CuPy (the net is in GPU mode)."""
    return getattr(xp, "__name__", "") == "cupy"


def cudnn_available() -> bool:
    """True when cuDNN 9 loads (cached by :mod:`minicaffe.cudnn.lib`; never raises)."""
    from .cudnn import lib
    return lib.available()


def _cudnn_missing() -> str:
    from .cudnn import lib
    return lib.load_report().splitlines()[0] if not lib.available() else ""


def default_engine(xp) -> str:
    """The engine a ``DEFAULT``-engine layer of a net using ``xp`` gets."""
    want, source = requested_default()
    gpu = is_gpu_module(xp)
    if want is None:
        return CUDNN if gpu and cudnn_available() else CAFFE
    if want == CUDNN:
        why = _why_not_cudnn(gpu)
        if why:
            _warn_once(("default", why),
                       f"the default engine is CUDNN (from {source}) but {why}: the layers "
                       "whose engine is DEFAULT use the CAFFE engine")
            return CAFFE
    return want


def _why_not_cudnn(gpu: bool) -> str:
    if not gpu:
        return "the net is in CPU mode"
    if not cudnn_available():
        return f"cuDNN does not load ({_cudnn_missing()})"
    return ""


def _warn_once(key, message: str):
    if key in _warned:
        return
    _warned.add(key)
    warnings.warn(message, EngineWarning, stacklevel=4)


def reset_warnings():
    """Forget which warnings were issued (tests)."""
    _warned.clear()


# ------------------------------------------------------------- per layer
def resolve(layer, field_name: str) -> str:
    """The engine ``layer`` runs: "CAFFE" or "CUDNN", from ``layer.param.<field_name>.engine``.

    Call once, in ``layer_setup``.  An explicit CUDNN that cannot run here
    (CPU mode, no cuDNN) gives CAFFE and a warning naming the layer, once per
    layer name.  Also resets ``layer.engine_fallback`` (None, or why the layer
    runs CAFFE although CUDNN was asked for).
    """
    sub = getattr(layer.param, field_name)
    value = int(sub.engine)
    if value not in _ENUM:
        raise ValueError(f"layer {layer.name!r} ({layer.type}): unknown {field_name}.engine "
                         f"{value} (known: DEFAULT, CAFFE, CUDNN)")
    layer.engine_fallback = None
    explicit = _ENUM[value]
    if explicit is None:
        return default_engine(layer.xp)
    if explicit == CUDNN:
        why = _why_not_cudnn(is_gpu_module(layer.xp))
        if why:
            layer.engine_fallback = why
            _warn_once(("layer", layer.name, why),
                       f"layer {layer.name!r} ({layer.type}): engine CUDNN asked for, but {why}; "
                       "running the CAFFE engine")
            return CAFFE
    return explicit


def fall_back(layer, reason: str):
    """Switch ``layer`` from CUDNN to CAFFE for good, because of ``reason``.

    For configurations cuDNN cannot compute as Caffe does; decided once, at
    setup or reshape.  Logged (INFO) once per layer object.
    """
    from .log import log
    layer.engine = CAFFE
    layer.engine_fallback = reason
    log(f"layer {layer.name!r} ({layer.type}): {reason}; using the CAFFE engine")


def layer_engines(net) -> list[tuple[str, str, str, str | None]]:
    """(layer name, type, engine, fallback reason or None) of every engine-aware layer of
    ``net`` (for logs and ``--engine`` reports)."""
    out = []
    for name, layer in zip(net.layer_names, net.layers):
        eng = getattr(layer, "engine", None)
        if eng is not None:
            out.append((name, layer.type, eng, getattr(layer, "engine_fallback", None)))
    return out


# --------------------------------------------------------- cuDNN options
def _flag(name: str, default: bool = False) -> bool:
    v = os.environ.get(name, "").strip().lower()
    if v == "":
        return default
    if v in ("0", "false", "no", "off"):
        return False
    if v in ("1", "true", "yes", "on"):
        return True
    raise ValueError(f"${name}={os.environ[name]!r}: use 1 or 0")


@dataclass(frozen=True)
class CudnnOptions:
    """How CUDNN-engine layers call cuDNN (read once per layer, at setup).

    deterministic: deterministic convolution algorithms and max pooling.
    tf32: float32 convolutions may use TF32 tensor cores (off: Caffe is FP32).
    find: time the convolution algorithms (``cudnnFind*``, the default) instead of
        taking cuDNN's heuristics (Caffe's choice).
    workspace_limit: bytes of convolution workspace per layer at most.
    workspace_per_image: with it (bytes, 0: off) a call on k images may use ``k`` times it,
        at least ``workspace_floor`` (and 64 MiB) and at most ``workspace_limit``
        (:func:`minicaffe.cudnn.ops.workspace_limit_at`).
    chunks: with a bound per image, a convolution on more images than the limit gives at
        its per-image bytes runs in chunks (:func:`minicaffe.cudnn.ops.workspace_chunks`;
        ``$MINICAFFE_CUDNN_CHUNKS=0`` turns it off), each chunk with the whole limit.
    fit_fastest: with a bound per image, timed search and chunks, each convolution's bytes
        per image are at least what its own fastest algorithms need (timed on
        :data:`~minicaffe.cudnn.ops.FIT_PROBE_IMAGES` images within the cap,
        :func:`minicaffe.cudnn.ops.fastest_bytes_per_image`), so it runs in chunks small
        enough for them instead of a slower algorithm on more images
        (``$MINICAFFE_CUDNN_FIT_FASTEST=0`` turns it off).
    """
    deterministic: bool = False
    tf32: bool = False
    find: bool = True
    workspace_limit: int = 4 << 30
    workspace_per_image: int = 0
    workspace_floor: int = 0
    chunks: bool = True
    fit_fastest: bool = True


def cudnn_options() -> CudnnOptions:
    from .cudnn import ops
    return CudnnOptions(deterministic=_flag(ENV_DETERMINISTIC), tf32=_flag(ENV_TF32),
                        find=_flag(ENV_FIND, default=True), workspace_limit=ops.workspace_limit(),
                        chunks=_flag(ops.ENV_CHUNKS, default=True),
                        fit_fastest=_flag(ops.ENV_FIT, default=True))


def bound_workspaces(net, budget: int | None, *, limit: int | None = None) -> tuple[int, int]:
    """Bound every CUDNN convolution's workspace of ``net`` for training inside ``budget``
    bytes, or to ``limit`` bytes when given (Caffe's 8 MiB per algorithm for the Caffe
    baseline); ``$MINICAFFE_CUDNN_WORKSPACE_LIMIT``, when set, wins over both.

    Inside a budget the bound is per image
    (:func:`minicaffe.cudnn.ops.workspace_per_image_under_budget`, 8 MiB per image by default,
    at least a sixteenth of the budget, at most a quarter of it), or, with the bound per image
    turned off, a sixteenth of the budget
    (:func:`minicaffe.cudnn.ops.workspace_limit_under_budget`).  The algorithms are chosen
    again at the next reshape.  Returns ``(limit, per_image)`` (bytes; per_image
    0: the limit is fixed)."""
    from .cudnn import ops
    per_image = floor = 0
    if limit is None or os.environ.get(ops.ENV_WORKSPACE_LIMIT, "").strip():
        per_image = ops.workspace_per_image_under_budget(budget)
        fixed = ops.workspace_limit_under_budget(budget)
        limit, floor = ((ops.workspace_cap_under_budget(budget), fixed) if per_image
                        else (fixed, 0))
    for layer in net.layers:
        setter = getattr(layer, "set_workspace_limit", None)
        if setter is not None:
            setter(limit, per_image, floor)
    return int(limit), int(per_image)


# ----------------------------------------------------- in-place hazards
def in_place_hazards(net) -> list[str]:
    """Layers whose backward reads a top's data that a later layer overwrites in place.

    A CUDNN max pooling (and Caffe's own Softmax, LRN, Sigmoid, TanH) reads its
    top data in backward; a later in-place layer on that top (a ReLU) would
    make the gradient wrong.  Caffe's layer factory runs its own max pooling
    even under CUDNN for this reason; here the engine runs and this check names
    such pairs (empty list: none).  Conservative: a ReLU in place on a CUDNN max
    pooling's top (cifar10_quick's relu1) is listed, yet harmless, since the
    windows it changes (max < 0) get a zero gradient from the ReLU anyway.
    """
    out = []
    for li, layer in enumerate(net.layers):
        tops = net.top_vecs[li]
        for ti in layer.backward_reads().top:
            storage = tops[ti].data_storage  # Split tops share it with their bottom
            for lj in range(li + 1, len(net.layers)):
                bottoms = net.bottom_vecs[lj]
                if any(t.data_storage is storage and any(b is t for b in bottoms)
                       for t in net.top_vecs[lj]):
                    out.append(f"layer {net.layer_names[lj]!r} works in place on the data of "
                               f"{net.layer_top_names[li][ti]!r}, which the backward of layer "
                               f"{net.layer_names[li]!r} ({layer.type}, engine "
                               f"{getattr(layer, 'engine', CAFFE)}) reads")
                    break
    return out
