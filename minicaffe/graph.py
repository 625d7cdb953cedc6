"""One SGD iteration replayed as a CUDA graph: no Python launch overhead in the steady state.

Eagerly, an iteration of ResNet-50 is a few thousand kernel launches from
Python (about 10 us of host time each), and the GPU idles whenever the host
falls behind.  :class:`IterationGraph` records the whole iteration once with
CuPy's stream capture (``Stream.begin_capture`` / ``end_capture``) and then
replays it with one ``cudaGraphLaunch``:

    clear param diffs -> forward (every layer after the data layers) -> backward
    -> the fused SGD update (one kernel, learning rate read from device memory)

What an iteration must satisfy to be captured, and what breaks capture:

* **No host synchronization.** ``.get()``, ``float()``/``.item()`` on a device
  array, ``cupy.asnumpy``, boolean-mask indexing and ``nonzero`` (they read a
  size back), ``Device.synchronize`` all fail inside a capture.  Layers keep
  losses on the device for this reason; gradient clipping with display logging
  reads the norm and is refused here.
* **No host-to-device copies of changing values.**  A copy from host memory is
  recorded with its source address, so a replay would copy whatever that
  staging buffer holds then.  Data layers (Data, ImageData, HDF5Data,
  MemoryData, DummyData) therefore run *eagerly before each launch*, writing
  into their tops, whose storage must not move (checked before each launch);
  an ``Input`` blob is simply written by the caller before :meth:`step`.
  Per-iteration scalars must come from device memory: the learning rate is
  filled into a device scalar that the fused SGD kernel reads
  (:class:`minicaffe.kernels.cuda_fused.MultiTensorSGD`), and Dropout's draw
  counter lives in device memory, where its forward kernel reads and advances
  it, so each replay draws a fresh mask, the one an eager iteration would draw.
* **Fixed addresses.**  The graph holds the address of every blob, internal,
  parameter and temporary.  Temporaries come from a private CuPy memory pool
  that serves only the warm-up iteration and the capture (which then asks for
  the same blocks in the same order, so the pool never grows during capture)
  and stays alive with this object.  A reshape or a memory plan that rebinds
  storage changes the addresses: :meth:`step` compares a key of every storage
  before each launch and re-captures when it changed.
* **One stream.**  Everything is issued on this object's non-blocking stream
  (cuBLAS, cuDNN and the RawKernels all follow CuPy's current stream); the
  caller's stream is ordered before and after each step with events.
* **cuBLAS through minicaffe.cublas.**  CuPy's own cuBLAS wrappers (``matmul``,
  ``dot``, ``tensordot``) refuse to run during a capture; InnerProduct and the
  CAFFE-engine Convolution call cuBLAS through :mod:`minicaffe.cublas` instead
  (a handle bound to the capturing stream and a workspace of its own, both
  created during the warm-up).  Where that binding does not load, a net with
  those layers is refused with the binding's reason.
* **Python-side state frozen at capture.**  Branches taken in Python (shapes,
  engines, ``propagate_down``) and Python scalars passed to kernels are baked
  in.  So only the plain SGD rule with the fused update is accepted (Adam's
  bias correction and Nesterov's scalars depend on the iteration), with
  ``iter_size`` 1, no gradient clipping and no memory plan (``net.executor``).
  Layers with untested capture behaviour (Accuracy, Python layers, anything
  not in ``CAPTURABLE_TYPES``) are refused with the reason.  A
  ``set_random_seed`` after the capture does not reach the replays (Dropout
  re-keys in Python, at its next eager forward).

Test-net evaluation, display, snapshots and callbacks stay with
:class:`minicaffe.solver.Solver`; :meth:`IterationGraph.step` is the inner
``forward_backward`` + ``apply_update`` of ``Solver.step``.  Use::

    g = IterationGraph(solver)      # raises NotCapturable with the reasons
    for _ in range(n):
        net.blobs["data"].data[...] = next_batch   # or a Data layer feeds it
        loss = g.step()             # a device scalar; float(loss) syncs
"""
from __future__ import annotations

