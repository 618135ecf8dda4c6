"""``torch.compile``'d training in an ``Estimator`` block, estimated as compiled, and held to the same
compiled step really run on the CPU (inductor's CPU backend, which builds its kernels with the C++
compiler) under ``MemTracker(device="cpu")``."""

from __future__ import annotations

import gc

import gpu_mem_track
import pytest
import torch

MIB = 2**20


class Block(torch.nn.Module):
    def __init__(self, width: int = 256) -> None:
        super().__init__()
        self.norm = torch.nn.LayerNorm(width)
        self.up = torch.nn.Linear(width, 4 * width)
        self.down = torch.nn.Linear(4 * width, width)

    def forward(self, x):
        return x + self.down(torch.nn.functional.gelu(self.up(self.norm(x))) * 2 + 1)


class Branching(torch.nn.Module):
    """Two blocks with a branch on data between them: dynamo breaks the graph there."""

    def __init__(self) -> None:
        super().__init__()
        self.first, self.second = Block(), Block()

    def forward(self, x):
        y = self.first(x)
        if y.sum() > 0:  # BRANCH: the graph break
            y = y * 2
        return self.second(y)


def steps(model, run, inputs: dict, n: int) -> None:
    opt = getattr(model, "_test_optimizer", None) or torch.optim.AdamW(model.parameters(), foreach=True)
    model._test_optimizer = opt
    for _ in range(n):
        out = run(**inputs)
        (out.loss if hasattr(out, "loss") else out.sum()).backward()
        opt.step()
        opt.zero_grad()


def above_model(e) -> int:
    """The estimate's peak of the steps after the first (which compiles), above the model and batch."""
    later = [p["peak_bytes"] for p in e["phases"] if p["iteration"] > 1]
    return max(later) - e["param_bytes"] - e["buffer_bytes"] - e["input_bytes"]


def estimated(build, inputs: dict, compiled: bool) -> tuple[int, object]:
    with gpu_mem_track.Estimator(device_profile="cuda") as est:
        model = build().cuda()
        run = torch.compile(model) if compiled else model
        steps(model, run, {k: v.cuda() for k, v in inputs.items()}, 3)
    return above_model(est.result), est.result


def measured(build, inputs: dict, logs) -> int:
    """The compiled step really run on the CPU: the peak of two steps after the one that compiles,
    above the model and the batch."""
    torch._dynamo.reset()
    model = build()
    tracker = gpu_mem_track.MemTracker(device="cpu", path=f"{logs}/", detail=False)
    base = tracker.track()["allocated"]
    run = torch.compile(model)
    steps(model, run, inputs, 1)
    tracker.track()
    steps(model, run, inputs, 2)
    peak = tracker.track()["peak_allocated"] - base
    del model, run, tracker
    gc.collect()
    return peak


def branching() -> torch.nn.Module:
    torch.manual_seed(0)
    return Branching()


def test_a_compiled_step_with_a_graph_break_estimates_as_it_runs_compiled(tmp_path):
    inputs = {"x": torch.randn(8, 128, 256)}
    compiled, e = estimated(branching, inputs, compiled=True)
    real = measured(branching, inputs, tmp_path)
    # Inductor's plan run on meta: its buffers, their reuse and what the forward saves are the
    # compiled program's own (the Hugging Face tests below hold it closer than the eager estimate).
    # An open bug: in some processes (it follows where objects land: pytest's plugins change it)
    # one tensor of the input's size outlives its step in the block, eager or compiled; it is
    # allowed for here, and only it.
    one_tensor = 8 * 128 * 256 * 4
    assert abs(compiled - real) <= 0.01 * real + one_tensor, (compiled, real)
    graphs = e["compiled"]["graphs"]
    assert [g["backend"] for g in graphs] == ["inductor", "inductor"]
    assert all(g["saved_for_backward"] > 0 for g in graphs)
    (graph_break,) = e["compiled"]["graph_breaks"]
    with open(__file__) as source:
        line = next(i for i, text in enumerate(source, 1) if "# BRANCH" in text)
    assert graph_break["at"].endswith(f"test_compiled.py:{line}"), graph_break
    assert "2 graphs of torch.compile, 1 graph break" in e.text and f"test_compiled.py:{line}" in e.text
    # The live-tensor list at the peak is the program's, not dynamo's fake tensors.
    assert "FakeTensor" not in e.text


