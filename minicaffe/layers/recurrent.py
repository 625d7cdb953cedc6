"""Recurrent layers: LSTMUnit, LSTM and RNN, as BVLC Caffe's ``lstm_unit_layer.cpp``,
``lstm_layer.cpp``, ``rnn_layer.cpp`` and ``recurrent_layer.cpp``.

Caffe builds LSTM and RNN as an *unrolled net* (``FillUnrolledNet``): one InnerProduct over
all T steps of x, then per step a Scale by ``cont_t``, an InnerProduct of the previous hidden
state, an Eltwise sum and an LSTMUnit (or TanH), and a Concat of the per-step outputs.  Here
the same recurrences run as a loop over t with the same parameter blobs, in the same order and
shapes, adding in the same order, so a ``.caffemodel`` trained in Caffe loads and gives Caffe's
outputs (within float rounding of the GEMMs).

Shapes (Caffe's ``RecurrentLayer``): x (T, N, ...), the T time steps of N independent streams;
cont (T, N), the sequence continuation indicators (0 at the first step of a sequence, which
zeroes the carried state: h_conted_{t-1} = cont_t * h_{t-1}, and LSTMUnit's forget gate
f_t = cont_t * sigmoid(.), which drops c_{t-1}); an optional static input x_static (N, ...)
seen at every step; with ``expose_hidden`` the initial states as bottoms (1, N, H) and the final
ones as tops (1, N, H).

Without ``expose_hidden`` Caffe copies the final states h_T (and c_T) of one forward into the
initial states of the next, so that a long sequence may be fed in pieces of T steps; the first
forward starts from zeros.  That carried state (2 x (1, N, H) for LSTM, 1 for RNN) lives across
iterations, which a layer internal cannot (the memory planner releases internals between
iterations): it is kept in ``self.carry``, outside the planner's arena, and is the only buffer
these layers keep besides their declared internals.
"""
from __future__ import annotations

from math import prod

from ..fillers import fill
from ..layer import BackwardReads, Layer, register_layer


def _sigmoid(xp, x):
    """1 / (1 + exp(-x)), Caffe's ``sigmoid`` in lstm_unit_layer.cpp."""
    return 1.0 / (1.0 + xp.exp(-x))


