"""Every torch name hf_specdec uses that is not public API, in one place.

``tests/test_torch_private.py`` checks each entry against the installed torch and fails naming the entry when it
changes. Entries (:data:`ENTRIES`):

- ``mkldnn_linear``: oneDNN's prepacked linear, the pair of ops that inductor's CPU weight prepacking
  (``torch/_inductor/fx_passes/mkldnn_fusion.py``) and Intel's extension for PyTorch use:
  ``torch.ops.mkldnn._reorder_linear_weight(weight, batch_size=None)`` reorders an ``(out, in)`` weight into
  oneDNN's blocked layout (an opaque ``torch._mkldnn`` tensor of the same shape and size, ``to_dense()`` gives it
  back exactly), and ``torch.ops.mkldnn._linear_pointwise(x, packed, bias, "none", [], "")`` computes
  ``F.linear(x, weight, bias)`` from it. The op has no autograd kernel: callers use it without gradients only.
  ``torch.ops.mkldnn._is_mkldnn_bf16_supported()`` tells whether the CPU has oneDNN's bf16 kernels.
"""

from __future__ import annotations

import torch

ENTRIES = ("mkldnn_linear",)

# the schemas the two ops had when this module was written; tests/test_torch_private.py compares them
REORDER_SCHEMA = "mkldnn::_reorder_linear_weight(Tensor self, int? batch_size=None) -> Tensor Y"
LINEAR_SCHEMA = (
    "mkldnn::_linear_pointwise(Tensor X, Tensor W, Tensor? B, str attr, Scalar?[] scalars, str? algorithm) "
    "-> Tensor Y"
)


def mkldnn_linear_available() -> bool:
    """Whether this torch build has oneDNN on the CPU and both ops of the ``mkldnn_linear`` entry."""
    if not torch.backends.mkldnn.is_available():
        return False
    ops = torch.ops.mkldnn
    return hasattr(ops, "_reorder_linear_weight") and hasattr(ops, "_linear_pointwise")


def mkldnn_bf16_available() -> bool:
    """Whether oneDNN runs bf16 on this CPU (entry ``mkldnn_linear``)."""
    return bool(torch.ops.mkldnn._is_mkldnn_bf16_supported())


def pack_linear_weight(weight: torch.Tensor) -> torch.Tensor:
    """``weight`` ``(out, in)`` in oneDNN's blocked layout (entry ``mkldnn_linear``)."""
    return torch.ops.mkldnn._reorder_linear_weight(weight.detach().contiguous())


def packed_linear(x: torch.Tensor, packed: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
    """``F.linear(x, weight, bias)`` with ``packed = pack_linear_weight(weight)`` (entry ``mkldnn_linear``)."""
    return torch.ops.mkldnn._linear_pointwise(x, packed, bias, "none", [], "")


def unpack_linear_weight(packed: torch.Tensor) -> torch.Tensor:
    """The dense ``(out, in)`` weight back from :func:`pack_linear_weight` (bit for bit)."""
    return packed.to_dense()
