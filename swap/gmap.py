"""Static analysis: the global memory-object access pattern (GMAP) of a net (paper, section 3).

A net of N layers trains in 2N steps: forward of layer 0 .. N-1, then backward of layer N-1 .. 0
(layers that need no backward are skipped in the second half, as ``Net.backward_from_to`` skips
them).  The GMAP says, for every step, which memory objects its computation reads, writes and
needs as scratch, and, in the paper's sense, which are allocated, released, offloaded and
prefetched when every feature map is swapped out (the naive pattern, from which the
strategies of :mod:`swap.plan` schedule).  It is the same every iteration and does not depend on
the minibatch size k: only the sizes do, linearly (section 3: "as minibatch size maps to one
channel of input, the corresponding size of feature maps related operation is proportional to
minibatch size"), and so do the FLOPs of every layer (eq. 1).  One size is neither: a cuDNN
convolution's workspace, which cuDNN sizes anew for each shape (:class:`Size`, ``per_k``).

The memory objects (:class:`Buffer`) are what Caffe allocates, by storage identity:

* ``data``: each unique blob data storage.  In-place layers share one Blob; Split tops,
  Flatten and Reshape tops share their bottom's data (``Blob.share_data``), so they are one
  buffer.  Its forward last use is the last forward step touching it; its backward uses are
  the backward steps whose ``backward_reads()`` name it.
* ``diff``: each diff storage that some backward writes (``bottom_need_backward``); each Split
  top has its own.  Live from its first writer to its last reader, within backward.
* ``const_diff``: a diff read by backward but written by nobody: the loss weight a loss top's
  diff holds (Caffe's SetLossWeights), or zeros.  Resident, tiny.
* ``param``, ``param_diff``, ``history``: each learnable parameter's data, diff and solver
  history (one slot for SGD/Nesterov/AdaGrad/RMSProp, two for AdaDelta/Adam); BatchNorm's
  statistics too, as in Caffe.
  Constant in k, resident.
* ``saved``: a layer internal written by forward and read by backward (a mask, ``x_norm``); a
  feature map for swapping purposes.  ``scratch``: an internal used within one step (im2col).
* ``caffe``: memory Caffe allocates that minicaffe does not need (see :mod:`swap.memory`); only
  the ``none`` plan reserves it, so that a ``none`` run is as large as Caffe's.

Each forward step also says whether its layer may be *recomputed* (``Step.recomputable``): run
again in backward to rebuild what it wrote, as the ``recompute`` strategy does
(:func:`swap.plan.plan_recompute`): a cheap layer (:data:`RECOMPUTABLE_TYPES`) whose forward is
a function of its bottoms and parameters alone.

Everything here is a pure function of a built Net; results are frozen dataclasses and tuples.
"""
from __future__ import annotations

from dataclasses import dataclass, field, replace

import numpy as np

FORWARD = "forward"
BACKWARD = "backward"

DATA = "data"
DIFF = "diff"
CONST_DIFF = "const_diff"
PARAM = "param"
PARAM_DIFF = "param_diff"
HISTORY = "history"
SAVED = "saved"
SCRATCH = "scratch"
CAFFE = "caffe"

KINDS = (DATA, DIFF, CONST_DIFF, PARAM, PARAM_DIFF, HISTORY, SAVED, SCRATCH, CAFFE)

# Caffe's cuDNN convolution: workspace limit per algorithm, streams per group
# (cudnn_conv_layer.cpp: workspace_limit_bytes = 8*1024*1024, CUDNN_STREAMS_PER_GROUP 3).
CUDNN_WORKSPACE_LIMIT = 8 << 20
CUDNN_STREAMS_PER_GROUP = 3
HISTORY_SLOTS = {"SGD": 1, "Nesterov": 1, "AdaGrad": 1, "RMSProp": 1, "AdaDelta": 2, "Adam": 2}
# the CAFFE-engine convolution's lowering scratch (buffer-name suffixes), one image in Caffe
LOWERING_SCRATCH = ("/col", "/top_diff_t")
# Caffe's BasePrefetchingDataLayer subclasses: their read-ahead batches are device memory
PREFETCHING_TYPES = ("Data", "ImageData", "WindowData")

# Layer types whose forward is cheap beside a convolution's or an inner product's (elementwise,
# a small window, a copy, a view) and a function of the bottoms and parameters alone, so that
# running it again in backward rebuilds exactly what it wrote: SuperNeurons' "cheap layers"
# (the ``recompute`` strategy, swap.plan.plan_recompute).  Not Dropout (its forward draws a new
# mask), nor STOCHASTIC pooling (it draws its positions, see _recomputable); BatchNorm is,
# because it leaves its running statistics alone while its ``recompute`` flag is set
# (minicaffe/layers/batchnorm.py).
RECOMPUTABLE_TYPES = frozenset({"ReLU", "Sigmoid", "TanH", "Pooling", "LRN", "BatchNorm",
                                "Scale", "Bias", "Eltwise", "Concat", "Softmax", "Split",
                                "Flatten", "Reshape"})