# ----------------------------------------------------------------------------- LSTMUnit
@register_layer
class LSTMUnitLayer(Layer):
    """One LSTM step without weights (Caffe's LSTMUnit).

    Bottoms: c_{t-1} (1, N, H), the gate inputs X (1, N, 4H) in the order i, f, o, g, and
    cont_t (1, N).  Tops: c_t (1, N, H), h_t (1, N, H)::

        i = sigmoid(X_i)  f = cont_t * sigmoid(X_f)  o = sigmoid(X_o)  g = tanh(X_g)
        c_t = f * c_{t-1} + i * g          h_t = o * tanh(c_t)

    No clipping.  Backward reads the three bottoms and c_t, and recomputes the activations
    from X, as Caffe's CPU backward does; there is no gradient to cont (Caffe refuses).  The
    forget-gate gradient is the exact one, cont * sigmoid'(X_f) (Caffe's GPU kernel); Caffe's
    CPU code writes f * (1 - f) with f already scaled by cont, which agrees for cont in {0, 1}.
    """

    type = "LSTMUnit"
    exact_num_bottom = 3
    exact_num_top = 2
    backward_reads_top = (0,)

    def reshape(self, bottom, top):
        c_prev, x, cont = bottom
        n = c_prev.shape[1] if c_prev.ndim >= 2 else -1
        for i, (b, axes) in enumerate(((c_prev, 3), (x, 3), (cont, 2))):
            if b.ndim != axes or b.shape[0] != 1 or b.shape[1] != n:
                raise ValueError(
                    f"layer {self.name!r} of type LSTMUnit: bottom[{i}] {b.name!r} of shape "
                    f"{b.shape} must have {axes} axes, the first 1 (one time step) and the "
                    f"second N as in bottom[0] {c_prev.name!r} of shape {c_prev.shape} "
                    "(c_prev (1, N, H), gates (1, N, 4H), cont (1, N))")
        self.hidden = c_prev.shape[2]
        if x.shape[2] != 4 * self.hidden:
            raise ValueError(
                f"layer {self.name!r} of type LSTMUnit: bottom[1] {x.name!r} of shape {x.shape} "
                f"must hold 4 * H = {4 * self.hidden} gate inputs (i, f, o, g) per item; "
                f"bottom[0] {c_prev.name!r} has H = {self.hidden}")
        top[0].reshape(c_prev.shape)
        top[1].reshape(c_prev.shape)

    def allow_force_backward(self, bottom_index: int) -> bool:
        return bottom_index != 2          # no gradient to the sequence indicators

    def _gates(self, x, cont):
        xp, H = self.xp, self.hidden
        i = _sigmoid(xp, x[..., :H])
        sig_f = _sigmoid(xp, x[..., H:2 * H])
        o = _sigmoid(xp, x[..., 2 * H:3 * H])
        g = xp.tanh(x[..., 3 * H:])
        return i, sig_f, cont[..., None] * sig_f, o, g

    def forward_impl(self, bottom, top):
        c_prev, x, cont = (b.data for b in bottom)
        i, _, f, o, g = self._gates(x, cont)
        c = top[0].data
        c[...] = f * c_prev + i * g
        top[1].data[...] = o * self.xp.tanh(c)

    def backward_impl(self, top, propagate_down, bottom):
        if propagate_down[2]:
            raise ValueError(f"layer {self.name!r} of type LSTMUnit: cannot backpropagate to "
                             "sequence indicators (bottom[2], cont)")
        if not (propagate_down[0] or propagate_down[1]):
            return
        c_prev, x, cont = (b.data for b in bottom)
        i, sig_f, f, o, g = self._gates(x, cont)
        tanh_c = self.xp.tanh(top[0].data)
        dh, dc = top[1].diff, top[0].diff
        c_term = dc + dh * o * (1 - tanh_c * tanh_c)
        if propagate_down[0]:
            bottom[0].diff[...] = c_term * f
        if propagate_down[1]:
            H = self.hidden
            dx = bottom[1].diff
            dx[..., :H] = c_term * g * i * (1 - i)
            dx[..., H:2 * H] = c_term * c_prev * cont[..., None] * sig_f * (1 - sig_f)
            dx[..., 2 * H:3 * H] = dh * tanh_c * o * (1 - o)
            dx[..., 3 * H:] = c_term * i * (1 - g * g)

    def flops(self, bottom, top):
        """About 30 elementwise operations per cell forward (four activations, the cell and
        the output), 40 backward."""
        n = top[0].count
        return 30.0 * n, 40.0 * n


