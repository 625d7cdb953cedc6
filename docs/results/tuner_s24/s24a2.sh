set -u
mkdir -p $OUT/r
timeout 100 python3 -m pytest -q -m gpu tests/scripts/test_fused_bench.py > $OUT/r/t.txt 2>&1; echo "test rc $?" >> $OUT/r/t.txt
timeout 150 python3 scripts/fused_bench.py --batch 85 --out $OUT/r/fused_bench.csv > $OUT/r/fused_bench.txt 2>&1; echo "bench rc $?"
tail -3 $OUT/r/t.txt; cat $OUT/r/fused_bench.txt | tail -32
