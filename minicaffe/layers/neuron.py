"""Elementwise neuron layers: ReLU, Sigmoid, TanH, Dropout (Caffe's ``NeuronLayer`` family).

Each takes one bottom and gives one top of the same shape, and may run in
place (top is the bottom Blob). In place, forward overwrites the bottom data,
so backward must be written from what survives: the top data (which is the
bottom blob's data after forward) or a saved mask.

ReLU and Dropout have GPU fast paths (:mod:`minicaffe.kernels.cuda_fused`):
one launch forward and one backward, with no temporary (ReLU's generic
backward makes a boolean mask first; Dropout's generic draw is some thirty
array operations); the generic code stays the reference.
"""
from __future__ import annotations

import numpy as np

from ..backend import to_numpy
from ..kernels import cuda_fused
from ..layer import BackwardReads, Layer, register_layer
from ..proto import caffe_pb2
from ..rng import caffe_uint_threshold, generation, stream_key, stream_uint32


class NeuronLayer(Layer):
    """One bottom, one top of the bottom's shape; in place allowed."""

    exact_num_bottom = 1
    exact_num_top = 1

    def reshape(self, bottom, top):
        top[0].reshape_like(bottom[0])


@register_layer
class ReLULayer(NeuronLayer):
    """y = max(x, 0) + negative_slope * min(x, 0).

    Caffe's backward tests ``bottom_data > 0``. For ``negative_slope >= 0``
    the top has the sign of the bottom wherever the bottom is positive and is
    <= 0 elsewhere, so ``top_data > 0`` selects the same elements; we read the
    top, which keeps an in-place ReLU (the usual case) correct and lets the
    memory manager free the input. For ``negative_slope < 0`` that equivalence
    fails, so we read the bottom like Caffe does, which also reproduces
    Caffe's behaviour when such a layer runs in place (Caffe then reads the
    overwritten bottom, i.e. the top).
    """

    type = "ReLU"

    # the layer whose forward runs this one (its top is this layer's bottom and top): a
    # Convolution (Net.set_conv_relu_fusion) or a BatchNorm paired with a Scale
    # (Net.set_bn_scale_fusion)
    fused_into = None

    def layer_setup(self, bottom, top):
        self.negative_slope = float(self.param.relu_param.negative_slope)
        self._fused = cuda_fused.enabled_for(self.xp, self.dtype)  # decided once

    def _mask_source_is_top(self) -> bool:
        return self.negative_slope >= 0

    def backward_reads(self) -> BackwardReads:
        if self._mask_source_is_top():
            return BackwardReads(bottom=(), top=(0,))
        return BackwardReads(bottom=(0,), top=())

    def forward_impl(self, bottom, top):
        if self.fused_into is not None:
            return  # the Convolution's or BatchNorm's forward wrote this layer's output
        self.relu(bottom[0].data, top[0].data)

    def relu(self, x, y):
        """y = this layer's function of x (y may be x)."""
        xp = self.xp
        if self._fused:
            cuda_fused.relu_forward(x, y, self.negative_slope)
        elif self.negative_slope == 0:
            xp.maximum(x, 0, out=y)
        else:
            # where() reads x fully before y (possibly x itself) is written.
            y[...] = xp.where(x > 0, x, x * self.dtype.type(self.negative_slope))

    def backward_impl(self, top, propagate_down, bottom):
        if not propagate_down[0]:
            return
        xp = self.xp
        ref = top[0].data if self._mask_source_is_top() else bottom[0].data
        dy = top[0].diff
        dx = bottom[0].diff
        if self._fused:
            cuda_fused.relu_backward(ref, dy, dx, self.negative_slope)
        elif self.negative_slope == 0:
            xp.multiply(dy, ref > 0, out=dx)
        else:
            dx[...] = xp.where(ref > 0, dy, dy * self.dtype.type(self.negative_slope))


