"""caffe.Detector (python/caffe/detector.py in BVLC Caffe): configure_crop's
crop dims and raw-unit mean, crop() with and without R-CNN context padding
against hand-computed boxes, detect_windows against a manual crop +
preprocess + forward per window, and detect_selective_search's import."""
import sys
import types

import numpy as np
import pytest
from PIL import Image

import minicaffe as caffe
from minicaffe.io import resize_image
from minicaffe.net import Net

# A deploy net with the legacy `input:` fields (no Input or DummyData layer):
# data (2, 3, 8, 8) -> conv 3x3 (4) -> ReLU -> fc (3) -> softmax.
DEPLOY = """
name: "tiny_det"
input: "data"
input_shape { dim: 2 dim: 3 dim: 8 dim: 8 }
layer { name: "conv" type: "Convolution" bottom: "data" top: "conv"
        convolution_param { num_output: 4 kernel_size: 3 } }
layer { name: "relu" type: "ReLU" bottom: "conv" top: "conv" }
layer { name: "fc" type: "InnerProduct" bottom: "conv" top: "fc"
        inner_product_param { num_output: 3 } }
layer { name: "prob" type: "Softmax" bottom: "fc" top: "prob" }
"""

S = 8                                   # the input's side
MEAN = np.array([10.0, 20.0, 30.0])    # BGR, in raw_scale units
RAW_SCALE = 255.0
INPUT_SCALE = 0.05
SWAP = (2, 1, 0)


@pytest.fixture
def tiny_model(tmp_path):
    proto = tmp_path / "deploy.prototxt"
    proto.write_text(DEPLOY)
    net = Net(str(proto), caffe.TEST)
    rng = np.random.default_rng(7)
    for name in ("conv", "fc"):
        for p in net.params[name]:
            p.data[...] = rng.standard_normal(p.data.shape) * 0.05
    weights = str(tmp_path / "tiny.caffemodel")
    net.save(weights)
    return str(proto), weights


def grid_image(h=10, w=12):
    """(h, w, 3) float32 image with distinct values: 0.01 y + 0.001 x + 0.1 c."""
    y, x, c = np.meshgrid(np.arange(h), np.arange(w), np.arange(3), indexing="ij")
    return (0.01 * y + 0.001 * x + 0.1 * c).astype(np.float32)


def detector(tiny_model, **kw):
    args = dict(mean=MEAN, raw_scale=RAW_SCALE, input_scale=INPUT_SCALE, channel_swap=SWAP)
    args.update(kw)
    return caffe.Detector(*tiny_model, **args)


# --------------------------------------------------------- configure_crop
def test_configure_crop_without_context(tiny_model):
    det = detector(tiny_model, context_pad=0)
    np.testing.assert_array_equal(det.crop_dims, (S, S, 3))   # (H, W, K)
    assert det.context_pad == 0
    assert not hasattr(det, "crop_mean")                      # pycaffe sets it only with context
    det.configure_crop(None)
    assert det.context_pad is None


def test_configure_crop_with_context_mean_in_raw_units(tiny_model):
    det = detector(tiny_model, context_pad=2)
    assert det.context_pad == 2
    np.testing.assert_array_equal(det.crop_dims, (S, S, 3))
    # (K,) BGR mean -> (1, 1, K) RGB, divided by raw_scale
    assert det.crop_mean.shape == (1, 1, 3)
    np.testing.assert_allclose(det.crop_mean[0, 0], [30 / 255, 20 / 255, 10 / 255])
    # a canvas of the crop mean preprocesses to zero: it is the mean in image units
    canvas = np.ones(det.crop_dims) * det.crop_mean
    np.testing.assert_allclose(det.transformer.preprocess("data", canvas), 0, atol=1e-6)


def test_configure_crop_full_mean_and_non_involutive_swap(tiny_model):
    mean = np.random.default_rng(3).uniform(0, 100, (3, S, S))
    det = caffe.Detector(*tiny_model, mean=mean, raw_scale=RAW_SCALE, channel_swap=(1, 2, 0),
                         context_pad=1)
    # input channel j is raw channel swap[j]: raw channel c has mean[swap.index(c)]
    expected = mean.transpose(1, 2, 0)[:, :, [2, 0, 1]] / RAW_SCALE
    np.testing.assert_allclose(det.crop_mean, expected)
    np.testing.assert_allclose(det.transformer.preprocess("data", det.crop_mean), 0, atol=1e-5)


def test_configure_crop_without_mean_is_zeros(tiny_model):
    det = caffe.Detector(*tiny_model, context_pad=2)
    np.testing.assert_array_equal(det.crop_mean, np.zeros((S, S, 3)))


