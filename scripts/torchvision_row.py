"""One row of scripts/torchvision-figures from `gpu-mem-track estimate --json` on stdin."""
import json
import sys

e = json.load(sys.stdin)
g = e["gpu"]
base = e["param_bytes"] + e["buffer_bytes"] + e["input_bytes"]


def mib_range(low, high):
    low, high = low / 2**20, high / 2**20
    return f"{low:.1f}" if low == high else f"{low:.1f}-{high:.1f}"


alloc = mib_range(g["peak_allocated"]["low"] - base, g["peak_allocated"]["high"] - base)
reserved = mib_range(g["peak_reserved"]["low"], g["peak_reserved"]["high"])
print(f"{sys.argv[1]:<20} {e['param_count']:>14} {alloc:>24} {reserved:>20}")
