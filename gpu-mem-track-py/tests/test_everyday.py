"""What users do every day, with a tracker running: none of it hangs, crashes, or changes a result
or an exception of the program."""

from __future__ import annotations

import gc
import os
import re
import threading
import warnings

import gpu_mem_track
import pytest
import torch
from conftest import GPU, device, logdir, parse_blocks  # noqa: F401
from gpu_mem_track import MemTracker


class Squares(torch.utils.data.Dataset):
    def __len__(self):
        return 64

    def __getitem__(self, i):
        return torch.full((8,), float(i)) ** 2


def test_dataloader_fork_workers(logdir):  # noqa: F811
    tracker = MemTracker(device="cpu")
    loader = torch.utils.data.DataLoader(
        Squares(),
        batch_size=8,
        num_workers=2,
        multiprocessing_context="fork",
        timeout=120,
    )
    total = sum(float(batch.sum()) for batch in loader)
    tracker.track()
    assert total == sum(float(i) ** 2 * 8 for i in range(64))
    assert len(parse_blocks(tracker.log_path)) == 1


def test_ops_on_other_threads_are_seen(logdir):  # noqa: F811
    tracker = MemTracker(device="cpu")
    made = []

    def work():
        made.append(torch.ones(4321))

    threads = [threading.Thread(target=work) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    tracker.track()
    lines, _ = parse_blocks(tracker.log_path)[0]
    assert ("+", 4, "(4321,)", 0.0659, "<class 'torch.Tensor'>", "torch.float32") in lines, lines


def test_no_grad_and_inference_mode(logdir):  # noqa: F811
    tracker = MemTracker(device="cpu")
    layer = torch.nn.Linear(32, 16)
    with torch.no_grad():
        a = layer(torch.ones(5, 32))
    with torch.inference_mode():
        b = layer(torch.ones(7, 32))
    tracker.track()
    lines, _ = parse_blocks(tracker.log_path)[0]
    shapes = {line[2] for line in lines if line[0] == "+"}
    assert {"(5, 16)", "(7, 16)"} <= shapes, lines
    assert not a.requires_grad and b.is_inference()


def test_compiled_model_allocator_totals(logdir):  # noqa: F811
    tracker = MemTracker(device="cpu")
    model = torch.nn.Sequential(torch.nn.Linear(64, 64), torch.nn.ReLU(), torch.nn.Linear(64, 8))
    compiled = torch.compile(model, backend="aot_eager")
    x = torch.randn(32, 64)
    expected = model(x)
    before = gpu_mem_track._native.cpu_allocated()
    out = compiled(x)
    point = tracker.track()
    torch.testing.assert_close(out, expected)
    # The registry may not see a compiled graph's outputs (see the README); the allocator does.
    assert point["allocated"] - before >= out.numel() * 4
    del out


def test_inductor_buffers_are_counted_and_named(logdir):  # noqa: F811
    # Inductor's code allocates a compiled graph's buffers past the dispatcher and its C++ kernels
    # fill them: no op returns them. The registry has them from inductor's allocator, as
    # `inductor buffer`, and none of them is left to Unattributed Memory.
    tracker = MemTracker(device="cpu")

    def step(x):
        return (x * 2 + 1).relu(), x.amax(0)

    compiled = torch.compile(step)  # inductor's CPU backend, its kernels built
    x = torch.randn(512, 256)
    compiled(x)  # compiles
    before = tracker.track()
    out, total = compiled(x)
    point = tracker.track()
    expected = step(x)
    torch.testing.assert_close(out, expected[0])
    torch.testing.assert_close(total, expected[1])
    made = out.numel() * 4 + total.numel() * 4
    assert point["tensor_bytes"] - before["tensor_bytes"] == made, (before, point)
    assert point["unattributed_bytes"] == before["unattributed_bytes"], (before, point)
    with open(tracker.log_path) as f:
        block = f.read().split(point["at"].strip())[0].rsplit("At ", 1)[1]
    added = [line for line in block.splitlines() if line.startswith("+ |")]
    line = "+ | 1 * Size:{:<20} | Memory: {} M | <class 'torch.Tensor'> | torch.float32 | inductor buffer"
    assert sorted(added) == sorted([line.format("(512, 256)", "0.5"), line.format("(256,)", "0.001")]), block
    del out, total


def test_model_moved_after_the_tracker_started(logdir):  # noqa: F811
    tracker = MemTracker(device=device() if GPU else "cpu")
    model = torch.nn.Linear(100, 10)
    tracker.track()
    model.to(device(), dtype=torch.float64)
    tracker.track()
    lines, _ = parse_blocks(tracker.log_path)[1]
    assert ("+", 1, "(10, 100)", 0.0076, "<class 'torch.nn.parameter.Parameter'>", "torch.float64") in lines, lines


def test_swapped_tensors_swap_as_without_the_tracker_and_stay_in_the_log(logdir):  # noqa: F811
    # torch.utils.swap_tensors refuses a tensor held weakly, as the registry holds every tensor;
    # FSDP2's to_empty after a meta-device init and swap_module_params_on_conversion swap so.
    tracker = MemTracker(device="cpu")
    a, b = torch.zeros(3333), torch.ones(4444)
    torch.utils.swap_tensors(a, b)
    assert a.shape == (4444,) and b.shape == (3333,) and float(a.sum()) == 4444.0
    model = torch.nn.Linear(50, 5)
    torch.__future__.set_swap_module_params_on_conversion(True)
    try:
        model.to(torch.float64)  # swaps each parameter for its float64 copy
    finally:
        torch.__future__.set_swap_module_params_on_conversion(False)
    assert model.weight.dtype == torch.float64 and isinstance(model.weight, torch.nn.Parameter)
    tracker.track()
    lines, _ = parse_blocks(tracker.log_path)[0]
    assert ("+", 1, "(4444,)", 0.017, "<class 'torch.Tensor'>", "torch.float32") in lines, lines
    assert ("+", 1, "(3333,)", 0.0127, "<class 'torch.Tensor'>", "torch.float32") in lines, lines
    assert any(line[2] == "(5, 50)" and line[5] == "torch.float64" for line in lines), lines


def test_two_trackers_write_two_logs(logdir):  # noqa: F811
    first = MemTracker(device="cpu", path="a-")
    second = MemTracker(device="cpu", path="b-")
    keep = torch.ones(2222)
    first.track()
    second.track()
    assert first.log_path != second.log_path
    for t in (first, second):
        lines, _ = parse_blocks(t.log_path)[0]
        assert ("+", 1, "(2222,)", 0.0085, "<class 'torch.Tensor'>", "torch.float32") in lines
    del keep


def test_results_and_exceptions_are_unchanged(logdir):  # noqa: F811
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(16, 16), torch.nn.Tanh(), torch.nn.Linear(16, 1))
    x = torch.randn(8, 16)

    def step():
        loss = model(x).square().mean()
        loss.backward()
        grads = [p.grad.clone() for p in model.parameters()]
        model.zero_grad()
        try:
            torch.ones(2, 3) @ torch.ones(4, 5)
        except RuntimeError as e:
            return loss.item(), grads, type(e), str(e)
        raise AssertionError("expected a shape error")

    with gpu_mem_track.registry_paused():
        without = step()
    tracker = MemTracker(device="cpu")
    tracker.track()
    with_tracker = step()
    tracker.track()
    assert with_tracker[0] == without[0]
    for a, b in zip(with_tracker[1], without[1]):
        assert torch.equal(a, b)
    assert with_tracker[2:] == without[2:]


