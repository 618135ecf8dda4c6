"""The class column names each tensor's Python class, as Pytorch-Memory-Utils' ``type(obj)`` does."""

from __future__ import annotations

import pytest
import torch
from conftest import device, only_log, parse_blocks
from gpu_mem_track import MemTracker, _native

PARAM = "<class 'torch.nn.parameter.Parameter'>"
TENSOR = "<class 'torch.Tensor'>"

needs_python_classes = pytest.mark.skipif(
    not _native.reads_python_classes(),
    reason="this build's torch (before 2.10) does not keep a tensor's Python object alive for the walk",
)


class Scaled(torch.Tensor):
    """A tensor subclass defined before the tracker: named when MemTracker() is made."""


def lines_of(logdir) -> list[tuple]:
    return [line for block, _ in parse_blocks(only_log(logdir)) for line in block]


def classes_of(lines: list[tuple], shape: str) -> set[tuple[str, float]]:
    """(class, MiB) of the lines of one shape. ``as_subclass`` makes a view of its input, which
    keeps that input alive: the plain tensor holds the bytes, the subclass is a 0.0 M view (the
    tests that look at it print views, ``views=True``)."""
    return {(line[4], line[3]) for line in lines if line[2] == shape}


@needs_python_classes
def test_a_plain_tensor_that_requires_grad_is_a_tensor_and_a_parameter_is_a_parameter(logdir):
    tracker = MemTracker(device=device())
    tracker.track()
    weight = torch.nn.Parameter(torch.zeros(33, 7, device=device()))
    leaf = torch.zeros(35, 7, device=device(), requires_grad=True)
    tracker.track()
    lines = lines_of(logdir)
    assert ("+", 1, "(33, 7)", 0.0009, PARAM, "torch.float32") in lines, lines
    assert ("+", 1, "(35, 7)", 0.0009, TENSOR, "torch.float32") in lines, lines
    del weight, leaf


@needs_python_classes
def test_subclasses_print_their_module_and_qualified_name(logdir):
    tracker = MemTracker(device=device(), views=True)
    tracker.track()
    scaled = torch.zeros(37, 5, device=device()).as_subclass(Scaled)

    class Late(torch.Tensor):
        """Defined after the tracker: named by the next track(), which finds a new subclass."""

    late = torch.zeros(39, 5, device=device()).as_subclass(Late)
    buffer = torch.nn.Buffer(torch.zeros(41, 5, device=device())) if hasattr(torch.nn, "Buffer") else None
    tracker.track()
    lines = lines_of(logdir)
    assert repr(Scaled) == f"<class '{__name__}.Scaled'>"
    assert classes_of(lines, "(37, 5)") == {(TENSOR, 0.0007), (repr(Scaled), 0.0)}, lines
    assert "<locals>" in repr(Late)
    assert classes_of(lines, "(39, 5)") == {(TENSOR, 0.0007), (repr(Late), 0.0)}, lines
    if buffer is not None:
        assert (repr(type(buffer)), 0.0008) in classes_of(lines, "(41, 5)"), lines
    del scaled, late, buffer


@needs_python_classes
def test_a_class_stays_with_its_tensor_across_blocks(logdir):
    tracker = MemTracker(device=device(), views=True)
    scaled = torch.zeros(43, 3, device=device()).as_subclass(Scaled)
    tracker.track()
    del scaled
    tracker.track()
    blocks = parse_blocks(only_log(logdir))
    added = [line for line in blocks[0][0] if line[2] == "(43, 3)"]
    removed = [line for line in blocks[1][0] if line[2] == "(43, 3)"]
    assert sorted(added) == [
        ("+", 1, "(43, 3)", 0.0, repr(Scaled), "torch.float32"),
        ("+", 1, "(43, 3)", 0.0005, TENSOR, "torch.float32"),
    ], blocks
    assert sorted(removed) == [("-", *line[1:]) for line in sorted(added)], blocks


@pytest.mark.skipif(_native.reads_python_classes(), reason="the autograd rule is only used before torch 2.10")
def test_before_torch_2_10_a_leaf_that_requires_grad_is_a_parameter(logdir):
    tracker = MemTracker(device=device())
    tracker.track()
    leaf = torch.zeros(35, 7, device=device(), requires_grad=True)
    tracker.track()
    assert ("+", 1, "(35, 7)", 0.0009, PARAM, "torch.float32") in lines_of(logdir)
    del leaf


def test_by_default_a_view_is_counted_on_its_owners_line(logdir):
    tracker = MemTracker(device=device())
    tracker.track()
    base = torch.zeros(45, 3, device=device())
    flat = base.view(-1)
    tracker.track()
    del flat
    tracker.track()
    del base
    tracker.track()
    blocks = parse_blocks(only_log(logdir))
    assert not any(line[3] == 0.0 for block, _ in blocks for line in block), blocks
    assert [line for line in blocks[1][0] if line[2] == "(45, 3)"] == [("+", 1, "(45, 3)", 0.0005, TENSOR, "torch.float32")]
    assert blocks[2][0] == [], "a view going alone prints nothing"
