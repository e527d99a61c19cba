"""Exporting a model that holds inference collections: ``torch.export`` and AOTInductor packages.

The table ops are ``torch.library`` ops with fake kernels, so a model calling
:meth:`~dynamicemb_core.inference.InferenceEmbeddingBagCollection.lookup` traces like any other; the
batch's sizes (ids and samples) are exported as dynamic dimensions.

Freshness: an AOTInductor package embeds a copy of every buffer by default. :func:`attach` points the
loaded package at the live module's parameters and buffers instead (``load_constants`` with
``user_managed=True``: the package keeps the tensors' addresses, not copies), so a
:meth:`replay` into the module, which writes those buffers in place, is what the package reads on
its next call. The module must stay alive, on the package's device, while the package serves.
"""

from __future__ import annotations

from typing import Any, Dict, Optional, Sequence, Tuple

import torch
from torch import Tensor, nn

__all__ = ["LookupModule", "attach", "compile_package", "export_model"]


class LookupModule(nn.Module):
    """Tensors in, tensor out: the exportable face of one inference collection.

    ``forward(values, offsets[, per_sample_weights])`` is the collection's ``lookup``: the KJT's
    values and offsets (features in ``collection.feature_names`` order). A package of it takes plain
    tensors, so serving it needs neither TorchRec nor this package's training code.
    """

    def __init__(self, collection: nn.Module) -> None:
        super().__init__()
        self.collection = collection

    def forward(
        self, values: Tensor, offsets: Tensor, per_sample_weights: Optional[Tensor] = None
    ) -> Tensor:
        collection: Any = self.collection
        return collection.lookup(values, offsets, per_sample_weights)


def export_model(model: nn.Module, args: Tuple[Any, ...]) -> torch.export.ExportedProgram:
    """``torch.export.export`` with every tensor argument's first dimension dynamic.

    Args:
        model: a module whose forward takes tensors (ids, offsets, dense inputs...).
        args: an example batch; its sizes are not baked in.
    """
    dims = tuple({0: torch.export.Dim.AUTO} if isinstance(a, Tensor) else None for a in args)
    with torch.no_grad():
        return torch.export.export(model.eval(), args, dynamic_shapes=dims)


def compile_package(
    program: torch.export.ExportedProgram,
    path: str,
    *,
    fast_compile: bool = False,
    embed_constants: bool = True,
) -> str:
    """AOTInductor-compile an exported program into a ``.pt2`` package at ``path``.

    Where the C++ toolchain links libstdc++ statically into shared objects (the lent GPU machine),
    the package is linked against the process's shared libstdc++ instead
    (:mod:`dynamicemb_core.inference.toolchain` says why); elsewhere the toolchain is used as is.

    Args:
        fast_compile: build the wrapper at -O0 (what the tests use; the kernels that matter are the
            table ops, compiled already).
        embed_constants: store a copy of every parameter and buffer in the package (a package
            that serves on its own). False leaves them out: the loaded package must then be given
            the live tensors with :func:`attach` before its first call. That is what a server
            holding the module does anyway, and it keeps multi-GB tables out of the compile.
    """
    from dynamicemb_core.inference.toolchain import inductor_configs

    configs: Dict[str, Any] = dict(inductor_configs())
    if fast_compile and hasattr(torch._inductor.config.aot_inductor, "compile_wrapper_opt_level"):
        configs["aot_inductor.compile_wrapper_opt_level"] = "O0"
    if not embed_constants:
        if not hasattr(torch._inductor.config.aot_inductor, "package_constants_in_so"):
            raise ValueError(
                f"compile_package: embed_constants=False needs torch's "
                f"aot_inductor.package_constants_in_so option, which torch {torch.__version__} "
                "lacks"
            )
        configs["aot_inductor.package_constants_in_so"] = False
    return torch._inductor.aoti_compile_and_package(
        program, package_path=path, inductor_configs=configs
    )


def attach(compiled: Any, model: nn.Module, prefixes: Sequence[str] = ("",)) -> int:
    """Make a loaded package read ``model``'s live parameters and buffers (no copies).

    Args:
        compiled: what ``torch._inductor.aoti_load_package`` returned.
        model: the module the program was exported from (or one with the same names and shapes,
            e.g. rebuilt from the same dump).
        prefixes: name prefixes to try when the package's names carry a wrapper's prefix.

    Returns:
        How many constants now point at ``model``'s tensors.

    Raises:
        ValueError: a constant of the package has no tensor of that name in ``model``.
    """
    tensors: Dict[str, Tensor] = dict(model.named_parameters())
    tensors.update(dict(model.named_buffers()))
    wanted = list(compiled.get_constant_fqns())
    mapping = {}
    for fqn in wanted:
        for prefix in prefixes:
            name = fqn[len(prefix) :] if fqn.startswith(prefix) else None
            if name is not None and name in tensors:
                mapping[fqn] = tensors[name].detach()
                break
    missing = [f for f in wanted if f not in mapping]
    if missing:
        raise ValueError(f"attach: the model has no tensor for package constants {missing}")
    compiled.load_constants(mapping, check_full_update=True, user_managed=True)
    return len(mapping)
