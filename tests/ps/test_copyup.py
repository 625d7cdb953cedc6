"""When a worker copies the parameter server's answers into its net (ps/copyup.py), on
the CPU: the mode's choice, the layer each bucket must be up before, and the copy
thread's round (nothing reaches the net before ``go``; a waiter returns only once its
buckets are in; a failing thread is reported, not hung on).  The end-to-end runs are in
test_overlap.py (``copy_up`` cases, bit for bit the path without overlap)."""

import threading
import time

import numpy as np
import pytest

from ps.copyup import COPY_UP_MODES, CopyError, CopyUp, copy_up_mode, forward_needs
from test_overlap import make_solver, names_of


def test_the_mode_defaults_to_forward_on_a_gpu_and_backward_on_the_cpu():
    assert copy_up_mode(True, env={}) == "forward"
    assert copy_up_mode(False, env={}) == "backward"
    assert copy_up_mode(True, env={"MINICAFFE_PS_COPY_UP": " Update "}) == "update"
    assert copy_up_mode(False, "forward", env={"MINICAFFE_PS_COPY_UP": "update"}) == "forward"
    assert set(COPY_UP_MODES) == {"backward", "update", "forward"}
    with pytest.raises(ValueError, match=r"\$MINICAFFE_PS_COPY_UP='later'"):
        copy_up_mode(True, env={"MINICAFFE_PS_COPY_UP": "later"})
    with pytest.raises(ValueError, match="--copy-up='soon'"):
        copy_up_mode(True, "soon", env={})


def test_each_bucket_is_needed_before_the_first_layer_that_holds_one_of_its_blobs():
    net = make_solver().net
    names = names_of(net)
    idx = {n: i for i, n in enumerate(names)}
    buckets = [[idx["ip4.0"], idx["ip4.1"]],          # the last layer's
               [idx["ip2.0"]],                       # shared by ip2 and ip3: ip2 first
               [idx["conv1.0"], idx["ip1.1"]],       # two layers: the lower one
               [],                                   # an empty bucket: no layer
               [idx["ip0.0"]]]                       # frozen, still read by forward
    needs = forward_needs(net, buckets)
    L = net.layer_index
    assert needs == {L("ip4"): [0], L("ip2"): [1], L("conv1"): [2], L("ip0"): [4]}


class Blob:
    def __init__(self, n, value=0.0):
        self.data = np.full(n, value, dtype=np.float32)


def test_answers_reach_the_net_only_at_go_in_the_forward_order():
    params = [Blob(3), Blob(2), Blob(4)]
    issued = []
    copy = CopyUp(params, [[0, 1], [2], []], order=[1, 0])
    assert copy.order == [1, 0, 2]               # the empty bucket is issued too, last
    try:
        copy.arrived(2, np.full(4, 3.0, np.float32))
        copy.arrived(0, np.full(3, 1.0, np.float32))
        time.sleep(0.05)
        assert not copy.open and all(p.data.sum() == 0 for p in params)   # not before go
        copy.arrived(1, np.full(2, 2.0, np.float32))
        copy.delay_s = 0.05
        original = copy._issued[0].set
        copy._issued[0].set = lambda: (issued.append(0), original())
        t0 = time.perf_counter()
        copy.go()
        assert copy.open
        copy.wait([1])                           # the first in order: about one delay
        assert params[2].data.tolist() == [3.0] * 4
        assert not issued                        # bucket 0 is not issued yet
        copy.wait([0])
        assert time.perf_counter() - t0 >= 0.1
        assert params[0].data.tolist() == [1.0] * 3 and params[1].data.tolist() == [2.0] * 2
        assert copy.open                         # the empty bucket is not waited for yet
        copy.land()
        assert not copy.open
        copy.land()                              # a landed round: nothing to do
        copy.settle()
    finally:
        copy.close()
    assert not copy._thread.is_alive()


def test_a_failing_copy_is_reported_to_the_waiter():
    params = [Blob(3)]
    copy = CopyUp(params, [[0]], order=[0], timeout=5.0)
    try:
        copy.arrived(0, np.zeros(5, np.float32))   # the wrong size: the copy raises
        copy.go()
        with pytest.raises(CopyError, match="copy-up thread failed: ValueError"):
            copy.wait([0])
    finally:
        copy.close()


def test_a_stuck_copy_thread_times_out_naming_the_bucket():
    copy = CopyUp([Blob(3)], [[0]], order=[0], timeout=0.2)
    gate = threading.Event()
    original = copy._issue_all
    copy._issue_all = lambda: (gate.wait(5.0), original())
    try:
        copy.arrived(0, np.ones(3, np.float32))
        copy.go()
        with pytest.raises(CopyError, match="did not issue bucket 0 within 0.2 s"):
            copy.wait([0])
    finally:
        gate.set()
        copy.close()


def test_direct_answers_are_kept_without_waking_the_copy_thread():
    """--ps-shm: the answers stay in the shards' segments; ``arrived`` only notes them (the
    copy thread, woken once per blob, had handed the GIL back and forth during backward),
    and ``go`` copies them in as before."""
    params = [Blob(3), Blob(2)]
    copy = CopyUp(params, [[0], [1]], order=[1, 0], direct=True)
    try:
        wakes = []
        put = copy._jobs.put
        copy._jobs.put = lambda job: (wakes.append(job and job[0]), put(job))
        segment = [np.full(3, 5.0, np.float32), np.full(2, 6.0, np.float32)]
        copy.arrived(0, segment[0])
        copy.arrived(1, segment[1])
        assert wakes == [] and all(p.data.sum() == 0 for p in params)
        copy.go()
        copy.land()
        assert wakes == ["go"]
        assert params[0].data.tolist() == [5.0] * 3 and params[1].data.tolist() == [6.0] * 2
    finally:
        copy.close()


def test_driver_copies_can_be_turned_off():
    from ps.copyup import driver_copies
    assert driver_copies(env={"MINICAFFE_PS_DRIVER_COPIES": "0"}) is None
