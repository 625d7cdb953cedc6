"""Prepared in session 41, not yet run: what a convolution costs the host through cuDNN's graph
(backend) API with the execution plan built once, against the legacy call minicaffe makes
today (`BoundConv`, 23-64 us per call on the H200's host in session 41, `../tuner_s41/
conv_host.py`).  Per shape and direction: the operation graph, engine configurations from the
heuristics (mode INSTANT), every one that finalizes as an execution plan (its workspace, its
numerical notes, its device time), and for the fastest one the host's time per call when the
variant pack is kept (pointers unchanged, as a layer's blobs are from one iteration to the
next under minicaffe's arena) and when it is built for every call; the output against the
legacy call's.  Enum values from cuDNN 9's cudnn_graph.h.  Usage: python3 backend_probe.py [N]"""
import ctypes, statistics, sys, time
from ctypes import byref, c_double, c_float, c_int, c_int64, c_void_p
import numpy as np
import cupy
from minicaffe.cudnn import lib as L
from minicaffe.cudnn import ops

N = int(sys.argv[1]) if len(sys.argv) > 1 else 200
# cudnnBackendDescriptorType_t
D_CONV, D_ENGINE, D_ENGINECFG, D_HEUR, D_PLAN = 1, 2, 3, 4, 5
D_OP = {"fwd": 10, "bwd_filter": 11, "bwd_data": 12}
D_GRAPH, D_PACK, D_TENSOR = 15, 16, 17
# cudnnBackendAttributeType_t
T_HANDLE, T_DATA_TYPE, T_INT64, T_FLOAT, T_DOUBLE, T_VOID_PTR = 0, 1, 3, 4, 5, 6
T_CONV_MODE, T_HEUR_MODE, T_NOTE, T_DESC = 7, 8, 11, 15
# cudnnBackendAttributeName_t
A_CONV_COMP, A_CONV_MODE, A_CONV_DIL, A_CONV_STRIDE, A_CONV_POST, A_CONV_PRE, A_CONV_DIMS = range(100, 107)
A_HEUR_MODE, A_HEUR_GRAPH, A_HEUR_RESULTS = 200, 201, 202
A_CFG_ENGINE = 300
A_PLAN_HANDLE, A_PLAN_CFG, A_PLAN_WS = 400, 401, 402
# per op: alpha, beta, conv desc, then its three tensors in the header's order
A_OP = {"fwd": dict(alpha=700, beta=701, conv=702, w=703, x=704, y=705),
        "bwd_data": dict(alpha=706, beta=707, conv=708, w=709, dx=710, dy=711),
        "bwd_filter": dict(alpha=712, beta=713, conv=714, dw=715, x=716, dy=717)}
A_GRAPH_HANDLE, A_GRAPH_OPS = 800, 801
A_T_ALIGN, A_T_DTYPE, A_T_DIMS, A_T_STRIDES, A_T_UID = 900, 901, 902, 903, 906
A_PACK_UIDS, A_PACK_PTRS, A_PACK_WS = 1000, 1001, 1003
A_ENGINE_NOTE = 1303
HEUR_INSTANT, DATA_FLOAT, CROSS_CORRELATION = 0, 0, 1
NOTES = ["TENSOR_CORE", "DOWN_CONVERT_INPUTS", "REDUCED_PRECISION_REDUCTION", "FFT",
         "NONDETERMINISTIC", "WINOGRAD", "WINOGRAD_4x4", "WINOGRAD_6x6", "WINOGRAD_13x13",
         "STRICT_NAN_PROP"]

lib = L.load()
C = lib._cdll
for name in ("cudnnBackendCreateDescriptor", "cudnnBackendDestroyDescriptor",
             "cudnnBackendFinalize", "cudnnBackendSetAttribute", "cudnnBackendGetAttribute",
             "cudnnBackendExecute"):
    getattr(C, name).restype = c_int
C.cudnnBackendCreateDescriptor.argtypes = [c_int, ctypes.POINTER(c_void_p)]
C.cudnnBackendDestroyDescriptor.argtypes = [c_void_p]
C.cudnnBackendFinalize.argtypes = [c_void_p]
C.cudnnBackendSetAttribute.argtypes = [c_void_p, c_int, c_int, c_int64, c_void_p]
C.cudnnBackendGetAttribute.argtypes = [c_void_p, c_int, c_int, c_int64,
                                       ctypes.POINTER(c_int64), c_void_p]
C.cudnnBackendExecute.argtypes = [c_void_p, c_void_p, c_void_p]


def ok(status, what):
    if status != 0:
        raise RuntimeError(f"{what}: cuDNN status {status}")


def create(kind):
    d = c_void_p()
    ok(C.cudnnBackendCreateDescriptor(kind, byref(d)), f"create {kind}")
    return d