def test_a_paused_registry_sees_no_op_and_a_tracker_resumes_it(logdir):  # noqa: F811
    tracker = MemTracker(device="cpu")
    tracker.track()
    callbacks = gpu_mem_track._native.registry_callbacks
    before = callbacks()
    with gpu_mem_track.registry_paused():
        assert not gpu_mem_track.registry_running()
        kept = torch.ones(123, 457, dtype=torch.float64) * 2
        with gpu_mem_track.registry_paused():
            pass
        # Leaving the inner block leaves the outer one's pause.
        assert not gpu_mem_track.registry_running()
        assert callbacks() == before
    assert gpu_mem_track.registry_running()
    # Resuming registered the tensor Python holds, made while paused.
    tracker.track()
    lines, _ = parse_blocks(tracker.log_path)[1]
    assert ("+", 1, "(123, 457)", 0.4289, "<class 'torch.Tensor'>", "torch.float64") in lines, lines

    gpu_mem_track.pause_registry()
    assert not gpu_mem_track.registry_running()
    MemTracker(device="cpu")
    assert gpu_mem_track.registry_running()
    before = callbacks()
    kept = kept + 1
    assert callbacks() > before


def test_history_snapshot(logdir):  # noqa: F811
    tracker = MemTracker(device="cpu")
    tracker.record_history()
    x = torch.ones(1000, 100)
    tracker.tag_input(x)
    tracker.track()
    y = x * 2
    del y
    tracker.track()
    tracker.stop_history()
    tracker.dump_snapshot(logdir / "snap.pickle")
    import pickle

    with open(logdir / "snap.pickle", "rb") as f:
        snap = pickle.load(f)
    actions = [e["action"] for e in snap["device_traces"][0]]
    assert actions.count("alloc") >= 2 and "free_completed" in actions
    with pytest.raises(gpu_mem_track.GpuMemTrackError, match="already running"):
        tracker.record_history()
        tracker.record_history()


