"""Session 41: the host's time per convolution call (what the profile's host issue is made of):
minicaffe's BoundConv (cuDNN 9's legacy API through ctypes), the bare ctypes call, a ctypes call
that does nothing in cuDNN (cudnnGetVersion), and PyTorch's conv2d / convolution_backward at the
same shape (cuDNN through its graph API, plans cached).  N calls each, perf_counter, median of
5 repeats, us per call.  Usage: python3 conv_host.py [N]"""
import statistics, sys, time
import numpy as np
import cupy
import torch
from minicaffe.cudnn import ops
from minicaffe.cudnn import lib as L

N = int(sys.argv[1]) if len(sys.argv) > 1 else 200
torch.backends.cudnn.benchmark = True
SHAPES = [("1x1 1024->256 14x14", (16, 1024, 14, 14), (256, 1024, 1, 1), 0, 1),
          ("3x3 256->256 14x14", (16, 256, 14, 14), (256, 256, 3, 3), 1, 1),
          ("1x1 256->1024 14x14", (16, 256, 14, 14), (1024, 256, 1, 1), 0, 1),
          ("3x3 64->64 56x56", (16, 64, 56, 56), (64, 64, 3, 3), 1, 1)]


def per_call(fn):
    out = []
    for _ in range(5):
        cupy.cuda.Device().synchronize(); torch.cuda.synchronize()
        t0 = time.perf_counter()
        for _ in range(N):
            fn()
        t1 = time.perf_counter()
        out.append(1e6 * (t1 - t0) / N)
    cupy.cuda.Device().synchronize(); torch.cuda.synchronize()
    return statistics.median(out)


lib = L.load()
print(f"ctypes cudnnGetVersion: {per_call(lib.cudnnGetVersion):.2f} us")
for name, xs, ws, pad, stride in SHAPES:
    x = cupy.random.rand(*xs, dtype=np.float32); w = cupy.random.rand(*ws, dtype=np.float32)
    bc = ops.BoundConv(xs, ws, pad, stride)
    y = cupy.empty(bc.geom.y_shape, np.float32); dy = cupy.random.rand(*y.shape, dtype=np.float32)
    dx = cupy.empty_like(x); dw = cupy.zeros_like(w)
    ws_buf = cupy.empty(256 << 20, np.uint8)
    bc.forward(x, w, None, y, ws_buf); bc.backward_data(w, dy, dx, ws_buf); bc.backward_filter(x, dy, dw, ws_buf)
    r = {"fwd": per_call(lambda: bc.forward(x, w, None, y, ws_buf)),
         "bwd_data": per_call(lambda: bc.backward_data(w, dy, dx, ws_buf)),
         "bwd_filter": per_call(lambda: bc.backward_filter(x, dy, dw, ws_buf))}
    lib_, h, plan, c = bc._ready(ops.FWD, {"x": x, "w": w, "y": y}, ws_buf)
    one, zero = ops._SCALARS[np.dtype(np.float32)]
    r["raw_fwd"] = per_call(lambda: lib_.cudnnConvolutionForward(
        h, one, plan.x.ptr, x.data.ptr, plan.w.ptr, w.data.ptr, plan.conv[ops.FWD].ptr, c.algo,
        ws_buf.data.ptr, ws_buf.nbytes, zero, plan.y.ptr, y.data.ptr))
    tx = torch.rand(*xs, device="cuda"); tw = torch.rand(*ws, device="cuda")
    ty = torch.nn.functional.conv2d(tx, tw, None, stride, pad); tdy = torch.rand_like(ty)
    for _ in range(3):
        torch.nn.functional.conv2d(tx, tw, None, stride, pad)
        torch.ops.aten.convolution_backward(tdy, tx, tw, None, [stride] * 2, [pad] * 2, [1, 1],
                                            False, [0, 0], 1, [True, True, False])
    with torch.no_grad():
        r["torch_fwd"] = per_call(lambda: torch.nn.functional.conv2d(tx, tw, None, stride, pad))
        r["torch_bwd_both"] = per_call(lambda: torch.ops.aten.convolution_backward(
            tdy, tx, tw, None, [stride] * 2, [pad] * 2, [1, 1], False, [0, 0], 1, [True, True, False]))
    # device time per forward (CUDA events), to see the loop was host-paced
    e0, e1 = cupy.cuda.Event(), cupy.cuda.Event()
    e0.record()
    for _ in range(20):
        bc.forward(x, w, None, y, ws_buf)
    e1.record(); e1.synchronize()
    r["device_fwd"] = 1e3 * cupy.cuda.get_elapsed_time(e0, e1) / 20
    print(name, " ".join(f"{k} {v:.1f}" for k, v in r.items()), "algo", c.algo, flush=True)