# ------------------------------------------------------------------ sizes
@dataclass(frozen=True)
class Size:
    """Bytes at minibatch k: ``item * min(k, cap)`` if batch-scaled, else ``item``.

    ``cap`` bounds the images a batch-scaled buffer grows to (the convolution's im2col chunk
    stops growing at ``col_buffer_bytes``); None means linear for every k.

    ``per_k``, where given, is the answer at every k (``per_k(k)`` bytes; ``item`` is the
    answer at the GMAP's own k): a cuDNN convolution's workspace, which is neither constant
    nor linear in k, because cuDNN chooses other algorithms at other shapes
    (:meth:`minicaffe.layers.conv.ConvolutionLayer.workspace_model`).  It is not part of
    the value (equality, hashing, repr).
    """
    item: int
    scaled: bool
    cap: int | None = None
    per_k: object = field(default=None, compare=False, repr=False)

    def at(self, k: int) -> int:
        if self.per_k is not None:
            return int(self.per_k(k))
        if not self.scaled:
            return self.item
        return self.item * (k if self.cap is None else min(k, self.cap))


@dataclass(frozen=True)
class Buffer:
    """One memory object.

    id: index in ``GMAP.buffers``.  name: for people (``data:conv1``, ``saved:bn1/x_norm``).
    kind: one of :data:`KINDS`.  dtype: element type of its views.
    size: bytes at k (:class:`Size`); caffe: what Caffe allocates for the same object (None:
    the same; differs for the convolution's scratch, which Caffe keeps at one image).
    persistent: holds state across iterations (parameters, loss weights, net outputs, inputs the
    caller writes): resident for the whole run in every strategy.
    ref: where the executor finds it in the net: ("data", blob), ("diff", blob),
    ("param" | "param_diff", i), ("history", i, slot), ("internal", layer, name), or () for
    ``caffe`` reservations that back nothing.
    uses: sorted steps whose computation touches it.  forward_uses / backward_uses split them.
    """
    id: int
    name: str
    kind: str
    dtype: str
    size: Size
    persistent: bool
    ref: tuple
    uses: tuple = ()
    n_forward: int = 0
    caffe: Size | None = None

    def nbytes(self, k: int) -> int:
        return self.size.at(k)

    def caffe_nbytes(self, k: int) -> int:
        return (self.size if self.caffe is None else self.caffe).at(k)

    @property
    def forward_uses(self) -> tuple:
        return tuple(s for s in self.uses if s < self.n_forward)

    @property
    def backward_uses(self) -> tuple:
        return tuple(s for s in self.uses if s >= self.n_forward)

    @property
    def is_feature_map(self) -> bool:
        """Data kept from forward to backward: what swapping may offload (section 3)."""
        return (self.kind in (DATA, SAVED) and not self.persistent
                and bool(self.forward_uses) and bool(self.backward_uses))


@dataclass(frozen=True)
class Step:
    """One of the 2N steps: the forward or backward computation of one layer.

    reads / writes: buffers its computation reads / writes (parameters included); scratch:
    internals it needs within the step only.  flops: of this computation at ``GMAP.k``.
    allocate / release / offload / prefetch: the GMAP proper, for the naive pattern (every
    feature map offloaded after its last forward use, back for its first backward use):
    buffers first written here (and scratch), dead after this step, offloaded after this step
    (its device copy is released once the copy completes), needed back from the host here.
    recomputable: a forward step that may run again in backward with the same result and no
    other effect (:data:`RECOMPUTABLE_TYPES`); always False for a backward step.
    """
    index: int
    layer: int
    name: str
    type: str
    phase: str
    reads: tuple
    writes: tuple
    scratch: tuple
    flops: float
    allocate: tuple = ()
    release: tuple = ()
    offload: tuple = ()
    prefetch: tuple = ()
    recomputable: bool = False

    @property
    def touches(self) -> tuple:
        return tuple(sorted(set(self.reads) | set(self.writes) | set(self.scratch)))

    def __str__(self):
        return f"step {self.index} ({self.phase} {self.name})"


