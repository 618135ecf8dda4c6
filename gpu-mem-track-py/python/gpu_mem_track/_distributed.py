"""A distributed program in an ``Estimator`` block, run as one rank of ``world_size``: its
``init_process_group`` gets a simulated process group of that many ranks (collectives move no data),
its device mesh is built as on a GPU machine, and what a GPU run allocates for FSDP and DTensor is
recorded as it is allocated there:

- ``UntypedStorage.resize_``, with which FSDP frees and re-allocates unsharded parameters and their
  gradients, frees and allocates on meta as on a GPU (libtorch's meta resize only sets the size);
- the global-shape fakes DTensor's sharding propagation runs an op on, to learn its output's shape,
  stand for no memory and are not recorded;
- a functional collective's result is the collective's output itself, as on a GPU (the meta
  kernels of the ops that wrap it and wait on it copy it);
- FSDP's check that no parameter is left on meta is off: inside the block meta is the GPU;
- FSDP1's CUDA device handle answers without a GPU (streams are the CPU's);
- DDP's reducer allocates its buckets on meta as on the GPU; its check that the ranks' parameter
  shapes agree is off (the simulated ranks are one program), and its allreduce of a bucket
  completes with the bucket itself, as NCCL's in-place allreduce does (the simulated group's work
  completes with no value, which the reducer refuses); a comm hook the program registers runs in
  its place, and ``dist.all_reduce(..., async_op=True)``'s future holds its tensor, as NCCL's does.

What FSDP and DDP make is tagged with its own category as it is made (``breakdown()`` shows them):
sharded and unsharded parameters and gradients, the all-gather and reduce-scatter buffers, DDP's
buckets. Under FSDP2's ``CPUOffloadPolicy`` the model, its shards, their gradients and the
optimizer step are host memory (``MetaMode.offloads``), left out of the GPU figures.
"""

from __future__ import annotations

import functools
import sys
from typing import TYPE_CHECKING, Any

import torch

from ._load import native as _native

if TYPE_CHECKING:
    from ._meta_mode import MetaMode


def collectives_run_on_meta() -> bool:
    """Whether c10d's collectives have meta kernels in this torch (2.11 and later): a collective
    of the simulated process group on the block's meta tensors runs."""
    has_kernel = torch._C._dispatch_has_kernel_for_dispatch_key
    return all(has_kernel(op, "Meta") for op in ("c10d::allreduce_", "c10d::_allgather_base_", "c10d::_reduce_scatter_base_"))


