"""Convolution (Caffe's ``ConvolutionLayer`` with the CAFFE engine: im2col + GEMM).

Shapes, for a bottom (N, C, H, W) with ``axis`` = 1 (axes before ``axis`` are
independent inputs, the two after it spatial):

    weight  (M, C/G, kh, kw)          M = num_output, G = group
    bias    (M,)
    col     (B, C*kh*kw, OH*OW)       scratch for a chunk of B images
    top     (N, M, OH, OW)            OH = (H + 2*ph - (dh*(kh-1)+1)) / sh + 1

Forward, per chunk of B images: ``col = im2col(x)`` laid out (C*kh*kw, B*OH*OW), one
GEMM per group over all the chunk's columns ``W[g] @ col[g]`` into the scratch
``top_diff_t`` (M, B, OH*OW), then one pass that transposes it into the top and adds
the bias; a one-image chunk is lowered batch-major and its GEMM writes the top
directly.  Backward lowers the bottom into the same ``(C*kh*kw, B, OH*OW)`` layout
and transposes the chunk's top diff to ``(M, B, OH*OW)`` (``top_diff_t``, only for
chunks of several images), so that per group ``dW[g] += dtop[g] @ col[g].T`` and
``dcol[g] = W[g].T @ dtop[g]`` are single GEMMs over ``B*OH*OW`` columns with no copy
of the column buffer; ``col2im`` folds ``dcol`` back into the bottom diff.  A 1x1
kernel with stride 1 and no padding skips the lowering (the bottom already is its
column matrix), as Caffe does.

N-d (none, one, three or more spatial axes after ``axis``, as Caffe's ``im2col_nd``; with
none the layer is a product over the channel axis, as a 1x1 convolution): the same
with weight (M, C/G, K1, ..., KD), col (B, C*K1*...*KD, O1*...*OD) and top (N, M, O1, ...,
OD), lowered by :func:`minicaffe.kernels.im2col.im2col_nd` on NumPy and CuPy alike (no CUDA
fast path, no cuDNN: Caffe's CuDNNConvolutionLayer takes two spatial axes only, so an N-d
layer that asks for CUDNN runs this engine and says why).  Two axes under
``force_nd_im2col`` take the 2-d lowering: the same numbers.

Caffe lowers one image at a time into a one-image buffer; here a chunk of
images is lowered at once (fewer, larger GEMMs), with the chunk bounded by
``col_buffer_bytes`` (at least one image).  With ``col_buffer_bytes = 0`` the
scratch buffer has exactly Caffe's size; that bound is what a memory manager places
(the internals ``col`` and ``top_diff_t``).  A GPU layer whose scratch no memory
manager binds uses the device's one shared column buffer instead, with chunks of up
to ``shared_col_bytes`` (default 1 GiB, ``$MINICAFFE_SHARED_COL``), split evenly
(:func:`balanced_chunk`): calls on one stream run one after another, so the net holds
the largest chunk once, as it holds cuDNN's one shared workspace.  On a GPU the
lowering uses the CUDA kernels of :mod:`minicaffe.kernels.cuda_vision` and the GEMMs
call cuBLAS through :mod:`minicaffe.cublas` (capturable in a CUDA graph): one-image
forward chunks one strided-batched GEMM per group (per image over the groups where
groups outnumber images); the others, and backward, a plain GEMM per group for up to
``group_loop_max`` groups (one strided-batched launch over more) for each of the
forward product, the weight diff (accumulating, ``beta = 1``) and the column diff.
Where that binding does not load they go through ``cupy.matmul``/``dot``/``tensordot``
(the same math).  Between the GEMMs and the blobs, one kernel transposes a chunk's
result into the top with the bias, and its top diff into ``(M, B, OH*OW)``
(``cuda_vision.swap_outer``); the bias gradient of a top of at least
``_BIAS_GEMM_MIN_PIXELS`` pixels is two GEMMs with rows of ones, as Caffe sums it
(per image over its pixels into the ``bias_sums`` internal, then over the images).

The CUDNN engine (``engine: CUDNN``, or DEFAULT in GPU mode with cuDNN; see
:mod:`minicaffe.engine`) calls cuDNN's convolution forward, backward data,
backward filter and backward bias on the same (N, C, H, W) views, with no
column buffer.  Its scratch is the internal ``workspace`` (uint8, the largest
need of the three algorithms chosen at reshape, at most the workspace limit),
declared to the memory manager, which binds it in its arena (under a memory budget's
bound per image, a minibatch past the bound's cap runs in chunks of images that each get
their full bytes per image, :func:`minicaffe.cudnn.ops.workspace_chunks`, sharing the one
workspace); without one, every
convolution of the device shares one cached buffer of the largest need, so
cuDNN allocates nothing in the steady state either way.  The algorithms are
chosen once per shape by timing them (``cudnnFind*``, as PyTorch's
``cudnn.benchmark``; the fastest within the limit, default 4 GiB, or the
budget's share under a memory budget), or by cuDNN's heuristics as Caffe's
``CuDNNConvolutionLayer`` does, with ``MINICAFFE_CUDNN_FIND=0``;
float32 without TF32 unless ``MINICAFFE_TF32=1``; deterministic algorithms with
``MINICAFFE_DETERMINISTIC=1``.  A shape that cuDNN cannot compute (no algorithm
within the limit, more than 2^31-1 elements) makes the layer fall back to the
CAFFE engine for good, at reshape.
"""
from __future__ import annotations

import functools
import os

import numpy as np

from .. import cublas
from .. import engine as engines
from ..cudnn import lib as cudnn_lib
from ..cudnn import ops as cudnn_ops
from ..fillers import fill
from ..kernels import cuda_fused, cuda_vision
from ..kernels import im2col as im2col_mod
from ..layer import BackwardReads, Layer, register_layer


def conv_geometry(p, x, channel_axis: int, where: str, what: str = "convolution",
                  kernel_word: str = "kernel", min_spatial: int = 0) -> tuple:
    """(kernel, stride, pad, dilation), each per spatial axis, of ``convolution_param`` ``p``
    for bottom ``x`` with its channels on ``channel_axis``: Caffe's BaseConvolutionLayer set-up
    for every axis after the channel axis.  Two spatial axes run the 2-d lowering (also with
    force_nd_im2col, whose N-d lowering computes the same numbers); one, three or more run the
    N-d lowering (:func:`minicaffe.kernels.im2col.im2col_nd`), as Caffe's do.  ``what`` and
    ``kernel_word`` name the operation and the kernel in the errors, as the layer's Caffe
    source does.  No spatial axis at all (a channel axis last: Caffe's Test0DConvolution) is
    a 1x1 convolution with no kernel dimensions; ``min_spatial`` refuses fewer (Im2col: 1)."""
    n_spatial = x.ndim - channel_axis - 1
    if n_spatial < min_spatial:
        raise ValueError(
            f"{where}{what} needs at least {min_spatial} spatial axis after the channel axis "
            f"{channel_axis}: bottom {x.name!r} has shape {x.shape}")
    kernel = tuple(_spatial_values(p, "kernel", n_spatial, None, where))
    stride = tuple(_spatial_values(p, "stride", n_spatial, 1, where))
    pad = tuple(_spatial_values(p, "pad", n_spatial, 0, where))
    dilation = tuple(_spatial_values(p, "dilation", n_spatial, 1, where))
    for name, vals in ((kernel_word, kernel), ("stride", stride), ("dilation", dilation)):
        if min(vals, default=1) < 1:
            raise ValueError(f"{where}{name} dimensions must be nonzero, got {vals}")
    return kernel, stride, pad, dilation