# ------------------------------------------------------------------ the recurrent base
class RecurrentLayer(Layer):
    """Caffe's RecurrentLayer: bottoms x (T, N, ...), cont (T, N), [x_static (N, ...)],
    [initial states (1, N, H) with expose_hidden]; tops the output (T, N, num_output),
    [final states (1, N, H) with expose_hidden].

    Subclasses set ``state_names`` (Caffe's RecurrentInputBlobNames order), and implement
    ``make_params``, ``forward_impl`` and ``backward_impl``.
    """

    state_names: tuple = ()
    # 4 for LSTM (the gates i, f, o, g), 1 for RNN: the rows of W_x* per hidden unit
    gates = 1

    def check_blob_counts(self, bottom, top):
        exposed = len(self.state_names) if self.param.recurrent_param.expose_hidden else 0
        self.min_num_bottom = 2 + exposed
        self.max_num_bottom = 3 + exposed
        self.exact_num_top = 1 + exposed
        super().check_blob_counts(bottom, top)

    def _fail(self, msg):
        raise ValueError(f"layer {self.name!r} of type {self.type}: {msg}")

    def layer_setup(self, bottom, top):
        rp = self.param.recurrent_param
        if rp.num_output <= 0:
            self._fail(f"num_output must be positive, got {rp.num_output}")
        self.num_output = int(rp.num_output)
        self.expose_hidden = bool(rp.expose_hidden)
        # debug_info only logs the unrolled net's blobs in Caffe; there is no unrolled net here
        # (the net warns that nothing is logged: minicaffe/proto/coverage.py)
        self.debug_info = bool(rp.debug_info)
        exposed = len(self.state_names) if self.expose_hidden else 0
        self.static_input = len(bottom) > 2 + exposed
        x = bottom[0]
        if x.ndim < 3:
            self._fail(f"bottom[0] {x.name!r} of shape {x.shape} must have at least 3 axes "
                       "(T time steps, N streams, the input): the input transform is an "
                       "InnerProduct from axis 2")
        self.T = x.shape[0]
        self.input_dim = prod(x.shape[2:])
        if self.static_input:
            s = bottom[2]
            if s.ndim < 2:
                self._fail(f"bottom[2] (x_static) {s.name!r} of shape {s.shape} must have at "
                           "least 2 axes (N streams, the input)")
            self.static_dim = prod(s.shape[1:])
        self.carry = None
        if not self.blobs:
            self.make_params(rp)
        self.param_propagate_down = [True] * len(self.blobs)

    def _param(self, shape, index, filler):
        b = self.make_param_blob(shape, index)
        fill(b, filler, where=f"layer {self.name!r}: ")
        return b

    def input_params(self, rp):
        """W_x* (G*H, D), b (G*H,), then W_x*_static (G*H, D_static): the unrolled net's
        x_transform and x_static transform, in Caffe's order."""
        gh = self.gates * self.num_output
        blobs = [self._param((gh, self.input_dim), 0, rp.weight_filler),
                 self._param((gh,), 1, rp.bias_filler)]
        if self.static_input:
            blobs.append(self._param((gh, self.static_dim), 2, rp.weight_filler))
        return blobs

    def reshape(self, bottom, top):
        x, cont = bottom[0], bottom[1]
        if x.ndim < 3 or x.shape[0] != self.T:
            self._fail(f"bottom[0] {x.name!r} of shape {x.shape} must be (T = {self.T}, N, ...) "
                       "(the number of time steps cannot change)")
        if prod(x.shape[2:]) != self.input_dim:
            self._fail(f"bottom[0] {x.name!r} of shape {x.shape} has {prod(x.shape[2:])} inputs "
                       f"per step and stream, the weights expect {self.input_dim}")
        self.N = N = x.shape[1]
        if cont.shape != (self.T, N):
            self._fail(f"bottom[1] (cont) {cont.name!r} of shape {cont.shape} must be (T, N) = "
                       f"{(self.T, N)}, as bottom[0] {x.name!r} of shape {x.shape}")
        if self.static_input:
            s = bottom[2]
            if s.ndim < 2 or s.shape[0] != N or prod(s.shape[1:]) != self.static_dim:
                self._fail(f"bottom[2] (x_static) {s.name!r} of shape {s.shape} must be (N = "
                           f"{N}, ...) with {self.static_dim} inputs per stream")
        H = self.num_output
        if self.expose_hidden:
            first = 2 + int(self.static_input)
            for j, name in enumerate(self.state_names):
                b = bottom[first + j]
                if b.shape != (1, N, H):
                    self._fail(f"bottom[{first + j}] ({name}) {b.name!r} of shape {b.shape} "
                               f"must match the hidden state input shape (1, {N}, {H})")
        elif self.carry is None or self.carry[0].shape != (1, N, H):
            # Caffe's recurrent output blobs start at zero (and Reset() zeroes them)
            self.carry = [self.xp.zeros((1, N, H), dtype=self.dtype) for _ in self.state_names]
        self.reshape_internals(bottom)
        top[0].reshape(self.T, N, self.out_dim())
        for t in top[1:]:
            t.reshape(1, N, H)

    def reset(self):
        """Caffe's RecurrentLayer::Reset: zero the carried state."""
        if self.carry is not None:
            for a in self.carry:
                a[...] = 0

    def out_dim(self) -> int:
        return self.num_output

    def allow_force_backward(self, bottom_index: int) -> bool:
        return bottom_index != 1          # no gradient to the sequence indicators

    def backward_reads(self) -> BackwardReads:
        # x and x_static for their weights' gradients, which backward always computes
        b = (0, 1, 2) if self.static_input else (0, 1)
        saved = tuple(n for n, i in self.internals.items() if i.saved)
        return BackwardReads(bottom=b, top=(), internals=saved)

    def whole_backward(self, propagate_down, bottom):
        """What backward computes, as Caffe's RecurrentLayer::Backward_cpu, which runs the
        whole unrolled net's backward "unconditionally, as either the inputs or the
        parameters do need backward": every param's gradient (accumulated, also at
        lr_mult 0, where the outer net's param_propagate_down is false) and the diffs of
        x and x_static (the unrolled net's x_transform layers say ``propagate_down:
        true``), whatever ``propagate_down`` says of them (unless a memory plan left such an
        unasked-for diff out).  Returns the propagate_down list to use; the sequence
        indicators never get a diff."""
        self.check_backward(propagate_down)
        pd = list(propagate_down)
        pd[0] = pd[0] or bottom[0].diff_placeable
        if self.static_input:
            pd[2] = pd[2] or bottom[2].diff_placeable
        return pd

    # ----------------------------------------------------------- shared pieces
    def initial_states(self, bottom):
        """h_0 (and c_0), each (1, N, H): the exposed bottoms, or the carried state."""
        if self.expose_hidden:
            first = 2 + int(self.static_input)
            return [bottom[first + j].data for j in range(len(self.state_names))]
        return self.carry

    def final_states(self, states, top):
        """Keep h_T (and c_T) for the next forward, or write the exposed tops."""
        if self.expose_hidden:
            for t, s in zip(top[1:], states):
                t.data[...] = s
        else:
            for a, s in zip(self.carry, states):
                a[...] = s

    def input_transform(self, bottom, out):
        """out (T, N, G*H) = x W_x*^T + b: the unrolled net's ``x_transform`` InnerProduct."""
        xp = self.xp
        x2 = bottom[0].data.reshape(self.T * self.N, self.input_dim)
        o2 = out.reshape(self.T * self.N, -1)
        xp.matmul(x2, self.blobs[0].data.T, out=o2)
        o2 += self.blobs[1].data[None, :]

    def static_transform(self, bottom):
        """(N, G*H) = x_static W_x*_static^T, or None."""
        if not self.static_input:
            return None
        s2 = bottom[2].data.reshape(self.N, self.static_dim)
        return s2 @ self.blobs[2].data.T

    def input_backward(self, dgates, propagate_down, bottom):
        """Gradients of the input transforms from the pre-activation diffs (T, N, G*H); the
        params' always, the bottoms' as ``propagate_down`` (of :meth:`whole_backward`)."""
        d2 = dgates.reshape(self.T * self.N, -1)
        x2 = bottom[0].data.reshape(self.T * self.N, self.input_dim)
        self.blobs[0].diff[...] += d2.T @ x2
        self.blobs[1].diff[...] += d2.sum(axis=0)
        if propagate_down[0]:
            self.xp.matmul(d2, self.blobs[0].data,
                           out=bottom[0].diff.reshape(self.T * self.N, self.input_dim))
        if self.static_input:
            # the T sums share one W_x_static product (Caffe's Split adds their diffs in t order)
            ds = dgates[0].copy()
            for t in range(1, self.T):
                ds += dgates[t]
            s2 = bottom[2].data.reshape(self.N, self.static_dim)
            self.blobs[2].diff[...] += ds.T @ s2
            if propagate_down[2]:
                self.xp.matmul(ds, self.blobs[2].data,
                               out=bottom[2].diff.reshape(self.N, self.static_dim))
        if self.expose_hidden:
            # Caffe shares only the data of the initial states: no gradient reaches them
            first = 2 + int(self.static_input)
            for j in range(len(self.state_names)):
                if propagate_down[first + j]:
                    bottom[first + j].diff[...] = 0

    def check_backward(self, propagate_down):
        if propagate_down[1]:
            self._fail("cannot backpropagate to sequence indicators (bottom[1], cont)")