class SimulatedRanks:
    """The block's distributed patches for rank ``rank`` of ``world_size``; ``used`` says whether the
    program made a process group (its figures are then that rank's, as traced)."""

    def __init__(self, world_size: int, rank: int) -> None:
        if world_size < 1:
            raise ValueError(f"Estimator: world_size={world_size} must be at least 1")
        if not 0 <= rank < world_size:
            raise ValueError(f"Estimator: rank={rank} must be in 0..{world_size - 1} (world_size={world_size})")
        self.world_size = world_size
        self.rank = rank
        self.used = False
        self.communicators = 0
        self._made_group = False

    def patch(self, undo: list, mode: MetaMode) -> None:
        """Patches torch for the block; what gives each back is appended to ``undo``."""
        self.used = False
        self.communicators = 0

        def patch(owner: Any, name: str, value: Any) -> None:
            old = getattr(owner, name)
            setattr(owner, name, value)
            undo.append(lambda: setattr(owner, name, old))

        storage_resize = torch.UntypedStorage.resize_

        def resize_(storage: torch.UntypedStorage, size: int) -> torch.UntypedStorage:
            if storage.device.type != "meta":
                return storage_resize(storage, size)
            _native.meta_storage_resize(storage._cdata, int(size))
            return storage

        patch(torch.UntypedStorage, "resize_", resize_)
        if not torch.distributed.is_available():
            return
        import torch.distributed as dist
        from torch.distributed import device_mesh

        init_process_group = dist.init_process_group

        def simulated_group(*args: Any, **kwargs: Any) -> None:
            # The program's backend, store and address are a real job's; this rank's group is the
            # simulated one, of the estimate's size, whatever the environment says.
            del args, kwargs
            if not collectives_run_on_meta():
                raise RuntimeError(
                    f"Estimator: a distributed program runs in the block from torch 2.11 on: this torch"
                    f" ({torch.__version__}) has no meta kernels of c10d's collectives"
                )
            from torch.testing._internal.distributed.fake_pg import FakeStore

            init_process_group("fake", rank=self.rank, world_size=self.world_size, store=FakeStore())
            self._made_group = True
            self.used = True

        # Wherever it is bound: torch's modules (device_mesh calls its own import) and the
        # program's (`from torch.distributed import init_process_group`).
        _patch_everywhere(patch, "init_process_group", init_process_group, simulated_group)
        mesh_init = device_mesh.DeviceMesh.__init__

        def rank_table(t: Any) -> Any:
            # init_device_mesh numbers the ranks with torch.arange, which the block made on meta:
            # the same numbers, on the CPU, where the mesh reads them.
            if isinstance(t, torch.Tensor) and t.device.type == "meta":
                return torch.arange(t.numel(), dtype=t.dtype).view(t.shape)
            return t

        def mesh_on_cpu_values(this: Any, device_type: str, *args: Any, **kwargs: Any) -> None:
            # A mesh's rank table holds values the mesh reads (which rank is where): real CPU
            # tensors. Its device is the GPU's, which in the block is meta; without a GPU the
            # CPU's device handle stands in for CUDA's.
            self.used = True
            with mode.cpu_is_cpu():
                args = tuple(rank_table(a) for a in args)
                kwargs = {k: rank_table(v) for k, v in kwargs.items()}
                mesh_init(this, "cpu" if device_type == "cuda" else device_type, *args, **kwargs)

        patch(device_mesh.DeviceMesh, "__init__", mesh_on_cpu_values)
        try:
            from torch.distributed.tensor._sharding_prop import ShardingPropagator
        except ImportError:  # torch without DTensor
            ShardingPropagator = None
        if ShardingPropagator is not None and hasattr(ShardingPropagator, "_propagate_tensor_meta_non_cached"):
            propagate = ShardingPropagator._propagate_tensor_meta_non_cached

            def propagate_unrecorded(this: Any, *args: Any, **kwargs: Any) -> Any:
                with _native.Unrecorded():
                    return propagate(this, *args, **kwargs)

            patch(ShardingPropagator, "_propagate_tensor_meta_non_cached", propagate_unrecorded)
        try:
            from torch.distributed.fsdp._fully_shard._fsdp_param_group import FSDPParamGroup
        except ImportError:  # torch without FSDP2
            FSDPParamGroup = None
        if FSDPParamGroup is not None:
            # In the block meta is the GPU, and the CPU meta too: FSDP's checks of the devices
            # its parameters are on cannot hold (the offloaded ones are on the host, as tagged).
            for check in ("_validate_no_meta_params", "_validate_cpu_offload_params"):
                if hasattr(FSDPParamGroup, check):
                    patch(FSDPParamGroup, check, lambda this: None)

        _patch_ddp(patch)
        _patch_fsdp1(undo, patch)
        _patch_fsdp2(patch, mode)
        _patch_functional_collectives(patch)

    def close(self) -> None:
        """Counts the NCCL communicators the program's process groups would hold on a GPU
        (``communicators``), then destroys the simulated process group the block made: the process
        is left as it was."""
        self.communicators = count_communicators() if self.used else 0
        if self._made_group:
            import torch.distributed as dist

            if dist.is_initialized():
                dist.destroy_process_group()
            self._made_group = False


