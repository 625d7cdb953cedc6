"""CUDA fast paths of the vision layers (CuPy RawKernels).

Each kernel computes exactly what the generic NumPy/CuPy code of the layer
computes, with Caffe's index math (``im2col.cu``, ``pooling_layer.cu``,
``lrn_layer.cu``), for a whole batch per launch:

* ``im2col`` / ``col2im``: one thread per (image, channel, output pixel) and per
  (image, channel, input pixel) respectively, for either column layout
  (batch-major or row-major over the batch); col2im *gathers* (each input pixel
  sums the column entries it fed) so no atomics are needed and results are
  deterministic.
* max / average pooling forward (one thread per output) and backward (one
  thread per input, gathering over the windows that cover it, as Caffe's GPU
  code does); the max mask is either an int32 buffer or the layer's second top
  (Caffe stores the mask in a float top then).
* LRN across and within channels, forward (scale and output in one pass) and
  backward.
* ``im2col_fixed`` / ``col2im_fixed``: the same lowering for square 3, 5, 7 and 11
  kernels with dilation 1, the window's size known when compiling (loops unrolled,
  loads issued together; col2im sums in the generic kernel's order).
* ``lrn_across_walk_*``: LRN across 3, 5 or 7 channels with one thread per pixel
  walking the channels (Caffe's GPU scheme), the window held in registers; the same
  sums, in the same order, as the per-element kernels.
* ``swap_outer``: (A, B, L) -> (B, A, L) with an optional bias per A, the
  convolution's transposing passes (32-bit indices where they fit; CuPy's copy of a
  transposed view is a general strided kernel).

The module imports without CuPy or a GPU; the kernels are compiled by NVRTC on
first use (float and double instantiations of C++ templates) and launched on
CuPy's current stream.  Arrays must be C-contiguous.
"""
from __future__ import annotations

import functools

import numpy as np

from ..backend import gpu_available

try:  # importing cupy needs no GPU; compiling and launching do.
    import cupy as _cp
except Exception:  # pragma: no cover - CuPy absent
    _cp = None

_THREADS = 256
_MAX_BLOCKS = 1 << 20  # kernels use grid-stride loops beyond this

