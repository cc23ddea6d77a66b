#!/usr/bin/env bash
# Builds the fuzz targets (fuzz/<target>_fuzz.cc; see fuzz/fuzz_target.h) with clang, libFuzzer,
# AddressSanitizer and UndefinedBehaviorSanitizer (every report fatal), and runs each one.
#
#   fuzz/run.sh [-runs=N | -max_total_time=S] [--merge] [TARGET...]
#
# TARGETs: safetensors, tokenizer, rollout_data, toml (default: all, in that order). Each runs for
# -runs=N executions (default 1000000) or -max_total_time=S seconds, from its checked-in corpus
# fuzz/corpus/<target>/, which is only read: new inputs go to the scratch corpus
# $FUZZ_OUT/corpus/<target>/ and crashing inputs to $FUZZ_OUT/artifacts/<target>/ (libFuzzer's
# -artifact_prefix; crash-*, leak-*, timeout-*, oom-*). $FUZZ_OUT defaults to /tmp/rl-fuzz.
# --merge then adds to fuzz/corpus/<target>/ the scratch inputs that reach new edges (libFuzzer's
# -merge=1, which keeps the corpus minimal); crashes are not merged: fix the parser,
# then copy the minimised crash (-minimize_crash=1) into the corpus under a descriptive name.
#
# The last lines are one summary per target: executions, time, exec/s, coverage (edges),
# features, the size of libFuzzer's in-memory corpus, and the crashes of this run (any sanitizer
# report, uncaught exception, -timeout=10 s hang or allocation beyond -rss_limit_mb=4096 leaves
# one artifact). Exit status 1 when a target failed to build or anything crashed.
# clang and its runtimes come from Debian (apt-get install clang libclang-rt-14-dev) and are
# installed when missing; CI does not need them (the corpora are replayed by
# `bazel test //fuzz:all`, built with gcc). Runs under `nice`: the fuzzers take every core given.
set -euo pipefail
cd "$(dirname "$0")/.."
root="$PWD"

runs_flag="-runs=1000000"
merge=0
targets=()
for arg in "$@"; do
  case "$arg" in
    -runs=*|-max_total_time=*) runs_flag="$arg" ;;
    --merge) merge=1 ;;
    safetensors|tokenizer|rollout_data|toml) targets+=("$arg") ;;
    *) echo "usage: fuzz/run.sh [-runs=N | -max_total_time=S] [--merge] [TARGET...]" >&2; exit 2 ;;
  esac