from . import cublas
from . import engine as engines
from .kernels import cuda_fused

# Layers whose forward only feeds host data into their tops: run eagerly before each launch.
DATA_LAYER_TYPES = frozenset({"Data", "ImageData", "HDF5Data", "MemoryData", "DummyData",
                              "WindowData"})
# Layers checked to issue device work only (no host sync, no host-to-device copy of a
# changing value) in forward and backward.
CAPTURABLE_TYPES = frozenset({"Input", "Convolution", "Pooling", "LRN", "BatchNorm", "Scale",
                              "Bias", "ReLU", "Sigmoid", "TanH", "Dropout", "Eltwise",
                              "InnerProduct", "Softmax", "SoftmaxWithLoss", "EuclideanLoss",
                              "Split", "Concat", "Flatten", "Reshape", "Silence"})


class NotCapturable(RuntimeError):
    """The iteration cannot be captured; the message lists every reason."""


def _data_prefix(net) -> int:
    """Number of leading data layers (no bottoms, host-fed tops)."""
    k = 0
    while k < len(net.layers) and net.layers[k].type in DATA_LAYER_TYPES \
            and not net.bottom_vecs[k]:
        k += 1
    return k


def gemm_layers(net) -> list[str]:
    """Names of the layers whose GPU GEMMs call cuBLAS: InnerProduct, and Convolution in
    the CAFFE engine (the CUDNN engine calls cuDNN)."""
    return [layer.name for layer in net.layers
            if layer.type == "InnerProduct"
            or (layer.type == "Convolution" and getattr(layer, "engine", None) == engines.CAFFE)]


def why_not_capturable(solver) -> list[str]:
    """Every reason that keeps ``solver``'s iteration out of a CUDA graph (empty: capturable)."""
    from .solver import SGDRule
    net, p = solver.net, solver.param
    reasons = []
    gpu = cuda_fused.enabled_for(net.xp, net.dtype)
    if not gpu:
        reasons.append("not GPU mode with the fused kernels (MINICAFFE_FUSED, CuPy, a device)")
    elif not cublas.enabled_for(net.xp):
        names = gemm_layers(net)
        if names:
            reasons.append(
                f"layers {', '.join(map(repr, names))} would call cuBLAS through CuPy, which "
                f"refuses stream capture, because minicaffe.cublas is not active: "
                f"{cublas.unavailable_reason(net.xp)}")
    if net.executor is not None:
        reasons.append("the net runs under a memory plan (swap executor: three streams)")
    if type(solver.rule) is not SGDRule:
        reasons.append(f"solver type {solver.type!r}: only plain SGD has a capturable update")
    if p.HasField("clip_gradients") and p.clip_gradients >= 0:
        reasons.append("gradient clipping")
    if p.iter_size > 1:
        reasons.append("iter_size > 1")
    if not reasons and solver.fused_sgd() is None:
        reasons.append("the parameters do not fit the fused SGD update (mixed dtypes?)")
    prefix = _data_prefix(net)
    for li in range(prefix, len(net.layers)):
        layer = net.layers[li]
        if layer.type in DATA_LAYER_TYPES:
            reasons.append(f"data layer {layer.name!r} does not come first")
        elif layer.type not in CAPTURABLE_TYPES:
            reasons.append(f"layer {layer.name!r} of type {layer.type} is not known to be "
                           "capturable")
    return reasons


def storage_key(solver) -> tuple:
    """Identity of every buffer a captured iteration touches (blobs, internals,
    params, history), to detect storage that moved since the capture."""
    net = solver.net
    key = []
    for b in net.blobs.values():
        key.append(id(b.data_storage.array))
        key.append(id(b.diff_storage.array))
    for layer in net.layers:
        for it in layer.internals.values():
            key.append(id(it.blob.data_storage.array))
        for b in layer.blobs:
            key.append(id(b.data_storage.array))
            key.append(id(b.diff_storage.array))
    key.extend(id(h) for h in solver.history)
    return tuple(key)


