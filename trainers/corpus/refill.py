"""Greedy answers for many prompts with a refilled batch: continuous batching for ``corpus --method ar-refill``.

Plain batched ``generate`` decodes a batch until its longest row ends, and left-pads every prompt to the batch's
longest. On a shard of ShareGPT first turns (prompts of 30 to 1024 tokens, answers of 10 to 256) that wastes both
ways: a row that ended early keeps being computed until the batch's last row ends, and the long prompts' batch is
mostly padding (shard 0: 13,856 prompt tokens fed for 5,541 real ones). :func:`refill_greedy` decodes the prompts in
the tree core's loop with continuous batching (``hf_specdec.core.refill``) and a proposer that drafts nothing: a row
leaves the batch when it ends, and once ``refill_at`` rows are free the next prompts in the queue are prefilled in
groups of similar length and join the running batch. Every forward then computes live rows only.

Each row computes what it computes alone, up to float rounding (the batch changes the shapes of the matmuls). In fp32
the text is plain ``generate``'s: shards written both ways are compared in docs/corpus.md and
``tests/test_regenerate``. The rows' cache is the tree core's ``RaggedCache`` of ``hf_compat.OverallocatedLayer``
layers: a step writes each row's new entry into spare capacity rather than copying the whole cache.

Greedy only (sampled rows would draw from one RNG in an order the refill changes), and only a generation config
whose greedy step is the plain argmax (:func:`check_plain_greedy`): the loop is called with no logits processors,
where ``generate`` would build them from the model's generation config.
"""

from __future__ import annotations

from transformers import GenerationConfig, StoppingCriteriaList
from transformers.generation import EosTokenCriteria

from hf_specdec.core.refill import refill_generate
from hf_specdec.errors import SpecDecError

# generation-config fields that do not change a greedy step (ids, switches of outputs, sampling-only settings)
GREEDY_NEUTRAL = {
    "use_cache", "output_attentions", "output_hidden_states", "output_scores", "output_logits",
    "return_dict_in_generate", "pad_token_id", "bos_token_id", "eos_token_id", "decoder_start_token_id",
    "_from_model_config", "transformers_version", "max_length", "max_new_tokens", "do_sample", "temperature",
    "top_k", "top_p", "min_p", "typical_p", "cache_implementation",
}  # fmt: skip


def check_plain_greedy(model) -> None:
    """Refuse a model whose generation config changes greedy decoding's argmax (a repetition penalty, suppressed
    tokens, a minimum length, ...): the refill decodes without logits processors."""
    changed = sorted(set(model.generation_config.to_diff_dict()) - GREEDY_NEUTRAL)
    if changed:
        raise SpecDecError(
            f"--method ar-refill decodes plain greedy, but this model's generation config sets {', '.join(changed)}; "
            "use --method ar (plain generate, which applies them)"
        )


def refill_greedy(
    model,
    prompts: list[list[int]],
    max_new_tokens: int,
    eos_ids: list[int],
    pad_id: int,
    batch_size: int,
    refill_at: int | None = None,
) -> list[list[int]]:
    """Each prompt's greedy new tokens (ending with its EOS when it stopped on one), in the order of ``prompts``,
    which are fed in that order (sort them by length for little padding). At most ``batch_size`` rows decode at once;
    the batch is refilled when ``refill_at`` rows are free (default a quarter of ``batch_size``) or when it is
    empty."""
    check_plain_greedy(model)
    cfg = GenerationConfig(do_sample=False, eos_token_id=list(eos_ids), pad_token_id=pad_id)
    stop = StoppingCriteriaList([EosTokenCriteria(list(eos_ids))] if eos_ids else [])
    return refill_generate(model, prompts, max_new_tokens, cfg, stop, pad_id, batch_size, refill_at)
