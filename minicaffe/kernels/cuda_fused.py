"""Fused CUDA kernels for the elementwise-heavy layers and the SGD update (GPU fast paths).

Why: on a GPU, Caffe's BatchNorm, Scale, ReLU and Eltwise written as generic
CuPy array expressions cost many small kernels per layer (BatchNorm TRAIN: about
17 forward and 7 backward), each a full pass over the activation with a
temporary, and each launched from Python (about 10 us of host time per launch).
The kernels here compute the *same function* in few passes:

=====================  =======================================  ===========================
layer / step           fused launches (generic CuPy launches)   full-size passes, fused
=====================  =======================================  ===========================
BatchNorm TRAIN fwd    2: partial stats, normalize (~17)        read x twice, write y, x_norm
BatchNorm TRAIN bwd    2: partial sums, apply (~7)              read dy, y twice; write dx
BatchNorm global       1 forward, 1 backward (~8 / 1)           one pass each
Scale (+bias) fwd      1 (2-3, plus the in-place copy)          read x; write y (and copy)
Scale (+bias) bwd      2: partial sums + dx, finalize (~6)      read dy, x; write dx
BatchNorm + in-place   fwd 2 (BatchNorm's and Scale's: 3)       read x twice; write y, x_norm
Scale, paired          bwd 3: sums, finalize, apply (4)         read dy, x_norm twice; write dx
ReLU fwd / bwd         1 / 1 (1 / 2)                            one pass each
Conv bias + ReLU fwd   1 (2: cuDNN's AddTensor, ReLU)           one pass (read, write y)
Eltwise SUM, 2 bottoms 1 forward, 1 backward (2 / 2)            one pass each
Dropout TRAIN fwd/bwd  1 / 1 (~30 / 2)                          one pass each, no temporary
SGD update, all params 1 for the whole net (7 per param)        read/write data, diff, history
=====================  =======================================  ===========================

Per-channel reductions (BatchNorm's mean/variance and its backward sums, Scale's
parameter gradients) work on the bottom viewed as (N, C, S): N outer items, C
channels, S = H*W inner positions; channel c has m = N*S elements, at
``(n*C + c)*S + s``.  A grid of (P, C) blocks covers it: block (p, c) sums
elements ``j = n*S + s`` of channel c with ``j`` in ``[p*L, (p+1)*L)`` into a
``float64`` partial written to a workspace of shape (C, P, 2); the next kernel's
blocks each add their channel's P partials in a fixed order, so results are
deterministic (no atomics) and accumulate in double precision.  The batch mean
is taken around a pivot (the channel's first element) so the variance
``E[(x-K)^2] - E[x-K]^2`` does not cancel catastrophically.

Bandwidth: these kernels are bound by device memory.  One 4-byte load per
thread per step leaves too few bytes in flight to fill an H100/H200's HBM
(session 23's profile of ResNet-152: the BatchNorm+Scale pairs at 1.6-2.2 TB/s
of the H200's 4.8).  Where S and the block's chunk L are multiples of 16 bytes
of elements and every array is 16-byte aligned, a thread moves 16 bytes per
access (``Lanes``, ``channel_walk``); elsewhere one element.  The values are
the same either way; the per-block sums add the same elements in another
order (in double precision; the tests hold the statistics to float rounding).
``MINICAFFE_FUSED_LANES=0`` keeps one element per access
(for A/B timing).  The channel walk keeps each element's offset by additions.

Bit-level faithfulness: where the generic path does one rounding per CuPy op
(``y = x * scale``, then ``y += bias``), the kernels use ``__fmul_rn``-style
intrinsics, which the compiler never contracts into an FMA, so the elementwise
results match the generic path bit for bit given the same per-channel
statistics; the statistics themselves are more accurate here (double
accumulation), so those outputs agree to float32 rounding of the sums (about
1e-7 relative), not bit for bit.

Dispatch: :func:`enabled_for` is true only when the layer's array module is CuPy,
a CUDA device answers, the environment does not say ``MINICAFFE_FUSED=0``, and
the module compiles (NVRTC, once per process, float and double instantiations).
Layers decide once, at set-up; :func:`disabled` turns the fast paths off for the
layers set up inside it (tests compare both paths on one GPU).  Every launch
goes on CuPy's current stream; nothing here synchronizes the host or allocates
device memory (workspaces are the layers' declared internals, or preallocated
once: the SGD tables, Dropout's (3,) key/counter array), and what changes
between iterations can come from device memory (the SGD learning rate,
Dropout's draw counter), so the iteration can be captured in a CUDA graph
(:mod:`minicaffe.graph`).  Arrays must be C-contiguous (every Blob view is).
"""
from __future__ import annotations

import contextlib
import functools
import operator
import os
import warnings

import numpy as np

from ..backend import gpu_available

try:  # importing cupy needs no GPU; compiling and launching do.
    import cupy as _cp
except Exception:  # pragma: no cover - CuPy absent
    _cp = None

THREADS = 256            # threads per block of every kernel here (block_sum2 relies on it)
_MAX_BLOCKS = 1 << 20    # elementwise kernels use grid-stride loops beyond this
_MAX_GRID_Y = 65535      # CUDA's limit on gridDim.y: the channel count of (P, C) grids
_TARGET_BLOCKS = 2048    # enough (P, C) blocks to fill an H100/H200 (132 SMs) several times
_MIN_BLOCK_ELEMS = 1024  # ... but no fewer than 4 elements per thread in a block
_LANE_MULTIPLE = 4       # a block's chunk of a channel: whole 16-byte units of float or double
_SGD_CHUNK = 8192        # elements of one parameter handled by one block of the SGD update
ENV_FUSED = "MINICAFFE_FUSED"
ENV_LANES = "MINICAFFE_FUSED_LANES"  # "0": channel and Eltwise kernels one element at a time

