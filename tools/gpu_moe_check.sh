#!/usr/bin/env bash
# MoE checks on the GPU machine, from the repository root: tools/gpu_moe_check.sh BIN_DIR OUT_DIR
# BIN_DIR holds moe_sync_check and decode_bench (built here: bazel build
# //tools/bench:moe_sync_check //tools/bench:decode_bench, then copied).
#  1. moe_sync_check: the grouped MoE block equals a per-expert loop (fp32 exactly, bf16 within
#     tolerance; forward and gradients) for the softmax and the sigmoid noaux_tc routers, and its
#     bf16 forward + backward, no-grad forward and a Decoder::DecodeStep never synchronise with
#     the host (sync debug mode L_ERROR: the error names the op that did).
#  2. decode_bench --compare-eager on the tiny Qwen3-MoE fixture (tests/fixtures/qwen3_moe, bf16
#     on the GPU): its MoE blocks are sync-free, so it must decode by CUDA graphs, and the graphs
#     must generate bit-identical tokens and log-probs to eager steps, greedy and sampled.
# Logs: OUT_DIR/moe_sync_check.log, OUT_DIR/decode_moe.log. Prints each exit status, the JSON
# lines and the verdict; exits 1 when a check failed.
set -uo pipefail
bin="$1" out="$2"
mkdir -p "$out"
failed=0
"$bin/moe_sync_check" > "$out/moe_sync_check.log" 2>&1
rc=$?
echo "moe_sync_check rc $rc"
[ "$rc" -eq 0 ] || failed=1
tail -n 3 "$out/moe_sync_check.log" | cut -c1-3000
"$bin/decode_bench" --checkpoint tests/fixtures/qwen3_moe --batch 8 --prompt-len 16 \
  --new-tokens 16 --compare-eager > "$out/decode_moe.log" 2>&1
rc=$?
echo "decode_bench (qwen3_moe fixture) rc $rc"
[ "$rc" -eq 0 ] || failed=1
tail -n 2 "$out/decode_moe.log" | cut -c1-1000
if ! tail -n 1 "$out/decode_moe.log" | grep -q '"cuda_graphs":true'; then
  echo "decode_bench did not decode the MoE fixture by CUDA graphs"
  failed=1
fi
[ "$failed" -eq 0 ] && echo "MoE checks passed" || echo "MoE checks FAILED"
exit "$failed"
