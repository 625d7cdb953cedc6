#!/usr/bin/env bash
# Session 32, call 1: VGG-16's paper's rule under the recomputation bound (fit off, session 31's
# profile v reused), then the GPU tests of session 31's changes and Caffe's command lines on the
# device.  Needs docs/results/tuner_s32/prof_v/vgg16_profile.json (gunzip of tuner_s31/v's).
set -u
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl > /dev/null 2>&1 || exit 1
export PYTHONPATH=/tmp/site
D=$OUT/${TAG:-c1}; mkdir -p $D; T0=$(date +%s)
left() { echo $(( ${TOTAL:-585} - ($(date +%s) - T0) )); }
step() { echo "$1 rc $2 at $(( $(date +%s) - T0 )) s" >> $D/steps.txt; }
{ nvidia-smi --query-gpu=index,name,memory.total,clocks.max.sm --format=csv,noheader; nproc; date -u; } > $D/host.txt 2>&1
L=$(( $(left) - 200 ))
MINICAFFE_CUDNN_FIT_FASTEST=0 timeout $L python3 scripts/tuner_table.py --gpus 0 --nets vgg16:64 --engine CUDNN --r152-batch 0 --recompute vgg16=auto --profiles docs/results/tuner_s32/prof_v --timeout $(( L - 5 )) --out $D/vgg16 > $D/vgg16.txt 2>&1
step vgg16 $?
grep "^| vgg16" $D/vgg16/tuner_table.md
timeout $(( $(left) - 40 )) python3 scripts/gpu_checks.py tests/swap/test_swap_gpu.py tests/swap/test_dynamic_recompute.py tests/test_net.py tests/test_solver.py tests/test_pycaffe_surface.py tests/test_cli.py tests/test_gpu_training.py tests/test_graph.py > $D/gpu_tests.txt 2>&1
step gpu_tests $?
timeout 15 python3 -m minicaffe device_query -gpu 0 > $D/device_query.txt 2>&1; step device_query $?
timeout 45 python3 -m minicaffe time -model prototxt/resnet50/dummy.prototxt -gpu 0 -iterations 5 > $D/time.txt 2>&1; step time $?
cat $D/steps.txt; tail -12 $D/gpu_tests.txt; tail -4 $D/device_query.txt; tail -6 $D/time.txt
cd $OUT && tar czf ${TAG:-c1}.tgz ${TAG:-c1}