_SOURCE = r"""
#define CUDA_KERNEL_LOOP(i, n) \
  for (long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x; i < (n); \
       i += (long long)blockDim.x * gridDim.x)

// Caffe's -FLT_MAX: the start value of max pooling, in either precision.
#define NEG_FLT_MAX (-3.402823466e+38)

// ------------------------------------------------------------------ im2col
// The column buffer: entry (n, row, l), row = (c*kh + i)*kw + j, l = oh*OW + ow,
// lives at n * col_batch_stride + row * col_row_stride + l, which covers both
// layouts: (N, C*kh*kw, OH*OW) and (C*kh*kw, N, OH*OW).

// im (N, C, H, W) -> col; one thread per (n, c, oh, ow).  I is the index type: int
// where every index of the call fits (the host checks), long long otherwise; 64-bit
// division and modulo cost several times the 32-bit ones.
template <typename T, typename I>
__global__ void im2col_batch(const I total, const T* __restrict__ im,
    const int channels, const int height, const int width,
    const int kernel_h, const int kernel_w, const int pad_h, const int pad_w,
    const int stride_h, const int stride_w, const int dilation_h, const int dilation_w,
    const int out_h, const int out_w, const I col_batch_stride,
    const I col_row_stride, T* __restrict__ col) {
  for (I idx = (I)blockIdx.x * blockDim.x + threadIdx.x; idx < total;
       idx += (I)blockDim.x * gridDim.x) {
    const int ow = idx % out_w;
    const I t = idx / out_w;
    const int oh = t % out_h;
    const I nc = t / out_h;  // n * channels + c
    const I n = nc / channels;
    const int c = nc - n * channels;
    const int h0 = oh * stride_h - pad_h;
    const int w0 = ow * stride_w - pad_w;
    const T* src = im + nc * height * width;
    T* dst = col + n * col_batch_stride + (I)c * kernel_h * kernel_w * col_row_stride
             + (I)oh * out_w + ow;
    for (int i = 0; i < kernel_h; ++i) {
      const int h = h0 + i * dilation_h;
      const bool h_in = h >= 0 && h < height;
      for (int j = 0; j < kernel_w; ++j) {
        const int w = w0 + j * dilation_w;
        *dst = (h_in && w >= 0 && w < width) ? src[h * width + w] : T(0);
        dst += col_row_stride;
      }
    }
  }
}

// col -> im (N, C, H, W), overwriting im; one thread per input pixel, summing
// the column entries that read it (Caffe's col2im_gpu_kernel).  I as in im2col.
template <typename T, typename I>
__global__ void col2im_batch(const I total, const T* __restrict__ col,
    const int channels, const int height, const int width,
    const int kernel_h, const int kernel_w, const int pad_h, const int pad_w,
    const int stride_h, const int stride_w, const int dilation_h, const int dilation_w,
    const int out_h, const int out_w, const I col_batch_stride,
    const I col_row_stride, T* __restrict__ im) {
  const int extent_h = (kernel_h - 1) * dilation_h + 1;
  const int extent_w = (kernel_w - 1) * dilation_w + 1;
  for (I idx = (I)blockIdx.x * blockDim.x + threadIdx.x; idx < total;
       idx += (I)blockDim.x * gridDim.x) {
    const int w = idx % width + pad_w;  // coordinates in the padded image
    const I t = idx / width;
    const int h = t % height + pad_h;
    const I nc = t / height;
    const I n = nc / channels;
    const int c = nc - n * channels;
    const int oh_start = (h < extent_h) ? 0 : (h - extent_h) / stride_h + 1;
    const int oh_end = min(h / stride_h + 1, out_h);
    const int ow_start = (w < extent_w) ? 0 : (w - extent_w) / stride_w + 1;
    const int ow_end = min(w / stride_w + 1, out_w);
    const T* src = col + n * col_batch_stride + (I)c * kernel_h * kernel_w * col_row_stride;
    T val = 0;
    if (dilation_h == 1 && dilation_w == 1) {
      for (int oh = oh_start; oh < oh_end; ++oh) {
        const int i = h - oh * stride_h;
        for (int ow = ow_start; ow < ow_end; ++ow) {
          const int j = w - ow * stride_w;
          val += src[(I)(i * kernel_w + j) * col_row_stride + oh * out_w + ow];
        }
      }
    } else {
      for (int oh = oh_start; oh < oh_end; ++oh) {
        int i = h - oh * stride_h;
        if (i % dilation_h != 0) continue;
        i /= dilation_h;
        for (int ow = ow_start; ow < ow_end; ++ow) {
          int j = w - ow * stride_w;
          if (j % dilation_w != 0) continue;
          j /= dilation_w;
          val += src[(I)(i * kernel_w + j) * col_row_stride + oh * out_w + ow];
        }
      }
    }
    im[idx] = val;
  }
}

// ------------------------------------------------------- outer transpose
// src (A, B, L) -> dst (B, A, L), plus bias[a] when has_bias: the convolution's
// flat GEMM result (M, b, L) into its top (b, M, L) with the bias, and its top diff
// (b, M, L) into (M, b, L).  Block x is one row (b, a) of dst, block y a stretch of
// 4 * blockDim.x of its L elements, each thread 4 of them blockDim.x apart: no
// division per element, four loads in flight.  I as in im2col.
template <typename T, typename I>
__global__ void swap_outer(const T* __restrict__ src, const int A, const int B,
    const int L, const T* __restrict__ bias, const int has_bias, T* __restrict__ dst) {
  const I r = blockIdx.x;
  const int a = r % A;
  const I b = r / A;
  const T add = has_bias ? bias[a] : T(0);
  const T* s = src + ((I)a * B + b) * L;
  T* d = dst + r * L;
  const int l0 = blockIdx.y * (4 * blockDim.x) + threadIdx.x;
  T v[4];
#pragma unroll
  for (int k = 0; k < 4; ++k) {
    const int l = l0 + k * blockDim.x;
    v[k] = l < L ? s[l] : T(0);
  }
#pragma unroll
  for (int k = 0; k < 4; ++k) {
    const int l = l0 + k * blockDim.x;
    if (l < L) d[l] = v[k] + add;
  }
}

// ----------------------------------------------------------------- pooling
// One thread per output (n, c, ph, pw).  M is int (an internal mask) or T (the
// mask top); the mask holds h * width + w of the first maximum, -1 if none.
template <typename T, typename M>
__global__ void max_pool_forward(const long long total, const T* __restrict__ bottom,
    const int height, const int width, const int pooled_h, const int pooled_w,
    const int kernel_h, const int kernel_w, const int stride_h, const int stride_w,
    const int pad_h, const int pad_w, T* __restrict__ top, M* __restrict__ mask) {
  CUDA_KERNEL_LOOP(idx, total) {
    const int pw = idx % pooled_w;
    const long long t = idx / pooled_w;
    const int ph = t % pooled_h;
    const long long nc = t / pooled_h;
    int hstart = ph * stride_h - pad_h;
    int wstart = pw * stride_w - pad_w;
    const int hend = min(hstart + kernel_h, height);
    const int wend = min(wstart + kernel_w, width);
    hstart = max(hstart, 0);
    wstart = max(wstart, 0);
    T maxval = T(NEG_FLT_MAX);
    int maxidx = -1;
    const T* src = bottom + nc * height * width;
    for (int h = hstart; h < hend; ++h) {
      for (int w = wstart; w < wend; ++w) {
        if (src[h * width + w] > maxval) {
          maxidx = h * width + w;
          maxval = src[maxidx];
        }
      }
    }
    top[idx] = maxval;
    mask[idx] = M(maxidx);
  }
}

// One thread per input (n, c, h, w): the sum of the diffs of the windows whose
// first maximum is this pixel (bottom_diff is overwritten).
template <typename T, typename M>
__global__ void max_pool_backward(const long long total, const T* __restrict__ top_diff,
    const M* __restrict__ mask, const int height, const int width,
    const int pooled_h, const int pooled_w, const int kernel_h, const int kernel_w,
    const int stride_h, const int stride_w, const int pad_h, const int pad_w,
    T* __restrict__ bottom_diff) {
  CUDA_KERNEL_LOOP(idx, total) {
    const int w = idx % width;
    const long long t = idx / width;
    const int h = t % height;
    const long long nc = t / height;
    const int phstart = (h + pad_h < kernel_h) ? 0 : (h + pad_h - kernel_h) / stride_h + 1;
    const int phend = min((h + pad_h) / stride_h + 1, pooled_h);
    const int pwstart = (w + pad_w < kernel_w) ? 0 : (w + pad_w - kernel_w) / stride_w + 1;
    const int pwend = min((w + pad_w) / stride_w + 1, pooled_w);
    const long long offset = nc * pooled_h * pooled_w;
    const int target = h * width + w;
    T gradient = 0;
    for (int ph = phstart; ph < phend; ++ph) {
      for (int pw = pwstart; pw < pwend; ++pw) {
        const long long k = offset + ph * pooled_w + pw;
        if (int(mask[k]) == target) gradient += top_diff[k];
      }
    }
    bottom_diff[idx] = gradient;
  }
}

// Average over the window clipped to the padded input (padding counts).
template <typename T>
__global__ void ave_pool_forward(const long long total, const T* __restrict__ bottom,
    const int height, const int width, const int pooled_h, const int pooled_w,
    const int kernel_h, const int kernel_w, const int stride_h, const int stride_w,
    const int pad_h, const int pad_w, T* __restrict__ top) {
  CUDA_KERNEL_LOOP(idx, total) {
    const int pw = idx % pooled_w;
    const long long t = idx / pooled_w;
    const int ph = t % pooled_h;
    const long long nc = t / pooled_h;
    int hstart = ph * stride_h - pad_h;
    int wstart = pw * stride_w - pad_w;
    int hend = min(hstart + kernel_h, height + pad_h);
    int wend = min(wstart + kernel_w, width + pad_w);
    const int pool_size = (hend - hstart) * (wend - wstart);
    hstart = max(hstart, 0);
    wstart = max(wstart, 0);
    hend = min(hend, height);
    wend = min(wend, width);
    const T* src = bottom + nc * height * width;
    T sum = 0;
    for (int h = hstart; h < hend; ++h) {
      for (int w = wstart; w < wend; ++w) sum += src[h * width + w];
    }
    top[idx] = sum / T(pool_size);
  }
}

template <typename T>
__global__ void ave_pool_backward(const long long total, const T* __restrict__ top_diff,
    const int height, const int width, const int pooled_h, const int pooled_w,
    const int kernel_h, const int kernel_w, const int stride_h, const int stride_w,
    const int pad_h, const int pad_w, T* __restrict__ bottom_diff) {
  CUDA_KERNEL_LOOP(idx, total) {
    const int w = idx % width + pad_w;  // padded coordinates
    const long long t = idx / width;
    const int h = t % height + pad_h;
    const long long nc = t / height;
    const int phstart = (h < kernel_h) ? 0 : (h - kernel_h) / stride_h + 1;
    const int phend = min(h / stride_h + 1, pooled_h);
    const int pwstart = (w < kernel_w) ? 0 : (w - kernel_w) / stride_w + 1;
    const int pwend = min(w / stride_w + 1, pooled_w);
    const T* src = top_diff + nc * pooled_h * pooled_w;
    T gradient = 0;
    for (int ph = phstart; ph < phend; ++ph) {
      for (int pw = pwstart; pw < pwend; ++pw) {
        const int hstart = ph * stride_h - pad_h;
        const int wstart = pw * stride_w - pad_w;
        const int hend = min(hstart + kernel_h, height + pad_h);
        const int wend = min(wstart + kernel_w, width + pad_w);
        const int pool_size = (hend - hstart) * (wend - wstart);
        gradient += src[ph * pooled_w + pw] / T(pool_size);
      }
    }
    bottom_diff[idx] = gradient;
  }
}

// --------------------------------------------------------------------- LRN
// Across channels: scale = k + alpha/size * sum_{|c'-c| <= (size-1)/2} x^2,
// top = x * scale^-beta.  One thread per element (n, c, h, w).
template <typename T>
__global__ void lrn_across_forward(const long long total, const T* __restrict__ bottom,
    const int channels, const long long plane, const int size, const T alpha_over_size,
    const T k, const T neg_beta, T* __restrict__ scale, T* __restrict__ top) {
  const int pre_pad = (size - 1) / 2;
  CUDA_KERNEL_LOOP(idx, total) {
    const long long hw = idx % plane;
    const long long t = idx / plane;
    const int c = t % channels;
    const long long base = (t - c) * plane + hw;  // (n, 0, h, w)
    const int c0 = max(c - pre_pad, 0);
    const int c1 = min(c + pre_pad + 1, channels);
    T acc = 0;
    for (int cc = c0; cc < c1; ++cc) {
      const T v = bottom[base + cc * plane];
      acc += v * v;
    }
    const T s = k + alpha_over_size * acc;
    scale[idx] = s;
    top[idx] = bottom[idx] * pow(s, neg_beta);
  }
}

// bottom_diff = top_diff * scale^-beta
//             - 2*alpha*beta/size * x * sum_window(top_diff * top / scale)
template <typename T>
__global__ void lrn_across_backward(const long long total, const T* __restrict__ bottom,
    const T* __restrict__ top, const T* __restrict__ scale, const T* __restrict__ top_diff,
    const int channels, const long long plane, const int size, const T neg_beta,
    const T cache_ratio, T* __restrict__ bottom_diff) {
  const int pre_pad = (size - 1) / 2;
  CUDA_KERNEL_LOOP(idx, total) {
    const long long hw = idx % plane;
    const long long t = idx / plane;
    const int c = t % channels;
    const long long base = (t - c) * plane + hw;
    const int c0 = max(c - pre_pad, 0);
    const int c1 = min(c + pre_pad + 1, channels);
    T acc = 0;
    for (int cc = c0; cc < c1; ++cc) {
      const long long j = base + cc * plane;
      acc += top_diff[j] * top[j] / scale[j];
    }
    bottom_diff[idx] = top_diff[idx] * pow(scale[idx], neg_beta)
                       - cache_ratio * bottom[idx] * acc;
  }
}

// Within channel: scale = 1 + alpha/size^2 * sum over the size x size window
// (zero outside the image), top = x * scale^-beta.
template <typename T>
__global__ void lrn_within_forward(const long long total, const T* __restrict__ bottom,
    const int height, const int width, const int size, const T alpha_over_area,
    const T neg_beta, T* __restrict__ scale, T* __restrict__ top) {
  const int pre_pad = (size - 1) / 2;
  CUDA_KERNEL_LOOP(idx, total) {
    const int w = idx % width;
    const long long t = idx / width;
    const int h = t % height;
    const T* src = bottom + (t / height) * height * width;
    const int h0 = max(h - pre_pad, 0), h1 = min(h + pre_pad + 1, height);
    const int w0 = max(w - pre_pad, 0), w1 = min(w + pre_pad + 1, width);
    T acc = 0;
    for (int hh = h0; hh < h1; ++hh) {
      for (int ww = w0; ww < w1; ++ww) {
        const T v = src[hh * width + ww];
        acc += v * v;
      }
    }
    const T s = T(1) + alpha_over_area * acc;
    scale[idx] = s;
    top[idx] = bottom[idx] * pow(s, neg_beta);
  }
}

template <typename T>
__global__ void lrn_within_backward(const long long total, const T* __restrict__ bottom,
    const T* __restrict__ top, const T* __restrict__ scale, const T* __restrict__ top_diff,
    const int height, const int width, const int size, const T neg_beta,
    const T cache_ratio, T* __restrict__ bottom_diff) {
  const int pre_pad = (size - 1) / 2;
  CUDA_KERNEL_LOOP(idx, total) {
    const int w = idx % width;
    const long long t = idx / width;
    const int h = t % height;
    const long long base = (t / height) * height * width;
    const int h0 = max(h - pre_pad, 0), h1 = min(h + pre_pad + 1, height);
    const int w0 = max(w - pre_pad, 0), w1 = min(w + pre_pad + 1, width);
    T acc = 0;
    for (int hh = h0; hh < h1; ++hh) {
      for (int ww = w0; ww < w1; ++ww) {
        const long long j = base + hh * width + ww;
        acc += top_diff[j] * top[j] / scale[j];
      }
    }
    bottom_diff[idx] = top_diff[idx] * pow(scale[idx], neg_beta)
                       - cache_ratio * bottom[idx] * acc;
  }
}
"""