def test_an_optimizers_state_is_named_as_such(logdir):  # noqa: F811
    tracker = MemTracker(device="cpu")
    model = torch.nn.Linear(64, 32)
    opt = torch.optim.Adam(model.parameters())
    model(torch.randn(4, 64)).sum().backward()
    opt.step()
    tracker.track()
    with open(tracker.log_path) as f:
        text = f.read()
    # exp_avg and exp_avg_sq of the weight, made and kept by the step.
    state = [line for line in text.splitlines() if "Size:(32, 64)" in line and "optimizer state" in line]
    assert state and "2 * Size:(32, 64)" in state[0], text

    # A step that raises ends its marking: what is made afterwards is no optimizer state.
    class Failing(torch.optim.SGD):
        def step(self, closure=None):
            raise RuntimeError("no step today")

    failing = Failing(model.parameters(), lr=0.1)
    with pytest.raises(RuntimeError, match="no step today"):
        failing.step()
    opt.step()  # the next step's hooks end the failed one's marking first
    after = torch.zeros(5, 13)
    tracker.track()
    last = parse_blocks(tracker.log_path)[-1][0]
    assert [line for line in last if line[2] == "(5, 13)"], last
    assert "(5, 13)" not in [line[2] for line in last if "optimizer" in str(line)], last
    del after


def test_what_a_steps_closure_makes_is_not_optimizer_state(logdir):  # noqa: F811
    # LBFGS and Lightning run the forward and backward in a closure inside the step: the closure's
    # gradients and activations are not optimizer state; SGD's momentum buffers are. The closure's
    # result and its exception reach the program unchanged.
    tracker = MemTracker(device="cpu")
    model = torch.nn.Linear(48, 24)
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    x = torch.randn(4, 48)

    def closure():
        opt.zero_grad()
        loss = model(x).sum()
        loss.backward()
        return loss

    loss = opt.step(closure)
    assert isinstance(loss, torch.Tensor) and loss.requires_grad
    tracker.track()
    marked = [line for line in parse_blocks(tracker.log_path)[-1][0] if line[2] == "(24, 48)"]
    assert ("+", 1, "(24, 48)", 0.0044, "<class 'torch.Tensor'>", "torch.float32") in marked, marked
    with open(tracker.log_path) as f:
        state = [line for line in f if "Size:(24, 48)" in line and "optimizer state" in line]
    assert len(state) == 1 and "1 * Size:(24, 48)" in state[0], state

    def failing():
        raise ValueError("closure says no")

    with pytest.raises(ValueError, match="closure says no"):
        opt.step(failing)
    after = torch.zeros(6, 11)
    tracker.track()
    last = parse_blocks(tracker.log_path)[-1][0]
    assert [line for line in last if line[2] == "(6, 11)" and "optimizer" not in str(line)], last
    del after


