"""CPU and GPU training agree: 20 SGD iterations of the digits LeNet and of
ResNet-50 (batch 2) give the same losses within float32 tolerance.

Both runs start from the same seed, so they draw the same weights and the same
DummyData batches on the host; only the arithmetic differs (NumPy vs CuPy
kernels, different summation orders), and that difference must stay at
float32 rounding level over 20 updates.  Set MINICAFFE_GPU_REPORT to a file
path to append the measured differences as JSON lines.
"""
import json
import os
import sys

import numpy as np
import pytest

from minicaffe.proto import caffe_pb2
from minicaffe.solver import Solver

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, REPO)


def _losses(net_param, mode, iters, base_lr, momentum=0.9, inputs=None, dtype=np.float32):
    p = caffe_pb2.SolverParameter(base_lr=base_lr, momentum=momentum, weight_decay=5e-4,
                                  lr_policy="fixed", max_iter=iters, display=0, random_seed=1)
    p.net_param.CopyFrom(net_param)
    s = Solver(p, mode=mode, verbose=False, dtype=dtype)
    for name, value in (inputs or {}).items():
        s.net.blobs[name].data[...] = s.net.xp.asarray(value, dtype=dtype)
    out = []
    for _ in range(iters):
        s.step(1)
        out.append(float(s.last_loss))
    for layer in s.net.layers:
        if hasattr(layer, "close"):
            layer.close()
    return np.array(out)


def _report(name, cpu, gpu, floor=1e-12):
    """Relative loss differences; ``floor`` keeps a loss trained close to 0 from
    turning rounding noise into a large ratio."""
    rel = np.abs(cpu - gpu) / np.maximum(np.abs(cpu), floor)
    path = os.environ.get("MINICAFFE_GPU_REPORT")
    if path:
        with open(path, "a") as f:
            f.write(json.dumps({"test": name, "cpu": cpu.tolist(), "gpu": gpu.tolist(),
                                "max_rel_diff": float(rel.max())}) + "\n")
    return rel


@pytest.mark.gpu
def test_lenet_digits_same_losses_cpu_gpu(tmp_path):
    from scripts.gen_prototxt import digits
    from minicaffe.tools.make_digits import make_digits
    make_digits(str(tmp_path / "digits"))
    net = digits(data="lmdb", data_dir=str(tmp_path / "digits"))
    cpu = _losses(net, "CPU", 20, base_lr=0.01)
    gpu = _losses(net, "GPU", 20, base_lr=0.01)
    rel = _report("lenet_digits", cpu, gpu)
    assert cpu[-1] < cpu[0]  # it trains
    assert rel.max() <= 1e-4, (cpu, gpu)


@pytest.mark.gpu
def test_resnet50_batch2_same_losses_cpu_gpu():
    """ResNet-50 at batch 2 is ill-conditioned in float32: BatchNorm's backward over
    two images nearly cancels the gradient after global pooling, so float32 and
    float64 gradients differ by about 2.6 % (measured) and any two float32
    implementations drift apart over 20 SGD steps at that scale.  "Within float32
    tolerance" is therefore measured against float32 itself: the first losses
    (same weights, same data) agree to 1e-5, and over 20 steps the GPU stays as
    close to the CPU as the CPU's float32 run stays to its float64 run (x3)."""
    # Input layer fed with fixed random images and random labels: with DummyData's
    # constant label the loss collapses to 0 in four steps and compares nothing.
    from scripts.bench_throughput import minicaffe_net_param
    net = minicaffe_net_param("resnet50", 2, "CAFFE")
    rng = np.random.default_rng(0)
    inputs = {"data": rng.standard_normal((2, 3, 224, 224)),
              "label": np.array([3.0, 711.0])}
    # lr 1e-4: the loss falls smoothly from 7.2 to about 0.03 in 20 steps (measured on CPU)
    cpu = _losses(net, "CPU", 20, base_lr=1e-4, inputs=inputs)
    gpu = _losses(net, "GPU", 20, base_lr=1e-4, inputs=inputs)
    ref = _losses(net, "CPU", 20, base_lr=1e-4, inputs=inputs, dtype=np.float64)
    assert cpu[-1] < 0.5 * cpu[0]  # it trains (memorises the two images)
    rel = _report("resnet50_b2", cpu, gpu)
    drift64 = np.abs(cpu - ref).max()
    path = os.environ.get("MINICAFFE_GPU_REPORT")
    if path:
        with open(path, "a") as f:
            f.write(json.dumps({"test": "resnet50_b2_f64", "f64": ref.tolist(),
                                "max_abs_cpu32_vs_f64": float(drift64),
                                "max_abs_gpu_vs_cpu32": float(np.abs(cpu - gpu).max())}) + "\n")
    assert np.all(np.isfinite(cpu)) and np.all(np.isfinite(gpu))
    assert rel[0] <= 1e-5, (cpu[0], gpu[0])
    assert np.abs(cpu - gpu).max() <= 3 * drift64 + 1e-5, (cpu, gpu, ref)
