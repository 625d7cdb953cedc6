"""Accuracy: top-k with Caffe's tie rule, ignore_label, axis, per-class top, no backward."""
import numpy as np
import pytest

import minicaffe.layers  # noqa: F401  (registers the layer types)
from minicaffe.backend import to_numpy
from minicaffe.blob import Blob
from minicaffe.testing import make_blob, make_layer


def acc_text(params=""):
    return f'name: "acc" type: "Accuracy" accuracy_param {{ {params} }}'


def run(params, scores, labels, n_top=1, xp=np, dtype=np.float64):
    layer = make_layer(acc_text(params), xp=xp, dtype=dtype)
    bottom = [make_blob(scores, xp=xp, dtype=dtype, name="score"),
              make_blob(labels, xp=xp, dtype=dtype, name="label")]
    top = [Blob(xp=xp, dtype=dtype, name=f"t{i}") for i in range(n_top)]
    layer.setup(bottom, top)
    layer.forward(bottom, top)
    return [to_numpy(t.data) for t in top], layer, bottom, top


def caffe_reference(scores, labels, top_k, axis=1, ignore=None):
    """A direct transcription of Caffe's loop (count of scores >= the true one)."""
    s = np.moveaxis(scores, axis, -1).reshape(-1, scores.shape[axis])
    lab = labels.reshape(-1).astype(int)
    c = s.shape[1]
    hits, nums, count, acc = np.zeros(c), np.zeros(c), 0, 0
    for row, l in zip(s, lab):
        if ignore is not None and l == ignore:
            continue
        nums[l] += 1
        if (row >= row[l]).sum() - 1 < top_k:
            acc += 1
            hits[l] += 1
        count += 1
    per_class = np.where(nums == 0, 0, hits / np.maximum(nums, 1))
    return (acc / count if count else 0.0), per_class


def test_top1_hand_computed():
    scores = np.array([[0.1, 0.7, 0.2],
                       [0.5, 0.3, 0.2],
                       [0.2, 0.2, 0.6],
                       [0.3, 0.3, 0.4]])
    labels = np.array([1, 1, 2, 0])
    (acc, per_class), *_ = run("", scores, labels, n_top=2)
    np.testing.assert_allclose(acc, 0.5)
    np.testing.assert_allclose(per_class, [0.0, 0.5, 1.0])
    assert acc.shape == () and per_class.shape == (3,)


def test_ties_count_against_the_true_class():
    # true class tied with another for the top score: wrong at top-1, right at top-2
    scores = np.array([[0.4, 0.4, 0.2],     # label 0 tied with class 1 (a higher index)
                       [0.4, 0.4, 0.2],     # label 1 tied with class 0 (a lower index)
                       [0.3, 0.3, 0.3]])    # three-way tie
    labels = np.array([0, 1, 2])
    (acc,), *_ = run("top_k: 1", scores, labels)
    np.testing.assert_allclose(acc, 0.0)
    (acc,), *_ = run("top_k: 2", scores, labels)
    np.testing.assert_allclose(acc, 2 / 3)  # the three-way tie needs top_k 3
    (acc,), *_ = run("top_k: 3", scores, labels)
    np.testing.assert_allclose(acc, 1.0)


@pytest.mark.parametrize("top_k", [1, 2, 4])
def test_top_k_against_reference_with_ties(top_k, rng):
    scores = rng.integers(0, 4, size=(40, 6)).astype(np.float64)  # many ties
    labels = rng.integers(0, 6, size=40)
    (acc, per_class), *_ = run(f"top_k: {top_k}", scores, labels, n_top=2)
    ref, ref_pc = caffe_reference(scores, labels, top_k)
    np.testing.assert_allclose(acc, ref)
    np.testing.assert_allclose(per_class, ref_pc)


def test_ignore_label_and_spatial_axis(rng):
    scores = rng.standard_normal((3, 5, 2, 2))
    labels = rng.integers(0, 5, size=(3, 2, 2)).astype(np.float64)
    labels[0, 0, 0] = labels[2, 1, 1] = -1
    (acc, per_class), *_ = run("ignore_label: -1 top_k: 2", scores, labels, n_top=2)
    ref, ref_pc = caffe_reference(scores, labels, 2, ignore=-1)
    np.testing.assert_allclose(acc, ref)
    np.testing.assert_allclose(per_class, ref_pc)


def test_label_axis(rng):
    scores = rng.standard_normal((2, 3, 4))  # classes on the last axis
    labels = rng.integers(0, 4, size=(2, 3))
    (acc,), *_ = run("axis: -1", scores, labels)
    ref, _ = caffe_reference(scores, labels, 1, axis=2)
    np.testing.assert_allclose(acc, ref)


def test_all_ignored_gives_zero():
    (acc, per_class), *_ = run("ignore_label: 0", np.eye(3), np.zeros(3), n_top=2)
    assert acc == 0.0
    np.testing.assert_array_equal(per_class, 0.0)


def test_no_backward():
    _, layer, bottom, top = run("", np.eye(3), np.arange(3))
    assert not layer.allow_force_backward(0) and not layer.allow_force_backward(1)
    layer.backward(top, [False, False], bottom)  # nothing asked: fine
    with pytest.raises(NotImplementedError, match="no backward"):
        layer.backward(top, [True, False], bottom)


@pytest.mark.parametrize("params,scores,labels,match", [
    ("top_k: 4", np.zeros((2, 3)), np.zeros(2), "top_k"),
    ("", np.zeros((2, 3, 2)), np.zeros(2), "number of labels must match"),
    ("axis: 2", np.zeros((2, 3)), np.zeros(2), "axis 2 out of range"),
])
def test_errors(params, scores, labels, match):
    with pytest.raises(ValueError, match=match):
        run(params, scores, labels)


@pytest.mark.gpu
@pytest.mark.parametrize("params", ["top_k: 1", "top_k: 3 ignore_label: 2"])
def test_gpu_matches_cpu(cp, params):
    rng = np.random.default_rng(9)
    scores = rng.integers(0, 5, size=(32, 10, 2, 2)).astype(np.float32)  # with ties
    labels = rng.integers(0, 10, size=(32, 2, 2)).astype(np.float32)
    cpu, *_ = run(params, scores, labels, n_top=2, dtype=np.float32)
    gpu, *_ = run(params, scores, labels, n_top=2, xp=cp, dtype=np.float32)
    for c, g in zip(cpu, gpu):
        np.testing.assert_allclose(g, c, rtol=1e-6)
