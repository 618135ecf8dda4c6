"""The torchvision sweep (scripts/figures/torchvision-sweep): exports, estimates and compares."""
import json
import subprocess
import sys
import time

import torch
import torchvision

# Run for real on the CPU too (small enough for a CPU training step at batch 2 in seconds): live
# after forward and the peak within 2 % of the CPU's.
COMPARED = ["alexnet", "convnext_tiny", "densenet121", "efficientnet_b0", "googlenet", "mnasnet0_5",
            "mobilenet_v2", "mobilenet_v3_small", "regnet_y_400mf", "resnet18", "shufflenet_v2_x0_5",
            "squeezenet1_0"]


def export(name, path, weights):
    """Scripted (traced where scripting fails); on meta (no weights in the file) unless `weights`."""
    kwargs = {"aux_logits": False, "init_weights": False} if name in ("googlenet", "inception_v3") else {}
    size = 299 if name == "inception_v3" else 224
    if weights:
        model = torchvision.models.get_model(name, weights=None, **kwargs)
    else:
        try:
            with torch.device("meta"):
                model = torchvision.models.get_model(name, weights=None, **kwargs)
        except Exception:  # noqa: BLE001 - regnet's init reads values: build on the CPU, then move
            model = torchvision.models.get_model(name, weights=None, **kwargs).to("meta")
    model.train()
    try:
        torch.jit.script(model).save(path)
        return "script", size
    except Exception:  # noqa: BLE001 - any scripting failure falls back to tracing
        example = torch.rand(2, 3, size, size, device="meta" if not weights else "cpu")
        torch.jit.trace(model, example, check_trace=False).save(path)
        return "trace", size


def estimate(binary, path, size, run_on):
    cmd = [binary, "estimate", path, "--input", f"2x3x{size}x{size}", "--mode", "train", "--optimizer", "adam",
           "--run-on", run_on, "--json"]
    started = time.time()
    p = subprocess.run(cmd, capture_output=True, text=True, check=False)
    if p.returncode != 0:
        return None, (p.stderr.strip().splitlines() or [f"exit {p.returncode}"])[-1], time.time() - started
    return json.loads(p.stdout), None, time.time() - started


def main():
    binary, out = sys.argv[1], sys.argv[2]
    names = sys.argv[3:] or torchvision.models.list_models(module=torchvision.models)
    failed, off, rows = [], [], 0
    print(f"{'model':<22} {'how':<6} {'params':>12} {'meta peak MiB':>14} {'cpu peak MiB':>13} {'diff %':>7} "
          f"{'meta live MiB':>14} {'cpu live MiB':>13} {'diff %':>7} {'s':>6}  cpu fallback")
    for name in names:
        compared = name in COMPARED
        path = f"{out}/{name}.pt"
        try:
            how, size = export(name, path, weights=compared)
        except Exception as e:  # noqa: BLE001
            print(f"{name:<22} cannot export: {str(e).splitlines()[0][:100]}")
            failed.append(name)
            continue
        meta, error, seconds = estimate(binary, path, size, "meta")
        if meta is None:
            print(f"{name:<22} {how:<6} FAILED on meta: {error[:140]}")
            failed.append(name)
            continue
        rows += 1
        fallback = ", ".join(f"{o['op']} x{o['calls']}" for o in meta.get("cpu_fallback", [])) or "-"
        mib = lambda b: b / 2**20
        line = f"{name:<22} {how:<6} {meta['param_count']:>12} {mib(meta['peak']['bytes']):>14.1f}"
        if compared:
            cpu, error, _ = estimate(binary, path, size, "cpu")
            if cpu is None:
                print(f"{line} CPU run failed: {error[:120]}")
                off.append(name)
                continue
            d_peak = (meta["peak"]["bytes"] - cpu["peak"]["bytes"]) / cpu["peak"]["bytes"] * 100
            d_live = (meta["live_after_forward"] - cpu["live_after_forward"]) / cpu["live_after_forward"] * 100
            # What the forward keeps and the peak must agree within 2 % (the CPU run's figures leave
            # out oneDNN's scratch memory, which no GPU run has: Estimate::cpu_only_temporaries).
            if abs(d_live) > 2 or abs(d_peak) > 2:
                off.append(name)
            line += (f" {mib(cpu['peak']['bytes']):>13.1f} {d_peak:>7.2f} {mib(meta['live_after_forward']):>14.1f}"
                     f" {mib(cpu['live_after_forward']):>13.1f} {d_live:>7.2f}")
        else:
            line += f" {'':>13} {'':>7} {mib(meta['live_after_forward']):>14.1f} {'':>13} {'':>7}"
        print(f"{line} {seconds:>6.1f}  {fallback}", flush=True)
    print(f"sweep: {rows} of {len(names)} torchvision classification models estimated on meta in train mode "
          f"(Adam, batch 2); {len(COMPARED) - len([n for n in COMPARED if n not in names])} compared with the CPU"
          f"{'; failed: ' + ', '.join(failed) if failed else ''}{'; off by more than 2 %: ' + ', '.join(off) if off else ''}")
    sys.exit(1 if failed or off else 0)


if __name__ == "__main__":
    main()
