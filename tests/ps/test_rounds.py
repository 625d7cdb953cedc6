"""The worker's round thread (ps/rounds.py) against a fake client, on the CPU: a bucket
leaves as soon as its copy is done, in backward order, whatever the main thread does;
the update pushes the rest after waiting for their copies; answers are taken early or
late; a failure on the thread is raised on the main thread."""

import threading
import time

import pytest

from ps.rounds import RoundThread
from test_overlap import wait_for
from ps.worker import PSError


class Copy:
    """A CUDA event's stand-in: done once set."""

    def __init__(self):
        self.flag = threading.Event()
        self.waited = False

    @property
    def done(self):
        return self.flag.is_set()

    def synchronize(self):
        self.waited = True
        assert self.flag.wait(5.0)


class FakeClient:
    def __init__(self, fail_push=None):
        self.pushed = []
        self.answers = []          # (blob id, value) readable now
        self.fail_push = fail_push
        self.socks, self.monitors = [], []   # nothing for the thread to poll

    def next_send_s(self):
        return None

    def push(self, t, s, payloads):
        if self.fail_push is not None and len(self.pushed) == self.fail_push:
            raise PSError("shard 1 (tcp://x) aborted: rank 2 died")
        self.pushed.append((t, s, [i for i, _ in payloads]))
        self.answers += [(i, 10 * i) for i, _ in payloads]
        return 100

    def send_due(self, wait=False):
        pass

    def receive_ready(self, t, take):
        while self.answers:
            take(*self.answers.pop(0))

    def pull(self, t, take):
        self.answers.append((99, 0))   # an answer that only the update's wait gets
        self.receive_ready(t, take)
        return 7


def make(client):
    early, late = [], []
    rt = RoundThread(client, shard_of=[0, 1, 0], payloads=lambda g, done: [(g, None)],
                     take_early=lambda i, a: early.append(i), take_late=lambda i, a: late.append(i))
    return rt, early, late


def test_a_bucket_leaves_once_its_copy_is_done_and_in_order():
    client = FakeClient()
    rt, early, late = make(client)
    try:
        c0, c1, c2 = Copy(), Copy(), Copy()
        rt.bucket(3, 0, c0)
        rt.bucket(3, 1, c1)
        time.sleep(0.02)
        assert client.pushed == []                 # no copy done yet
        c1.flag.set()
        time.sleep(0.02)
        assert client.pushed == []                 # bucket 1 waits behind bucket 0
        c0.flag.set()
        wait_for(lambda: len(client.pushed) == 2)
        assert client.pushed == [(3, 0, [0]), (3, 1, [1])]
        wait_for(lambda: early == [0, 1])          # answers taken before the update
        rt.bucket(3, 2, c2)
        threading.Timer(0.05, c2.flag.set).start()
        pushed, pulled, parts = rt.finish(3)       # the round ends once bucket 2's copy has
        assert c2.waited and c2.done and client.pushed[-1] == (3, 0, [2])
        assert (pushed, pulled) == (300, 7) and sorted(early + late) == [0, 1, 2, 99]
        assert late[-1] == 99
        assert parts["push_s"] >= 0 and parts["pull_wait_s"] >= 0
        rt.bucket(4, 0, None)                      # the next round; None: on the host now
        wait_for(lambda: len(client.pushed) == 4)
    finally:
        assert rt.stop()


def test_a_failure_on_the_thread_is_raised_on_the_main_thread():
    client = FakeClient(fail_push=1)
    rt, _, _ = make(client)
    try:
        rt.bucket(0, 0, None)
        rt.bucket(0, 1, None)                      # its push fails
        with pytest.raises(PSError, match="rank 2 died"):
            rt.finish(0)
        with pytest.raises(PSError, match="rank 2 died"):
            rt.bucket(1, 0, None)                  # and stays failed
    finally:
        rt.stop()
