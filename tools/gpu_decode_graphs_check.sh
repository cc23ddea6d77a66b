#!/usr/bin/env bash
# Decode by CUDA graphs inside the trainer, on the GPU machine (with .gpu/trainer built here):
# tools/gpu_decode_graphs_check.sh OUT_DIR [CONFIG]
# CONFIG (default: the embedded default, the tiny dense Qwen3 learning the toy task, every CI check
# on; an MoE recipe such as configs/qwen3_30b_a3b_4layer_ci.toml decodes by graphs too) on one GPU
# in bf16 with responses of up to 16 tokens, once decoding by CUDA graphs and once by eager steps.
# Graph replays compute what the eager steps compute, so the rollouts, and with them every
# training metric, must be identical. Prints the decode mode of each run and the verdict.
set -uo pipefail
out="$1"
config="${2:-configs/default.toml}"
run() {
  mpirun --allow-run-as-root -np 1 .gpu/trainer --config "$config" --device cuda \
    --actor-num-gpus-per-node 1 --params-dtype bf16 --num-rollout 10 \
    --rollout-max-response-len 16 "$@"
}
run --metrics-out "$out/graphs.jsonl" > "$out/graphs.log" 2>&1; echo "graphs rc $?"
run --no-rollout-cuda-graphs --metrics-out "$out/eager.jsonl" > "$out/eager.log" 2>&1
echo "eager rc $?"
grep -h "rollout engine:\|error" "$out/graphs.log" "$out/eager.log" | cut -c1-240
python3 - "$out/graphs.jsonl" "$out/eager.jsonl" <<'PY'
import json, sys
def rows(path):
    # Everything but wall-clock figures and memory readings (the graphs keep a memory pool).
    skip = ("tokens_per_s", "gpu_bytes", "host_pinned_bytes", "rss_bytes")
    return [{k: v for k, v in json.loads(line).items()
             if not k.startswith("time_") and k not in skip} for line in open(path)]
a, b = rows(sys.argv[1]), rows(sys.argv[2])
print(f"{len(a)} iterations; last reward_mean {a[-1].get('reward_mean')}, "
      f"response_length_mean {a[-1].get('response_length_mean')}")
print("metrics identical (graphs vs eager)" if a == b and a else
      "metrics DIFFER:\n" + "\n".join(f"{x}\n{y}" for x, y in zip(a, b) if x != y))
PY
