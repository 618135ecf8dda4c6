"""Where a GPU's memory history and the estimator's prediction of it part (issue 28's gaps).

Usage: snapshot_gaps.py GPU.pickle PREDICTED.pickle [--min-mib M] [--top N]   (either may be .pickle.xz)

GPU.pickle is a memory history PyTorch wrote (`scripts/gpu/gpu_truth.py ... --snapshot FILE`, as
`scripts/gpu-check` runs it). PREDICTED.pickle is either the estimator's history of the same model
and step (`gpu-mem-track timeline MODEL --input SHAPE --mode train --optimizer adamw
--device-profile h100-80g -o FILE.pickle`: the cuBLAS workspaces placed, cuDNN's left to the GPU to
show), or the GPU's own allocations laid out again by the caching allocator model (`gpu-mem-track
timeline GPU.pickle -o FILE.pickle`), which tells whether the model reproduces the GPU's segments
from the same allocations. Both are plain pickles: no torch needed.

Prints, for each side:
  - the peak of the bytes asked for and of reserved memory, replayed from the trace (what was live before it started is
    taken from the snapshot's final segments);
  - the segments it reserved, by size;
  - its largest temporaries: blocks freed before any other allocation or free, which is how a
    library workspace (cuDNN, cuBLAS) shows in a trace;
then the allocations one side made that the other did not, from a greedy alignment of the two
sequences of bytes asked for, at least M MiB (default 1), each GPU-only one with the predicted ops
around it, and the segments those allocations made the GPU reserve.
"""
import lzma
import pickle
import sys
from collections import Counter

MIB = 2**20
# Sizes that recur everywhere (a 512-byte scalar) would resynchronise the alignment anywhere: a
# resynchronisation needs this many equal sizes in a row.
RUN = 3
# How far ahead the alignment looks for the other side to resynchronise.
WINDOW = 256


def fail(msg):
    sys.exit(f"snapshot_gaps.py: {msg}")


def load(path):
    try:
        # gpu-check brings histories back compressed (MODEL.pickle.xz).
        with (lzma.open(path, "rb") if path.endswith(".xz") else open(path, "rb")) as f:
            snap = pickle.load(f)
    except (OSError, lzma.LZMAError, pickle.UnpicklingError, EOFError, AttributeError, ImportError) as e:
        fail(f"{path}: not a readable pickle: {e}")
    if not isinstance(snap, dict) or not isinstance(snap.get("device_traces"), list):
        fail(f"{path}: no `device_traces` (is it a memory snapshot?)")
    traces = [t for t in snap["device_traces"] if t]
    if len(traces) != 1:
        fail(f"{path}: {len(traces)} devices with events; one expected")
    return snap, traces[0]


def op_of(entry):
    """The estimator's op and the call it is in, or the script line of a GPU's history."""
    frames = entry.get("frames") or []
    if not frames:
        return "?"
    f = frames[0]
    name = str(f.get("filename", ""))
    if name.endswith(".py"):
        return f"{name.rsplit('/', 1)[-1]}:{f.get('line', 0)}"
    return " in ".join(str(f.get("name", "?")) for f in frames)


class Side:
    """One trace, replayed."""

    def __init__(self, name, path):
        self.name = name
        snap, trace = load(path)
        for i, e in enumerate(trace):
            if not isinstance(e, dict) or "action" not in e:
                fail(f"{path}: device_traces entry {i} has no `action`")
        # Replay: allocated and reserved relative to the trace's start, then shifted by what the
        # final segments show was there before it.
        allocated = reserved = peak_allocated = peak_reserved = 0
        self.allocs = []  # (size, op, index in trace)
        self.segments = []  # (size, index into allocs of the allocation that asked for it)
        self.temporaries = []  # (size, op, size of the allocation before it)
        live = {}
        pending_segments = []
        last = None  # the previous alloc/free: (action, addr)
        for i, e in enumerate(trace):
            action, size = e["action"], int(e.get("size", 0))
            if action == "alloc":
                allocated += size
                peak_allocated = max(peak_allocated, allocated)
                live[e["addr"]] = len(self.allocs)
                for s in pending_segments:
                    self.segments.append((s, len(self.allocs)))
                pending_segments = []
                self.allocs.append((size, op_of(e), i))
                last = ("alloc", e["addr"])
            elif action == "free_completed":
                allocated -= size
                live.pop(e["addr"], None)
            elif action == "free_requested":
                if last == ("alloc", e["addr"]):
                    before = self.allocs[-2][0] if len(self.allocs) > 1 else 0
                    self.temporaries.append((size, self.allocs[-1][1], before))
                last = ("free", e["addr"])
            elif action == "segment_alloc":
                reserved += size
                peak_reserved = max(peak_reserved, reserved)
                pending_segments.append(size)
            elif action == "segment_free":
                reserved -= size
        final_reserved = sum(int(s.get("total_size", 0)) for s in snap.get("segments", []))
        final_allocated = sum(
            int(b.get("size", 0))
            for s in snap.get("segments", [])
            for b in s.get("blocks", [])
            if b.get("state") == "active_allocated"
        )
        self.base_reserved = max(final_reserved - reserved, 0)
        self.base_allocated = max(final_allocated - allocated, 0)
        self.peak_allocated = self.base_allocated + peak_allocated
        self.peak_reserved = self.base_reserved + peak_reserved

    def report(self, top):
        print(f"{self.name}: {len(self.allocs)} allocations, {len(self.segments)} segments reserved")
        print(f"  peak asked for {self.peak_allocated / MIB:9.1f} MiB (before the trace {self.base_allocated / MIB:.1f})")
        print(f"  peak reserved  {self.peak_reserved / MIB:9.1f} MiB (before the trace {self.base_reserved / MIB:.1f})")
        by_size = Counter(s for s, _ in self.segments)
        sizes = ", ".join(f"{n} x {s / MIB:.0f}" for s, n in sorted(by_size.items(), reverse=True))
        print(f"  segments (MiB): {sizes or 'none'}")
        temps = sorted(self.temporaries, reverse=True)[:top]
        if temps:
            print("  largest temporaries (size, op, the allocation before it):")
            for size, op, before in temps:
                print(f"    {size / MIB:9.2f} MiB  {op}  (after {before / MIB:.2f} MiB)")


