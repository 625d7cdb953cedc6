"""A device-side wait: one CUDA thread that holds CuPy's current stream for a given time
while the host goes on issuing work behind it.  Timing with CUDA events measures the
device only when the work between the events is queued before the device reaches it;
a wait in front of the work lets the host queue it first (the profiler's head start,
the cuDNN graph API's engine search)."""
from __future__ import annotations

import numpy as np

_SOURCE = r"""
extern "C" __global__ void minicaffe_device_wait(const unsigned long long ns) {
  unsigned long long t0, t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t0));
  do {
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
  } while (t - t0 < ns);
}
"""
_kernel = None


def device_wait(cp, seconds: float):    # pragma: no cover - GPU machine only
    """Keep CuPy's current stream busy for ``seconds`` (one thread reading the device's
    nanosecond timer), without the host waiting: what is issued after it queues behind it."""
    global _kernel
    if _kernel is None:
        _kernel = cp.RawKernel(_SOURCE, "minicaffe_device_wait")
    _kernel((1,), (1,), (np.uint64(max(0, int(seconds * 1e9))),))
