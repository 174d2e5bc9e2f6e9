"""The Hub metadata of a drafter's model card (``huggingface_hub.ModelCardData``) and its runnable usage snippet.

The card's YAML names the target as ``base_model`` (so the Hub lists the drafter under its target), the
training data as ``datasets``, ``pipeline_tag: text-generation``, and the measured figures of ``model_card.json``
as ``model-index`` results (held-out ShareGPT validation, and the quick greedy measurement on mt-bench prompts when
the run made one); the command that made them is the ``hf_specdec.command`` field. Nothing is measured here.

``library_name: hf_specdec``, not ``transformers``: the Hub's ``transformers`` snippet
(``AutoModelForCausalLM.from_pretrained(repo)`` / a pipeline) cannot work for a drafter, which needs
``import hf_specdec`` (it registers the drafter classes) and its target (``target=``); a library the Hub has no
snippet for leaves the card's own snippet (:func:`usage_snippet`) as the one users see. The ``transformers`` tag
keeps the drafter under the Hub's transformers filter.
"""

from __future__ import annotations

import json
from pathlib import Path

from huggingface_hub import EvalResult, ModelCard, ModelCardData

from hf_specdec.errors import SpecDecError
from hf_specdec.targets import DEFAULT, TARGETS, named_target
from hf_specdec.tasks import SHAREGPT_HUB_ID

from ..data.tokenized import is_regenerated

HUB_IDS = {target.name: target.hub_id for target in TARGETS}
METHOD_TAGS = {"glide": ["glide", "cape"], "edd": ["edd", "pct"]}
NOT_METRICS = {
    "epoch",
    "tokens",
    "runtime",
    "samples_per_second",
    "steps_per_second",
    "prompts",
    "max_new_tokens",
}


def init_words(args) -> str:
    """How the run's drafter started, for its card's architecture line: ``--init`` or a warm start (``--init-from``)."""
    return "warm start (--init-from)" if getattr(args, "init_from", None) else f"init {args.init}"


def draft_vocab_words(config, coverage: float | None) -> str | None:
    """The drafter's reduced draft vocabulary in words: sized by this run (``coverage`` of its supervised tokens),
    kept from the ``--init-from`` drafter, or None for the full vocabulary."""
    if coverage is not None:
        return f"{config.draft_vocab_size} (coverage {coverage:.1%})"
    return f"{config.draft_vocab_size} (the --init-from drafter's)" if config.draft_vocab_size else None


def base_model_id(target: dict) -> str | None:
    """The target's Hub id: recorded (``hub_id``) or known from its recorded name; None when neither."""
    return target.get("hub_id") or HUB_IDS.get(target.get("name", ""))


def usage_snippet(kind: str, folder: str | Path, target_name: str | None = None) -> list[str]:
    """A fenced python block that runs as written from where ``folder`` is reachable: load the target (the default
    one, or the named target ``target_name``), the drafter through ``AutoModelForCausalLM``, and generate greedily
    with it (and with PCT trees for EDD)."""
    if kind not in METHOD_TAGS:
        raise SpecDecError(f"no usage snippet for drafter kind {kind!r}; known: {', '.join(METHOD_TAGS)}")
    edd = kind == "edd"
    named = named_target(target_name) if target_name else None
    if named is None or named is DEFAULT:  # a chat model
        load = ['target, tokenizer = hf_specdec.load_default_target("fp32")']
        prompt = [
            'messages = [{"role": "user", "content": "Name three uses of a hash map."}]',
            "inputs = tokenizer.apply_chat_template(",
            '    messages, add_generation_prompt=True, return_tensors="pt", return_dict=True',
            ")",
        ]
    else:  # a named target by its name; a pretrained one has no chat template
        load = [f'target, tokenizer = hf_specdec.load_target("{named.name}", "fp32")']
        prompt = ['inputs = tokenizer("Three uses of a hash map are", return_tensors="pt")']
    lines = [
        "```python",
        "import hf_specdec  # registers the drafters with transformers' Auto classes",
        "from transformers import AutoModelForCausalLM",
        *(["from hf_specdec.edd import EddTreeProposer"] if edd else []),
        "",
        *load,
        f'drafter = AutoModelForCausalLM.from_pretrained("{folder}", target=target)',
        *prompt,
        "out = target.generate(**inputs, assistant_model=drafter, max_new_tokens=24, do_sample=False)  # chain drafts",
    ]
    if edd:
        lines += [
            "tree = target.generate(  # token trees (PCT)",
            '    **inputs, custom_generate=hf_specdec.tree_generate, proposer=EddTreeProposer(drafter, "pct"),',
            "    max_new_tokens=24, do_sample=False,",
            ")",
        ]
    lines += ['print(tokenizer.decode(out[0, inputs["input_ids"].shape[1] :]))', "```"]
    return lines


def _results(
    values: dict, dataset: str, name: str, split: str | None, config: str | None = None
) -> list[EvalResult]:
    return [
        EvalResult(
            task_type="text-generation",
            dataset_type=dataset,
            dataset_name=name,
            dataset_config=config,
            dataset_split=split,
            metric_type=key,
            metric_name=key,
            metric_value=value,
        )
        for key, value in values.items()
        if key not in NOT_METRICS and isinstance(value, int | float) and not isinstance(value, bool)
    ]


