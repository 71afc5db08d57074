"""Lazy registration of torch.compile for vnpu (imported at ``import torch``; imports nothing heavy).

* Dynamo: a one-shot import hook runs :func:`torch_vnpu._inductor.register_dynamo`
  right after ``torch._dynamo.device_interface`` has been executed (or at once,
  if it already was).
* Inductor: right after ``torch._inductor.codegen.common`` has been executed,
  its ``init_backend_registration`` (which every compilation calls first) is
  wrapped so that it runs :func:`torch_vnpu._inductor.register_inductor` before
  registering the built-in backends. Registering then, rather than through
  Inductor's PrivateUse1 discovery of ``torch.vnpu.Scheduling`` & co. (which
  ``torch.vnpu`` also answers, for a ``torch_vnpu`` imported after Inductor),
  keeps vnpu's cache-key pass: the discovery re-registers without one.
* fake convolutions: right after ``torch._subclasses.fake_impls`` has been
  executed (``import torch`` does), vnpu convolutions get CPU's output memory
  format (:mod:`.fake_conv`).
* graph trees: right after ``torch._inductor.cudagraph_trees`` has been executed (``mode="reduce-overhead"``
  or ``torch.compiler.cudagraph_mark_step_begin()`` imports it), its code runs again with CUDA's names
  answered by vnpu (:mod:`.graph_trees`), before anyone used its state.
* compiled optimizers: right after ``torch._dynamo.variables.optimizer`` has been executed, Dynamo makes a
  compiled vnpu optimizer step capturable, as for CUDA (:func:`.graph_trees.apply_optimizer`).
* flex_attention: right after ``torch.nn.attention.flex_attention`` has been
  executed, it accepts vnpu tensors (:mod:`.flex_attention`).
"""

from __future__ import annotations

import sys
from types import ModuleType

from .._import_hooks import run_hook, when_imported

_DYNAMO_MODULE = "torch._dynamo.device_interface"
_INDUCTOR_MODULE = "torch._inductor.codegen.common"
_FLEX_ATTENTION_MODULE = "torch.nn.attention.flex_attention"
_FAKE_IMPLS_MODULE = "torch._subclasses.fake_impls"
_GRAPH_TREES_MODULE = "torch._inductor.cudagraph_trees"
_DYNAMO_OPTIMIZER_MODULE = "torch._dynamo.variables.optimizer"


def _register_dynamo(_module: ModuleType) -> None:
    from . import register_dynamo

    register_dynamo()


def _patch_flex_attention(module: ModuleType) -> None:
    from .flex_attention import patch_validate_device

    patch_validate_device(module)


def _patch_fake_conv(module: ModuleType) -> None:
    from .fake_conv import patch

    patch(module)


def _retarget_graph_trees(_module: ModuleType) -> None:
    from . import graph_trees

    graph_trees.apply()


def _capturable_optimizers(module: ModuleType) -> None:
    from . import graph_trees

    graph_trees.apply_optimizer(module)


def _hook_inductor(common: ModuleType) -> None:
    original = common.init_backend_registration
    if getattr(original, "_vnpu_original", None) is not None:
        return

    def init_backend_registration() -> None:
        from . import register_inductor

        register_inductor()
        original()

    init_backend_registration._vnpu_original = original  # type: ignore[attr-defined]
    init_backend_registration.__doc__ = original.__doc__
    # graph.py, compile_fx.py and codecache.py bind the name when they are imported, i.e. after this.
    from ..patches import replace

    replace(common, "init_backend_registration", init_backend_registration, "inductor.lazy-registration")


def install() -> None:
    """Installs the lazy registration (idempotent)."""
    when_imported(_DYNAMO_MODULE, _register_dynamo)
    when_imported(_FLEX_ATTENTION_MODULE, _patch_flex_attention)
    when_imported(_FAKE_IMPLS_MODULE, _patch_fake_conv)
    when_imported(_GRAPH_TREES_MODULE, _retarget_graph_trees)
    when_imported(_DYNAMO_OPTIMIZER_MODULE, _capturable_optimizers)
    if _INDUCTOR_MODULE in sys.modules:
        # torch_vnpu imported after Inductor (TORCH_DEVICE_BACKEND_AUTOLOAD=0): Inductor may already have
        # registered its backends, so register now; Inductor's modules are all importable at this point.
        from . import register_inductor

        run_hook(lambda _module: register_inductor(), sys.modules[_INDUCTOR_MODULE])
    when_imported(_INDUCTOR_MODULE, _hook_inductor)
