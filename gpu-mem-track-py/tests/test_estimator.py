"""``Estimator`` and ``estimate()``: a program's own PyTorch code on the meta device, in-process.

One forked process per test (the allocation recorder is process-wide and one records at a time).
"""

from __future__ import annotations

import warnings

import gpu_mem_track
import pytest
import torch
from gpu_mem_track import Estimator

MIB = 2**20


def nbytes(tensors) -> int:
    return sum(t.numel() * t.element_size() for t in tensors)


class Blocks(torch.nn.Module):
    """``depth`` MLP blocks of width ``width``, optionally each under activation checkpointing."""

    def __init__(self, depth: int = 6, width: int = 256, checkpoint: bool = False) -> None:
        super().__init__()
        self.blocks = torch.nn.ModuleList(
            torch.nn.Sequential(torch.nn.Linear(width, 4 * width), torch.nn.GELU(), torch.nn.Linear(4 * width, width))
            for _ in range(depth)
        )
        self.checkpoint = checkpoint

    def forward(self, x):
        for b in self.blocks:
            x = torch.utils.checkpoint.checkpoint(b, x, use_reentrant=False) if self.checkpoint else b(x)
        return x


def test_one_call_trains_a_built_model_without_touching_its_weights():
    torch.manual_seed(0)
    model = Blocks(depth=2, width=64)
    before = [p.detach().clone() for p in model.parameters()]
    params = nbytes(model.parameters())
    e = gpu_mem_track.estimate(model, torch.randn(32, 64), optimizer="adamw", device_profile="h100-80g")
    assert e["param_bytes"] == params and e["grad_bytes"] == params
    assert e["optimizer_state_bytes"] == 2 * params  # AdamW: exp_avg and exp_avg_sq
    assert e["input_bytes"] == 32 * 64 * 4
    # Parameters, gradients and both moments are live at the optimizer step.
    assert e.peak_bytes >= 4 * params and e["peak"]["phase"] == "optimizer step"
    assert e.fits is True and e.gpu["profile"]["name"] == "h100-80g"
    assert all(p.device.type == "cpu" and torch.equal(p, b) for p, b in zip(model.parameters(), before))
    assert model.training


def test_the_breakdown_charges_each_module_its_parameters_gradients_and_state():
    model = Blocks(depth=2, width=64)
    e = gpu_mem_track.estimate(model, torch.randn(32, 64), optimizer="adam", device_profile="h100-80g")
    rows = e.breakdown()
    first = rows["Blocks.blocks.0.0"]  # Linear(64, 256): weight and bias
    linear = (64 * 256 + 256) * 4
    assert first["parameter"] == linear and first["gradient"] == linear and first["optimizer_state"] == 2 * linear
    # The model as one row holds every parameter.
    assert e.breakdown(depth=0)["Blocks"]["parameter"] == e["param_bytes"]
    totals = rows.by_category()
    assert sum(totals.values()) - totals.get("workspace", 0) == e.peak_bytes
    assert totals["workspace"] == e.gpu["cublas_workspace"] > 0
    text = str(rows)
    assert "Blocks.blocks.1.2" in text and "optimizer state" in text


