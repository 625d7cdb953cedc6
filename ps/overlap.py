"""Gradient communication that overlaps the backward pass (issue 6).

Without overlap, a data-parallel worker communicates after the whole backward
pass: all gradients are copied or packed, then pushed to the server shards or
all-reduced, while the GPU sits idle.  Caffe's ``P2PSync`` starts per layer and
PyTorch's DDP per bucket as soon as the gradients are there, while backward
goes on with the layers below.  This module decides *when* a group of
parameters (a server shard, an NCCL bucket) may go; ps/worker.py and ps/nccl.py
decide what going means.

When a diff is final.  ``Net.backward_layer`` calls ``net.backward_listener(li)``
right after layer li's backward has been issued, for every layer that runs
backward, also under a swap plan (the executor's backward steps go through
``backward_layer``).  Backward runs from the last layer to the first, and a
layer adds its contribution to its parameter diffs (Caffe's rule), so a
learnable parameter's diff is final after the backward of the *lowest-index*
layer that holds it and runs backward; a shared parameter (``param { name: }``)
counts every layer that shares it.  A parameter that no backward layer holds
(lr_mult 0 everywhere, nothing below needs backward) keeps the zeros that
``clear_param_diffs`` wrote: it is final before backward starts, and counts as
final after the first backward layer.  With ``iter_size`` > 1 the solver runs
``iter_size`` forward/backward passes that accumulate into the same diffs: only
the last pass makes them final.  A group is ready when its last parameter is::

    ready_after[li] = groups whose lowest final layer is li     (static, from the net)
    pass p of iter_size:  after layer li's backward, if p == iter_size - 1,
                          every group of ready_after[li] goes

Every rank computes the same ``ready_after`` from the same net, so every rank
issues its groups in the same order (NCCL needs that: collectives are matched
by order).  :meth:`GradientOverlap.flush`, at the update, issues any group that
never became ready during backward (a net without backward layers, a partial
pass), in group order, so nothing is ever left out.

Streams.  On the GPU "issued" is not "done": the layer's kernels are queued on
the current stream, the one on which the layers run (the swap executor's
compute stream is the current stream too).  When a group becomes ready an event
is recorded on that stream and handed to the group's consumer, which makes its
own stream wait on it (a device-side wait: the host never blocks in backward).
Events are created once and re-recorded every iteration; a consumer waits on an
event as soon as it gets it, so the next recording cannot be confused with this
one.

The grouping functions are pure and run without a GPU: :func:`final_layers`,
:func:`backward_order`, :func:`make_buckets`.
"""
from __future__ import annotations

import os

ENV_OVERLAP = "MINICAFFE_PS_OVERLAP"
DEFAULT_BUCKET_MB = 25.0      # PyTorch DDP's bucket_cap_mb (NCCL all-reduce buckets)
# The parameter server's buckets are smaller: a bucket comes back only after the shard has
# all of it from every worker, so the last bucket's round trip is what backward cannot hide.
DEFAULT_PS_BUCKET_MB = 8.0
# ``--tail-mb``: the parameters backward finishes last go in buckets of at most this size
PS_TAIL_BUCKET_MB = 1.0
# ... and how many MiB of them by default.  Measured 2026-11-22 on 4 x H200, ResNet-152 at
# k = 72, W = 4, two runs of each in one call: 926 and 952 images/s without a tail, 1102 and
# 1177 with 8 MiB (the shards' tail from 24-27 ms to 12 ms; docs/RESULTS.md, issue 8).
DEFAULT_PS_TAIL_MB = 8.0


def overlap_default(env=None) -> bool:
    """Whether data-parallel workers overlap communication with backward
    (``$MINICAFFE_PS_OVERLAP``, default on; 0/false/off/no turns it off)."""
    env = os.environ if env is None else env
    return env.get(ENV_OVERLAP, "1").strip().lower() not in ("0", "false", "off", "no")


def nccl_overlap_default(solver_param, env=None) -> bool:
    """``--comm nccl``'s default: ``$MINICAFFE_PS_OVERLAP`` where it is set, else the solver's
    ``layer_wise_reduce`` (Caffe's NCCL, parallel.cpp: true, its default, all-reduces each
    layer's gradients as backward finishes them; false, all of them after backward), which
    decides when the gradients are summed, not their sum."""
    env = os.environ if env is None else env
    if ENV_OVERLAP in env:
        return overlap_default(env)
    return bool(solver_param.layer_wise_reduce)


# ----------------------------------------------------------- static analysis
def learnable_index(net) -> list:
    """Per entry of ``net.all_params``: its index in ``net.learnable_params``
    (a sharer maps to its owner's)."""
    out, owners = [], 0
    for owner in net.param_owner:
        if owner >= 0:
            out.append(out[owner])
        else:
            out.append(owners)
            owners += 1
    return out


def final_layers(net) -> list:
    """Per learnable parameter: the layer after whose backward its diff is
    final (the lowest-index layer that holds it and runs backward), or None
    when no backward layer holds it (its diff stays as cleared)."""
    final = [None] * len(net.learnable_params)
    for flat, q in enumerate(learnable_index(net)):
        li = net.param_layer_index[flat][0]
        if net.layer_need_backward[li] and (final[q] is None or li < final[q]):
            final[q] = li
    return final


def backward_layers(net) -> list:
    """The layers that run backward, in the order they run (last layer first)."""
    return [li for li in range(len(net.layers) - 1, -1, -1) if net.layer_need_backward[li]]