def count_communicators() -> int:
    """The process groups of more than one rank this process has: on GPUs each holds an NCCL
    communicator, with its buffers outside the caching allocator (the device profile's
    ``nccl_communicator_bytes`` each). A 1-D mesh shares the default group; each dimension of a 2-D
    mesh is a group of its own."""
    import torch.distributed as dist

    if not dist.is_available() or not dist.is_initialized():
        return 0
    groups = dist.distributed_c10d._world.pg_map
    return sum(1 for group in groups if group.size() > 1)


def _patch_everywhere(patch: Any, name: str, old: Any, new: Any) -> None:
    """Patches ``name`` wherever a module binds ``old`` to it: torch's own modules and the
    program's (``from torch.distributed import init_process_group``)."""
    for module in list(sys.modules.values()):
        if getattr(module, name, None) is old:
            patch(module, name, new)


def _tag(tensor: Any, category: str) -> None:
    """Tags the block's allocation holding ``tensor`` (a DTensor: its local shard) with
    ``category``; the first tag of an allocation stays, so FSDP's and DDP's, made first, win over
    the parameters and gradients the block's hooks tag later."""
    tensor = getattr(tensor, "_local_tensor", tensor)
    if isinstance(tensor, torch.Tensor) and tensor.device.type == "meta":
        _native.recording_tag(tensor._cdata, category)


def _tagging(owner: Any, name: str, before: Any, after: Any, patch: Any) -> None:
    """Patches the method ``owner.name`` to call ``before(self, *args)`` and ``after(self, *args)``
    around it (either may be ``None``); nothing when torch has no such method."""
    method = getattr(owner, name, None)
    if method is None:
        return

    def tagged(this: Any, *args: Any, **kwargs: Any) -> Any:
        if before is not None:
            before(this, *args)
        out = method(this, *args, **kwargs)
        if after is not None:
            after(this, *args)
        return out

    patch(owner, name, tagged)


def _bucket_in_place(state: object, bucket: Any) -> torch.futures.Future:
    """A DDP comm hook: the bucket, allreduced in place, is its own result (no memory made)."""
    del state
    buffer = bucket.buffer()
    _tag(buffer, "ddp_bucket")
    done: torch.futures.Future = torch.futures.Future()
    done.set_result(buffer)
    return done


def _patch_functional_collectives(patch: Any) -> None:
    """A functional collective's output, as its caller gets it: on a GPU, the output itself, wrapped
    (``AsyncCollectiveTensor``) or waited on (``wait_tensor`` returns its argument); on meta, the
    meta kernels of both ops make a copy (``empty_like``), memory no GPU holds. In the block, the
    output itself (the simulated collectives have nothing to wait for)."""
    try:
        from torch.distributed import _functional_collectives as funcol
    except ImportError:  # torch without functional collectives
        return
    for name in ("_maybe_wrap_tensor", "wait_tensor"):
        op = getattr(funcol, name, None)
        if op is not None:
            patch(funcol, name, lambda tensor, op=op: tensor if tensor.device.type == "meta" else op(tensor))


def _in_mode_when_offloaded(collective: Any, mode: MetaMode) -> Any:
    """FSDP2's all-gather or reduce-scatter (``foreach_all_gather``, ``foreach_reduce``), with the
    block's mode on for offloaded parameters: in a backward they run in autograd's hooks, outside
    the mode (it sees the ``Tensor.backward`` call, and the call runs outside it), where their
    moves between the host and the GPU would be no copies."""

    def run(fsdp_params: Any, *args: Any, **kwargs: Any) -> Any:
        from torch.overrides import _get_current_function_mode_stack

        offloaded = any(getattr(p, "offload_to_cpu", False) for p in fsdp_params)
        if offloaded and mode not in _get_current_function_mode_stack():
            with mode:
                return collective(fsdp_params, *args, **kwargs)
        return collective(fsdp_params, *args, **kwargs)

    return run


