"""Helpers for the parameter-server tests: real processes on 127.0.0.1.

Every process started through the ``procs`` fixture is killed at teardown,
whatever the test did; servers bind free ports (``tcp://127.0.0.1:*``) and
report them through ``--endpoint-file``.
"""
import os
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
from ps_batches import hook_batch  # noqa: F401  (the tests import it from here)

ROOT = Path(__file__).resolve().parents[2]
HERE = Path(__file__).resolve().parent

# A tiny regression net: Input tops fed by a data hook (see worker_proc.py).
INPUT_NET = """
name: "tiny"
layer {{ name: "data" type: "Input" top: "data" top: "target"
        input_param {{ shape {{ dim: {k} dim: 4 }} shape {{ dim: {k} dim: 2 }} }} }}
layer {{ name: "ip1" type: "InnerProduct" bottom: "data" top: "ip1"
        param {{ lr_mult: 1 decay_mult: 1 }} param {{ lr_mult: 2 decay_mult: 0 }}
        inner_product_param {{ num_output: 6 weight_filler {{ type: "xavier" }}
                               bias_filler {{ type: "constant" value: 0.1 }} }} }}
layer {{ name: "relu" type: "ReLU" bottom: "ip1" top: "ip1" }}
layer {{ name: "ip2" type: "InnerProduct" bottom: "ip1" top: "ip2"
        inner_product_param {{ num_output: 2 weight_filler {{ type: "xavier" }} }} }}
layer {{ name: "loss" type: "EuclideanLoss" bottom: "ip2" bottom: "target" top: "loss" }}
"""

# The same net reading an HDF5 file (rows in order, no shuffle).
HDF5_NET = """
name: "tiny_h5"
layer {{ name: "data" type: "HDF5Data" top: "data" top: "target"
        hdf5_data_param {{ source: "{source}" batch_size: {k} }} }}
layer {{ name: "ip1" type: "InnerProduct" bottom: "data" top: "ip1"
        param {{ lr_mult: 1 decay_mult: 1 }} param {{ lr_mult: 2 decay_mult: 0 }}
        inner_product_param {{ num_output: 6 weight_filler {{ type: "xavier" }}
                               bias_filler {{ type: "constant" value: 0.1 }} }} }}
layer {{ name: "relu" type: "ReLU" bottom: "ip1" top: "ip1" }}
layer {{ name: "ip2" type: "InnerProduct" bottom: "ip1" top: "ip2"
        inner_product_param {{ num_output: 2 weight_filler {{ type: "xavier" }} }} }}
layer {{ name: "loss" type: "EuclideanLoss" bottom: "ip2" bottom: "target" top: "loss" }}
"""

SOLVER = """
net: "{net}"
base_lr: 0.05
momentum: 0.9
weight_decay: 0.01
lr_policy: "step"
gamma: 0.5
stepsize: 4
max_iter: {max_iter}
display: {display}
snapshot: {snapshot}
snapshot_prefix: "{prefix}"
random_seed: 7
solver_mode: CPU
"""


def write_solver(tmp, name, net_text, k, max_iter=10, snapshot=0, display=0, prefix=None, **fmt):
    """Write NAME.prototxt (net at batch k) and NAME_solver.prototxt; returns the solver path."""
    tmp = Path(tmp)
    net = tmp / f"{name}.prototxt"
    net.write_text(net_text.format(k=k, **fmt))
    solver = tmp / f"{name}_solver.prototxt"
    solver.write_text(SOLVER.format(net=net, max_iter=max_iter, display=display, snapshot=snapshot,
                                    prefix=prefix or (tmp / "snap" / name)))
    return str(solver)


def write_hdf5(tmp, rows=32, seed=3):
    """An HDF5 source of ``rows`` (data (rows, 4), target (rows, 2)); returns the list file."""
    h5py = pytest.importorskip("h5py")
    rng = np.random.default_rng(seed)
    path = Path(tmp) / "train.h5"
    with h5py.File(path, "w") as f:
        f["data"] = rng.normal(size=(rows, 4)).astype(np.float32)
        f["target"] = rng.normal(size=(rows, 2)).astype(np.float32)
    lst = Path(tmp) / "train.txt"
    lst.write_text(f"{path}\n")
    return str(lst)