@dataclass(frozen=True)
class GMAP:
    """The access pattern of one net at minibatch ``k`` (analysed at the net's own ``k0``)."""
    net_name: str
    k: int
    k0: int
    n_layers: int
    n_forward: int
    buffers: tuple
    steps: tuple
    layer_names: tuple = field(default=(), repr=False)

    @property
    def n_steps(self) -> int:
        return len(self.steps)

    def at(self, k: int) -> "GMAP":
        """The same pattern at minibatch ``k``: sizes through :class:`Size`, FLOPs by eq. (1)."""
        k = int(k)
        if k <= 0:
            raise ValueError(f"minibatch size must be positive, got {k}")
        if k == self.k:
            return self
        ratio = k / self.k
        steps = tuple(replace(s, flops=s.flops * ratio) for s in self.steps)
        return replace(self, k=k, steps=steps)

    def nbytes(self, bid: int) -> int:
        return self.buffers[bid].nbytes(self.k)

    def sizes(self) -> list[int]:
        """Bytes of every buffer at ``k`` (index = buffer id)."""
        return [b.nbytes(self.k) for b in self.buffers]

    def total(self, kinds=None, caffe: bool = False) -> int:
        """Sum of the buffers of ``kinds`` (all but ``caffe`` reservations by default)."""
        if kinds is None:
            kinds = tuple(x for x in KINDS if x != CAFFE) if not caffe else KINDS
        f = (lambda b: b.caffe_nbytes(self.k)) if caffe else (lambda b: b.nbytes(self.k))
        return sum(f(b) for b in self.buffers if b.kind in kinds)

    def feature_maps(self) -> tuple:
        """Ids of the buffers a swap strategy may offload."""
        return tuple(b.id for b in self.buffers if b.is_feature_map)

    def layout(self) -> dict:
        """What a plan of this GMAP has to place, in a few numbers ({"k", "feature_maps",
        "feature_map_bytes"}), which a profile keeps (``meta["layout"]``) so that a plan made
        elsewhere from it can say whether its own net has the same maps (``minicaffe plan``)."""
        fm = [b for b in self.buffers if b.is_feature_map]
        return {"k": int(self.k), "feature_maps": len(fm),
                "feature_map_bytes": int(sum(b.nbytes(self.k) for b in fm))}

    def step_name(self, j: int) -> str:
        return str(self.steps[j])

    def find(self, name: str) -> Buffer:
        for b in self.buffers:
            if b.name == name:
                return b
        raise KeyError(f"GMAP of {self.net_name!r} has no buffer {name!r}")

    def flops(self) -> float:
        return sum(s.flops for s in self.steps)

    def caffe_lowering(self) -> "GMAP":
        """The same net with Caffe's one-image im2col: every CAFFE-engine convolution's
        lowering scratch (``col``, ``top_diff_t``) at the size Caffe gives it (one image, and
        nothing for the transposed top diff), as the net would analyse after
        :func:`swap.runtime.set_lowering` ``(net, "caffe")``.  The ``none`` baseline's plan is
        made on this GMAP, so that it allocates what Caffe allocates."""
        def lowered(b):
            if b.kind != SCRATCH or b.caffe is None or not b.name.endswith(LOWERING_SCRATCH):
                return b
            return replace(b, size=b.caffe)
        buffers = tuple(lowered(b) for b in self.buffers)
        if all(a is b for a, b in zip(buffers, self.buffers)):
            return self
        return replace(self, buffers=buffers)


# --------------------------------------------------------------- analysis
def net_batch_size(net) -> int:
    """The minibatch of a built net: the first axis of its first data-layer top."""
    for li, layer in enumerate(net.layers):
        if not net.bottom_vecs[li]:
            for t in net.top_vecs[li]:
                if t.ndim >= 1 and t.shape[0] > 0:
                    return int(t.shape[0])
    return 1


def _is_reduction(layer) -> bool:
    """Layers whose tops do not scale with the batch (a loss, an accuracy)."""
    return bool(getattr(layer, "is_loss", False)) or layer.type == "Accuracy"