def test_context_pad_needs_a_square_input(tmp_path):
    proto = tmp_path / "wide.prototxt"
    proto.write_text(DEPLOY.replace("dim: 8 dim: 8", "dim: 8 dim: 10"))
    weights = str(tmp_path / "wide.caffemodel")
    Net(str(proto), caffe.TEST).save(weights)
    caffe.Detector(str(proto), weights, context_pad=0)        # no context: any shape
    with pytest.raises(ValueError, match="square input"):
        caffe.Detector(str(proto), weights, context_pad=2)



def test_context_pad_must_leave_room_for_the_window(tiny_model):
    # crop() grows a window by S / (S - 2 p): p = S / 2 would divide by zero and larger
    # pads turn the box inside out (pycaffe fails an assert on the first window)
    caffe.Detector(*tiny_model, context_pad=3)                 # S = 8: 3 is the largest
    for pad in (4, 16):
        with pytest.raises(ValueError, match=r"context_pad %d .*side 8: give at most 3" % pad):
            caffe.Detector(*tiny_model, context_pad=pad)

# ------------------------------------------------------------------- crop
def test_crop_without_context_excludes_max_row_and_column(tiny_model):
    det = detector(tiny_model)
    im = grid_image()
    crop = det.crop(im, np.array([2, 3, 7, 11]))
    np.testing.assert_array_equal(crop, im[2:7, 3:11])
    assert crop.shape == (5, 8, 3)


# context_pad 2 on S = 8: scale = 8 / (8 - 4) = 2.  For a 4 x 4 window
# (ymax - ymin + 1 = 4) the half side 2 grows to 4: the box spans 9 pixels,
# so each image pixel is 8/9 of an input pixel.
def expect_canvas(det):
    return np.ones((S, S, 3)) * det.crop_mean


def test_crop_context_interior(tiny_model):
    det = detector(tiny_model, context_pad=2)
    im = grid_image()
    # window rows 3..6: centre 3 + 2 = 5, box 5 -+ 4 = 1..9 (full 9, inside the 10 rows);
    # crop_h = round(9 * 8/9) = 8 rows from im[1:9] (8 rows): no resampling.
    # columns 4..7: centre 6, box 2..10 in 12 columns, im[:, 2:10].
    crop = det.crop(im, np.array([3, 4, 6, 7]))
    assert crop.shape == (S, S, 3)
    np.testing.assert_allclose(crop, im[1:9, 2:10], atol=1e-6)


def test_crop_context_top_left_border_is_mean_filled(tiny_model):
    det = detector(tiny_model, context_pad=2)
    im = grid_image()
    # window 0..3: centre 2, box -2..6 (full 9); pad = round(2 * 8/9 = 1.78) = 2;
    # clipped box 0..6, clip 7, crop = round(7 * 8/9 = 6.22) = 6 from im[0:6].
    crop = det.crop(im, np.array([0, 0, 3, 3]))
    expected = expect_canvas(det)
    expected[2:8, 2:8] = im[0:6, 0:6]
    np.testing.assert_allclose(crop, expected, atol=1e-6)
    np.testing.assert_allclose(crop[0, 0], [30 / 255, 20 / 255, 10 / 255], rtol=1e-6)


def test_crop_context_bottom_right_border_is_mean_filled(tiny_model):
    det = detector(tiny_model, context_pad=2)
    im = grid_image()   # 10 x 12
    # rows 6..9: centre 8, box 4..12 -> clipped to 4..10 (to H itself), clip 7,
    # crop round(6.22) = 6 rows from im[4:10]; columns 8..11: box 6..14 -> 6..12,
    # 6 columns from im[:, 6:12]; no top/left pad.
    crop = det.crop(im, np.array([6, 8, 9, 11]))
    expected = expect_canvas(det)
    expected[0:6, 0:6] = im[4:10, 6:12]
    np.testing.assert_allclose(crop, expected, atol=1e-6)


def test_crop_context_resizes_the_box(tiny_model):
    det = detector(tiny_model, context_pad=2)
    im = grid_image()
    # a 2 x 2 window (rows 2..3, columns 3..4): centres 3 and 4, half 1 -> 2:
    # box 1..5 x 2..6 (full 5), crop round(5 * 8/5) = 8 from the 4 x 4 im[1:5, 2:6]
    crop = det.crop(im, [2, 3, 3, 4])               # a list works too
    np.testing.assert_allclose(crop, resize_image(im[1:5, 2:6], (8, 8)), atol=1e-6)
    assert not np.allclose(crop[:4, :4], im[1:5, 2:6])   # it was resampled


