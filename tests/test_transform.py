"""DataTransformer against Caffe's data_transformer.cpp, on hand-checked values."""
import numpy as np
import pytest

from minicaffe import io as mio
from minicaffe.proto import caffe_pb2, parse_text
from minicaffe.rng import host_rng, set_random_seed
from minicaffe.transform import TEST, TRAIN, DataTransformer


def tparam(text=""):
    return parse_text(text, caffe_pb2.TransformationParameter)


def images(n=2, c=2, h=5, w=5):
    """Distinct pixel values: value = 100*n + 25*c + 5*h + w (fits in uint8 for n < 2)."""
    n_, c_, h_, w_ = np.meshgrid(np.arange(n), np.arange(c), np.arange(h), np.arange(w),
                                 indexing="ij")
    return (100 * n_ + 25 * c_ + 5 * h_ + w_).astype(np.uint8)


def reference(x, mirror, h_off, w_off, crop, mean=None, mean_values=None, scale=1.0):
    """Caffe's per-pixel loop of Transform(const Datum&, Dtype*), for one image (C, H, W)."""
    c, height, width = x.shape
    oh = ow = crop if crop else None
    oh = oh or height
    ow = ow or width
    out = np.zeros((c, oh, ow), np.float32)
    for ci in range(c):
        for h in range(oh):
            for w in range(ow):
                src = (ci, h_off + h, w_off + w)
                tw = ow - 1 - w if mirror else w
                v = np.float32(x[src])
                if mean is not None:
                    v = (v - np.float32(mean[src])) * np.float32(scale)
                elif mean_values is not None:
                    v = (v - np.float32(mean_values[ci])) * np.float32(scale)
                else:
                    v = v * np.float32(scale)
                out[ci, h, tw] = v
    return out


def test_identity_is_a_float_copy():
    x = images()
    t = DataTransformer(tparam(), TRAIN)
    out = t.transform(x)
    assert out.dtype == np.float32 and out.shape == x.shape
    np.testing.assert_array_equal(out, x.astype(np.float32))
    assert t.rng is None  # nothing random: no generator drawn (Caffe's InitRand)


def test_scale_applies_after_mean_value():
    x = images(1, 2, 2, 2)
    t = DataTransformer(tparam("mean_value: 10 mean_value: 20 scale: 0.5"), TEST)
    out = t.transform(x)
    # channel 0: (v - 10) * 0.5 ; channel 1: (v - 20) * 0.5
    np.testing.assert_array_equal(out[0, 0], (x[0, 0].astype(np.float32) - 10) * 0.5)
    np.testing.assert_array_equal(out[0, 1], (x[0, 1].astype(np.float32) - 20) * 0.5)
    assert out[0, 1, 1, 1] == pytest.approx((25 + 5 + 1 - 20) * 0.5)  # hand-checked: 5.5


def test_single_mean_value_applies_to_every_channel():
    x = images(1, 3, 2, 2)
    out = DataTransformer(tparam("mean_value: 4"), TEST).transform(x)
    np.testing.assert_array_equal(out, x.astype(np.float32) - 4)


def test_mean_value_count_must_match_channels():
    t = DataTransformer(tparam("mean_value: 1 mean_value: 2"), TEST, where="layer 'd' (Data)")
    with pytest.raises(ValueError, match="1 mean_value or as many as channels: 3"):
        t.transform(images(1, 3, 2, 2))


def test_mean_file_and_mean_value_are_exclusive(tmp_path):
    mio.save_mean_file(tmp_path / "m.binaryproto", np.zeros((1, 2, 2)))
    p = tparam(f'mean_file: "{tmp_path / "m.binaryproto"}" mean_value: 3')
    with pytest.raises(ValueError, match="cannot specify mean_file and mean_value"):
        DataTransformer(p, TEST)


def test_test_phase_center_crop_hand_checked():
    x = images(1, 1, 5, 5)  # x[0, 0, h, w] = 5h + w
    out = DataTransformer(tparam("crop_size: 3"), TEST).transform(x)
    # offset (5 - 3) // 2 = 1 in both directions
    expect = np.array([[6, 7, 8], [11, 12, 13], [16, 17, 18]], np.float32)
    np.testing.assert_array_equal(out[0, 0], expect)
    # an even margin rounds down: H = 6, crop 3 -> offset 1
    y = np.arange(36, dtype=np.uint8).reshape(1, 1, 6, 6)
    out = DataTransformer(tparam("crop_size: 3"), TEST).transform(y)
    np.testing.assert_array_equal(out[0, 0], y[0, 0, 1:4, 1:4])


def test_mean_file_is_cropped_at_the_image_offset(tmp_path):
    x = images(2, 2, 5, 5)
    mean = np.random.default_rng(1).uniform(0, 50, (1, 2, 5, 5)).astype(np.float32)
    mio.save_mean_file(tmp_path / "mean.binaryproto", mean)
    mean_file = tmp_path / "mean.binaryproto"
    p = tparam(f'crop_size: 3 mirror: true scale: 0.25 mean_file: "{mean_file}"')
    t = DataTransformer(p, TRAIN)
    draws = (np.array([True, False]), np.array([1, 2]), np.array([2, 0]))
    out = t.transform(x, draws=draws)
    for i in range(2):
        ref = reference(x[i], draws[0][i], draws[1][i], draws[2][i], 3, mean=mean[0], scale=0.25)
        np.testing.assert_array_equal(out[i], ref)
    # hand check one pixel: image 1, not mirrored, offset (2, 0): out[c, 0, 0] = (x - m) at (2, 0)
    expect = (np.float32(x[1, 1, 2, 0]) - mean[0, 1, 2, 0]) * np.float32(0.25)
    assert out[1, 1, 0, 0] == expect
    # TEST: the centre window of the mean, (1, 1)
    out = DataTransformer(p, TEST).transform(x[:1], draws=(np.array([False]), [1], [1]))
    np.testing.assert_array_equal(out[0], (x[0, :, 1:4, 1:4] - mean[0, :, 1:4, 1:4]) * 0.25)