def conv_output_hw(layer, x) -> tuple:
    """((h, w), (oh, ow)): the input's spatial size on ``layer.channel_axis`` and the
    lowering's output size (Caffe's truncating division) for the layer's ``kernel``,
    ``stride``, ``pad`` and ``dilation``, one entry per spatial axis (two for 2-d); an error
    naming the layer when it is empty."""
    ax = layer.channel_axis
    size = tuple(x.shape[ax + 1:])
    out = tuple(im2col_mod.conv_out_size(n, k, p, st, d) for n, k, p, st, d in
                zip(size, layer.kernel, layer.pad, layer.stride, layer.dilation))
    if min(out, default=1) <= 0:
        raise ValueError(
            f"{layer._where}kernel {layer.kernel} (dilation {layer.dilation}) does not fit the "
            f"{'x'.join(map(str, size))} input of {x.name!r} padded by {layer.pad} (output "
            f"{'x'.join(map(str, out))})")
    return size, out


def _spatial_values(param, name, n_spatial, default, where):
    """Caffe's handling of ``name`` (repeated) versus ``name_h``/``name_w``.

    Returns one value per spatial axis, or raises with Caffe's message.
    """
    has_h = param.HasField(f"{name}_h") if name != "dilation" else False
    has_w = param.HasField(f"{name}_w") if name != "dilation" else False
    repeated = list(getattr(param, name if name != "kernel" else "kernel_size"))
    field = "kernel_size" if name == "kernel" else name
    if n_spatial == 0 and not (has_h or has_w) and len(repeated) <= 1:
        return []                   # Caffe's loop over no spatial axis reads nothing
    if has_h or has_w:
        if n_spatial != 2:
            raise ValueError(f"{where}{name}_h & {name}_w can only be used for 2D convolution")
        if repeated:
            raise ValueError(f"{where}either {field} or {name}_h/w should be specified; not both")
        if not (has_h and has_w) and name == "kernel":
            raise ValueError(f"{where}for non-square kernels both kernel_h and kernel_w are "
                             "required")
        return [getattr(param, f"{name}_h"), getattr(param, f"{name}_w")]
    if not repeated:
        if default is None:
            raise ValueError(f"{where}kernel_size (or kernel_h and kernel_w) must be specified")
        return [default] * n_spatial
    if len(repeated) not in (1, n_spatial):
        raise ValueError(
            f"{where}{field} must be specified once, or once per spatial dimension "
            f"({field} specified {len(repeated)} times; {n_spatial} spatial dims)")
    return [int(repeated[0])] * n_spatial if len(repeated) == 1 else [int(v) for v in repeated]


def _col_buffer_default() -> int:
    return cudnn_ops.env_bytes("MINICAFFE_COL_BUFFER", 64 << 20)


def _shared_col_default() -> int:
    return cudnn_ops.env_bytes("MINICAFFE_SHARED_COL", 1 << 30)


# Scratch shared by every CAFFE-engine convolution of a device that no memory manager
# binds: (device, dtype, internal name) -> flat array, grown to the largest need.
_shared_scratch: dict = {}