def _patch_fsdp2(patch: Any, mode: MetaMode) -> None:
    """FSDP2's tensors tagged by what they are, where its parameter group makes them; offloaded
    to the CPU, the model's parameters and their shards on the host."""
    try:
        from torch.distributed.fsdp._fully_shard import _fsdp_param_group
        from torch.distributed.fsdp._fully_shard._fsdp_param import FSDPParam
        from torch.distributed.fsdp._fully_shard._fsdp_param_group import FSDPParamGroup
    except ImportError:  # torch without FSDP2
        return
    from torch.distributed.fsdp._fully_shard import _fsdp_collectives

    record_stream = getattr(_fsdp_collectives, "record_grad_output_stream", None)
    if record_stream is not None:  # torch 2.15 and later

        def record_on_gpu(buffer: torch.Tensor, stream: Any) -> None:
            # The block's streams are the CPU's, which order nothing and have no stream id.
            if buffer.device.type != "meta":
                record_stream(buffer, stream)

        patch(_fsdp_collectives, "record_grad_output_stream", record_on_gpu)
    for name in ("foreach_all_gather", "foreach_reduce"):
        if hasattr(_fsdp_param_group, name):
            patch(_fsdp_param_group, name, _in_mode_when_offloaded(getattr(_fsdp_param_group, name), mode))
    from torch.optim import optimizer

    choose = getattr(optimizer, "_default_to_fused_or_foreach", None)
    if choose is not None:

        def on_the_cpu(params: Any, *args: Any, **kwargs: Any) -> tuple[bool, bool]:
            # The optimizer step on offloaded shards runs on the CPU: neither fused nor foreach
            # (the block's meta is a GPU to the optimizers otherwise).
            if mode.offloads and any(p is not None and mode.on_host(p) for p in params):
                return False, False
            return choose(params, *args, **kwargs)

        _patch_everywhere(patch, "_default_to_fused_or_foreach", choose, on_the_cpu)

    def sharded_param(p: Any) -> None:
        # The parameter's local shard: its padded data, and the tensor `to_empty` or
        # `load_state_dict(assign=True)` gave it (FSDP re-points its data at it only off meta).
        for shard in (getattr(p, "_sharded_param_data", None), getattr(p, "sharded_param", None)):
            if getattr(p, "offload_to_cpu", False):
                mode.put_on_host(shard)
            else:
                _tag(shard, "sharded_parameter")

    def offloaded(p: Any, param: Any, *args: Any) -> None:
        # Offloaded, the model is one the program built on the CPU (FSDP checks it is): the
        # parameter FSDP shards, on the host from the start.
        if getattr(p, "offload_to_cpu", False):
            mode.offloads = True
            mode.put_on_host(param)

    def sharded(group: Any, *args: Any) -> None:
        for p in group.fsdp_params:
            sharded_param(p)

    def gathered(group: Any, *args: Any) -> None:
        result = getattr(group, "_all_gather_result", None)
        _tag(getattr(result, "all_gather_output", None), "all_gather_buffer")

    def unsharded(group: Any, *args: Any) -> None:
        for p in group.fsdp_params:
            for t in getattr(p, "all_gather_outputs", ()):
                _tag(t, "unsharded_parameter")

    def unsharded_grads(group: Any, *args: Any) -> None:
        for p in group.fsdp_params:
            _tag(getattr(p, "unsharded_accumulated_grad", None), "unsharded_gradient")
            _tag(getattr(getattr(p, "_unsharded_param", None), "grad", None), "unsharded_gradient")

    def reduced(group: Any, *args: Any) -> None:
        for p in group.fsdp_params:
            _tag(getattr(p.sharded_param, "grad", None), "sharded_gradient")
        # The reduce-scatter the group just issued: the last of the states it keeps (torch 2.12 and
        # later), or its one state (torch 2.11).
        ctx = getattr(group, "comm_ctx", None)
        states = getattr(ctx, "reduce_scatter_states", None)
        state = states[-1] if states else getattr(ctx, "reduce_scatter_state", None)
        _tag(getattr(state, "reduce_scatter_input", None), "reduce_scatter_buffer")

    _tagging(FSDPParam, "__init__", None, offloaded, patch)
    _tagging(FSDPParamGroup, "__init__", None, sharded, patch)
    _tagging(FSDPParam, "reset_sharded_param", None, sharded_param, patch)
    _tagging(FSDPParamGroup, "wait_for_unshard", gathered, unsharded, patch)
    _tagging(FSDPParamGroup, "post_backward", unsharded_grads, reduced, patch)


