"""Greedy answers for many prompts with a refilled batch: continuous batching for ``corpus --method ar-refill``.

Plain batched ``generate`` decodes a batch until its longest row ends, and left-pads every prompt to the batch's
longest. On a shard of ShareGPT first turns (prompts of 30 to 1024 tokens, answers of 10 to 256) that wastes both
ways: a row that ended early keeps being computed until the batch's last row ends, and the long prompts' batch is
mostly padding (shard 0: 13,856 prompt tokens fed for 5,541 real ones). Here a row leaves the batch when it ends,
and once ``refill_at`` rows are free the next prompts in the queue are prefilled in batches of similar length
(:func:`prefill_groups`) and appended to the running batch (:meth:`RaggedCache.append_rows`). Every forward then
computes live rows only.

The rows share one :class:`~hf_specdec.core.ragged_cache.RaggedCache` of the tree core: each row has its own valid
entries, position ids count its real tokens, and a 4D mask lets a query see its own row's entries only. So each row
computes what it computes alone, up to float rounding (the batch changes the shapes of the matmuls). In fp32 the
text is plain ``generate``'s: shards written both ways are compared in docs/corpus.md and ``tests/test_regenerate``.
The cache's layers are ``hf_compat.OverallocatedLayer``: a step writes each row's new entry into spare capacity
rather than copying the whole cache (``torch.cat``), which at long rows cost as much as the attention.

Greedy only (sampled rows would draw from one RNG in an order the refill changes), and only a generation config
whose greedy step is the plain argmax (:func:`check_plain_greedy`). One host read per step: the new tokens, which
decide what is emitted and which rows end.
"""

from __future__ import annotations

from collections import deque

import torch

from hf_specdec.core.batch_io import left_pad
from hf_specdec.core.generate_io import logits_to_keep
from hf_specdec.core.ragged_cache import RaggedCache
from hf_specdec.core.sliding_window import LayerMasks
from hf_specdec.errors import SpecDecError
from hf_specdec.hf_compat import overallocated_cache

PREFILL_WASTE = 0.25  # at most this fraction of a prefill batch's tokens are padding (prefill_groups)

# generation-config fields that do not change a greedy step (ids, switches of outputs, sampling-only settings)
GREEDY_NEUTRAL = {
    "use_cache", "output_attentions", "output_hidden_states", "output_scores", "output_logits",
    "return_dict_in_generate", "pad_token_id", "bos_token_id", "eos_token_id", "decoder_start_token_id",
    "_from_model_config", "transformers_version", "max_length", "max_new_tokens", "do_sample", "temperature",
    "top_k", "top_p", "min_p", "typical_p", "cache_implementation",
}  # fmt: skip


def check_plain_greedy(model) -> None:
    """Refuse a model whose generation config changes greedy decoding's argmax (a repetition penalty, suppressed
    tokens, a minimum length, ...): this loop takes the argmax of the logits as they are."""
    changed = sorted(set(model.generation_config.to_diff_dict()) - GREEDY_NEUTRAL)
    if changed:
        raise SpecDecError(
            f"--method ar-refill decodes plain greedy, but this model's generation config sets {', '.join(changed)}; "
            "use --method ar (plain generate, which applies them)"
        )


@torch.no_grad()
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
    device = next(model.parameters()).device
    refill_at = max(1, batch_size // 4) if refill_at is None else refill_at
    masks, eos = LayerMasks(model), set(eos_ids)
    queue, out = deque(range(len(prompts))), [[] for _ in prompts]
    rows: list[int] = []  # the prompt index of each row of the batch
    batch, pending = None, None  # the rows' cache, and their last tokens: emitted, not yet fed
    while queue or rows:
        if queue and (not rows or batch_size - len(rows) >= refill_at):
            new = [queue.popleft() for _ in range(min(batch_size - len(rows), len(queue)))]
            first = len(rows)  # the rows from ``first`` on get a new token
            for group in prefill_groups([prompts[i] for i in new]):
                ids, mask = left_pad([prompts[new[k]] for k in group], pad_id, device)
                fresh = RaggedCache(overallocated_cache(), masks)
                tokens = _greedy_next(model, fresh, *fresh.prefill(ids, mask))  # the new rows' own batch
                if rows:
                    batch.append_rows(fresh)
                    pending = torch.cat([pending, tokens])
                else:
                    batch, pending = fresh, tokens
                rows += [new[k] for k in group]
            batch.maybe_repack()
        else:
            positions = batch.lengths[:, None]
            allowed = torch.cat([batch.valid, batch.valid.new_ones(len(rows), 1)], dim=1)[:, None, None, :]
            keys = torch.cat([batch.entry_positions(), positions], dim=1)
            pending = _greedy_next(model, batch, pending[:, None], positions, masks(allowed, positions, keys))
            batch.append_column()
            first = 0
        # the one host read: what the rows emit, and which of them end
        ended = [False] * first
        for row, token in enumerate(pending[first:].tolist(), start=first):
            out[rows[row]].append(token)
            ended.append(token in eos or len(out[rows[row]]) >= max_new_tokens)
        if any(ended):
            keep = torch.tensor([r for r, e in enumerate(ended) if not e], dtype=torch.long, device=device)
            batch.select_rows(keep)
            rows, pending = [rows[k] for k in keep.tolist()], pending.index_select(0, keep)
            batch.maybe_repack()
    return out


def prefill_groups(prompts: list[list[int]], waste: float = PREFILL_WASTE) -> list[list[int]]:
    """The indices of ``prompts`` cut into prefill batches of similar length: by length, a batch closes before a
    prompt that would make more than ``waste`` of its tokens padding. (One prefill of 20 prompts of 100 to 850 tokens,
    padded to 850, took 87 s of a 347 s shard; docs/corpus.md.)"""
    groups: list[list[int]] = []
    real = 0
    for i in sorted(range(len(prompts)), key=lambda i: len(prompts[i])):
        n = len(prompts[i])
        if groups and (len(groups[-1]) + 1) * n <= (1 + waste) * (real + n):
            groups[-1].append(i)
            real += n
        else:
            groups.append([i])
            real = n
    return groups


def _greedy_next(model, batch: RaggedCache, fed, positions, mask) -> torch.Tensor:
    """One forward of ``fed`` into ``batch``'s cache; each row's argmax after its last fed token, ``(rows,)``."""
    logits = model(
        input_ids=fed,
        position_ids=positions,
        attention_mask=mask,
        past_key_values=batch.cache,
        use_cache=True,
        return_dict=True,
        **logits_to_keep(model, 1),
    ).logits
    return logits[:, -1].argmax(-1)
