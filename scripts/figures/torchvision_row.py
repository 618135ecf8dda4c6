"""One row of scripts/figures/torchvision-figures from two `gpu-mem-track estimate --json` outputs: with
eager lifetimes, then with TorchScript lifetimes."""
import json
import sys


def mib_range(low, high):
    low, high = low / 2**20, high / 2**20
    return f"{low:.1f}" if low == high else f"{low:.1f}-{high:.1f}"


def delta(e):
    """max_memory_allocated() - memory_allocated() after loading the model and the input."""
    g = e["gpu"]["peak_delta"]
    return mib_range(g["low"], g["high"])


name, eager_file, script_file = sys.argv[1:4]
with open(eager_file) as f:
    e = json.load(f)
with open(script_file) as f:
    ts = json.load(f)
reserved = mib_range(e["gpu"]["peak_reserved"]["low"], e["gpu"]["peak_reserved"]["high"])
print(f"{name:<20} {e['param_count']:>14} {delta(e):>24} {reserved:>20} {delta(ts):>22}")
