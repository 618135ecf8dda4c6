"""What cuDNN allocates for an LSTM or GRU on cuda:0, for the estimator's model of it
(gpu-mem-track-estimate-sys/csrc/cudnn_rnn.cpp): for each geometry and option (layers, directions,
biases, dropout between layers), every block allocated in one training forward and its backward,
in order, with when it was freed, from PyTorch's memory history. One JSON line per case, after a
first line with the size of cuDNN's dropout state: PyTorch makes it once per device and process,
at the first training step with dropout (`get_dropout_state` in aten/src/ATen/native/cudnn/RNN.cpp),
so the cases' warm-up steps make it, never their recorded ones.

Usage: gpu_rnn_sizes.py   (needs a CUDA GPU)
"""
import itertools
import json

import torch


def events():
    return torch.cuda.memory._snapshot()["device_traces"][0]


def blocks(trace, start, marks):
    """Allocations from trace[start:], each [size, phase freed in] (phases split at `marks`)."""
    out, where = [], {}
    for i, e in enumerate(trace[start:], start):
        if e["action"] == "alloc":
            where[e["addr"]] = len(out)
            out.append([e["size"], "kept"])
        elif e["action"] == "free_requested" and e["addr"] in where:
            phase = next(name for name, end in marks if i < end)
            out[where.pop(e["addr"])][1] = phase
    return out


dev = torch.device("cuda:0")
# The dropout state alone, as PyTorch makes it for a training RNN with dropout (a byte tensor of
# cudnnDropoutGetStatesSize bytes).
state = torch._cudnn_init_dropout_state(0.5, True, 0, dtype=torch.uint8, device=dev)
print(json.dumps({"dropout_state_bytes": state.numel()}), flush=True)
del state
geometries = [(32, 64, 65, 256), (16, 32, 64, 128), (64, 128, 128, 512), (8, 16, 24, 32), (32, 64, 512, 128)]
options = [(layers, bidirectional, bias, dropout)
           for layers in (1, 2, 3) for bidirectional in (False, True) for bias in (True, False)
           for dropout in ((0.0, 0.5) if layers > 1 else (0.0,))]
for (batch, seq, features, hidden), kind, (layers, bidirectional, bias, dropout) in itertools.product(
        geometries, ("LSTM", "GRU"), options):
    torch.manual_seed(0)
    m = getattr(torch.nn, kind)(features, hidden, num_layers=layers, bidirectional=bidirectional,
                                bias=bias, dropout=dropout, batch_first=True).to(dev)
    x = torch.randn(batch, seq, features, device=dev)
    out, _ = m(x)  # warm-up: handles, plans, the dropout state
    out.sum().backward()
    m.zero_grad(set_to_none=True)
    del out
    torch.cuda.synchronize()
    torch.cuda.memory._record_memory_history(enabled="all", context=None, stacks="python", max_entries=100000)
    start = len(events())
    out, _ = m(x)
    after_forward = len(events())
    loss = out.sum()
    loss.backward()
    torch.cuda.synchronize()
    trace = events()
    torch.cuda.memory._record_memory_history(enabled=None)
    end = len(trace)
    print(json.dumps({
        "kind": kind, "layers": layers, "bidirectional": bidirectional, "bias": bias, "dropout": dropout,
        "batch": batch, "seq": seq, "features": features, "hidden": hidden,
        "blocks": blocks(trace, start, [("forward", after_forward), ("backward", end + 1)]),
        "forward_events": after_forward - start,
    }), flush=True)
    del m, x, out, loss
    torch.cuda.empty_cache()
