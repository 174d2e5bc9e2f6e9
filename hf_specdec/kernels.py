"""CPU kernels that make a verification forward cost what the machine allows: ``apply_kernels(model)``.

Speculative decoding pays when a forward over ``q`` tokens costs about one forward over one token (the cost curve
``c(q)``, ``core/verify_cost.py``). On x86 CPUs PyTorch's default linear layer calls a BLAS ``gemm`` that is tuned
for large matrices: in fp32 a 2-row product can cost twice a 1-row one, so ``c(2)`` is far above 1 and drafting
does not pay. oneDNN's linear on a weight reordered once into its blocked layout (what inductor's CPU weight
prepacking and Intel's extension for PyTorch run) costs nearly the same for 1 to 16 rows; on AMD's Zen 4 / 5 it is
faster at 1 row too, on an Intel Xeon with AMX only for the LM head (a small layer pays oneDNN's fixed cost per call). :func:`apply_kernels` swaps a model's ``nn.Linear`` layers for :class:`PackedLinear` layers in place::

    model = AutoModelForCausalLM.from_pretrained(...)
    report = hf_specdec.apply_kernels(model)          # and apply_kernels(drafter) for a GLIDE / EDD drafter
    print(report)                                     # what was packed, and the timings that decided it
    model.generate(...)                               # plain generate and every method now run the same kernels

Each distinct layer shape is timed both ways at the verification sizes :data:`ROWS` on the machine at hand and
packed only where oneDNN is faster in sum and no slower at one row, so plain decoding never slows down; where it is nowhere faster (or the model is not on the CPU, or torch has
no oneDNN) nothing changes and the report says why. Packing replaces each weight by its reordered copy one layer
at a time, so no second copy of the model is ever held; a weight that another module shares (a tied LM head, whose
matrix is also the input embedding) keeps its dense tensor for the other user and adds its packed copy. The packed
layers are for inference: a forward that needs gradients is refused, ``state_dict`` / ``save_pretrained`` write the
dense weights, and :func:`restore_kernels` puts ``nn.Linear`` layers back. The oneDNN ops are torch's private
names, kept in ``torch_private.py``. A model with grouped key/value heads also gets ``grouped_attention.py``."""

from __future__ import annotations

import copy
import logging
from collections import Counter

import torch
from torch import nn

from .errors import SpecDecError
from .grouped_attention import restore_attention, unavailable, use_grouped_attention
from .kernel_timing import ROWS, KernelReport, ShapeTiming, time_shape
from .torch_private import (
    mkldnn_bf16_available,
    mkldnn_linear_available,
    pack_linear_weight,
    packed_linear,
    unpack_linear_weight,
)

logger = logging.getLogger(__name__)

KERNELS = ("stock", "onednn")  # what --kernels takes: PyTorch's default linear, oneDNN's prepacked one
_ATTR = "_hf_specdec_kernels"
GROUPED_ONLY = "grouped-attention"  # kernels_of a model whose attention alone was switched
_SHAPES = "_hf_specdec_packed_shapes"


def kernels_of(model: nn.Module) -> str:
    """What :func:`apply_kernels` left ``model`` on: ``"onednn"``, :data:`GROUPED_ONLY` or ``"stock"``."""
    return model.__dict__.get(_ATTR, "stock")


