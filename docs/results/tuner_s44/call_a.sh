#!/usr/bin/env bash
# Session 44, call a (prepared in session 43): the whole GPU suite on this session's code, with
# cuDNN's graph API now the default. Session 43's CPU-side changes have not run on a GPU:
# 1dac274 (test nets' room in the planner), the memory-budget walkthrough's changes to swap/
# and cli, --max-batch, and the bad-input audit's in-place check at net setup. Whole
# tracebacks go to failures_a.txt. (Session 43's call ab: 900 passed in 237 s.)
set -u
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl > /dev/null 2>&1 || exit 1
export PYTHONPATH=/tmp/site:$PWD
mkdir -p $OUT/a
FILES=$(grep -rl "mark.gpu" tests --include="*.py" | sort)
T0=$(date +%s)
timeout 560 python3 scripts/gpu_checks.py --failures $OUT/a/failures_a.txt $FILES > $OUT/a/gpu_checks_a.txt 2>&1; echo "suite rc $? in $(( $(date +%s) - T0 )) s"
tail -30 $OUT/a/gpu_checks_a.txt
cd $OUT && tar czf a.tgz a && rm -rf a
