#!/usr/bin/env bash
# Session 42, call g: the graph API's GPU tests after the search's overrun check, and call e's
# failure on the graph API with its whole traceback.
set -u
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl > /dev/null 2>&1 || exit 1
export PYTHONPATH=/tmp/site:$PWD
mkdir -p $OUT/g
timeout 60 python3 scripts/gpu_checks.py tests/cudnn/test_backend_api.py > $OUT/g/gpu_checks.txt 2>&1; echo "backend_api tests rc $?"; tail -3 $OUT/g/gpu_checks.txt
MINICAFFE_CUDNN_API=graph timeout 120 python3 scripts/gpu_checks.py --failures $OUT/g/failures.txt -k replays_the_tuners tests/swap/test_swap_gpu.py > $OUT/g/replays.txt 2>&1; echo "replays on the graph API rc $?"; tail -3 $OUT/g/replays.txt
grep -n "^E " $OUT/g/failures.txt | head -20
cd $OUT && tar czf g.tgz g && rm -rf g
