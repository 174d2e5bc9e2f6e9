"""hf_specdec.apply_kernels (hf_specdec/kernels.py): oneDNN's prepacked linear layers change no output, keep no
second copy of a weight, save what the user saves, and every method stays token-identical to plain generate of the
packed model."""

from __future__ import annotations

import pytest
import torch
from hf_specdec.modeling import GlideConfig, GlideForCausalLM
from torch import nn
from transformers import AutoModelForCausalLM

import hf_specdec
from hf_specdec.core.verify_cost import measured_cost
from hf_specdec.errors import SpecDecError
from hf_specdec.kernels import PackedLinear, kernels_of

from .conftest import tiny_llama

pytestmark = pytest.mark.skipif(
    not torch.backends.mkldnn.is_available(), reason="this torch build has no oneDNN"
)


def _prompt(seed: int = 0, n: int = 6) -> torch.Tensor:
    return torch.randint(3, 97, (1, n), generator=torch.Generator().manual_seed(seed))


def _glide(target) -> GlideForCausalLM:
    torch.manual_seed(0)
    d = GlideForCausalLM(GlideConfig.for_target(target)).attach_target(target).eval()
    d.init_from_target(target)
    for layer in d.layers:
        if hasattr(layer, "cross_attn"):
            nn.init.normal_(layer.cross_attn.o_proj.weight, std=0.05)
    return d


def test_packed_layers_give_the_same_logits_and_restore_exactly():
    model = tiny_llama().eval()
    dense = {k: v.clone() for k, v in model.state_dict().items()}
    x = _prompt(n=9)
    with torch.no_grad():
        ref = model(x).logits
    report = hf_specdec.apply_kernels(model, measure=False)
    n_linear = sum(isinstance(m, PackedLinear) for m in model.modules())
    assert report.kernels == "onednn" and report.packed_layers == n_linear == report.linear_layers > 0
    assert kernels_of(model) == "onednn" and not any(type(m) is nn.Linear for m in model.modules())
    with torch.no_grad():
        got = model(x).logits
    assert torch.allclose(got, ref, atol=1e-5) and torch.equal(got.argmax(-1), ref.argmax(-1))
    assert set(model.state_dict()) == set(dense)  # state_dict writes the dense weights, under the same names
    assert all(torch.equal(model.state_dict()[k], v) for k, v in dense.items())
    hf_specdec.restore_kernels(model)
    assert kernels_of(model) == "stock" and not any(isinstance(m, PackedLinear) for m in model.modules())
    assert all(torch.equal(model.state_dict()[k], v) for k, v in dense.items())


def test_a_tied_head_keeps_one_dense_matrix_and_saves_round_trip(tmp_path):
    model = tiny_llama(tie_word_embeddings=True).eval()
    assert model.lm_head.weight is model.get_input_embeddings().weight
    x = _prompt(n=7)
    with torch.no_grad():
        ref = model(x).logits
    report = hf_specdec.apply_kernels(model, measure=False)
    head = model.get_output_embeddings()
    assert isinstance(head, PackedLinear) and head.weight is model.get_input_embeddings().weight
    assert (
        report.extra_bytes == head.weight.numel() * head.weight.element_size()
    )  # only the shared head's copy
    model.save_pretrained(tmp_path)
    loaded = AutoModelForCausalLM.from_pretrained(tmp_path).eval()
    with torch.no_grad():
        assert torch.allclose(loaded(x).logits, ref, atol=1e-5)
    hf_specdec.restore_kernels(model)
    assert model.lm_head.weight is model.get_input_embeddings().weight  # tied again


def test_plain_generate_and_every_method_agree_on_the_packed_model():
    target = tiny_llama(tie_word_embeddings=True).eval()
    glide = _glide(target)
    prompts = [_prompt(s, 5 + s) for s in range(2)]
    stock = [target.generate(p, max_new_tokens=20, do_sample=False) for p in prompts]
    hf_specdec.apply_kernels(target, measure=False)
    hf_specdec.apply_kernels(glide, measure=False)
    assert glide.__dict__["_head"] is target.get_output_embeddings()  # the drafter shares the packed head
    for p, s in zip(prompts, stock):
        ref = target.generate(p, max_new_tokens=20, do_sample=False)
        assert torch.equal(ref, s)
        for kw in (
            dict(custom_generate=hf_specdec.pld_plus),
            dict(custom_generate=hf_specdec.glide_cape, drafter=glide, cape_cost=False),
            dict(assistant_model=glide),
        ):
            out = target.generate(p, max_new_tokens=20, do_sample=False, **kw)
            assert torch.equal(out, ref), kw


def test_a_packed_model_refuses_gradients_and_a_move_off_the_cpu():
    model = tiny_llama()
    hf_specdec.apply_kernels(model, measure=False)
    with pytest.raises(SpecDecError, match="restore_kernels"):
        model(_prompt())  # grad mode on and the embedding needs a gradient
    model.to(torch.float32)  # same device: repacked
    with torch.no_grad():
        model(_prompt())


def test_nothing_changes_where_the_kernels_cannot_run():
    model = tiny_llama().to(torch.float16)
    report = hf_specdec.apply_kernels(model)
    assert report.kernels == "stock" and "float16" in report.reason
    assert kernels_of(model) == "stock" and not any(isinstance(m, PackedLinear) for m in model.modules())
    with pytest.raises(SpecDecError, match="stock, onednn"):
        hf_specdec.apply_kernels(model, "mkl")