def _conv_cap(layer) -> int | None:
    """Images a convolution lowers at once at most (its im2col chunk bound), or None.

    minicaffe's convolution lowers ``chunk = min(k, cap)`` images at a time, ``cap =
    max(1, col_buffer_bytes // one image)``, and sizes its scratch for one chunk, so the scratch
    is ``min(k, cap)`` times its size per image for every k.
    """
    cap_bytes = getattr(layer, "col_buffer_bytes", None)
    if cap_bytes is None or not hasattr(layer, "kdim") or not hasattr(layer, "out_spatial"):
        return None
    per_image = layer.kdim * layer.out_spatial * layer.dtype.itemsize
    return max(1, int(cap_bytes) // max(per_image, 1))


def _recomputable(layer) -> bool:
    """May ``layer``'s forward run again in backward (see :data:`RECOMPUTABLE_TYPES`)?"""
    if layer.type not in RECOMPUTABLE_TYPES:
        return False
    if layer.type == "Pooling":
        from minicaffe.layers.pooling import STOCHASTIC
        return layer.method != STOCHASTIC          # TRAIN draws the pooled positions
    if layer.type == "BatchNorm":
        return hasattr(layer, "recompute")         # it can leave its statistics alone
    return True


def _workspace_at(layer, net, li: int, k0: int):
    """``fn(k) -> bytes`` of a cuDNN convolution's workspace at minibatch k (None where the
    layer does not run cuDNN, or its images are not a multiple of the net's minibatch): the
    layer's :meth:`workspace_model`, with the options it has now, at its own images scaled
    from ``k0`` to k.  At ``k0`` it is the workspace the layer has."""
    model = getattr(layer, "workspace_model", None)
    fn = model() if model is not None else None
    if fn is None or "workspace" not in layer.internals:
        return None
    num0 = int(getattr(layer, "num", 0) or 0)
    if num0 <= 0 or num0 % k0:
        return None
    per_image = num0 // k0
    own = int(layer.internals["workspace"].blob.nbytes)

    def at(k: int) -> int:
        k = int(k)
        return own if k == k0 else fn(per_image * k)
    return at


def _conv_engine(layer, default: str) -> str:
    engine = layer.param.convolution_param.engine
    return {1: "CAFFE", 2: "CUDNN"}.get(engine, default)


def build_gmap(net, k: int | None = None, *, solver_type: str = "SGD",
               caffe_engine: str = "CAFFE") -> GMAP:
    """Analyse a built Net; return its GMAP at minibatch ``k`` (default: the net's own).

    Args:
        net: a built ``minicaffe.net.Net`` (TRAIN phase for training).
        k: minibatch to size for; sizes scale from the net's own batch by :class:`Size`.
        solver_type: decides the history slots per parameter (HISTORY_SLOTS).
        caffe_engine: what a DEFAULT-engine convolution is in the Caffe accounting ("CAFFE":
            a one-image im2col buffer per layer; "CUDNN": workspaces, no im2col).

    Reads layer declarations only (``backward_reads()``, ``internals``, ``flops()``); it
    allocates nothing and does not touch blob contents.  One exception: a net whose
    BatchNorm and Scale layers run paired (the fused GPU path, Net.set_bn_scale_fusion) is
    paired again as a plan runs pairs (each BatchNorm in place: the pair's backward, in the
    Scale's step, reads the BatchNorm's internals and writes no diff but the Scale's own).
    A paired Scale keeps no copy of its input; Caffe's copy is counted in the Caffe
    accounting.
    """
    if getattr(net, "bn_scale_pairs", None):
        net.set_bn_scale_fusion(True, planned=True)
    if solver_type not in HISTORY_SLOTS:
        raise ValueError(f"unknown solver type {solver_type!r} (known: {', '.join(HISTORY_SLOTS)})")
    n = len(net.layers)
    k0 = net_batch_size(net)
    bwd_layers = [li for li in range(n - 1, -1, -1) if net.layer_need_backward[li]]
    bstep = {li: n + i for i, li in enumerate(bwd_layers)}

    # ---- which blobs scale with the batch: propagate from the data layers.
    scaled: dict[int, bool] = {}        # id(Blob) -> batch-scaled
    for li, layer in enumerate(net.layers):
        bottoms, tops = net.bottom_vecs[li], net.top_vecs[li]
        src = any(scaled.get(id(b), False) for b in bottoms)
        for t in tops:
            if id(t) in scaled:          # in place: keeps its bottom's answer
                continue
            if not bottoms:
                s = t.ndim >= 1 and t.shape[0] == k0
            else:
                s = src and not _is_reduction(layer) and t.ndim >= 1
            scaled[id(t)] = bool(s and t.nbytes % k0 == 0)

    def size_of(nbytes: int, is_scaled: bool) -> Size:
        """Bytes measured at k0 -> a Size: linear in k when batch-scaled (section 3)."""
        if is_scaled and nbytes % k0 == 0 and nbytes:
            return Size(nbytes // k0, True)
        return Size(nbytes, False)

    buffers: list[dict] = []
    data_of: dict[int, int] = {}        # id(Storage) -> buffer index
    diff_of: dict[int, int] = {}

    def new(name, kind, dtype, size, ref, persistent=False, caffe=None) -> int:
        buffers.append(dict(name=name, kind=kind, dtype=np.dtype(dtype).name, size=size, ref=ref,
                            persistent=persistent, caffe=caffe, uses=set()))
        return len(buffers) - 1

    # ---- blob storages, by identity; the representative blob is the largest sharer.
    blobs_of: dict[int, list] = {}
    for name, blob in net.blobs.items():
        blobs_of.setdefault(id(blob.data_storage), []).append((name, blob))
    diff_blobs: dict[int, list] = {}
    for name, blob in net.blobs.items():
        diff_blobs.setdefault(id(blob.diff_storage), []).append((name, blob))

    def rep(group):
        return max(group, key=lambda nb: nb[1].count)

    def data_buf(blob) -> int | None:
        key = id(blob.data_storage)
        if key not in data_of:
            name, b = rep(blobs_of[key])
            if b.nbytes == 0:
                return None
            data_of[key] = new(f"data:{name}", DATA, b.dtype, size_of(b.nbytes, scaled[id(b)]),
                               ("data", name))
        return data_of[key]

    def diff_buf(blob) -> int | None:
        key = id(blob.diff_storage)
        if key not in diff_of:
            name, b = rep(diff_blobs[key])
            if b.nbytes == 0:
                return None
            diff_of[key] = new(f"diff:{name}", DIFF, b.dtype, size_of(b.nbytes, scaled[id(b)]),
                               ("diff", name))
        return diff_of[key]

    # ---- persistent data: net outputs, Input tops (the caller writes them), DummyData tops
    # filled once at setup.
    persistent_storage = set()
    for name in net.outputs:
        persistent_storage.add(id(net.blobs[name].data_storage))
    input_diffs = set()
    for li, layer in enumerate(net.layers):
        tops = net.top_vecs[li]
        if layer.type == "Input":
            for t in tops:
                persistent_storage.add(id(t.data_storage))
                input_diffs.add(id(t.diff_storage))
        elif hasattr(layer, "persistent_tops"):
            for i in layer.persistent_tops(len(tops)):
                persistent_storage.add(id(tops[i].data_storage))

    # ---- parameters, diffs, history: constant in k, resident.
    slots = HISTORY_SLOTS[solver_type]
    param_ids = []
    for i, p in enumerate(net.learnable_params):
        if p.nbytes == 0:
            continue
        owner = _param_name(net, p, i)
        param_ids.append(new(f"param:{owner}", PARAM, p.dtype, Size(p.nbytes, False),
                             ("param", i), persistent=True))
        param_ids.append(new(f"param_diff:{owner}", PARAM_DIFF, p.dtype, Size(p.nbytes, False),
                             ("param_diff", i), persistent=True))
        for s in range(slots):
            param_ids.append(new(f"history:{owner}" + (f"#{s}" if slots > 1 else ""), HISTORY,
                                 p.dtype, Size(p.nbytes, False), ("history", i, s),
                                 persistent=True))
    pdata, pdiff = {}, {}     # id(Storage) -> buffer, for the steps' parameter reads/writes
    for b_i in param_ids:
        ref = buffers[b_i]["ref"]
        if ref[0] == "param":
            pdata[id(net.learnable_params[ref[1]].data_storage)] = b_i
        elif ref[0] == "param_diff":
            pdiff[id(net.learnable_params[ref[1]].diff_storage)] = b_i

    # ---- layer internals
    internal_of: dict[tuple, int] = {}
    for li, layer in enumerate(net.layers):
        cap = _conv_cap(layer)
        ws_at = _workspace_at(layer, net, li, k0)
        for iname, it in layer.internals.items():
            nb = it.blob.nbytes
            per_k = ws_at if iname == "workspace" else None
            if nb == 0 and per_k is None:
                continue
            kind = SAVED if it.saved else SCRATCH
            caffe = None
            if layer.type == "Convolution" and not it.saved:
                # Caffe keeps one image of im2col per CAFFE-engine layer, nothing for cuDNN,
                # and has no other convolution scratch (see swap.memory).
                # A running cuDNN convolution's workspace is one stream's; Caffe's two
                # more streams are in _caffe_only.
                engine = _conv_engine(layer, caffe_engine)
                if iname == "col" and engine == "CAFFE":
                    caffe = Size(layer.kdim * layer.out_spatial * layer.dtype.itemsize, False)
                elif iname == "workspace" and engine == "CUDNN":
                    caffe = Size(nb, False, per_k=per_k)
                else:
                    caffe = Size(0, False)
            chunk = getattr(layer, "chunk", None)
            if (cap is not None and iname in ("col", "top_diff_t") and chunk
                    and nb % chunk == 0):
                # a convolution's scratch holds a chunk of min(k, cap) images
                size = Size(nb // chunk, True, cap)
            elif per_k is not None:
                size = Size(nb, False, per_k=per_k)
            else:
                size = size_of(nb, it.batch_scaled)
            internal_of[(li, iname)] = new(f"{kind}:{layer.name}/{iname}", kind, it.blob.dtype,
                                           size, ("internal", li, iname), caffe=caffe)

    # ---- steps: what each computation touches
    raw_steps = []
    for li, layer in enumerate(net.layers):
        bottoms, tops = net.bottom_vecs[li], net.top_vecs[li]
        reads = {data_buf(b) for b in bottoms}
        writes = {data_buf(t) for t in tops}
        scratch = set()
        for iname, it in layer.internals.items():
            bid = internal_of.get((li, iname))
            if bid is None:
                continue
            if it.saved:
                writes.add(bid)
            elif FORWARD in it.uses:
                scratch.add(bid)
        for p in layer.blobs:
            if id(p.data_storage) in pdata:
                reads.add(pdata[id(p.data_storage)])
        fl = layer.flops(bottoms, tops)
        raw_steps.append((li, FORWARD, reads, writes, scratch, float(fl[0])))
    diff_writers: dict[int, set] = {}
    diff_readers: dict[int, set] = {}
    index_of = {id(layer): li for li, layer in enumerate(net.layers)}
    for li in bwd_layers:
        layer = net.layers[li]
        j = bstep[li]
        bottoms, tops = net.bottom_vecs[li], net.top_vecs[li]
        br = layer.backward_reads()
        reads = {data_buf(bottoms[i]) for i in br.bottom} | {data_buf(tops[i]) for i in br.top}
        reads |= {internal_of[(li, n_)] for n_ in br.internals if (li, n_) in internal_of}
        borrowed_scratch = set()
        for other, n_ in br.others:
            bid = internal_of.get((index_of[id(other)], n_))
            if bid is not None:
                (reads if other.internals[n_].saved else borrowed_scratch).add(bid)
        writes = set()
        for t in tops:
            d = diff_buf(t)
            if d is not None:
                reads.add(d)
                diff_readers.setdefault(d, set()).add(j)
        for bi, b in enumerate(bottoms):
            if net.bottom_need_backward[li][bi]:
                d = diff_buf(b)
                if d is not None:
                    writes.add(d)
                    diff_writers.setdefault(d, set()).add(j)
        scratch = {bid for iname, it in layer.internals.items()
                   if not it.saved and BACKWARD in it.uses
                   and (bid := internal_of.get((li, iname))) is not None} | borrowed_scratch
        for pi, p in enumerate(layer.blobs):
            if id(p.data_storage) in pdata:
                reads.add(pdata[id(p.data_storage)])
            if id(p.diff_storage) in pdiff and layer.param_propagate_down[pi]:
                writes.add(pdiff[id(p.diff_storage)])
        fl = layer.flops(bottoms, tops)
        raw_steps.append((li, BACKWARD, reads, writes, scratch, float(fl[1])))

    for j, (li, phase, reads, writes, scratch, _) in enumerate(raw_steps):
        reads.discard(None)
        writes.discard(None)
        for bid in reads | writes | scratch:
            buffers[bid]["uses"].add(j)

    # ---- classify diffs: written by backward (dynamic) or read only (constant, resident)
    for key, bid in diff_of.items():
        b = buffers[bid]
        writers, readers = diff_writers.get(bid, set()), diff_readers.get(bid, set())
        if not writers or (readers and min(readers) < min(writers)):
            b["kind"] = CONST_DIFF
            b["persistent"] = True
        if key in input_diffs:
            b["persistent"] = True
    for key, bid in data_of.items():
        if key in persistent_storage:
            buffers[bid]["persistent"] = True

    # ---- what Caffe allocates besides (the `none` accounting, swap.memory)
    for extra in _caffe_only(net, k0, bwd_layers, diff_of, caffe_engine, size_of):
        new(*extra, persistent=True)

    frozen = tuple(
        Buffer(id=i, name=b["name"], kind=b["kind"], dtype=b["dtype"], size=b["size"],
               persistent=b["persistent"] or b["kind"] in (PARAM, PARAM_DIFF, HISTORY, CAFFE),
               ref=b["ref"], uses=tuple(sorted(b["uses"])), n_forward=n, caffe=b["caffe"])
        for i, b in enumerate(buffers))
    steps = _naive_pattern(net, raw_steps, frozen, n)
    g = GMAP(net_name=net.name, k=k0, k0=k0, n_layers=n, n_forward=n, buffers=frozen,
             steps=steps, layer_names=tuple(net.layer_names))
    return g if k is None else g.at(k)


def _param_name(net, p, i) -> str:
    """``layer/index`` of the owner of learnable param ``i``."""
    for flat, q in enumerate(net.all_params):
        if q is p:
            li, pi = net.param_layer_index[flat]
            return f"{net.layer_names[li]}/{pi}"
    return f"param{i}"


def _caffe_only(net, k0, bwd_layers, diff_of, caffe_engine, size_of):
    """(name, kind, dtype, size, ref) of memory Caffe allocates and minicaffe does not.

    CAFFE_FACTS, "Memory that Caffe allocates":
    * the prefetching data layers' batches (:data:`PREFETCHING_TYPES`), all resident:
      ``prefetch`` batches, one of which the tops alias (Caffe's Forward sets the tops' data
      to the current batch), so ``prefetch - 1`` batches beyond the tops;
    * BatchNorm always keeps ``temp_`` and ``x_norm_`` (full size; minicaffe declares them only
      with batch statistics) and, when in place, a full-size copy of the top diff
      (``x_norm_``'s diff) for backward;
    * a Scale in place keeps a copy of its input (a Scale paired with a BatchNorm does not:
      it reads the BatchNorm's ``x_norm``);
    * a CAFFE-engine convolution that computes its weight gradient writes its bottom's diff even
      where nothing needs it (``mutable_gpu_diff`` before the propagate_down test), so the data
      blob gets a diff; a cuDNN convolution does not, and instead keeps one workspace per
      stream (3) and per group, each the largest need of its three algorithms within 8 MiB:
      two more of the layer's own ``workspace`` where it runs cuDNN (the same algorithms,
      which :func:`swap.runtime.set_lowering` bounds as Caffe does), else the bound.
    """
    out = []
    backward = set(bwd_layers)
    for li, layer in enumerate(net.layers):
        tops, bottoms = net.top_vecs[li], net.bottom_vecs[li]
        if hasattr(layer, "prefetch_nbytes") and layer.type in PREFETCHING_TYPES:
            top_bytes = sum(t.nbytes for t in tops)
            extra = layer.prefetch_nbytes() - top_bytes
            if extra > 0:
                out.append((f"caffe:{layer.name}/prefetch", CAFFE, layer.dtype,
                            size_of(extra, True), ()))
        elif layer.type == "BatchNorm":
            full = bottoms[0].nbytes
            missing = sum(1 for n_ in ("temp", "x_norm") if n_ not in layer.internals)
            if missing:
                out.append((f"caffe:{layer.name}/temp_x_norm", CAFFE, layer.dtype,
                            size_of(missing * full, True), ()))
            if tops[0] is bottoms[0] and li in backward:
                out.append((f"caffe:{layer.name}/x_norm_diff", CAFFE, layer.dtype,
                            size_of(full, True), ()))
        elif layer.type == "Scale" and getattr(layer, "fused_bn", None) is not None:
            if tops[0] is bottoms[0]:
                out.append((f"caffe:{layer.name}/bottom_copy", CAFFE, layer.dtype,
                            size_of(bottoms[0].nbytes, True), ()))
        elif layer.type == "Convolution":
            engine = _conv_engine(layer, caffe_engine)
            if engine == "CUDNN":
                own = layer.internals.get("workspace")
                extra = ((CUDNN_STREAMS_PER_GROUP - 1) * own.blob.nbytes if own is not None
                         else CUDNN_WORKSPACE_LIMIT * CUDNN_STREAMS_PER_GROUP * layer.group)
                ws_at = _workspace_at(layer, net, li, k0) if own is not None else None
                if ws_at is not None:      # two more of the workspace cuDNN chooses at k
                    out.append((f"caffe:{layer.name}/cudnn_workspace", CAFFE, np.uint8,
                                Size(extra, False, per_k=_times(ws_at,
                                                                CUDNN_STREAMS_PER_GROUP - 1)),
                                ()))
                elif extra:
                    out.append((f"caffe:{layer.name}/cudnn_workspace", CAFFE, np.uint8,
                                Size(extra, False), ()))
            elif li in backward and layer.param_propagate_down and layer.param_propagate_down[0]:
                for bi, b in enumerate(bottoms):
                    if id(b.diff_storage) not in diff_of and b.nbytes:
                        out.append((f"caffe:{layer.name}/bottom{bi}_diff", CAFFE, b.dtype,
                                    size_of(b.nbytes, True), ()))
    return out


def _times(fn, n: int):
    return lambda k: n * fn(k)


def _naive_pattern(net, raw_steps, buffers, n) -> tuple:
    """Steps with the naive GMAP: allocate at first use, offload after the last forward use,
    prefetch for the first backward use, release after the last use."""
    alloc = [[] for _ in raw_steps]
    release = [[] for _ in raw_steps]
    offload = [[] for _ in raw_steps]
    prefetch = [[] for _ in raw_steps]
    for b in buffers:
        if b.persistent or not b.uses:
            continue
        if b.kind == SCRATCH:
            for s in b.uses:
                alloc[s].append(b.id)
                release[s].append(b.id)
            continue
        alloc[b.uses[0]].append(b.id)
        if b.is_feature_map:
            offload[b.forward_uses[-1]].append(b.id)
            prefetch[b.backward_uses[0]].append(b.id)
        release[b.uses[-1]].append(b.id)
    steps = []
    for j, (li, phase, reads, writes, scratch, fl) in enumerate(raw_steps):
        layer = net.layers[li]
        steps.append(Step(index=j, layer=li, name=net.layer_names[li], type=layer.type,
                          phase=phase, reads=tuple(sorted(reads)), writes=tuple(sorted(writes)),
                          scratch=tuple(sorted(scratch)), flops=fl,
                          allocate=tuple(alloc[j]), release=tuple(release[j]),
                          offload=tuple(offload[j]), prefetch=tuple(prefetch[j]),
                          recomputable=phase == FORWARD and _recomputable(layer)))
    return tuple(steps)


# ------------------------------------------------------------ saved form
GMAP_SCHEMA = "minicaffe.swap.gmap"
GMAP_VERSION = 1


class SampledSize:
    """``k -> bytes`` from samples ``[(k, bytes), ...]`` of a size that is neither constant nor
    linear in k (a cuDNN workspace, :class:`Size` ``per_k``): exact at a sampled k, linear
    between the two nearest samples, and beyond the samples the nearest one's bytes per
    image times k.  What a saved GMAP (:func:`gmap_to_dict`) keeps of such a size."""

    def __init__(self, samples):
        pts = sorted({int(k): int(b) for k, b in samples}.items())
        if not pts:
            raise ValueError("SampledSize needs at least one (k, bytes) sample")
        self.ks = [k for k, _ in pts]
        self.bytes = [b for _, b in pts]

    def __call__(self, k: int) -> int:
        k = int(k)
        ks, bs = self.ks, self.bytes
        if k <= ks[0]:
            return int(round(bs[0] * k / ks[0]))
        if k >= ks[-1]:
            return int(round(bs[-1] * k / ks[-1]))
        i = int(np.searchsorted(ks, k))
        if ks[i] == k:
            return bs[i]
        k1, k2, b1, b2 = ks[i - 1], ks[i], bs[i - 1], bs[i]
        return int(round(b1 + (b2 - b1) * (k - k1) / (k2 - k1)))

    def samples(self) -> list:
        return [[k, b] for k, b in zip(self.ks, self.bytes)]


def sample_ks(k_max: int, extra=(), points: int = 48) -> list:
    """The minibatches a saved GMAP samples its per-k sizes at: ``points`` geometrically
    spaced from 1 to ``k_max``, every k of ``extra`` (the profiled ones, the net's own)."""
    k_max = max(1, int(k_max))
    grid = {int(round(x)) for x in np.geomspace(1, k_max, num=max(2, points))}
    return sorted({k for k in grid | {int(k) for k in extra} if 1 <= k})


def _size_to(s: Size | None, ks):
    if s is None:
        return None
    out = [int(s.item), bool(s.scaled), None if s.cap is None else int(s.cap)]
    if s.per_k is not None:
        out.append([[int(k), int(s.per_k(k))] for k in ks])
    return out


def _size_from(v) -> Size | None:
    if v is None:
        return None
    per_k = SampledSize(v[3]) if len(v) > 3 else None
    return Size(int(v[0]), bool(v[1]), None if v[2] is None else int(v[2]), per_k=per_k)


def _tuple(v):
    return tuple(_tuple(x) for x in v) if isinstance(v, list) else v


def gmap_to_dict(g: GMAP, ks=(), *, solver_type: str | None = None) -> dict:
    """``g`` in a JSON-able form that :func:`gmap_from_dict` reads back to an equal GMAP: the
    access pattern a plan is made on, without the net.  A size that is neither constant nor
    linear in k (``Size.per_k``, a cuDNN convolution's workspace) keeps its bytes at every
    k of ``ks`` (:func:`sample_ks`), from which the read GMAP interpolates (:class:`SampledSize`).

    A GPU profile keeps its net's GMAP so (``meta["gmap"]``), so that ``minicaffe plan`` on
    another machine plans the device's own feature maps and workspaces: a net built on a CPU
    has the CAFFE engine's (max pooling's masks, LRN's scales, im2col in place of cuDNN's
    workspaces; VGG-16 at 12 GiB: k* 188 there against the device's 160)."""
    ks = sorted({int(k) for k in ks} | {int(g.k)})
    return {
        "schema": GMAP_SCHEMA, "version": GMAP_VERSION, "net_name": g.net_name, "k": int(g.k),
        "k0": int(g.k0), "n_layers": int(g.n_layers), "n_forward": int(g.n_forward),
        "layer_names": list(g.layer_names), "solver_type": solver_type,
        "buffers": [[b.name, b.kind, b.dtype, _size_to(b.size, ks), bool(b.persistent),
                     list(b.ref), list(b.uses), _size_to(b.caffe, ks)] for b in g.buffers],
        "steps": [[s.layer, s.name, s.type, s.phase, list(s.reads), list(s.writes),
                   list(s.scratch), float(s.flops), list(s.allocate), list(s.release),
                   list(s.offload), list(s.prefetch), bool(s.recomputable)] for s in g.steps],
    }


def gmap_from_dict(d: dict) -> GMAP:
    """The GMAP :func:`gmap_to_dict` saved (ValueError on another schema or version)."""
    if d.get("schema") != GMAP_SCHEMA or d.get("version") != GMAP_VERSION:
        raise ValueError(f"not a saved GMAP of version {GMAP_VERSION} (schema "
                         f"{d.get('schema')!r}, version {d.get('version')!r})")
    n = int(d["n_forward"])
    buffers = tuple(
        Buffer(id=i, name=name, kind=kind, dtype=dtype, size=_size_from(size),
               persistent=bool(persistent), ref=_tuple(ref), uses=tuple(uses), n_forward=n,
               caffe=_size_from(caffe))
        for i, (name, kind, dtype, size, persistent, ref, uses, caffe) in enumerate(d["buffers"]))
    steps = tuple(
        Step(index=j, layer=int(layer), name=name, type=typ, phase=phase, reads=tuple(reads),
             writes=tuple(writes), scratch=tuple(scratch), flops=float(flops),
             allocate=tuple(alloc), release=tuple(release), offload=tuple(offload),
             prefetch=tuple(prefetch), recomputable=bool(rc))
        for j, (layer, name, typ, phase, reads, writes, scratch, flops, alloc, release,
                offload, prefetch, rc) in enumerate(d["steps"]))
    return GMAP(net_name=d["net_name"], k=int(d["k"]), k0=int(d["k0"]),
                n_layers=int(d["n_layers"]), n_forward=n, buffers=buffers, steps=steps,
                layer_names=tuple(d.get("layer_names") or ()))