def put(desc, name, typ, values):
    """Set an attribute from a list of Python values of one type."""
    ctype = {T_INT64: c_int64, T_FLOAT: c_float, T_DOUBLE: c_double, T_DATA_TYPE: c_int,
             T_CONV_MODE: c_int, T_HEUR_MODE: c_int, T_HANDLE: c_void_p, T_DESC: c_void_p,
             T_VOID_PTR: c_void_p}[typ]
    arr = (ctype * len(values))(*values)
    ok(C.cudnnBackendSetAttribute(desc, name, typ, len(values), ctypes.cast(arr, c_void_p)),
       f"set attribute {name}")


def tensor(uid, shape):
    t = create(D_TENSOR)
    strides = [int(np.prod(shape[i + 1:])) for i in range(len(shape))]
    put(t, A_T_DTYPE, T_DATA_TYPE, [DATA_FLOAT])
    put(t, A_T_DIMS, T_INT64, list(shape))
    put(t, A_T_STRIDES, T_INT64, strides)
    put(t, A_T_UID, T_INT64, [uid])
    put(t, A_T_ALIGN, T_INT64, [16])
    ok(C.cudnnBackendFinalize(t), "tensor")
    return t


def plans(direction, xs, ws, ys, pad, stride, handle, limit=8):
    """Execution plans (plan, workspace bytes, notes) of the heuristics' configurations."""
    conv = create(D_CONV)
    put(conv, A_CONV_COMP, T_DATA_TYPE, [DATA_FLOAT])
    put(conv, A_CONV_MODE, T_CONV_MODE, [CROSS_CORRELATION])
    put(conv, A_CONV_DIMS, T_INT64, [2])
    put(conv, A_CONV_DIL, T_INT64, [1, 1])
    put(conv, A_CONV_STRIDE, T_INT64, [stride, stride])
    put(conv, A_CONV_PRE, T_INT64, [pad, pad])
    put(conv, A_CONV_POST, T_INT64, [pad, pad])
    ok(C.cudnnBackendFinalize(conv), "convolution")
    x, w, y = tensor(1, xs), tensor(2, ws), tensor(3, ys)
    a = A_OP[direction]
    op = create(D_OP[direction])
    names = {"fwd": (("x", x), ("w", w), ("y", y)), "bwd_data": (("dx", x), ("w", w), ("dy", y)),
             "bwd_filter": (("x", x), ("dw", w), ("dy", y))}[direction]
    for key, t in names:
        put(op, a[key], T_DESC, [t.value])
    put(op, a["conv"], T_DESC, [conv.value])
    put(op, a["alpha"], T_FLOAT, [1.0])
    put(op, a["beta"], T_FLOAT, [0.0])
    ok(C.cudnnBackendFinalize(op), f"operation {direction}")
    graph = create(D_GRAPH)
    put(graph, A_GRAPH_HANDLE, T_HANDLE, [handle])
    put(graph, A_GRAPH_OPS, T_DESC, [op.value])
    ok(C.cudnnBackendFinalize(graph), "operation graph")
    heur = create(D_HEUR)
    put(heur, A_HEUR_GRAPH, T_DESC, [graph.value])
    put(heur, A_HEUR_MODE, T_HEUR_MODE, [HEUR_INSTANT])
    ok(C.cudnnBackendFinalize(heur), "heuristics")
    cfgs = [create(D_ENGINECFG) for _ in range(limit)]
    arr = (c_void_p * limit)(*[c.value for c in cfgs])
    n = c_int64()
    ok(C.cudnnBackendGetAttribute(heur, A_HEUR_RESULTS, T_DESC, limit, byref(n),
                                  ctypes.cast(arr, c_void_p)), "heuristics results")
    out = []
    for cfg in cfgs[:n.value]:
        plan = create(D_PLAN)
        put(plan, A_PLAN_HANDLE, T_HANDLE, [handle])
        put(plan, A_PLAN_CFG, T_DESC, [cfg.value])
        if C.cudnnBackendFinalize(plan) != 0:
            continue
        ws_bytes = c_int64()
        ok(C.cudnnBackendGetAttribute(plan, A_PLAN_WS, T_INT64, 1, byref(n), byref(ws_bytes)),
           "workspace size")
        eng = create(D_ENGINE)
        engs = (c_void_p * 1)(eng.value)
        ok(C.cudnnBackendGetAttribute(cfg, A_CFG_ENGINE, T_DESC, 1, byref(n),
                                      ctypes.cast(engs, c_void_p)), "engine")
        notes = (c_int * 16)()
        C.cudnnBackendGetAttribute(eng, A_ENGINE_NOTE, T_NOTE, 16, byref(n),
                                   ctypes.cast(notes, c_void_p))
        out.append((plan, ws_bytes.value, [NOTES[i] for i in notes[:n.value] if i < len(NOTES)]))
    return out