_SOURCE = r"""
#define FUSED_THREADS 256

#define CUDA_KERNEL_LOOP(i, n) \
  for (long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x; i < (n); \
       i += (long long)blockDim.x * gridDim.x)

// One rounding per operation, as CuPy's one-op kernels do: these intrinsics are
// never contracted into fused multiply-adds.
__device__ __forceinline__ float mul_rn(float a, float b) { return __fmul_rn(a, b); }
__device__ __forceinline__ double mul_rn(double a, double b) { return __dmul_rn(a, b); }
__device__ __forceinline__ float add_rn(float a, float b) { return __fadd_rn(a, b); }
__device__ __forceinline__ double add_rn(double a, double b) { return __dadd_rn(a, b); }
__device__ __forceinline__ float sub_rn(float a, float b) { return __fsub_rn(a, b); }
__device__ __forceinline__ double sub_rn(double a, double b) { return __dsub_rn(a, b); }
__device__ __forceinline__ float div_rn(float a, float b) { return __fdiv_rn(a, b); }
__device__ __forceinline__ double div_rn(double a, double b) { return __ddiv_rn(a, b); }
__device__ __forceinline__ float sqrt_rn(float a) { return __fsqrt_rn(a); }
__device__ __forceinline__ double sqrt_rn(double a) { return __dsqrt_rn(a); }

// ReLU's function: v > 0 ? v : slope * v (slope 0: max(v, 0), NaN kept).
template <typename T>
__device__ __forceinline__ T relu_value(const T v, const T slope) {
  if (v > T(0)) return v;
  if (slope == T(0)) return (v != v) ? v : T(0);
  return mul_rn(v, slope);
}


// Sum a and b over the block (blockDim.x == FUSED_THREADS) in a fixed order;
// every thread gets the totals.  Called at most once per kernel.
__device__ __forceinline__ void block_sum2(double& a, double& b) {
  __shared__ double sa[FUSED_THREADS];
  __shared__ double sb[FUSED_THREADS];
  sa[threadIdx.x] = a;
  sb[threadIdx.x] = b;
  __syncthreads();
  for (int k = FUSED_THREADS / 2; k > 0; k >>= 1) {
    if (threadIdx.x < k) {
      sa[threadIdx.x] += sa[threadIdx.x + k];
      sb[threadIdx.x] += sb[threadIdx.x + k];
    }
    __syncthreads();
  }
  a = sa[0];
  b = sb[0];
}

// block_sum2 for four values (the same tree, so each total is summed in the same
// order as block_sum2 would); called at most once per kernel, not with block_sum2.
__device__ __forceinline__ void block_sum4(double& a, double& b, double& c, double& d) {
  __shared__ double s4[4][FUSED_THREADS];
  s4[0][threadIdx.x] = a;
  s4[1][threadIdx.x] = b;
  s4[2][threadIdx.x] = c;
  s4[3][threadIdx.x] = d;
  __syncthreads();
  for (int k = FUSED_THREADS / 2; k > 0; k >>= 1) {
    if (threadIdx.x < k) {
      s4[0][threadIdx.x] += s4[0][threadIdx.x + k];
      s4[1][threadIdx.x] += s4[1][threadIdx.x + k];
      s4[2][threadIdx.x] += s4[2][threadIdx.x + k];
      s4[3][threadIdx.x] += s4[3][threadIdx.x + k];
    }
    __syncthreads();
  }
  a = s4[0][0];
  b = s4[1][0];
  c = s4[2][0];
  d = s4[3][0];
}

// V consecutive elements of T that one thread moves with one access: V = 16 /
// sizeof(T) gives a 16-byte vector load or store (the channel and elementwise
// kernels are bound by memory bandwidth, which one-element accesses leave
// half unused on an H100/H200: too few bytes in flight per SM); V = 1 is the
// plain element.
template <typename T, int V>
struct alignas(sizeof(T) * V) Lanes {
  T v[V];
};

template <typename T>
using Pack16 = Lanes<T, 16 / sizeof(T)>;

template <typename T, int V>
__device__ __forceinline__ Lanes<T, V> load(const T* a, const long long o) {
  return reinterpret_cast<const Lanes<T, V>*>(a)[o];
}

template <typename T, int V>
__device__ __forceinline__ void store(T* a, const long long o, const Lanes<T, V>& r) {
  reinterpret_cast<Lanes<T, V>*>(a)[o] = r;
}

// The lane count as a type, so that one generic lambda serves both widths.
template <int V>
struct Width {
  static constexpr int value = V;
};

// Walks the units u = n*S + s (a unit: V elements) of channel c of an (N, C, S)
// array (S counted in units) that one thread of block (p, c) owns: u = u0 +
// threadIdx.x, then steps of FUSED_THREADS.  o is the unit's offset in the
// array, (n*C + c)*S + s, kept by additions only (no division or product per
// unit).
struct ChannelCursor {
  long long u, s, o, ds, step, wrap;
  __device__ ChannelCursor(const long long u0, const long long C, const long long c,
                           const long long S) {
    u = u0 + threadIdx.x;
    const long long n = u / S;
    s = u - n * S;
    o = (n * C + c) * S + s;
    const long long dn = FUSED_THREADS / S;
    ds = FUSED_THREADS - dn * S;
    step = dn * C * S + ds;
    wrap = (C - 1) * S;
  }
  __device__ __forceinline__ void next(const long long S) {
    u += FUSED_THREADS;
    s += ds;
    o += step;
    if (s >= S) {
      s -= S;
      o += wrap;
    }
  }
};

__device__ __forceinline__ long long chunk_end(long long j0, long long L, long long m) {
  return j0 + L < m ? j0 + L : m;
}

// Calls body(Width<V>(), o) for every unit of block (p, c)'s chunk of channel c,
// elements [p*L, min((p+1)*L, m)), that this thread owns; o counts units of V
// elements.  vec: V = 16 / sizeof(T) (the caller has checked that S and L are
// multiples of V and every array is 16-byte aligned, so no unit straddles two
// (n, c) rows); otherwise V = 1.  Each element is visited by one thread, which
// reads its inputs before it writes its outputs: in-place arrays are safe.
template <typename T, typename Body>
__device__ __forceinline__ void channel_walk(const int vec, const long long C, const long long c,
    const long long S, const long long m, const long long L, const long long p, Body body) {
  const long long j0 = p * L, j1 = chunk_end(j0, L, m);
  if (vec) {
    constexpr int V = 16 / sizeof(T);
    const long long Sv = S / V, u1 = j1 / V;
    for (ChannelCursor it(j0 / V, C, c, Sv); it.u < u1; it.next(Sv)) body(Width<V>(), it.o);
  } else {
    for (ChannelCursor it(j0, C, c, S); it.u < j1; it.next(S)) body(Width<1>(), it.o);
  }
}

// ------------------------------------------------------------ BatchNorm
// Workspace (double): ws[(c*P + p)*2 + {0, 1}] = partial sums of block (p, c);
// ws[2*C*P + c] = the channel's pivot K (its element (0, c, 0)).
// Every channel kernel takes (C, S, m, L, vec) as channel_walk does.

// Block (p, c): sums of (x - K) and (x - K)^2 over its chunk of channel c.
template <typename T>
__global__ void bn_stats_partial(const T* __restrict__ x, const long long C, const long long S,
    const long long m, const long long L, const int vec, double* __restrict__ ws) {
  const long long c = blockIdx.y, p = blockIdx.x, P = gridDim.x;
  const double pivot = (double)x[c * S];
  double a = 0.0, b = 0.0;
  channel_walk<T>(vec, C, c, S, m, L, p, [&](auto w, const long long o) {
    constexpr int V = decltype(w)::value;
    const Lanes<T, V> r = load<T, V>(x, o);
    for (int k = 0; k < V; ++k) {
      const double v = (double)r.v[k] - pivot;
      a += v;
      b += v * v;
    }
  });
  block_sum2(a, b);
  if (threadIdx.x == 0) {
    ws[(c * P + p) * 2] = a;
    ws[(c * P + p) * 2 + 1] = b;
    if (p == 0) ws[2 * C * P + c] = pivot;
  }
}

// y = (x - mean) / std per channel (y may be x: in place); x_norm (may be
// null) gets a copy of y.  With gamma (a following Scale layer fused in, see
// BatchNormLayer): x_norm gets (x - mean) / std and y = that * gamma[c]
// (+ beta[c] when beta is not null), rounded as the Scale kernel rounds it.
// TRAIN (use_global 0): mean and biased variance from the P partials of
// bn_stats_partial; block (0, c) writes std[c] and updates Caffe's running
// sums (mean_sum <- maf*mean_sum + mean, var_sum <- maf*var_sum +
// correction*var, and block (0, 0) the scale factor s <- maf*s + 1).  Global
// statistics (use_global 1): mean = mean_sum / s, var = var_sum / s (0 while s
// is 0), nothing is updated but std.
template <typename T>
__global__ void bn_forward_apply(const T* x, T* y, T* x_norm, const long long C,
    const long long S, const long long m, const long long L, const int vec, const int P,
    const double* __restrict__ ws, const int use_global, T* mean_sum, T* var_sum, T* factor,
    const T eps, const T maf, const T correction, T* std_out, const T* __restrict__ gamma,
    const T* __restrict__ beta, const int relu, const T slope) {
  __shared__ T s_mean, s_std;
  const long long c = blockIdx.y, p = blockIdx.x;
  if (threadIdx.x == 0) {
    T mean_t, var_t;
    if (use_global) {
      const T s = factor[0];
      const T f = s == T(0) ? T(0) : div_rn(T(1), s);
      mean_t = mul_rn(mean_sum[c], f);
      var_t = mul_rn(var_sum[c], f);
    } else {
      double a = 0.0, b = 0.0;
      for (int q = 0; q < P; ++q) {
        a += ws[(c * P + q) * 2];
        b += ws[(c * P + q) * 2 + 1];
      }
      const double d = a / (double)m;
      double var = b / (double)m - d * d;
      if (var < 0.0) var = 0.0;
      mean_t = (T)(ws[2 * C * P + c] + d);
      var_t = (T)var;
    }
    const T sd = sqrt_rn(add_rn(var_t, eps));
    s_mean = mean_t;
    s_std = sd;
    if (p == 0) {
      std_out[c] = sd;
      if (!use_global) {
        mean_sum[c] = add_rn(mul_rn(mean_sum[c], maf), mean_t);
        var_sum[c] = add_rn(mul_rn(var_sum[c], maf), mul_rn(var_t, correction));
        if (c == 0) factor[0] = add_rn(mul_rn(factor[0], maf), T(1));
      }
    }
  }
  __syncthreads();
  const T mean_t = s_mean, sd = s_std;
  const T g = gamma ? gamma[c] : T(1);
  const T b = beta ? beta[c] : T(0);
  channel_walk<T>(vec, C, c, S, m, L, p, [&](auto w, const long long o) {
    constexpr int V = decltype(w)::value;
    const Lanes<T, V> r = load<T, V>(x, o);
    Lanes<T, V> v, out;
    for (int k = 0; k < V; ++k) {
      v.v[k] = div_rn(sub_rn(r.v[k], mean_t), sd);
      T t = v.v[k];
      if (gamma) {
        t = mul_rn(t, g);
        if (beta) t = add_rn(t, b);
      }
      out.v[k] = relu ? relu_value(t, slope) : t;
    }
    if (x_norm) store<T, V>(x_norm, o, v);
    store<T, V>(y, o, out);
  });
}

// Block (p, c): sums of dy and dy * y over its chunk of channel c.
template <typename T>
__global__ void bn_backward_partial(const T* __restrict__ dy, const T* __restrict__ y,
    const long long C, const long long S, const long long m, const long long L, const int vec,
    double* __restrict__ ws) {
  const long long c = blockIdx.y, p = blockIdx.x, P = gridDim.x;
  double a = 0.0, b = 0.0;
  channel_walk<T>(vec, C, c, S, m, L, p, [&](auto w, const long long o) {
    constexpr int V = decltype(w)::value;
    const Lanes<T, V> g = load<T, V>(dy, o), r = load<T, V>(y, o);
    for (int k = 0; k < V; ++k) {
      a += (double)g.v[k];
      b += (double)g.v[k] * (double)r.v[k];
    }
  });
  block_sum2(a, b);
  if (threadIdx.x == 0) {
    ws[(c * P + p) * 2] = a;
    ws[(c * P + p) * 2 + 1] = b;
  }
}

// BatchNorm + Scale fused (BatchNormLayer's pairing): block (p, c) sums, over its
// chunk of channel c with g = dy and x the normalized input, the Scale's
// gradients  g * x  and  g  and BatchNorm's  g' = g * gamma[c]  and  g' * x,  each
// product rounded as the separate Scale and BatchNorm kernels round it, into
// ws[(c*P + p)*4 + {0, 1, 2, 3}].
template <typename T>
__global__ void bn_scale_backward_partial(const T* __restrict__ dy, const T* __restrict__ x,
    const T* __restrict__ gamma, const long long C, const long long S, const long long m,
    const long long L, const int vec, double* __restrict__ ws) {
  const long long c = blockIdx.y, p = blockIdx.x, P = gridDim.x;
  const T sc = gamma[c];
  double a = 0.0, b = 0.0, e = 0.0, f = 0.0;
  channel_walk<T>(vec, C, c, S, m, L, p, [&](auto w, const long long o) {
    constexpr int V = decltype(w)::value;
    const Lanes<T, V> g = load<T, V>(dy, o), v = load<T, V>(x, o);
    for (int k = 0; k < V; ++k) {
      a += (double)mul_rn(g.v[k], v.v[k]);
      b += (double)g.v[k];
      const double g2 = (double)mul_rn(g.v[k], sc);
      e += g2;
      f += g2 * (double)v.v[k];
    }
  });
  block_sum4(a, b, e, f);
  if (threadIdx.x == 0) {
    ws[(c * P + p) * 4] = a;
    ws[(c * P + p) * 4 + 1] = b;
    ws[(c * P + p) * 4 + 2] = e;
    ws[(c * P + p) * 4 + 3] = f;
  }
}

// TRAIN: dx = (dy - (mean(dy * y) * y + mean(dy))) / std, the means from the P
// partials of bn_backward_partial; global statistics: dx = dy / std (y is not
// read and may be null).  dx may be dy (in place).  Fused with a Scale (gamma
// not null): the partials are bn_scale_backward_partial's (W = 4, BatchNorm's
// sums at offsets 2 and 3), dy is first multiplied by gamma[c] (the Scale's
// bottom diff, which dy_out, when not null, receives; it may be dy or dx too),
// W = 2 otherwise.
template <typename T>
__global__ void bn_backward_apply(const T* dy, const T* __restrict__ y,
    const T* __restrict__ std_in, T* dx, const long long C, const long long S,
    const long long m, const long long L, const int vec, const int P,
    const double* __restrict__ ws, const int use_global, const T* __restrict__ gamma,
    const int W, T* dy_out) {
  __shared__ T s_mdy, s_mdyy, s_std;
  const long long c = blockIdx.y, p = blockIdx.x;
  const int k0 = W == 4 ? 2 : 0;
  if (threadIdx.x == 0) {
    T mdy = T(0), mdyy = T(0);
    if (!use_global) {
      double a = 0.0, b = 0.0;
      for (int q = 0; q < P; ++q) {
        a += ws[(c * P + q) * W + k0];
        b += ws[(c * P + q) * W + k0 + 1];
      }
      mdy = (T)(a / (double)m);
      mdyy = (T)(b / (double)m);
    }
    s_mdy = mdy;
    s_mdyy = mdyy;
    s_std = std_in[c];
  }
  __syncthreads();
  const T mdy = s_mdy, mdyy = s_mdyy, sd = s_std;
  const T sc = gamma ? gamma[c] : T(1);
  channel_walk<T>(vec, C, c, S, m, L, p, [&](auto w, const long long o) {
    constexpr int V = decltype(w)::value;
    Lanes<T, V> g = load<T, V>(dy, o);
    if (gamma) {
      for (int k = 0; k < V; ++k) g.v[k] = mul_rn(g.v[k], sc);
      if (dy_out) store<T, V>(dy_out, o, g);
    }
    Lanes<T, V> out;
    if (use_global) {
      for (int k = 0; k < V; ++k) out.v[k] = div_rn(g.v[k], sd);
    } else {
      const Lanes<T, V> r = load<T, V>(y, o);
      for (int k = 0; k < V; ++k)
        out.v[k] = div_rn(sub_rn(g.v[k], add_rn(mul_rn(r.v[k], mdyy), mdy)), sd);
    }
    store<T, V>(dx, o, out);
  });
}

// ---------------------------------------------------------------- Scale
// The bottom viewed as (outer, dim, inner) = (N, C, S) of the channel view.

// y = x * scale[c] (+ bias[c]); y may be x (in place); x_copy (may be null)
// receives x first (Caffe's temp_ of an in-place Scale).
template <typename T>
__global__ void scale_forward(const T* x, const T* __restrict__ scale,
    const T* __restrict__ bias, T* y, T* x_copy, const long long C, const long long S,
    const long long m, const long long L, const int vec) {
  const long long c = blockIdx.y, p = blockIdx.x;
  const T sc = scale[c];
  const T b = bias ? bias[c] : T(0);
  channel_walk<T>(vec, C, c, S, m, L, p, [&](auto w, const long long o) {
    constexpr int V = decltype(w)::value;
    const Lanes<T, V> v = load<T, V>(x, o);
    if (x_copy) store<T, V>(x_copy, o, v);
    Lanes<T, V> r;
    for (int k = 0; k < V; ++k) {
      r.v[k] = mul_rn(v.v[k], sc);
      if (bias) r.v[k] = add_rn(r.v[k], b);
    }
    store<T, V>(y, o, r);
  });
}

// Block (p, c): partial sums of dy * x (when need_scale; x may be null
// otherwise) and dy (when need_bias), and dx = dy * scale[c] when dx is not
// null (dx may be dy).
template <typename T>
__global__ void scale_backward_partial(const T* dy, const T* __restrict__ x,
    const T* __restrict__ scale, T* dx, const long long C, const long long S,
    const long long m, const long long L, const int vec, const int need_scale,
    const int need_bias, double* __restrict__ ws) {
  const long long c = blockIdx.y, p = blockIdx.x, P = gridDim.x;
  const T sc = dx ? scale[c] : T(0);
  double a = 0.0, b = 0.0;
  channel_walk<T>(vec, C, c, S, m, L, p, [&](auto w, const long long o) {
    constexpr int V = decltype(w)::value;
    const Lanes<T, V> g = load<T, V>(dy, o);
    if (need_scale) {
      const Lanes<T, V> v = load<T, V>(x, o);
      for (int k = 0; k < V; ++k) a += (double)mul_rn(g.v[k], v.v[k]);
    }
    if (need_bias)
      for (int k = 0; k < V; ++k) b += (double)g.v[k];
    if (dx) {
      Lanes<T, V> r;
      for (int k = 0; k < V; ++k) r.v[k] = mul_rn(g.v[k], sc);
      store<T, V>(dx, o, r);
    }
  });
  if (need_scale || need_bias) {
    block_sum2(a, b);
    if (threadIdx.x == 0) {
      ws[(c * P + p) * 2] = a;
      ws[(c * P + p) * 2 + 1] = b;
    }
  }
}

// One thread per channel: add the P partials in order; scale_diff (may be
// null) += or = the dy*x sum; bias_diff (may be null) += the dy sum.  W: the
// partials' stride (2, or 4 for bn_scale_backward_partial's).
template <typename T>
__global__ void scale_backward_finalize(const double* __restrict__ ws, const long long C,
    const int P, T* scale_diff, const int scale_accumulate, T* bias_diff, const int W) {
  CUDA_KERNEL_LOOP(c, C) {
    double a = 0.0, b = 0.0;
    for (int q = 0; q < P; ++q) {
      a += ws[(c * P + q) * W];
      b += ws[(c * P + q) * W + 1];
    }
    if (scale_diff) scale_diff[c] = scale_accumulate ? add_rn(scale_diff[c], (T)a) : (T)a;
    if (bias_diff) bias_diff[c] = add_rn(bias_diff[c], (T)b);
  }
}

// ----------------------------------------------------------------- ReLU
// y = x > 0 ? x : slope * x (slope 0: max(x, 0), NaN kept); y may be x.
template <typename T>
__global__ void relu_forward(const long long n, const T* x, T* y, const T slope) {
  CUDA_KERNEL_LOOP(i, n) y[i] = relu_value(x[i], slope);
}

// relu_forward over n16 packs of 16 bytes (n a multiple of the pack, x and y
// 16-byte aligned); the same value per element.
template <typename T>
__global__ void relu_forward_v(const long long n16, const T* x, T* y, const T slope) {
  CUDA_KERNEL_LOOP(i, n16) {
    Pack16<T> a = reinterpret_cast<const Pack16<T>*>(x)[i];
    for (int k = 0; k < (int)(16 / sizeof(T)); ++k) a.v[k] = relu_value(a.v[k], slope);
    reinterpret_cast<Pack16<T>*>(y)[i] = a;
  }
}

// A convolution's top and the in-place ReLU after it, in one pass (Net's conv+ReLU
// pairs): y = relu_value(y + bias[c], slope) on the (N, C, S) view, bias null: no sum.
// The generic path's two passes (cuDNN's AddTensor, then relu_forward) round the same
// sum once, so the values are the same bit for bit.
template <typename T>
__global__ void bias_relu_forward(T* y, const T* __restrict__ bias, const long long C,
    const long long S, const long long m, const long long L, const int vec, const T slope) {
  const long long c = blockIdx.y, p = blockIdx.x;
  const T b = bias ? bias[c] : T(0);
  channel_walk<T>(vec, C, c, S, m, L, p, [&](auto w, const long long o) {
    constexpr int V = decltype(w)::value;
    Lanes<T, V> r = load<T, V>(y, o);
    for (int k = 0; k < V; ++k) r.v[k] = relu_value(bias ? add_rn(r.v[k], b) : r.v[k], slope);
    store<T, V>(y, o, r);
  });
}

// dx = ref > 0 ? dy : slope * dy, ref the top (slope >= 0) or bottom data;
// dx may be dy.
template <typename T>
__global__ void relu_backward(const long long n, const T* __restrict__ ref, const T* dy, T* dx,
    const T slope) {
  CUDA_KERNEL_LOOP(i, n) {
    const T g = dy[i];
    dx[i] = ref[i] > T(0) ? g : mul_rn(g, slope);
  }
}

// relu_backward over n16 packs of 16 bytes (as relu_forward_v).
template <typename T>
__global__ void relu_backward_v(const long long n16, const T* __restrict__ ref, const T* dy,
    T* dx, const T slope) {
  CUDA_KERNEL_LOOP(i, n16) {
    const Pack16<T> r = reinterpret_cast<const Pack16<T>*>(ref)[i];
    Pack16<T> g = reinterpret_cast<const Pack16<T>*>(dy)[i];
    for (int k = 0; k < (int)(16 / sizeof(T)); ++k)
      g.v[k] = r.v[k] > T(0) ? g.v[k] : mul_rn(g.v[k], slope);
    reinterpret_cast<Pack16<T>*>(dx)[i] = g;
  }
}

// -------------------------------------------------------------- Eltwise
// y = ca * a + (cb == 1 ? b : cb * b); y may be a or b.
template <typename T>
__global__ void eltwise_sum2(const long long n, const T* a, const T ca, const T* b, const T cb,
    T* y) {
  CUDA_KERNEL_LOOP(i, n) {
    const T u = b[i];
    const T t = cb == T(1) ? u : mul_rn(u, cb);
    y[i] = add_rn(mul_rn(a[i], ca), t);
  }
}

// dx0 = c0 * dy, dx1 = c1 * dy (a copy where the coefficient is 1); either
// output may be null or be dy itself.
template <typename T>
__global__ void eltwise_sum_backward2(const long long n, const T* dy, T* dx0, const T c0,
    T* dx1, const T c1) {
  CUDA_KERNEL_LOOP(i, n) {
    const T g = dy[i];
    if (dx0) dx0[i] = c0 == T(1) ? g : mul_rn(g, c0);
    if (dx1) dx1[i] = c1 == T(1) ? g : mul_rn(g, c1);
  }
}

// eltwise_sum2 over n16 packs of 16 bytes (as relu_forward_v); the same value per element.
template <typename T>
__global__ void eltwise_sum2_v(const long long n16, const T* a, const T ca, const T* b,
    const T cb, T* y) {
  CUDA_KERNEL_LOOP(i, n16) {
    const Pack16<T> u = reinterpret_cast<const Pack16<T>*>(b)[i];
    const Pack16<T> v = reinterpret_cast<const Pack16<T>*>(a)[i];
    Pack16<T> r;
    for (int k = 0; k < (int)(16 / sizeof(T)); ++k) {
      const T t = cb == T(1) ? u.v[k] : mul_rn(u.v[k], cb);
      r.v[k] = add_rn(mul_rn(v.v[k], ca), t);
    }
    reinterpret_cast<Pack16<T>*>(y)[i] = r;
  }
}

// eltwise_sum_backward2 over n16 packs of 16 bytes.
template <typename T>
__global__ void eltwise_sum_backward2_v(const long long n16, const T* dy, T* dx0, const T c0,
    T* dx1, const T c1) {
  CUDA_KERNEL_LOOP(i, n16) {
    const Pack16<T> g = reinterpret_cast<const Pack16<T>*>(dy)[i];
    Pack16<T> r0, r1;
    for (int k = 0; k < (int)(16 / sizeof(T)); ++k) {
      r0.v[k] = c0 == T(1) ? g.v[k] : mul_rn(g.v[k], c0);
      r1.v[k] = c1 == T(1) ? g.v[k] : mul_rn(g.v[k], c1);
    }
    if (dx0) reinterpret_cast<Pack16<T>*>(dx0)[i] = r0;
    if (dx1) reinterpret_cast<Pack16<T>*>(dx1)[i] = r1;
  }
}

// -------------------------------------------------------------- Dropout
// minicaffe.rng's counter-based generator (splitmix64): element i of draw c of
// the stream with key k gets
//   rand = hi32(mix64(mix64(k + GOLDEN*(c+1)) + GOLDEN*(i+1)))   (mod 2^64),
// the bits that rng.stream_uint32 computes with NumPy.
#define SPLITMIX_GOLDEN 0x9E3779B97F4A7C15ULL

__device__ __forceinline__ unsigned long long mix64(unsigned long long z) {
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ULL;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBULL;
  return z ^ (z >> 31);
}

// TRAIN forward.  state (device memory, not kernel arguments, so that a CUDA
// graph replays fresh masks) = {key, counter, tickets}.  mask[i] = rand > thres
// (Caffe's uint_thres_ rule), y[i] = (x[i] * mask[i]) * scale, rounded as the
// generic path's two multiplies; y may be x.  Then the counter advances by one
// without a second launch: thread 0 of every block reads it before anything
// else and, once its elements are written, takes a ticket; the block that takes
// the last ticket knows that every block has read the counter, so it writes
// counter + 1 and clears the tickets for the next launch (on the same stream).
template <typename T>
__global__ void dropout_forward(const long long n, const T* x, T* y, unsigned int* mask,
    unsigned long long* state, const unsigned int thres, const T scale) {
  __shared__ unsigned long long s_counter, s_base;
  if (threadIdx.x == 0) {
    const unsigned long long c = state[1];
    s_counter = c;
    s_base = mix64(state[0] + SPLITMIX_GOLDEN * (c + 1ULL));
  }
  __syncthreads();
  const unsigned long long base = s_base;
  CUDA_KERNEL_LOOP(i, n) {
    const unsigned long long z = base + SPLITMIX_GOLDEN * (unsigned long long)(i + 1);
    const unsigned int m = (unsigned int)(mix64(z) >> 32) > thres ? 1u : 0u;
    mask[i] = m;
    y[i] = mul_rn(mul_rn(x[i], (T)m), scale);
  }
  if (threadIdx.x == 0) {
    __threadfence();  // this thread's read of the counter is complete before its ticket
    const unsigned long long ticket = atomicAdd(&state[2], 1ULL);
    if (ticket == (unsigned long long)gridDim.x - 1ULL) {
      state[2] = 0ULL;
      state[1] = s_counter + 1ULL;
    }
  }
}

// dx = (dy * mask) * scale, rounded as the generic path; dx may be dy.
template <typename T>
__global__ void dropout_backward(const long long n, const T* dy,
    const unsigned int* __restrict__ mask, T* dx, const T scale) {
  CUDA_KERNEL_LOOP(i, n) dx[i] = mul_rn(mul_rn(dy[i], (T)mask[i]), scale);
}

// ------------------------------------------------------------------ SGD
// Every parameter of the net in one launch.  Block b updates elements
// [chunk_start[b], chunk_start[b] + chunk) of parameter q = chunk_param[b],
// whose data, diff and history pointers are ptrs[3q .. 3q+2].  The arithmetic
// is Caffe's SGDSolver::ApplyUpdate, one rounding per step as the generic path:
//   diff *= 1/iter_size (when scale_diff); if decay != 0: diff += decay * (data
//   or sign(data) for L1); h = momentum * h + local_rate * diff; diff = h;
//   data -= h; local_rate = rate * lr_mult and decay = weight_decay *
//   decay_mult are formed in double, then rounded, like the Python scalars.
// rate comes from rate_ptr[0] when rate_ptr is not null (a CUDA graph reads
// the current learning rate from device memory), else from rate_value.
template <typename T>
__global__ void sgd_update_multi(const long long* __restrict__ chunk_param,
    const long long* __restrict__ chunk_start, const long long* __restrict__ ptrs,
    const long long* __restrict__ counts, const double* __restrict__ lr_mult,
    const double* __restrict__ decay_mult, const double* __restrict__ rate_ptr,
    const double rate_value, const double weight_decay, const T momentum, const T iter_scale,
    const int scale_diff, const int l1, const long long chunk) {
  const long long q = chunk_param[blockIdx.x];
  const long long start = chunk_start[blockIdx.x];
  const long long end = start + chunk < counts[q] ? start + chunk : counts[q];
  T* data = reinterpret_cast<T*>(ptrs[3 * q]);
  T* diff = reinterpret_cast<T*>(ptrs[3 * q + 1]);
  T* hist = reinterpret_cast<T*>(ptrs[3 * q + 2]);
  const double rate = rate_ptr ? rate_ptr[0] : rate_value;
  const T local_rate = (T)(rate * lr_mult[q]);
  const double decay_d = weight_decay * decay_mult[q];
  const T decay = (T)decay_d;
  for (long long i = start + threadIdx.x; i < end; i += FUSED_THREADS) {
    const T w = data[i];
    T d = diff[i];
    if (scale_diff) d = mul_rn(d, iter_scale);
    if (decay_d != 0.0) {
      T r = w;
      if (l1) r = (w > T(0)) ? T(1) : ((w < T(0)) ? T(-1) : ((w != w) ? w : T(0)));
      d = add_rn(d, mul_rn(decay, r));
    }
    T h = mul_rn(hist[i], momentum);
    h = add_rn(h, mul_rn(local_rate, d));
    hist[i] = h;
    diff[i] = h;
    data[i] = sub_rn(w, h);
  }
}

// Zero array `which` (0 data, 1 diff, 2 history) of every parameter in the table.
template <typename T>
__global__ void zero_multi(const long long* __restrict__ chunk_param,
    const long long* __restrict__ chunk_start, const long long* __restrict__ ptrs,
    const long long* __restrict__ counts, const int which, const long long chunk) {
  const long long q = chunk_param[blockIdx.x];
  const long long start = chunk_start[blockIdx.x];
  const long long end = start + chunk < counts[q] ? start + chunk : counts[q];
  T* a = reinterpret_cast<T*>(ptrs[3 * q + which]);
  for (long long i = start + threadIdx.x; i < end; i += FUSED_THREADS) a[i] = T(0);
}
"""

