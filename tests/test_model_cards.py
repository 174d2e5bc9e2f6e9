"""Drafter model cards the Hub understands (``trainers/drafter_card.py``): YAML read back by ``huggingface_hub``, the
target as ``base_model``, the recorded figures as results, a usage snippet that runs as written; and the Hub
arguments of ``save_pretrained`` / ``Trainer`` pass through our classes untouched (no network: uploads stubbed)."""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

import pytest
import torch
from hf_specdec.trainers.drafter_card import refresh_card
from hf_specdec.trainers.glide import write_model_card
from huggingface_hub import ModelCard

from hf_specdec.target import DEFAULT_TARGET_HUB_ID

ROOT = Path(__file__).resolve().parent.parent
SHIPPED = {
    "glide": ROOT / "hf_specdec/resources/glide-smollm2",
    "edd": ROOT / "hf_specdec/resources/edd-smollm2",
    "vanilla": ROOT / "hf_specdec/resources/vanilla-smollm2",  # GLIDE without cross-attention (§5.2 ablation)
    "glide-gemma3": ROOT / "hf_specdec/resources/glide-gemma3",  # the named target gemma-3-270m's
    "edd-gemma3": ROOT / "hf_specdec/resources/edd-gemma3",
}
DRAFTER_KIND = {
    "glide": "glide",
    "edd": "edd",
    "vanilla": "glide",
    "glide-gemma3": "glide",
    "edd-gemma3": "edd",
}
TAG = {
    "glide": "glide",
    "edd": "edd",
    "vanilla": "vanilla-draft",
    "glide-gemma3": "glide",
    "edd-gemma3": "edd",
}
HUB_ID = {"SmolLM2-135M-Instruct": DEFAULT_TARGET_HUB_ID, "gemma-3-270m": "google/gemma-3-270m"}


def snippet(readme: Path) -> str:
    """The first fenced python block of a card."""
    return re.search(r"```python\n(.*?)```", readme.read_text(), re.S).group(1)


@pytest.mark.parametrize("kind", sorted(SHIPPED))
def test_shipped_card_metadata(kind, tmp_path):
    folder = SHIPPED[kind]
    data = ModelCard.load(folder / "README.md").data
    info = json.loads((folder / "model_card.json").read_text())
    assert data.base_model == HUB_ID[info["target"]["name"]]
    assert data.library_name == "hf_specdec" and data.pipeline_tag == "text-generation"
    assert {"speculative-decoding", TAG[kind]}.issubset(data.tags)
    assert kind != "vanilla" or "glide" not in data.tags
    assert data.datasets == ["anon8231489123/ShareGPT_Vicuna_unfiltered"]
    figures = {(r.dataset_split, r.metric_type): r.metric_value for r in data.eval_results}
    assert figures[("validation", "top1_match")] == info["validation"]["top1_match"]
    assert data.hf_specdec["command"] == info["command"] and data.hf_specdec["target"] == info["target"]
    # the shipped card is what the card writer makes of its model_card.json (kept in sync)
    copy = shutil.copytree(folder, tmp_path / folder.name, ignore=shutil.ignore_patterns("*.safetensors"))
    refresh_card(copy, DRAFTER_KIND[kind], f"hf_specdec/resources/{folder.name}")
    assert (copy / "README.md").read_text() == (folder / "README.md").read_text()


def test_card_of_a_new_run(tmp_path, capsys):
    info = json.loads((SHIPPED["glide"] / "model_card.json").read_text())
    card = ModelCard.load(write_model_card(tmp_path, info))
    assert card.data.base_model == DEFAULT_TARGET_HUB_ID
    assert f'from_pretrained("{tmp_path}", target=target)' in card.text
    assert [r.metric_value for r in card.data.eval_results if r.metric_type == "tau"] == [
        info["measured"]["tau"]
    ]
    other = {**info, "target": {**info["target"], "name": "my-local-model"}}
    assert ModelCard.load(write_model_card(tmp_path, other)).data.base_model is None
    assert "no known Hub id" in capsys.readouterr().out


@pytest.mark.real
@pytest.mark.parametrize("kind", sorted(SHIPPED))
def test_shipped_snippet_runs_as_written(kind, monkeypatch):
    monkeypatch.chdir(ROOT)
    scope: dict = {}
    exec(compile(snippet(SHIPPED[kind] / "README.md"), f"{kind} card", "exec"), scope)
    target, inputs = scope["target"], scope["inputs"]
    greedy = target.generate(**inputs, max_new_tokens=24, do_sample=False)
    assert torch.equal(scope["out"], greedy)
    if DRAFTER_KIND[kind] == "edd":
        assert torch.equal(scope["tree"], greedy)


def test_save_pretrained_push_to_hub_passes_through(tmp_path, monkeypatch, target_and_edd):
    import transformers.modeling_utils as mu

    _, edd = target_and_edd
    calls = {}

    class Api:
        def create_repo(self, repo_id, exist_ok, **kwargs):
            calls["create"] = (repo_id, kwargs)
            return type("Url", (), {"repo_id": repo_id})()

    monkeypatch.setattr(mu, "hf_api", Api)
    monkeypatch.setattr(mu, "create_and_tag_model_card", lambda *a, **k: ModelCard("---\n---\n"))
    monkeypatch.setattr(
        type(edd),
        "_upload_modified_files",
        lambda self, folder, repo_id, stamps, **k: calls.update(upload=(folder, repo_id, k)),
    )
    edd.save_pretrained(tmp_path, push_to_hub=True, repo_id="me/edd", commit_message="first", private=True)
    assert calls["create"] == ("me/edd", {"private": True})
    folder, repo_id, kwargs = calls["upload"]
    assert (Path(folder), repo_id, kwargs["commit_message"]) == (tmp_path, "me/edd", "first")
    assert (tmp_path / "config.json").is_file() and (tmp_path / "model.safetensors").is_file()


def test_trainer_hub_arguments_pass_through(tmp_path, monkeypatch, target_and_edd):
    from hf_specdec.trainers.drafter_trainer import DrafterTrainer
    from transformers import Trainer, TrainingArguments

    target, edd = target_and_edd
    repos = []
    monkeypatch.setattr(Trainer, "init_hf_repo", lambda self, *a, **k: repos.append(self.args.hub_model_id))
    args = TrainingArguments(
        output_dir=str(tmp_path), push_to_hub=True, hub_model_id="me/edd", report_to=[], use_cpu=True
    )
    trainer = DrafterTrainer(model=edd, args=args, target=target)
    assert repos == ["me/edd"] and trainer.args.push_to_hub and trainer.args.hub_model_id == "me/edd"
