"""Sums the GPU kernel time of a Chrome trace (train_step_bench or decode_bench --profile FILE)
by kernel name: python3 tools/bench/profile_summary.py FILE [--top 25]. Prints the total and the
top kernels with their share, so that a profile says where a step's device time goes.

Under programmatic dependent launch a kernel starts while the one ahead still runs (it loads its
weights, then waits), so its duration counts time that the kernel ahead counts too. The second
table charges each kernel only the time it adds to its stream's timeline: its end less the latest
end of the kernels of that stream that started before it (0 where it ends earlier). Those times
add up, per stream, to the span its kernels keep it busy, and say which kernel a step waits for.

--timeline N also lists N kernels in the order they start, from the middle of the trace (a decode
step's layer in steady state), each with its start and end relative to the first one's start: how
far each kernel runs ahead of the one before it and how long after it ends."""
import argparse
import collections
import json

parser = argparse.ArgumentParser()
parser.add_argument("trace")
parser.add_argument("--top", type=int, default=25)
parser.add_argument("--timeline", type=int, default=0,
                    help="also list this many consecutive kernels from the middle of the trace")
args = parser.parse_args()
events = [e for e in json.load(open(args.trace))["traceEvents"]
          if e.get("ph") == "X" and e.get("cat") in ("kernel", "gpu_memcpy", "gpu_memset")]
by_name = collections.Counter()
count = collections.Counter()
for e in events:
    by_name[e["name"]] += e["dur"]
    count[e["name"]] += 1
total = sum(by_name.values())
print(f"GPU time {total / 1e3:.1f} ms in {sum(count.values())} kernels")
for name, us in by_name.most_common(args.top):
    print(f"{us / 1e3:8.2f} ms {100 * us / total:5.1f}% x{count[name]:<5d} {name[:110]}")

added = collections.Counter()
latest_end = {}  # per stream (the trace's pid and tid: device and stream)
for e in sorted(events, key=lambda e: e["ts"]):
    stream = (e.get("pid"), e.get("tid"))
    end = e["ts"] + e["dur"]
    if stream not in latest_end:
        added[e["name"]] += e["dur"]
    elif end > latest_end[stream]:
        added[e["name"]] += end - max(latest_end[stream], e["ts"])
    latest_end[stream] = max(latest_end.get(stream, end), end)
busy = sum(added.values())
print(f"\nTime each kernel adds to the timeline (overlap with kernels ahead not counted): "
      f"{busy / 1e3:.1f} ms busy")
for name, us in added.most_common(args.top):
    print(f"{us / 1e3:8.2f} ms {100 * us / busy:5.1f}% x{count[name]:<5d} {name[:110]}")

if args.timeline > 0:
    ordered = sorted((e for e in events if e.get("cat") == "kernel"), key=lambda e: e["ts"])
    window = ordered[len(ordered) // 2:len(ordered) // 2 + args.timeline]
    origin = window[0]["ts"] if window else 0
    print(f"\n{args.timeline} kernels from the middle of the trace (us from the first's start): "
          "start, end, duration, start less the end of the kernel before")
    previous_end = None
    for e in window:
        name = e["name"].replace("(anonymous namespace)::", "").replace("void ", "")
        short = name.split("(")[0].replace("rl::kernels::", "").replace("__nv_bfloat16", "bf16")
        start, end = e["ts"] - origin, e["ts"] + e["dur"] - origin
        lead = "" if previous_end is None else f"{start - previous_end:8.2f}"
        print(f"{start:9.2f} {end:9.2f} {e['dur']:8.2f} {lead:>8} {short[:80]}")
        previous_end = end