class IterationGraph:
    """Replays ``solver``'s training iteration as one CUDA graph (see the module doc).

    Args:
        solver: a :class:`minicaffe.solver.Solver` in GPU mode.
        warmup: eager iterations before the capture (at least 2: the first in
            CuPy's default pool creates every lazily allocated buffer, the last
            in the graph's private pool fills it with the temporaries' blocks).
    """

    def __init__(self, solver, warmup: int = 2):
        reasons = why_not_capturable(solver)
        if reasons:
            raise NotCapturable("; ".join(reasons))
        import cupy
        self.cp = cupy
        self.solver = solver
        self.net = solver.net
        self.prefix = _data_prefix(self.net)
        self.stream = cupy.cuda.Stream(non_blocking=True)
        self.warmup = max(2, int(warmup))
        self.captures = 0          # how many times the iteration was (re)captured
        self.last_rate = None      # the learning rate of the last step
        self._reset()

    def _reset(self):
        self.graph = None
        self.pool = self.cp.cuda.MemoryPool()
        self._eager_left = self.warmup
        self._loss = None
        self._key = None

    # ------------------------------------------------------------ the body
    def _body(self, rate: float, rate_from_device: bool):
        """clear diffs, forward and backward after the data layers, the fused update.
        Returns the loss (a device scalar, or 0.0 for a net without loss)."""
        net, p = self.net, self.solver.param
        fused = self.solver.fused_sgd()
        fused.zero("diff")  # Net.clear_param_diffs in one launch
        loss = 0.0
        for li in range(self.prefix, len(net.layers)):
            loss = loss + net.forward_layer(li)
        for li in range(len(net.layers) - 1, self.prefix - 1, -1):
            net.backward_layer(li)
        fused.update(rate, p.momentum, p.weight_decay, 1,
                     (p.regularization_type or "L2") == "L1", rate_from_device=rate_from_device)
        return loss

    def _capture(self):
        s = self.stream
        s.synchronize()
        with self.cp.cuda.using_allocator(self.pool.malloc):
            s.begin_capture()
            try:
                loss = self._body(0.0, rate_from_device=True)
            except BaseException:
                try:
                    s.end_capture()
                except Exception:
                    pass
                raise
            self.graph = s.end_capture()
        # a Python 0.0 (no loss layer) stays a host number
        self._loss = loss
        self._key = storage_key(self.solver)
        self.graph.upload(s)
        self.captures += 1

    # ------------------------------------------------------------- stepping
    def step(self, advance: bool = True):
        """One training iteration (``Solver.step(1)`` less test, display, snapshot,
        callbacks); returns the loss as a new device scalar.  ``advance=False`` leaves
        ``solver.iter`` for the caller to count (``Solver.step`` does); the learning
        rate used is kept in ``last_rate``."""
        cp, solver, net, s = self.cp, self.solver, self.net, self.stream
        caller = cp.cuda.get_current_stream()
        rate = solver.get_learning_rate()
        self.last_rate = rate
        s.wait_event(caller.record())  # inputs written by the caller come first
        with s:
            for li in range(self.prefix):  # host-fed data into fixed top buffers
                net.forward_layer(li)
            if self.graph is not None and storage_key(solver) != self._key:
                self._reset()  # storage moved: warm up and capture again
            if self.graph is None and self._eager_left > 0:
                if self._eager_left == 1:   # the last warm-up fills the private pool
                    with cp.cuda.using_allocator(self.pool.malloc):
                        loss = self._body(rate, rate_from_device=False)
                else:
                    loss = self._body(rate, rate_from_device=False)
                self._eager_left -= 1
                loss = loss.copy() if hasattr(loss, "copy") else cp.full((), loss, net.dtype)
            else:
                if self.graph is None:
                    self._capture()
                solver.fused_sgd().rate.fill(rate)  # a fill kernel: no host-to-device copy
                self.graph.launch(s)
                loss = (self._loss.copy() if hasattr(self._loss, "copy")
                        else cp.full((), self._loss, net.dtype))
        caller.wait_event(s.record())  # the caller sees this iteration's results
        if advance:
            solver.iter += 1
        solver.last_loss = loss
        return loss
