"""Drafter checkpoints the HF way: Auto classes with and without ``target=``, namespaced model types, old checkpoints."""

from __future__ import annotations

import json

import pytest
import torch
from hf_specdec.modeling import EddConfig, EddForCausalLM, GlideConfig, GlideForCausalLM
from transformers import AutoConfig, AutoModelForCausalLM

from hf_specdec.errors import SpecDecError

from .conftest import tiny_llama


def _drafters(target):
    edd = EddForCausalLM(EddConfig.for_target(target)).eval()
    glide = GlideForCausalLM(GlideConfig.for_target(target)).eval()
    return {"hf_specdec_edd": edd, "hf_specdec_glide": glide}


@pytest.mark.parametrize("kind", ["hf_specdec_edd", "hf_specdec_glide"])
def test_auto_classes_load_a_drafter_with_and_without_its_target(kind, tmp_path):
    target = tiny_llama(num_hidden_layers=4)
    drafter = _drafters(target)[kind]
    drafter.save_pretrained(tmp_path)
    assert json.loads((tmp_path / "config.json").read_text())["model_type"] == kind

    attached = AutoModelForCausalLM.from_pretrained(tmp_path, target=target)
    assert type(attached) is type(drafter) and attached.target is target
    assert not hasattr(attached.config, "target")  # the keyword did not leak into the config
    attached.save_pretrained(tmp_path / "again")  # and the config still serializes
    ids = torch.tensor([[5, 6, 7, 8]])
    ref = target.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=6, do_sample=False)
    out = target.generate(
        ids, attention_mask=torch.ones_like(ids), max_new_tokens=6, do_sample=False, assistant_model=attached
    )
    assert torch.equal(out, ref)

    loose = AutoModelForCausalLM.from_pretrained(tmp_path)  # loads; using it says what to do
    assert loose.target is None
    with pytest.raises(
        SpecDecError, match=r"not attached to its target.*from_pretrained\(path, target=target\)"
    ):
        loose(input_ids=ids)


@pytest.mark.parametrize("kind", ["hf_specdec_edd", "hf_specdec_glide"])
def test_a_drafter_loads_at_the_dtype_asked_for(kind, tmp_path):
    """``from_pretrained(..., dtype=torch.bfloat16)`` gives a bf16 drafter, however its layer config records the
    target's dtype: an fp32 drafter beside a bf16 target ran its layer in fp32 and cast the LM head every call."""
    target = tiny_llama(num_hidden_layers=4).to(torch.bfloat16)
    made_beside = tiny_llama(num_hidden_layers=4)
    made_beside.config.dtype = torch.float32  # as a loaded target's config records it
    _drafters(made_beside)[kind].save_pretrained(tmp_path)
    for loaded in (
        AutoModelForCausalLM.from_pretrained(tmp_path, target=target, dtype=torch.bfloat16),
        type(_drafters(target)[kind]).from_pretrained(tmp_path, target=target, dtype=torch.bfloat16),
    ):
        assert {p.dtype for p in loaded.parameters()} == {torch.bfloat16}
    assert {p.dtype for p in AutoModelForCausalLM.from_pretrained(tmp_path).parameters()} == {torch.float32}


@pytest.mark.parametrize("old_type", ["edd", "glide"])
def test_checkpoints_of_the_earlier_model_types_still_load(old_type, tmp_path):
    """Checkpoints written before the namespace (model_type 'edd' / 'glide'; EDD's fingerprint under 'target') load
    through the Auto classes and are saved under the namespaced type."""
    target = tiny_llama(num_hidden_layers=4)
    drafter = _drafters(target)[f"hf_specdec_{old_type}"]
    drafter.save_pretrained(tmp_path)
    config = json.loads((tmp_path / "config.json").read_text())
    config["model_type"] = old_type
    if old_type == "edd":
        config["target"] = config.pop("target_info")
    (tmp_path / "config.json").write_text(json.dumps(config))

    assert AutoConfig.from_pretrained(tmp_path).target_info == drafter.config.target_info
    loaded = AutoModelForCausalLM.from_pretrained(tmp_path, target=target)
    assert isinstance(loaded, type(drafter)) and loaded.target is target
    for name, p in drafter.state_dict().items():
        torch.testing.assert_close(loaded.state_dict()[name], p)
    loaded.save_pretrained(tmp_path / "new")
    saved = json.loads((tmp_path / "new" / "config.json").read_text())
    assert saved["model_type"] == f"hf_specdec_{old_type}" and "target" not in saved
    assert type(AutoModelForCausalLM.from_pretrained(tmp_path / "new", target=target)) is type(drafter)


