"""Paired host A/B in one process (session 38): ResNet-152 (or NET) at K under `none`, CUDNN,
the solver's whole step; rounds alternate the code before 587b4f0 (RawModule.get_function on
every launch, the SGD tables' storage key through the blobs' views) and after, so the host's
drifting pace falls on both alike.  With ``old/ops.py`` beside this file (0086a97's), "old"
also restores the cuDNN library look-up per call (before 4e764f0) and the bound convolutions'
generator context manager (before af7306c): their methods, from that file, in ops'
namespace.  Prints each round's median step ms and the paired differences.
The old files are not kept in the tree (git has them); before a run:
    mkdir -p docs/results/tuner_s38/old
    git show 0086a97:minicaffe/cudnn/ops.py > docs/results/tuner_s38/old/ops.py
(call e also used ``git show 587b4f0~1:minicaffe/kernels/cuda_fused.py > old/cuda_fused.py``).  Usage: python3 ab_host.py NET K ROUNDS ITERS [bnrelu]
(bnrelu: the same rounds for Net.set_bn_relu_fusion on against off, with this code)"""
import os, statistics, sys, time
sys.path.insert(0, os.getcwd())
import cupy
from scripts import ps_scaling
from minicaffe import engine
from minicaffe.kernels import cuda_fused as cf
from minicaffe.solver import Solver

net, k, rounds, iters = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
AB = sys.argv[5] if len(sys.argv) > 5 else "code"   # "bnrelu": on ("new") against off
engine.set_default_engine("CUDNN")
work = "/tmp/ab"; os.makedirs(work, exist_ok=True)
solver = Solver(ps_scaling.write_solver(work, ps_scaling.write_net(work, net, k, "constant"),
                                        100000, False), mode="GPU", verbose=False)

new_fn, new_key = cf._fn, cf.MultiTensorSGD.storage_key
from minicaffe.cudnn import ops as _ops_now  # noqa: E402
new_handle = _ops_now._handle_on_device


def old_fn(kernel, dtype):
    return cf._module().get_function(cf._name(kernel, dtype))


def old_key(params, history):
    return tuple((cf._ptr(q.data), cf._ptr(q.diff), cf._ptr(h), q.count)
                 for q, h in zip(params, history))


from minicaffe.cudnn import ops
OLD_OPS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "old", "ops.py")
old_ops = {}
if os.path.exists(OLD_OPS):
    src = open(OLD_OPS).read()
    start = src.index("def _handle_on_device():")
    end = src.index("\n# ---", start)
    cls = src.index("class BoundConv:")
    cls_end = src.index("\ndef conv2d_backward_bias", cls)
    code = (src[start:end] + "\n" + src[cls:cls_end]).replace("class BoundConv:",
                                                            "class _OldBoundConv:")
    exec(compile(code, OLD_OPS, "exec"), vars(ops))     # noqa: S102  (0086a97's own code)
    old_ops = {"_handle_on_device": ops._handle_on_device}
    for m in ("forward", "backward_data", "backward_filter"):
        old_ops[m] = getattr(ops._OldBoundConv, m)
new_ops = {m: getattr(ops.BoundConv, m) for m in ("forward", "backward_data", "backward_filter")}
print("old ops methods:", "restored" if old_ops else "not found (cuda_fused only)", flush=True)


def use_ops(variant):
    if not old_ops:
        return
    if variant == "old":
        ops._handle_on_device = old_ops["_handle_on_device"]
        for m in new_ops:
            setattr(ops.BoundConv, m, old_ops[m])
    else:
        ops._handle_on_device = new_handle
        for m, f in new_ops.items():
            setattr(ops.BoundConv, m, f)


def use(variant):
    if AB == "bnrelu":           # the ReLU joined to the BatchNorm+Scale pairs: "new" = on
        solver.net.set_bn_relu_fusion(variant == "new")
        return
    use_ops(variant)
    cf._fn = new_fn if variant == "new" else old_fn
    cf.MultiTensorSGD.storage_key = staticmethod(new_key if variant == "new" else old_key)


def timed(n):
    out = []
    for _ in range(n):
        cupy.cuda.Device().synchronize()
        t = time.perf_counter()
        solver.step(1)
        cupy.cuda.Device().synchronize()
        out.append(1e3 * (time.perf_counter() - t))
    return statistics.median(out)


for v in ("new", "old", "new"):
    use(v); timed(10)                       # warm-up (cuDNN searches, both code paths)
res = {"new": [], "old": []}
for r in range(rounds):
    order = ("old", "new") if r % 2 else ("new", "old")
    for v in order:
        use(v)
        res[v].append(timed(iters))
    print(f"round {r}: new {res['new'][-1]:.1f} ms, old {res['old'][-1]:.1f} ms", flush=True)
d = [o - n for n, o in zip(res["new"], res["old"])]
print(f"{net} at {k}: new median {statistics.median(res['new']):.2f} ms, old "
      f"{statistics.median(res['old']):.2f} ms; old - new per round: median "
      f"{statistics.median(d):.2f} ms (min {min(d):.2f}, max {max(d):.2f}, "
      f"{sum(x > 0 for x in d)} of {len(d)} rounds faster new)")
