#!/usr/bin/env bash
# tools/forward on a fixture: writes a logits file for ragged rows; bad flags exit 2 naming the
# flag; a bad checkpoint exits 1 with the checkpoint error. (The logits themselves are compared
# with transformers by //trainer/model:decoder_test, which runs the same Decoder.)
set -uo pipefail
forward="$1"
fixtures="${TEST_SRCDIR}/${TEST_WORKSPACE}/tests/fixtures"
out="${TEST_TMPDIR}/logits.safetensors"
failures=0

expect() {  # expect STATUS PATTERN -- ARGS...
  local want="$1" pattern="$2"
  shift 3
  local err
  err=$("${forward}" "$@" 2>&1 >/dev/null)
  local got=$?
  if [[ ${got} -ne ${want} ]] || ! grep -q -- "${pattern}" <<<"${err}"; then
    echo "FAIL: forward $* exited ${got} (want ${want}), stderr: ${err} (want /${pattern}/)"
    failures=$((failures + 1))
  fi
}

expect 0 "" -- --checkpoint "${fixtures}/glm_moe_dsa" --tokens "1,2,3,4,5,6;7,8" --output "${out}"
if [[ ! -s "${out}" ]]; then
  echo "FAIL: no output file"
  failures=$((failures + 1))
fi
# Header of the output: one tensor "logits", F32, [2, 6, 128].
if ! head -c 400 "${out}" | grep -q '"logits":{"dtype":"F32","shape":\[2,6,128\]'; then
  echo "FAIL: unexpected header: $(head -c 200 "${out}" | tr -d '\0')"
  failures=$((failures + 1))
fi
expect 2 "--tokens" -- --checkpoint "${fixtures}/qwen3" --tokens "1,x" --output "${out}"
expect 2 "--tokens" -- --checkpoint "${fixtures}/qwen3" --tokens "1,999" --output "${out}"
expect 2 "--output" -- --checkpoint "${fixtures}/qwen3" --tokens "1,2"
expect 2 "--bogus" -- --checkpoint "${fixtures}/qwen3" --tokens "1,2" --output "${out}" --bogus 1
expect 1 "config.json" -- --checkpoint "${TEST_TMPDIR}/nothing" --tokens "1,2" --output "${out}"

if [[ ${failures} -ne 0 ]]; then
  echo "${failures} check(s) failed"
  exit 1
fi
echo "all checks passed"