def test_crop_context_box_rounds_half_to_even(tiny_model):
    det = detector(tiny_model, context_pad=2)
    im = grid_image()
    # rows 4..6: half 1.5, centre 5.5, box 5.5 -+ 3 = 2.5..8.5 -> np.round 2..8
    # (rounding halves up would give 3..9), full 7; crop round(7 * 8/7) = 8 from
    # the 6 rows im[2:8].  Columns 4..7 as in the interior case: im[:, 2:10].
    crop = det.crop(im, np.array([4, 4, 6, 7]))
    np.testing.assert_allclose(crop, resize_image(im[2:8, 2:10], (8, 8)), atol=1e-6)


# --------------------------------------------------------- detect_windows
def write_image(path, rng, h, w):
    arr = rng.integers(0, 256, (h, w, 3), dtype=np.uint8)
    Image.fromarray(arr).save(path)
    return str(path)


def manual_prediction(det, crop):
    """Preprocess as pycaffe's Transformer by hand and forward one window."""
    x = resize_image(crop, (S, S)).astype(np.float64)   # (S, S, 3) RGB in [0, 1]
    x = x.transpose(2, 0, 1)[list(SWAP)]                # (3, S, S) BGR
    x = (x * RAW_SCALE - MEAN[:, None, None]) * INPUT_SCALE
    det.blobs["data"].data[...] = 0
    det.blobs["data"].data[0] = x
    return det.forward()["prob"][0].copy()


@pytest.mark.parametrize("context_pad", [0, 2])
def test_detect_windows_matches_manual_forward(tiny_model, tmp_path, monkeypatch, context_pad):
    rng = np.random.default_rng(5)
    a = write_image(tmp_path / "a.png", rng, 10, 12)
    b = write_image(tmp_path / "b.png", rng, 9, 9)
    wins_a = [np.array([0, 0, 5, 6]), np.array([3, 4, 9, 11])]
    wins_b = [np.array([1, 1, 8, 8]), np.array([0, 2, 4, 8]), np.array([4, 0, 9, 5])]
    det = detector(tiny_model, context_pad=context_pad)

    loads = []
    real_load = caffe.io.load_image
    monkeypatch.setattr(caffe.io, "load_image", lambda f, *a: loads.append(f) or real_load(f))
    dets = det.detect_windows([(a, wins_a), (b, wins_b)])   # 5 windows: batches 2 + 2 + 1
    assert loads == [a, b]                                  # each image once

    assert len(dets) == 5
    order = [(a, w) for w in wins_a] + [(b, w) for w in wins_b]
    for d, (fname, window) in zip(dets, order):
        assert set(d) == {"window", "prediction", "filename"}
        assert d["filename"] == fname and d["window"] is window
    for d in dets:
        im = real_load(d["filename"]).astype(np.float32)
        if context_pad:
            crop = det.crop(im, d["window"])                # checked by hand above
        else:
            y0, x0, y1, x1 = d["window"]
            crop = im[y0:y1, x0:x1]
        expected = manual_prediction(det, crop)
        assert d["prediction"].shape == (3,)
        np.testing.assert_allclose(d["prediction"], expected, rtol=1e-5, atol=1e-6)
    # the windows differ, and so do the (unsaturated) predictions
    assert all(0.01 < p < 0.99 for d in dets for p in d["prediction"])
    assert not np.allclose(dets[0]["prediction"], dets[1]["prediction"])


def test_detect_windows_takes_an_iterator_and_rejects_no_windows(tiny_model, tmp_path):
    rng = np.random.default_rng(6)
    a = write_image(tmp_path / "a.png", rng, 10, 10)
    det = detector(tiny_model)
    wins = [np.array([0, 0, 5, 5]), np.array([2, 2, 9, 9])]
    from_list = det.detect_windows([(a, wins)])
    from_iter = det.detect_windows(iter([(a, iter(wins))]))  # walked twice by pycaffe
    assert [d["window"] for d in from_iter] == wins
    for x, y in zip(from_list, from_iter):
        np.testing.assert_array_equal(x["prediction"], y["prediction"])
    with pytest.raises(ValueError, match="no windows"):
        det.detect_windows([(a, [])])


# ------------------------------------------------ detect_selective_search
def test_selective_search_missing_package_names_it(tiny_model, monkeypatch):
    monkeypatch.setitem(sys.modules, "selective_search_ijcv_with_python", None)
    det = detector(tiny_model)
    with pytest.raises(ImportError, match="selective_search_ijcv_with_python"):
        det.detect_selective_search(["x.jpg"])


