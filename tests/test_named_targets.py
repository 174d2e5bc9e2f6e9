"""Named targets (hf_specdec/targets.py): names and aliases, the error for an unknown name, the GGUF put together
from its package's parts, the Makefile installing every package; PLD+(a) on a sliding-window model (Gemma 3); and
the real Gemma-3-270M loaded by name, PLD+ (h) and (a) token-identical to greedy on it."""

from __future__ import annotations

import copy
import hashlib
import re
import sys
from pathlib import Path

import pytest
import torch
from transformers import DynamicCache

import hf_specdec
from hf_specdec.core.verify_cost import CostCurve
from hf_specdec.errors import SpecDecError
from hf_specdec.pld_plus.attention_capture import capture_selected_attention
from hf_specdec.pld_plus.heads_file import write_heads_file
from hf_specdec.target import load_target, resolve_model_path
from hf_specdec.targets import DEFAULT, TARGETS, NamedTarget, locate_gguf, named_target

ROOT = Path(__file__).resolve().parent.parent


# ----------------------------------------------------------------------------------------------- registry
def test_names_and_aliases_match_in_any_case():
    assert DEFAULT.name == "SmolLM2-135M-Instruct" and DEFAULT.hub_id == "HuggingFaceTB/SmolLM2-135M-Instruct"
    gemma = named_target("gemma-3-270m")
    assert gemma is not None and gemma.hub_id == "google/gemma-3-270m"
    for spelling in ("Gemma-3-270M", "GEMMA-3-270M", "gemma3-270m", " gemma-3-270m "):
        assert named_target(spelling) is gemma
    assert named_target("smollm2") is named_target("smollm2-135m-instruct") is DEFAULT
    assert named_target("gemma-3-1b") is None
    names = [n.lower() for t in TARGETS for n in (t.name, *t.aliases)]
    assert len(names) == len(set(names))  # no name or alias names two targets


def test_an_unknown_name_lists_the_known_ones(tmp_path, monkeypatch, capsys):
    from hf_specdec.cli import main

    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("HF_SPECDEC_HOME", str(tmp_path / "home"))
    with pytest.raises(
        SpecDecError, match=r"model=gemma-9: .*known: SmolLM2-135M-Instruct, gemma-3-270m.*Hub id"
    ):
        load_target("gemma-9")
    assert main(["demo", "--model", "gemma-9"]) == 2
    err = capsys.readouterr().err.strip()
    assert "--model gemma-9: " in err and "not a named target" in err and "a model folder" in err
    assert len(err.splitlines()) == 1
    assert not (tmp_path / "home").exists()  # nothing loaded or converted