def test_a_dict_forward_that_branches_in_python():
    class Heads(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.trunk = torch.nn.Linear(32, 128)
            self.a = torch.nn.Linear(128, 10)
            self.b = torch.nn.Linear(128, 1000)

        def forward(self, batch: dict) -> dict:
            h = torch.relu(self.trunk(batch["x"]))
            logits = self.a(h) if batch["task"] == "small" else self.b(h)
            return {"loss": torch.nn.functional.cross_entropy(logits, batch["y"]), "logits": logits}

    with Estimator(device_profile="a100-40g") as est:
        model = Heads()
        opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
        for task in ("small", "large"):
            out = model({"x": torch.randn(64, 32), "task": task, "y": torch.zeros(64, dtype=torch.long)})
            out["loss"].backward()
            opt.step()
            opt.zero_grad()
    e = est.result
    params = nbytes(Heads().parameters())
    assert e["param_bytes"] == params and e["optimizer_state_bytes"] == params  # one momentum buffer each
    assert e["options"]["mode"] == {"train": "momentum"}
    assert "train (momentum)" in str(e), "the text spells the optimizer as the JSON does"
    # The branch taken second ran head b: its logits (64 x 1000 floats) are in the second forward.
    rows = e.breakdown()
    assert "Heads.b" in rows and [p["iteration"] for p in e["phases"]][-1] == 2
    assert e.fits is True and e.gpu["profile"]["name"] == "a100-40g"


def test_autocast_bfloat16_computes_in_half_the_bytes():
    def run(autocast: bool):
        with Estimator(device_profile="cuda") as est:
            model = Blocks(depth=4, width=512)
            opt = torch.optim.AdamW(model.parameters())
            x = torch.randn(2048, 512, device="cuda")
            for _ in range(2):
                with torch.autocast("cuda", dtype=torch.bfloat16, enabled=autocast):
                    y = model(x)
                y.float().sum().backward()
                opt.step()
                opt.zero_grad()
        return est.result

    full, mixed = run(False), run(True)
    # Weights, gradients and optimizer state stay float32 under autocast.
    assert (
        mixed["param_bytes"] == full["param_bytes"] and mixed["optimizer_state_bytes"] == full["optimizer_state_bytes"]
    )
    f, m = full.breakdown().by_category(), mixed.breakdown().by_category()
    # What the forward keeps for backward: bfloat16 activations and the weights' bfloat16 copies
    # autocast caches, against float32 activations.
    assert m["activation"] < 0.75 * f["activation"], (m, f)
    assert mixed["live_after_forward"] < full["live_after_forward"]


def test_checkpointing_frees_the_activations_of_the_checkpointed_blocks():
    def run(checkpoint: bool):
        with Estimator(device_profile="h100-80g") as est:
            model = Blocks(depth=6, width=256, checkpoint=checkpoint)
            opt = torch.optim.SGD(model.parameters(), lr=0.1)
            x = torch.randn(4096, 256)
            model(x).sum().backward()
            opt.step()
        return est.result

    plain, ckpt = run(False), run(True)
    # Without checkpointing each block keeps its hidden activations (4096 x 1024 floats, before and
    # after GELU) for backward; with it, only each block's input.
    hidden = 4096 * 1024 * 4
    assert plain["live_after_forward"] - ckpt["live_after_forward"] >= 6 * 2 * hidden * 0.9
    assert ckpt.peak_bytes < plain.peak_bytes
    assert ckpt["param_bytes"] == plain["param_bytes"]


def test_a_hugging_face_causal_lm_from_a_config():
    transformers = pytest.importorskip("transformers", reason="needs transformers")
    cfg = transformers.GPT2Config(n_layer=2, n_embd=128, n_head=4, vocab_size=1000, n_positions=256)
    ids = torch.randint(0, 1000, (4, 128))
    mask = torch.ones(4, 128, dtype=torch.long)
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        with Estimator(device_profile="h100-80g") as est:
            model = transformers.AutoModelForCausalLM.from_config(cfg)
            opt = torch.optim.AdamW(model.parameters())
            for _ in range(2):
                # As on a GPU: the batch is copied to the device, and only the loss is kept.
                loss = model(input_ids=ids.cuda(), attention_mask=mask.cuda(), labels=ids.cuda()).loss
                loss.backward()
                opt.step()
                opt.zero_grad()
    assert not [w for w in seen if "jit" in str(w.message).lower()], [str(w.message) for w in seen]
    e = est.result
    with torch.device("meta"):
        params = nbytes(transformers.AutoModelForCausalLM.from_config(cfg).parameters())
    assert e["param_bytes"] == params and e["optimizer_state_bytes"] == 2 * params
    assert e["options"]["input_shape"] == [4, 128] and e["options"]["input_is_index"] is True
    assert e.fits is True
    rows = e.breakdown(depth=3)
    assert rows["GPT2LMHeadModel.transformer.h.0"]["parameter"] > 0
    assert "GPT2LMHeadModel.transformer.h.1" in rows
    # The one-call form of the same step (which keeps the loss, not the output, for backward), on
    # a model built outside: the same peak (within the few bytes two ways of making the batch and
    # the optimizer differ by).
    built = transformers.AutoModelForCausalLM.from_config(cfg)
    one = gpu_mem_track.estimate(built, input_ids=ids, attention_mask=mask, labels=ids, device_profile="h100-80g")
    assert one.peak_bytes == pytest.approx(e.peak_bytes, rel=1e-3) and one["param_bytes"] == params


def test_a_vision_language_model_finds_its_image_tokens_in_the_real_ids():
    # Llava counts the image tokens in input_ids (`input_ids == image_token_id`, `.sum()`) and
    # checks the count against the image features before scattering them into the embeddings. The
    # ids are data (a processor's output): their real values, kept on meta, give the real count.
    transformers = pytest.importorskip("transformers", reason="needs transformers")
    small = {"hidden_size": 64, "num_hidden_layers": 1, "num_attention_heads": 4, "intermediate_size": 128}
    cfg = transformers.LlavaConfig(
        text_config=transformers.LlamaConfig(vocab_size=120, num_key_value_heads=2, **small).to_dict(),
        vision_config=transformers.CLIPVisionConfig(image_size=32, patch_size=8, **small).to_dict(),
        image_token_id=110,
    )
    row = [1] + [110] * 16 + list(range(20, 43))  # 16 image tokens: (32 / 8)^2 patches
    with warnings.catch_warnings(record=True) as seen, Estimator(device_profile="cuda") as est:
        warnings.simplefilter("always")
        model = transformers.LlavaForConditionalGeneration(cfg)
        ids = torch.tensor([row, row])
        out = model(input_ids=ids, pixel_values=torch.randn(2, 3, 32, 32), attention_mask=torch.ones_like(ids), labels=ids)
        out.loss.backward()
    assert not [w for w in seen if "nonzero" in str(w.message)], [str(w.message) for w in seen]
    assert est.result["meta_scalar_reads"] == 0 and "largest_results" not in est.result


def test_generate_runs_its_loop_to_max_new_tokens():
    # generate() stops when every sequence has finished: a flag computed as `unfinished & ~is_done`
    # from stopping criteria, read each step. The length criterion is known (torch.full of a
    # Python bool), so the loop ends at max_new_tokens; an end-of-sequence token, a value meta
    # lacks, is never read as seen: the longest generation.
    transformers = pytest.importorskip("transformers", reason="needs transformers")
    cfg = transformers.GPT2Config(n_embd=64, n_layer=2, n_head=4, vocab_size=100)
    with Estimator(device_profile="cuda") as est:
        model = transformers.GPT2LMHeadModel(cfg).eval()
        with torch.no_grad():
            ids = torch.tensor([[5, 6, 7, 8]])
            out = model.generate(input_ids=ids, attention_mask=torch.ones_like(ids), max_new_tokens=6, do_sample=False)
    assert out.shape == (1, 10)
    assert est.result["options"]["mode"] == "inference"


def test_qwen2_vl_trains_from_its_processors_real_inputs():
    # Qwen2-VL reads its image grid (image_grid_thw: rows, .item(), repeat_interleave by it) and
    # its token types (.tolist()) to lay out its vision patches and 3-D positions. Both are data,
    # whose real values the block keeps.
    transformers = pytest.importorskip("transformers", reason="needs transformers")
    if not hasattr(transformers, "Qwen2VLForConditionalGeneration"):
        pytest.skip("needs transformers with Qwen2-VL")
    text = {"vocab_size": 200, "hidden_size": 64, "num_hidden_layers": 1, "num_attention_heads": 4,
            "intermediate_size": 128, "num_key_value_heads": 2,
            "rope_scaling": {"type": "mrope", "mrope_section": [2, 3, 3]}}  # fmt: skip
    vision = {"depth": 1, "embed_dim": 32, "hidden_size": 64, "num_heads": 4, "patch_size": 14,
              "spatial_merge_size": 2, "temporal_patch_size": 2}  # fmt: skip
    cfg = transformers.Qwen2VLConfig(
        text_config=text, vision_config=vision, image_token_id=151, video_token_id=152, vision_start_token_id=150
    )
    row = [1, 150] + [151] * 4 + list(range(20, 40))  # 4 image tokens: a 4x4 grid of patches, merged 2x2
    with Estimator(device_profile="cuda") as est:
        model = transformers.Qwen2VLForConditionalGeneration(cfg)
        ids = torch.tensor([row])
        out = model(
            input_ids=ids,
            attention_mask=torch.ones_like(ids),
            pixel_values=torch.randn(16, 3 * 2 * 14 * 14),
            image_grid_thw=torch.tensor([[1, 4, 4]]),
            mm_token_type_ids=torch.tensor([[int(t == 151) for t in row]]),
            labels=ids,
        )
        out.loss.backward()
    assert "largest_results" not in est.result and est.result["meta_scalar_reads"] <= 1


def test_the_block_allocates_what_a_real_run_of_the_same_step_allocates(tmp_path):
    """The lifetimes are the program's own: the same eager training step, estimated in the block
    and really run on the CPU (whose kernels allocate what a GPU's do here: attention in matmuls,
    no dropout), peaks within the scalars a GPU run keeps on the CPU (AdamW's step counts)."""
    transformers = pytest.importorskip("transformers", reason="needs transformers")
    cfg = transformers.LlamaConfig(
        hidden_size=128, intermediate_size=352, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, vocab_size=1000, attn_implementation="eager",
    )

    def build():
        torch.manual_seed(0)
        return transformers.LlamaForCausalLM(cfg)

    def step(model, ids, mask):
        opt = torch.optim.AdamW(model.parameters(), foreach=True)
        for _ in range(2):
            model(input_ids=ids, attention_mask=mask, labels=ids).loss.backward()
            opt.step()
            opt.zero_grad()

    ids = torch.randint(0, 1000, (4, 64))
    mask = torch.ones_like(ids)
    with Estimator(device_profile="cuda") as est:
        step(build().cuda(), ids.cuda(), mask.cuda())
    e = est.result
    estimated = max(p["peak_bytes"] for p in e["phases"]) - e["param_bytes"] - e["buffer_bytes"] - e["input_bytes"]

    model = build()
    tracker = gpu_mem_track.MemTracker(device="cpu", path=f"{tmp_path}/", detail=False)
    before = tracker.track()["allocated"]  # the model, the batch and whatever else is alive
    step(model, ids, mask)
    measured = tracker.track()["peak_allocated"] - before
    # One activation kept too long, or freed too early, is 128 KiB (4 x 64 x 128 floats).
    assert estimated > 10 * MIB and abs(measured - estimated) <= 4096, (measured, estimated)


def test_each_steps_batch_is_freed_when_the_program_drops_it(tmp_path):
    """A loop that makes each step's batch, as a data loader does, holds one batch at a time in the
    block as in a real run: the block keeps no batch it has seen (a kept first batch was one batch
    more in every later step)."""

    def train(model, device):
        opt = torch.optim.SGD(model.parameters(), lr=0.1)

        def step(x):
            model(x).relu().sum().backward()
            opt.step()
            opt.zero_grad()

        for _ in range(3):
            step(torch.randn(512, 512, device=device))  # 1 MiB, dropped when the step returns

    def build():
        torch.manual_seed(0)
        return torch.nn.Sequential(torch.nn.Linear(512, 512), torch.nn.Linear(512, 512))

    with Estimator(device_profile="cuda") as est:
        train(build().cuda(), "cuda")
    e = est.result
    peaks = {(p["iteration"], p["phase"]): p["peak_bytes"] for p in e["phases"]}
    assert e["input_bytes"] == MIB and e["options"]["input_shape"] == [512, 512]
    assert peaks[(3, "optimizer step")] == peaks[(1, "optimizer step")], peaks
    estimated = max(peaks.values()) - e["param_bytes"] - e["buffer_bytes"]

    model = build()
    tracker = gpu_mem_track.MemTracker(device="cpu", path=f"{tmp_path}/", detail=False)
    before = tracker.track()["allocated"]  # the model
    train(model, "cpu")
    measured = tracker.track()["peak_allocated"] - before
    assert estimated > 4 * MIB and abs(measured - estimated) < MIB // 4, (measured, estimated)


def _forward_keeps(build, batch: int = 64, width: int = 256) -> int:
    """Bytes a training forward of ``build(width)`` keeps for backward, beyond parameters and input."""
    with Estimator(device_profile="cuda") as est:
        model = build(width).cuda()
        x = torch.randn(batch, width, device="cuda")
        model(x).sum().backward()
    e = est.result
    return e["live_after_forward"] - e["param_bytes"] - e["input_bytes"]


def test_random_fills_in_place_allocate_nothing_as_on_a_gpu():
    # A GPU fills a tensor in place (nn.init's initialisers, rand_like, randn_like): nothing but
    # the tensors themselves. Python torch's meta decompositions of normal_ and uniform_ allocated
    # full-size temporaries (peak 4x and 2x the tensor; torch.normal(t, t) 5x).
    mib = 2**20
    fills = {
        "normal_": lambda t: torch.nn.init.normal_(t, std=0.02),
        "kaiming_uniform_": lambda t: torch.nn.init.kaiming_uniform_(t, a=5**0.5),
        "xavier_normal_": torch.nn.init.xavier_normal_,
        "uniform_": lambda t: t.uniform_(-1, 1),
        "rand_like": torch.rand_like,
        "randn_like": torch.randn_like,
        "normal of a tensor": lambda t: torch.normal(t, 2.0),
        "normal of tensors": lambda t: torch.normal(t, t),
    }
    for name, fill in fills.items():
        with Estimator(device_profile="cuda") as est:
            t = torch.empty(256, 1024)  # 1 MiB
            with torch.no_grad():
                out = fill(t)
            del out
        e = est.result
        made = 0 if name.endswith("_") else 1  # the new tensor of rand_like, torch.normal, ...
        if name == "normal of a tensor":
            made += 1  # and a GPU's own temporary, of the result's size (normal_out_impl's std_tensor)
        assert (e["allocations"], e["peak"]["bytes"]) == (1 + made, (1 + made) * mib), name
    # A model's parameters are all it holds while it is built: nn.Linear's weight and bias.
    with Estimator(device_profile="cuda") as est:
        torch.nn.Linear(1024, 256)
    assert est.result["peak"]["bytes"] == 256 * 1024 * 4 + 256 * 4
    # And a bad parameter fails as on a GPU (and on the CPU), with the same message.
    with pytest.raises(RuntimeError) as on_cpu:
        torch.empty(4).normal_(0.0, -1.0)
    with pytest.raises(RuntimeError) as in_block, Estimator(device_profile="cuda"):
        torch.empty(4).normal_(0.0, -1.0)
    assert str(in_block.value) == str(on_cpu.value), (in_block.value, on_cpu.value)


def test_ops_allocate_what_libtorch_allocates_not_what_pythons_meta_functions_do():
    # Python torch's meta functions of some 600 ops are decompositions whose intermediates are
    # meta tensors: GELU's backward allocated ten of them, cumsum one of rows x columns x columns
    # (1 GiB here), ReLU's backward two. A GPU allocates the results, as libtorch's own Meta
    # kernels do; the block runs those.
    mib = 2**20
    cases = {
        "gelu_backward": (2, lambda g, x: torch.ops.aten.gelu_backward(g, x)),
        "threshold_backward": (2, lambda g, x: torch.ops.aten.threshold_backward(g, x, 0.0)),
        "log_softmax": (1, lambda x: torch.log_softmax(x, -1)),
        "cumsum": (1, lambda x: x.cumsum(-1)),
        "triu_": (1, lambda x: x.triu_()),
    }

    def python_meta_functions() -> dict:
        """Which of the ops' active Meta kernel is a Python function (which, depends on the torch)."""
        ops = ["gelu_backward", "threshold_backward", "_log_softmax", "cumsum", "triu_"]
        meta = {op: [line for line in torch._C._dispatch_dump(f"aten::{op}").splitlines() if line.startswith("Meta:")] for op in ops}
        return {op: bool(lines) and "(none) [ boxed ]" in lines[0] for op, lines in meta.items()}  # unboxed: C++

    before = python_meta_functions()
    assert any(before.values()), before
    for name, (n, f) in cases.items():
        with Estimator(device_profile="cuda") as est:
            inputs = [torch.empty(256, 1024) for _ in range(n)]  # 1 MiB each
            with torch.no_grad():
                out = f(*inputs)
            del out
        made = 0 if name.endswith("_") else 1
        assert (est.result["allocations"], est.result["peak"]["bytes"]) == (n + made, (n + made) * mib), name
    # Outside the block torch's own meta functions are active again, for the program's other code.
    assert python_meta_functions() == before


def test_dropout_keeps_a_bool_mask_as_on_a_gpu():
    # A GPU runs nn.Dropout in training as one fused kernel that keeps a bool mask (one byte an
    # element) for backward; other devices keep float noise (four). Two Linear layers, dropout
    # between them: the second Linear keeps its input either way (dropout's output, or with p=0
    # the first Linear's); with p=0.5 the mask is kept as well.
    def net(p):
        return lambda w: torch.nn.Sequential(torch.nn.Linear(w, w), torch.nn.Dropout(p), torch.nn.Linear(w, w))

    with_dropout, without = _forward_keeps(net(0.5)), _forward_keeps(net(0.0))
    assert with_dropout - without == 64 * 256  # the mask, bool


def test_rms_norm_keeps_its_input_and_one_statistic_per_row():
    # torch.nn.RMSNorm runs the fused kernel (`_fused_rms_norm`) on a GPU from torch 2.9, which
    # keeps only its input and a float rstd per row; before, a GPU runs its composite body, which
    # also keeps the normalised rows (for the weight's product).
    def net(norm):
        return lambda w: torch.nn.Sequential(torch.nn.Linear(w, w), norm(w), torch.nn.Linear(w, w))

    rms, none = _forward_keeps(net(torch.nn.RMSNorm)), _forward_keeps(net(lambda w: torch.nn.Identity()))
    # The norm's output (the second Linear's input) and its rstd: 64 rows of 256 floats, and 64.
    rows = 64 * 256 * 4
    assert rms - none == (rows if _torch_minor() >= (2, 9) else 2 * rows) + 64 * 4


def test_a_learned_attention_bias_takes_memory_efficient_attention():
    # T5 adds a learned position bias to attention scores: scaled_dot_product_attention's mask
    # requires grad, which flash attention cannot give. A GPU runs memory-efficient attention,
    # which keeps no (batch, heads, query, key) scores; the eager path keeps the softmax of them.
    transformers = pytest.importorskip("transformers", reason="needs transformers")
    ids = torch.randint(0, 256, (4, 128))

    def keeps(attention: str) -> int:
        cfg = transformers.T5Config(
            d_model=64, d_ff=128, num_layers=2, num_heads=4, d_kv=16, vocab_size=256, decoder_start_token_id=0,
            attn_implementation=attention,
        )
        model = transformers.T5ForConditionalGeneration(cfg)
        e = gpu_mem_track.estimate(model, input_ids=ids, labels=ids, optimizer="sgd", device_profile="cuda")
        return e["live_after_forward"]

    sdpa, eager = keeps("sdpa"), keeps("eager")
    scores = 4 * 4 * 128 * 128 * 4  # one attention's probabilities, float
    # Each of the six attentions (two encoder, two decoder self, two cross) keeps its probabilities
    # on the eager path and its dropout mask: more than six score tensors of difference.
    assert eager - sdpa >= 6 * scores, (eager, sdpa)


def _torch_minor() -> tuple:
    return tuple(int(p) for p in torch.__version__.split("+")[0].split(".")[:2])


class Attend(torch.nn.Module):
    """One ``scaled_dot_product_attention`` call on its inputs."""

    def forward(self, q, k, v, mask=None, gqa=False):
        return torch.nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=mask, enable_gqa=gqa)


