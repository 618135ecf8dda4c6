"""The in-process estimator against a GPU: each Python model that ran eagerly on a GPU
(`gpu_truth.py --eager`, one truth.jsonl line), built again on the CPU by models.py and estimated
by `gpu_mem_track.estimate()` with the same inputs and step (two AdamW steps; the model's loss
given labels, else the sum of its outputs), beside what the GPU measured, held to the GPU table's
acceptance (acceptance.py).

Without TRUTH.jsonl: the GPU table's two Hugging Face rows, against what an H100 measured for their
traced models (issue 41's reference figures: NVIDIA H100 80GB HBM3, torch 2.11.0+cu130,
2026-11-27), until an eager run of them has been measured.

usage: python scripts/gpu/in_process.py [TRUTH.jsonl] [--device-profile NAME]   (default h100-80g;
       needs gpu_mem_track, and transformers / torchvision for the models that use them)
"""

from __future__ import annotations

import argparse
import json
import time

import gpu_mem_track
import torch
from acceptance import HEADER, verdict
from models import build, inputs

MIB = 2**20
# The traced H100 rows: name, mode, shape, peak allocated and reserved (bytes).
REFERENCE = [
    {"name": "hf-bert", "mode": "train", "shape": [8, 128], "peak_allocated": 2191.1 * MIB, "peak_reserved": 2472 * MIB},
    {"name": "hf-gpt2", "mode": "train", "shape": [4, 128], "peak_allocated": 2448.8 * MIB, "peak_reserved": 2760 * MIB},
]


def estimate(row: dict, device_profile: str) -> dict:
    """The in-process estimate of one row's model, step and inputs."""
    model = build(row["name"])
    args, kwargs = inputs(row["name"], row["shape"], "cpu")
    return gpu_mem_track.estimate(
        model, *args, mode=row["mode"], optimizer="adamw", device_profile=device_profile, **kwargs
    )


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("truth", nargs="?", help="gpu_truth.py's JSON lines (the --eager ones are estimated)")
    parser.add_argument("--device-profile", default="h100-80g")
    a = parser.parse_args()
    if a.truth:
        with open(a.truth) as f:
            rows = [r for r in map(json.loads, f) if r.get("eager")]
        if not rows:
            raise SystemExit(f"{a.truth}: no --eager rows to estimate in-process")
    else:
        rows = REFERENCE
    print(f"in-process estimates ({a.device_profile}, torch {torch.__version__}) against the GPU's runs")
    print(HEADER)
    failed = 0
    for row in rows:
        started = time.time()
        try:
            gpu = estimate(row, a.device_profile).gpu
        except Exception as e:  # noqa: BLE001 - a model that cannot be estimated is a row's result
            print(f"ERR {row['name']} {row['mode']}: {type(e).__name__}: {e}".splitlines()[0])
            failed = 1
            continue
        line = verdict(row, gpu)
        failed |= line.startswith("OFF")
        print(f"{line}  [{time.time() - started:.1f} s]", flush=True)
    return failed


if __name__ == "__main__":
    raise SystemExit(main())