def test_selective_search_windows_go_through_detect_windows(tiny_model, tmp_path,
                                                            monkeypatch):
    rng = np.random.default_rng(8)
    a = write_image(tmp_path / "a.png", rng, 10, 10)
    calls = []

    def get_windows(fnames, cmd):
        calls.append((list(fnames), cmd))
        return [np.array([[0, 0, 5, 5], [1, 2, 8, 9]])]

    fake = types.ModuleType("selective_search_ijcv_with_python")
    fake.get_windows = get_windows
    monkeypatch.setitem(sys.modules, "selective_search_ijcv_with_python", fake)
    monkeypatch.chdir(tmp_path)
    det = detector(tiny_model)
    dets = det.detect_selective_search(["a.png"])
    assert calls == [([a], "selective_search_rcnn")]       # absolute paths, R-CNN's command
    assert [d["filename"] for d in dets] == [a, a]
    want = det.detect_windows([(a, [np.array([0, 0, 5, 5]), np.array([1, 2, 8, 9])])])
    for d, w in zip(dets, want):
        np.testing.assert_array_equal(d["window"], w["window"])
        np.testing.assert_array_equal(d["prediction"], w["prediction"])


# ------------------------------------------------- python/detect.py's tool
def test_detect_tool_writes_csv_in_input_order(tiny_model, tmp_path, capsys):
    import csv

    from minicaffe.tools import detect

    rng = np.random.default_rng(9)
    a = write_image(tmp_path / "a.png", rng, 10, 12)
    b = write_image(tmp_path / "b.png", rng, 9, 9)
    np.save(tmp_path / "mean.npy", np.broadcast_to(MEAN[:, None, None], (3, 5, 5)))
    windows = tmp_path / "windows.csv"
    # columns by name, in upstream's documented xmin-first order; images interleaved
    windows.write_text("filename,xmin,ymin,xmax,ymax\n"
                       f"{b},1,1,8,8\n{a},0,0,6,5\n{b},2,0,8,4\n")
    out = tmp_path / "dets.csv"
    args = [str(windows), str(out), "--model_def", tiny_model[0], "--pretrained_model",
            tiny_model[1], "--crop_mode", "list", "--mean_file", str(tmp_path / "mean.npy"),
            "--input_scale", str(INPUT_SCALE), "--context_pad", "2"]
    assert detect.main(args) == 0
    with open(out, newline="") as f:
        rows = list(csv.reader(f))
    assert rows[0] == ["filename", "ymin", "xmin", "ymax", "xmax", "class0", "class1", "class2"]
    det = detector(tiny_model, context_pad=2)
    want = det.detect_windows([(b, [np.array([1, 1, 8, 8]), np.array([0, 2, 4, 8])]),
                               (a, [np.array([0, 0, 5, 6])])])
    assert len(rows) == 1 + len(want)
    for row, d in zip(rows[1:], want):
        assert row[0] == d["filename"]
        assert [int(c) for c in row[1:5]] == list(d["window"])
        np.testing.assert_allclose([float(p) for p in row[5:]], d["prediction"], rtol=1e-6)

    assert detect.main(args[:1] + [str(tmp_path / "dets.h5")] + args[2:]) == 1
    assert "only .csv" in capsys.readouterr().err



def test_detect_tool_user_mistakes_are_one_line_and_status_1(tiny_model, tmp_path, capsys):
    """python/detect.py's default --context_pad 16 on a net of side 8, a missing model, a
    missing mean file: the line says what, no traceback (they were raised outside the
    tool's try before)."""
    from minicaffe.tools import detect

    a = write_image(tmp_path / "a.png", np.random.default_rng(3), 10, 12)
    windows = tmp_path / "windows.csv"
    windows.write_text(f"filename,ymin,xmin,ymax,xmax\n{a},0,0,6,5\n")
    out = str(tmp_path / "dets.csv")
    base = [str(windows), out, "--crop_mode", "list", "--model_def", tiny_model[0],
            "--pretrained_model", tiny_model[1]]
    for extra, says in ((["--context_pad", "16"], "context_pad 16 leaves no room"),
                        (["--context_pad", "2", "--mean_file", str(tmp_path / "no.npy")],
                         "no.npy"),
                        ([], "context_pad 16")):              # the default, as pycaffe's
        assert detect.main(base + extra) == 1
        err = capsys.readouterr().err
        assert says in err and "Traceback" not in err and len(err.strip().splitlines()) == 1
    missing = base[:5] + [str(tmp_path / "none.prototxt")] + base[6:] + ["--context_pad", "2"]
    assert detect.main(missing) == 1
    assert "none.prototxt" in capsys.readouterr().err
    assert detect.main(base + ["--context_pad", "2"]) == 0
