"""What a drafter run reads: its training and validation rows (``hf-specdec train glide`` / ``train edd``).

Two kinds of row, for training (``--train-context``) and validation (``--eval-context``) alike:

- **packed**: the split's conversations concatenated and cut into ``--block-size`` blocks. Every token is used and
  every row has the same length, but a block starts wherever the stream falls, often mid-conversation, so the target
  state the drafter reads (and the target's own next token) comes from a cut context;
- **conversation**: one row per conversation from its first token, ``--train-length`` / ``--eval-length`` tokens at
  most: the context the drafter has when it decodes. Rows keep their own lengths; ``chat.stack_collator`` pads a
  batch on the right, and training batches are grouped by length (``train_sampling_strategy="group_by_length"``) so
  little of a batch is padding.

A conversation batch holds as many tokens as a packed one at most: ``--batch-size`` x ``--block-size`` tokens, that
is ``--batch-size x --block-size // length`` rows (:func:`rows_per_batch`); validation keeps two rows at least, for
the other-context control (``DrafterTrainer.evaluate``). Why whole conversations: docs/training.md, "Whole
conversations".

``--mix-corpus DIR`` (repeatable) trains on several corpora at once, e.g. the target's own answers with ShareGPT's
code-rich text: each gives an equal share of the run's rows (``--mix-skip-rows`` of each mixed split skipped first),
interleaved row by row with ``datasets.interleave_datasets``; a corpus that runs out starts over until the longest
has been seen once.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from hf_specdec.errors import SpecDecError


def whole_conversations(args, part: str = "eval") -> bool:
    """Whether ``part`` (``"eval"`` or ``"train"``) reads whole conversations (``--eval-context`` /
    ``--train-context conversation``); checks that part's length and, for training, that no feature store is used."""
    whole = getattr(args, f"{part}_context", "packed") == "conversation"
    length = getattr(args, f"{part}_length", None) if whole else None
    if whole and length < 2:
        raise SpecDecError(f"--{part}-length must be at least 2 tokens (got {length})")
    if whole and part == "train" and getattr(args, "features", None):
        raise SpecDecError(
            "--train-context conversation reads the target live; a feature store (--features) holds packed blocks. "
            "Drop one of the two"
        )
    return whole


def skipped_rows(args) -> int:
    """``--skip-train-rows``, checked: 0 or more, and not with a feature store (whose blocks are its own)."""
    skip = getattr(args, "skip_train_rows", 0) or 0
    if skip < 0:
        raise SpecDecError(f"--skip-train-rows must be 0 or more (got {skip})")
    if skip and getattr(args, "features", None):
        raise SpecDecError(
            "--skip-train-rows picks rows of --corpus or ShareGPT; a feature store (--features) holds its own "
            "blocks. Write the store from the rows you want instead"
        )
    return skip


def rows_per_batch(args, part: str = "eval") -> int:
    """Rows per batch and process: ``--batch-size`` packed blocks, or the whole conversations that hold as many
    tokens at most (one at least for training, two for validation)."""
    if not whole_conversations(args, part):
        return args.batch_size
    return max(
        1 if part == "train" else 2, args.batch_size * args.block_size // getattr(args, f"{part}_length")
    )


def eval_batch_size(args) -> int:
    """Validation rows per batch when ``--eval-batch-size`` is not given (:func:`rows_per_batch`)."""
    return rows_per_batch(args, "eval")


def mix_skipped_rows(args) -> int:
    """``--mix-skip-rows``, checked: 0 or more (:func:`skipped_rows`' twin for ``--mix-corpus``)."""
    skip = getattr(args, "mix_skip_rows", 0) or 0
    if skip < 0:
        raise SpecDecError(f"--mix-skip-rows must be 0 or more (got {skip})")
    return skip


