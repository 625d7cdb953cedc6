"""pycaffe's own layer_type_list test, as a spec: BVLC Caffe
python/caffe/test/test_layer_type_list.py, written for pytest and run through
``import caffe``.
"""
import minicaffe  # noqa: F401  (makes ``import caffe`` reach minicaffe)
import caffe


def test_standard_types():
    types = caffe.layer_type_list()
    for type_name in ['Data', 'Convolution', 'InnerProduct']:
        assert type_name in types, '%s not in layer_type_list()' % type_name
    # LayerRegistry::LayerTypeList walks a std::map: sorted, each type once
    assert list(types) == sorted(set(types))
    assert 'NoSuchLayer' not in types