def _tagged_hook(hook: Any) -> Any:
    """A DDP comm hook that first tags its bucket (``functools.wraps``: DDP checks the hook's own
    signature)."""

    @functools.wraps(hook)
    def tagged(state: object, bucket: Any) -> Any:
        _tag(bucket.buffer(), "ddp_bucket")
        return hook(state, bucket)

    return tagged


class _DoneWork:
    """A simulated collective's work, done, whose future holds the collective's output as NCCL's
    does (a comm hook reads it: ``fut.value()[0]``); the simulated group's holds none."""

    def __init__(self, work: Any, output: list) -> None:
        self._work = work
        self._output = output

    def get_future(self) -> torch.futures.Future:
        done: torch.futures.Future = torch.futures.Future()
        done.set_result(self._output)
        return done

    def __getattr__(self, name: str) -> Any:
        return getattr(self._work, name)


def _patch_ddp(patch: Any) -> None:
    try:
        from torch.distributed.algorithms.ddp_comm_hooks import default_hooks
        from torch.nn.parallel import distributed as ddp
    except ImportError:  # torch without torch.distributed
        return
    import torch.distributed as dist

    if hasattr(ddp, "_verify_param_shape_across_processes"):
        patch(ddp, "_verify_param_shape_across_processes", lambda *args, **kwargs: None)
    # DDP checks a hook's annotations against these objects; this module's are strings.
    _bucket_in_place.__annotations__ = {
        "state": object,
        "bucket": torch.distributed.GradBucket,
        "return": torch.futures.Future[torch.Tensor],
    }
    DDP = ddp.DistributedDataParallel
    init, register, pre_forward = DDP.__init__, DDP.register_comm_hook, DDP._pre_forward
    lazy = "_comm_hooks" in init.__code__.co_names  # the hooks registered, a list DDP keeps

    def simulated_ddp(this: Any, *args: Any, **kwargs: Any) -> None:
        init(this, *args, **kwargs)
        if not lazy:  # a torch that keeps no list of hooks: the block's, now
            register(this, None, _bucket_in_place)

    def first_forward(this: Any, *args: Any, **kwargs: Any) -> Any:
        # The program registers its own hook, if any, before its first forward; without one, the
        # block's (the reducer's own allreduce refuses the simulated group's empty result).
        if lazy and not getattr(this, "_comm_hooks", None):
            register(this, None, _bucket_in_place)
        return pre_forward(this, *args, **kwargs)

    def register_tagged(this: Any, state: object, hook: Any) -> None:
        register(this, state, _tagged_hook(hook))

    def builtin(this: Any, comm_hook_type: Any) -> None:
        # libtorch's own hooks allreduce through the group in C++, where the simulated result is
        # empty: their Python twins run.
        fp16 = comm_hook_type == dist.BuiltinCommHookType.FP16_COMPRESS
        if fp16:
            register_tagged(this, this.process_group, default_hooks.fp16_compress_hook)
        else:
            register_tagged(this, None, _bucket_in_place)

    patch(DDP, "__init__", simulated_ddp)
    patch(DDP, "_pre_forward", first_forward)
    patch(DDP, "register_comm_hook", register_tagged)
    patch(DDP, "_register_builtin_comm_hook", builtin)
    all_reduce = dist.all_reduce

    def all_reduce_done(tensor: torch.Tensor, *args: Any, **kwargs: Any) -> Any:
        work = all_reduce(tensor, *args, **kwargs)
        return _DoneWork(work, [tensor]) if work is not None else None

    _patch_everywhere(patch, "all_reduce", all_reduce, all_reduce_done)