def align(a, b):
    """Greedy alignment of two size sequences: (a-only indices, b-only indices, matched pairs)."""
    i = j = 0
    a_only, b_only, pairs = [], [], []

    def run(x, xi, y, yi):
        return all(
            xi + k < len(x) and yi + k < len(y) and x[xi + k] == y[yi + k] for k in range(RUN)
        )

    while i < len(a) and j < len(b):
        if a[i] == b[j]:
            pairs.append((i, j))
            i, j = i + 1, j + 1
            continue
        step = None
        for k in range(1, WINDOW):
            if run(a, i + k, b, j):
                step = ("a", k)
                break
            if run(a, i, b, j + k):
                step = ("b", k)
                break
        if step is None:
            a_only.append(i)
            b_only.append(j)
            i, j = i + 1, j + 1
        elif step[0] == "a":
            a_only.extend(range(i, i + step[1]))
            i += step[1]
        else:
            b_only.extend(range(j, j + step[1]))
            j += step[1]
    a_only.extend(range(i, len(a)))
    b_only.extend(range(j, len(b)))
    return a_only, b_only, pairs


def main(argv):
    args, min_mib, top = [], 1.0, 15
    it = iter(argv)
    for arg in it:
        if arg in ("--min-mib", "--top"):
            value = next(it, None)
            try:
                if arg == "--min-mib":
                    min_mib = float(value)
                else:
                    top = int(value)
            except (TypeError, ValueError):
                fail(f"{arg} needs a number, got {value!r}")
        elif arg.startswith("-"):
            fail(f"unknown option {arg}\n{__doc__}")
        else:
            args.append(arg)
    if len(args) != 2:
        sys.exit(__doc__)
    gpu, ours = Side("GPU", args[0]), Side("predicted", args[1])
    gpu.report(top)
    ours.report(top)
    print(
        f"reserved: predicted {ours.peak_reserved / MIB:.1f} MiB against the GPU's {gpu.peak_reserved / MIB:.1f}"
        f" ({(ours.peak_reserved - gpu.peak_reserved) / max(gpu.peak_reserved, 1) * 100:+.1f} %)"
    )
    a = [s for s, _, _ in gpu.allocs]
    b = [s for s, _, _ in ours.allocs]
    a_only, b_only, pairs = align(a, b)
    print(f"alignment: {len(pairs)} allocations on both sides, {len(a_only)} on the GPU only, {len(b_only)} predicted only")
    # Where each GPU-only allocation falls among the predicted ones: the matched allocations just
    # before and after it.
    matched = dict(pairs)
    match_before, match_after = [None] * len(a), [None] * len(a)
    seen = None
    for ai in range(len(a)):
        match_before[ai] = seen
        seen = matched.get(ai, seen)
    seen = None
    for ai in range(len(a) - 1, -1, -1):
        match_after[ai] = seen
        seen = matched.get(ai, seen)
    limit = min_mib * MIB
    big = [i for i in a_only if a[i] >= limit]
    print(f"GPU-only allocations of {min_mib:g} MiB or more: {len(big)}, {sum(a[i] for i in big) / MIB:.1f} MiB in all")
    for i in sorted(big, key=lambda i: -a[i])[:top]:
        before = ours.allocs[match_before[i]][1] if match_before[i] is not None else "the start"
        after = ours.allocs[match_after[i]][1] if match_after[i] is not None else "the end"
        print(f"  #{i:<6} {a[i] / MIB:9.2f} MiB  after predicted {before}, before {after}")
    big = [j for j in b_only if b[j] >= limit]
    print(f"predicted-only allocations of {min_mib:g} MiB or more: {len(big)}, {sum(b[j] for j in big) / MIB:.1f} MiB in all")
    for j in sorted(big, key=lambda j: -b[j])[:top]:
        print(f"  #{j:<6} {b[j] / MIB:9.2f} MiB  {ours.allocs[j][1]}")
    only = set(a_only)
    made = [(s, k) for s, k in gpu.segments if k in only]
    print(
        f"GPU segments asked for by GPU-only allocations: {len(made)}, {sum(s for s, _ in made) / MIB:.0f} MiB"
        f" of the {sum(s for s, _ in gpu.segments) / MIB:.0f} MiB the trace reserved"
    )


if __name__ == "__main__":
    main(sys.argv[1:])