# ----------------------------------------------------------------------------- LSTM
@register_layer
class LSTMLayer(RecurrentLayer):
    """Caffe's LSTM: per step t = 1..T (lstm_layer.cpp, FillUnrolledNet)::

        gate_input_t = W_hc (cont_t * h_{t-1}) + (W_xc x_t + b_c) [+ W_xc_static x_static]
        c_t, h_t = LSTMUnit(c_{t-1}, gate_input_t, cont_t)       (gates i, f, o, g)

    Params, in Caffe's order: W_xc (4H, D), b_c (4H,), [W_xc_static (4H, D_static)],
    W_hc (4H, H).  Top h (T, N, H); with expose_hidden bottoms h_0, c_0 and tops h_T, c_T.

    Saved for backward (as the unrolled net keeps its per-step blobs): ``h`` (T+1, N, H) the
    hidden states h_0..h_T, ``c`` (T+1, N, H) the cells c_0..c_T, ``gates`` (T, N, 4H) the
    activations i, sigmoid(f), o, g.  Scratch: ``gates_diff`` (T, N, 4H) in backward.
    """

    type = "LSTM"
    state_names = ("h_0", "c_0")
    gates = 4

    def make_params(self, rp):
        H = self.num_output
        self.blobs = self.input_params(rp)
        self.blobs.append(self._param((4 * H, H), len(self.blobs), rp.weight_filler))

    def reshape_internals(self, bottom):
        T, N, H = self.T, self.N, self.num_output
        self.add_internal("h", (T + 1, N, H), saved=True)
        self.add_internal("c", (T + 1, N, H), saved=True)
        self.add_internal("gates", (T, N, 4 * H), saved=True)
        self.add_internal("gates_diff", (T, N, 4 * H), saved=False)
        self.internals["gates_diff"].uses = ("backward",)

    def forward_impl(self, bottom, top):
        xp, T, H = self.xp, self.T, self.num_output
        h, c, gates = (self.internal(n).data for n in ("h", "c", "gates"))
        cont = bottom[1].data
        h0, c0 = self.initial_states(bottom)
        h[0], c[0] = h0[0], c0[0]
        self.input_transform(bottom, gates)               # W_xc_x: (T, N, 4H)
        static = self.static_transform(bottom)
        w_hc = self.blobs[-1].data
        for t in range(T):
            ct = cont[t][:, None]                          # (N, 1)
            a = gates[t]                                   # (N, 4H), W_xc x_t + b_c
            a += (ct * h[t]) @ w_hc.T                      # Eltwise sum: W_hc_h + W_xc_x_t
            if static is not None:
                a += static
            i = _sigmoid(xp, a[:, :H])
            f = _sigmoid(xp, a[:, H:2 * H])
            o = _sigmoid(xp, a[:, 2 * H:3 * H])
            g = xp.tanh(a[:, 3 * H:])
            a[:, :H], a[:, H:2 * H], a[:, 2 * H:3 * H], a[:, 3 * H:] = i, f, o, g
            c[t + 1] = (ct * f) * c[t] + i * g             # LSTMUnit, f scaled by cont_t
            h[t + 1] = o * xp.tanh(c[t + 1])
        top[0].data[...] = h[1:]
        self.final_states((h[T:], c[T:]), top)

    def backward_impl(self, top, propagate_down, bottom):
        propagate_down = self.whole_backward(propagate_down, bottom)
        xp, T, H = self.xp, self.T, self.num_output
        h, c, gates = (self.internal(n).data for n in ("h", "c", "gates"))
        dgates = self.internal("gates_diff").data
        cont = bottom[1].data
        w_hc = self.blobs[-1].data
        dtop = top[0].diff
        # beyond T: h_T's diff comes from the output only, c_T's is zero (Caffe's c_T copy)
        dh_next = xp.zeros_like(h[0])
        dc_next = xp.zeros_like(c[0])
        for t in range(T - 1, -1, -1):
            ct = cont[t][:, None]
            i, f, o, g = (gates[t][:, k * H:(k + 1) * H] for k in range(4))
            tanh_c = xp.tanh(c[t + 1])
            dh = dtop[t] + dh_next
            c_term = dc_next + dh * o * (1 - tanh_c * tanh_c)
            dc_next = c_term * (ct * f)
            d = dgates[t]
            d[:, :H] = c_term * g * i * (1 - i)
            d[:, H:2 * H] = c_term * c[t] * ct * f * (1 - f)
            d[:, 2 * H:3 * H] = dh * tanh_c * o * (1 - o)
            d[:, 3 * H:] = c_term * i * (1 - g * g)
            self.blobs[-1].diff[...] += d.T @ (ct * h[t])       # transform_t: W_hc
            dh_next = ct * (d @ w_hc)                            # Scale backward by cont_t
        self.input_backward(dgates, propagate_down, bottom)

    def flops(self, bottom, top):
        """GEMMs: 2*T*N*4H*(D + H) [+ 2*N*4H*D_static]; 30 elementwise per cell.  Backward:
        twice the GEMMs, 40 elementwise per cell."""
        T, N, H = self.T, self.N, self.num_output
        gemm = 2.0 * T * N * 4 * H * (self.input_dim + H)
        if self.static_input:
            gemm += 2.0 * N * 4 * H * self.static_dim
        cells = float(T * N * H)
        return gemm + 30 * cells, 2 * gemm + 40 * cells