def test_measured_costs_are_kept_per_kernels():
    model = tiny_llama().eval()
    context = _prompt(n=12)[0]
    stock = measured_cost(model, context)
    hf_specdec.apply_kernels(model, measure=False)
    packed = measured_cost(model, context)
    assert packed is not stock and measured_cost(model, context) is packed
    assert any("onednn kernels" in label for label in hf_specdec.core.verify_cost.cached_curves(model))


def test_the_timed_decision_keeps_a_shape_that_is_not_faster(monkeypatch):
    from hf_specdec import kernels

    monkeypatch.setattr(kernels, "time_shape", lambda *a, **k: ({1: 1.0}, {1: 2.0}))
    model = tiny_llama()
    report = hf_specdec.apply_kernels(model)
    assert report.kernels == "stock" and "not faster" in report.reason and report.packed_layers == 0
    assert not any(isinstance(m, PackedLinear) for m in model.modules())


def test_a_shape_is_packed_only_where_one_row_is_no_slower_and_timed_once_per_process(monkeypatch):
    from hf_specdec import kernel_timing
    from hf_specdec.kernel_timing import ShapeTiming

    faster_in_sum = {1: 1.0, 16: 10.0}
    assert not ShapeTiming(
        (4, 4), 1, faster_in_sum, {1: 1.5, 16: 5.0}
    ).packed  # plain decoding would slow down
    assert ShapeTiming((4, 4), 1, faster_in_sum, {1: 1.01, 16: 5.0}).packed  # within the timing's spread
    assert not ShapeTiming((4, 4), 1, faster_in_sum, {1: 0.9, 16: 11.0}).packed  # slower in sum
    timed = []
    monkeypatch.setattr(kernel_timing, "_TIMED", {})
    monkeypatch.setattr(
        kernel_timing, "_time_shape", lambda w, *a: timed.append(tuple(w.shape)) or ({1: 1.0}, {1: 2.0})
    )
    for _ in range(2):  # a target and a model of the same shapes (SPACE's, a drafter's) decide alike
        hf_specdec.apply_kernels(tiny_llama())
    assert timed and len(timed) == len(set(timed))


@pytest.mark.real
def test_the_default_target_on_packed_kernels_decodes_as_on_stock_ones(real_target):
    import copy

    model, tok = real_target
    packed = copy.deepcopy(model)
    report = hf_specdec.apply_kernels(packed, measure=False)
    assert report.packed_layers == report.linear_layers
    prompt = tok("def fibonacci(n):", return_tensors="pt").input_ids
    ref = model.generate(prompt, max_new_tokens=32, do_sample=False)
    assert torch.equal(packed.generate(prompt, max_new_tokens=32, do_sample=False), ref)
    out = packed.generate(prompt, max_new_tokens=32, do_sample=False, custom_generate=hf_specdec.pld_plus)
    assert torch.equal(out, ref)


def test_copies_restores_and_an_untied_drafter_head():
    import copy

    target = tiny_llama().eval()  # untied head
    target.lm_head.weight.requires_grad_(True)
    glide = _glide(target)
    hf_specdec.apply_kernels(target, measure=False)
    hf_specdec.apply_kernels(glide, measure=False)
    assert glide.__dict__["_head"] is target.get_output_embeddings()  # shared, not a second packed head
    twin = copy.deepcopy(target)
    x = _prompt(n=5)
    with torch.no_grad():
        assert torch.equal(twin(x).logits, target(x).logits)
    hf_specdec.restore_kernels(target)
    assert type(target.lm_head) is nn.Linear and target.lm_head.weight.requires_grad


def test_a_tied_head_loaded_without_its_copy_follows_the_embedding():
    model = tiny_llama(tie_word_embeddings=True).eval()
    hf_specdec.apply_kernels(model, measure=False)
    other = tiny_llama(tie_word_embeddings=True, seed=1).state_dict()
    other.pop("lm_head.weight")  # what save_pretrained writes for a tied head
    model.load_state_dict(other, strict=False)
    x = _prompt(n=5)
    reference = tiny_llama(tie_word_embeddings=True, seed=1).eval()
    with torch.no_grad():
        assert torch.allclose(model(x).logits, reference(x).logits, atol=1e-5)


@pytest.mark.parametrize("tied", [False, True])
def test_the_drafter_cost_prior_reads_packed_layers_as_the_weights_they_pack(tied):
    from hf_specdec.core.draft_budget import drafter_cost_prior, step_bytes

    target = tiny_llama(tie_word_embeddings=tied).eval()
    glide = _glide(target)
    head = target.config.vocab_size * target.config.hidden_size * 4
    layers = sum(
        p.numel() * 4 for n, p in target.named_parameters() if "embed_tokens" not in n and "lm_head" not in n
    )
    assert step_bytes(target) == layers + head  # the head once (tied or not), no embedding table
    stock = drafter_cost_prior(glide, target)
    assert 0 < stock < 1
    hf_specdec.apply_kernels(target, measure=False)
    hf_specdec.apply_kernels(glide, measure=False)
    assert step_bytes(target) == layers + head
    assert drafter_cost_prior(glide, target) == pytest.approx(stock)