# Square kernels of a size known when compiling (dilation 1): im2col issues each window
# row's loads together, col2im its K*K gathers (in the generic kernels' order, so the sums
# are the same bits).  Compiled per (dtype, index type, K, stride 1 or not) on first use.
_FIXED_SOURCE = r"""
template <typename T, typename I, int K>
__global__ void im2col_fixed(const I total, const T* __restrict__ im,
    const int channels, const int height, const int width, const int pad_h,
    const int pad_w, const int stride_h, const int stride_w, const int out_h,
    const int out_w, const I col_batch_stride, const I col_row_stride,
    T* __restrict__ col) {
  for (I idx = (I)blockIdx.x * blockDim.x + threadIdx.x; idx < total;
       idx += (I)blockDim.x * gridDim.x) {
    const int ow = idx % out_w;
    const I t = idx / out_w;
    const int oh = t % out_h;
    const I nc = t / out_h;
    const I n = nc / channels;
    const int c = nc - n * channels;
    const int h0 = oh * stride_h - pad_h;
    const int w0 = ow * stride_w - pad_w;
    const T* src = im + nc * height * width;
    T* dst = col + n * col_batch_stride + (I)c * (K * K) * col_row_stride
             + (I)oh * out_w + ow;
#pragma unroll
    for (int i = 0; i < K; ++i) {
      const int h = h0 + i;
      const bool h_in = h >= 0 && h < height;
      T v[K];
#pragma unroll
      for (int j = 0; j < K; ++j) {
        const int w = w0 + j;
        v[j] = (h_in && w >= 0 && w < width) ? src[h * width + w] : T(0);
      }
#pragma unroll
      for (int j = 0; j < K; ++j) dst[(I)(i * K + j) * col_row_stride] = v[j];
    }
  }
}

template <typename T, typename I, int K, bool S1>
__global__ void col2im_fixed(const I total, const T* __restrict__ col,
    const int channels, const int height, const int width, const int pad_h,
    const int pad_w, const int stride_h, const int stride_w, const int out_h,
    const int out_w, const I col_batch_stride, const I col_row_stride,
    T* __restrict__ im) {
  for (I idx = (I)blockIdx.x * blockDim.x + threadIdx.x; idx < total;
       idx += (I)blockDim.x * gridDim.x) {
    const int w = idx % width + pad_w;
    const I t = idx / width;
    const int h = t % height + pad_h;
    const I nc = t / height;
    const I n = nc / channels;
    const int c = nc - n * channels;
    const T* src = col + n * col_batch_stride + (I)c * (K * K) * col_row_stride;
    T val = 0;
#pragma unroll
    for (int i = K - 1; i >= 0; --i) {  // oh ascending, as the generic kernel sums
      const int hh = h - i;
      const int oh = S1 ? hh : hh / stride_h;
      const bool h_ok = hh >= 0 && (S1 || hh % stride_h == 0) && oh < out_h;
#pragma unroll
      for (int j = K - 1; j >= 0; --j) {
        const int ww = w - j;
        const int ow = S1 ? ww : ww / stride_w;
        if (h_ok && ww >= 0 && (S1 || ww % stride_w == 0) && ow < out_w)
          val += src[(I)(i * K + j) * col_row_stride + oh * out_w + ow];
      }
    }
    im[idx] = val;
  }
}

// LRN across channels with a window of SIZE channels known when compiling: one thread
// per (n, h, w) walks the channels, holding the window in registers, so each input is
// loaded once (forward) and each top_diff * top / scale is computed once (backward).
// The window sums add the same terms in the same order as lrn_across_forward /
// lrn_across_backward (channels outside the image are skipped), so the bits agree.
template <typename T, typename I, int SIZE>
__global__ void lrn_across_walk_forward(const I total, const T* __restrict__ bottom,
    const int channels, const int plane, const T alpha_over_size, const T k,
    const T neg_beta, T* __restrict__ scale, T* __restrict__ top) {
  const int pre = (SIZE - 1) / 2;
  for (I idx = (I)blockIdx.x * blockDim.x + threadIdx.x; idx < total;
       idx += (I)blockDim.x * gridDim.x) {
    const I n = idx / plane;
    const int hw = idx - n * plane;
    const I base = n * channels * plane + hw;
    T win[SIZE];
#pragma unroll
    for (int s = 0; s < SIZE; ++s) {  // channels -pre .. SIZE-1-pre
      const int cc = s - pre;
      win[s] = (cc >= 0 && cc < channels) ? bottom[base + (I)cc * plane] : T(0);
    }
    for (int c = 0; c < channels; ++c) {
      T acc = 0;
      int first = max(0, pre - c);  // window slots below channel 0 hold nothing
#pragma unroll
      for (int s = 0; s < SIZE; ++s) {
        if (s >= first && c - pre + s < channels) acc += win[s] * win[s];
      }
      const I j = base + (I)c * plane;
      const T sc = k + alpha_over_size * acc;
      scale[j] = sc;
      top[j] = win[pre] * pow(sc, neg_beta);
#pragma unroll
      for (int s = 0; s + 1 < SIZE; ++s) win[s] = win[s + 1];
      const int cn = c + SIZE - pre;
      win[SIZE - 1] = cn < channels ? bottom[base + (I)cn * plane] : T(0);
    }
  }
}

template <typename T, typename I, int SIZE>
__global__ void lrn_across_walk_backward(const I total, const T* __restrict__ bottom,
    const T* __restrict__ top, const T* __restrict__ scale, const T* __restrict__ top_diff,
    const int channels, const int plane, const T neg_beta, const T cache_ratio,
    T* __restrict__ bottom_diff) {
  const int pre = (SIZE - 1) / 2;
  for (I idx = (I)blockIdx.x * blockDim.x + threadIdx.x; idx < total;
       idx += (I)blockDim.x * gridDim.x) {
    const I n = idx / plane;
    const int hw = idx - n * plane;
    const I base = n * channels * plane + hw;
    T win[SIZE];
#pragma unroll
    for (int s = 0; s < SIZE; ++s) {
      const int cc = s - pre;
      const I j = base + (I)cc * plane;
      win[s] = (cc >= 0 && cc < channels) ? top_diff[j] * top[j] / scale[j] : T(0);
    }
    for (int c = 0; c < channels; ++c) {
      T acc = 0;
      int first = max(0, pre - c);
#pragma unroll
      for (int s = 0; s < SIZE; ++s) {
        if (s >= first && c - pre + s < channels) acc += win[s];
      }
      const I j = base + (I)c * plane;
      bottom_diff[j] = top_diff[j] * pow(scale[j], neg_beta) - cache_ratio * bottom[j] * acc;
#pragma unroll
      for (int s = 0; s + 1 < SIZE; ++s) win[s] = win[s + 1];
      const int cn = c + SIZE - pre;
      const I jn = base + (I)cn * plane;
      win[SIZE - 1] = cn < channels ? top_diff[jn] * top[jn] / scale[jn] : T(0);
    }
  }
}
"""
FIXED_SIZES = (3, 5, 7, 11)
LRN_WALK_SIZES = (3, 5, 7)