class _SimulatedCudaHandle:
    """FSDP1's handle on CUDA in the block, where there is no GPU: device 0 of this rank, streams
    the CPU's (which order nothing: the block's ops run one after the other)."""

    def current_device(self) -> torch.device:
        return torch.device("cuda", 0)

    def is_available(self) -> bool:
        return True

    def device_count(self) -> int:
        return 1

    def __getattr__(self, name: str) -> Any:
        return getattr(torch.cpu, name)


def _patch_fsdp1(undo: list, patch: Any) -> None:
    try:
        from torch.distributed.fsdp import FullyShardedDataParallel, _init_utils
        from torch.distributed.fsdp._common_utils import _FSDPDeviceHandle
    except ImportError:  # torch without FSDP1
        return
    # The classmethod itself, not the method it binds to, is what goes back.
    from_device = vars(_FSDPDeviceHandle)["from_device"]
    handle = _SimulatedCudaHandle()

    def simulated(cls: type, device: torch.device) -> Any:
        return handle if device.type in ("cuda", "meta") else from_device.__func__(cls, device)

    _FSDPDeviceHandle.from_device = classmethod(simulated)
    undo.append(lambda: setattr(_FSDPDeviceHandle, "from_device", from_device))
    # A module on meta is one FSDP1 would materialize (to_empty, reset_parameters); in the block
    # meta is the GPU, where the module already is.
    if hasattr(_init_utils, "_need_to_materialize_module"):
        patch(_init_utils, "_need_to_materialize_module", lambda *args, **kwargs: (False, False))
    if hasattr(_init_utils, "_get_compute_device"):
        compute_device = _init_utils._get_compute_device

        def gpu_compute_device(module: Any, ignored: Any, device_id: Any, rank: int, handle: Any) -> torch.device:
            # The module's parameters are on meta, the block's GPU, which is then the compute
            # device: where FSDP1 makes its buffers, and what it checks its tensors are on.
            found = compute_device(module, ignored, None, rank, handle)
            return found if found.type == "meta" else compute_device(module, ignored, device_id, rank, handle)

        patch(_init_utils, "_get_compute_device", gpu_compute_device)
    init = FullyShardedDataParallel.__init__

    def on_this_gpu(this: Any, module: Any, *args: Any, **kwargs: Any) -> None:
        # FSDP1 takes its device from the module's parameters, skipping meta ones (the block's
        # GPU): the current CUDA device, as on the GPU where the module is.
        params = list(module.parameters()) if isinstance(module, torch.nn.Module) else []
        if kwargs.get("device_id") is None and params and all(p.is_meta for p in params):
            kwargs["device_id"] = torch.device("cuda", 0)
        init(this, module, *args, **kwargs)

    patch(FullyShardedDataParallel, "__init__", on_this_gpu)
    try:
        from torch.distributed.fsdp import _runtime_utils
        from torch.distributed.fsdp._flat_param import FlatParamHandle
    except ImportError:  # a torch whose FSDP1 is laid out otherwise: untagged
        return
    _tagging(FlatParamHandle, "shard", None, lambda h: _tag(h.flat_param, "sharded_parameter"), patch)
    _tagging(FlatParamHandle, "unshard", None, lambda h: _tag(h.flat_param, "unsharded_parameter"), patch)
    reduce_grad = getattr(_runtime_utils, "_reduce_grad", None)
    accumulate = getattr(_runtime_utils, "_accumulate_sharded_grad", None)
    if reduce_grad is not None and accumulate is not None:

        def reduce_unsharded(state: Any, handle: Any) -> None:
            _tag(handle.flat_param.grad, "unsharded_gradient")
            reduce_grad(state, handle)

        def accumulate_sharded(state: Any, handle: Any, sharded_grad: torch.Tensor) -> torch.Tensor:
            _tag(sharded_grad, "sharded_gradient")
            return accumulate(state, handle, sharded_grad)

        patch(_runtime_utils, "_reduce_grad", reduce_unsharded)
        patch(_runtime_utils, "_accumulate_sharded_grad", accumulate_sharded)