def hugging_face(name: str, attention: str):
    transformers = pytest.importorskip("transformers", reason="needs transformers (installed beside the main torch)")
    fields = {"hidden_size": 128, "intermediate_size": 512, "num_hidden_layers": 2, "num_attention_heads": 4}
    configs = {
        "gpt2": transformers.GPT2Config(n_embd=128, n_layer=2, n_head=4, vocab_size=1000),
        "llama": transformers.LlamaConfig(**fields, num_key_value_heads=2, vocab_size=1000),
    }
    config = configs[name]
    for key, value in list(vars(config).items()):
        if ("dropout" in key or "pdrop" in key) and isinstance(value, float):
            setattr(config, key, 0.0)

    def build():
        torch.manual_seed(0)
        return transformers.AutoModelForCausalLM.from_config(config, attn_implementation=attention)

    return build


# Llama with torch's fused attention (sdpa): inductor plans the CPU's flash kernel, whose output
# strides the block's meta kernel orders otherwise.
@pytest.mark.parametrize(("name", "attention"), [("gpt2", "eager"), ("llama", "sdpa")])
def test_a_compiled_hugging_face_model_estimates_within_3_percent_of_its_compiled_cpu_run(name, attention, tmp_path):
    build = hugging_face(name, attention)
    torch.manual_seed(1)
    ids = torch.randint(3, 1000, (4, 128))
    inputs = {"input_ids": ids, "labels": ids}
    compiled, e = estimated(build, inputs, compiled=True)
    eager, _ = estimated(build, inputs, compiled=False)
    real = measured(build, inputs, tmp_path)
    assert abs(compiled - real) <= 0.03 * real, (compiled, real)
    assert abs(compiled - real) < abs(eager - real), (compiled, eager, real)
    assert e["compiled"]["graphs"] and all(g["backend"] == "inductor" for g in e["compiled"]["graphs"])


def mlp() -> torch.nn.Module:
    torch.manual_seed(0)
    return torch.nn.Sequential(
        torch.nn.Linear(256, 1024), torch.nn.ReLU(), torch.nn.Linear(1024, 1024), torch.nn.ReLU(), torch.nn.Linear(1024, 256)
    )


def autocast_steps(model, run, x, device: str, n: int) -> None:
    opt = getattr(model, "_test_optimizer", None) or torch.optim.AdamW(model.parameters(), foreach=True)
    model._test_optimizer = opt
    for _ in range(n):
        with torch.autocast(device, dtype=torch.bfloat16):
            out = run(x)
            loss = torch.nn.functional.mse_loss(out, x)
        loss.backward()
        opt.step()
        opt.zero_grad()


def test_a_compiled_step_under_autocast_casts_as_on_the_gpu(tmp_path):
    """autocast("cuda") around compiled code: the graph inductor plans with fake CPU tensors casts
    as it would on the GPU. Held to the compiled step run on the CPU under autocast("cpu"), whose
    policy is CUDA's for these ops (linear in bfloat16, mse_loss in float32)."""
    x = torch.rand(4096, 256)
    with gpu_mem_track.Estimator(device_profile="cuda") as est:
        model = mlp().cuda()
        autocast_steps(model, torch.compile(model), x.cuda(), "cuda", 3)
    estimate = above_model(est.result)
    torch._dynamo.reset()
    model = mlp()
    tracker = gpu_mem_track.MemTracker(device="cpu", path=f"{tmp_path}/", detail=False)
    base = tracker.track()["allocated"]
    run = torch.compile(model)
    autocast_steps(model, run, x, "cpu", 1)
    tracker.track()
    autocast_steps(model, run, x, "cpu", 2)
    real = tracker.track()["peak_allocated"] - base
    # Planned in float32 (autocast unseen) the estimate was 42 % above the run; now within 24 B.
    assert abs(estimate - real) <= 0.01 * real, (estimate, real)


def test_the_activation_memory_budget_lowers_the_compiled_estimate():
    inputs = {"x": torch.randn(8, 128, 256)}
    default, e = estimated(branching, inputs, compiled=True)
    torch._dynamo.reset()
    with torch._functorch.config.patch(activation_memory_budget=0.3):
        budgeted, low = estimated(branching, inputs, compiled=True)
    saved = sum(g["saved_for_backward"] for g in e["compiled"]["graphs"])
    saved_low = sum(g["saved_for_backward"] for g in low["compiled"]["graphs"])
    # The partitioner recomputes in the backward what the budget leaves unsaved.
    assert saved_low < saved and budgeted < default, (saved_low, saved, budgeted, default)


def test_a_compiled_step_in_the_block_leaves_no_compiled_code_for_real_tensors():
    """What the block compiled plans on meta; the same function called on real tensors after the
    block compiles again, for real, and computes its real result."""

    def f(x):
        return torch.nn.functional.gelu(x) * 3

    compiled = torch.compile(f)
    with gpu_mem_track.Estimator(device_profile="cuda"):
        compiled(torch.randn(64, 64).cuda())
    x = torch.randn(64, 64)
    torch.testing.assert_close(compiled(x), f(x))  # a compiled kernel rounds as it does, not as eager
