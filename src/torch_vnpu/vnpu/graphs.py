"""vnpu graphs: capture a sequence of vnpu work once, replay it with one launch (mirrors ``torch.cuda.graphs``).

``VNPUGraph`` has ``torch.cuda.CUDAGraph``'s API and is PyTorch's device-generic ``torch.accelerator.Graph`` on
vnpu (both are the same C++ graph, ``at::GraphImplInterface``); ``graph`` is ``torch.cuda.graph``'s context manager.

Semantics (CUDA graphs'): while the capture stream captures, the ops enqueued on it are recorded, not run, and the
tensors they allocate come from the graph's private memory pool. ``replay()`` enqueues the whole recorded sequence
as ONE task on the current stream; the kernels run on the same device addresses as at capture, so fill the
captured input tensors (``static_x.copy_(x)``) before each replay and read the captured output tensors after it.
Random ops draw new numbers at every replay (the generator advances as it would eagerly). A host synchronization
inside the capture (``torch.vnpu.synchronize()``, ``.item()``, ``.cpu()``, printing a tensor, an op whose output
shape depends on the data) or a copy from pageable host memory raises ``torch.AcceleratorError`` ("operation not
permitted when stream is capturing") and invalidates the capture; ``capture_end()`` then raises too and the
graph may be reset and captured again. Work forked to other streams through events or ``wait_stream`` joins the
capture and must be joined back before it ends (cross-stream capture, as CUDA's). See docs/graphs.md.
"""

from __future__ import annotations

import gc
from typing import Optional

import torch

from .. import _C

__all__ = ["VNPUGraph", "graph", "graph_pool_handle", "is_current_stream_capturing", "make_graphed_callables"]


def is_current_stream_capturing() -> bool:
    """True if the current vnpu stream of the current device is capturing a graph (as
    ``torch.cuda.is_current_stream_capturing``); False without initializing the device otherwise."""
    return bool(_C._is_current_stream_capturing())


def graph_pool_handle() -> tuple[int, int]:
    """A new memory pool id that several graphs may share (``pool=``), as ``torch.cuda.graph_pool_handle``.

    Graphs sharing a pool must be replayed in the order they were captured (their memory overlaps)."""
    return tuple(_C._graph_pool_handle())


class VNPUGraph(torch._C._acceleratorGraph):
    """A vnpu graph with ``torch.cuda.CUDAGraph``'s API (``keep_graph``: see ``torch.cuda.CUDAGraph``).

    Prefer the ``torch.vnpu.graph`` context manager to calling ``capture_begin``/``capture_end`` yourself.
    Errors: capture on the default stream, a second capture without ``reset()``, ``replay()`` before a successful
    capture and illegal operations during capture raise RuntimeError (subclasses), as on CUDA.
    """

    def __new__(cls, keep_graph: bool = False):
        return super().__new__(cls, keep_graph)

    def __init__(self, keep_graph: bool = False) -> None:
        super().__init__(keep_graph)

    def capture_begin(self, pool: Optional[tuple[int, int]] = None, capture_error_mode: str = "global") -> None:
        """Begins capturing the current (non-default) stream. ``pool``: a ``graph_pool_handle()`` or another
        graph's ``pool()`` to share memory with; ``capture_error_mode``: "global" (default, as CUDA),
        "thread_local" or "relaxed" (which calls from which threads may break the capture, as
        ``cudaStreamCaptureMode``)."""
        super().capture_begin(pool=pool, capture_error_mode=capture_error_mode)

    def capture_end(self) -> None:
        """Ends the capture; raises if the capture was invalidated (the message names the call that did it)."""
        super().capture_end()

    def instantiate(self) -> None:
        """Makes the captured graph replayable (done by ``capture_end`` unless ``keep_graph=True``)."""
        super().instantiate()

    def replay(self) -> None:
        """Enqueues the captured work on the current stream as one task (asynchronous, stream-ordered)."""
        super().replay()

    def reset(self) -> None:
        """Drops the graph and releases its memory pool (returned to the device at the next ``empty_cache()``,
        or when the last tensor allocated during capture dies); the object may capture again."""
        super().reset()

    def pool(self) -> tuple[int, int]:
        """The id of this graph's memory pool, for another capture's ``pool=``."""
        return super().pool()

    def enable_debug_mode(self) -> None:
        """Keeps the captured graph for ``debug_dump``."""
        super().enable_debug_mode()

    def debug_dump(self, debug_path: str) -> None:
        """Writes the captured graph as Graphviz dot (one node per recorded task, in order)."""
        super().debug_dump(debug_path)


