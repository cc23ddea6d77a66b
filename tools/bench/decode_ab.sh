#!/usr/bin/env bash
# Two or more decode_bench runs compared in one call, in turn (A, B, ..., A, B, ...: the GPU
# machines are noisy, and alternating spreads the noise over every command):
#   tools/bench/decode_ab.sh ROUNDS 'A COMMAND' 'B COMMAND' ['C COMMAND' ...]
# Each command is a whole decode_bench command line (a build and its flags, such as
#   '.gpu/before/decode_bench --checkpoint /tmp/q06 --batch 64 --no-split-k-linear'),
# to which --step-time is added. Prints each run's decode step time, tokens/s, roofline fraction
# and generation_sha256, then per command the median step time and its speed-up over A (A's
# median over its own), and whether every run generated the same bits; with more than two
# commands, also which commands generated A's bits in every run. Exit status 1 when a run fails
# or prints no result, 2 on a wrong command line.
set -euo pipefail
if [ $# -lt 3 ] || [ $# -gt 27 ] || ! [[ "$1" =~ ^[1-9][0-9]*$ ]]; then
  echo "usage: $0 ROUNDS 'A COMMAND' 'B COMMAND' ['C COMMAND' ...] (at most 26 commands)" >&2
  exit 2
fi
rounds="$1"
shift
commands=("$@")
labels=(A B C D E F G H I J K L M N O P Q R S T U V W X Y Z)
results="$(mktemp)"
trap 'rm -f "$results"' EXIT

for ((round = 1; round <= rounds; round++)); do
  for ((side = 0; side < ${#commands[@]}; side++)); do
    label="${labels[$side]}"
    # shellcheck disable=SC2086  # the command is a command line, split into its words
    if ! line=$(${commands[$side]} --step-time | tail -n 1); then
      echo "decode_ab: run $round of $label failed: ${commands[$side]}" >&2
      exit 1
    fi
    printf '%s\t%s\n' "$label" "$line" >> "$results"
  done
done

python3 - "$results" "${#commands[@]}" <<'PY'
import json
import statistics
import sys

labels = "ABCDEFGHIJKLMNOPQRSTUVWXYZ"[: int(sys.argv[2])]
runs = {label: [] for label in labels}
for entry in open(sys.argv[1]):
    label, _, text = entry.rstrip("\n").partition("\t")
    try:
        result = json.loads(text)
    except json.JSONDecodeError:
        sys.exit(f"decode_ab: a {label} run printed no result: {text[-200:]!r}")
    if "decode_step_ms" not in result:
        sys.exit(f"decode_ab: a {label} run reported no decode step time (fewer than 2 new tokens?)")
    runs[label].append(result)
    fraction = result.get("decode_step_roofline_fraction")
    print(f"{label}: {result['decode_step_ms']:.3f} ms a step, {result['tokens_per_s']:.0f} tokens/s"
          + (f", {100 * fraction:.1f}% of the roofline" if fraction is not None else "")
          + f", {result.get('generation_sha256', '-')}")
medians = {label: statistics.median(r["decode_step_ms"] for r in rs) for label, rs in runs.items()}
shas = {label: {r.get("generation_sha256") for r in rs} for label, rs in runs.items()}
every = set().union(*shas.values())
print("median step: " + ", ".join(f"{label} {medians[label]:.3f} ms" for label in labels) + "; "
      + ", ".join(f"{label} / A speed-up {medians['A'] / medians[label]:.3f}x" for label in labels[1:])
      + f"; same bits in every run: {len(every) == 1 and None not in every}")
if len(labels) > 2:
    same = [label for label in labels[1:] if shas[label] == shas["A"] and len(shas["A"]) == 1
            and None not in shas["A"]]
    print("A's bits in every run: " + (", ".join(same) if same else "none"))
PY
