"""Command-line tools in the manner of Caffe's ``tools/`` and ``build/tools``.

Each runs with ``python -m minicaffe.tools.<name> --help``:

* ``convert_imageset``: a list of ``path label`` lines and a root folder of
  images (PNG/JPEG through Pillow, or ``.npy`` arrays) to an LMDB or LevelDB
  of Datum records (raw or ``-encoded``), keyed ``%08d_<path>`` as Caffe's tool;
* ``compute_image_mean``: the mean image of an LMDB or LevelDB, as a
  ``.binaryproto``, with Caffe's per-channel ``mean_value`` lines;
* ``make_digits``: the bundled 8x8 digits as ``train_lmdb``, ``test_lmdb`` and
  ``mean.binaryproto``, a tiny real data set for the examples and tests;
* ``draw_net``: pycaffe's ``python/draw_net.py``, a net drawn as a graph
  (``caffe.draw``; also ``minicaffe draw``);
* ``detect``: pycaffe's ``python/detect.py``, a ``caffe.Detector`` over a CSV
  of windows (or selective search proposals), detections written as CSV;
* ``classify``: pycaffe's ``python/classify.py``, a ``caffe.Classifier`` over an
  image, a directory of images or a ``.npy``, predictions saved as ``.npy``;
* ``parse_log``: Caffe's ``tools/extra/parse_log.py``, a training log (Caffe's or
  minicaffe's) as ``.train`` and ``.test`` CSV tables;
* ``extract_features``: a trained net's blobs, one Datum of ``float_data`` per
  image, into new LMDBs or LevelDBs keyed ``%010d`` as Caffe's tool;
* ``upgrade_net_proto_text``, ``upgrade_net_proto_binary``,
  ``upgrade_solver_proto_text``: a V0/V1 net prototxt or ``.caffemodel``, or a
  solver with ``solver_type``, rewritten in the current format, with Caffe's
  log lines and exit statuses.

Each module also exposes its work as a function (``convert_imageset``,
``compute_image_mean``, ``make_digits``, ``parse_log``, ``extract_features``, ``upgrade_net_proto``,
``upgrade_solver_proto``;
``caffe.draw.draw_net_to_file`` for ``draw_net``) for use from Python.
"""