def mixed_corpora(args) -> list[str]:
    """``--mix-corpus`` folders, checked: each a corpus folder, with ``--corpus`` given, and no feature store (and
    ``--mix-skip-rows``)."""
    mixes = list(getattr(args, "mix_corpus", None) or [])
    mix_skipped_rows(args)
    if not mixes:
        return mixes
    if not args.corpus:
        raise SpecDecError(
            "--mix-corpus mixes token corpora: give the first with --corpus too (ShareGPT as a corpus: "
            "`hf-specdec corpus --out DIR`)"
        )
    if getattr(args, "features", None):
        raise SpecDecError(
            "--mix-corpus picks rows of several corpora; a feature store (--features) holds its own blocks. "
            "Drop one of the two"
        )
    for mix in mixes:
        if not (Path(mix) / "corpus.json").is_file():
            raise SpecDecError(
                f"--mix-corpus {mix}: no corpus.json there; build one with `hf-specdec corpus --out {mix}`"
            )
    return mixes


def row_source(args, tokenizer, part: str, corpus: str | None = None) -> Callable:
    """``(split, limit) -> Dataset`` of ``part``'s rows (module docstring), from a corpus (``corpus``, else
    ``--corpus``; for validation ``--eval-corpus`` first) or ShareGPT tokenized now."""
    corpus = corpus or part_corpus(args, part)
    if whole_conversations(args, part):
        length = getattr(args, f"{part}_length")
        if corpus:
            from .tokenized import conversations_from_corpus

            return lambda split, limit: conversations_from_corpus(corpus, split, length, limit, tokenizer)
        from .chat import conversation_rows

        return lambda split, limit: conversation_rows(tokenizer, split, length, limit)
    if corpus:
        from .tokenized import packed_from_corpus

        return lambda split, limit: packed_from_corpus(corpus, split, args.block_size, limit, tokenizer)
    from .chat import packed_dataset

    return lambda split, limit: packed_dataset(tokenizer, split, args.block_size, limit=limit)


def part_corpus(args, part: str) -> str | None:
    """The corpus folder ``part``'s rows come from: ``--corpus``, for validation ``--eval-corpus`` first; None for
    ShareGPT tokenized now."""
    return (getattr(args, "eval_corpus", None) if part == "eval" else None) or args.corpus


def source_name(args, part: str) -> str:
    """Where ``part``'s rows come from, in words (the run's log)."""
    corpus = part_corpus(args, part)
    return f"corpus {corpus}" if corpus else "ShareGPT"


def describe_rows(args, part: str) -> str:
    """``part``'s rows in words (the run's log and the model card)."""
    skipped = skipped_rows(args) if part == "train" else 0
    skip = f", after the split's first {skipped} rows" if skipped else ""
    if whole_conversations(args, part):
        rows = f"whole conversations from their start, {getattr(args, f'{part}_length')} tokens at most{skip}"
    else:
        rows = f"packed blocks of {args.block_size} tokens{skip}"
    mixes = mixed_corpora(args) if part == "train" else []
    if mixes:
        from .tokenized import corpus_source

        mix_skip = mix_skipped_rows(args)
        after = f" after its first {mix_skip} rows" if mix_skip else ""
        named = "; ".join(f"the corpus folder {Path(m).name} ({corpus_source(m)}){after}" for m in mixes)
        rows += f"; interleaved row by row, in equal shares, with {named}"
    return rows


def validation_rows(args) -> str:
    """What the validation rows are, for the model card (and where from, with ``--eval-corpus``)."""
    if whole_conversations(args, "eval"):
        rows = f"held-out conversations, first {args.eval_length} tokens each"
    else:
        rows = f"held-out packed blocks of {args.block_size} tokens"
    from .tokenized import corpus_source, is_regenerated

    eval_corpus = getattr(args, "eval_corpus", None)
    if not eval_corpus:
        return rows
    source = corpus_source(eval_corpus)
    what = "the target's own answers" if is_regenerated(source) else source
    return f"{rows}, of corpus {Path(eval_corpus).name}'s validation split ({what})"


def validation_source(args) -> str:
    """Where the validation text comes from (the card's and ``eval_results.json``'s dataset): the source of
    ``--eval-corpus`` (or ``--corpus``), else ShareGPT."""
    from .tokenized import corpus_source

    corpus = part_corpus(args, "eval")
    return corpus_source(corpus) if corpus else "ShareGPT"


