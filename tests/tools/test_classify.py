"""classify (pycaffe's python/classify.py) on a tiny deploy net, on the CPU."""
import numpy as np
import pytest

import minicaffe as caffe
from minicaffe.backend import gpu_available
from minicaffe.tools.classify import main

DEPLOY = """
name: "tiny"
layer { name: "data" type: "Input" top: "data"
        input_param { shape { dim: 2 dim: 3 dim: 4 dim: 4 } } }
layer { name: "fc" type: "InnerProduct" bottom: "data" top: "fc"
        inner_product_param { num_output: 6 weight_filler { type: "gaussian" std: 0.3 }
                              bias_filler { type: "gaussian" std: 0.1 } } }
layer { name: "prob" type: "Softmax" bottom: "fc" top: "prob" }
"""


@pytest.fixture
def model(tmp_path):
    """(deploy prototxt, weights, mean .npy (3, 6, 6)) in tmp_path."""
    caffe.set_random_seed(0)
    deploy = tmp_path / "deploy.prototxt"
    deploy.write_text(DEPLOY)
    weights = tmp_path / "w.caffemodel"
    caffe.Net(str(deploy), caffe.TEST).save(str(weights))
    mean = tmp_path / "mean.npy"
    np.save(mean, np.random.default_rng(1).uniform(0, 255, (3, 6, 6)).astype(np.float32))
    return str(deploy), str(weights), str(mean)


def flags(model, *extra):
    deploy, weights, mean = model
    return ["--model_def", deploy, "--pretrained_model", weights, "--mean_file", mean,
            "--images_dim", "6,6", *extra]


def reference(model, images, oversample=True):
    """What caffe.Classifier gives with classify.py's settings."""
    deploy, weights, mean = model
    clf = caffe.Classifier(deploy, weights, image_dims=[6, 6],
                           mean=np.load(mean).mean(1).mean(1), raw_scale=255.0,
                           channel_swap=[2, 1, 0])
    return clf.predict(images, oversample)


def test_classify_a_npy_of_images(model, tmp_path, capsys):
    images = np.random.default_rng(2).uniform(0, 1, (3, 5, 7, 3)).astype(np.float32)
    np.save(tmp_path / "in.npy", images)
    out = tmp_path / "out"
    assert main([str(tmp_path / "in.npy"), str(out), *flags(model)]) == 0
    assert capsys.readouterr().out.splitlines()[:3] == [
        "CPU mode", f"Loading file: {tmp_path / 'in.npy'}", "Classifying 3 inputs."]
    predictions = np.load(str(out) + ".npy")                 # np.save appends .npy
    assert predictions.shape == (3, 6)
    np.testing.assert_allclose(predictions, reference(model, images), rtol=1e-6)
    np.testing.assert_allclose(predictions.sum(1), 1, rtol=1e-5)
    assert main([str(tmp_path / "in.npy"), str(out), *flags(model), "--center_only"]) == 0
    np.testing.assert_allclose(np.load(str(out) + ".npy"),
                               reference(model, images, oversample=False), rtol=1e-6)


def test_classify_an_image_and_a_directory(model, tmp_path, capsys):
    Image = pytest.importorskip("PIL.Image")
    rng = np.random.default_rng(3)
    (tmp_path / "imgs").mkdir()
    for name in ("b.png", "a.png", "c.png"):
        Image.fromarray(rng.integers(0, 256, (5, 7, 3), dtype=np.uint8)).save(
            tmp_path / "imgs" / name)
    (tmp_path / "imgs" / "skip.txt").write_text("not an image")
    loaded = [caffe.io.load_image(str(tmp_path / "imgs" / n)) for n in ("a.png", "b.png",
                                                                         "c.png")]
    out = str(tmp_path / "out.npy")
    assert main([str(tmp_path / "imgs"), out, *flags(model), "--ext", "png"]) == 0
    assert f"Loading folder: {tmp_path / 'imgs'}" in capsys.readouterr().out
    np.testing.assert_allclose(np.load(out), reference(model, loaded), rtol=1e-6)  # sorted
    assert main([str(tmp_path / "imgs" / "b.png"), out, *flags(model)]) == 0
    np.testing.assert_allclose(np.load(out), reference(model, loaded[1:2]), rtol=1e-6)
    capsys.readouterr()
    assert main([str(tmp_path / "imgs"), out, *flags(model)]) == 1       # no *.jpg there
    assert "no *.jpg files" in capsys.readouterr().err


def test_classify_without_a_mean_and_print_results(model, tmp_path, capsys):
    deploy, weights, _ = model
    images = np.random.default_rng(4).uniform(0, 1, (1, 6, 6, 3)).astype(np.float32)
    np.save(tmp_path / "in.npy", images)
    labels = tmp_path / "synset_words.txt"
    # synset_words.txt: 'id name, other names'; pycaffe sorts the lines by id
    labels.write_text("".join(f"n0{9 - i} class {i}, alias\n" for i in range(6)))
    out = str(tmp_path / "out.npy")
    assert main([str(tmp_path / "in.npy"), out, "--model_def", deploy, "--pretrained_model",
                 weights, "--mean_file", "", "--images_dim", "6,6", "--print_results",
                 "--labels_file", str(labels)]) == 0
    clf = caffe.Classifier(deploy, weights, image_dims=[6, 6], raw_scale=255.0,
                           channel_swap=[2, 1, 0])
    expect = clf.predict(images)
    np.testing.assert_allclose(np.load(out), expect, rtol=1e-6)
    names = [f"class {i}" for i in range(6)][::-1]          # ids n04..n09 sorted
    top = [(names[i], "%.5f" % expect[0][i]) for i in (-expect[0]).argsort()[:5]]
    assert str(top) in capsys.readouterr().out.splitlines()


def test_classify_requires_the_files_pycaffe_takes_from_its_tree(model, tmp_path, capsys):
    with pytest.raises(SystemExit) as e:
        main(["in.npy", "out.npy"])
    assert e.value.code == 2
    err = capsys.readouterr().err
    for flag in ("--model_def", "--pretrained_model", "--mean_file"):
        assert f"{flag} is required: pycaffe's default" in err
    assert "Caffe's source tree" in err and "--mean_file '' classifies without a mean" in err
    with pytest.raises(SystemExit):
        main(["in.npy", "out.npy", *flags(model), "--print_results"])
    assert "--labels_file is required" in capsys.readouterr().err
    assert main([str(tmp_path / "nowhere.npy"), "out.npy", *flags(model)]) == 1


@pytest.mark.skipif(gpu_available(), reason="checks the message without a CUDA device")
def test_classify_gpu_without_a_device(model, tmp_path, capsys):
    np.save(tmp_path / "in.npy", np.zeros((1, 6, 6, 3), np.float32))
    assert main([str(tmp_path / "in.npy"), str(tmp_path / "o"), *flags(model), "--gpu"]) == 1
    assert "--gpu: no CUDA device is visible" in capsys.readouterr().err