def pack(ptrs, ws_ptr):
    p = create(D_PACK)
    put(p, A_PACK_UIDS, T_INT64, [1, 2, 3])
    put(p, A_PACK_PTRS, T_VOID_PTR, ptrs)
    put(p, A_PACK_WS, T_VOID_PTR, [ws_ptr])
    ok(C.cudnnBackendFinalize(p), "variant pack")
    return p


def per_call(fn):
    out = []
    for _ in range(5):
        cupy.cuda.Device().synchronize()
        t0 = time.perf_counter()
        for _ in range(N):
            fn()
        out.append(1e6 * (time.perf_counter() - t0) / N)
    cupy.cuda.Device().synchronize()
    return statistics.median(out)


def device_us(fn, n=20):
    e0, e1 = cupy.cuda.Event(), cupy.cuda.Event()
    e0.record()
    for _ in range(n):
        fn()
    e1.record(); e1.synchronize()
    return 1e3 * cupy.cuda.get_elapsed_time(e0, e1) / n


SHAPES = [("1x1 1024->256 14x14", (16, 1024, 14, 14), (256, 1024, 1, 1), 0, 1),
          ("3x3 256->256 14x14", (16, 256, 14, 14), (256, 256, 3, 3), 1, 1),
          ("1x1 256->1024 14x14", (16, 256, 14, 14), (1024, 256, 1, 1), 0, 1),
          ("3x3 64->64 56x56", (16, 64, 56, 56), (64, 64, 3, 3), 1, 1)]
_, handle, _ = ops._handle_on_device()
ws_buf = cupy.empty(512 << 20, np.uint8)
for name, xs, wsh, pad, stride in SHAPES:
    bc = ops.BoundConv(xs, wsh, pad, stride)
    ys = bc.geom.y_shape
    x = cupy.random.rand(*xs, dtype=np.float32); w = cupy.random.rand(*wsh, dtype=np.float32)
    dy = cupy.random.rand(*ys, dtype=np.float32)
    ref = {"fwd": lambda: bc.forward(x, w, None, cupy.empty(ys, np.float32), ws_buf),
           "bwd_data": lambda: bc.backward_data(w, dy, cupy.empty(xs, np.float32), ws_buf),
           "bwd_filter": lambda: bc.backward_filter(x, dy, cupy.zeros(wsh, np.float32), ws_buf,
                                                    accumulate=False)}
    for direction in ("fwd", "bwd_data", "bwd_filter"):
        want = ref[direction]()
        out = cupy.empty_like(want)
        ptrs = {"fwd": [x.data.ptr, w.data.ptr, out.data.ptr],
                "bwd_data": [out.data.ptr, w.data.ptr, dy.data.ptr],
                "bwd_filter": [x.data.ptr, out.data.ptr, dy.data.ptr]}[direction]
        try:
            found = plans(direction, xs, wsh, ys, pad, stride, handle)
        except RuntimeError as e:
            print(name, direction, "refused:", e, flush=True)
            continue
        rows = []
        for plan, wsb, notes in found:
            if wsb > ws_buf.nbytes:
                continue
            vp = pack(ptrs, ws_buf.data.ptr)
            run = (lambda plan=plan, vp=vp: ok(C.cudnnBackendExecute(handle, plan, vp), "execute"))
            run()
            rows.append((device_us(run), plan, vp, wsb, notes))
        if not rows:
            print(name, direction, "no plan finalized", flush=True)
            continue
        rows.sort(key=lambda r: r[0])
        dev, plan, vp, wsb, notes = rows[0]
        C.cudnnBackendExecute(handle, plan, vp); cupy.cuda.Device().synchronize()
        err = float(cupy.abs(out - want).max() / (cupy.abs(want).max() + 1e-30))

        def fresh():
            p = pack(ptrs, ws_buf.data.ptr)
            C.cudnnBackendExecute(handle, plan, p)
            C.cudnnBackendDestroyDescriptor(p)
        legacy = {"fwd": lambda: bc.forward(x, w, None, want, ws_buf),
                  "bwd_data": lambda: bc.backward_data(w, dy, want, ws_buf),
                  "bwd_filter": lambda: bc.backward_filter(x, dy, want, ws_buf)}[direction]
        print(f"{name} {direction}: {len(found)} plans; fastest {dev:.1f} us on the device "
              f"(legacy {device_us(legacy):.1f}), workspace {wsb >> 10} KiB, notes {notes}; host "
              f"per call: kept pack {per_call(lambda: C.cudnnBackendExecute(handle, plan, vp)):.1f} "
              f"us, new pack {per_call(fresh):.1f} us, legacy {per_call(legacy):.1f} us; "
              f"max rel err vs legacy {err:.2e}", flush=True)
