"""The declared patches: what torch_vnpu changes in other libraries, why, and what would make it unnecessary.

One entry per reason. ``checked`` is the library version the patch was written and tested against; a test fails
when the installed version differs, so a library upgrade re-examines every patch of that library. ``when`` says
when the patch is applied: ``import`` (``import torch``, which loads torch_vnpu), ``first compile`` (the first
``torch.compile`` / Inductor use), ``import of <module>`` (an import hook), ``integration`` (when the third-party
library is imported, unless ``VNPU_INTEGRATIONS`` switches the adapter off), or a mode that is switched on
explicitly (``port mode``, ``sanitizer``) and switched off again by its ``disable()``.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Patch:
    id: str
    library: str  # distribution name, as importlib.metadata knows it
    checked: str  # the version the patch was checked against
    when: str
    applied_by: str  # the torch_vnpu module that applies it
    targets: tuple[str, ...]  # what it replaces (qualified names)
    reason: str  # what goes wrong for vnpu without it
    upstream: str  # the upstream issue or change that would make it unnecessary


_TORCH = "2.13.0"
_IND = "torch_vnpu._inductor.cpu_assumptions"

PATCHES: tuple[Patch, ...] = (
    # ---- eager, at import ----
    Patch("cpu-policies.linear-cross-entropy", "torch", _TORCH, "import", "torch_vnpu.patches.cpu_policies",
          ("torch.nn.modules.linear_cross_entropy_options._AUTO_DEFAULTS",
           "torch.nn.modules.linear_cross_entropy_options.LinearCrossEntropyOptions._resolve_auto_acc_dtype"),
          "The chunked linear_cross_entropy picks its accumulation dtype from a table keyed by cpu/cuda; vnpu (CPU "
          "kernels) fell to the CUDA-like default and accumulated float16 chunks in float16 (4e-3 off CPU).",
          "Let a backend declare its numerics policy, or key the table by the kernels' device."),
    Patch("optim.graph-capture-health-check", "torch", _TORCH, "import", "torch_vnpu.patches.optim_capture",
          ("torch.optim.optimizer.Optimizer._accelerator_graph_capture_health_check",),
          "Capturing step() of an optimizer with capturable=False replays stale bias corrections; torch raises for "
          "CUDA and XPU only, so a vnpu graph trained silently wrong.",
          "Run the check for every torch.accelerator device that supports graph capture."),
    Patch("profiler.stop-keeps-trace", "torch", _TORCH, "import", "torch_vnpu.patches.profiler_stop",
          ("torch.autograd.profiler.profile.__exit__",),
          "A device error raised by the synchronize at the profiler's exit left the profiler running and lost "
          "the trace of the failing step.",
          "Stop the profiler in a finally block around the exit's device synchronize."),
    Patch("profiler.export-checks-path", "torch", _TORCH, "import", "torch_vnpu.patches.profiler_export",
          ("torch.autograd.profiler.profile.export_chrome_trace",
           "torch.profiler.profiler._KinetoProfile.export_chrome_trace"),
          "Kineto logs an unwritable export path, raises nothing and marks the trace saved, so the recording is "
          "lost (all devices); the path is now opened first and raises OSError.",
          "Kineto's export returns an error for a path it cannot open and torch raises it."),
    Patch("host-modes.setters-wait", "torch", _TORCH, "import", "torch_vnpu.patches.host_modes",
          ("torch._C._set_deterministic_algorithms", "torch._C._set_float32_matmul_precision",
           "torch._C._set_fp32_precision_setter", "torch._C._set_default_dtype", "torch._C.set_flush_denormal",
           "torch.set_flush_denormal", "torch.backends.*.ContextProp setters", "and the other at::Context setters"),
          "CPU kernels read at::Context flags when they run, on vnpu possibly after the host changed them: each "
          "setter first waits for queued vnpu work, so every kernel runs under the modes of its call.",
          "A backend hook called before at::Context's global modes change, or modes captured per operator."),
    Patch("cuda-unavailable.hint", "torch", _TORCH, "import", "torch_vnpu.patches.cuda_unavailable",
          ("torch.cuda._lazy_init",),
          "'Torch not compiled with CUDA enabled' also says how to run the CUDA script on vnpu unedited.",
          "None needed for correctness: a hook for backends to extend the CUDA-unavailable message."),
    Patch("multiprocessing.vnpu-tensors", "torch", _TORCH, "import", "torch_vnpu._multiprocessing_reductions",
          ("multiprocessing.reduction.ForkingPickler reducers of torch.Tensor, Parameter, UntypedStorage",),
          "torch.multiprocessing shares CUDA tensors through IPC handles and every other device by copy; vnpu "
          "tensors are shared by device-memory handles as CUDA's are (other devices keep torch's reducers).",
          "A per-device reduction hook in torch.multiprocessing.reductions."),
    Patch("serialization.load-streamed", "torch", _TORCH, "import", "torch_vnpu.patches.load_streamed",
          ("torch.load",),
          "torch.load(path, map_location=<device>) builds each storage in host memory and copies it with a blocking "
          "copy per storage; for a vnpu map_location the file is read into device memory through pinned buffers "
          "(torch_vnpu.checkpoints.torch_load). Other calls are torch.load's own.",
          "A device hook in torch.serialization that restores a storage from its byte range in the file."),
    Patch("distributed-checkpoint.read-into-device", "torch", _TORCH,
          "import of torch.distributed.checkpoint.filesystem", "torch_vnpu.patches.dcp_read",
          ("torch.distributed.checkpoint.filesystem.FileSystemReader.read_data",),
          "torch.distributed.checkpoint.load restores each tensor by building it in host memory (torch.load of its "
          "record) and copying it into its target; a vnpu target whose chunk is one byte range of the record is "
          "read from the file into the device instead (torch_vnpu.checkpoints.dcp). Other items and readers of "
          "other file systems are DCP's own.",
          "A storage-reader hook that hands a record's byte range to the target's device."),
    Patch("serialization.save-batched", "torch", _TORCH, "import", "torch_vnpu.patches.save_batched",
          ("torch.save", "torch.storage._StorageBase.cpu"),
          "torch.save copies each device storage to fresh host memory with a blocking copy just before writing it; "
          "for vnpu storages the downloads are queued ahead into pinned buffers and each write waits for its own "
          "(torch_vnpu.checkpoints.torch_save). Other .cpu() calls and devices are torch's own.",
          "A device hook in torch.serialization's writer that stages storages ahead of the writes."),
    Patch("distributed-checkpoint.staging-every-device", "torch", _TORCH,
          "import of torch.distributed.checkpoint.filesystem", "torch_vnpu.patches.dcp_staging",
          ("torch.distributed.checkpoint.filesystem._OverlappingCpuLoader.__init__",
           "torch.distributed.checkpoint.filesystem._OverlappingCpuLoader._drain",
           "torch.distributed.checkpoint.filesystem._OverlappingCpuLoader._finish"),
          "dcp.save stages tensors with non_blocking copies to the host and synchronizes a stream of the current "
          "device only; a tensor on another vnpu device was written before its copy finished (stale values, no "
          "error; CUDA has the same race). The loader now also synchronizes the streams of the devices it staged.",
          "Synchronize the source tensors' devices (or record events per source stream) in _OverlappingCpuLoader."),
    # ---- torch.compile: import hooks ----
    Patch("inductor.lazy-registration", "torch", _TORCH, "import of torch._inductor.codegen.common",
          "torch_vnpu._inductor.lazy", ("torch._inductor.codegen.common.init_backend_registration",),
          "torch 2.13 has no hook that registers a backend's Inductor code generators when Inductor starts; "
          "vnpu's are registered there (with its cache-key pass) without importing Inductor at import torch.",
          "An Inductor backend-init entry point for out-of-tree devices."),
    Patch("fake-conv.memory-format", "torch", _TORCH, "import of torch._subclasses.fake_impls",
          "torch_vnpu._inductor.fake_conv",
          ("torch._subclasses.fake_impls.op_implementations_dict[aten.convolution, _convolution, "
           "convolution_backward]",),
          "The fake convolution asks ATen which backend a PrivateUse1 device picks ('overrideable', always "
          "contiguous) while vnpu's real convolution (CPU's) follows a channels-last input; compiled graphs read "
          "conv outputs with the wrong strides.",
          "Let a backend supply its convolution memory-format rule to FakeTensor."),
    Patch("flex-attention.device", "torch", _TORCH, "import of torch.nn.attention.flex_attention",
          "torch_vnpu._inductor.flex_attention", ("torch.nn.attention.flex_attention._validate_device",),
          "flex_attention accepts cuda, cpu, xpu, hpu and mps only.",
          "Accept any device with a registered flex_attention implementation."),
    # ---- torch.compile: Inductor, at the first compile ----
    Patch("inductor.flex-attention-lowering", "torch", _TORCH, "first compile",
          "torch_vnpu._inductor.flex_attention", ("torch._inductor.lowering.lowerings[higher_order.flex_attention]",),
          "Inductor lowers flex_attention of any non-CPU, non-MPS graph to Triton; vnpu needs CPU's C++ template.",
          "Choose the flex_attention template by the device's code generator, not its type."),
    Patch("inductor.cpp-device-tables", "torch", _TORCH, "first compile", "torch_vnpu._inductor",
          ("torch._inductor.codegen.cpp_utils.DEVICE_TO_ATEN['vnpu']",
           "torch._inductor.codegen.cpp_utils.DEVICE_TO_INT['vnpu']"),
          "The C++ wrapper's device constants list cpu/cuda/xpu/mps; vnpu is PrivateUse1.",
          "Derive the entries from the device type for PrivateUse1 backends."),
    Patch("inductor.aoti-package", "torch", _TORCH, "first compile", "torch_vnpu._inductor.aoti",
          ("torch._inductor.codecache.AotCodeCompiler.compile",),
          "AOTInductor builds a package for a device from its GPU template; a vnpu model is built as a CPU model "
          "and tagged AOTI_DEVICE_KEY='vnpu' so aoti_load_package creates vnpu's runner.",
          "Let an out-of-tree device build AOTInductor models with the CPU code generator."),
    Patch("inductor.graph-trees", "torch", _TORCH, "import of torch._inductor.cudagraph_trees",
          "torch_vnpu._inductor.graph_trees",
          ("torch._inductor.cudagraph_trees (module code re-run)", "torch._inductor.compile_fx.cudagraphify_impl"),
          "Inductor's graph trees and its simple cudagraphify call torch.cuda and CUDA's allocator bindings by "
          "name, so mode='reduce-overhead' could not record graphs on any other device (XPU: a silent no-op). "
          "Their code runs unchanged with each CUDA name (torch.cuda.*, torch._C._cuda_*, Tensor.is_cuda) "
          "answered by vnpu. Only in a torch built without CUDA (else they stay CUDA's, and vnpu graphs compile "
          "without graphs).",
          "Device-generic graph trees: the graph, stream and allocator-pool calls taken from the device "
          "interface (pytorch/pytorch RFC #180168, PRs #190301, #191906, #194598)."),
    Patch("inductor.graph-gates", "torch", _TORCH, "import of torch._inductor.cudagraph_trees",
          "torch_vnpu._inductor.graph_trees",
          ("torch._inductor.cudagraph_utils.check_multiple_devices_or_any_cpu_nodes",
           "torch._inductor.cudagraph_utils.check_caching_allocator_for_cudagraphs",
           "torch._inductor.cudagraph_utils.collect_cuda_data_ptrs",
           "torch._inductor.cudagraph_utils.check_lowering_disable_cudagraph",
           "torch._inductor.scheduler.Scheduler.should_partition",
           "torch._inductor.fx_passes.post_grad.move_constructors_to_gpu"),
          "Inductor admits a graph to CUDA graphs only if its one device is 'cuda', and graph partitioning cuts "
          "every node that is not a GPU (Triton) node out of the graphs; vnpu graphs were always skipped. vnpu "
          "graphs with torch.cond/while_loop are skipped (CUDA records conditional nodes; vnpu has none). CPU "
          "scalar tensors (a Python float argument) are moved to the device only for CUDA: on vnpu a recorded "
          "graph kept their values of the recording.",
          "Ask the device interface whether the device records graphs, instead of comparing with 'cuda'."),
    Patch("dynamo.optimizer-capturable", "torch", _TORCH, "import of torch._dynamo.variables.optimizer",
          "torch_vnpu._inductor.graph_trees",
          ("torch._dynamo.variables.optimizer.OptimizerVariable._set_capturable",
           "torch._dynamo.variables.optimizer._is_static_for_cudagraphs"),
          "Dynamo makes a compiled optimizer step capturable (step counts on the device) only for CUDA/XPU "
          "parameters; on vnpu the CPU step count was read by value, so under mode='reduce-overhead' Adam's bias "
          "correction stayed at the recorded step (parameters 8e-2 off after 6 steps, no error). Only in a torch "
          "built without CUDA.",
          "Ask torch.optim's capturable-supported devices (which include PrivateUse1) instead of is_cuda/is_xpu."),
    Patch("inductor.current-backend", "torch", _TORCH, "first compile", _IND,
          ("torch._inductor.utils.get_current_backend",),
          "Every unknown device maps to Triton, so C++ kernels of vnpu graphs took Triton's masked-load branch and "
          "training graphs failed to compile.",
          "Ask the device's registered scheduling for its backend."),
    Patch("inductor.is-cpu", "torch", _TORCH, "first compile", _IND,
          ("torch._inductor.scheduler.BaseSchedulerNode.is_cpu",),
          "Three fusion-time loop rewrites that only Triton supports are skipped for CPU nodes only; the scheduler "
          "failed on vnpu's C++ kernels.",
          "Gate these rewrites on the scheduling backend, not on the CPU device."),
    Patch("inductor.device-guard", "torch", _TORCH, "first compile", _IND,
          ("torch._inductor.utils.device_need_guard",),
          "Only GPUs get a device guard, so a graph on vnpu:1 allocated on the current device (vnpu:0).",
          "A device interface query: does this device have several devices?"),
    Patch("inductor.logical-index-reductions", "torch", _TORCH, "first compile", _IND,
          ("torch._inductor.ir.get_device_type", "torch._inductor.lowering._make_reduction_inner"),
          "argmax/argmin over several dimensions of a permuted input returned an index in memory order on devices "
          "other than CUDA and CPU: a silently wrong result.",
          "Decide the index computation by code generator, not by device type."),
    Patch("inductor.cpu-heuristics", "torch", _TORCH, "first compile", _IND,
          ("torch._inductor.lowering.use_two_step_variance", "torch._inductor.utils.use_scatter_fallback"),
          "Two-pass variance and ATen's scatter_reduce fallback are chosen for CPU only; vnpu's compiled norms "
          "differed from CPU in the last bits and scatter sums in run-to-run order.",
          "Key the heuristics on the code generator (C++ vs Triton)."),
    Patch("inductor.layout-opt", "torch", _TORCH, "first compile", _IND,
          ("torch._inductor.graph.GraphLowering.decide_layout_opt",),
          "Channels-last layout optimization uses GPU heuristics for non-CPU devices; vnpu's convolution is CPU's.",
          "Ask the device's scheduling for the layout policy."),
    Patch("inductor.division-by-constant", "torch", _TORCH, "first compile", _IND,
          ("torch._inductor.lowering.get_constant_value", "torch._inductor.lowering.div_prim",
           "torch._inductor.lowering.lowerings[aten.div]"),
          "Division by a constant becomes multiplication by its reciprocal except on CPU; floor(x / 41) gave 0 "
          "for x = 41 on vnpu.",
          "Apply the CPU precision rule (pytorch/pytorch#157959) by code generator."),
    Patch("inductor.pointwise-cat", "torch", _TORCH, "first compile", _IND,
          ("torch._inductor.lowering.pointwise_cat",),
          "cat lowers to pointwise_cat off CPU; that path failed to compile transformers' ProphetNet in C++ kernels.",
          "Choose the cat lowering by code generator."),
    Patch("inductor.pointwise-device", "torch", _TORCH, "first compile", _IND,
          ("torch._inductor.lowering.is_gpu", "torch._inductor.ir.Pointwise.create",
           "torch._inductor.lowering.lowerings[aten.addcmul, aten.addcdiv]"),
          "A pointwise op with a 0-dim CPU tensor first ran as a host CPU kernel reading vnpu buffers without "
          "waiting for the stream (wrong values) and returned a CPU tensor.",
          "Treat every accelerator like a GPU in make_pointwise's device choice."),
    Patch("inductor.convolution-bias", "torch", _TORCH, "first compile", _IND,
          ("torch._inductor.kernel.conv.convolution", "torch._inductor.lowering.lowerings[aten.convolution]"),
          "The bias is peeled off into a separate add except on CPU, rounding bfloat16 outputs twice.",
          "Let the device's convolution declare whether it fuses the bias."),
    Patch("inductor.norm-statistics", "torch", _TORCH, "first compile", _IND,
          ("torch._refs.native_layer_norm", "torch._inductor.decomposition.decomp_native_layer_norm",
           "torch._decomp.decomposition_table[aten.native_layer_norm]",
           "torch._decomp.decompositions.native_batch_norm_helper"),
          "Layer/batch norm decompositions give CPU's saved statistics only for device.type == 'cpu'; vnpu's "
          "compiled bfloat16 backward differed from eager.",
          "Decompositions ask the kernel's statistics dtype rather than the device type."),
    Patch("inductor.combo-kernels", "torch", _TORCH, "first compile", _IND,
          ("torch._inductor.scheduler.ForeachKernelSchedulerNode.group_nodes_for_combo_kernels",),
          "Combo kernels group every non-CPU/MPS node, but only Triton-style schedulers generate them.",
          "Ask the scheduling backend whether it supports combo kernels."),
    # ---- torch.distributed, at import ----
    Patch("distributed.default-backend-config", "torch", _TORCH, "import", "torch_vnpu.distributed._compat",
          ("torch.distributed.distributed_c10d.BackendConfig.__init__",),
          "init_process_group() with no backend maps only the accelerator, so CPU tensors (object collectives, "
          "DCP metadata) had no backend; vnpu gets cpu:gloo,vnpu:vccl.",
          "Include cpu:gloo in the default map for plugin accelerators."),
    Patch("distributed.group-default-backend", "torch", _TORCH, "import", "torch_vnpu.distributed._compat",
          ("torch.distributed.distributed_c10d._new_process_group_helper",),
          "A group's default backend type may name a backend it does not have ('Could not find the default "
          "backend type').",
          "pytorch/pytorch#179901 (after 2.13)."),
    Patch("distributed.monitored-barrier", "torch", _TORCH, "import", "torch_vnpu.distributed._compat",
          ("torch.distributed.distributed_c10d.monitored_barrier",),
          "monitored_barrier refuses every group whose backend is not exactly 'gloo'; vccl implements it.",
          "Check the backend's capability instead of its name."),
    Patch("distributed.no-backend-hint", "torch", _TORCH, "import", "torch_vnpu.distributed._compat",
          ("torch.distributed.c10d_logger._get_msg_dict",),
          "'No backend type associated with device type cpu' does not say what to do; a note names the fix.",
          "None needed for correctness: a clearer message upstream."),
    Patch("distributed.dtensor-cpu-flash-attention", "torch", _TORCH, "import of torch.distributed.tensor",
          "torch_vnpu.distributed.dtensor_attention",
          ("DTensor sharding strategies of aten._scaled_dot_product_flash_attention_for_cpu and its backward",),
          "Grouped-query attention (enable_gqa=True) runs CPU's flash op on every device but CUDA, and DTensor has "
          "no strategy for it: tensor-parallel GQA attention on DTensors raised NotImplementedError.",
          "Register DTensor strategies for the CPU flash-attention ops (as for CUDA's flash op)."),
    # ---- third-party libraries (torch_vnpu.integrations) ----
    Patch("huggingface.accelerate", "accelerate", "1.15.0", "integration", "torch_vnpu.integrations.huggingface",
          ("accelerate.state.PartialState.default_device", "accelerate.state.PartialState._prepare_backend",
           "accelerate.state.PartialState.set_device", "accelerate's fp16 device list, get_grad_scaler",
           "accelerate.utils.modeling.get_max_memory"),
          "accelerate picks its device and collectives backend from a list of device types and falls back to the "
          "CPU, training every rank alone on CPU; big-model dispatch (device_map=\"auto\") measured listed devices "
          "only and put every weight on the CPU.",
          "Ask torch.accelerator where the lists end (the direction accelerate is taking)."),
    Patch("huggingface.transformers", "transformers", "5.17.0", "integration",
          "torch_vnpu.integrations.huggingface",
          ("transformers.training_args.TrainingArguments._setup_devices",
           "transformers.training_args.is_torch_bf16_gpu_available",
           "transformers.generation.utils.GenerationMixin._optimize_model_for_decode",
           "transformers.modeling_utils.safe_open", "transformers.core_model_loading._materialize_copy"),
          "TrainingArguments chooses its device from a list and falls back to the CPU; bf16 is refused off GPU "
          "lists; generate() swaps MoE experts to batched_mm off CPU (3x slower with CPU kernels); "
          "from_pretrained copies each weight from a CPU tensor of the memory-mapped file with a blocking copy "
          "(read into vnpu memory through pinned buffers instead).",
          "Ask torch.accelerator where the lists end."),
    Patch("huggingface.peft", "peft", "0.21.0", "integration", "torch_vnpu.integrations.huggingface",
          ("peft.utils.other.infer_device",), "infer_device falls back to the CPU for unlisted devices.",
          "Ask torch.accelerator where the list ends."),
    Patch("huggingface.safetensors", "safetensors", "0.8.0", "integration", "torch_vnpu.integrations.huggingface",
          ("safetensors.safe_open", "safetensors.torch.safe_open", "safetensors.torch.load_file",
           "safetensors.torch.save_file"),
          "safe_open(device='vnpu') is refused ('device vnpu is invalid'): device strings are parsed from a fixed "
          "list, though a device index is accepted; vnpu strings are passed as the index. load_file and "
          "safe_open().get_tensor onto vnpu, and save_file of vnpu tensors, stream through pinned buffers "
          "(torch_vnpu.checkpoints) instead of a blocking copy per tensor.",
          "Accept any torch device string and hand it to torch."),
    Patch("lightning.accelerator", "lightning", "2.6.6", "integration", "torch_vnpu.integrations.lightning",
          ("lightning's _AcceleratorConnector (auto accelerator, single-device strategy, precision, fsdp check)",
           "DDPStrategy setup side stream", "_basic_subprocess_cmd (port mode)", "the Trainer's device banner"),
          "Lightning lists CUDA/MPS and falls back to the CPU; DDP setup uses torch.cuda.Stream; FSDP and mixed "
          "precision are tied to 'cuda'.",
          "An accelerator-registry path that covers out-of-tree accelerators end to end."),
    # ---- modes switched on explicitly ----
    Patch("port-mode", "torch", _TORCH, "port mode", "torch_vnpu.port._cuda",
          ("torch.cuda.* (forwarded to torch.vnpu)", "Tensor.cuda", "torch.load", "torch.distributed.Backend",
           "init_process_group", "DeviceMesh", "is_nccl_available", "is_backend_available"),
          "Runs a script written for CUDA on vnpu unedited; everything is restored by port.disable().",
          "None: a porting aid, not a workaround."),
    Patch("sanitizer.cuda-calls", "torch", _TORCH, "sanitizer", "torch_vnpu.sanitizer.cuda_calls",
          ("torch.cuda.* calls, Tensor.is_cuda, GradScaler/autocast constructors",),
          "Reports hard-coded CUDA calls of the user's code while the sanitizer runs; restored when it stops.",
          "None: a diagnostic."),
)
