"""Lists the GPU events (kernels, copies) around one decode step's boundary of a Chrome trace
(decode_bench --profile FILE): python3 tools/bench/step_boundary.py FILE [--around N].
It finds the sampling kernel in the middle of the trace and prints the N events before and after
it in the order they start, each with its start, duration and the gap since the latest end before
it (us), so that what a step spends between its last layer and the next step's first is seen."""
import argparse
import json

parser = argparse.ArgumentParser()
parser.add_argument("trace")
parser.add_argument("--around", type=int, default=14)
args = parser.parse_args()
events = sorted((e for e in json.load(open(args.trace))["traceEvents"]
                 if e.get("ph") == "X" and e.get("cat") in ("kernel", "gpu_memcpy", "gpu_memset")),
                key=lambda e: e["ts"])
samples = [i for i, e in enumerate(events) if "Sample" in e["name"]]
if not samples:
    raise SystemExit("no sampling kernel in the trace")
middle = samples[len(samples) // 2]
window = events[max(0, middle - args.around):middle + args.around + 1]
t0 = window[0]["ts"]
latest_end = t0
for e in window:
    gap = e["ts"] - latest_end
    print(f"{e['ts'] - t0:9.2f} {e['dur']:8.2f} gap {gap:7.2f}  {e.get('cat'):10s} "
          f"{e['name'][:90]}")
    latest_end = max(latest_end, e["ts"] + e["dur"])
