"""InnerProduct (fully connected), as Caffe's ``inner_product_layer.cpp``.

The bottom is viewed as an (M, K) matrix: M = product of the axes before
``axis``, K = product of the axes from ``axis`` on (so an (N, C, H, W) bottom
with the default axis 1 is flattened to (N, C*H*W)). The top is (M..., N_out)
where the leading axes are the bottom's axes before ``axis``.

On a GPU the three GEMMs call cuBLAS through :mod:`minicaffe.cublas` (which a
CUDA graph can capture; the weight diff accumulates with ``beta = 1``), or
CuPy's ``matmul`` where that binding does not load.
"""
from __future__ import annotations

from math import prod

from .. import cublas
from ..fillers import fill
from ..layer import BackwardReads, Layer, register_layer


@register_layer
class InnerProductLayer(Layer):
    """y = x W^T + b, W of shape (N_out, K), or (K, N_out) with ``transpose``.

    Backward reads the bottom data only for the weight gradient (and the
    weights, which are params, for the bottom gradient).
    """

    type = "InnerProduct"
    exact_num_bottom = 1
    exact_num_top = 1

    def layer_setup(self, bottom, top):
        p = self.param.inner_product_param
        if p.num_output <= 0:
            raise ValueError(
                f"layer {self.name!r} of type InnerProduct: num_output must be positive, "
                f"got {p.num_output}")
        self.num_output = int(p.num_output)
        self.bias_term = bool(p.bias_term)
        self.transpose = bool(p.transpose)
        self.axis = self._axis(bottom[0])
        self.k = prod(bottom[0].shape[self.axis:])
        if not self.blobs:
            wshape = (self.k, self.num_output) if self.transpose else (self.num_output, self.k)
            weight = self.make_param_blob(wshape, 0)
            fill(weight, p.weight_filler, where=f"layer {self.name!r}: ")
            self.blobs = [weight]
            if self.bias_term:
                bias = self.make_param_blob((self.num_output,), 1)
                fill(bias, p.bias_filler, where=f"layer {self.name!r}: ")
                self.blobs.append(bias)
        self.param_propagate_down = [True] * len(self.blobs)

    def _axis(self, b) -> int:
        axis = self.param.inner_product_param.axis
        if not -b.ndim <= axis < b.ndim:
            raise ValueError(
                f"layer {self.name!r} of type InnerProduct: axis {axis} out of range for bottom "
                f"{b.name!r} of shape {b.shape}")
        return axis + b.ndim if axis < 0 else axis

    def reshape(self, bottom, top):
        b = bottom[0]
        axis = self._axis(b)
        k = prod(b.shape[axis:])
        if k != self.k:
            raise ValueError(
                f"layer {self.name!r} of type InnerProduct: input size incompatible with inner "
                f"product parameters: bottom {b.name!r} of shape {b.shape} gives {k} inputs per "
                f"item from axis {axis}, the weights expect {self.k}")
        self.axis = axis
        self.m = prod(b.shape[:axis])
        top[0].reshape(tuple(b.shape[:axis]) + (self.num_output,))

    def backward_reads(self) -> BackwardReads:
        weight_grad = bool(self.param_propagate_down and self.param_propagate_down[0])
        return BackwardReads(bottom=(0,) if weight_grad else (), top=(), internals=())

    def _weight_nk(self):
        """The weight as an (N_out, K) matrix (a transposed view when ``transpose``)."""
        w = self.blobs[0].data
        return w.T if self.transpose else w

    def forward_impl(self, bottom, top):
        x = bottom[0].data.reshape(self.m, self.k)
        y = top[0].data.reshape(self.m, self.num_output)
        if cublas.enabled_for(self.xp):
            # (M, K) @ W^T, W stored (N_out, K); or (M, K) @ W with transpose, W (K, N_out)
            cublas.gemm(x, self.blobs[0].data, y, trans_b=not self.transpose)
        else:
            self.xp.matmul(x, self._weight_nk().T, out=y)
        if self.bias_term:
            y += self.blobs[1].data[None, :]

    def backward_impl(self, top, propagate_down, bottom):
        xp = self.xp
        fast = cublas.enabled_for(xp)  # cuBLAS directly: capturable in a CUDA graph
        dy = top[0].diff.reshape(self.m, self.num_output)
        if self.param_propagate_down[0]:
            x = bottom[0].data.reshape(self.m, self.k)
            wdiff = self.blobs[0].diff
            if fast:  # Caffe's rule: the weight diff accumulates (beta = 1)
                if self.transpose:
                    cublas.gemm(x, dy, wdiff, trans_a=True, beta=1.0)   # (K, N_out) += x^T dy
                else:
                    cublas.gemm(dy, x, wdiff, trans_a=True, beta=1.0)   # (N_out, K) += dy^T x
            elif self.transpose:
                wdiff += x.T @ dy    # (K, N_out)
            else:
                wdiff += dy.T @ x    # (N_out, K)
        if self.bias_term and self.param_propagate_down[1]:
            self.blobs[1].diff[...] += dy.sum(axis=0)
        if propagate_down[0]:
            dx = bottom[0].diff.reshape(self.m, self.k)
            if fast:  # (M, N_out) @ W, W stored (N_out, K); transposed when stored (K, N_out)
                cublas.gemm(dy, self.blobs[0].data, dx, trans_b=self.transpose)
            else:
                xp.matmul(dy, self._weight_nk(), out=dx)

    def flops(self, bottom, top):
        """Forward 2*M*K*N (+ M*N bias); backward the same GEMM twice (data and weight
        gradients) plus the bias reduction."""
        mkn = 2.0 * self.m * self.k * self.num_output
        mn = float(self.m * self.num_output) if self.bias_term else 0.0
        return mkn + mn, 2.0 * mkn + mn