def test_regions_and_functions_are_tracked_on_entry_and_exit(logdir):  # noqa: F811
    tracker = MemTracker(device="cpu")

    @tracker.track_function
    def make(n):
        return torch.zeros(n, 11)

    with tracker.region("forward"):
        kept = make(3)
    at = [line for _, line in parse_blocks(tracker.log_path)]
    assert [re.search(r"line \d+: (.*?) +Total Tensor", a).group(1) for a in at] == [
        "forward (enter)",
        "test_regions_and_functions_are_tracked_on_entry_and_exit.<locals>.make (enter)",
        "test_regions_and_functions_are_tracked_on_entry_and_exit.<locals>.make (exit)",
        "forward (exit)",
    ], at
    blocks = parse_blocks(tracker.log_path)
    # The tensor appears at the function's exit, and the exit lines name where each one ends.
    assert [line[2] for line in blocks[2][0]] == ["(3, 11)"], blocks
    assert kept.shape == (3, 11)
    # get_tensors(): the tracked device's tensors Python holds, this one among them.
    assert any(t is kept for t in tracker.get_tensors())


def test_a_failing_track_warns_once_per_distinct_failure_and_returns_none(logdir):  # noqa: F811
    tracker = MemTracker(device="cpu")
    real = tracker._tracker

    class Failing:
        """The native tracker, failing as a full disk or a lost GPU would."""

        errors = iter([OSError("No space left on device"), OSError("No space left on device"),
                       gpu_mem_track.GpuMemTrackError("CUDA error: device lost")])  # fmt: skip

        def __getattr__(self, name):
            return getattr(real, name)

        def track(self, *args):
            raise next(self.errors)

    tracker._tracker = Failing()
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        assert [tracker.track() for _ in range(3)] == [None, None, None]
    failures = [str(w.message) for w in seen if "track failed" in str(w.message)]
    assert len(failures) == 2 and "No space left" in failures[0] and "device lost" in failures[1], failures
    tracker._tracker = real
    assert tracker.track() is not None


def test_watch_names_a_models_parameters_by_module_path(logdir, capsys):  # noqa: F811
    tracker = MemTracker(device="cpu")
    model = tracker.watch(torch.nn.Sequential(torch.nn.Linear(8, 4), torch.nn.BatchNorm1d(4)), "net")
    extra = tracker.register(torch.zeros(3, 5), "my.extra")
    tracker.print_all_gpu_tensor()
    out = capsys.readouterr().out
    for name in ("net.0.weight", "net.0.bias", "net.1.weight", "net.1.running_mean", "my.extra"):
        assert any(line.startswith(name + " ") for line in out.splitlines()), (name, out)
    with pytest.raises(TypeError, match="expected a tensor"):
        tracker.register([1, 2], "not.a.tensor")
    assert extra.shape == (3, 5) and isinstance(model, torch.nn.Sequential)


def mix(n: int) -> list[torch.Tensor]:
    """The mix of ``benches/track.rs``: 16 shapes, every fourth tensor a view of its own base."""
    out = []
    for i in range(n):
        base = torch.zeros((i % 16 + 1, 4))
        out.append(base.view(-1) if i % 4 == 0 else base)
    return out


def test_a_large_walk_of_views_and_parameters_counts_each_tensor_once(logdir):  # noqa: F811
    # 8 192 tensors: the walk splits them among its helper threads, which read the tensors that
    # have a Python object without pinning them (the GIL keeps them alive).
    tracker = MemTracker(device="cpu")
    tensors = mix(8192)
    weight = torch.nn.Parameter(torch.zeros(1000, 3))
    weight_view = weight[:10]  # a view of a parameter: not one itself
    tracker.track()
    lines, _ = parse_blocks(tracker.log_path)[-1]
    counts = {(shape, cls): n for sign, n, shape, _, cls, _ in lines if sign == "+"}
    # Shape (k, 4) is tensor i's base for i % 16 == k - 1, and tensor i is a view of it when
    # i % 4 == 0: the view keeps its base alive, and is counted on the base's line.
    for k in range(1, 17):
        assert counts[(f"({k}, 4)", "<class 'torch.Tensor'>")] == 8192 // 16, k
    with open(tracker.log_path) as f:
        assert f.read().count("| (+512 views)") == 4
    assert counts[("(1000, 3)", "<class 'torch.nn.parameter.Parameter'>")] == 1
    assert tracker.get_tensor_usage() * 2**20 >= sum(t.untyped_storage().nbytes() for t in tensors) + 12_000
    del tensors, weight_view