class PackedLinear(nn.Module):
    """``nn.Linear`` on a weight in oneDNN's blocked layout (``torch_private.pack_linear_weight``).

    ``shared``: the dense weight, kept when another module uses the same matrix (a tied LM head); otherwise the
    only copy of the weight is the packed one and :attr:`weight` unpacks it on demand."""

    def __init__(self, linear: nn.Linear, shared: bool = False):
        super().__init__()
        self.in_features, self.out_features = linear.in_features, linear.out_features
        self.packed = pack_linear_weight(linear.weight)
        self.bias = linear.bias
        # a plain attribute, not a registered parameter: the module that shares it owns (and converts) it
        self.__dict__["shared"] = linear.weight if shared else None
        self.source = linear.weight.data_ptr()  # the dense matrix packed (a drafter's head: the same?)
        self.trainable = linear.weight.requires_grad  # what restore_kernels gives the dense weight back

    @property
    def weight(self) -> torch.Tensor:
        """The dense ``(out, in)`` weight: the shared tensor, or the packed one unpacked (a new tensor)."""
        if self.shared is not None:
            return self.shared
        return unpack_linear_weight(self.packed)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if x.requires_grad and torch.is_grad_enabled():
            raise SpecDecError(
                "hf_specdec's packed CPU kernels are for inference (no gradients): run the model under "
                "torch.no_grad() (generate does), or call hf_specdec.restore_kernels(model) before training"
            )
        return packed_linear(x, self.packed, self.bias)

    def _apply(self, fn, recurse: bool = True):
        dense = fn(unpack_linear_weight(self.packed))
        if dense.device.type != "cpu":
            raise SpecDecError(
                f"packed CPU kernels cannot move to {dense.device}: call hf_specdec.restore_kernels(model) first"
            )
        self.packed = pack_linear_weight(dense)
        return super()._apply(fn, recurse)

    def _save_to_state_dict(self, destination, prefix, keep_vars):
        super()._save_to_state_dict(destination, prefix, keep_vars)
        weight = self.weight
        destination[prefix + "weight"] = weight if keep_vars else weight.detach()

    def _load_from_state_dict(
        self, state_dict, prefix, local_metadata, strict, missing_keys, *args, **kwargs
    ):
        weight = state_dict.pop(prefix + "weight", None)
        if weight is None and self.shared is not None:
            weight = self.shared  # a checkpoint without a tied head's copy: the matrix the other module loads
        elif weight is None:
            missing_keys.append(prefix + "weight")
        if weight is not None:
            self.packed = pack_linear_weight(weight.detach().to(self.packed.dtype))
        super()._load_from_state_dict(
            state_dict, prefix, local_metadata, strict, missing_keys, *args, **kwargs
        )

    def __deepcopy__(self, memo):
        """A copy with its own packed weight (an opaque oneDNN tensor has no storage to copy)."""
        clone = copy.copy(self)
        clone.__dict__ = {k: v for k, v in self.__dict__.items() if k != "packed"}
        for name in ("_parameters", "_buffers", "_modules"):
            clone.__dict__[name] = copy.deepcopy(self.__dict__[name], memo)
        if self.shared is not None:
            clone.__dict__["shared"] = copy.deepcopy(self.shared, memo)
        clone.packed = pack_linear_weight(unpack_linear_weight(self.packed))
        return clone

    def to_linear(self) -> nn.Linear:
        """An ``nn.Linear`` with this layer's dense weight (the shared tensor itself, if any) and bias."""
        linear = nn.Linear(self.in_features, self.out_features, bias=self.bias is not None, device="meta")
        weight = self.shared if self.shared is not None else self.weight
        if not isinstance(weight, nn.Parameter):
            weight = nn.Parameter(weight, requires_grad=self.trainable)
        linear.weight = weight
        linear.bias = self.bias
        return linear

    def extra_repr(self) -> str:
        return (
            f"in_features={self.in_features}, out_features={self.out_features}, bias={self.bias is not None}"
        )


def _unavailable(model: nn.Module) -> str:
    """Why oneDNN kernels cannot run ``model`` here ("" if they can)."""
    params = list(model.parameters())
    if not params:
        return "the model has no parameters"
    device, dtype = params[0].device, params[0].dtype
    if device.type != "cpu":
        return f"the model is on {device}; the packed kernels are for the CPU"
    if dtype not in (torch.float32, torch.bfloat16):
        return f"{dtype} is not packed (fp32 and bf16 are)"
    if not mkldnn_linear_available():
        return "this torch build has no oneDNN linear"
    if dtype == torch.bfloat16 and not mkldnn_bf16_available():
        return "oneDNN has no bf16 kernels for this CPU"
    return ""