@register_layer
class SigmoidLayer(NeuronLayer):
    """y = 1 / (1 + exp(-x)); backward dy * y * (1 - y) reads only the top."""

    type = "Sigmoid"
    backward_reads_bottom = ()
    backward_reads_top = (0,)

    def forward_impl(self, bottom, top):
        xp = self.xp
        # Caffe's form 0.5 * tanh(0.5 x) + 0.5: no overflow in exp for large |x|.
        y = top[0].data
        xp.multiply(bottom[0].data, 0.5, out=y)
        xp.tanh(y, out=y)
        y *= 0.5
        y += 0.5

    def backward_impl(self, top, propagate_down, bottom):
        if not propagate_down[0]:
            return
        y = top[0].data
        bottom[0].diff[...] = top[0].diff * y * (1 - y)


@register_layer
class TanHLayer(NeuronLayer):
    """y = tanh(x); backward dy * (1 - y^2) reads only the top."""

    type = "TanH"
    backward_reads_bottom = ()
    backward_reads_top = (0,)

    def forward_impl(self, bottom, top):
        self.xp.tanh(bottom[0].data, out=top[0].data)

    def backward_impl(self, top, propagate_down, bottom):
        if not propagate_down[0]:
            return
        y = top[0].data
        bottom[0].diff[...] = top[0].diff * (1 - y * y)


