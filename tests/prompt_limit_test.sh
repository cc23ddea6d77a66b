#!/usr/bin/env bash
# Prompts that do not fit (Note [Prompt length limit] in trainer/engine_rollout.cc), on the
# embedded default (tiny Qwen3: a context of 256 positions, responses of 1 token), one property
# per case:
#   1. a 2 MB prompt line and a 300-token one are dropped at start-up with one warning giving
#      their count and line numbers; the run goes on, its KV cache sized by the prompts kept;
#   2. a file whose every prompt is too long stops the run with status 2 naming the option;
#   3. --rollout-max-prompt-len + --rollout-max-response-len beyond the model's context: status 2
#      naming both;
#   4. a KV cache region that cannot be mapped: status 2 naming the options that size it.
set -euo pipefail
trainer="$1" config="$2" toy="$3"
here="$(dirname "$0")"
tmp="${TEST_TMPDIR:-$(mktemp -d)}"
failed=0
fail() { echo "FAIL: $*"; failed=1; }
run() {  # run LOG [ARGS...]: the trainer on 1 rank, one iteration; prints its exit status
  local log="$1"
  shift
  set +e
  "$here/mpi_run.sh" 1 "$trainer" --config "$config" --num-rollout 1 "$@" > "$log" 2>&1
  echo $?
  set -e
}

# 22 prompts: the first 20 toy prompts with a 2 MB line at line 4 and a 300-byte one at line 8
# (the default's tokenizer is byte-level: one token per byte).
{
  head -n 3 "$toy"
  printf '{"prompt": "%s", "label": "1"}\n' "$(head -c 2000000 /dev/zero | tr '\0' x)"
  sed -n 4,6p "$toy"
  printf '{"prompt": "%s", "label": "1"}\n' "$(head -c 300 /dev/zero | tr '\0' y)"
  sed -n 7,20p "$toy"
} > "$tmp/long.jsonl"
status=$(run "$tmp/1.log" --prompt-data "$tmp/long.jsonl")
[[ $status -eq 0 ]] || fail "1: status $status with two long prompts: $(tail -n 5 "$tmp/1.log")"
warning="2 of 22 prompts in $tmp/long.jsonl are longer than --rollout-max-prompt-len 255 tokens and are dropped (lines 4, 8)"
[[ $(grep -cF "$warning" "$tmp/1.log") -eq 1 ]] || fail "1: no single warning '$warning'"
grep -q "rollout engine: 20 prompts, batch 256 x 9 tokens" "$tmp/1.log" ||
  fail "1: the engine is not sized by the prompts kept: $(grep 'rollout engine' "$tmp/1.log")"

printf '{"prompt": "%s", "label": "1"}\n' "$(head -c 300 /dev/zero | tr '\0' z)" > "$tmp/all_long.jsonl"
status=$(run "$tmp/2.log" --prompt-data "$tmp/all_long.jsonl")
[[ $status -eq 2 ]] && grep -q "every prompt of .*all_long.jsonl is longer than --rollout-max-prompt-len 255" "$tmp/2.log" ||
  fail "2: status $status: $(grep -i error "$tmp/2.log")"

status=$(run "$tmp/3.log" --rollout-max-prompt-len 256)
[[ $status -eq 2 ]] && grep -q -- "--rollout-max-prompt-len 256 + --rollout-max-response-len 1 exceed the model's context of 256" "$tmp/3.log" ||
  fail "3: status $status: $(grep -i error "$tmp/3.log")"

# 268 TiB: beyond x86-64's 128 TiB of user address space, so no overcommit setting maps it.
status=$(run "$tmp/4.log" --rollout-batch-size 4000000000 --global-batch-size 16)
[[ $status -eq 2 ]] && grep -q "the kv_cache region of .* --rollout-batch-size 4000000000 x --n-samples-per-prompt 16.*--rollout-max-response-len 1" "$tmp/4.log" ||
  fail "4: status $status: $(grep -i error "$tmp/4.log" | cut -c1-300)"

[[ $failed -eq 0 ]] && echo "PASS"
exit $failed
