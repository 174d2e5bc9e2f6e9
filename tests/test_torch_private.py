"""hf_specdec/torch_private.py: one test per entry, failing with the entry's name when the installed torch changes
what the entry relies on; plus the guard that no torch private op is named outside torch_private.py."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

from hf_specdec import torch_private

ROOT = Path(__file__).resolve().parents[1]
PRIVATE = re.compile(r"torch\.ops\.(mkldnn|mkl)\.")


def _entry(name: str) -> str:
    return f"torch_private entry {name!r} no longer matches the installed torch"


def test_every_entry_has_a_test():
    tests = {name[len("test_") :] for name in globals() if name.startswith("test_")}
    assert set(torch_private.ENTRIES) <= tests


@pytest.mark.skipif(not torch.backends.mkldnn.is_available(), reason="this torch build has no oneDNN")
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_mkldnn_linear(dtype):
    assert torch_private.mkldnn_linear_available(), _entry("mkldnn_linear")
    reorder = str(torch.ops.mkldnn._reorder_linear_weight.default._schema)
    linear = str(torch.ops.mkldnn._linear_pointwise.default._schema)
    assert reorder == torch_private.REORDER_SCHEMA, _entry("mkldnn_linear") + f": {reorder}"
    assert linear == torch_private.LINEAR_SCHEMA, _entry("mkldnn_linear") + f": {linear}"
    g = torch.Generator().manual_seed(0)
    weight, bias = torch.randn(24, 16, generator=g).to(dtype), torch.randn(24, generator=g).to(dtype)
    packed = torch_private.pack_linear_weight(weight)
    assert packed.shape == weight.shape and packed.dtype == dtype, _entry("mkldnn_linear")
    assert torch.equal(torch_private.unpack_linear_weight(packed), weight), _entry("mkldnn_linear")
    for shape in [(1, 16), (3, 16), (2, 5, 16)]:
        x = torch.randn(*shape, generator=g).to(dtype)
        got = torch_private.packed_linear(x, packed, bias)
        want = F.linear(x.float(), weight.float(), bias.float())
        tol = 1e-5 if dtype == torch.float32 else 5e-2
        assert got.shape == want.shape and torch.allclose(got.float(), want, atol=tol, rtol=tol), _entry(
            "mkldnn_linear"
        )


def test_no_private_torch_op_outside_torch_private():
    offenders = []
    for folder in ("hf_specdec", "modeling", "trainers"):
        for path in (ROOT / folder).rglob("*.py"):
            if path.name != "torch_private.py" and PRIVATE.search(path.read_text()):
                offenders.append(str(path.relative_to(ROOT)))
    assert not offenders, f"torch private ops named outside hf_specdec/torch_private.py: {offenders}"
