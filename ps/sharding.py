"""Which server shard holds which parameter blob.

Workers compute the assignment from the blob sizes alone (and, with overlap,
the order in which backward finishes the blobs, a function of the net), so
every worker agrees without talking to anybody, and servers never need the
net: they hold whatever blob ids the workers register with them.

Two rules.  Without overlap every shard is pushed at the end of backward, so
only the balance matters: :func:`assign_shards` (greedy LPT), one message per
shard.  With overlap the unit is a *bucket*: a run of the backward order of at
most a few MiB (:func:`ps.overlap.make_buckets`), pushed as soon as backward has
finished it, updated by its shard as soon as every worker has pushed it, and
sent back at once (ps/server.py).  :func:`assign_buckets` deals the buckets to
the shards in backward order, each to the least loaded, so every shard's link
carries traffic from the top of backward on.  The two rules place blobs
differently: servers restored from a snapshot must be joined by workers with
the same overlap setting and bucket size (the join says so).
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


def bucket_cap(nbytes: list[int], num_shards: int, cap_bytes: int) -> int:
    """The bucket size for ``num_shards`` shards: ``cap_bytes``, but at most an equal
    share of the bytes, so that a net smaller than S buckets still spreads over the shards."""
    if num_shards < 1:
        raise ValueError(f"need at least one shard, got {num_shards}")
    if cap_bytes <= 0:
        raise ValueError(f"bucket size must be positive, got {cap_bytes} bytes")
    share = -(-sum(nbytes) // num_shards)
    return max(1, min(cap_bytes, share))


def assign_buckets(bucket_nbytes: list[int], num_shards: int) -> list[int]:
    """The shard of each bucket: in bucket order (the order backward finishes them), each
    bucket goes to the shard holding the fewest bytes so far (ties: lower shard).  Buckets
    of equal size go round the shards, so each shard's traffic starts with the first
    buckets; a shard may stay empty when there are fewer buckets than shards."""
    if num_shards < 1:
        raise ValueError(f"need at least one shard, got {num_shards}")
    load = [0] * num_shards
    out = []
    for nbytes in bucket_nbytes:
        s = min(range(num_shards), key=lambda s: (load[s], s))
        out.append(s)
        load[s] += nbytes
    return out