class graph:
    """Captures the vnpu work of its block into ``vnpu_graph`` (``torch.cuda.graph``'s context manager).

    Args:
        vnpu_graph (VNPUGraph or torch.accelerator.Graph): the graph to capture into.
        pool (tuple[int, int], optional): memory pool to share (``graph_pool_handle()`` or ``g.pool()``).
        stream (torch.vnpu.Stream, optional): capture stream; by default one side stream shared by all captures.
        capture_error_mode (str): "global" (default), "thread_local" or "relaxed", as ``torch.cuda.graph``.

    On entry: synchronizes the device, empties the caches (so the graph's pool starts clean), makes the capture
    stream current and begins the capture; on exit: ends it and restores the stream.
    """

    default_capture_stream: Optional[torch.Stream] = None

    def __init__(self, vnpu_graph, pool: Optional[tuple[int, int]] = None, stream: Optional[torch.Stream] = None,
                 capture_error_mode: str = "global") -> None:
        from .streams import Stream, stream as stream_context

        if stream is None and graph.default_capture_stream is None:
            graph.default_capture_stream = Stream()
        self.capture_stream = stream if stream is not None else graph.default_capture_stream
        self.stream_ctx = stream_context(self.capture_stream)
        self.vnpu_graph = vnpu_graph
        self.pool = pool
        self.capture_error_mode = capture_error_mode

    def __enter__(self) -> None:
        from . import synchronize
        from .memory import empty_cache

        synchronize()
        if torch.compiler.config.force_cudagraph_gc:
            gc.collect()
        empty_cache()
        _C._host_empty_cache()
        self.stream_ctx.__enter__()
        try:
            if isinstance(self.vnpu_graph, torch.accelerator.Graph):  # takes its settings as attributes
                self.vnpu_graph.graph_pool = self.pool
                self.vnpu_graph.capture_error_mode = self.capture_error_mode
                self.vnpu_graph.capture_begin()
            else:
                self.vnpu_graph.capture_begin(pool=self.pool, capture_error_mode=self.capture_error_mode)
        except BaseException:
            self.stream_ctx.__exit__(None, None, None)
            raise

    def __exit__(self, exc_type, exc, tb) -> None:
        try:
            if exc_type is None:
                self.vnpu_graph.capture_end()
            else:
                # The exception in flight (e.g. "operation not permitted when stream is capturing") says why the
                # capture failed; ending it still runs, so that the stream stops capturing, but its own error
                # ("invalidated by an earlier call") would only hide the first one.
                try:
                    self.vnpu_graph.capture_end()
                except RuntimeError:
                    pass
        finally:
            self.stream_ctx.__exit__(exc_type, exc, tb)