def backward_order(net) -> list:
    """Learnable parameter ids in the order their diffs become final: those no
    backward layer holds first, then by final layer from the top; within one
    layer, in reverse (the order DDP's buckets use)."""
    final = final_layers(net)
    top = len(net.layers)
    return sorted(range(len(final)), key=lambda i: (-(top if final[i] is None else final[i]), -i))


def make_buckets(nbytes: list, order: list, cap_bytes: int, tail_bytes: int = 0,
                 tail_cap_bytes: int | None = None) -> list:
    """Buckets: consecutive runs of ``order`` of at most ``cap_bytes`` each (a parameter
    larger than the cap is a bucket of its own).  With ``tail_bytes``, the parameters
    among the last ``tail_bytes`` of the order go in buckets of at most
    ``tail_cap_bytes``: the last bucket is ready only when backward ends, and a smaller
    one comes back sooner (the parameter server's ``--tail-mb``).  Returns lists of
    parameter ids, each sorted increasing (the packing order)."""
    if cap_bytes <= 0:
        raise ValueError(f"bucket size must be positive, got {cap_bytes} bytes")
    if tail_bytes and (tail_cap_bytes is None or tail_cap_bytes <= 0):
        raise ValueError(f"a tail of {tail_bytes} bytes needs a positive bucket size, got "
                         f"{tail_cap_bytes}")
    after = sum(nbytes[i] for i in order)     # bytes from this parameter to the end
    buckets, cur, size, cur_tail = [], [], 0, False
    for i in order:
        tail = tail_bytes and after <= tail_bytes
        if cur and (tail and not cur_tail):
            buckets.append(sorted(cur))           # the tail starts a bucket of its own
            cur, size = [], 0
        limit = tail_cap_bytes if tail else cap_bytes
        if cur and size + nbytes[i] > limit:
            buckets.append(sorted(cur))
            cur, size = [], 0
        cur_tail = tail
        cur.append(i)
        size += nbytes[i]
        after -= nbytes[i]
    if cur:
        buckets.append(sorted(cur))
    return buckets


def ready_after(net, groups: list) -> dict:
    """{layer index: [group ids]}: after that layer's backward (in the last
    pass of an iteration) every parameter of those groups is final.  A group
    with no parameter, or only parameters no backward layer holds, is ready
    after the first backward layer.  Groups never ready during backward (a net
    with no backward layer) are absent: :meth:`GradientOverlap.flush` sends them."""
    final = final_layers(net)
    bwd = backward_layers(net)
    if not bwd:
        return {}
    first = bwd[0]
    out: dict = {}
    for g, ids in enumerate(groups):
        li = min((first if final[i] is None else final[i] for i in ids), default=first)
        out.setdefault(li, []).append(g)
    return out


# ------------------------------------------------------------------ runtime
class GradientOverlap:
    """Listens to a net's backward and hands each group of parameters to its
    consumer as soon as the group's diffs are final.

    Args:
        net: the train net (its ``backward_listener`` is taken).
        groups: lists of learnable parameter ids (server shards, NCCL buckets).
        iter_size: the solver's ``iter_size``: only the last of that many
            backward passes per iteration makes the diffs final.
        on_ready: ``on_ready(g, event)``, called once per group and iteration,
            in backward, right after the layer that completed the group;
            ``event`` is recorded on the current stream just before (GPU), or
            None (CPU).
        between_layers: optional ``fn()`` called after every backward layer of
            the last pass (after ``on_ready``), e.g. to send what is ready.
        gpu: record CUDA events (the net's arrays are CuPy arrays).

    Per iteration: backward passes report through the listener, then the
    update calls :meth:`flush` (issues the groups not issued yet) and, once the
    communication is done, :meth:`reset`.
    """

    def __init__(self, net, groups: list, iter_size: int, on_ready, between_layers=None,
                 gpu: bool = False):
        if net.backward_listener is not None:
            raise RuntimeError(f"net {net.name!r} already has a backward listener")
        self.net = net
        self.groups = [list(g) for g in groups]
        self.iter_size = max(1, int(iter_size))
        self.on_ready = on_ready
        self.between_layers = between_layers
        self.ready_after = ready_after(net, self.groups)
        bwd = backward_layers(net)
        self.last_layer = bwd[-1] if bwd else None     # the end of one backward pass
        self.events = None
        if gpu:
            import cupy
            self._current_stream = cupy.cuda.get_current_stream
            self.events = [cupy.cuda.Event(disable_timing=True) for _ in self.groups]
        self.passes = 0                          # backward passes done this iteration
        self.issued = [False] * len(self.groups)
        net.backward_listener = self._layer_done

    def _layer_done(self, li: int):
        if self.passes == self.iter_size - 1:
            for g in self.ready_after.get(li, ()):
                self._issue(g)
            if self.between_layers is not None:
                self.between_layers()
        if li == self.last_layer:
            self.passes += 1

    def _issue(self, g: int):
        if self.issued[g]:
            return
        self.issued[g] = True
        event = None
        if self.events is not None:
            event = self.events[g]
            event.record(self._current_stream())   # after the kernels that wrote the diffs
        self.on_ready(g, event)

    def flush(self):
        """At the update: issue, in group order, every group backward did not
        (their diffs are final now: backward is over)."""
        for g in range(len(self.groups)):
            self._issue(g)

    def reset(self):
        """The iteration's communication is complete: count passes anew."""
        self.passes = 0
        self.issued = [False] * len(self.groups)

    def detach(self):
        if self.net.backward_listener == self._layer_done:
            self.net.backward_listener = None
