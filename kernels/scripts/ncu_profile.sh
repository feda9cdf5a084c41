#!/usr/bin/env bash
# Nsight Compute profiles of the three ReplaySSM kernels at B = 256 (Qwen3.6 GDN shapes, fp32 state),
# one launch each, from bench_parts' eager mode. Run on a GPU machine from the repository root:
#     kernels/scripts/ncu_profile.sh OUTDIR
# Writes OUTDIR/{fold,decode,window}.ncu-rep, OUTDIR/ncu-details.txt (every section, all three) and
# OUTDIR/src-{fold,decode,window}.csv (per-SASS-instruction counters: stall reasons, executed instructions).
# --clock-control none: the clocks stay as the benchmarks see them.
# NCU_DECODE_VARIANT picks the bench_parts decode variant (default "decode 64x4", `_decode_kernel`; the kernel regex
# matches the key-head decode's too, e.g. "decode key head 64x4 kc32"); NCU_DECODE_WP pins the
# decode rows' history length (bench_parts --window-wp; default: half the ring); NCU_KERNELS, a subset of
# "fold decode window" (default all three); NCU_BATCH the batch size (default 256); NCU_FOLD_TOKENS the fold's T
# (default 4; 1 for a decode step's fold, capped as the launcher caps it) and NCU_FOLD_VARIANT its bench_parts
# variant (default "flush 16x1 persistent"); NCU_WINDOW_VARIANT the window kernel's (default "window 32x2 k32 s3";
# "window 32x2 k32 s3 preload" at NCU_BATCH=1, the small-batch default); NCU_PARTS_ARGS more bench_parts arguments,
# e.g. "--chain-blocks 2" for another op order.
set -u
out=${1:?usage: ncu_profile.sh OUTDIR}
mkdir -p "$out"
export PYTHONPATH=kernels PYTHONUNBUFFERED=1
read -r -a extra <<<"${NCU_PARTS_ARGS:-}"
parts=(python3 -m gdn_replayssm.bench_parts --batch-sizes "${NCU_BATCH:-256}" --eager 1 "${extra[@]}")
profile() {  # name kernel-regex bench_parts-arguments...
    local name=$1 kernel=$2
    shift 2
    ncu --clock-control none --set full --import-source yes -k "regex:$kernel" -c 1 -f -o "$out/$name" \
        "${parts[@]}" "$@"
}
wanted() { [[ " ${NCU_KERNELS:-fold decode window} " == *" $1 "* ]]; }
wanted fold && profile fold _flush_persistent_kernel --parts flush --tokens "${NCU_FOLD_TOKENS:-4}" \
    --variants "${NCU_FOLD_VARIANT:-flush 16x1 persistent}"
wanted decode && profile decode _decode_kernel --parts window --tokens 1 --variants "${NCU_DECODE_VARIANT:-decode 64x4}" \
    ${NCU_DECODE_WP:+--window-wp "$NCU_DECODE_WP"}
wanted window && profile window _window_kernel --parts window --tokens 4 --variants "${NCU_WINDOW_VARIANT:-window 32x2 k32 s3}"
for name in fold decode window; do
    [ -f "$out/$name.ncu-rep" ] || continue
    { echo "##### $name"; ncu -i "$out/$name.ncu-rep" --page details; } >>"$out/ncu-details.txt"
    ncu -i "$out/$name.ncu-rep" --page source --csv --print-source sass >"$out/src-$name.csv" 2>&1
done
