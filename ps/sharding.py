"""Which server shard holds which parameter blob.

Workers compute the assignment from the blob sizes alone, so every worker
agrees without talking to anybody, and servers never need the net: they hold
whatever blob ids the workers register with them.
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