_CTYPE = {np.dtype(np.float32): "float", np.dtype(np.float64): "double"}
KERNELS = ("bn_stats_partial", "bn_forward_apply", "bn_backward_partial", "bn_backward_apply",
           "bn_scale_backward_partial", "scale_forward", "scale_backward_partial", "scale_backward_finalize",
           "relu_forward", "relu_backward", "relu_forward_v", "relu_backward_v",
           "bias_relu_forward", "eltwise_sum2",
           "eltwise_sum_backward2", "eltwise_sum2_v", "eltwise_sum_backward2_v",
           "dropout_forward", "dropout_backward", "sgd_update_multi", "zero_multi")

def _env_on(name: str) -> bool:
    return os.environ.get(name, "1").strip().lower() not in ("0", "false", "off", "no")


_state = {"enabled": _env_on(ENV_FUSED), "lanes": _env_on(ENV_LANES)}
_NULL = np.uint64(0)  # a null pointer argument (8 bytes, passed by value)
_i32 = np.int32
_i64 = np.int64
_f64 = np.float64


def source() -> str:
    """The CUDA C++ source (for inspection and offline compile checks with nvcc)."""
    return _SOURCE


def _name(kernel: str, dtype) -> str:
    return f"{kernel}<{_CTYPE[np.dtype(dtype)]}>"


