"""The verification core every method shares.

- ``tree.py``: :class:`TokenTree`, tree positions and the 4D tree mask (SpecInfer's tree attention);
- ``acceptance.py``: which drafted tokens are accepted (greedy match, lossless tree speculative sampling);
- ``kv_cache.py``: compacting the target's KV cache to the accepted path (``PackedCache``: a batch of one's layout);
- ``ragged_cache.py``: a batch's KV cache, rows accepting their own counts; ``batch_decoding.py``: what only a batch
  needs (checks, the depth that pays for every row, the output layout);
- ``generate_io.py``: what a ``custom_generate`` loop takes from ``generate`` and hands back (input checks, cache
  set-up, stopping, streamer, EOS ids, appending tokens, output assembly);
- ``tree_decoding.py``: the tree decoding loop (``tree_generate``), one for every batch size, with a pluggable
  :class:`TreeProposer` (``proposer.py``); ``refill.py``: continuous batching in that loop (rows join a running
  batch as others end); ``gather.py``: a forward's hidden states and attentions at the rows a step kept;
- ``chain_drafting.py``: gamma's one default, the drafters' chain length;
- ``assisted.py``: the hooks into transformers' assisted loop (an hf_specdec drafter as ``assistant_model`` runs the
  tree loop; its private names: ``hf_specdec/hf_compat.py``);
- ``verify_cost.py``: the measured cost of a verification forward; ``timing.py``: device-correct timing;
  ``stats.py``: tau, alpha and timings;
- ``lossless.py``: comparing an output with plain greedy decoding;
- ``batch_io.py``: left-padded batches of token-id prompts for a batched ``generate`` and its rows back.
"""