_CTYPE = {np.dtype(np.float32): "float", np.dtype(np.float64): "double"}
_TEMPLATES_TI = ("im2col_batch", "col2im_batch", "swap_outer")
_TEMPLATES_T = ("ave_pool_forward", "ave_pool_backward",
                "lrn_across_forward", "lrn_across_backward", "lrn_within_forward",
                "lrn_within_backward")
_TEMPLATES_TM = ("max_pool_forward", "max_pool_backward")


def _name(kernel: str, dtype, mask_dtype=None) -> str:
    t = _CTYPE[np.dtype(dtype)]
    if mask_dtype is None:
        return f"{kernel}<{t}>"
    m = "int" if np.dtype(mask_dtype) == np.int32 else _CTYPE[np.dtype(mask_dtype)]
    return f"{kernel}<{t},{m}>"


def _name_i(kernel: str, dtype, wide: bool) -> str:
    return f"{kernel}<{_CTYPE[np.dtype(dtype)]},{'long long' if wide else 'int'}>"


def _all_names():
    names = []
    for t in _CTYPE:
        names += [_name(k, t) for k in _TEMPLATES_T]
        names += [_name_i(k, t, w) for k in _TEMPLATES_TI for w in (False, True)]
        names += [_name(k, t, m) for k in _TEMPLATES_TM for m in (np.int32, t)]
    return names