def training_blocks(args, tokenizer, processes: int = 1, with_train: bool = True):
    """``(train, validation)`` rows: from ``args.corpus`` when given, else tokenized from ShareGPT now; as many
    training rows as ``max_steps`` global batches take (``processes`` x :func:`rows_per_batch` x accumulation), after
    the split's first ``--skip-train-rows`` (continued training on unseen text), whole
    conversations with a ``length`` column for grouping; no training rows (None) without ``with_train``.
    Validation: ``--eval-blocks`` rows, or else the first that hold ``--eval-tokens`` supervised tokens."""
    train = None
    if with_train:
        n_train = args.max_steps * rows_per_batch(args, "train") * args.grad_accum * processes
        mixes = mixed_corpora(args)
        share = -(-n_train // (1 + len(mixes)))  # each corpus's rows: all of them, or an equal share in a mix
        train = _rows_after(
            row_source(args, tokenizer, "train"), skipped_rows(args), share, "--skip-train-rows"
        )
        if mixes:
            from datasets import interleave_datasets

            mix_skip = mix_skipped_rows(args)
            parts = [
                _rows_after(row_source(args, tokenizer, "train", mix), mix_skip, share, "--mix-skip-rows")
                for mix in mixes
            ]
            for mix, rows in zip(mixes, parts):
                print(f"corpus {mix}: {len(rows)} train rows to mix in")
            train = interleave_datasets([train, *parts], stopping_strategy="all_exhausted")
        if whole_conversations(args, "train"):
            train = train.add_column("length", [len(r) for r in train["input_ids"]])
        print(f"{source_name(args, 'train')}: {len(train)} train rows, {describe_rows(args, 'train')}")
        if len(train) < n_train:
            print(f"{len(train)} train rows for {n_train}: {n_train / len(train):.2f} epochs over them")
    held_out = row_source(args, tokenizer, "eval")
    eval_blocks = getattr(args, "eval_blocks", None)
    if eval_blocks:
        valid = held_out("validation", eval_blocks)
    else:
        size = args.eval_length if whole_conversations(args, "eval") else args.block_size
        valid = validation_blocks(held_out, getattr(args, "eval_tokens", 20000), size)
    print(f"{source_name(args, 'eval')}: {len(valid)} validation rows, {describe_rows(args, 'eval')}")
    return train, valid


def _rows_after(rows: Callable, skip: int, n: int, option: str):
    """The train split's ``n`` rows after its first ``skip`` (fewer if it holds fewer); ``option`` names the skip."""
    train = rows("train", skip + n)
    if not skip:
        return train
    if len(train) <= skip:
        raise SpecDecError(f"{option} {skip}: the train split holds only {len(train)} rows; skip fewer")
    return train.select(range(skip, len(train)))


def validation_blocks(blocks: Callable, tokens: int, block_size: int):
    """The first validation rows (``blocks("validation", limit)``) that hold at least ``tokens`` supervised tokens
    (labels other than -100), or all of them if the split holds fewer."""
    limit = max(1, -(-2 * tokens // block_size))
    while True:
        valid = blocks("validation", limit)
        seen = 0
        for i, labels in enumerate(valid["labels"]):
            seen += sum(1 for x in labels if x != -100)
            if seen >= tokens:
                return valid.select(range(i + 1))
        if len(valid) < limit:
            print(f"the validation split holds {seen} supervised tokens, fewer than --eval-tokens {tokens}")
            return valid
        limit *= 2


def train_tokens(args, train, steps: int, processes: int) -> int:
    """Tokens the run trained on: rows seen x their length (packed), or x the mean row length (conversations)."""
    rows = steps * rows_per_batch(args, "train") * args.grad_accum * processes
    if train is None or not whole_conversations(args, "train"):
        return rows * args.block_size
    lengths = train["length"]
    return round(rows * sum(lengths) / max(len(lengths), 1))
