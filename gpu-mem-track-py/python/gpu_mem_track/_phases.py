"""What the program's hooks say as an ``Estimator`` block runs: the phases and iterations (a
forward of a module called outside any other starts an iteration, ``Tensor.backward`` the
backward, an optimizer's ``step`` the optimizer step), the module running (``_sites``), and who
owns the gradients and optimizer state.
"""

from __future__ import annotations

import threading
import weakref
from typing import TYPE_CHECKING, Any

import torch
import torch.optim.optimizer as _optim  # the module (torch.optim's namespace hides it)
from torch.utils._pytree import tree_leaves

from ._load import native as _native
from ._model_to_meta import note_model
from ._recorded_options import FirstInput

if TYPE_CHECKING:
    from ._meta_mode import MetaMode
    from ._sites import Sites


class PhaseHooks:
    """The hooks of ``Estimator``'s block (a base of it): what they say goes to the recording, and
    to the state the block's entry set up."""

    _thread: int
    _phase: str
    _iteration: int
    _backward_ran: bool
    _roots: dict[int, torch.nn.Module]
    _owners: dict[int, tuple[torch.Tensor, int]]
    _optimizers: dict[int, weakref.ref]
    _first_input: FirstInput | None
    _sites: Sites
    _mode: MetaMode
    _undo: list

    def _enter_backward(self) -> None:
        if self._phase != "backward":
            self._phase = "backward"
            self._backward_ran = True
            _native.recording_phase("backward", max(self._iteration, 1))

    def _root_forward(self, module: torch.nn.Module, args: tuple, kwargs: dict) -> None:
        if id(module) not in self._roots:  # before the phase: what it moves to meta is the model's
            note_model(module, self._mode, self._sites, self._owners)
            self._roots[id(module)] = module
        if self._phase != "forward":
            self._iteration += 1
            self._phase = "forward"
            _native.recording_phase("forward", self._iteration)
        # Each iteration's batch is input, though the program makes the next one after the
        # optimizer step (which would make it optimizer state, kept past the step).
        tensors = [t for t in tree_leaves((args, kwargs)) if isinstance(t, torch.Tensor)]
        if self._first_input is None:
            self._first_input = FirstInput.of(tensors)
        for t in tensors:
            if t.device.type == "meta":
                _native.recording_tag(t._cdata, "input")

    def _own_gradients(self) -> None:
        """Charges each parameter's gradient to the parameter's module."""
        for p, site in self._owners.values():
            g = p.grad
            if g is not None and g.device.type == "meta":
                _native.recording_owner(g._cdata, site)

    def _own_state(self, optimizer: torch.optim.Optimizer, args: Any, kwargs: Any) -> None:
        """Charges an optimizer's state of each parameter to the parameter's module."""
        for p, state in optimizer.state.items():
            owner = self._owners.get(id(p))
            if owner is None or owner[0] is not p:
                continue
            for v in state.values():
                if isinstance(v, torch.Tensor) and v.device.type == "meta":
                    _native.recording_owner(v._cdata, owner[1])

    def _note_constant(self, meta: torch.Tensor, value: Any) -> None:
        """``meta`` stands in the block for a tensor of the program's whose elements all hold
        ``value`` (``_value_ops.constant_of``; ``None``: not constant)."""
        self._mode.known.set(meta, value)

    def _optimizer_step(self, optimizer: torch.optim.Optimizer, args: Any, kwargs: Any) -> None:
        self._own_gradients()
        self._optimizers[id(optimizer)] = weakref.ref(optimizer)
        if self._phase != "optimizer":
            self._phase = "optimizer"
            _native.recording_phase("optimizer", max(self._iteration, 1))

    def _install_hooks(self, tracker: Any) -> None:
        """The module hooks (``tracker``: a ``ModTracker``), the call of a model, and the
        optimizer step hooks, for the block; what takes each down goes to ``_undo``."""
        sites = self._sites

        def fqn(module):
            # ModTracker's backward hooks hold their module weakly: one the program made in
            # its forward and dropped (the CrossEntropyLoss T5 builds per call) arrives as None.
            return None if module is None else tracker.get_known_fqn(module)

        def pre_forward(module, args):
            if threading.get_ident() == self._thread:
                sites.enter(fqn(module))

        def post_forward(module, args, output):
            if threading.get_ident() == self._thread:
                sites.leave(fqn(module))

        def pre_backward(module, grad_output):
            self._enter_backward()
            sites.enter(fqn(module), backward=True)

        def post_backward(module, grad_input):
            sites.leave(fqn(module))

        tracker.register_user_hooks(pre_forward, post_forward, pre_backward, post_backward)
        # A module called outside any other's forward is the model: its call starts an
        # iteration's forward. Module.__call__, not a global forward pre-hook, which would
        # not see keyword arguments (`input_ids=...`), the input of most models. Not inside a
        # backward pass (checkpointing's recompute): autograd's own word for it, as
        # ModTracker's is_bw stays set after a backward until the next forward before torch 2.7.
        call = torch.nn.Module.__call__

        def module_call(module, *args, **kwargs):
            if torch.compiler.is_dynamo_compiling():  # a module inside a compiled graph
                return call(module, *args, **kwargs)
            in_backward = torch._C._current_graph_task_id() != -1
            if sites.idle() and not in_backward and threading.get_ident() == self._thread:
                sites.forget_backward()
                self._root_forward(module, args, kwargs)
            return call(module, *args, **kwargs)

        torch.nn.Module.__call__ = module_call
        self._undo.append(lambda: setattr(torch.nn.Module, "__call__", call))
        tracker.__enter__()
        self._undo.append(lambda: tracker.__exit__(None, None, None))
        pre = _optim.register_optimizer_step_pre_hook(self._optimizer_step)
        self._undo.append(pre.remove)
        post = _optim.register_optimizer_step_post_hook(self._own_state)
        self._undo.append(post.remove)


def module_tracker() -> Any:
    """PyTorch's ``ModTracker`` for the block, with nothing for dynamo to trace in compiled code: a
    module inside a compiled graph is the graph's, which runs as one."""
    from torch.distributed._tools.mod_tracker import ModTracker

    class BlockModTracker(ModTracker):
        def _fw_pre_hook(self, mod, input):
            if not torch.compiler.is_dynamo_compiling():
                super()._fw_pre_hook(mod, input)

        def _fw_post_hook(self, mod, input, output):
            if not torch.compiler.is_dynamo_compiling():
                super()._fw_post_hook(mod, input, output)

    return BlockModTracker()