@functools.lru_cache(maxsize=None)
def available() -> bool:
    """True when CuPy imports and a CUDA device answers (kernels can run here)."""
    return gpu_available()


def enabled_for(xp) -> bool:
    """True when arrays of module ``xp`` should take these kernels (xp is cupy on a GPU)."""
    return _cp is not None and xp is _cp and available()


@functools.lru_cache(maxsize=None)
def _module():
    """The compiled module (NVRTC, once per process, on first use)."""
    if not available():
        raise RuntimeError("cuda_vision kernels need CuPy and a CUDA device")
    return _cp.RawModule(code=_SOURCE, options=("--std=c++14",), name_expressions=_all_names())


@functools.lru_cache(maxsize=None)
def _fixed_function(name: str):
    """One instantiation of the fixed-size lowering kernels, compiled on first use."""
    if not available():
        raise RuntimeError("cuda_vision kernels need CuPy and a CUDA device")
    mod = _cp.RawModule(code=_FIXED_SOURCE, options=("--std=c++14",), name_expressions=(name,))
    return mod.get_function(name)


def _fixed(kernel, dilation):
    """K where (kernel, dilation) takes the fixed-size kernels, else None."""
    (kh, kw), (dh, dw) = kernel, dilation
    return kh if kh == kw and kh in FIXED_SIZES and dh == dw == 1 else None


