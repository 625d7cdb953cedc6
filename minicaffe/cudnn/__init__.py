"""The CUDNN engine's library: a thin ctypes binding to cuDNN 9's legacy API.

``lib`` finds and loads ``libcudnn.so.9`` (``$MINICAFFE_CUDNN_PATH``, a copy
already loaded in the process, the ``nvidia-cudnn-cu13`` wheel on
``sys.path``, the system loader) and declares the prototypes; ``ops`` holds
the operations the layers call on CuPy arrays (convolution with cached
algorithm choice, pooling, LRN, softmax).  Importing this package needs
neither CuPy nor a GPU nor cuDNN: :func:`available` says whether the engine
can run here, and every op raises a clear error where it cannot.
"""
from .lib import (CudnnError, CudnnNotFound, CudnnUnsupported, available, library_path,
                  load_report, version)
from .ops import (AVE, MAX, AlgoChoice, algo_cache_info, caffe_pooled_size, clear_cache,
                  conv2d_backward_bias, conv2d_backward_data, conv2d_backward_filter,
                  conv2d_forward, conv_algorithms, conv_geometry, conv_workspace_bytes, conv_workspace_estimate,
                  lrn_backward, lrn_forward, lrn_supported, pool2d_backward, pool2d_forward,
                  pool2d_supported, release_workspaces, softmax_backward, softmax_forward,
                  workspace_limit)

__all__ = [
    "CudnnError", "CudnnNotFound", "CudnnUnsupported", "available", "library_path",
    "load_report", "version",
    "AVE", "MAX", "AlgoChoice", "algo_cache_info", "caffe_pooled_size", "clear_cache",
    "conv2d_backward_bias", "conv2d_backward_data", "conv2d_backward_filter", "conv2d_forward",
    "conv_algorithms", "conv_geometry", "conv_workspace_bytes", "conv_workspace_estimate", "lrn_backward", "lrn_forward",
    "lrn_supported", "pool2d_backward", "pool2d_forward", "pool2d_supported",
    "release_workspaces", "softmax_backward", "softmax_forward", "workspace_limit",
]
