"""Real data bundled with minicaffe: the 8x8 handwritten digits (UCI / scikit-learn).

``digits.csv.gz`` is the copy of the UCI "Optical Recognition of Handwritten
Digits" test set that scikit-learn ships (1797 images of 8x8 pixels with 17
grey levels 0..16, labels 0..9); see ``LICENSE`` in this folder.  It is read
from the package: no download, and scikit-learn is not needed.

``load_digits()`` returns Caffe-style uint8 images; ``split_digits()`` a
fixed, stratified train/test split that does not depend on NumPy's random
streams (a hash of the image index decides), so every install makes the same
databases.  ``python -m minicaffe.tools.make_digits`` writes them as LMDBs.
"""
from __future__ import annotations

import gzip
import os

import numpy as np

DIGITS_PATH = os.path.join(os.path.dirname(os.path.abspath(__file__)), "digits.csv.gz")
DIGITS_COUNT = 1797
DIGITS_TEST_SIZE = 360


def load_digits():
    """The digits as ``(images (1797, 1, 8, 8) uint8, labels (1797,) int64)``.

    Grey levels 0..16 are scaled by 16 to 0..255 (16 * 16 = 256 is clipped
    to 255), so that the images look like the 8-bit pictures Caffe reads.
    """
    with gzip.open(DIGITS_PATH, "rt") as f:
        table = np.loadtxt(f, delimiter=",", dtype=np.int64)
    if table.shape != (DIGITS_COUNT, 65):
        raise ValueError(f"{DIGITS_PATH}: expected {DIGITS_COUNT} rows of 65 columns, got "
                         f"{table.shape}")
    images = np.clip(table[:, :64] * 16, 0, 255).astype(np.uint8).reshape(-1, 1, 8, 8)
    labels = table[:, 64].astype(np.int64)
    return images, labels


def _hash_keys(n: int, seed: int) -> np.ndarray:
    """SplitMix64 of ``seed`` and each index in ``range(n)``: a fixed pseudo-random key per item."""
    with np.errstate(over="ignore"):
        z = (np.arange(n, dtype=np.uint64) + np.uint64(seed) * np.uint64(0x9E3779B97F4A7C15)
             + np.uint64(0x9E3779B97F4A7C15))
        z = (z ^ (z >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
        z = (z ^ (z >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
        return z ^ (z >> np.uint64(31))


def split_digits(labels, test_size: int = DIGITS_TEST_SIZE, seed: int = 0):
    """A stratified train/test split: ``(train_indices, test_indices)``.

    Each class gives the test set its share of ``test_size`` (largest
    remainders round); within a class, and then over each whole set, the
    order follows a hash of the index, so both sets come out shuffled and the
    split is the same on every machine and NumPy version.
    """
    labels = np.asarray(labels)
    n = labels.size
    if not 0 < test_size < n:
        raise ValueError(f"test_size must be in (0, {n}), got {test_size}")
    keys = _hash_keys(n, seed)
    classes, counts = np.unique(labels, return_counts=True)
    exact = counts * (test_size / n)
    take = np.floor(exact).astype(np.int64)
    short = test_size - int(take.sum())
    take[np.argsort(-(exact - take), kind="stable")[:short]] += 1
    test = []
    for cls, k in zip(classes, take):
        idx = np.flatnonzero(labels == cls)
        idx = idx[np.argsort(keys[idx], kind="stable")]
        test.extend(idx[:k].tolist())
    test = np.asarray(test, dtype=np.int64)
    train = np.setdiff1d(np.arange(n), test)
    order = _hash_keys(n, seed + 1)
    train = train[np.argsort(order[train], kind="stable")]
    test = test[np.argsort(order[test], kind="stable")]
    return train, test


__all__ = ["load_digits", "split_digits", "DIGITS_PATH", "DIGITS_COUNT", "DIGITS_TEST_SIZE"]
