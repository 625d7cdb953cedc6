"""Which server shard holds which parameter blob.

Workers compute the assignment from the blob sizes alone (and, with overlap,
the order in which backward finishes the blobs, a function of the net), so
every worker agrees without talking to anybody, and servers never need the
net: they hold whatever blob ids the workers register with them.

Two rules.  Without overlap every shard is pushed at the end of backward, so
only the balance matters: :func:`assign_shards` (greedy LPT).  With overlap a
shard is pushed as soon as its last blob's gradient is final, so a shard
should hold blobs that backward finishes together: :func:`assign_shards_in_order`
cuts the backward order into contiguous runs of about equal bytes, and the
first shard leaves while most of backward is still to run.  The two rules place
blobs differently: servers restored from a snapshot must be joined by workers
with the same overlap setting (the join says so).
"""
from __future__ import annotations


def assign_shards(nbytes: list[int], num_shards: int) -> list[list[int]]:
    """Blob ids per shard, balanced by bytes (greedy longest-processing-time).

    Blobs are taken largest first (ties: lower id first) and each goes to the
    shard holding the fewest bytes so far (ties: lower shard).  Greedy LPT is
    within 4/3 of the best possible balance, and for CNNs, whose bytes sit in
    a few large blobs, close to it.  Blob ids within a shard are sorted, so a
    shard's messages list blobs in net order.

    A shard may end up empty when there are fewer blobs than shards; it still
    takes part in every round (with nothing to update), which keeps the
    protocol free of special cases.
    """
    if num_shards < 1:
        raise ValueError(f"need at least one shard, got {num_shards}")
    load = [0] * num_shards
    shards: list[list[int]] = [[] for _ in range(num_shards)]
    for i in sorted(range(len(nbytes)), key=lambda i: (-nbytes[i], i)):
        s = min(range(num_shards), key=lambda s: (load[s], s))
        shards[s].append(i)
        load[s] += nbytes[i]
    return [sorted(ids) for ids in shards]


def shard_bytes(nbytes: list[int], shards: list[list[int]]) -> list[int]:
    return [sum(nbytes[i] for i in ids) for ids in shards]


def assign_shards_in_order(nbytes: list[int], num_shards: int, order: list[int]) -> list[list[int]]:
    """Blob ids per shard as contiguous runs of ``order`` (the order backward
    finishes them, :func:`ps.overlap.backward_order`), of about equal bytes.

    Blob ``i`` goes to the shard whose equal share of the bytes,
    ``[s T / S, (s + 1) T / S)`` of the running total T, holds the middle of
    the blob: so each shard is within one blob of T / S, and a blob larger than
    a share may leave a neighbour empty (an empty shard still takes part, as
    with :func:`assign_shards`).  Ids within a shard are sorted.
    """
    if num_shards < 1:
        raise ValueError(f"need at least one shard, got {num_shards}")
    if sorted(order) != list(range(len(nbytes))):
        raise ValueError(f"order must list every blob id 0..{len(nbytes) - 1} once, got {order}")
    total = sum(nbytes)
    shards: list[list[int]] = [[] for _ in range(num_shards)]
    before = 0
    for i in order:
        middle = before + nbytes[i] / 2
        s = min(num_shards - 1, int(middle * num_shards / total)) if total else 0
        shards[s].append(i)
        before += nbytes[i]
    return [sorted(ids) for ids in shards]