def test_an_existing_path_wins_over_a_name(tmp_path, monkeypatch):
    """A folder called like a named target is loaded as the folder (here: a folder of GGUFs, which wants
    --gguf-file); ``org/name`` is left to transformers as a Hub id."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "gemma-3-270m").mkdir()
    (tmp_path / "gemma-3-270m" / "a.gguf").write_bytes(b"GGUF")
    with pytest.raises(SpecDecError, match="holds GGUF files"):
        resolve_model_path("gemma-3-270m")
    assert resolve_model_path("someone/some-model") == "someone/some-model"


def _fake_parts(tmp_path, monkeypatch, chunks: list[bytes]) -> list[tuple[str, str]]:
    """Installed-looking part packages ``fake_part<i>/data/f.part<i>`` on ``sys.path`` (never imported)."""
    site = tmp_path / "site"
    files = []
    for i, chunk in enumerate(chunks):
        pkg = site / f"fake_part{i}"
        (pkg / "data").mkdir(parents=True)
        (pkg / "__init__.py").write_text("raise ImportError('part packages are located, not imported')\n")
        (pkg / "data" / f"f.part{i}").write_bytes(chunk)
        files.append((f"fake_part{i}", f"data/f.part{i}"))
    monkeypatch.syspath_prepend(str(site))
    return files


def test_a_split_gguf_is_put_together_and_checked(tmp_path, monkeypatch):
    chunks = [b"GGUF" + bytes(range(200)), bytes(100), b"tail"]
    files = _fake_parts(tmp_path, monkeypatch, chunks)
    whole = b"".join(chunks)
    target = NamedTarget(
        "fake", "org/fake", "f.gguf", tuple(files), hashlib.sha256(whole).hexdigest(), "fake"
    )
    assert target.packages == ["fake", "fake-part0", "fake-part1", "fake-part2"]
    out = locate_gguf(target, tmp_path / "work")
    assert out == tmp_path / "work" / "f.gguf" and out.read_bytes() == whole
    assert "fake_part0" not in sys.modules
    bad = NamedTarget("fake", "org/fake", "f.gguf", tuple(files), "0" * 64, "fake")
    with pytest.raises(
        SpecDecError, match="do not match its published sha256.*--force-reinstall fake fake-part0"
    ):
        locate_gguf(bad, tmp_path / "work2")
    assert not (tmp_path / "work2" / "f.gguf").exists()
    missing = NamedTarget("fake", "org/fake", "f.gguf", (*files, ("fake_part9", "data/x")), None, "fake")
    with pytest.raises(
        SpecDecError, match=r"needs the 'fake-part9' package: run `make install`.*fake-part9`"
    ):
        locate_gguf(missing, tmp_path / "work3")


def test_the_makefile_installs_every_named_target():
    makefile = (ROOT / "Makefile").read_text().replace("\\\n", " ")
    variables = dict(re.findall(r"^(\w+)\s*:=\s*(.*)$", makefile, re.M))
    installed = re.sub(r"\$\((\w+)\)", lambda m: variables[m.group(1)], variables["DATA_PACKAGES"]).split()
    for target in TARGETS:
        assert set(target.packages) <= set(installed), target.name
        assert (ROOT / "hf_specdec" / "resources" / f"{target.name}.heads.json").is_file(), target.name


# ------------------------------------------------------------------------- sliding-window attention (Gemma 3)
def tiny_gemma3(vocab_size: int = 97, window: int = 6, seed: int = 0):
    """A 2-layer Gemma 3 text model (a sliding-window layer, then a global one), random weights, sdpa."""
    from transformers import Gemma3ForCausalLM, Gemma3TextConfig

    torch.manual_seed(seed)
    cfg = Gemma3TextConfig(
        vocab_size=vocab_size,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=1,
        head_dim=16,
        query_pre_attn_scalar=16,
        sliding_window=window,
        layer_types=["sliding_attention", "full_attention"],
        max_position_embeddings=256,
        bos_token_id=1,
        eos_token_id=2,
        pad_token_id=0,
    )
    model = Gemma3ForCausalLM(cfg).eval()
    model.set_attn_implementation("sdpa")
    return model


@torch.no_grad()
def test_captured_rows_of_a_sliding_layer_cover_the_whole_context():
    """Past the window the sliding layer's cache keeps only the window: the captured rows are still those of eager
    attention over the whole context (masked to the window, zeros before it), for the prefill and cached steps."""
    model = tiny_gemma3()
    eager = type(model)(copy.deepcopy(model.config)).eval()
    eager.load_state_dict(model.state_dict())
    eager.set_attn_implementation("eager")
    ids = torch.randint(3, 97, (1, 20))
    ref = eager(ids, output_attentions=True).attentions
    heads = {0: torch.tensor([0, 2]), 1: torch.tensor([1])}
    with capture_selected_attention(model, heads) as heads_only:
        out = model(ids[:, :12], output_attentions=True, use_cache=True)
        steps = [(0, 12, out.attentions)]
        for start in (12, 16):
            out = model(
                ids[:, start : start + 4], past_key_values=out.past_key_values, output_attentions=True
            )
            steps.append((start, start + 4, out.attentions))
    assert heads_only and model.config._attn_implementation == "sdpa"
    assert type(out.past_key_values.layers[0]).__name__ == "DynamicSlidingWindowLayer"
    for start, end, got in steps:
        for (layer, hs), weights in zip(heads.items(), got):
            torch.testing.assert_close(
                weights, ref[layer][:, hs, start:end, :end].float(), atol=1e-5, rtol=1e-4
            )


@pytest.mark.skipif(
    not hasattr(DynamicCache, "activate_past_recording"),
    reason="this transformers cannot crop a sliding-window cache past its window (assisted decoding fails there)",
)
def test_pld_plus_a_past_the_window_is_token_identical(tmp_path):
    model = tiny_gemma3(vocab_size=32, window=8)
    entries = [{"layer": 0, "head": 1, "score": 0.5}, {"layer": 1, "head": 2, "score": 0.4}]
    heads = write_heads_file(tmp_path / "heads.json", model, entries, task="test")
    torch.manual_seed(1)
    base = torch.randint(3, 32, (12,))
    prompt = torch.cat([base, base[:6]])[None]  # 18 tokens: already past the window of 8
    kw = dict(attention_mask=torch.ones_like(prompt), max_new_tokens=30, min_new_tokens=30, do_sample=False)
    ref = model.generate(prompt, **kw)
    cheap = dict(pld_min_score=-1, pld_cost=CostCurve.linear(0.02))
    for variant in ("attention", "hidden"):
        out = model.generate(
            prompt, **kw, custom_generate=hf_specdec.pld_plus, pld_variant=variant, pld_heads=heads, **cheap
        )
        assert torch.equal(out, ref), variant
    model.set_attn_implementation("eager")
    with pytest.raises(SpecDecError, match="sliding-window model.*attn_implementation='sdpa'"):
        model.generate(
            prompt,
            **kw,
            custom_generate=hf_specdec.pld_plus,
            pld_variant="attention",
            pld_heads=heads,
            **cheap,
        )


# ------------------------------------------------------------------------------------------ the real Gemma
@pytest.fixture(scope="module")
def gemma():
    """(model, tokenizer) of the named target gemma-3-270m in fp32 (converted once per machine)."""
    return load_target("Gemma-3-270M", "fp32")


@pytest.mark.real
@pytest.mark.compat
def test_gemma_3_270m_by_name_is_lossless_with_pld_plus(gemma):
    from hf_specdec.pld_plus.heads_file import default_heads_file

    model, tokenizer = gemma
    assert type(model).__name__ == "Gemma3ForCausalLM" and model.dtype == torch.float32
    assert model.config.num_hidden_layers == 18 and not hasattr(model.config, "quantization_config")
    assert Path(model.config.name_or_path).name == "gemma-3-270m"
    assert default_heads_file(model).name == "gemma-3-270m.heads.json"  # shipped: no find-heads needed
    text = "Fruit: apple, pear, plum, fig, date, lime, kiwi, mango.\nThe same fruit again: apple, pear,"
    ids = tokenizer(text, return_tensors="pt").input_ids
    assert ids[0, 0] == tokenizer.bos_token_id
    kw = dict(attention_mask=torch.ones_like(ids), max_new_tokens=24, do_sample=False)
    ref = model.generate(ids, **kw)
    assert "plum" in tokenizer.decode(ref[0, ids.shape[1] :])  # sensible: it copies the list on
    cheap = CostCurve.linear(0.05)  # drafting must not depend on this machine's timing
    for variant in ("hidden", "attention"):
        out = model.generate(
            ids,
            **kw,
            custom_generate=hf_specdec.pld_plus,
            pld_variant=variant,
            pld_cost=cheap,
            pld_return_attribution=True,
        )
        assert torch.equal(out.sequences, ref), variant
        assert sum(span.length for span in out.attribution) > 0, variant  # drafts were accepted