def _attention(profile="h100-80g", dtype=torch.float32, head_dim=64, kv_heads=4, mask=None, gqa=False):
    """The estimate of one attention call's training step: batch 2, 4 query heads, 256 tokens."""
    with Estimator(device_profile=profile) as est:
        q, k, v = (
            torch.randn(2, heads, 256, head_dim, device="cuda", dtype=dtype, requires_grad=True)
            for heads in (4, kv_heads, kv_heads)
        )
        m = None if mask is None else torch.zeros(2, 1, 256, 256, device="cuda", dtype=mask)
        Attend()(q, k, v, m, gqa).sum().backward()
    return est.result


def test_attention_takes_the_kernel_the_gpu_picks():
    # On a GPU, scaled_dot_product_attention runs the first of flash, memory-efficient and math
    # attention that takes the call; math keeps the (batch, heads, query, key) weights.
    def kernel(e) -> str:
        (name,) = [k for k, calls in e["attention"].items() if calls]
        return name

    assert kernel(_attention(dtype=torch.bfloat16)) == "flash"
    assert kernel(_attention()) == "efficient"  # flash attention takes half precision only
    assert kernel(_attention(head_dim=30)) == "math"  # a float32 head size must be a multiple of 4
    assert kernel(_attention("t4", dtype=torch.float16)) == "efficient"  # no flash attention before 8.0
    assert kernel(_attention("t4", dtype=torch.bfloat16)) == "math"  # nor bfloat16 memory-efficient
    assert kernel(_attention("a100-80g", dtype=torch.bfloat16)) == "flash"
    assert kernel(_attention(kv_heads=2, gqa=True, dtype=torch.bfloat16)) == "flash"  # grouped heads
    # In float32, memory-efficient attention takes grouped heads (and one key/value head for all)
    # from torch 2.15; before, a GPU runs those calls on the math path.
    if _torch_minor() != (2, 14):
        fused_or_math = "efficient" if _torch_minor() >= (2, 15) else "math"
        assert kernel(_attention(kv_heads=2, gqa=True)) == fused_or_math
        assert kernel(_attention(kv_heads=1)) == fused_or_math
    from torch.nn.attention import SDPBackend, sdpa_kernel

    with sdpa_kernel([SDPBackend.MATH]):  # the user's choice holds
        assert kernel(_attention(dtype=torch.bfloat16)) == "math"
    # Math attention keeps the weights: float32, and a bfloat16 call's too (math works in float).
    weights = 2 * 4 * 256 * 256 * 4
    fused = _attention()["live_after_forward"]
    with sdpa_kernel([SDPBackend.MATH]):
        math = _attention()
        assert math["live_after_forward"] - fused >= weights
        assert _attention(dtype=torch.bfloat16)["live_after_forward"] - fused >= weights
    # Held during the math path's forward and freed by its end, as _safe_softmax on a GPU: the
    # scores and their softmax (float), the bool test of each score and all() of each row.
    assert math["forward_peak"] - math["live_after_forward"] == 2 * weights + weights // 4 + 2 * 4 * 256


