"""The README.md (Hub card) of an exported ``custom_generate`` folder (``custom_generate_export.py``): YAML with the
``custom_generate`` tag the Hub lists decoding strategies under, then what it does, its arguments and usage."""

from __future__ import annotations

from huggingface_hub import ModelCard, ModelCardData

from .target import DEFAULT_TARGET_HUB_ID

ARGUMENTS = {
    "pld_plus": [
        '`pld_variant` (`"hidden"` or `"attention"`, default `"hidden"`): rank prompt-lookup occurrences by '
        "hidden-state similarity (PLD+(h)) or induction-head attention (PLD+(a); needs `pld_heads=` a heads file "
        "made by `hf-specdec find-heads`, since the shipped one is not bundled)",
        "`pld_num_tokens` (`int`): a fixed number of drafted tokens per step (default: adaptive, from a measured "
        "verification cost)",
        "`pld_layer`, `pld_min_score`, `pld_max_num_tokens`, `pld_top_heads`, `pld_return_attribution`: as in "
        "`hf_specdec.pld_plus`",
    ],
    "tree_lookup": [
        "`tree_ngram`, `tree_tokens`, `tree_branches`, `tree_nodes`, `tree_random` (`int`): the n-gram lookup "
        "tree (longest n-gram, tokens per continuation, continuations, node cap, random root siblings)",
    ],
}


def strategy_card(method: str, title: str, loop: str, files: list[str]) -> ModelCard:
    """The card of the exported ``method`` (``title``: one line; ``loop``: the hf_specdec entry it equals)."""
    data = ModelCardData(
        library_name="transformers",
        pipeline_tag="text-generation",
        tags=["custom_generate", "speculative-decoding", method.replace("_", "-"), "hf_specdec"],
    )
    args = "\n".join(f"- {a}" for a in ARGUMENTS[method])
    body = f"""
# {method}: {title}

## Description
Lossless speculative decoding from the `hf_specdec` package, exported with
`hf-specdec export-custom-generate {method} DIR`: greedy outputs are the model's own, token for token, sampled
ones follow its distribution. The decoding loop is `{loop}`; its modules are bundled in `custom_generate/`
({", ".join(files)}), so hf_specdec need not be installed. Batch size 1.

## Base model
Any; tested with `{DEFAULT_TARGET_HUB_ID}`.

## Model compatibility
Decoder-only causal LMs, batch size 1; a model whose cache the loop cannot handle gets a clear error.

## Additional Arguments
{args}

## Output Type changes
(none): a tensor of token ids, or a `GenerateDecoderOnlyOutput` with `return_dict_in_generate=True`.

## Example usage

```python
from transformers import AutoModelForCausalLM, AutoTokenizer

tokenizer = AutoTokenizer.from_pretrained("{DEFAULT_TARGET_HUB_ID}")
model = AutoModelForCausalLM.from_pretrained("{DEFAULT_TARGET_HUB_ID}")
inputs = tokenizer("def add(a, b):\\n    return a + b\\n\\ndef add3(a, b, c):", return_tensors="pt")
out = model.generate(**inputs, custom_generate="THIS_REPO_OR_DIR", trust_remote_code=True, max_new_tokens=64)
print(tokenizer.decode(out[0]))
```
"""
    return ModelCard(f"---\n{data.to_yaml()}\n---\n{body}")