def _shared_buffer(cp, dtype, name: str, count: int):
    """The device's shared scratch ``name`` with at least ``count`` elements.  The calls
    of one stream run one after another, so one buffer serves every layer (Caffe keeps
    one per layer); growing drops the old one into CuPy's pool."""
    key = (cp.cuda.runtime.getDevice(), np.dtype(dtype).str, name)
    buf = _shared_scratch.get(key)
    if buf is None or buf.size < count:
        per_mib = (1 << 20) // np.dtype(dtype).itemsize
        buf = cp.empty(-(-count // per_mib) * per_mib, dtype=dtype)
        _shared_scratch[key] = buf
    return buf


def release_shared_scratch():
    """Drop the shared column buffers (their memory returns to CuPy's pool)."""
    _shared_scratch.clear()


# The shortest slice of columns a split weight gradient sums per partial product.
_WGRAD_SEGMENT = 4096
_MAX_SEGMENTS = 64
# Rows of ones (1, S) per (device, dtype, S): the split weight gradient's reduction and the
# bias gradient's sums (Caffe's bias_multiplier).
_ones_rows: dict = {}
# The fewest output pixels for which the GPU's bias gradient is two GEMMs, not CuPy's
# reduction over axes (0, 2): on the H200 (scripts/conv_passes.py) the GEMMs take 0.25 ms
# where the reduction takes 3.0 on VGG-16's 224x224 tops, 0.070 against 0.081 at 28x28,
# and lose below (0.070 against 0.036 at 14x14).
_BIAS_GEMM_MIN_PIXELS = 512


def _ones_row(xp, dtype, s: int):
    key = (-1 if xp is np else xp.cuda.runtime.getDevice(), np.dtype(dtype).str, s)
    row = _ones_rows.get(key)
    if row is None:
        row = _ones_rows[key] = xp.ones((1, s), dtype=dtype)
    return row


def _swap_outer(xp, src, out):
    """``out`` (any shape of B*A*L elements) = ``src`` (A, B, L) transposed to (B, A, L):
    the CUDA kernel on a GPU (CuPy's copy of a transposed view indexes every element in
    general strided form), NumPy's copy otherwise."""
    a, b, l = src.shape
    if cuda_vision.enabled_for(xp):
        cuda_vision.swap_outer(src, out.reshape(b, a, l))
    else:
        out.reshape(b, a, l)[...] = src.transpose(1, 0, 2)
    return out


def balanced_chunk(num: int, bound: int) -> int:
    """The chunk of at most ``bound`` images that splits ``num`` into the fewest, most
    even chunks (64 images with a bound of 9: 8 chunks of 8, not 7 of 9 and one of 1)."""
    bound = max(1, min(num, bound))
    pieces = -(-num // bound)
    return -(-num // pieces)


@register_layer
class ConvolutionLayer(Layer):
    """2-d convolution with groups, dilation, per-axis kernel/stride/pad."""

    type = "Convolution"
    min_num_bottom = 1
    min_num_top = 1
    equal_num_bottom_top = True

    # Upper bound of the scratch column buffer (bytes); at least one image is
    # lowered at a time.  0 gives Caffe's one-image buffer.  $MINICAFFE_COL_BUFFER
    # (bytes, or 64M, 1G...) sets it for the process.
    col_buffer_bytes = _col_buffer_default()
    # On a GPU, a layer whose scratch no memory manager binds lowers chunks of up to this
    # many bytes into the device's one shared column buffer instead (fewer, larger GEMMs;
    # the net holds the largest layer's chunk once).  0, or a col_buffer_bytes of 0
    # (Caffe's one-image lowering), turns it off.  $MINICAFFE_SHARED_COL sets it.
    shared_col_bytes = _shared_col_default()
    # Weights of at most this many elements get a split weight gradient on the GPU
    # (see _wgrad_segments); 0, the default, turns it off: measured on an H200 it saved
    # 0.2 ms on AlexNet's conv1 and cost 2.2 ms on VGG-16's conv1_1 and conv1_2, whose
    # plain GEMMs cuBLAS already splits.  $MINICAFFE_WGRAD_SPLIT_MAX sets it.
    wgrad_split_max = int(os.environ.get("MINICAFFE_WGRAD_SPLIT_MAX", "0"))
    # Groups up to this many take one plain GEMM each (see _per_group); 0: always one
    # strided-batched launch.  $MINICAFFE_GROUP_LOOP_MAX sets it.
    group_loop_max = int(os.environ.get("MINICAFFE_GROUP_LOOP_MAX", "4"))
    engine = engines.CAFFE

    # the in-place ReLU after this layer whose forward this layer's runs (the pair's one
    # pass on a GPU); set by Net.set_conv_relu_fusion
    fused_relu = None

    def layer_setup(self, bottom, top):
        p = self.param.convolution_param
        where = f"layer {self.name!r} (Convolution): "
        self._where = where
        x = bottom[0]
        self.channel_axis = x.canonical_axis(p.axis)
        self.kernel, self.stride, self.pad, self.dilation = conv_geometry(
            p, x, self.channel_axis, where)
        self._set_lowering_kind()

        self.channels = x.shape[self.channel_axis]
        self.num_output = int(p.num_output)
        if self.num_output <= 0:
            raise ValueError(f"{where}num_output must be positive, got {self.num_output}")
        self.group = int(p.group)
        if self.group <= 0:
            raise ValueError(f"{where}group must be positive, got {self.group}")
        if self.channels % self.group:
            raise ValueError(f"{where}the {self.channels} input channels of {x.name!r} are not "
                             f"a multiple of group {self.group}")
        if self.num_output % self.group:
            raise ValueError(f"{where}num_output {self.num_output} should be a multiple of "
                             f"group {self.group}")
        self.bias_term = bool(p.bias_term)

        weight = self.make_param_blob(
            (self.num_output, self.channels // self.group) + self.kernel, 0)
        fill(weight, p.weight_filler, where)
        self.blobs = [weight]
        if self.bias_term:
            bias = self.make_param_blob((self.num_output,), 1)
            fill(bias, p.bias_filler, where)
            self.blobs.append(bias)
        # Caffe's engine field, once (see minicaffe.engine)
        self.engine = engines.resolve(self, "convolution_param")
        if self.engine == engines.CUDNN and self.nd:
            engines.fall_back(self, f"cuDNN convolution is 2-d only here ({len(self.kernel)} "
                                    "spatial axes; Caffe's CuDNNConvolutionLayer refuses them "
                                    "and asks for engine: CAFFE)")
        if self.engine == engines.CUDNN:
            self._cudnn = engines.cudnn_options()

    def _set_lowering_kind(self):
        """``nd``: a number of spatial axes other than two (the N-d lowering, never the CUDA
        fast path or cuDNN); ``is_1x1``: a 1x1..x1 kernel with stride 1 and no padding (the
        bottom is its own column matrix)."""
        d = len(self.kernel)
        self.nd = d != 2
        self.is_1x1 = (self.kernel == (1,) * d and self.stride == (1,) * d
                       and self.pad == (0,) * d)

    # ----------------------------------------------------------------- shape
    def check_bottoms(self, bottom, channels: int, kernel: str = "convolution"):
        """Caffe's BaseConvolutionLayer::Reshape checks: the bottoms keep their number of
        axes, have ``channels`` channels and all one shape."""
        x = bottom[0]
        ax = self.channel_axis
        if x.ndim != ax + 1 + len(self.kernel):
            raise ValueError(f"{self._where}bottom num_axes may not change: {x.name!r} now has "
                             f"shape {x.shape}")
        if x.shape[ax] != channels:
            raise ValueError(f"{self._where}input size incompatible with {kernel} kernel: "
                             f"bottom {x.name!r} has {x.shape[ax]} channels, the weights "
                             f"expect {channels}")
        for b in bottom[1:]:
            if b.shape != x.shape:
                raise ValueError(f"{self._where}shape mismatch - bottom[0] {x.name!r}: {x.shape} "
                                 f"vs. bottom {b.name!r}: {b.shape}")

    def reshape(self, bottom, top):
        self.check_bottoms(bottom, self.channels)
        x = bottom[0]
        ax = self.channel_axis
        self.num = int(np.prod(x.shape[:ax], dtype=np.int64))
        self.in_hw, self.out_hw = conv_output_hw(self, x)
        for t in top:
            t.reshape(x.shape[:ax] + (self.num_output,) + self.out_hw)
        self.kdim = self.channels * int(np.prod(self.kernel))  # rows of col: C*kh*kw
        self.out_spatial = int(np.prod(self.out_hw))            # OH*OW
        if self.engine == engines.CUDNN and self._reshape_cudnn():
            return
        if self._bias_by_gemm() or "bias_sums" in self.internals:
            # (N, M): each image's bias gradient summed over its pixels (backward only)
            self.add_internal("bias_sums", (self.num, self.num_output) if self._bias_by_gemm()
                              else (0,), saved=False)
        if not self.is_1x1:
            per_image = self.kdim * self.out_spatial * self.dtype.itemsize
            self.chunk = max(1, min(self.num, self.col_buffer_bytes // max(per_image, 1)))
            self._shared_chunk = self.chunk
            if (self.xp is not np and self.col_buffer_bytes > 0
                    and self.shared_col_bytes > self.col_buffer_bytes):
                self._shared_chunk = max(self.chunk, balanced_chunk(
                    self.num, self.shared_col_bytes // max(per_image, 1)))
            # (chunk, C*kh*kw, OH*OW): scratch within one forward or backward call.
            self.add_internal("col", (self.chunk, self.kdim, self.out_spatial), saved=False)
            # grows with the batch only until the chunk reaches its bound
            self.internals["col"].batch_scaled = self.chunk == self.num
            if self.chunk > 1 or "top_diff_t" in self.internals:
                # (M, chunk*OH*OW): a chunk's top, and its top diff, transposed (the
                # forward GEMM's output, the weight gradient's operand); unused for
                # one-image chunks
                shape = (self.num_output, self.chunk * self.out_spatial) if self.chunk > 1 else (0,)
                self.add_internal("top_diff_t", shape, saved=False)
                self.internals["top_diff_t"].batch_scaled = self.chunk == self.num
            if self._splits_wgrad() or "wgrad_parts" in self.internals:
                # (S <= 64, M, C*kh*kw/G): the split weight gradient's partial sums, within
                # backward; the same size for every batch
                size = _MAX_SEGMENTS * self.num_output * self.kdim // self.group
                self.add_internal("wgrad_parts", (size if self._splits_wgrad() else 0,),
                                  saved=False, batch_scaled=False)
        else:
            self.chunk = max(1, self.num)
            self._shared_chunk = self.chunk

    # --------------------------------------------------------------- helpers
    def _images(self, arr):
        """View a bottom array as (num, C, H, W)."""
        return arr.reshape((self.num, self.channels) + self.in_hw)

    def _shared(self) -> bool:
        """True when this call lowers into the device's shared buffers: a GPU layer whose
        column scratch no memory manager has bound (see ``shared_col_bytes``)."""
        it = self.internals.get("col")
        return (it is not None and self._shared_chunk > self.chunk
                and not it.blob.data_storage.external)

    def _bias_by_gemm(self) -> bool:
        return (self.bias_term and cublas.enabled_for(self.xp)
                and self.out_spatial >= _BIAS_GEMM_MIN_PIXELS)

    def _bias_diff(self, dy):
        """bias diff += the sum of dy (N, M, L) over images and pixels.  On a GPU with
        large tops, as Caffe sums it: per image over its pixels by a GEMM with a row of
        ones (one strided-batched launch into the ``bias_sums`` internal), then over the
        images by a second GEMM that accumulates into the diff; else one reduction."""
        diff = self.blobs[1].diff
        if not self._bias_by_gemm():
            diff[...] += dy.sum(axis=(0, 2))
            return
        n, m, L = dy.shape
        sums = self.internal("bias_sums").data.reshape(n, m)
        cublas.gemm_strided_batched(dy, _ones_row(self.xp, self.dtype, L).reshape(L, 1),
                                    sums.reshape(n, m, 1))
        cublas.gemm(_ones_row(self.xp, self.dtype, n), sums, diff.reshape(1, m), beta=1.0)

    def _splits_wgrad(self) -> bool:
        return (cublas.enabled_for(self.xp) and not self.is_1x1
                and self.num_output * self.kdim // self.group <= self.wgrad_split_max)

    def _wgrad_segments(self, columns: int) -> int:
        """How many slices of its ``columns`` (b*OH*OW) the weight gradient of one chunk is
        split into on the GPU (1: not split), for a weight of at most ``wgrad_split_max``
        elements: S partial products over slices of at least ``_WGRAD_SEGMENT`` columns in
        one strided-batched launch, then one GEMM with a row of ones that adds them into
        the diff.  Meant for small weights summed over hundreds of thousands of columns
        (few output tiles); off by default, since cuBLAS's plain GEMMs did as well or
        better on the H200 (see ``wgrad_split_max``)."""
        if not self._splits_wgrad():
            return 1
        for s in (_MAX_SEGMENTS, 48, 32, 24, 16, 12, 8, 6, 4):
            if columns % s == 0 and columns // s >= _WGRAD_SEGMENT:
                return s
        return 1

    def _run_chunk(self) -> int:
        return self._shared_chunk if self._shared() else self.chunk

    def _scratch(self, name, shape):
        """A view of the first elements of internal ``name`` (or of the shared buffer of
        that name) with ``shape``."""
        count = int(np.prod(shape))
        if self._shared():
            flat = _shared_buffer(self.xp, self.dtype, name, count)
        else:
            flat = self.internal(name).data.reshape(-1)
        return flat[:count].reshape(shape)

    def _lower(self, x, b, batch_major=True):
        """Columns of the images x (b, C, H, W): (b, C*kh*kw, OH*OW), or
        (C*kh*kw, b, OH*OW) when not ``batch_major``."""
        if self.is_1x1:
            return x.reshape(b, self.channels, self.out_spatial)
        shape = ((b, self.kdim, self.out_spatial) if batch_major
                 else (self.kdim, b, self.out_spatial))
        col = self._scratch("col", shape)
        if self.nd:
            return im2col_mod.im2col_nd(x, self.kernel, self.pad, self.stride, self.dilation,
                                        out=col, batch_major=batch_major)
        if cuda_vision.enabled_for(self.xp):
            return cuda_vision.im2col(x, col, self.kernel, self.pad, self.stride, self.dilation,
                                      self.out_hw, batch_major=batch_major)
        return im2col_mod.im2col(x, self.kernel, self.pad, self.stride, self.dilation, out=col,
                                 batch_major=batch_major)

    def _fold(self, col, out):
        """Sum columns (C*kh*kw, b, OH*OW) back into the images ``out`` (overwritten)."""
        if self.nd:
            im2col_mod.col2im_nd(col, out.shape, self.kernel, self.pad, self.stride,
                                 self.dilation, out=out, batch_major=False)
        elif cuda_vision.enabled_for(self.xp):
            cuda_vision.col2im(col, out, self.kernel, self.pad, self.stride, self.dilation,
                               self.out_hw, batch_major=False)
        else:
            im2col_mod.col2im(col, out.shape, self.kernel, self.pad, self.stride, self.dilation,
                              out=out, batch_major=False)

    @staticmethod
    def _grouped_gemms(weight, x, out, trans_a=False):
        """out[b, g] = op(W[g]) @ x[b, g] for every image b and group g through cuBLAS:
        W (G, ., .), x and out (b, G, ., .).  One strided-batched GEMM per group over the
        images (W[g] shared: batch stride 0; x[:, g] and out[:, g] strided views), or,
        where there are more groups than images (depthwise), one per image over the
        groups: the fewer launches."""
        g, b = weight.shape[0], x.shape[0]
        if g <= b:
            for gi in range(g):
                cublas.gemm_strided_batched(weight[gi], x[:, gi], out[:, gi], trans_a=trans_a)
        else:
            for bi in range(b):
                cublas.gemm_strided_batched(weight, x[bi], out[bi], trans_a=trans_a)

    def _per_group(self, a, b, out, trans_a=False, trans_b=False, beta=0.0):
        """out[g] = op(a[g]) @ op(b[g]) (+ beta out[g]) for every group through cuBLAS: a
        plain GEMM per group for up to ``group_loop_max`` groups, one strided-batched
        launch for more.  cuBLAS picks faster kernels for the plain calls where the
        sums are long: AlexNet's two-group conv2 at batch 256 took 7.6 ms of backward
        this way, 11.7 ms as one batched launch (H200, scripts/caffe_conv_profile.py)."""
        g = out.shape[0]
        if g <= self.group_loop_max:
            for gi in range(g):
                cublas.gemm(a[gi], b[gi], out[gi], trans_a=trans_a, trans_b=trans_b, beta=beta)
        else:
            cublas.gemm_strided_batched(a, b, out, trans_a=trans_a, trans_b=trans_b, beta=beta)

    def _grouped_weight(self, arr):
        g = self.group
        return arr.reshape(g, self.num_output // g, self.kdim // g)

    # ------------------------------------------------------- forward/backward
    def forward_impl(self, bottom, top):
        if self.engine == engines.CUDNN:
            return self._forward_cudnn(bottom, top)
        self._forward_caffe(bottom, top)
        if self.fused_relu is not None:
            self.fused_relu.relu(top[0].data, top[0].data)

    def _forward_caffe(self, bottom, top):
        xp = self.xp
        fast = cublas.enabled_for(xp)
        g, mg, kg = self.group, self.num_output // self.group, self.kdim // self.group
        m, L = self.num_output, self.out_spatial
        weight = self._grouped_weight(self.blobs[0].data)  # (G, M/G, C/G*kh*kw)
        bias = self.blobs[1].data.reshape(1, m, 1) if self.bias_term else None
        chunk = self._run_chunk()
        flat = chunk > 1 and not self.is_1x1
        for b_blob, t_blob in zip(bottom, top):
            x = self._images(b_blob.data)
            y = t_blob.data.reshape(self.num, m, L)
            for n0 in range(0, self.num, chunk):
                n1 = min(n0 + chunk, self.num)
                b = n1 - n0
                if flat:
                    self._forward_flat(x[n0:n1], y[n0:n1], weight, bias, fast)
                    continue
                col = self._lower(x[n0:n1], b)
                colg = col.reshape(b, g, kg, L)
                yg = y[n0:n1].reshape(b, g, mg, L)
                if fast:  # y[b, g] = W[g] @ col[b, g]
                    self._grouped_gemms(weight, colg, yg)
                else:
                    # one batched GEMM: (G, M/G, K/G) @ (b, G, K/G, L) -> (b, G, M/G, L)
                    xp.matmul(weight, colg, out=yg)
            if bias is not None and not flat:
                y += bias

    def _forward_flat(self, x, y, weight, bias, fast):
        """A chunk of b images as one GEMM per group over all its columns: the chunk
        lowered to (C*kh*kw, b*OH*OW), ``W[g] @ col[g]`` into the scratch ``top_diff_t``
        as (M, b, OH*OW), then one pass that transposes it into the top's (b, M, OH*OW)
        and adds the bias.  Wide GEMMs where a batched one would have OH*OW columns
        (169 on AlexNet's conv3, 49 on ResNet's last stage), and the bias costs no
        pass of its own."""
        xp = self.xp
        g, mg, kg = self.group, self.num_output // self.group, self.kdim // self.group
        b, L = x.shape[0], self.out_spatial
        col = self._lower(x, b, batch_major=False).reshape(g, kg, b * L)
        out = self._scratch("top_diff_t", (g, mg, b * L))
        if fast:  # out[g] = W[g] @ col[g], every group in one launch
            self._per_group(weight, col, out)
        else:
            xp.matmul(weight, col, out=out)
        if cuda_vision.enabled_for(xp):
            cuda_vision.swap_outer(out.reshape(self.num_output, b, L), y,
                                   None if bias is None else self.blobs[1].data)
            return
        src = out.reshape(self.num_output, b, L).transpose(1, 0, 2)
        if bias is None:
            y[...] = src
        else:
            xp.add(src, bias, out=y)

    def backward_impl(self, top, propagate_down, bottom):
        if self.engine == engines.CUDNN:
            return self._backward_cudnn(top, propagate_down, bottom)
        need_w = bool(self.param_propagate_down[0])
        need_b = self.bias_term and bool(self.param_propagate_down[1])
        for i, (t_blob, b_blob) in enumerate(zip(top, bottom)):
            dy = t_blob.diff.reshape(self.num, self.num_output, self.out_spatial)
            if need_b:
                self._bias_diff(dy)
            if not (need_w or propagate_down[i]):
                continue
            x = self._images(b_blob.data) if need_w else None
            dx = self._images(b_blob.diff) if propagate_down[i] else None
            chunk = self._run_chunk()
            for n0 in range(0, self.num, chunk):
                n1 = min(n0 + chunk, self.num)
                xc = x[n0:n1] if need_w else None
                dxc = dx[n0:n1] if propagate_down[i] else None
                if self.is_1x1:
                    self._backward_1x1(dy[n0:n1], xc, dxc, need_w)
                else:
                    self._backward_chunk(dy[n0:n1], xc, dxc, need_w)

    def _backward_chunk(self, dy, x, dx, need_w):
        """Gradients of one chunk; dy (b, M, L), x and dx (b, C, H, W) or None."""
        xp = self.xp
        g, mg, kg = self.group, self.num_output // self.group, self.kdim // self.group
        b, L = dy.shape[0], self.out_spatial
        if b == 1:
            dyt = dy.reshape(g, mg, L)
        else:  # (M, b, L): one copy of the (small) top diff instead of the columns
            dyt = self._scratch("top_diff_t", (g, mg, b, L))
            _swap_outer(xp, dy, dyt)
            dyt = dyt.reshape(g, mg, b * L)
        fast = cublas.enabled_for(xp)
        if need_w:
            col = self._lower(x, b, batch_major=False).reshape(g, kg, b * L)
            wdiff = self._grouped_weight(self.blobs[0].diff)
            segments = self._wgrad_segments(b * L) if fast else 1
            if segments > 1:
                self._split_wgrad(dyt, col, wdiff, segments)
            elif fast:
                # dW[g] += dtop[g] @ col[g]^T, every group in one launch (accumulates: beta = 1)
                self._per_group(dyt, col, wdiff, trans_b=True, beta=1.0)
            else:
                for gi in range(g):
                    # (M/G, b*L) @ (b*L, K/G): sums over the chunk's images and pixels
                    wdiff[gi] += xp.dot(dyt[gi], col[gi].T)
        if dx is not None:
            dcol = self._scratch("col", (g, kg, b * L))
            weight = self._grouped_weight(self.blobs[0].data)  # (G, M/G, K/G)
            if fast:  # dcol[g] = W[g]^T @ dtop[g], every group in one launch
                self._per_group(weight, dyt, dcol, trans_a=True)
            else:
                xp.matmul(weight.transpose(0, 2, 1), dyt, out=dcol)  # (G, K/G, M/G) @ (G, M/G, b*L)
            self._fold(dcol.reshape(self.kdim, b, L), dx)

    def _split_wgrad(self, dyt, col, wdiff, s):
        """dW[g] += dtop[g] @ col[g]^T as ``s`` partial products over slices of the
        columns (one strided-batched launch per group: slice i of dtop (M/G, n/s) times
        slice i of col transposed), summed into the diff by a GEMM with a row of ones
        (beta = 1).  The same sum as one GEMM, in another order."""
        g, mg, n = dyt.shape
        kg = col.shape[1]
        seg = n // s
        parts = self._scratch("wgrad_parts", (s, mg, kg))
        ones = _ones_row(self.xp, self.dtype, s)
        for gi in range(g):
            a = dyt[gi].reshape(mg, s, seg).transpose(1, 0, 2)      # (s, M/G, seg) views
            c = col[gi].reshape(kg, s, seg).transpose(1, 0, 2)      # (s, K/G, seg)
            cublas.gemm_strided_batched(a, c, parts, trans_b=True)
            cublas.gemm(ones, parts.reshape(s, mg * kg), wdiff[gi].reshape(1, mg * kg), beta=1.0)

    def _backward_1x1(self, dy, x, dx, need_w):
        """A 1x1 chunk: the bottom is its own column matrix (b, C, L)."""
        xp = self.xp
        g, mg, kg = self.group, self.num_output // self.group, self.kdim // self.group
        b, L = dy.shape[0], self.out_spatial
        dyg = dy.reshape(b, g, mg, L)
        fast = cublas.enabled_for(xp)
        if need_w:
            xg = x.reshape(b, g, kg, L)
            wdiff = self._grouped_weight(self.blobs[0].diff)
            if fast:
                # dW[g] += sum_b dtop[b, g] @ x[b, g]^T as one GEMM over b*L columns: the top
                # diff and the bottom transposed to (G, ., b*L), the copies tensordot makes
                # (temporaries, none for a one-image chunk)
                if b == 1:
                    dyt, xt = dyg.reshape(g, mg, L), xg.reshape(g, kg, L)
                else:
                    dyt = _swap_outer(xp, dy, xp.empty((g, mg, b * L), self.dtype))
                    xt = _swap_outer(xp, x.reshape(b, g * kg, L),
                                     xp.empty((g, kg, b * L), self.dtype))
                self._per_group(dyt, xt, wdiff, trans_b=True, beta=1.0)
            else:
                for gi in range(g):
                    wdiff[gi] += xp.tensordot(dyg[:, gi], xg[:, gi], axes=([0, 2], [0, 2]))
        if dx is not None:
            weight = self._grouped_weight(self.blobs[0].data)  # (G, M/G, K/G)
            dxg = dx.reshape(b, g, kg, L)
            if fast:  # dx[b, g] = W[g]^T @ dtop[b, g]
                self._grouped_gemms(weight, dyg, dxg, trans_a=True)
            else:
                xp.matmul(weight.transpose(0, 2, 1), dyg, out=dxg)

    # ------------------------------------------------------------ CUDNN engine
    def _conv_args(self, num: int | None = None):
        """pad, stride, dilation, groups and the cuDNN keywords of every call on ``num``
        images (default the layer's own: one chunk, :meth:`_chunks_at`).

        The workspace is the layer's ``workspace`` internal where a memory manager has
        bound it to its arena; otherwise (a net without one) every convolution shares the
        device's one cached buffer (:func:`minicaffe.cudnn.ops._cached_workspace`), so the
        net holds the largest workspace once, not one per layer.
        """
        o = self._cudnn
        ws = self.internal("workspace")
        return ((self.pad, self.stride, self.dilation, self.group),
                # an empty workspace (no bytes needed at this shape) is never bound
                {"workspace": ws.data if ws.data_storage.external and ws.nbytes else None,
                 "tf32": o.tf32,
                 "deterministic": o.deterministic, "find": o.find,
                 "workspace_limit": self._call_limit(self.num,
                                                     self.num if num is None else num)})

    def _chunks_at(self, num: int, options=None) -> tuple:
        """((start, stop), ...): the images of each cuDNN call on a minibatch of ``num``
        (:func:`minicaffe.cudnn.ops.workspace_chunks`): more than one chunk only under a bound
        per image, past its cap (at this layer's own bytes per image,
        :meth:`_bytes_per_image`)."""
        rule = self.chunk_rule(options)
        if rule is None:
            return ((0, int(num)),)
        return cudnn_ops.workspace_chunks(num, *rule)

    def chunk_rule(self, options=None):
        """``(limit, bytes per image, multiple)``: how :meth:`_chunks_at` cuts a minibatch
        (:func:`minicaffe.cudnn.ops.workspace_chunks` with these), or None where this layer's
        calls are never cut (no cuDNN options, no chunks under them, or no bound per image;
        a layer that fell back to the CAFFE engine keeps its options, so ask ``engine`` too).
        The profiler records it (``meta["chunks"]``), and the performance model prices a cut
        step per call (:class:`swap.model.ComputeModel`)."""
        o = getattr(self, "_cudnn", None) if options is None else options
        if o is None or not getattr(o, "chunks", False):
            return None
        per = int(self._bytes_per_image(o))
        if not per:
            return None
        # where the probe's need sets the bytes per image, chunks of whole probes
        probed = per > int(o.workspace_per_image)
        return (int(o.workspace_limit), per, cudnn_ops.FIT_PROBE_IMAGES if probed else 1)

    def _call_limit(self, num: int, size: int, options=None) -> int:
        """The workspace limit of one call on ``size`` images of a minibatch of ``num``: the
        bound at ``size`` (:meth:`_workspace_limit_at`) where the minibatch runs in one call,
        the cap itself where it runs in chunks (:meth:`_chunks_at`).

        The chunks hold the cap over the bytes per image, but the fastest algorithm's
        workspace is not linear in its images: VGG-16's conv2_2 under WINOGRAD_NONFUSED needs
        27.6 MiB per image at 32 and 64 images and 30.1 at 44 (H200, session 34, call e).  So
        its chunks of 44 at k = 221, bounded to 44 x 27.7 MiB, fell back to FFT_TILING, 30 %
        slower; conv3_2 and conv3_3 likewise (14 ms of a 306 ms iteration).  A minibatch past
        the cap would have had the cap in one call; each of its chunks gets it too.  The
        chunks of one call share one workspace, so the layer still holds at most the cap."""
        o = self._cudnn if options is None else options
        if len(self._chunks_at(num, o)) > 1:
            return int(o.workspace_limit)
        return self._workspace_limit_at(size, o)

    def call_choices(self, num: int | None = None) -> tuple:
        """((images, {direction: AlgoChoice}), ...): cuDNN's algorithms for each call this
        layer makes on a minibatch of ``num`` (default its own), one per chunk
        (:meth:`_chunks_at`), each under that call's limit (:meth:`_call_limit`).  Searched now
        where a shape is new (with ``find``, temporary operands of that shape), then cached:
        the layer's own calls run exactly these.  The one place that turns the layer's calls
        into the search's arguments, for its reshape, the profiler's search pricing
        (:func:`swap.profiler.search_times_now`) and ``scripts/executor_overhead.py``."""
        o = self._cudnn
        num = self.num if num is None else int(num)
        found = {}
        calls = []
        for a, b in self._chunks_at(num):
            if b - a not in found:
                found[b - a] = cudnn_ops.conv_algorithms(
                    (b - a, self.channels) + tuple(self.in_hw), tuple(self.blobs[0].shape),
                    self.pad, self.stride, self.dilation, self.group, self.dtype, tf32=o.tf32,
                    deterministic=o.deterministic, find=o.find,
                    workspace_limit=self._call_limit(num, b - a))
            calls.append((b - a, found[b - a]))
        return tuple(calls)

    def _workspace_limit_at(self, num: int, options=None) -> int:
        """The workspace limit of a call on ``num`` images under ``options`` (default the
        layer's own): fixed, or per image (:meth:`_bytes_per_image`) up to the limit
        (:func:`minicaffe.cudnn.ops.workspace_limit_at`)."""
        o = self._cudnn if options is None else options
        return cudnn_ops.workspace_limit_at(o.workspace_limit, self._bytes_per_image(o), num,
                                            o.workspace_floor)

    def _bytes_per_image(self, options=None) -> int:
        """Bytes of workspace per image of this layer's cuDNN calls under ``options``
        (default its own; 0: a fixed bound): the bound per image, and with ``fit_fastest``
        (a timed search, chunks) at least what this convolution's own fastest algorithms
        need, timed once on :data:`~minicaffe.cudnn.ops.FIT_PROBE_IMAGES` images within the
        cap (:func:`minicaffe.cudnn.ops.fastest_bytes_per_image`).

        Why: the fastest algorithm of a convolution on large maps needs far more than the
        bound per image (VGG-16's conv1_2 under WINOGRAD_NONFUSED: 58 MB per image, its three
        directions 16.2 ms at 64 images against 30.3 for the fastest within 64 MiB, H200,
        ``docs/results/conv_algos``; with it VGG-16 went from 0.84x to 1.2x PyTorch eager
        under a 12 GiB plan, docs/RESULTS.md "Session 23").
        With its own bytes per image such a layer runs in chunks that each fit its fastest
        algorithm in the cap (at least the probe's images per chunk, since the probe's need
        is within the cap), the others keep the bound; the memory model charges each layer's
        workspace at each k as before (:meth:`workspace_model`).  The probe's choice is
        cuDNN's timing, like every search; where it cannot run (no algorithm, no memory) the
        bound per image holds."""
        o = self._cudnn if options is None else options
        per = int(o.workspace_per_image)
        if not (per and o.find and getattr(o, "chunks", False)
                and getattr(o, "fit_fastest", False)):
            return per
        w_shape = tuple(self.blobs[0].shape)
        x_shape = (cudnn_ops.FIT_PROBE_IMAGES, self.channels) + tuple(self.in_hw)
        conv = (self.pad, self.stride, self.dilation, self.group)
        key = (int(o.workspace_limit), bool(o.tf32), bool(o.deterministic), x_shape, w_shape,
               conv, np.dtype(self.dtype).str)
        fit = getattr(self, "_fit", None)
        if fit is None or fit[0] != key:
            need = 0
            try:
                need = cudnn_ops.fastest_bytes_per_image(cudnn_ops.conv_candidates(
                    x_shape, w_shape, *conv, self.dtype, tf32=o.tf32,
                    deterministic=o.deterministic, workspace_limit=o.workspace_limit),
                    cudnn_ops.FIT_PROBE_IMAGES)
            except cudnn_lib.CudnnUnsupported:
                pass
            except Exception as e:          # pragma: no cover - GPU machine only
                if type(e).__name__ != "OutOfMemoryError":
                    raise
            if self.xp is not np:           # pragma: no cover - GPU machine only
                # the probe's temporary operands go back to the device, not to CuPy's pool
                self.xp.get_default_memory_pool().free_all_blocks()
            fit = self._fit = (key, int(need))
        return max(per, fit[1])

    def set_workspace_limit(self, limit: int, per_image: int = 0, floor: int = 0):
        """Bound this layer's cuDNN workspace to ``limit`` bytes, or, with ``per_image``,
        to that many bytes per image of the call, at least ``floor`` and at most ``limit`` (a
        memory manager calls this before planning); the algorithms are chosen again at the
        next reshape."""
        import dataclasses
        o = getattr(self, "_cudnn", None)
        new = (int(limit), int(per_image), int(floor))
        if o is not None and (o.workspace_limit, o.workspace_per_image,
                              o.workspace_floor) != new:
            self._cudnn = dataclasses.replace(o, workspace_limit=new[0],
                                              workspace_per_image=new[1], workspace_floor=new[2])

    def workspace_model(self):
        """``fn(num) -> bytes``: this layer's ``workspace`` internal at an input of ``num``
        images, with the cuDNN options it has now (its workspace limit included); None where
        the layer does not run cuDNN.

        A memory model that plans other minibatches than the net's own
        (:func:`swap.gmap.build_gmap`) takes each convolution's workspace from here: cuDNN
        chooses other algorithms, with other workspaces, at other minibatches.  The answer
        (:func:`minicaffe.cudnn.ops.conv_workspace_estimate`) is exactly what a reshape at
        ``num`` sizes the workspace to where that shape was searched (the net's own minibatch,
        every profiled one); elsewhere it is the workspace, at ``num``, of the algorithms
        chosen at the nearest searched minibatch, at most the limit, with no timed search (a
        search per asked minibatch would cost seconds each).  A convolution never searched
        with these options is searched, on temporary operands, outside any arena: do not call
        it while an executor is installed.  Where that search runs out of device memory, or
        cuDNN cannot compute the shape (the reshape would fall back to the CAFFE engine), the
        answer is the limit.
        """
        if self.engine != engines.CUDNN or getattr(self, "_cudnn", None) is None:
            return None
        o = self._cudnn
        geometry = (self.channels,) + tuple(self.in_hw)
        w_shape = tuple(self.blobs[0].shape)
        conv = (self.pad, self.stride, self.dilation, self.group)
        dtype = self.dtype
        cache: dict = {}

        def one(size: int, limit_at) -> int:   # the workspace of one call on ``size`` images
            try:
                ws = cudnn_ops.conv_workspace_estimate(
                    (size,) + geometry, w_shape, *conv, dtype, tf32=o.tf32,
                    deterministic=o.deterministic, find=o.find,
                    limit_at=limit_at)
                return max(ws.values())
            except cudnn_lib.CudnnUnsupported:
                return limit_at(size)
            except Exception as e:          # pragma: no cover - GPU machine only
                if type(e).__name__ != "OutOfMemoryError":
                    raise
                return limit_at(size)

        def fn(num: int) -> int:
            num = int(num)
            if num <= 0:
                return 0
            if num in cache:
                return cache[num]
            searches = cudnn_ops.algo_cache_info()["searches"]
            # the calls of a chunked minibatch share the one workspace, of the largest need
            # each call's limit as the calls of this minibatch get it (:meth:`_call_limit`),
            # under the options as they are now, not at a later call
            limit_at = functools.partial(self._call_limit, num, options=o)
            need = max(one(size, limit_at) for size in {b - a for a, b in self._chunks_at(num, o)})
            if cudnn_ops.algo_cache_info()["searches"] != searches:
                # the search's temporary operands go back to the device, not to CuPy's pool
                import cupy
                cupy.get_default_memory_pool().free_all_blocks()
            cache[num] = int(need)
            return cache[num]
        return fn

    def _reshape_cudnn(self) -> bool:
        """Choose the three algorithms for this shape and size the workspace; False
        (after falling back to CAFFE for good) when cuDNN cannot do this shape."""
        if self.dtype not in (np.float32, np.float64):
            engines.fall_back(self, f"cuDNN convolutions take float32 or float64, not "
                                    f"{self.dtype}")
            return False
        need = 0
        if self.num > 0:
            try:
                # heuristics (or a timed search with find): cached per shape, so the
                # calls of forward and backward use exactly these algorithms; a chunked
                # minibatch's calls share one workspace, of the largest need
                need = max(c.workspace for _, choices in self.call_choices()
                           for c in choices.values())
            except cudnn_lib.CudnnUnsupported as e:
                engines.fall_back(self, f"cuDNN cannot run this convolution: {e}")
                self.internals.pop("workspace", None)
                return False
        # (bytes,): the chosen algorithms' scratch, used within one forward or
        # backward call; bounded by the limit, not linear in the batch
        self.add_internal("workspace", (need,), saved=False, batch_scaled=False,
                          dtype=np.uint8)
        return True

    def _bound_cudnn(self):
        """(((start, stop, BoundConv), ...) of the calls at this layer's current shape and
        options, one per chunk (:meth:`_chunks_at`), workspace or None): built again when
        the images, the shape or the options change."""
        o = self._cudnn
        x_shape = (self.num, self.channels) + tuple(self.in_hw)
        bound = getattr(self, "_bound", None)
        if bound is None or bound[0] is not o or bound[1] != x_shape:
            convs, calls = {}, []
            for a, b in self._chunks_at(self.num):
                conv = convs.get(b - a)
                if conv is None:
                    geo, kw = self._conv_args(b - a)
                    kw.pop("workspace")
                    conv = convs[b - a] = cudnn_ops.BoundConv(
                        (b - a,) + x_shape[1:], tuple(self.blobs[0].shape), *geo,
                        dtype=self.dtype, **kw)
                calls.append((a, b, conv))
            bound = self._bound = (o, x_shape, tuple(calls))
        ws = self.internal("workspace")
        # an empty workspace (no bytes needed at this shape) is never bound
        return bound[2], (ws.data if ws.data_storage.external and ws.nbytes else None)

    def _forward_cudnn(self, bottom, top):
        calls, ws = self._bound_cudnn()
        weight = self.blobs[0].data  # (M, C/G, kh, kw)
        bias = self.blobs[1].data if self.bias_term else None
        relu = self.fused_relu
        # with a paired ReLU, the bias and the ReLU in one pass after the convolution
        # (cuda_fused.bias_relu_forward) instead of cuDNN's AddTensor and the ReLU's pass
        one_pass = (relu is not None and cuda_fused.enabled_for(self.xp, self.dtype)
                    and cuda_fused.channel_grid_ok(self.num_output))
        conv_bias = None if one_pass else bias
        for b_blob, t_blob in zip(bottom, top):
            x = self._images(b_blob.data)  # (N, C, H, W)
            y = t_blob.data.reshape((self.num, self.num_output) + self.out_hw)
            if len(calls) == 1:
                calls[0][2].forward(x, weight, conv_bias, y, ws)
            else:
                for a, b, conv in calls:
                    conv.forward(x[a:b], weight, conv_bias, y[a:b], ws)
            if one_pass:
                s = self.out_spatial
                cuda_fused.bias_relu_forward(
                    y.reshape(self.num, self.num_output, s), bias, relu.negative_slope,
                    *cuda_fused.channel_chunks(self.num * s, self.num_output))
            elif relu is not None:
                relu.relu(y, y)

    def _backward_cudnn(self, top, propagate_down, bottom):
        """Bias and weight diffs accumulate (cuDNN beta = 1, over the chunks too), the bottom
        diff is overwritten."""
        need_w = bool(self.param_propagate_down[0])
        need_b = self.bias_term and bool(self.param_propagate_down[1])
        calls, ws = self._bound_cudnn()
        one = len(calls) == 1
        for i, (t_blob, b_blob) in enumerate(zip(top, bottom)):
            dy = t_blob.diff.reshape((self.num, self.num_output) + self.out_hw)
            if need_b:
                cudnn_ops.conv2d_backward_bias(dy, self.blobs[1].diff)
            x = self._images(b_blob.data) if need_w else None
            dx = self._images(b_blob.diff) if propagate_down[i] else None
            for a, b, conv in calls:
                if need_w:
                    conv.backward_filter(x if one else x[a:b], dy if one else dy[a:b],
                                         self.blobs[0].diff, ws)
                if dx is not None:
                    conv.backward_data(self.blobs[0].data, dy if one else dy[a:b],
                                       dx if one else dx[a:b], ws)

    # ---------------------------------------------------------- declarations
    def backward_reads(self) -> BackwardReads:
        """Bottom data is read only for the weight gradient (the bias and the
        bottom gradient need the top diff and the weights alone)."""
        reads_bottom = bool(self.param_propagate_down and self.param_propagate_down[0])
        return BackwardReads(bottom=tuple(range(self._num_bottom)) if reads_bottom else (),
                             top=(), internals=())

    def flops(self, bottom, top):
        """2 * multiply-adds: forward one GEMM per image (plus the bias); backward
        one GEMM for the weight gradient and one for the bottom gradient."""
        macs = self.num * self.num_output * (self.kdim // self.group) * self.out_spatial
        fwd = 2.0 * macs * len(bottom)
        if self.bias_term:
            fwd += self.num * self.num_output * self.out_spatial * len(bottom)
        return fwd, 2.0 * fwd