def make_graphed_callables(callables, sample_args, num_warmup_iters: int = 3, allow_unused_input: bool = False,
                           pool: Optional[tuple[int, int]] = None):
    """``torch.cuda.make_graphed_callables`` on vnpu: graphed versions of functions or ``nn.Module`` objects whose
    forward and backward each replay one captured graph inside one autograd node.

    Arguments and constraints are those of ``torch.cuda.make_graphed_callables``: ``callables`` is one callable or
    a tuple (then ``sample_args`` is a tuple of argument tuples, and the callables must later run in that order, as they share
    one memory pool); ``sample_args`` hold only tensors, with the ``requires_grad`` of the real inputs; modules must
    have no hooks and no buffers requiring grad; a module's graph runs only in the training mode it was captured in
    (else its original forward). Returns the graphed callable(s) (modules are returned with ``forward`` replaced).
    Raises RuntimeError with autocast caching enabled, AssertionError on the constraints above (as CUDA's).
    """
    from torch.utils import _pytree as pytree

    from . import synchronize
    from .streams import Stream, stream as stream_context

    if torch.is_autocast_enabled() and torch.is_autocast_cache_enabled():
        raise RuntimeError("make_graphed_callables does not support the autocast caching. Please set "
                           "`cache_enabled=False`.")
    single = not isinstance(callables, tuple)
    if single:
        callables, sample_args = (callables,), (sample_args,)
    n = len(callables)
    flat_args, params = [], []
    for c, args in zip(callables, sample_args):
        if isinstance(c, torch.nn.Module):
            if c._backward_hooks or c._forward_hooks or c._forward_pre_hooks:
                raise AssertionError("Modules must not have hooks registered at the time they are passed. However, "
                                     "registering hooks on modules after passing them through make_graphed_callables "
                                     "is allowed.")
            if any(b.requires_grad for b in c.buffers()):
                raise AssertionError("In any nn.Module passed to make_graphed_callables, only parameters may be "
                                     "trainable. All buffers must have requires_grad=False.")
        leaves = tuple(pytree.arg_tree_leaves(*args))
        if not all(isinstance(a, torch.Tensor) for a in leaves):
            raise AssertionError("sample_args for each callable must contain only Tensors. Other types are not "
                                 "allowed.")
        flat_args.append(leaves)
        params.append(tuple(c.parameters()) if isinstance(c, torch.nn.Module) else ())
    surfaces = [flat_args[i] + params[i] for i in range(n)]

    def grads_of(outputs, inputs, grad_outputs):
        return torch.autograd.grad(outputs=outputs, inputs=inputs, grad_outputs=grad_outputs, only_inputs=True,
                                   allow_unused=allow_unused_input)

    # Warm-up on a side stream keeps lazy initialisation out of the captures. The captures use the same stream:
    # autograd nodes made during the warm-up (a parameter's AccumulateGrad) remember their stream, and one stream
    # keeps the backward's capture free of forks.
    side = Stream()
    synchronize()
    with stream_context(side):
        for c, args, surface in zip(callables, sample_args, surfaces):
            for _ in range(num_warmup_iters):
                outs = tuple(o for o in pytree.tree_leaves(c(*args)) if o.requires_grad)
                if outs:
                    grads_of(outs, tuple(i for i in surface if i.requires_grad),
                             tuple(torch.empty_like(o) for o in outs))
    synchronize()

    mempool = graph_pool_handle() if pool is None else pool
    fwd_graphs = [VNPUGraph() for _ in range(n)]
    bwd_graphs = [VNPUGraph() for _ in range(n)]
    static_outs, specs = [], []
    for c, args, g in zip(callables, sample_args, fwd_graphs):  # forwards in run order
        with graph(g, pool=mempool, stream=side):
            out = c(*args)
        flat, spec = pytree.tree_flatten(out)
        static_outs.append(tuple(flat))
        specs.append(spec)
    static_grad_outs, static_grad_ins = [None] * n, [None] * n
    for i in reversed(range(n)):  # backwards in the reverse order, as they will run
        grad_outs = tuple(torch.empty_like(o) if o.requires_grad else None for o in static_outs[i])
        needed = tuple(o for o in static_outs[i] if o.requires_grad)
        grads = None
        if needed:
            with graph(bwd_graphs[i], pool=mempool, stream=side):
                grads = grads_of(needed, tuple(x for x in surfaces[i] if x.requires_grad),
                                 tuple(g for g in grad_outs if g is not None))
        it = iter(grads or ())
        static_grad_ins[i] = tuple(next(it) if (x.requires_grad and grads is not None) else None for x in surfaces[i])
        static_grad_outs[i] = grad_outs

    def graphed_function(i):
        fwd, bwd, surface = fwd_graphs[i], bwd_graphs[i], surfaces[i]
        n_user, outs, grad_outs, grad_ins = len(flat_args[i]), static_outs[i], static_grad_outs[i], static_grad_ins[i]

        class Graphed(torch.autograd.Function):
            @staticmethod
            def forward(ctx, *inputs):
                for k in range(n_user):  # the user's tensors into the captured inputs (module parameters are in place)
                    if surface[k].data_ptr() != inputs[k].data_ptr():
                        surface[k].copy_(inputs[k])
                fwd.replay()
                return tuple(o.detach() for o in outs)

            @staticmethod
            @torch.autograd.function.once_differentiable
            def backward(ctx, *grads):
                for static, grad in zip(grad_outs, grads):
                    if static is not None and grad is not None and static.data_ptr() != grad.data_ptr():
                        static.copy_(grad)
                bwd.replay()
                return tuple(b.detach() if b is not None else None for b in grad_ins)

        def run(*user_args):
            out = Graphed.apply(*(tuple(pytree.arg_tree_leaves(*user_args)) + params[i]))
            return pytree.tree_unflatten(out, specs[i])

        return run

    result = []
    for i, c in enumerate(callables):
        run = graphed_function(i)
        if isinstance(c, torch.nn.Module):
            def forward(*args, _module=c, _training=c.training, _run=run, _orig=c.forward, **kwargs):
                return _run(*args, **kwargs) if _module.training == _training else _orig(*args, **kwargs)

            c.forward = forward
            result.append(c)
        else:
            result.append(run)
    return result[0] if single else tuple(result)