@register_layer
class DropoutLayer(NeuronLayer):
    """TRAIN: y = x * mask * scale, scale = 1 / (1 - ratio); TEST: y = x.

    The mask follows Caffe's GPU rule: each element draws an unsigned 32-bit
    ``rand`` and is kept when ``rand > uint_thres`` with ``uint_thres =
    static_cast<unsigned int>(UINT_MAX * ratio)`` computed in the net's type
    (:func:`minicaffe.rng.caffe_uint_threshold`).  It is stored as uint32 0/1
    (Caffe's ``rand_vec_`` is unsigned int per element, so memory accounting
    matches) in a saved internal: forward draws it, backward applies it.  A
    TEST-phase layer has no mask at all.  Backward never reads data, so an
    in-place Dropout needs nothing but its mask.

    The draws are not Caffe's (cuRAND on the GPU, boost on the CPU): ``rand``
    of element i in the layer's c-th TRAIN forward is
    ``minicaffe.rng.stream_uint32(key, c, i)``, a hash of (key, c, i), which
    NumPy and the fused CUDA kernel compute to the same bits.  So a CPU and a
    GPU run draw the same masks, and y and dx are the same bits as well: both
    round ``x * mask``, then ``* scale`` with scale in the net's type, as
    Caffe's CPU code does (Caffe's GPU kernels take scale as a float even in
    double nets, and their backward rounds ``dy * scale`` first, which differs
    from ours only where that product overflows).

    ``rng_state`` ((3,) uint64 of the layer's array module: key, draw counter,
    and the fused kernel's ticket count, 0 between launches) lives on the
    device and is not a declared internal: it persists across iterations, and
    the memory planner must not free it.  The kernel reads the counter and
    advances it, so a captured CUDA graph (:mod:`minicaffe.graph`) draws a
    fresh mask at each replay.  The key is drawn from the host generator at
    set-up (:func:`minicaffe.rng.stream_key`: fixed by the process seed,
    different per layer), and again at the first draw after a
    ``set_random_seed``, which restarts the counter; :meth:`state_dict` and
    :meth:`load_state_dict` carry key and counter through a snapshot.

    GPU fast path (:mod:`minicaffe.kernels.cuda_fused`): one launch forward
    (draw, mask, y, counter) and one backward, no temporaries.
    """

    type = "Dropout"
    backward_reads_bottom = ()
    backward_reads_top = ()
    _CHUNK = 1 << 20  # elements hashed at once on the generic path (8 MiB of uint64 temporaries)

    def layer_setup(self, bottom, top):
        ratio = float(self.param.dropout_param.dropout_ratio)
        # Caffe DCHECKs 0 < ratio < 1, which its release builds skip: 0 then keeps every
        # element (a draw above 0) at scale 1, as here; 1 scales by 1 / 0 into NaN, and a
        # negative ratio is cast to an unsigned threshold, both refused
        if not 0.0 <= ratio < 1.0:
            raise ValueError(
                f"layer {self.name!r} of type Dropout: dropout_ratio must lie in [0, 1) (0 "
                f"keeps everything; 1 would drop everything and scale by 1 / 0), got {ratio}")
        self.ratio = ratio
        self.scale = 1.0 / (1.0 - ratio)  # in double, as Caffe's 1. / (1. - threshold_)
        self.uint_thres = caffe_uint_threshold(ratio, self.dtype)
        self.train = self.phase == caffe_pb2.TRAIN
        self._fused = self.train and cuda_fused.enabled_for(self.xp, self.dtype)
        self.rng_state = None
        if self.train:
            self.rng_state = self.xp.zeros(3, dtype=np.uint64)
            self._set_stream(stream_key(), 0)

    def _set_stream(self, key: int, counter: int):
        """Key and counter of the mask stream (a host-to-device copy on the GPU:
        set-up, a reseed or a restore, never a steady-state iteration)."""
        self.rng_state[...] = self.xp.asarray(np.array([key, counter, 0], dtype=np.uint64))
        self._generation = generation()

    def state_dict(self) -> dict:
        """Key and draw counter of the mask stream (Python ints; on the GPU this
        copies them to the host, which synchronizes).  Empty for TEST."""
        if not self.train:
            return {}
        key, counter = (int(v) for v in to_numpy(self.rng_state)[:2])
        return {"key": key, "counter": counter}

    def load_state_dict(self, state: dict):
        """Continue the stream saved by :meth:`state_dict`: the next TRAIN forward
        draws the mask the saved run would have drawn next."""
        if not self.train:
            return
        if "key" not in state or "counter" not in state:
            raise ValueError(f"layer {self.name!r} of type Dropout: saved state {state!r} has no "
                             "key and counter (a TEST layer's state?)")
        self._set_stream(int(state["key"]), int(state["counter"]))

    def reshape(self, bottom, top):
        super().reshape(bottom, top)
        if self.train:
            self.add_internal("mask", bottom[0].shape, saved=True, dtype=np.uint32)

    def _draw(self, mask):
        """mask = rand > uint_thres for draw ``counter`` of the stream, then
        counter += 1; array operations of the layer's module on the state where
        it lives (no host copy)."""
        xp = self.xp
        flat = mask.reshape(-1)
        key, counter = self.rng_state[0:1], self.rng_state[1:2]
        thres = np.uint32(self.uint_thres)
        for start in range(0, flat.size, self._CHUNK):
            stop = min(flat.size, start + self._CHUNK)
            flat[start:stop] = stream_uint32(key, counter, start, stop, xp) > thres
        counter += np.uint64(1)

    def forward_impl(self, bottom, top):
        if not self.train:
            if top[0] is not bottom[0]:
                top[0].data[...] = bottom[0].data
            return
        if self._generation != generation():  # set_random_seed since the last key
            self._set_stream(stream_key(), 0)
        x = bottom[0].data
        y = top[0].data
        mask = self.internal("mask").data
        if self._fused:
            cuda_fused.dropout_forward(x, y, mask, self.rng_state, self.uint_thres, self.scale)
            return
        self._draw(mask)
        # dtype=: multiply in the layer's precision (uint32 x float32 would promote).
        self.xp.multiply(x, mask, out=y, dtype=self.dtype)
        y *= self.dtype.type(self.scale)

    def backward_impl(self, top, propagate_down, bottom):
        if not propagate_down[0]:
            return
        if not self.train:
            if top[0] is not bottom[0]:
                bottom[0].diff[...] = top[0].diff
            return
        dx = bottom[0].diff
        mask = self.internal("mask").data
        if self._fused:
            cuda_fused.dropout_backward(top[0].diff, mask, dx, self.scale)
            return
        self.xp.multiply(top[0].diff, mask, out=dx, dtype=self.dtype)
        dx *= self.dtype.type(self.scale)