def _validation_results(figures: dict, source: str, rows: str, config: str | None = None) -> list[EvalResult]:
    """``model-index`` results of one validation: its ``figures`` on ``rows`` of ShareGPT or, when ``source`` says
    so, of ShareGPT prompts answered by the target (``--eval-corpus`` of a regenerated corpus). The Hub groups results
    by dataset type, config and split, so each later validation has a config of its own (``eval-only-N``)."""
    regenerated = is_regenerated(source)
    name = f"{'ShareGPT prompts answered by the target' if regenerated else 'ShareGPT'} ({rows})"
    return _results(
        figures, "sharegpt-regenerated" if regenerated else "sharegpt", name, "validation", config
    )


def drafter_card_data(info: dict, kind: str, title: str) -> ModelCardData:
    """The YAML metadata of a drafter's card from its ``model_card.json`` ``info`` (module docstring)."""
    base = base_model_id(info["target"])
    if base is None:
        print(
            f"model card: target {info['target'].get('name')!r} has no known Hub id, so no base_model is set"
        )
    # the validation text's source: recorded since --eval-corpus (validation on other text than training's)
    results = _validation_results(
        info.get("validation", {}),
        str(info.get("validation_source", info.get("data", ""))),
        info.get("validation_rows", "held-out validation blocks"),
    )
    for i, e in enumerate(info.get("evaluations", []), 1):  # the same weights validated later (--add-to-card)
        results += _validation_results(e["figures"], e["source"], e["rows"], f"eval-only-{i}")
    method_tags = METHOD_TAGS[kind]
    if kind == "glide" and info.get("cross_attention") is False:  # the paper's ablation drafter (§5.2)
        method_tags = ["vanilla-draft"]
    measured = info.get("measured") or {}
    if measured:
        name = f"mt-bench, first {measured.get('prompts')} prompts, greedy, {measured.get('max_new_tokens')} new tokens"
        results += _results(measured, "mt-bench", name, None)
    return ModelCardData(
        base_model=base,
        library_name="hf_specdec",
        pipeline_tag="text-generation",
        tags=["hf_specdec", "speculative-decoding", "draft-model", *method_tags, "transformers"],
        # ShareGPT's text, or its prompts answered by the target (``corpus --regenerate``), mixed or not
        datasets=[SHAREGPT_HUB_ID] if "ShareGPT" in str(info.get("data", "")) else None,
        model_name=title,
        eval_results=results or None,
        hf_specdec={"method": kind, "target": info["target"], "command": info.get("command", "")},
    )


EVALUATIONS = "## Validated again (`--eval-only`)"


def evaluations_section(evaluations: list[dict]) -> str:
    """The card's section of later validations of the same weights (``model_card.json``'s ``evaluations``)."""
    lines = [
        EVALUATIONS,
        "",
        "The same weights, validated after training (`hf-specdec train glide|edd --eval-only --add-to-card`):",
        "",
        "| validation rows | tokens | KL | top-1 | top-1 at round starts | alpha |",
        "|---|---:|---:|---:|---:|---:|",
    ]
    for e in evaluations:
        f = e["figures"]
        cells = [f.get(k, "") for k in ("tokens", "kl", "top1_match", "top1_round_start", "alpha")]
        lines.append(f"| {e['rows']} | " + " | ".join(str(c) for c in cells) + " |")
    lines += ["", *(f"- `{e['command']}`" for e in evaluations if e.get("command")), ""]
    return "\n".join(lines)


def add_evaluation(folder: str | Path, evaluation: dict, kind: str) -> Path:
    """Record ``evaluation`` (``{"rows", "source", "figures", "command"}``) in the drafter card of ``folder``: in
    ``model_card.json``'s ``evaluations`` (replacing one on the same rows) and its README (:func:`refresh_card`)."""
    folder = Path(folder)
    card = folder / "model_card.json"
    if not card.is_file() or not (folder / "README.md").is_file():
        raise SpecDecError(
            f"--add-to-card: {folder} has no model_card.json and README.md (cards of `hf-specdec train` runs); "
            "drop --add-to-card, the figures are in eval_results.json"
        )
    info = json.loads(card.read_text())
    same = (evaluation["rows"], evaluation["source"])
    kept = [e for e in info.get("evaluations", []) if (e["rows"], e["source"]) != same]
    info["evaluations"] = [*kept, evaluation]
    card.write_text(json.dumps(info, indent=1))
    return refresh_card(folder, kind)


def refresh_card(folder: str | Path, kind: str, snippet_folder: str | Path | None = None) -> Path:
    """Rewrite ``folder/README.md`` as a Hub card: the metadata from ``model_card.json``, today's body with its
    usage block replaced by :func:`usage_snippet` (for ``snippet_folder``, default ``folder``); returns its path."""
    folder = Path(folder)
    info = json.loads((folder / "model_card.json").read_text())
    readme = folder / "README.md"
    body = ModelCard(readme.read_text()).text if readme.is_file() else ""
    start = body.find("```python")
    end = body.find("```", start + 3) if start >= 0 else -1
    if end < 0:
        raise SpecDecError(f"{readme} has no ```python usage block to refresh")
    snippet = "\n".join(usage_snippet(kind, snippet_folder or folder, info["target"].get("name")))
    body = body[:start] + snippet + body[end + 3 :]
    if info.get("evaluations"):  # the section is the card's last, or stops at the next second-level heading
        at = body.find(EVALUATIONS)
        after = body.find("\n## ", at + len(EVALUATIONS)) if at >= 0 else -1
        head = body[:at] if at >= 0 else body.rstrip("\n") + "\n\n"
        body = head + evaluations_section(info["evaluations"]) + (body[after + 1 :] if after >= 0 else "")
    title = body.lstrip().splitlines()[0].lstrip("# ").strip()
    card = ModelCard(f"---\n{drafter_card_data(info, kind, title).to_yaml()}\n---\n{body.lstrip()}")
    card.save(readme)
    return readme