def test_a_bad_attention_call_fails_in_the_block_as_it_does_on_a_device():
    # The block chooses attention's kernel itself; a call torch refuses is refused with torch's words.
    q = torch.randn(2, 4, 16, 8)
    calls = [
        lambda d: (q.to(d), q.to(d, torch.bfloat16), q.to(d), None),  # dtypes differ
        lambda d: (q.to(d), q.to(d), q.to(d), torch.zeros(16, 16, dtype=torch.long, device=d)),  # an int mask
    ]
    for call in calls:
        with pytest.raises(RuntimeError) as real:
            Attend()(*call("cpu"))
        with pytest.raises(RuntimeError) as meta, Estimator(device_profile="h100-80g"):
            Attend()(*call("cuda"))
        assert str(meta.value) == str(real.value)


def test_a_boolean_attention_mask_becomes_an_additive_one_which_attention_keeps():
    # A GPU turns a bool mask into a float one of the query's dtype before memory-efficient
    # attention, which keeps it for backward: after the forward, the bool mask (1 byte an
    # element) and its float twin (4) are held on top of the unmasked call.
    unmasked, masked = _attention(), _attention(mask=torch.bool)
    assert masked["attention"]["efficient"] == 1
    assert masked["live_after_forward"] - unmasked["live_after_forward"] == 2 * 256 * 256 * (1 + 4)
    additive = _attention(mask=torch.float32)  # already additive: kept as it is
    assert additive["live_after_forward"] - unmasked["live_after_forward"] == 2 * 256 * 256 * 4


