#!/usr/bin/env bash
# decode_ab.sh against a stand-in benchmark (a script that prints a line like decode_bench's
# last): the medians and speed-ups of two and of three commands, the bits reported the same or
# not, and the exit status of a run without a result and of a wrong command line.
#   decode_ab_test.sh DECODE_AB
set -uo pipefail
ab="$(realpath "$1")"
dir="$(mktemp -d)"
trap 'rm -rf "$dir"' EXIT
failures=0
check() {  # check DESCRIPTION OUTPUT PATTERN: OUTPUT has a line matching PATTERN
  if grep -Eq -- "$3" <<< "$2"; then
    echo "ok: $1"
  else
    echo "FAILED: $1: no line matches '$3' in:"
    echo "$2"
    failures=$((failures + 1))
  fi
}

# fake MS SHA: a decode_bench whose step takes MS ms (1 us more at each run of that MS, by a
# counter file) and generates SHA.
cat > "$dir/fake" <<'SH'
#!/usr/bin/env bash
count_file="$(dirname "$0")/count.$1"
count=$(cat "$count_file" 2>/dev/null || echo 0)
echo $((count + 1)) > "$count_file"
echo "loading..."
ms=$(python3 -c "print($1 + 0.001 * $count)")
echo "{\"decode_step_ms\": $ms, \"tokens_per_s\": 100, \"decode_step_roofline_fraction\": 0.4, \"generation_sha256\": \"$2\"}"
SH
cat > "$dir/silent" <<'SH'
#!/usr/bin/env bash
echo "no result"
SH
chmod +x "$dir/fake" "$dir/silent"

out=$("$ab" 3 "$dir/fake 2.0 aa" "$dir/fake 1.0 aa" 2>&1)
check "two commands: medians" "$out" "^median step: A 2\.001 ms, B 1\.001 ms; B / A speed-up 1\.999x; same bits in every run: True$"
check "two commands: each run listed" "$out" "^B: 1\.002 ms a step, 100 tokens/s, 40\.0% of the roofline, aa$"

out=$("$ab" 1 "$dir/fake 4.0 aa" "$dir/fake 3.0 bb" "$dir/fake 8.0 aa" 2>&1)
check "three commands: medians and speed-ups" "$out" "^median step: A 4\.000 ms, B 3\.000 ms, C 8\.000 ms; B / A speed-up 1\.333x, C / A speed-up 0\.500x; same bits in every run: False$"
check "three commands: which generated A's bits" "$out" "^A's bits in every run: C$"

"$ab" 1 "$dir/fake 1.0 aa" "$dir/silent" > "$dir/out" 2>&1
status=$?
check "a run without a result fails" "$(cat "$dir/out"; echo "status $status")" "^status 1$"
check "and says which" "$(cat "$dir/out")" "a B run printed no result"

"$ab" 1 "$dir/fake 1.0 aa" > "$dir/out" 2>&1
status=$?
check "one command is a usage error" "$(cat "$dir/out"; echo "status $status")" "^status 2$"

echo "$failures failed"
[ "$failures" -eq 0 ]
