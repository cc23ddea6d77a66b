"""Sums the GPU kernel time of a Chrome trace (train_step_bench --profile FILE) by kernel name:
python3 tools/bench/profile_summary.py FILE [--top 25]. Prints the total and the top kernels with
their share, so that a profile says where a step's device time goes."""
import argparse
import collections
import json

parser = argparse.ArgumentParser()
parser.add_argument("trace")
parser.add_argument("--top", type=int, default=25)
args = parser.parse_args()
events = json.load(open(args.trace))["traceEvents"]
by_name = collections.Counter()
count = collections.Counter()
for e in events:
    if e.get("ph") == "X" and e.get("cat") in ("kernel", "gpu_memcpy", "gpu_memset"):
        by_name[e["name"]] += e["dur"]
        count[e["name"]] += 1
total = sum(by_name.values())
print(f"GPU time {total / 1e3:.1f} ms in {sum(count.values())} kernels")
for name, us in by_name.most_common(args.top):
    print(f"{us / 1e3:8.2f} ms {100 * us / total:5.1f}% x{count[name]:<5d} {name[:110]}")