def _all_names():
    return [_name(k, t) for t in _CTYPE for k in KERNELS]


# ------------------------------------------------------------- dispatch
@functools.lru_cache(maxsize=None)
def available() -> bool:
    """True when CuPy imports and a CUDA device answers (kernels can run here)."""
    return gpu_available()


@functools.lru_cache(maxsize=None)
def _module():
    """The compiled module (NVRTC once per process); raises when it cannot compile."""
    if not available():
        raise RuntimeError("cuda_fused kernels need CuPy and a CUDA device")
    mod = _cp.RawModule(code=_SOURCE, options=("--std=c++14",), name_expressions=_all_names())
    mod.compile()
    return mod


@functools.lru_cache(maxsize=None)
def compiles() -> bool:
    """True when the kernels compiled here; a failure is reported once and the
    layers keep their generic paths."""
    try:
        mod = _module()
        for n in _all_names():
            mod.get_function(n)
        return True
    except Exception as e:  # pragma: no cover - needs a GPU
        warnings.warn(f"minicaffe fused CUDA kernels did not compile ({type(e).__name__}: {e}); "
                      "BatchNorm, Scale, ReLU, Eltwise, Dropout and the SGD update use their "
                      "generic CuPy code", RuntimeWarning, stacklevel=2)
        return False