def test_grouped_query_attention_takes_the_kernel_a_gpu_takes():
    # Llama-style models with fewer key/value heads than query heads call
    # scaled_dot_product_attention(enable_gqa=True) when there is no mask. In bfloat16 a GPU runs
    # flash attention, which takes grouped heads: the grouped model needs less than the one with a
    # key/value head per query head. In float32 flash attention is out, and memory-efficient
    # attention takes grouped heads from torch 2.15 only: before it, a GPU runs the math path,
    # which keeps (batch, heads, query, key) weights, and the grouped model needs more.
    transformers = pytest.importorskip("transformers", reason="needs transformers")
    ids = torch.randint(0, 1000, (2, 512))

    def run(kv_heads: int, dtype: torch.dtype):
        cfg = transformers.LlamaConfig(
            num_hidden_layers=2, hidden_size=256, num_attention_heads=8, num_key_value_heads=kv_heads,
            intermediate_size=512, vocab_size=1000,
        )
        model = transformers.LlamaForCausalLM(cfg).to(dtype)
        return gpu_mem_track.estimate(model, input_ids=ids, labels=ids, optimizer="sgd", device_profile="h100-80g")

    weights = 2 * 8 * 512 * 512 * 4  # one layer's attention weights on the math path, float
    grouped, full = run(2, torch.bfloat16), run(8, torch.bfloat16)
    assert grouped["attention"] == full["attention"] == {"flash": 4, "efficient": 0, "math": 0}
    assert grouped.peak_bytes < full.peak_bytes < grouped.peak_bytes + weights / 2, (grouped, full)
    grouped, full = run(2, torch.float32), run(8, torch.float32)
    assert full["attention"] == {"flash": 0, "efficient": 4, "math": 0}
    if _torch_minor() <= (2, 13):
        assert grouped["attention"] == {"flash": 0, "efficient": 0, "math": 4}
        assert grouped.peak_bytes > full.peak_bytes + weights, (grouped.peak_bytes, full.peak_bytes)
    elif _torch_minor() >= (2, 15):
        assert grouped["attention"] == {"flash": 0, "efficient": 4, "math": 0}
        assert grouped.peak_bytes < full.peak_bytes


def test_a_fused_optimizer_runs_as_on_a_gpu():
    # AdamW(fused=True) (Hugging Face Trainer's default) checks that its parameters are on a
    # device with fused kernels: meta is the GPU in the block. The fused step makes no
    # parameter-sized temporaries, which the foreach step does.
    def peak(**kind) -> int:
        with Estimator(device_profile="cuda") as est:
            model = Blocks(depth=2, width=256).cuda()
            opt = torch.optim.AdamW(model.parameters(), **kind)
            model(torch.randn(8, 256, device="cuda")).sum().backward()
            opt.step()
        return est.result.peak_bytes

    fused, foreach = peak(fused=True), peak(foreach=True)
    params = nbytes(Blocks(depth=2, width=256).parameters())
    assert 4 * params <= fused < foreach  # parameters, gradients and both moments at least


def test_constant_inputs_keep_their_values_through_the_ops_that_read_them():
    ids = torch.randint(0, 10, (4, 16))
    total = int(ids.sum())
    with warnings.catch_warnings(record=True) as caught, Estimator(device_profile="cuda") as est:
        warnings.simplefilter("always")
        ones = torch.ones_like(ids).cuda()  # made filled
        mask = torch.ones(4, 16, dtype=torch.long).cuda().to(dtype=torch.bool)
        assert bool(mask[:, :8].sum() == 32) and bool(mask.all()) and not bool((~mask).any())
        assert int(ones.sum()) == 64 and (ones * 3).max().item() == 3
        assert bool(torch.full((2, 2), 7).cuda().eq(7).all())
        real = ids.cuda()  # integers from data keep their values on meta, through element-wise ops
        assert bool(real.sum() == total) and real.tolist() == ids.tolist() and int(real[1, 2]) == int(ids[1, 2])
        assert torch.where(real > 4)[0].shape == (int((ids > 4).sum()),)  # the real count, no warning
        assert real[ids.cuda() > 4].shape == (int((ids > 4).sum()),)
        unknown = torch.randint(0, 10, (4, 16), device="cuda")  # made on meta: a read reads 0, counted
        assert not bool(unknown.sum() == total)
        padded = torch.ones(4, 16, dtype=torch.long).cuda()
        view = padded[:, :8]
        padded[:, :3] = 0  # written: neither it nor its views are known any more (two more reads)
        assert not bool(padded.all()) and not bool(view.all())
    assert est.result["meta_scalar_reads"] == 3
    assert not [w for w in caught if "nonzero" in str(w.message)] and "largest_results" not in est.result


