#!/usr/bin/env bash
# scratch: chain-block op orders on the H200 (deleted after the run)
set -u
export PYTHONPATH=kernels
R=$(mktemp -d)
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm --format=csv > $R/gpu.txt 2>&1
for n in 0 2 4 8; do
  timeout --foreground 100 python -m gdn_replayssm.bench_parts --parts flush --tokens 1,4 --batch-sizes 64,256 \
    --variants "flush 16x1 r168 persistent,flush 16x1 persistent normalised window" --chain-blocks $n --json \
    --out $R/parts-chain$n.jsonl > $R/parts-chain$n.log 2>&1
done
for n in 0 2 4 8; do
  python -m gdn_replayssm.bench --quick --json --tokens 1,4 --batch-sizes 64,256 --starts lockstep --chain-blocks $n \
    --max-seconds 75 --out $R/bench-chain$n.jsonl > $R/bench-chain$n.log 2>&1
done

tar -C $R -czf $OUT/chain.tgz . ; tail -n 4 $R/*.log