def enabled() -> bool:
    """The switch alone: ``MINICAFFE_FUSED`` (default on) or :func:`set_enabled`."""
    return _state["enabled"]


def set_enabled(flag: bool) -> bool:
    """Turn the fast paths on or off for layers set up afterwards; returns the old value."""
    old = _state["enabled"]
    _state["enabled"] = bool(flag)
    return old


@contextlib.contextmanager
def disabled():
    """Layers (and solvers) set up inside this block keep their generic paths."""
    old = set_enabled(False)
    try:
        yield
    finally:
        set_enabled(old)


@contextlib.contextmanager
def sized_as_gpu():
    """Layers set up inside this block take the buffers of the fused GPU path whatever their
    arrays, so that a net built on the CPU has the GPU's feature maps (a BatchNorm+Scale pair
    with no copy of the Scale's input, the fused kernels' workspaces): ``minicaffe plan`` on
    a GPU profile.  Such a net is for sizing only: its forward would call CUDA kernels."""
    old = _state.get("as_gpu", False)
    _state["as_gpu"] = True
    try:
        yield
    finally:
        _state["as_gpu"] = old


def enabled_for(xp, dtype=None) -> bool:
    """True when arrays of module ``xp`` (and element type ``dtype``) should take
    these kernels: xp is CuPy on a GPU, the switch is on, the kernels compile (or, inside
    :func:`sized_as_gpu`, the switch is on and the type is one they take)."""
    if _state.get("as_gpu") and _state["enabled"]:
        return dtype is None or np.dtype(dtype) in _CTYPE
    if not _state["enabled"] or _cp is None or xp is not _cp:
        return False
    if dtype is not None and np.dtype(dtype) not in _CTYPE:
        return False
    return available() and compiles()