@pytest.mark.parametrize(
    ("folder", "kind"),
    [
        ("edd-smollm2", "hf_specdec_edd"),
        ("glide-smollm2", "hf_specdec_glide"),
        ("vanilla-smollm2", "hf_specdec_glide"),
    ],
)
def test_the_shipped_drafters_are_saved_under_the_namespaced_types(folder, kind):
    """The packaged checkpoints load as current configs, not through the legacy shims (which make transformers warn
    'a model of type edd to instantiate a model of type hf_specdec_edd' on every bench and demo)."""
    from importlib.resources import files

    path = files("hf_specdec") / "resources" / folder
    raw = json.loads((path / "config.json").read_text())
    assert (
        raw["model_type"] == kind
        and "target" not in raw
        and raw["target_info"]["name"] == "SmolLM2-135M-Instruct"
    )
    config = AutoConfig.from_pretrained(str(path))
    assert type(config) is {"hf_specdec_edd": EddConfig, "hf_specdec_glide": GlideConfig}[kind]


# ------------------------------------------------------------------ shipped checkpoints, found by target (shipped.py)
def test_a_method_given_no_checkpoint_takes_the_one_made_for_its_target(tmp_path, monkeypatch):
    """A checkpoint folder counts for a target only when the fingerprint it records is that target's: a drafter of
    another target is never picked (it would fail later, on the wrong question); an option without a checkpoint
    and a target with none shipped are clear errors naming what to do."""
    from hf_specdec import shipped
    from hf_specdec.bench.glide_methods import find_checkpoint
    from hf_specdec.edd.checkpoint import find_edd_checkpoint
    from hf_specdec.fingerprint import target_fingerprint

    mine, other = tiny_llama(num_hidden_layers=4), tiny_llama(num_hidden_layers=4, seed=1)
    resources = tmp_path / "resources"
    for name, target in (("edd-mine", mine), ("edd-other", other)):
        EddForCausalLM(EddConfig.for_target(target)).save_pretrained(resources / name)
    GlideForCausalLM(GlideConfig.for_target(other)).save_pretrained(resources / "glide-other")
    (resources / "space-mine").mkdir()
    (resources / "space-mine" / "space_training.json").write_text(
        json.dumps({"target_info": target_fingerprint(mine)})
    )
    monkeypatch.setattr(shipped, "RESOURCES", resources)
    monkeypatch.chdir(tmp_path)  # no runs/ here

    assert shipped.shipped_checkpoint("edd", mine) == resources / "edd-mine"
    assert shipped.shipped_checkpoint("edd", other) == resources / "edd-other"
    assert shipped.shipped_checkpoint("space", mine) == resources / "space-mine"
    assert (
        shipped.shipped_checkpoint("space", other) is None
        and shipped.shipped_checkpoint("glide", mine) is None
    )
    assert find_edd_checkpoint(None, mine) == resources / "edd-mine"
    assert find_checkpoint("glide", None, other) == resources / "glide-other"
    with pytest.raises(
        SpecDecError, match=r"no glide drafter for this target .*train one with .*--option glide="
    ):
        find_checkpoint("glide", None, mine)
    with pytest.raises(SpecDecError, match="no EDD checkpoint at nowhere"):
        find_edd_checkpoint("nowhere", mine)
    # a trained drafter in the docs' place wins over the shipped one, for its own target only
    EddForCausalLM(EddConfig.for_target(mine)).save_pretrained(tmp_path / "runs" / "edd-smollm2")
    assert find_edd_checkpoint(None, mine) == shipped.Path("runs/edd-smollm2")
    assert find_edd_checkpoint(None, other) == resources / "edd-other"


@pytest.mark.real
def test_the_default_target_finds_its_shipped_checkpoints(real_target):
    from hf_specdec.shipped import RESOURCES, shipped_checkpoint

    model, _ = real_target
    for kind in ("glide", "vanilla", "edd", "space"):
        assert shipped_checkpoint(kind, model) == RESOURCES / f"{kind}-smollm2"
