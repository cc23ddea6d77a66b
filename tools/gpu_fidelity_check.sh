#!/usr/bin/env bash
# The train/rollout log-prob mismatch on the GPU machine, in bf16 (with .gpu/trainer built here):
# tools/gpu_fidelity_check.sh OUT_DIR [ITERATIONS] [--wide] [ONLY] [TRAINER_FLAG...]
# Runs the embedded default (dense Qwen3) and three MoE CI recipes on one GPU in bf16, decoding by
# CUDA graphs, each without replay and with rollout routing replay (R3; for GLM-5 also with the
# indexer's top-k replayed), and prints per run the mean over iterations of
# train_rollout_logprob_abs_diff, the largest per-iteration maximum and the mean importance ratio.
# --wide: the same 4-layer models at the widths of the real ones (Qwen3-0.6B for the dense model;
# Qwen3-30B-A3B and GLM-4.7-Flash for the MoE ones; for GLM-5 its attention and indexer widths,
# which its decode kernels take, with the CI hidden size, experts and index_topk: the rest would
# not fit one GPU), with the CI vocabulary kept so that the toy task's tokenizer still fits, and
# 32 samples an iteration. ONLY (a bash pattern, e.g. 'glm47*') runs only the runs whose names match it; the
# flags after it are passed to every run (e.g. --no-rollout-mla-latent-decode).
set -uo pipefail
out="$1"
iterations="${2:-5}"
wide="${3:-}"
only="${4:-*}"
extra=("${@:5}")
widen() {  # widen NAME CONFIG: writes $out/NAME.json, the CI model of CONFIG at the real widths
  python3 - "$2" "$1" "$out/$1.json" <<'PY'
import json, re, sys
config, name, dest = sys.argv[1:]
path = re.search(r'model_config = "(.*)"', open(config).read()).group(1)
model = json.load(open(path))
full = {"dense": "configs/models/tiny_qwen3.json"}.get(name, path.replace("_4layer_ci", ""))
if name == "dense":  # Qwen3-0.6B's widths
    model.update(hidden_size=1024, intermediate_size=3072, num_attention_heads=16,
                 num_key_value_heads=8, head_dim=128)
elif name == "glm5":  # GLM-5's attention (MLA) and indexer widths
    real = json.load(open(full))
    model.update({k: real[k] for k in (
        "num_attention_heads", "num_key_value_heads", "head_dim", "q_lora_rank", "kv_lora_rank",
        "qk_nope_head_dim", "qk_rope_head_dim", "v_head_dim", "index_n_heads", "index_head_dim")})
else:
    real = json.load(open(full))
    keep = ("vocab_size", "num_hidden_layers", "first_k_dense_replace", "mlp_only_layers",
            "max_position_embeddings", "eos_token_id", "bos_token_id", "pad_token_id")
    model.update({k: v for k, v in real.items() if k not in keep and k in model})
model["num_hidden_layers"] = 4
json.dump(model, open(dest, "w"), indent=1)
PY
}
run() {
  local name="$1" config="$2"
  shift 2
  # shellcheck disable=SC2053
  [[ "$name" == $only ]] || return 0
  if [[ "$wide" == --wide ]]; then
    widen "${name%%_r3*}" "$config"
    set -- --model-config "$out/${name%%_r3*}.json" --rollout-batch-size 8 \
      --n-samples-per-prompt 4 --global-batch-size 32 --micro-batch-size 8 "$@"
  fi
  mpirun --allow-run-as-root -np 1 .gpu/trainer --config "$config" --device cuda \
    --actor-num-gpus-per-node 1 --params-dtype bf16 --num-rollout "$iterations" \
    --rollout-max-response-len 16 --metrics-out "$out/$name.jsonl" "$@" "${extra[@]}" > "$out/$name.log" 2>&1
  echo "$name rc $? $(grep -h 'routing replay check' "$out/$name.log" | tail -1 | cut -c1-120)"
}
run dense configs/default.toml
run qwen3_moe configs/qwen3_30b_a3b_4layer_ci.toml --no-use-rollout-routing-replay
run qwen3_moe_r3 configs/qwen3_30b_a3b_4layer_ci.toml --use-rollout-routing-replay
run glm47_flash configs/glm47_flash_4layer_ci.toml --no-use-rollout-routing-replay
run glm47_flash_r3 configs/glm47_flash_4layer_ci.toml --use-rollout-routing-replay
run glm5 configs/glm5_744b_a40b_4layer_ci.toml --no-use-rollout-routing-replay
run glm5_r3 configs/glm5_744b_a40b_4layer_ci.toml --use-rollout-routing-replay
run glm5_r3_indexer configs/glm5_744b_a40b_4layer_ci.toml --use-rollout-routing-replay \
  --use-rollout-indexer-replay
python3 - "$out" <<'PY'
import glob, json, os, sys
print(f"{'run':18} {'iters':>5} {'mean |diff|':>12} {'max |diff|':>11} {'ratio mean':>11}")
for path in sorted(glob.glob(os.path.join(sys.argv[1], "*.jsonl"))):
    rows = [json.loads(line) for line in open(path)]
    d = [r["train_rollout_logprob_abs_diff"] for r in rows if "train_rollout_logprob_abs_diff" in r]
    m = [r["train_rollout_logprob_abs_diff_max"] for r in rows if "train_rollout_logprob_abs_diff_max" in r]
    q = [r["train_rollout_ratio_mean"] for r in rows if "train_rollout_ratio_mean" in r]
    if not d:
        print(f"{os.path.basename(path)[:-6]:18} no metrics")
        continue
    print(f"{os.path.basename(path)[:-6]:18} {len(d):5d} {sum(d)/len(d):12.3e} {max(m):11.3e} "
          f"{sum(q)/len(q):11.6f}")
PY