done
[[ ${#targets[@]} -gt 0 ]] || targets=(safetensors tokenizer rollout_data toml)

out="${FUZZ_OUT:-/tmp/rl-fuzz}"
mkdir -p "$out"/{bin,corpus,artifacts,logs,include}

# ---- clang with libFuzzer ------------------------------------------------------------------
if ! command -v clang++ >/dev/null; then
  echo "installing clang (Debian) ..." >&2
  apt-get update -qq && apt-get install -y -qq clang >&2
fi
# Debian puts libFuzzer and the sanitizer runtimes in libclang-rt-<major>-dev, which clang only
# recommends.
if ! echo 'extern "C" int LLVMFuzzerTestOneInput(const char*, long) { return 0; }' |
    clang++ -x c++ -fsanitize=fuzzer,address,undefined - -o "$out/bin/probe" 2>/dev/null; then
  major="$(clang++ -dumpversion | cut -d. -f1)"
  echo "installing libclang-rt-${major}-dev (libFuzzer, sanitizer runtimes) ..." >&2
  apt-get update -qq && apt-get install -y -qq "libclang-rt-${major}-dev" >&2
fi

# ---- LibTorch, found as third_party/repositories.bzl finds it --------------------------------
torch_root="$(python3 -c "import importlib.util as u; s = u.find_spec('torch'); \
print(s.submodule_search_locations[0] if s else '')")"
[[ -n "$torch_root" ]] || { echo "the Python package torch is missing; run tools/setup.sh" >&2; exit 1; }
# Torch bundles fmt 12 under include/fmt; our code uses Debian's fmt 9 (as the Bazel build does),
# so the include directory is rebuilt without it.
torch_include="$out/include/torch"
mkdir -p "$torch_include"
for entry in "$torch_root"/include/*; do
  if [[ "$(basename "$entry")" != fmt ]]; then ln -sfn "$entry" "$torch_include/"; fi
done

# ---- build ------------------------------------------------------------------------------------
# Each source is compiled once into $FUZZ_OUT/obj/ (shared by the targets) and again only when it
# or a header it read (clang -MMD) changed.
cxxflags=(-std=c++17 -O1 -g -fno-omit-frame-pointer -fsanitize=fuzzer,address,undefined
          -fno-sanitize-recover=all -DFMT_HEADER_ONLY -Wall -I"$root"
          -isystem "$torch_include" -isystem "$torch_include/torch/csrc/api/include")
torch_libs=(-L"$torch_root/lib" -Wl,-rpath,"$torch_root/lib" -ltorch_cpu -lc10)

sources_of() {
  case "$1" in
    safetensors) echo trainer/model/safetensors.cc launch/json.cc launch/utf8.cc \
                      launch/atomic_file.cc ;;
    tokenizer) echo trainer/data/tokenizer.cc trainer/data/pretokenizer.cc launch/utf8.cc \
                    launch/json.cc launch/atomic_file.cc ;;
    rollout_data) echo trainer/rl/rollout_data.cc launch/json.cc launch/utf8.cc \
                       launch/atomic_file.cc ;;
    toml) echo trainer/config/toml.cc trainer/config/config.cc trainer/config/validate.cc \
               launch/utf8.cc ;;
  esac
}

# True when `object` is missing or older than a file its dependency list names.
stale() {
  local object="$1" file
  [[ -f "$object" && -f "$object.d" ]] || return 0
  for file in $(sed -e 's/^[^:]*://' -e 's/\\$//' "$object.d"); do
    if [[ "$file" -nt "$object" ]]; then return 0; fi
  done
  return 1
}

build() {
  local target="$1" source object objects=() relink=0
  local binary="$out/bin/${target}_fuzz"
  mkdir -p "$out/obj"
  for source in "fuzz/${target}_fuzz.cc" $(sources_of "$target"); do
    object="$out/obj/${source//\//_}.o"
    objects+=("$object")
    if stale "$object"; then
      echo "compiling $source ..." >&2
      nice -n 19 clang++ "${cxxflags[@]}" -MMD -MF "$object.d" -c "$source" -o "$object" ||
        return 1
    fi
    if [[ "$object" -nt "$binary" ]]; then relink=1; fi
  done
  if [[ -x "$binary" && $relink -eq 0 ]]; then return 0; fi
  local libs=()
  [[ "$target" != safetensors ]] || libs=("${torch_libs[@]}")
  [[ "$target" != tokenizer ]] || libs=(-l:libpcre2-8.a)  # static, as in the Bazel build
  nice -n 19 clang++ -fsanitize=fuzzer,address,undefined "${objects[@]}" "${libs[@]}" \
    -o "$binary"
}

# ---- run --------------------------------------------------------------------------------------
declare -A summary
status=0
for target in "${targets[@]}"; do
  if ! build "$target"; then
    summary[$target]="$target: BUILD FAILED"
    status=1
    continue
  fi
  corpus="$out/corpus/$target"
  artifacts="$out/artifacts/$target"
  log="$out/logs/$target.log"
  mkdir -p "$corpus" "$artifacts"
  echo "fuzzing $target ($runs_flag) ..." >&2
  started="$out/logs/$target.started"  # artifacts newer than this are this run's
  touch "$started"
  start=$(date +%s.%N)
  set +e
  # -timeout: an input that takes longer than 10 s is a hang; -rss_limit_mb: an allocation driven
  # by a length in the input shows up as an out-of-memory finding instead of swapping.
  ASAN_OPTIONS=detect_leaks=1:abort_on_error=0 UBSAN_OPTIONS=print_stacktrace=1 \
    nice -n 19 "$out/bin/${target}_fuzz" "$runs_flag" -timeout=10 -rss_limit_mb=4096 \
    -print_final_stats=1 -artifact_prefix="$artifacts/" "$corpus" "fuzz/corpus/$target" \
    >"$log" 2>&1
  rc=$?
  set -e
  seconds=$(awk -v a="$start" -v b="$(date +%s.%N)" 'BEGIN { printf "%.1f", b - a }')
  execs=$(grep -o 'stat::number_of_executed_units: *[0-9]*' "$log" | grep -o '[0-9]*$' || echo 0)
  last=$(grep -E '^#[0-9]+' "$log" | tail -1)
  cov=$(grep -o 'cov: [0-9]*' <<<"$last" | grep -o '[0-9]*' || echo "?")
  ft=$(grep -o 'ft: [0-9]*' <<<"$last" | grep -o '[0-9]*' || echo "?")
  units=$(grep -o 'corp: [0-9]*' <<<"$last" | grep -o '[0-9]*' || echo "?")
  crashes=$(find "$artifacts" -type f -newer "$started" | wc -l)
  rate=$(awk -v n="${execs:-0}" -v s="$seconds" 'BEGIN { printf "%.0f", n / s }')
  summary[$target]="$(printf '%s: %s execs in %.0f s (%s exec/s), cov %s ft %s, corpus %s units, crashes %s%s' \
    "$target" "${execs:-0}" "$seconds" "$rate" "$cov" "$ft" "$units" "$crashes" \
    "$([[ $rc -eq 0 ]] || echo ", libFuzzer exit $rc; see $log")")"
  [[ $rc -eq 0 && $crashes -eq 0 ]] || status=1

  if [[ $merge -eq 1 ]]; then
    # -use_counters=0: an input is kept for a new edge, not for a new hit count of a known one,
    # which keeps the checked-in corpus a few hundred files.
    nice -n 19 "$out/bin/${target}_fuzz" -merge=1 -use_counters=0 "fuzz/corpus/$target" "$corpus" \
      >"$out/logs/$target.merge.log" 2>&1
    echo "$target: merged into fuzz/corpus/$target ($(ls "fuzz/corpus/$target" | wc -l) files)" >&2
  fi
done

for target in "${targets[@]}"; do echo "${summary[$target]}"; done
exit $status