# ----------------------------------------------------------------------------- RNN
@register_layer
class RNNLayer(RecurrentLayer):
    """Caffe's RNN (rnn_layer.cpp, FillUnrolledNet): per step t = 1..T::

        h_t = tanh(W_hh (cont_t * h_{t-1}) + (W_xh x_t + b_h) [+ W_xh_static x_static])
        o_t = tanh(W_ho h_t + b_o)

    Params, in Caffe's order: W_xh (H, D), b_h (H,), [W_xh_static (H, D_static)], W_hh (H, H),
    W_ho (H, H), b_o (H,), every size num_output.  Top o (T, N, H); with expose_hidden bottom
    h_0 and top h_T.

    Saved for backward: ``h`` (T+1, N, H) the hidden states h_0..h_T and ``o`` (T, N, H) the
    outputs (the unrolled net's own copies: a layer working in place on the top cannot
    change them).  Scratch: ``h_diff`` (T, N, H) in backward.
    """

    type = "RNN"
    state_names = ("h_0",)

    def make_params(self, rp):
        H = self.num_output
        self.blobs = self.input_params(rp)
        k = len(self.blobs)
        self.blobs += [self._param((H, H), k, rp.weight_filler),        # W_hh
                       self._param((H, H), k + 1, rp.weight_filler),    # W_ho
                       self._param((H,), k + 2, rp.bias_filler)]        # b_o

    def reshape_internals(self, bottom):
        T, N, H = self.T, self.N, self.num_output
        self.add_internal("h", (T + 1, N, H), saved=True)
        self.add_internal("o", (T, N, H), saved=True)
        self.add_internal("h_diff", (T, N, H), saved=False)
        self.internals["h_diff"].uses = ("backward",)

    def forward_impl(self, bottom, top):
        xp, T = self.xp, self.T
        h, o = self.internal("h").data, self.internal("o").data
        cont = bottom[1].data
        (h0,) = self.initial_states(bottom)
        h[0] = h0[0]
        self.input_transform(bottom, h[1:])                # W_xh_x, into h_1..h_T for now
        static = self.static_transform(bottom)
        w_hh, w_ho, b_o = (b.data for b in self.blobs[-3:])
        for t in range(T):
            ct = cont[t][:, None]
            a = h[t + 1]                                   # W_xh x_t + b_h
            a[...] = (ct * h[t]) @ w_hh.T + a              # Eltwise sum: W_hh_h + W_xh_x_t
            if static is not None:
                a += static
            xp.tanh(a, out=a)
            o[t] = xp.tanh(a @ w_ho.T + b_o)
        top[0].data[...] = o
        self.final_states((h[T:],), top)

    def backward_impl(self, top, propagate_down, bottom):
        propagate_down = self.whole_backward(propagate_down, bottom)
        xp, T = self.xp, self.T
        h, o = self.internal("h").data, self.internal("o").data
        dz_all = self.internal("h_diff").data
        cont = bottom[1].data
        w_hh, w_ho = self.blobs[-3].data, self.blobs[-2].data
        dtop = top[0].diff
        dh_next = xp.zeros_like(h[0])
        for t in range(T - 1, -1, -1):
            ct = cont[t][:, None]
            da = dtop[t] * (1 - o[t] * o[t])               # o_neuron_t (TanH)
            self.blobs[-2].diff[...] += da.T @ h[t + 1]
            self.blobs[-1].diff[...] += da.sum(axis=0)
            dh = da @ w_ho + dh_next                       # Split of h_t: W_ho_h_t, h_conted_t
            dz = dz_all[t]
            dz[...] = dh * (1 - h[t + 1] * h[t + 1])       # h_neuron_t (TanH)
            self.blobs[-3].diff[...] += dz.T @ (ct * h[t])
            dh_next = ct * (dz @ w_hh)
        self.input_backward(dz_all, propagate_down, bottom)

    def flops(self, bottom, top):
        """GEMMs: 2*T*N*H*(D + 2H) [+ 2*N*H*D_static]; backward twice the GEMMs."""
        T, N, H = self.T, self.N, self.num_output
        gemm = 2.0 * T * N * H * (self.input_dim + 2 * H)
        if self.static_input:
            gemm += 2.0 * N * H * self.static_dim
        cells = float(T * N * H)
        return gemm + 4 * cells, 2 * gemm + 6 * cells
