#!/usr/bin/env bash
# Session 32, CPU: the latest profiles of six networks replayed by `minicaffe plan` (their saved
# GMAPs).  Usage, from the repository root: bash docs/results/tuner_s32/replay.sh OUTDIR
set -u
O=${1:?an output folder}; mkdir -p $O
P=$(mktemp -d); R=docs/results
zcat $R/tuner_s32/c/googlenet/tuner/googlenet_profile.json.gz > $P/googlenet.json
zcat $R/tuner_s31/v/vgg16_profile.json.gz > $P/vgg16.json
zcat $R/tuner_s32/c/resnet34/tuner/resnet34_profile.json.gz > $P/resnet34.json
zcat $R/tuner_s32/b/resnet50/tuner/resnet50_profile.json.gz > $P/resnet50.json
zcat $R/tuner_s32/a/resnet101/tuner/resnet101_profile.json.gz > $P/resnet101.json
zcat $R/tuner_s31/a/resnet152_profile.json.gz > $P/resnet152.json
run() { n=$1; shift; python3 -m minicaffe plan --budget 12G --search bisect --profile $P/${n%%.*}.json "$@" > $O/$n.txt 2>&1; }
run googlenet & run vgg16 --recompute auto & wait
run vgg16.largest --recompute auto --k-objective largest & run resnet34 & wait
run resnet50 & run resnet101 & wait
run resnet152
rm -rf $P
grep -H "^k\* =\|^predicted" $O/*.txt