def test_track_while_other_threads_make_and_drop_views(logdir):  # noqa: F811
    # Threads that make views, drop them and run autograd while the main thread walks thousands of
    # tensors: every walk ends, and the last one counts exactly what is left.
    tracker = MemTracker(device="cpu")
    gc.collect()
    before = tracker._tracker.tensor_bytes()
    kept = mix(6000)
    stop = threading.Event()
    errors = []

    def churn(seed: int) -> None:
        try:
            g = torch.Generator().manual_seed(seed)
            w = torch.randn(64, 64, generator=g, requires_grad=True)
            while not stop.is_set():
                views = [t.view(-1)[:2] for t in mix(300)]
                loss = (w.view(-1)[:100] * 2).sum() + sum(v.sum() for v in views[:10])
                loss.backward()
                del views, loss
        except Exception as e:  # noqa: BLE001 - reported by the test
            errors.append(e)

    threads = [threading.Thread(target=churn, args=(s,)) for s in range(2)]
    for t in threads:
        t.start()
    try:
        for _ in range(60):
            assert tracker.track() is not None
    finally:
        stop.set()
        for t in threads:
            t.join(timeout=120)
    assert not errors, errors
    assert not any(t.is_alive() for t in threads)
    gc.collect()
    point = tracker.track()
    assert point is not None
    # The threads' tensors are gone: what is left is what this test keeps (each storage once).
    kept_bytes = sum({t.untyped_storage().data_ptr(): t.untyped_storage().nbytes() for t in kept}.values())
    assert point["tensor_bytes"] - before == kept_bytes
    del kept


class AnswersFromPython(torch.Tensor):
    """A subclass whose device() asks Python, as FakeTensor's does; counts the questions."""

    asked: list[str] = []  # noqa: RUF012 - the class's own record

    @staticmethod
    def __new__(cls, elem: torch.Tensor):
        return torch.Tensor._make_subclass(cls, elem, False, dispatch_device=True)

    @classmethod
    def __torch_dispatch__(cls, func, types, args=(), kwargs=None):
        cls.asked.append(str(func))
        if func is torch.ops.prim.device.default:
            return torch.device("cpu")
        return NotImplemented


def test_a_walk_never_asks_python_while_it_holds_the_registry(logdir):  # noqa: F811
    # Python code run under the registry's lock may hand the GIL to a thread that then waits for
    # that lock: a hang (seen with a FakeTensor left by torch.compile, and threads making views).
    # The walks read a subclass's stored device and sizes instead, so they count it all the same.
    tracker = MemTracker(device="cpu")
    gc.collect()
    before = tracker.track()["tensor_bytes"]
    t = AnswersFromPython(torch.zeros(1000))
    assert t.device == torch.device("cpu")  # the subclass does answer when asked
    AnswersFromPython.asked.clear()
    point = tracker.track()
    listing = tracker._tracker.tensors_text()  # the full walk, one line per tensor
    assert AnswersFromPython.asked == []
    assert point["tensor_bytes"] - before == 4000
    assert "(1000,)" in listing, listing
    del t


def test_a_notebook_shows_the_last_block_and_the_report(logdir):  # noqa: F811
    tracker = MemTracker(device="cpu")
    assert "no block yet" in tracker._repr_html_()
    weights = torch.zeros(300, 7)
    tracker.track()
    del weights
    tracker.track()
    shown = tracker._repr_html_()
    # The last block: the freed group in red, its figures in cells, the At line as the caption.
    assert '<td style="padding:2px 8px;border-bottom:1px solid #ddd;text-align:left;color:#cf222e">-</td>' in shown
    assert ">(300, 7)<" in shown and ">0.008<" in shown and "&lt;class &#x27;torch.Tensor&#x27;&gt;" in shown
    assert "<caption" in shown and "test_everyday.py line" in shown

    report = gpu_mem_track.report(tracker.log_path)
    assert str(report) == report.text and "peak" in report.text.lower()
    assert report.data["logs"][0]["points"] == 2
    table = report._repr_html_()
    assert os.path.basename(tracker.log_path) in table and "<details>" in table
    assert tracker.report().data == report.data
    with pytest.raises(ValueError, match="at least one log"):
        gpu_mem_track.report()
    with pytest.raises(OSError, match="missing.txt"):
        gpu_mem_track.report("missing.txt")