def test_checks_of_values_meta_lacks_pass_as_in_a_working_program():
    # A meta tensor has no values, so a read of one is counted. A check of float values that a
    # working program passes reads as passed: `.all()` of a comparison or predicate of floats
    # (DETR's box format), torch._check_tensor_all (transformers' checks); `.any()` reads false.
    # `.numpy()` gives zeros, on which a CPU library (scipy's matching in DETR's loss) runs.
    # Integer data reads its real values; an integer mask's `.all()` is a branch on data, and
    # reads 0 (the constant-inputs test above).
    numpy = pytest.importorskip("numpy", reason="needs numpy")
    with Estimator(device_profile="cuda") as est:
        boxes = torch.rand(40, 4, device="cuda")
        assert bool((boxes[:, 2:] >= boxes[:, :2]).all())
        torch._check_tensor_all_with(ValueError, boxes.isfinite(), lambda: "not finite")
        assert not bool(torch.isnan(boxes).any())
        cost = (boxes @ boxes.T).cpu().numpy()
        assert cost.shape == (40, 40) and cost.dtype == numpy.float32 and not cost.any()
        ids = torch.tensor([3, 1, 2]).cuda()
        assert ids.numpy().tolist() == [3, 1, 2] and numpy.asarray(ids).tolist() == [3, 1, 2]
    assert est.result["meta_scalar_reads"] == 4