def env():
    e = dict(os.environ)
    e["PYTHONPATH"] = str(ROOT) + os.pathsep + e.get("PYTHONPATH", "")
    e["PYTHONUNBUFFERED"] = "1"
    return e


class Proc:
    def __init__(self, name, args, log_path):
        self.name = name
        self.log_path = Path(log_path)
        self._log = open(self.log_path, "w")
        self.popen = subprocess.Popen(args, cwd=ROOT, env=env(), stdout=self._log,
                                      stderr=subprocess.STDOUT)
        self.endpoint = None

    def log(self) -> str:
        self._log.flush()
        return self.log_path.read_text()

    def wait(self, timeout):
        try:
            return self.popen.wait(timeout)
        finally:
            self._log.flush()

    def kill(self):
        if self.popen.poll() is None:
            self.popen.kill()
            self.popen.wait(10)
        self._log.close()


class Procs:
    """Processes of one test; every one is killed at teardown."""

    def __init__(self, tmp):
        self.tmp = Path(tmp)
        self.all = []

    def start(self, name, args):
        p = Proc(name, [sys.executable] + list(args), self.tmp / f"{name}.log")
        self.all.append(p)
        return p

    def server(self, shard, world_size, timeout=10.0, extra=(), name=None):
        """``python -m ps server`` on a free loopback port; waits for its endpoint."""
        name = name or f"shard{shard}"
        ep_file = self.tmp / f"{name}.endpoint"
        if ep_file.exists():
            ep_file.unlink()
        p = self.start(name, ["-m", "ps", "server", "--shard", str(shard), "--world-size",
                              str(world_size), "--timeout", str(timeout), "--bind",
                              "tcp://127.0.0.1:*", "--endpoint-file", str(ep_file), *extra])
        deadline = time.monotonic() + 20
        while not ep_file.exists():
            if p.popen.poll() is not None or time.monotonic() > deadline:
                raise AssertionError(f"{name} did not start:\n{p.log()}")
            time.sleep(0.02)
        p.endpoint = ep_file.read_text().strip()
        return p

    def worker_api(self, name, solver, endpoints, rank, world_size, out, timeout=10.0,
                   extra=()):
        """tests/ps/worker_proc.py: the Python API with an Input data hook."""
        return self.start(name, [str(HERE / "worker_proc.py"), solver, ",".join(endpoints),
                                 str(rank), str(world_size), str(out), str(timeout), *extra])

    def train(self, name, args):
        """``python -m minicaffe train ...``."""
        return self.start(name, ["-m", "minicaffe", "train", *args])

    def wait_all(self, procs, timeout):
        """Exit codes of ``procs``, failing with their logs if one outlives ``timeout``."""
        deadline = time.monotonic() + timeout
        codes = []
        for p in procs:
            try:
                codes.append(p.wait(max(0.1, deadline - time.monotonic())))
            except subprocess.TimeoutExpired:
                logs = "\n".join(f"--- {q.name}\n{q.log()[-3000:]}" for q in procs)
                raise AssertionError(f"{p.name} still running after {timeout} s\n{logs}")
        return codes

    def kill_all(self):
        for p in self.all:
            p.kill()


@pytest.fixture
def procs(tmp_path):
    group = Procs(tmp_path)
    try:
        yield group
    finally:
        group.kill_all()


def logs(*procs):
    return "\n".join(f"--- {p.name} (exit {p.popen.returncode})\n{p.log()}" for p in procs)


def caffemodel_params(path):
    """{layer name: [arrays]} of a .caffemodel."""
    from minicaffe.proto import caffe_pb2, read_binary
    net = read_binary(str(path), caffe_pb2.NetParameter)
    out = {}
    for layer in net.layer:
        if len(layer.blobs):
            out[layer.name] = [np.asarray(b.data, dtype=np.float32).reshape(tuple(b.shape.dim))
                               for b in layer.blobs]
    return out
