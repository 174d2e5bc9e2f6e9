"""Token trees: many draft continuations verified in one target forward (tree attention).

A :class:`TokenTree` holds the *draft* nodes that hang below the **root**, the last committed token (the one
token the target has not processed yet, exactly like the last token of ``input_ids`` in HF's assisted
decoding). Node ``i`` has a token, a parent (``-1`` = the root, else an earlier node: nodes are in
topological order, ``parents[i] < i``) and a depth (root = 0, its children = 1, ...). When a proposer
*samples* its nodes it also records, per node, the draft distribution ``q`` the node was drawn from
(``draft_probs[i]``; see ``acceptance.py`` for how ``q`` is used and what ``None`` means).

The verification forward feeds ``[root, node_0, ..., node_{n-1}]`` after the ``P`` cached prefix tokens,
with position ids ``P + depth`` and a 4D mask in which each fed token sees the whole prefix, its
ancestors and itself (SpecInfer's tree attention, also used by CAPE, GLIDE (arXiv:2402.02082) §4.2, and PCT,
EDD (ACL 2025) §3.2). ``docs/tree-verification.md`` has a drawing.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from ..errors import SpecDecError

ROOT = -1  # parent index meaning "child of the root (the last committed token)"


def host_to_device(values: list, device: torch.device | str, dtype: torch.dtype = torch.long) -> torch.Tensor:
    """A host list (nested lists: a matrix) as a ``dtype`` tensor on ``device``, without the host waiting for the
    device: ``torch.tensor(values, device=cuda)`` copies from pageable memory, which first waits for everything
    queued on the stream; here a CUDA copy goes from pinned memory, asynchronously (the caching host allocator keeps
    the buffer until the copy is done). Elsewhere it is ``torch.tensor(values, dtype=dtype, device=device)``. The
    decoding loops put what the host decided (tree tokens and parents, kept offsets) on the device with it."""
    device = torch.device(device)
    if device.type != "cuda":
        return torch.tensor(values, dtype=dtype, device=device)
    pinned = torch.tensor(values, dtype=dtype, pin_memory=True)  # device: host-side, pinned for the copy
    return pinned.to(device, non_blocking=True)


@dataclass
class TokenTree:
    """Draft nodes below the root. ``tokens``/``parents`` are 1D long tensors of length ``n`` (or lists, which are
    checked on the host and put on ``device`` in one copy that does not wait for it: what the proposers pass, so
    building a tree reads nothing back from the device); ``draft_probs`` is ``None`` (deterministic drafts) or an
    ``(n, vocab)`` float tensor.

    The structure is also kept on the host (``parent_list``, ``depths``): the loop needs it to shape the
    verification forward, and keeping it avoids a device read per step. Tensors given by a caller are read once,
    to check them."""

    tokens: torch.Tensor
    parents: torch.Tensor
    draft_probs: torch.Tensor | None = None
    device: torch.device | str | None = None

    def __post_init__(self) -> None:
        if isinstance(self.tokens, torch.Tensor):
            device = self.tokens.device if self.device is None else self.device
        else:
            device = "cpu" if self.device is None else self.device
        self.device = torch.device(device)
        given_lists = not isinstance(self.tokens, torch.Tensor) and not isinstance(self.parents, torch.Tensor)
        if given_lists:
            token_list = [int(t) for t in self.tokens]
            self.parent_list = [int(p) for p in self.parents]
            both = host_to_device([token_list, self.parent_list], self.device)  # one copy for the two
            self.tokens, self.parents = both[0], both[1]
            self.token_list: list[int] | None = token_list
        else:
            self.tokens = torch.as_tensor(self.tokens, dtype=torch.long, device=self.device).reshape(-1)
            self.parents = torch.as_tensor(self.parents, dtype=torch.long, device=self.device).reshape(-1)
            self.parent_list = self.parents.tolist() if self.parents.dim() == 1 else []
            self.token_list = None
        self.validate()
        self.depths = _depths(self.parent_list)
        self._ancestors: torch.Tensor | None = None
        self._fed_depths: torch.Tensor | None = None

    # ----------------------------------------------------------------- builders
    @classmethod
    def empty(cls, device: torch.device | str = "cpu") -> TokenTree:
        """No draft: the verification forward is a plain decoding step."""
        return cls([], [], device=device)

    @classmethod
    def from_chain(cls, tokens, draft_probs: torch.Tensor | None = None, device=None) -> TokenTree:
        """A chain ``t_0 -> t_1 -> ...`` (classic speculative decoding) is the tree ``parents = [-1, 0, 1, ...]``."""
        if isinstance(tokens, torch.Tensor):
            tokens = tokens.reshape(-1)
            parents = torch.arange(-1, len(tokens) - 1, device=tokens.device)
            return cls(tokens, parents, draft_probs, device)
        tokens = [int(t) for t in tokens]
        return cls(tokens, list(range(ROOT, len(tokens) - 1)), draft_probs, device)

    @classmethod
    def from_additions(cls, additions, draft_probs: torch.Tensor | None = None, device=None) -> TokenTree:
        """Build from ``[(parent, token), ...]`` in insertion order (``parent`` = ``-1`` or an earlier index)."""
        additions = list(additions)
        return cls([int(t) for _, t in additions], [int(p) for p, _ in additions], draft_probs, device)

    # ----------------------------------------------------------------- queries
    def __len__(self) -> int:
        return len(self.parent_list)

    @property
    def max_depth(self) -> int:
        return max(self.depths, default=0)

    def children(self, node: int) -> list[int]:
        """Indices of the children of ``node`` (``-1`` = root), in node order (= the order they are tried)."""
        return [i for i, p in enumerate(self.parent_list) if p == node]

    def path(self, node: int) -> list[int]:
        """Node indices from the root's child down to ``node`` (empty for the root)."""
        out = []
        while node != ROOT:
            out.append(node)
            node = self.parent_list[node]
        return out[::-1]

    def validate(self) -> None:
        n = len(self.parent_list)
        if self.tokens.dim() != 1 or self.parents.shape != self.tokens.shape:
            raise SpecDecError(
                f"TokenTree needs 1D tokens and parents of equal length (got {tuple(self.tokens.shape)} "
                f"and {tuple(self.parents.shape)}); build it with TokenTree.from_chain/from_additions"
            )
        for i, p in enumerate(self.parent_list):
            if not ROOT <= p < i:
                raise SpecDecError(
                    f"TokenTree node {i} has parent {p}; parents must be -1 (the root) or an earlier node "
                    "index (nodes in topological order)"
                )
        lowest = min(self.token_list, default=0) if self.token_list is not None else None
        if n and (int(self.tokens.min()) if lowest is None else lowest) < 0:
            raise SpecDecError("TokenTree tokens must be non-negative token ids")
        if self.draft_probs is not None:
            q = self.draft_probs
            if q.dim() != 2 or q.shape[0] != n:
                raise SpecDecError(f"draft_probs must be (num_nodes={n}, vocab), got {tuple(q.shape)}")
            if n and bool((q.gather(1, self.tokens[:, None].to(q.device)) <= 0).any()):
                raise SpecDecError(
                    "draft_probs gives probability 0 to a node's own token: q must be the distribution the node "
                    "was actually sampled from"
                )

    def check_vocab(self, vocab_size: int) -> None:
        """Raise unless every drafted token id is below ``vocab_size`` (the target's vocabulary). Free for trees built
        from host lists; a tree built from tensors is read once here."""
        if not len(self):
            return
        highest = max(self.token_list) if self.token_list is not None else int(self.tokens.max())
        if highest >= vocab_size:
            raise SpecDecError(f"the proposer drafted a token id >= the target's vocabulary ({vocab_size})")

    def truncate_depth(self, max_depth: int) -> TokenTree:
        """Drop the nodes deeper than ``max_depth`` (their descendants go with them, order is kept)."""
        keep = [i for i, d in enumerate(self.depths) if d <= max_depth]
        return self if len(keep) == len(self) else self.subset(keep)

    def subset(self, keep: list[int]) -> TokenTree:
        """The nodes ``keep`` (increasing; every kept node's parent kept too), re-indexed in their order."""
        remap = {ROOT: ROOT, **{old: new for new, old in enumerate(keep)}}
        parents = [remap[self.parent_list[i]] for i in keep]
        # the kept rows are gathered on the device from tensors only
        tensors = self.draft_probs is not None or self.token_list is None
        idx = host_to_device(keep, self.device) if tensors else None
        probs = None if self.draft_probs is None else self.draft_probs[idx.to(self.draft_probs.device)]
        if self.token_list is not None:
            return TokenTree([self.token_list[i] for i in keep], parents, probs, self.device)
        return TokenTree(self.tokens[idx], host_to_device(parents, self.device), probs)

    # ----------------------------------------------------------------- verification inputs
    def flat_tokens(self, root_token: int | torch.Tensor) -> torch.Tensor:
        """``(1, 1 + n)`` input ids ``[root, node_0, ..., node_{n-1}]``."""
        root = torch.as_tensor(root_token, dtype=torch.long, device=self.device).reshape(1)
        return torch.cat([root, self.tokens])[None]

    def fed_depths(self) -> torch.Tensor:
        """``(1 + n,)`` long, on the tree's device: the depth of each fed token (0 for the root), counted on the device
        from :meth:`ancestor_mask` (a fed token is one deeper than its number of ancestors), so no host list is
        copied to the device. Built once per tree."""
        if self._fed_depths is None:
            if not len(self):
                self._fed_depths = torch.zeros(1, dtype=torch.long, device=self.device)
            else:
                self._fed_depths = self.ancestor_mask().sum(1) - 1
        return self._fed_depths

    def position_ids(self, prefix_length: int) -> torch.Tensor:
        """``(1, 1 + n)``: ``prefix_length + depth`` (the root sits at ``prefix_length``)."""
        return (prefix_length + self.fed_depths())[None]

    def ancestor_mask(self) -> torch.Tensor:
        """``(1 + n, 1 + n)`` boolean: entry ``[i, j]`` is True iff fed token ``j`` is ``i`` or an ancestor of it
        (index 0 is the root, node ``k`` is index ``k + 1``). Built once per tree, on its device."""
        if self._ancestors is not None:
            return self._ancestors
        n, device = len(self), self.device
        mask = torch.eye(n + 1, dtype=torch.bool, device=device)
        mask[:, 0] = True
        # one step up the tree per depth level (not per node): up[i] is the parent of fed token i, the root its own
        up = torch.cat([torch.zeros(1, dtype=torch.long, device=device), self.parents + 1])
        rows = torch.arange(n + 1, device=device)
        ancestor = rows
        for _ in range(self.max_depth - 1):
            ancestor = up[ancestor]
            mask[rows, ancestor] = True
        self._ancestors = mask
        return mask

    def attention_mask(self, prefix_length: int) -> torch.Tensor:
        """``(1, 1, 1 + n, prefix_length + 1 + n)`` boolean mask (True = may attend)."""
        tree = self.ancestor_mask()
        prefix = torch.ones(tree.shape[0], prefix_length, dtype=torch.bool, device=tree.device)
        return torch.cat([prefix, tree], dim=1)[None, None]


def additive_mask(mask: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """Boolean mask -> the additive float mask (0 = attend, dtype min = blocked).

    transformers 5.23 passes a custom 4D ``attention_mask`` through unchanged (``masking_utils``) to the
    attention function. SDPA accepts boolean or float masks, but the *eager* path computes
    ``scores + attention_mask``, which silently turns a boolean mask into +1/+0 biases; the float form is
    right for both (checked for Llama and GPT-2 in ``tests/test_tree_mask.py``).
    """
    out = torch.zeros(mask.shape, dtype=dtype, device=mask.device)
    return out.masked_fill_(~mask, torch.finfo(dtype).min)


def _depths(parents: list[int]) -> list[int]:
    depths: list[int] = []
    for p in parents:
        depths.append(1 if p == ROOT else depths[p] + 1)
    return depths
