#!/usr/bin/env bash
# Session 42, call a (prepared in session 41): the host's cost of a convolution through cuDNN's
# graph API with its plan built once (backend_probe.py), beside session 41's legacy figures
# (conv_host.py again in the same call, for the same machine's pace); then search_noise.py:
# cuDNN's search times for ResNet-152's convolutions at 15-72, three searches each.
set -u
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl > /dev/null 2>&1 || exit 1
export PYTHONPATH=/tmp/site:$PWD
mkdir -p $OUT/a
timeout 200 python3 docs/results/tuner_s42/backend_probe.py 200 > $OUT/a/backend_probe.txt 2>&1; echo "probe rc $?"
cat $OUT/a/backend_probe.txt | tail -14
timeout 150 python3 docs/results/tuner_s41/conv_host.py 200 > $OUT/a/conv_host.txt 2>&1; echo "conv_host rc $?"
tail -5 $OUT/a/conv_host.txt
timeout 200 python3 docs/results/tuner_s42/search_noise.py resnet152 15,16,17,36,63,72 3 > $OUT/a/search_noise.txt 2>&1; echo "search_noise rc $?"
cat $OUT/a/search_noise.txt | tail -6
cd $OUT && tar czf a.tgz a && rm -rf a
