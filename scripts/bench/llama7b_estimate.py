"""The in-process estimator's benchmark on a model people train: a Llama-2-7B-shaped config built
under ``with Estimator():``, one AdamW step at batch 1 x 4096, without a GPU. Prints the seconds,
the process's peak RSS and the estimate. With ``--memtracker``, the same step under
``torch.distributed._tools.mem_tracker.MemTracker`` and ``FakeTensorMode`` instead, for comparison.
With ``--compiled``, the model ``torch.compile``'d (inductor), two steps: the first compiles, the
second runs what was compiled; the compile's seconds are the first step's less the second's.

Usage: python scripts/bench/llama7b_estimate.py [--memtracker | --compiled]
       (needs torch, transformers, gpu_mem_track)
"""

from __future__ import annotations

import resource
import sys
import time

import torch
import transformers

CONFIG = transformers.LlamaConfig(
    hidden_size=4096,
    intermediate_size=11008,
    num_hidden_layers=32,
    num_attention_heads=32,
    num_key_value_heads=32,
    vocab_size=32000,
    max_position_embeddings=4096,
)
SHAPE = (1, 4096)


def with_estimator() -> str:
    from gpu_mem_track import Estimator

    ids = torch.randint(0, CONFIG.vocab_size, SHAPE)
    with Estimator(device_profile="h100-80g") as est:
        model = transformers.AutoModelForCausalLM.from_config(CONFIG).cuda()
        opt = torch.optim.AdamW(model.parameters())
        loss = model(input_ids=ids.cuda(), labels=ids.cuda()).loss
        loss.backward()
        opt.step()
        opt.zero_grad()
    return f"{est}\n{est.breakdown(depth=2)}"


def with_estimator_compiled() -> str:
    from gpu_mem_track import Estimator

    ids = torch.randint(0, CONFIG.vocab_size, SHAPE)
    took = []
    with Estimator(device_profile="h100-80g") as est:
        model = transformers.AutoModelForCausalLM.from_config(CONFIG).cuda()
        run = torch.compile(model)
        opt = torch.optim.AdamW(model.parameters())
        for _ in range(2):
            started = time.time()
            run(input_ids=ids.cuda(), labels=ids.cuda()).loss.backward()
            opt.step()
            opt.zero_grad()
            took.append(time.time() - started)
    steps = f"first step (compiles) {took[0]:.1f} s, second {took[1]:.1f} s: compile {took[0] - took[1]:.1f} s"
    return f"{steps}\n{est}\n{est.breakdown(depth=2)}"


def with_memtracker() -> str:
    from torch._subclasses.fake_tensor import FakeTensorMode
    from torch.distributed._tools.mem_tracker import MemTracker

    with FakeTensorMode():
        model = transformers.AutoModelForCausalLM.from_config(CONFIG)
        opt = torch.optim.AdamW(model.parameters(), foreach=True)
        ids = torch.randint(0, CONFIG.vocab_size, SHAPE)
        tracker = MemTracker()
        tracker.track_external(model, opt)
        with tracker:
            loss = model(input_ids=ids, labels=ids).loss
            loss.backward()
            opt.step()
            opt.zero_grad()
        peak = tracker.get_tracker_snapshot("peak")
    return "\n".join(f"{dev}: " + ", ".join(f"{k}: {b / 2**20:.1f} MiB" for k, b in v.items()) for dev, v in peak.items())


if __name__ == "__main__":
    start = time.time()
    runs = {"--memtracker": with_memtracker, "--compiled": with_estimator_compiled}
    text = runs.get(sys.argv[1] if sys.argv[1:] else "", with_estimator)()
    took = time.time() - start
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    print(f"{took:.1f} s, max RSS {rss:.0f} MiB")
    print(text)