def test_architecture_computed_with_torch_takes_its_real_values():
    # Model code computes its architecture with torch: timm's RegNet its stage widths (arange, log,
    # round, then unique with counts), its drop-path rates (linspace(...).tolist()). Such small
    # factories keep their values in the block, and ops on them compute theirs; a value-sized op
    # (unique) of values takes their real size.
    with Estimator(device_profile="cuda") as est:
        widths = torch.round(torch.arange(6, dtype=torch.float32) * 8.0 + 24.0)
        stage_widths, depths = torch.unique(widths.int() // 16 * 16, return_counts=True)
        assert stage_widths.tolist() == [16, 32, 48, 64] and depths.tolist() == [1, 2, 2, 1]
        assert torch.linspace(0, 0.3, 4).tolist() == pytest.approx([0.0, 0.1, 0.2, 0.3])
        assert int(torch.log2(torch.tensor(64.0)).item()) == 6
        w = stage_widths.tolist()
        model = torch.nn.Sequential(*[torch.nn.Linear(w[i], w[i + 1]) for i in range(len(w) - 1)])
        model(torch.randn(2, 16, device="cuda"))
    assert est.result["meta_scalar_reads"] == 0
    assert est.result["param_bytes"] == sum((a * b + b) * 4 for a, b in ((16, 32), (32, 48), (48, 64)))


def test_a_boolean_mask_takes_its_largest_selection_and_says_so():
    # x[mask] sizes its result by the mask's values (aten::nonzero), which a meta tensor lacks: the
    # estimate takes every element selected, and warns once a block, at the program's line. A mask whose
    # value the block knows selects exactly.
    rows, cols = 64, 128
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        with Estimator(device_profile="cuda") as est:
            x = torch.randn(rows, cols, device="cuda")
            mask = torch.rand(rows, cols, device="cuda") > 0.5
            picked = x[mask]  # nonzero's (N, 2) int64 indices, then the N floats picked
            assert picked.shape == (rows * cols,)
        with Estimator(device_profile="cuda"):
            mask = torch.rand(rows, cols, device="cuda") > 0.5
            assert torch.where(mask)[0].shape == (rows * cols,) and torch.argwhere(mask).shape == (rows * cols, 2)
            x = torch.randn(rows, cols, device="cuda")
            assert x[torch.zeros(rows, cols, dtype=torch.bool, device="cuda")].shape == (0,)
            assert x[torch.ones(rows, cols, dtype=torch.bool).cuda()].shape == (rows * cols,)
    said = [w for w in caught if "nonzero" in str(w.message)]
    assert len(said) == 2 and all(w.filename == __file__ for w in said), [str(w.message) for w in caught]
    assert "(64, 128) torch.bool" in str(said[0].message)
    x_bytes, mask_bytes, indices_bytes = rows * cols * 4, rows * cols, rows * cols * 2 * 8
    assert est.result.peak_bytes == x_bytes + mask_bytes + indices_bytes + x_bytes
    assert est.result["largest_results"] == {"torch.nonzero": 1}
    assert "upper bound: torch.nonzero (1 call)" in str(est.result)


def test_a_sampled_mask_selects_the_samples_not_every_element():
    # torchvision's detection sampler (BalancedPositiveNegativeSampler, then `torch.where(pos |
    # neg)`): zeros, `mask[idx] = 1` for the k indices sampled, a union, then nonzero. The block
    # follows the most ones each mask can hold, so the selection is k + j rows, not every element.
    n, k, j = 4000, 128, 384
    with Estimator(device_profile="cuda"):
        matched = torch.randint(-1, 3, (n,), device="cuda")
        positive = torch.where(matched >= 1)[0]  # values unknown: every element
        assert positive.shape == (n,)
        pos = torch.zeros_like(matched, dtype=torch.uint8)
        neg = torch.zeros_like(matched, dtype=torch.uint8)
        pos[positive[torch.randperm(positive.numel(), device="cuda")[:k]]] = 1
        neg[torch.randperm(n, device="cuda")[:j]] = 1
        assert torch.where(pos)[0].shape == (k,)
        assert torch.where(pos | neg)[0].shape == (k + j,)
        assert torch.where(torch.cat([pos, neg]))[0].shape == (k + j,)
        assert torch.where(pos.bool() & (matched > 0))[0].shape == (k,)  # at most the smaller
        assert torch.where(pos[: n // 2])[0].shape == (k,)  # a view keeps the count
        assert torch.where(pos[torch.zeros(2 * n, dtype=torch.long, device="cuda")])[0].shape == (2 * n,)
        pos[0] = 0  # zeros written cannot add a one
        assert torch.where(pos)[0].shape == (k,)
        pos += 1  # any other write forgets it
        assert torch.where(pos)[0].shape == (n,)
        full = torch.zeros(8, 5, device="cuda")
        full[torch.arange(3, device="cuda")] = 2.0  # three rows of five
        assert torch.nonzero(full).shape == (15, 2)


def test_nms_keeps_every_box_with_what_its_cuda_kernel_allocates():
    torchvision = pytest.importorskip("torchvision", reason="needs torchvision")
    n = 1000
    with warnings.catch_warnings(record=True) as caught, Estimator(device_profile="cuda") as est:
        warnings.simplefilter("always")
        boxes = torch.rand(n, 4, device="cuda")
        scores = torch.rand(n, device="cuda")
        kept = torchvision.ops.nms(boxes, scores, 0.5)
        assert kept.shape == (n,) and kept.dtype == torch.int64
        assert torchvision.ops.nms(boxes[:0], scores[:0], 0.5).shape == (0,)
    said = [str(w.message) for w in caught if "nms" in str(w.message)]
    assert len(said) == 1 and "torchvision.ops.nms of a (1000, 4) torch.float32" in said[0], said
    # At its result: the boxes and scores, the scores' sort order (int64), the sorted boxes, the
    # overlap bit mask (a 64-bit word for each box and block of 64 boxes), the kept indices
    # copied from the host, and the result.
    inputs = n * 4 * 4 + n * 4
    assert est.result.peak_bytes == inputs + n * 8 + n * 4 * 4 + n * ((n + 63) // 64) * 8 + n * 8 + n * 8
    assert est.result["largest_results"] == {"torchvision.ops.nms": 1}
    # After the block, torchvision's own meta function is back (it refuses meta tensors).
    with pytest.raises(RuntimeError, match="nms"):
        torchvision.ops.nms(torch.empty(3, 4, device="meta"), torch.empty(3, device="meta"), 0.5)


def test_a_shuffling_data_loader_and_real_tensors_read_in_the_block():
    # The data pipeline stays real: a DataLoader's shuffle (randperm with its own generator) and
    # its `.tolist()`, and reads of tensors made from data. A meta tensor's `.tolist()` is its
    # known value, else zeros (a counted read).
    xs, ys = torch.randn(64, 32), torch.randint(0, 4, (64,))
    loader = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(xs, ys), batch_size=16, shuffle=True)
    with Estimator(device_profile="cuda") as est:
        assert torch.tensor([3, 1, 2]).tolist() == [3, 1, 2]
        assert torch.zeros(2, 2, device="cuda").tolist() == [[0.0, 0.0], [0.0, 0.0]]
        model = torch.nn.Linear(32, 4).cuda()
        batches = 0
        for x, y in loader:
            torch.nn.functional.cross_entropy(model(x.cuda()), y.cuda()).backward()
            batches += 1
    assert batches == 4
    e = est.result
    assert e["options"]["input_shape"] == [16, 32] and e["input_bytes"] == 16 * 32 * 4  # the model's input


def test_an_all_ones_attention_mask_is_dropped_as_on_a_gpu():
    # Hugging Face drops an attention mask that masks nothing (it reads `mask.sum() == numel`) and
    # then runs attention without one: in bfloat16, the flash kernels, grouped-query attention
    # included. A mask with padding is kept, and its values (unknown on meta) are read as 0.
    transformers = pytest.importorskip("transformers", reason="needs transformers")
    cfg = transformers.LlamaConfig(
        num_hidden_layers=2, hidden_size=256, num_attention_heads=8, num_key_value_heads=2, intermediate_size=512,
        vocab_size=1000,
    )
    model = transformers.LlamaForCausalLM(cfg).to(torch.bfloat16)
    ids = torch.randint(0, 1000, (2, 512))
    padded = torch.ones_like(ids)
    padded[:, :7] = 0

    def run(**mask):
        return gpu_mem_track.estimate(model, input_ids=ids, labels=ids, optimizer="sgd", device_profile="cuda", **mask)

    none, ones, pad = run(), run(attention_mask=torch.ones_like(ids)), run(attention_mask=padded)
    # The same step, with the mask itself (int64, one a token) as the one more input.
    assert ones.peak_bytes == none.peak_bytes + ids.numel() * 8 and ones["meta_scalar_reads"] == 0
    assert pad.peak_bytes > none.peak_bytes and pad["meta_scalar_reads"] > 0


def test_a_float32_mixture_of_experts_runs_its_experts_as_a_gpu_does():
    # Mixtral's experts call torch._grouped_mm, which a GPU runs in float32 too (one matmul per
    # expert) while torch's meta kernel takes bfloat16 only. In the block meta is the GPU; after
    # it, torch's meta kernel is back.
    transformers = pytest.importorskip("transformers", reason="needs transformers")
    if not hasattr(torch.ops.aten, "_grouped_mm"):
        pytest.skip("torch has no _grouped_mm")
    cfg = transformers.MixtralConfig(
        num_hidden_layers=2, hidden_size=64, num_attention_heads=4, num_key_value_heads=2, intermediate_size=128,
        vocab_size=256, num_local_experts=4, num_experts_per_tok=2,
    )
    ids = torch.randint(0, 256, (2, 32))
    with Estimator(device_profile="h100-80g") as est:
        model = transformers.MixtralForCausalLM(cfg)
        opt = torch.optim.AdamW(model.parameters())
        model(input_ids=ids.cuda(), labels=ids.cuda()).loss.backward()
        opt.step()
        a = torch.randn(10, 8, device="cuda")
        out = torch._grouped_mm(a, torch.randn(3, 8, 6, device="cuda"), offs=torch.tensor([3, 7, 10], device="cuda").int())
        assert out.shape == (10, 6) and out.stride() == (8, 1)  # 6 floats padded to 16 bytes
    e = est.result
    assert e["param_bytes"] > 0 and e["optimizer_state_bytes"] == 2 * e["param_bytes"]
    assert e["breakdown"] and e.fits is True
    meta = torch.empty(10, 8, device="meta"), torch.empty(3, 8, 6, device="meta")
    # torch's own refuses it: bfloat16 only (to 2.13), rows of 16 bytes (2.15); the block's took it.
    with pytest.raises(RuntimeError, match="BF16|multiple of 16 bytes"):
        torch._grouped_mm(*meta, offs=torch.empty(3, dtype=torch.int32, device="meta"))


def test_sharding_and_fit_from_python():
    def step(batch: int) -> None:
        model = Blocks(depth=2, width=1024)
        opt = torch.optim.AdamW(model.parameters())
        model(torch.randn(batch, 1024)).sum().backward()
        opt.step()

    with Estimator(device_profile="h100-80g", world_size=8, shard="zero3") as est:
        step(16)
    rank = est.result["rank"]
    params = est.result["param_bytes"]
    assert rank["parallelism"]["world_size"] == 8 and rank["model_states"]["parameters"] < params
    budget = 512 * MIB  # parameters, gradients and AdamW's moments take 256 MiB
    context = est.result.gpu["profile"]["context_bytes"]  # the H100's CUDA context and libraries
    found = gpu_mem_track.fit(step, device_profile="h100-80g", gpu_memory=budget + context, max=1 << 16)
    largest = found["largest"]
    assert largest is not None and 1 <= largest < 1 << 16
    fits = {p["value"]: p["fits"] for p in found["probes"]}
    assert fits[largest] is True and all(not ok for v, ok in fits.items() if v > largest)
    # What binds is the figure the smallest size too large is above the budget by.
    too_large = min((p for p in found["probes"] if not p["fits"]), key=lambda p: p["value"])
    over = too_large["allocated_needed"] > budget + context
    assert found["binds"] == ("allocated" if over else "reserved")


class Scaled(torch.nn.Module):
    """A parameter made from data, as CLIP's ``logit_scale = nn.Parameter(torch.tensor(2.6592))``."""

    def __init__(self) -> None:
        super().__init__()
        self.linear = torch.nn.Linear(64, 64)
        self.scale = torch.nn.Parameter(torch.tensor([2.5] * 1024))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.linear(x) * self.scale[:64].exp()


def test_a_parameter_made_from_data_in_the_block_is_the_models():
    # torch.tensor() in the block is a real CPU tensor (data pipelines read it), so such a
    # parameter is on the CPU at the first forward. It was made in the block: it goes to meta, the
    # same object (the optimizer made before holds it), and counts as a parameter with a gradient
    # and Adam's two moments; a parameter made before the block is still refused (above).
    with Estimator(device_profile="cuda") as est:
        model = Scaled()
        opt = torch.optim.Adam(model.parameters())
        model(torch.randn(8, 64)).sum().backward()
        opt.step()
        assert model.scale.device.type == "meta" and opt.param_groups[0]["params"][0] is model.scale
        assert model.scale.grad is not None and model.scale.grad.device.type == "meta"
    params = (64 * 64 + 64 + 1024) * 4
    assert est.result["param_bytes"] == params
    # After the step: parameters, gradients and both moments of each.
    assert est.result.peak_bytes >= 4 * params


def test_bad_input_names_the_problem():
    model = Blocks(depth=1, width=8)
    x = torch.randn(2, 8)
    # Rust's parser speaks: the message lists the words the command line takes.
    with pytest.raises(ValueError, match=r"optimizer.*lion.*sgd, momentum, adam or adamw"):
        gpu_mem_track.estimate(model, x, optimizer="lion")
    with pytest.raises(ValueError, match=r"shard.*zero4"):
        Estimator(shard="zero4")
    with pytest.raises(ValueError, match="mode"):
        gpu_mem_track.estimate(model, x, mode="finetune")
    with pytest.raises(ValueError, match="no-such-gpu"):
        gpu_mem_track.estimate(model, x, device_profile="no-such-gpu")
    with pytest.raises(ValueError, match="built before the block"), Estimator():
        model(x)
    with pytest.raises(ValueError, match="one GPU profile"):
        gpu_mem_track.fit(lambda b: None, device_profile="cuda")
    # After a failed block the next one runs.
    e = gpu_mem_track.estimate(model, x, mode="inference", device_profile="cuda")
    assert e.gpu is None and e["param_bytes"] == nbytes(model.parameters())
    # device=, the old name of device_profile, still works, with a deprecation warning.
    with pytest.warns(DeprecationWarning, match="pass device_profile='cuda'"):
        old = gpu_mem_track.estimate(model, x, mode="inference", device="cuda")
    assert old.gpu is None and old.peak_bytes == e.peak_bytes
    with pytest.warns(DeprecationWarning), pytest.raises(ValueError, match="one GPU profile"):
        gpu_mem_track.fit(lambda b: None, device="all")
    for both in ("t4", "h100-80g"):  # the default too: device must not win silently
        with pytest.raises(TypeError, match="pass device_profile only"):
            Estimator(device_profile=both, device="l4")


def test_options_take_the_command_lines_words_and_spellings():
    """``sgd-momentum`` is the command line's alias of ``momentum``: Python takes every spelling
    Rust's parser takes, and JSON and text name the value alike."""
    model = Blocks(depth=1, width=16)
    e = gpu_mem_track.estimate(model, torch.randn(4, 16), optimizer="sgd-momentum", device_profile="h100-80g")
    params = nbytes(model.parameters())
    assert e["optimizer_state_bytes"] == params  # one momentum buffer per parameter
    assert e["options"]["mode"] == {"train": "momentum"}
    text = str(e)
    assert "train (momentum)" in text and f"in {e['peak']['phase']} (iteration" in text, text
    amp = gpu_mem_track.estimate(model, torch.randn(4, 16), device_profile="h100-80g", world_size=2, precision="AMP_BF16")
    assert amp["rank"]["parallelism"]["precision"] == "amp-bf16"
    assert "(none, amp-bf16)" in str(amp)


def test_the_default_gpu_is_the_command_lines():
    from gpu_mem_track._load import native

    e = gpu_mem_track.estimate(Blocks(depth=1, width=8), torch.randn(2, 8))
    assert native.DEFAULT_GPU_TARGET == "auto"
    # Without a GPU, `auto` is the command line's fallback preset.
    if not torch.cuda.is_available():
        assert e.gpu["profile"]["name"] == "rtx4090"


def test_the_package_lists_no_word_of_the_vocabulary():
    """The names of optimizers, precisions, shardings, categories and phases come from Rust
    (``_native.vocabulary()``): no literal list, tuple, set or dict in the package holds two words
    of one option."""
    import ast
    from pathlib import Path

    from gpu_mem_track._load import native

    vocabulary = native.vocabulary()
    options = ("optimizer", "dtype", "precision", "shard", "category", "phase")
    package = Path(gpu_mem_track.__file__).parent
    found = []
    for path in sorted(package.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if not isinstance(node, (ast.List, ast.Tuple, ast.Set, ast.Dict)):
                continue
            elements = node.keys if isinstance(node, ast.Dict) else node.elts
            strings = {e.value for e in elements if isinstance(e, ast.Constant) and isinstance(e.value, str)}
            for option in options:
                words = strings & set(vocabulary[option])
                if len(words) >= 2:
                    found.append(f"{path.name}:{node.lineno}: {option} {sorted(words)}")
    assert not found, found


def test_what_the_program_makes_on_meta_itself_is_no_gpu_memory():
    # Large models are built on meta, sharded, then given memory with `to_empty`: only that last
    # step allocates on the GPU.
    with Estimator(device_profile="cuda") as est:
        with torch.device("meta"):
            layer = torch.nn.Linear(1000, 1000)
        scratch = torch.empty(10**9, device="meta")  # 4 GB, were it counted
        layer.to_empty(device="cuda")
        out = layer(torch.randn(8, 1000, device="cuda"))
        del scratch, out
    weight, bias, batch = 1000 * 1000 * 4, 1000 * 4, 8 * 1000 * 4
    assert max(p["peak_bytes"] for p in est.result["phases"]) == weight + bias + 2 * batch, est.result["phases"]