_FUNCTIONS: dict = {}


def _fn(kernel: str, dtype):
    """The compiled kernel ``kernel<dtype>`` on the current device, looked up once.

    ``RawModule.get_function`` resolves the mangled name and asks the driver for the
    function on every call; the layers launch about 1,100 of these kernels per ResNet-152
    iteration, and session 38's cProfile of the host at batch 16 put 4.1 ms of every
    iteration's issue into those look-ups.  A function belongs to one device's module, so
    the device is part of the key."""
    key = (kernel, dtype, _cp.cuda.runtime.getDevice())
    f = _FUNCTIONS.get(key)
    if f is None:
        f = _FUNCTIONS[key] = _module().get_function(_name(kernel, dtype))
    return f


def _elementwise_grid(n: int):
    return (min((n + THREADS - 1) // THREADS, _MAX_BLOCKS),)


# ------------------------------------------------------ channel geometry
def channel_chunks(m: int, channels: int) -> tuple[int, int]:
    """(P, L) for a (P, C) grid over (N, C, S) with m = N*S elements per channel:
    P blocks per channel, each of L consecutive elements (the last may be short),
    enough blocks in all to fill the GPU, at least ``_MIN_BLOCK_ELEMS`` each.
    L is a multiple of ``_LANE_MULTIPLE``, so that the 16-byte units of the
    channel kernels never straddle two blocks."""
    if m <= 0:
        return 1, 1
    want = max(1, -(-_TARGET_BLOCKS // max(channels, 1)))
    p = max(1, min(want, -(-m // _MIN_BLOCK_ELEMS)))
    length = -(-m // p)
    length = -(-length // _LANE_MULTIPLE) * _LANE_MULTIPLE
    return -(-m // length), length


def _vec(s: int, length: int, *arrays):
    """The channel kernels' ``vec`` argument: 1 when they may move 16-byte units
    (S and L multiples of the unit, every array 16-byte aligned; None entries are
    absent arrays), else 0 (one element at a time).  The same values either way."""
    width = 16 // arrays[0].dtype.itemsize
    ok = (_state["lanes"] and s % width == 0 and length % width == 0
          and all(_ptr(a) % 16 == 0 for a in arrays if a is not None))
    return _i32(ok)


def channel_grid_ok(channels: int) -> bool:
    """A (P, C) grid can hold C channels (gridDim.y)."""
    return 0 < channels <= _MAX_GRID_Y


def workspace_size(channels: int, p: int, width: int = 2) -> int:
    """float64 elements of a (C, P, width) partial-sum workspace and, after the width-2
    sums, C pivots (forward only; the width-4 sums of a fused BatchNorm+Scale backward
    may overwrite them)."""
    return channels * max(2 * p + 1, width * p)


# ------------------------------------------------------------ BatchNorm
def bn_forward_train(x, y, x_norm, ws, std, mean_sum, var_sum, factor, eps, maf, correction,
                     p: int, length: int, gamma=None, beta=None, relu_slope=None):
    """BatchNorm TRAIN forward on (N, C, S) views: y, x_norm (C-contiguous, y may
    be x), std (C,) and the running sums updated in place; ws is the float64
    workspace of :func:`workspace_size` elements.  Two launches.  With ``gamma``
    (C,) (and ``beta`` (C,) or None), y = x_norm * gamma (+ beta): a following
    Scale layer's forward, fused; with ``relu_slope`` (a float), y is then ReLU'd with
    that negative slope: a ReLU in place after the Scale, fused too."""
    n, c, s = x.shape
    m = n * s
    if m == 0:
        return
    dt = x.dtype
    T = dt.type
    args = (_i64(c), _i64(s), _i64(m), _i64(length), _vec(s, length, x, y, x_norm))
    _fn("bn_stats_partial", dt)((p, c), (THREADS,), (x,) + args + (ws,))
    _fn("bn_forward_apply", dt)(
        (p, c), (THREADS,),
        (x, y, x_norm if x_norm is not None else _NULL) + args
        + (_i32(p), ws, _i32(0), mean_sum, var_sum, factor, T(eps), T(maf), T(correction), std,
           gamma if gamma is not None else _NULL, beta if beta is not None else _NULL,
           _i32(relu_slope is not None), T(relu_slope or 0.0)))


def bn_forward_global(x, y, std, mean_sum, var_sum, factor, eps, p: int, length: int):
    """BatchNorm forward with the stored statistics (use_global_stats); one launch."""
    n, c, s = x.shape
    m = n * s
    if m == 0:
        return
    dt = x.dtype
    T = dt.type
    _fn("bn_forward_apply", dt)(
        (p, c), (THREADS,),
        (x, y, _NULL, _i64(c), _i64(s), _i64(m), _i64(length), _vec(s, length, x, y), _i32(p),
         _NULL, _i32(1),
         mean_sum, var_sum, factor, T(eps), T(0), T(0), std, _NULL, _NULL, _i32(0), T(0)))


def bn_backward_train(dy, y, std, dx, ws, p: int, length: int):
    """BatchNorm TRAIN backward on (N, C, S) views (dx may be dy); two launches."""
    n, c, s = dy.shape
    m = n * s
    if m == 0:
        return
    dt = dy.dtype
    args = (_i64(c), _i64(s), _i64(m), _i64(length), _vec(s, length, dy, y, dx))
    _fn("bn_backward_partial", dt)((p, c), (THREADS,), (dy, y) + args + (ws,))
    _fn("bn_backward_apply", dt)((p, c), (THREADS,),
                                 (dy, y, std, dx) + args + (_i32(p), ws, _i32(0), _NULL,
                                                            _i32(2), _NULL))


def bn_scale_backward_partial(dy, y, gamma, ws, p: int, length: int):
    """The first half of a fused BatchNorm+Scale TRAIN backward on (N, C, S) views:
    dy the Scale's top diff, y the normalized input (BatchNorm's x_norm), gamma
    (C,): the per-block sums of both layers' gradients into ``ws`` (width 4,
    :func:`workspace_size`).  One launch; writes no full-size array."""
    n, c, s = dy.shape
    m = n * s
    if m == 0:
        return
    _fn("bn_scale_backward_partial", dy.dtype)(
        (p, c), (THREADS,), (dy, y, gamma, _i64(c), _i64(s), _i64(m), _i64(length),
                             _vec(s, length, dy, y), ws))


def bn_scale_backward_apply(dy, y, std, gamma, dx, dy_out, ws, p: int, length: int):
    """The second half: dx = BatchNorm's backward of dy * gamma (the Scale's bottom
    diff, also written to ``dy_out`` unless None), from the sums of
    :func:`bn_scale_backward_partial`; dx may be dy.  One launch."""
    n, c, s = dy.shape
    m = n * s
    if m == 0:
        return
    _fn("bn_backward_apply", dy.dtype)(
        (p, c), (THREADS,),
        (dy, y, std, dx, _i64(c), _i64(s), _i64(m), _i64(length),
         _vec(s, length, dy, y, dx, dy_out), _i32(p), ws, _i32(0), gamma, _i32(4),
         dy_out if dy_out is not None else _NULL))


def bn_backward_global(dy, std, dx, p: int, length: int):
    """dx = dy / std per channel (use_global_stats); one launch."""
    n, c, s = dy.shape
    m = n * s
    if m == 0:
        return
    _fn("bn_backward_apply", dy.dtype)(
        (p, c), (THREADS,),
        (dy, _NULL, std, dx, _i64(c), _i64(s), _i64(m), _i64(length), _vec(s, length, dy, dx),
         _i32(p), _NULL, _i32(1), _NULL, _i32(2), _NULL))


# ---------------------------------------------------------------- Scale
def scale_forward(x, scale, bias, y, x_copy, p: int, length: int):
    """y = x * scale (+ bias) on (outer, dim, inner) views; x_copy (or None)
    receives x first.  One launch."""
    n, c, s = x.shape
    m = n * s
    if m == 0:
        return
    _fn("scale_forward", x.dtype)(
        (p, c), (THREADS,),
        (x, scale, bias if bias is not None else _NULL, y,
         x_copy if x_copy is not None else _NULL, _i64(c), _i64(s), _i64(m), _i64(length),
         _vec(s, length, x, y, x_copy)))


def scale_backward(dy, x, scale, dx, scale_diff, scale_accumulate, bias_diff, ws, p: int,
                   length: int):
    """Scale backward on (outer, dim, inner) views: dx = dy * scale (dx None: not
    wanted; may be dy), scale_diff += (or =) sum(dy * x), bias_diff += sum(dy)
    over the outer and inner axes (either None: not wanted).  One or two launches."""
    n, c, s = dy.shape
    m = n * s
    need_scale = scale_diff is not None
    need_bias = bias_diff is not None
    if m == 0 or not (need_scale or need_bias or dx is not None):
        return
    dt = dy.dtype
    _fn("scale_backward_partial", dt)(
        (p, c), (THREADS,),
        (dy, x if need_scale else _NULL, scale, dx if dx is not None else _NULL, _i64(c),
         _i64(s), _i64(m), _i64(length), _vec(s, length, dy, x if need_scale else None, dx),
         _i32(need_scale), _i32(need_bias), ws))
    if need_scale or need_bias:
        _fn("scale_backward_finalize", dt)(
            _elementwise_grid(c), (THREADS,),
            (ws, _i64(c), _i32(p), scale_diff if need_scale else _NULL,
             _i32(bool(scale_accumulate)), bias_diff if need_bias else _NULL, _i32(2)))


def scale_backward_finalize(ws, scale_diff, bias_diff, p: int, width: int):
    """Scale's parameter gradients from per-block sums of stride ``width`` (4: those of
    :func:`bn_scale_backward_partial`): scale_diff += sum(dy * x), bias_diff += sum(dy)
    (either None: not wanted).  One launch (none when neither is wanted)."""
    if scale_diff is None and bias_diff is None:
        return
    ref = scale_diff if scale_diff is not None else bias_diff
    c = ref.size
    _fn("scale_backward_finalize", ref.dtype)(
        _elementwise_grid(c), (THREADS,),
        (ws, _i64(c), _i32(p), scale_diff if scale_diff is not None else _NULL, _i32(1),
         bias_diff if bias_diff is not None else _NULL, _i32(width)))


# ----------------------------------------------------------------- ReLU
def _packs16(n: int, *arrays) -> int:
    """Number of 16-byte packs the arrays split into when all of them are 16-byte aligned
    and hold a whole number of packs; 0 otherwise (then the one-element kernels run)."""
    width = 16 // arrays[0].dtype.itemsize
    if n % width or any(_ptr(a) % 16 for a in arrays):
        return 0
    return n // width


def relu_forward(x, y, slope: float):
    n = x.size
    if n:
        n16 = _packs16(n, x, y)
        if n16:
            _fn("relu_forward_v", x.dtype)(_elementwise_grid(n16), (THREADS,),
                                           (_i64(n16), x, y, x.dtype.type(slope)))
            return
        _fn("relu_forward", x.dtype)(_elementwise_grid(n), (THREADS,),
                                     (_i64(n), x, y, x.dtype.type(slope)))


def relu_backward(ref, dy, dx, slope: float):
    n = dy.size
    if n:
        n16 = _packs16(n, ref, dy, dx)
        if n16:
            _fn("relu_backward_v", dy.dtype)(_elementwise_grid(n16), (THREADS,),
                                             (_i64(n16), ref, dy, dx, dy.dtype.type(slope)))
            return
        _fn("relu_backward", dy.dtype)(_elementwise_grid(n), (THREADS,),
                                       (_i64(n), ref, dy, dx, dy.dtype.type(slope)))


def bias_relu_forward(y, bias, slope: float, p: int, length: int):
    """y = ReLU(y + bias[c]) in place on an (N, C, S) view (bias None: y = ReLU(y)), one
    pass: a convolution's top and the in-place ReLU paired with it
    (:meth:`minicaffe.net.Net.set_conv_relu_fusion`); ``(p, length)`` from
    :func:`channel_chunks`."""
    n, c, s = y.shape
    if n * s == 0:
        return
    _fn("bias_relu_forward", y.dtype)(
        (p, c), (THREADS,),
        (y, bias if bias is not None else _NULL, _i64(c), _i64(s), _i64(n * s), _i64(length),
         _vec(s, length, y), y.dtype.type(slope)))


# -------------------------------------------------------------- Eltwise
def eltwise_sum2(a, ca: float, b, cb: float, y):
    """y = ca * a + cb * b (the second product skipped where cb is 1); one launch."""
    n = y.size
    if n:
        T = y.dtype.type
        n16 = _packs16(n, a, b, y) if _state["lanes"] else 0
        if n16:
            _fn("eltwise_sum2_v", y.dtype)(_elementwise_grid(n16), (THREADS,),
                                           (_i64(n16), a, T(ca), b, T(cb), y))
            return
        _fn("eltwise_sum2", y.dtype)(_elementwise_grid(n), (THREADS,),
                                     (_i64(n), a, T(ca), b, T(cb), y))


def eltwise_sum_backward2(dy, dx0, c0: float, dx1, c1: float):
    """dx0 = c0 * dy and dx1 = c1 * dy (either may be None); one launch."""
    n = dy.size
    if n and (dx0 is not None or dx1 is not None):
        T = dy.dtype.type
        outs = (dx0 if dx0 is not None else _NULL, T(c0), dx1 if dx1 is not None else _NULL,
                T(c1))
        n16 = _packs16(n, *(a for a in (dy, dx0, dx1) if a is not None)) if _state["lanes"] else 0
        if n16:
            _fn("eltwise_sum_backward2_v", dy.dtype)(_elementwise_grid(n16), (THREADS,),
                                                     (_i64(n16), dy) + outs)
            return
        _fn("eltwise_sum_backward2", dy.dtype)(_elementwise_grid(n), (THREADS,),
                                               (_i64(n), dy) + outs)


# -------------------------------------------------------------- Dropout
def dropout_forward(x, y, mask, state, thres: int, scale: float):
    """TRAIN Dropout in one launch: ``mask`` (uint32, x's size) gets draw ``state[1]``
    of stream ``state[0]`` compared with ``thres``, y = x * mask * scale (y may be x),
    and ``state[1]`` advances by one on the device (``state``: (3,) uint64, its third
    element the kernel's ticket count, 0 between launches).  Launched also for an
    empty x, so that every forward is one draw, as on the CPU."""
    n = x.size
    _fn("dropout_forward", x.dtype)(_elementwise_grid(max(n, 1)), (THREADS,),
                                    (_i64(n), x, y, mask, state, np.uint32(thres),
                                     x.dtype.type(scale)))


def dropout_backward(dy, mask, dx, scale: float):
    """dx = dy * mask * scale (dx may be dy); one launch."""
    n = dy.size
    if n:
        _fn("dropout_backward", dy.dtype)(_elementwise_grid(n), (THREADS,),
                                          (_i64(n), dy, mask, dx, dy.dtype.type(scale)))


# ------------------------------------------------------------------ SGD
def _ptr(a) -> int:
    """Device address of a CuPy array (host address of a NumPy one: tests/kernels
    run these kernels through a CPU emulator)."""
    return a.ctypes.data if isinstance(a, np.ndarray) else a.data.ptr


_data_st, _diff_st = operator.attrgetter("data_storage"), operator.attrgetter("diff_storage")
_array_of, _shape_of = operator.attrgetter("array"), operator.attrgetter("shape")


def _all_same(objs, seen) -> bool:
    """Every object is the one seen (identity, pairwise; the caller checks the lengths)."""
    return all(map(operator.is_, objs, seen))


def _identities(params, history) -> tuple:
    """The objects :meth:`MultiTensorSGD.matches` compares by identity: each blob's data and
    diff storages, their arrays, its shape, and the history arrays."""
    ds, gs = list(map(_data_st, params)), list(map(_diff_st, params))
    return (ds, gs, list(map(_array_of, ds)), list(map(_array_of, gs)),
            list(map(_shape_of, params)), list(history))


class MultiTensorSGD:
    """Caffe's SGD update of every learnable parameter in one kernel launch.

    Holds device tables built once from the parameters' current storage: per
    parameter the (data, diff, history) pointers, its element count, lr_mult and
    decay_mult; per block the parameter it updates and where its chunk starts.
    :meth:`matches` tells whether the storage is still where the tables point
    (the memory manager or a reshape may move it); the owner rebuilds when not.
    Building synchronizes (small host-to-device copies); updating does not.
    """

    def __init__(self, params, history, lr_mult, decay_mult, chunk: int = _SGD_CHUNK, xp=None):
        xp = _cp if xp is None else xp
        self.dtype = np.dtype(params[0].dtype)
        self.chunk = int(chunk)
        ptrs = np.zeros((len(params), 3), dtype=np.int64)
        counts = np.zeros(len(params), dtype=np.int64)
        cparam, cstart = [], []
        for i, (q, h) in enumerate(zip(params, history)):
            ptrs[i] = (_ptr(q.data), _ptr(q.diff), _ptr(h))
            counts[i] = q.count
            starts = np.arange(0, q.count, self.chunk, dtype=np.int64)
            cparam.append(np.full(len(starts), i, dtype=np.int64))
            cstart.append(starts)
        self.key = self.storage_key(params, history)  # after the views allocated any storage
        self._seen = _identities(params, history)     # matches' fast path
        self.n_blocks = int(sum(len(s) for s in cstart))
        self.ptrs = xp.asarray(ptrs.ravel())
        self.counts = xp.asarray(counts)
        self.chunk_param = xp.asarray(np.concatenate(cparam) if cparam else np.zeros(0, np.int64))
        self.chunk_start = xp.asarray(np.concatenate(cstart) if cstart else np.zeros(0, np.int64))
        self.lr_mult = xp.asarray(np.asarray(lr_mult, dtype=np.float64))
        self.decay_mult = xp.asarray(np.asarray(decay_mult, dtype=np.float64))
        # (1,) float64: the learning rate read by a captured graph (see update(rate_ptr=...))
        self.rate = xp.zeros(1, dtype=np.float64)

    @staticmethod
    def supports(params, history) -> bool:
        """Every parameter of one float dtype, C-contiguous, history alike."""
        if not params:
            return False
        dt = np.dtype(params[0].dtype)
        if dt not in _CTYPE:
            return False
        for q, h in zip(params, history):
            if np.dtype(q.dtype) != dt or h.dtype != dt or h.size != q.count:
                return False
            if not (q.data.flags.c_contiguous and q.diff.flags.c_contiguous
                    and h.flags.c_contiguous):
                return False
        return True

    @staticmethod
    def storage_key(params, history) -> tuple:
        """Where every parameter's arrays live now (compared before each update, twice an
        iteration): a blob's data and diff views start where their storage's array starts,
        so the key reads the storages' arrays, not the views (ResNet-152's 932 parameter
        blobs made 4 to 10 ms of the host's issue per iteration through the views).  A
        storage with no array (released, or not allocated yet) gives None, which never
        matches a built table; building allocates it, as the views do."""
        key = []
        for q, h in zip(params, history):
            d, g = q.data_storage.array, q.diff_storage.array
            key.append((None if d is None else _ptr(d), None if g is None else _ptr(g),
                        _ptr(h), q.count))
        return tuple(key)

    def matches(self, params, history) -> bool:
        """Whether the tables still point where every parameter's arrays live.

        First by identity (C-level passes over the blobs' storages, the storages' arrays,
        the shapes and the history arrays, against those seen at the last match): the same
        array objects are the same memory, so nothing moved.  Anything else (a reshape, a
        storage rebound, even to the same address) falls back to :meth:`storage_key`, which
        compares addresses and counts.  ResNet-152's 932 parameter blobs: 664 us per call
        through the key, 275 us through identity (H200 host, 2026-11-29), twice an iteration."""
        seen = self._seen
        if (seen is not None and len(params) == len(seen[0]) and len(history) == len(seen[5])
                and _all_same(map(_data_st, params), seen[0])
                and _all_same(map(_diff_st, params), seen[1])
                and _all_same(map(_array_of, seen[0]), seen[2])
                and _all_same(map(_array_of, seen[1]), seen[3])
                and _all_same(map(_shape_of, params), seen[4])
                and _all_same(history, seen[5])):
            return True
        if self.storage_key(params, history) != self.key:
            return False
        self._seen = _identities(params, history)
        return True

    def update(self, rate: float, momentum: float, weight_decay: float, iter_size: int = 1,
               l1: bool = False, rate_from_device: bool = False):
        """One launch: weight decay, momentum, ``diff = history``, ``data -= diff``.

        rate_from_device: read the learning rate from ``self.rate`` (a graph
        replays this launch; the caller fills ``self.rate`` before each replay).
        """
        if not self.n_blocks:
            return
        T = self.dtype.type
        scale = iter_size > 1
        _fn("sgd_update_multi", self.dtype)(
            (self.n_blocks,), (THREADS,),
            (self.chunk_param, self.chunk_start, self.ptrs, self.counts, self.lr_mult,
             self.decay_mult, self.rate if rate_from_device else _NULL, _f64(rate),
             _f64(weight_decay), T(momentum), T(1.0 / iter_size if scale else 1.0),
             _i32(scale), _i32(bool(l1)), _i64(self.chunk)))

    def zero(self, which: str = "diff"):
        """Zero every parameter's ``data``, ``diff`` or ``history`` in one launch
        (``diff``: Net.clear_param_diffs for all learnable params at once)."""
        if not self.n_blocks:
            return
        index = {"data": 0, "diff": 1, "history": 2}[which]
        _fn("zero_multi", self.dtype)(
            (self.n_blocks,), (THREADS,),
            (self.chunk_param, self.chunk_start, self.ptrs, self.counts, _i32(index),
             _i64(self.chunk)))