def _launch(name: str, total: int, args, fn=None):
    if total <= 0:
        return
    fn = fn or _module().get_function(name)
    blocks = min((total + _THREADS - 1) // _THREADS, _MAX_BLOCKS)
    # RawKernel launches go on CuPy's current stream; no host synchronisation.
    fn((blocks,), (_THREADS,), args)


def _check(*arrays):
    for a in arrays:
        if not a.flags.c_contiguous:
            raise ValueError("cuda_vision kernels need C-contiguous arrays")
    dt = arrays[0].dtype
    if dt not in _CTYPE:
        raise TypeError(f"cuda_vision kernels support float32 and float64, not {dt}")
    return dt


def _pair(v):
    if isinstance(v, int):
        return int(v), int(v)
    a, b = v
    return int(a), int(b)


_i32 = np.int32
_i64 = np.int64


# ------------------------------------------------------------------ im2col
def _col_strides(n, kdim, plane, batch_major):
    """(batch stride, row stride) of a column buffer (see kernels.im2col)."""
    return (kdim * plane, plane) if batch_major else (plane, n * plane)


def _index_args(col, im, strides, total):
    """(wide, the index-typed arguments): 32-bit indices where every element index of
    the call fits in an int, 64-bit otherwise."""
    wide = max(col.size, im.size, total) >= 1 << 30  # the grid-stride step stays in range
    it = _i64 if wide else _i32
    return wide, (it(total),), tuple(it(v) for v in strides)


def im2col(x, out, kernel, pad, stride, dilation, out_hw, batch_major=True):
    """x (N, C, H, W) -> out (N, C*kh*kw, OH*OW), or (C*kh*kw, N, OH*OW) when not
    ``batch_major``; the contract of :func:`minicaffe.kernels.im2col.im2col`."""
    dt = _check(x, out)
    n, c, h, w = x.shape
    kh, kw = _pair(kernel)
    ph, pw = _pair(pad)
    sh, sw = _pair(stride)
    dh, dw = _pair(dilation)
    oh, ow = out_hw
    total = n * c * oh * ow
    wide, head, strides = _index_args(out, x, _col_strides(n, c * kh * kw, oh * ow, batch_major),
                                      total)
    k = _fixed((kh, kw), (dh, dw))
    if k:
        name = f"im2col_fixed<{_CTYPE[dt]},{'long long' if wide else 'int'},{k}>"
        _launch(name, total, head + (x, _i32(c), _i32(h), _i32(w), _i32(ph), _i32(pw), _i32(sh),
                                     _i32(sw), _i32(oh), _i32(ow)) + strides + (out,),
                _fixed_function(name))
        return out
    _launch(_name_i("im2col_batch", dt, wide), total,
            head + (x, _i32(c), _i32(h), _i32(w), _i32(kh), _i32(kw), _i32(ph), _i32(pw),
                    _i32(sh), _i32(sw), _i32(dh), _i32(dw), _i32(oh), _i32(ow)) + strides + (out,))
    return out


def col2im(col, out, kernel, pad, stride, dilation, out_hw, batch_major=True):
    """col (either layout) -> out (N, C, H, W), overwritten."""
    dt = _check(col, out)
    n, c, h, w = out.shape
    kh, kw = _pair(kernel)
    ph, pw = _pair(pad)
    sh, sw = _pair(stride)
    dh, dw = _pair(dilation)
    oh, ow = out_hw
    total = n * c * h * w
    wide, head, strides = _index_args(col, out, _col_strides(n, c * kh * kw, oh * ow,
                                                             batch_major), total)
    k = _fixed((kh, kw), (dh, dw))
    if k:
        s1 = "true" if sh == sw == 1 else "false"
        name = f"col2im_fixed<{_CTYPE[dt]},{'long long' if wide else 'int'},{k},{s1}>"
        _launch(name, total, head + (col, _i32(c), _i32(h), _i32(w), _i32(ph), _i32(pw),
                                     _i32(sh), _i32(sw), _i32(oh), _i32(ow)) + strides + (out,),
                _fixed_function(name))
        return out
    _launch(_name_i("col2im_batch", dt, wide), total,
            head + (col, _i32(c), _i32(h), _i32(w), _i32(kh), _i32(kw), _i32(ph), _i32(pw),
                    _i32(sh), _i32(sw), _i32(dh), _i32(dw), _i32(oh), _i32(ow)) + strides + (out,))
    return out


# ------------------------------------------------------- outer transpose
def swap_outer(src, out, bias=None):
    """src (A, B, L) -> out (B, A, L), plus ``bias[a]`` (length A) when given."""
    dt = _check(src, out) if bias is None else _check(src, out, bias)
    a, b, l = src.shape
    if out.shape != (b, a, l):
        raise ValueError(f"swap_outer: out has shape {out.shape}, expected {(b, a, l)}")
    if bias is not None and bias.size != a:
        raise ValueError(f"swap_outer: bias has {bias.size} elements, expected {a}")
    if src.size == 0:
        return out
    threads = min(128, -(-(-(-l // 4)) // 32) * 32)    # 4 elements per thread, whole warps
    grid = (a * b, -(-l // (4 * threads)))
    if grid[1] > 65535:
        raise ValueError(f"swap_outer: rows of {l} elements are too long for one grid")
    fn = _module().get_function(_name_i("swap_outer", dt, src.size >= 1 << 31))
    fn(grid, (threads,), (src, _i32(a), _i32(b), _i32(l), src if bias is None else bias,
                          _i32(bias is not None), out))
    return out


# ----------------------------------------------------------------- pooling
def _pool_geometry(bottom_shape, top_shape, kernel, stride, pad):
    n, c, h, w = bottom_shape
    ph_, pw_ = top_shape[2], top_shape[3]
    kh, kw = _pair(kernel)
    sh, sw = _pair(stride)
    padh, padw = _pair(pad)
    return (_i32(h), _i32(w), _i32(ph_), _i32(pw_), _i32(kh), _i32(kw), _i32(sh), _i32(sw),
            _i32(padh), _i32(padw))


def max_pool_forward(bottom, top, mask, kernel, stride, pad):
    """top (N, C, PH, PW) and mask (int32 or the top's dtype) from bottom (N, C, H, W)."""
    dt = _check(bottom, top, mask)
    total = top.size
    geo = _pool_geometry(bottom.shape, top.shape, kernel, stride, pad)
    _launch(_name("max_pool_forward", dt, mask.dtype), total,
            (_i64(total), bottom) + geo + (top, mask))


def max_pool_backward(top_diff, mask, bottom_diff, kernel, stride, pad):
    dt = _check(top_diff, mask, bottom_diff)
    total = bottom_diff.size
    geo = _pool_geometry(bottom_diff.shape, top_diff.shape, kernel, stride, pad)
    _launch(_name("max_pool_backward", dt, mask.dtype), total,
            (_i64(total), top_diff, mask) + geo + (bottom_diff,))


def ave_pool_forward(bottom, top, kernel, stride, pad):
    dt = _check(bottom, top)
    total = top.size
    geo = _pool_geometry(bottom.shape, top.shape, kernel, stride, pad)
    _launch(_name("ave_pool_forward", dt), total, (_i64(total), bottom) + geo + (top,))


def ave_pool_backward(top_diff, bottom_diff, kernel, stride, pad):
    dt = _check(top_diff, bottom_diff)
    total = bottom_diff.size
    geo = _pool_geometry(bottom_diff.shape, top_diff.shape, kernel, stride, pad)
    _launch(_name("ave_pool_backward", dt), total, (_i64(total), top_diff) + geo + (bottom_diff,))


# --------------------------------------------------------------------- LRN
def _walk_name(kernel, dt, size, count):
    """The channel-walking LRN kernel for ``size`` (None: the per-element kernel)."""
    if size not in LRN_WALK_SIZES:
        return None
    return f"{kernel}<{_CTYPE[dt]},{'long long' if count >= 1 << 31 else 'int'},{size}>"


def lrn_across_forward(bottom, scale, top, size, alpha, beta, k):
    dt = _check(bottom, scale, top)
    n, c, h, w = bottom.shape
    total = bottom.size
    T = dt.type
    name = _walk_name("lrn_across_walk_forward", dt, size, total)
    if name and h * w < 1 << 31:
        it = _i64 if total >= 1 << 31 else _i32
        _launch(name, n * h * w, (it(n * h * w), bottom, _i32(c), _i32(h * w), T(alpha / size),
                                  T(k), T(-beta), scale, top), _fixed_function(name))
        return
    _launch(_name("lrn_across_forward", dt), total,
            (_i64(total), bottom, _i32(c), _i64(h * w), _i32(size), T(alpha / size), T(k),
             T(-beta), scale, top))


def lrn_across_backward(bottom, top, scale, top_diff, bottom_diff, size, alpha, beta):
    dt = _check(bottom, top, scale, top_diff, bottom_diff)
    n, c, h, w = bottom.shape
    total = bottom.size
    T = dt.type
    name = _walk_name("lrn_across_walk_backward", dt, size, total)
    if name and h * w < 1 << 31:
        it = _i64 if total >= 1 << 31 else _i32
        _launch(name, n * h * w, (it(n * h * w), bottom, top, scale, top_diff, _i32(c),
                                  _i32(h * w), T(-beta), T(2.0 * alpha * beta / size),
                                  bottom_diff), _fixed_function(name))
        return
    _launch(_name("lrn_across_backward", dt), total,
            (_i64(total), bottom, top, scale, top_diff, _i32(c), _i64(h * w), _i32(size),
             T(-beta), T(2.0 * alpha * beta / size), bottom_diff))


def lrn_within_forward(bottom, scale, top, size, alpha, beta):
    dt = _check(bottom, scale, top)
    n, c, h, w = bottom.shape
    total = bottom.size
    T = dt.type
    _launch(_name("lrn_within_forward", dt), total,
            (_i64(total), bottom, _i32(h), _i32(w), _i32(size), T(alpha / (size * size)),
             T(-beta), scale, top))


def lrn_within_backward(bottom, top, scale, top_diff, bottom_diff, size, alpha, beta):
    dt = _check(bottom, top, scale, top_diff, bottom_diff)
    n, c, h, w = bottom.shape
    total = bottom.size
    T = dt.type
    _launch(_name("lrn_within_backward", dt), total,
            (_i64(total), bottom, top, scale, top_diff, _i32(h), _i32(w), _i32(size),
             T(-beta), T(2.0 * alpha * beta / (size * size)), bottom_diff))