@torch.no_grad()
def apply_kernels(
    model: nn.Module, kernels: str = "onednn", rows=ROWS, repeats: int = 5, measure: bool = True
) -> KernelReport:
    """Run ``model``'s linear layers on ``kernels`` (:data:`KERNELS`), in place; returns what was done.

    ``"onednn"``: every ``nn.Linear`` whose shape runs faster packed on this machine (timed at ``rows``, the sum
    decides; ``measure=False`` packs every shape untimed) becomes a :class:`PackedLinear`; an hf_specdec drafter's
    LM head (the target's matrix, or its draft vocabulary's rows) is packed the same way. ``"stock"``:
    :func:`restore_kernels`. Layers packed already stay as they are (and count as packed in the report)."""
    if kernels not in KERNELS:
        raise SpecDecError(f"kernels={kernels!r}: expected one of {', '.join(KERNELS)}")
    if kernels == "stock":
        restore_kernels(model)
        return KernelReport("stock")
    reason = _unavailable(model)
    if reason:
        logger.warning("hf_specdec.apply_kernels: nothing changed: %s", reason)
        return KernelReport("stock", reason)
    linears = {name: _shape(m) for name, m in model.named_modules() if type(m) is nn.Linear}
    already = sum(isinstance(m, PackedLinear) for m in model.modules())
    head = _drafter_head(model)
    # data_ptr -> parameters on it: a weight with more than one user is shared
    uses = Counter(p.data_ptr() for _, p in model.named_parameters(remove_duplicate=False))
    shapes: dict[tuple, list[str]] = {}  # names only: no reference keeps a replaced layer alive
    for name, shape in linears.items():
        shapes.setdefault(shape, []).append(name)
    if head is not None:
        shapes.setdefault((head.shape[1], head.shape[0], False), [])
    total = len(linears) + (head is not None) + already
    report = KernelReport("onednn", packed_layers=already, linear_layers=total)
    packed_shapes = set()
    for (n_in, n_out, has_bias), names in shapes.items():
        if measure:
            first = model.get_submodule(names[0]) if names else None
            weight = head if first is None else first.weight.detach()
            bias = first.bias.detach() if first is not None and has_bias else None
            stock, onednn = time_shape(weight, bias, rows, repeats)
            del first, weight, bias
        else:
            stock, onednn = {r: 1.0 for r in rows}, {r: 0.0 for r in rows}
        count = len(names) + (head is not None and (n_in, n_out) == (head.shape[1], head.shape[0]))
        timing = ShapeTiming((n_in, n_out), count, stock, onednn)
        report.shapes.append(timing)
        if timing.packed:
            packed_shapes.add((n_in, n_out, has_bias))
    for name, shape in linears.items():
        if shape not in packed_shapes:
            continue
        linear = model.get_submodule(name)
        shared = uses.get(linear.weight.data_ptr(), 0) > 1
        model.set_submodule(name, PackedLinear(linear, shared=shared))
        report.packed_layers += 1
        report.extra_bytes += linear.weight.numel() * linear.weight.element_size() if shared else 0
        del linear  # the dense weight is freed here unless another module shares it
    if head is not None and (head.shape[1], head.shape[0], False) in packed_shapes:
        report.extra_bytes += _pack_drafter_head(model, head)
        report.packed_layers += 1
    grouped = use_grouped_attention(model)
    report.attention = "grouped key/value heads under masks" if grouped else unavailable(model)
    if report.packed_layers:
        packed = sorted({_shape(m) for m in model.modules() if isinstance(m, PackedLinear)})
        if isinstance(model.__dict__.get("_head"), PackedLinear):
            packed.append(("head",))
        model.__dict__[_ATTR] = "onednn"
        model.__dict__[_SHAPES] = ";".join("x".join(map(str, s)) for s in packed)
    else:
        report.kernels, report.reason = "stock", "oneDNN was not faster for any layer shape on this machine"
        logger.warning("hf_specdec.apply_kernels: no layer packed: %s", report.reason)
        if grouped:
            model.__dict__[_ATTR] = GROUPED_ONLY
    return report


def _shape(m: nn.Module) -> tuple[int, int, bool]:
    return m.in_features, m.out_features, m.bias is not None


def packed_shapes(model: nn.Module) -> str:
    """The shapes :func:`apply_kernels` packed in ``model`` (``""`` on stock kernels): part of a stored cost's key."""
    return model.__dict__.get(_SHAPES, "")


def _drafter_head(model: nn.Module) -> torch.Tensor | None:
    """An attached hf_specdec drafter's dense LM head (``modeling/attached.py``'s ``_head``), else ``None``."""
    if not hasattr(model, "attach_target") or not hasattr(model, "draft_logits"):
        return None
    head = model.__dict__.get("_head")
    return head if isinstance(head, torch.Tensor) else None


def _pack_drafter_head(model: nn.Module, head: torch.Tensor) -> int:
    """Replace a drafter's dense head by a packed one (the target's own packed head when it is the same matrix);
    returns the bytes it adds."""
    target = getattr(model, "target", None)
    target_head = target.get_output_embeddings() if target is not None else None
    if isinstance(target_head, PackedLinear) and target_head.source == head.data_ptr():
        model.__dict__["_head"] = target_head
        return 0
    linear = nn.Linear(head.shape[1], head.shape[0], bias=False, device="meta")
    linear.weight = nn.Parameter(head, requires_grad=False)
    is_target_matrix = isinstance(target_head, nn.Linear) and target_head.weight.data_ptr() == head.data_ptr()
    model.__dict__["_head"] = PackedLinear(linear, shared=is_target_matrix)
    return head.numel() * head.element_size() if is_target_matrix else 0


def restore_kernels(model: nn.Module) -> nn.Module:
    """Put ``nn.Linear`` layers back for every :class:`PackedLinear` of ``model`` (and a drafter's packed head)."""
    for name, m in list(model.named_modules()):
        if isinstance(m, PackedLinear):
            model.set_submodule(name, m.to_linear())
    head = model.__dict__.get("_head")
    if isinstance(head, PackedLinear):
        model.__dict__["_head"] = head.weight
    restore_attention(model)
    model.__dict__.pop(_ATTR, None)
    model.__dict__.pop(_SHAPES, None)
    return model
