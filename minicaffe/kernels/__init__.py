"""Array kernels: generic NumPy/CuPy code and guarded CUDA fast paths."""