def test_mean_file_relative_to_source_dir(tmp_path):
    mio.save_mean_file(tmp_path / "mean.binaryproto", np.full((1, 1, 2), 3.0))
    t = DataTransformer(tparam('mean_file: "mean.binaryproto"'), TEST, source_dir=str(tmp_path))
    out = t.transform(np.full((1, 1, 1, 2), 5, np.uint8))
    np.testing.assert_array_equal(out, np.full((1, 1, 1, 2), 2.0))
    with pytest.raises(FileNotFoundError, match="layer 'x' \\(Data\\): mean_file"):
        DataTransformer(tparam('mean_file: "absent.binaryproto"'), TEST, where="layer 'x' (Data)")


def test_mean_file_shape_must_match_images(tmp_path):
    mio.save_mean_file(tmp_path / "m.binaryproto", np.zeros((1, 4, 4)))
    t = DataTransformer(tparam(f'mean_file: "{tmp_path / "m.binaryproto"}"'), TEST)
    with pytest.raises(ValueError, match=r"mean image has shape \(1, 4, 4\).*\(1, 5, 5\)"):
        t.transform(images(1, 1, 5, 5))


def test_train_random_crop_and_mirror_follow_the_draws_and_the_seed():
    x = images(2, 2, 5, 5)
    x = np.concatenate([x] * 8)  # 16 images
    p = tparam("crop_size: 3 mirror: true")
    set_random_seed(11)
    t = DataTransformer(p, TRAIN)
    state = t.rng.bit_generator.state
    out = t.transform(x)
    # the same draws, replayed through Caffe's per-pixel loop
    t.rng.bit_generator.state = state
    mirror, h_off, w_off = t.draw(len(x), 5, 5)
    for i in range(len(x)):
        np.testing.assert_array_equal(out[i], reference(x[i], mirror[i], h_off[i], w_off[i], 3))
    assert mirror.any() and not mirror.all()
    assert len(set(zip(h_off.tolist(), w_off.tolist()))) > 1
    assert h_off.min() >= 0 and h_off.max() <= 2 and w_off.max() <= 2
    # a seed reproduces the batch, another seed does not
    set_random_seed(11)
    np.testing.assert_array_equal(DataTransformer(p, TRAIN).transform(x), out)
    set_random_seed(12)
    assert not np.array_equal(DataTransformer(p, TRAIN).transform(x), out)


def test_mirror_is_random_in_test_phase_too():
    # Caffe: do_mirror = param_.mirror() && Rand(2), whatever the phase
    x = images(1, 1, 3, 4)
    x = np.concatenate([x] * 32)
    set_random_seed(3)
    out = DataTransformer(tparam("mirror: true"), TEST).transform(x)
    flipped = [np.array_equal(o, xi[:, :, ::-1]) for o, xi in zip(out, x)]
    kept = [np.array_equal(o, xi) for o, xi in zip(out, x)]
    assert all(f or k for f, k in zip(flipped, kept))
    assert any(flipped) and any(kept)


def test_test_crop_without_mirror_draws_nothing():
    set_random_seed(5)
    before = host_rng().bit_generator.state
    t = DataTransformer(tparam("crop_size: 2"), TEST)
    assert t.rng is None and host_rng().bit_generator.state == before
    DataTransformer(tparam("crop_size: 2"), TRAIN)
    assert host_rng().bit_generator.state != before


def test_float_data_datums_and_transform_datums():
    t = DataTransformer(tparam("scale: 2"), TEST, dtype=np.float64)
    d1 = mio.array_to_datum(np.full((1, 2, 2), 0.25, np.float32), 3)
    d2 = mio.array_to_datum(np.full((1, 2, 2), 0.5, np.float32), 4)
    data, labels = t.transform_datums([d1, d2])
    assert data.dtype == np.float64
    np.testing.assert_array_equal(data[:, 0, 0, 0], [0.5, 1.0])
    np.testing.assert_array_equal(labels, [3, 4])
    d3 = mio.array_to_datum(np.zeros((1, 3, 2), np.float32))
    with pytest.raises(ValueError, match="one shape"):
        t.transform_datums([d1, d3])


def test_crop_larger_than_image_and_output_buffer():
    t = DataTransformer(tparam("crop_size: 6"), TEST, where="layer 'd' (Data)")
    with pytest.raises(ValueError, match="crop_size 6 is larger than the image"):
        t.transform(images(1, 1, 5, 5))
    t = DataTransformer(tparam("crop_size: 2"), TEST)
    buf = np.empty((1, 1, 2, 2), np.float32)
    assert t.transform(images(1, 1, 5, 5), out=buf) is buf
    with pytest.raises(ValueError, match="output buffer"):
        t.transform(images(1, 1, 5, 5), out=np.empty((1, 1, 3, 3), np.float32))
    assert t.output_shape((3, 5, 7)) == (3, 2, 2)
    assert t.transform(images(1, 1, 5, 5)[0]).shape == (1, 2, 2)  # a single image
