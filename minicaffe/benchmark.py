"""pycaffe's ``caffe.Timer``: Caffe's Timer (include/caffe/util/benchmark.hpp).

``start()`` starts it unless it is running, ``stop()`` stops it if it is, and ``ms`` is the
time between the last start and stop in milliseconds, stopping a running timer first.  A
timer never started reads 0 (Caffe logs a warning).  In GPU mode Caffe times with CUDA
events on the default stream, so ``ms`` covers the kernels queued between the two calls;
minicaffe does the same on the current stream when the default mode is GPU.
"""
from __future__ import annotations

import time

from .backend import GPU, cupy_module, default_mode
from .log import log


class Timer:
    def __init__(self):
        self._running = False
        self._has_run = False
        self._gpu = False
        self._start = self._stop = None
        self._elapsed_ms = 0.0

    @property
    def running(self) -> bool:
        return self._running

    def start(self):
        if self._running:
            return
        self._gpu = default_mode() == GPU
        if self._gpu:
            cp = cupy_module()
            self._start, self._stop = cp.cuda.Event(), cp.cuda.Event()
            self._start.record()
        else:
            self._start = time.perf_counter()
        self._running = True
        self._has_run = True

    def stop(self):
        if not self._running:
            return
        if self._gpu:
            self._stop.record()
        else:
            self._stop = time.perf_counter()
        self._running = False

    @property
    def ms(self) -> float:
        """Milliseconds from the last start to the last stop (Timer::MilliSeconds)."""
        if not self._has_run:
            log("Timer has never been run before reading time.", level="W")
            return 0.0
        if self._running:
            self.stop()
        if self._gpu:
            # waits for the kernels queued before stop() (cudaEventSynchronize)
            self._stop.synchronize()
            self._elapsed_ms = float(cupy_module().cuda.get_elapsed_time(self._start,
                                                                         self._stop))
        else:
            self._elapsed_ms = (self._stop - self._start) * 1e3
        return self._elapsed_ms
