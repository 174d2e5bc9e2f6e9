"""The bench filter of the regenerated corpus (``hf-specdec corpus --regenerate``): no bench prompt enters it.

A ShareGPT conversation is dropped, before anything is generated, when any of its messages (user or assistant) holds
any 13-word window of a bench task's prompt or source text (words: lower-cased ``\\w+`` runs, so whitespace, case and
punctuation do not matter), or the whole of a bench text of 8 to 12 words; a bench text of fewer than 8 words
(MT-Bench second turns such as "Can you parallelize it?") drops only a message that is exactly that text. The bench
texts are every row of the five tasks (mt-bench, humaneval, code-edit, summarize, text-edit: their ``prompt`` and
``source``) and MT-Bench's second turns. docs/corpus.md has the counts.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Iterator

NGRAM = 13  # the window of the bench filter (GPT-3's decontamination n-gram)
MIN_CONTAINED_WORDS = 8  # a shorter bench text only matches a whole message


def _words(text: str) -> tuple[str, ...]:
    return tuple(re.findall(r"\w+", text.lower()))


# the tasks a training conversation may not overlap; long-edit is left out: its rows are the installed Python's
# standard library, which no training corpus of ours reads, and they differ between Python versions
FILTERED_TASKS = ("mt-bench", "humaneval", "code-edit", "summarize", "text-edit")


def bench_texts() -> list[str]:
    """Every filtered bench task's prompt and source texts (all rows of :data:`FILTERED_TASKS`) and MT-Bench's
    second turns."""
    from hf_specdec.tasks import _mt_bench_questions, load_task

    texts = []
    for name in FILTERED_TASKS:
        task = load_task(name)
        texts += list(task["prompt"]) + list(task["source"])
    texts += [turn for q in _mt_bench_questions() for turn in q["turns"]]
    return list(dict.fromkeys(texts))


class BenchFilter:
    """Tells whether a text overlaps a bench text (the rule in the module docstring)."""

    def __init__(self, texts: Iterable[str]):
        self.windows: dict[int, set[tuple[str, ...]]] = {}  # window length -> bench windows of that length
        self.whole: set[tuple[str, ...]] = set()  # short bench texts: matched as a whole message
        self.count = 0
        for text in texts:
            words = _words(text)
            self.count += 1
            if len(words) >= NGRAM:
                self.windows.setdefault(NGRAM, set()).update(
                    words[i : i + NGRAM] for i in range(len(words) - NGRAM + 1)
                )
            elif len(words) >= MIN_CONTAINED_WORDS:
                self.windows.setdefault(len(words), set()).add(words)
            elif words:
                self.whole.add(words)

    def overlaps(self, text: str) -> bool:
        words = _words(text)
        if words in self.whole:
            return True
        for n, windows in self.windows.items():
            if any(words[i : i + n] in windows for i in range(len(words) - n + 1)):
                return True
        return False

    def conversation_overlaps(self, messages: list[dict]) -> bool:
        return any(self.overlaps(m["content"]) for m in messages)

    def describe(self) -> dict:
        return {
            "rule": f"a conversation is dropped when any message holds a {NGRAM}-word window of a bench text, the "
            f"whole of a bench text of {MIN_CONTAINED_WORDS}-{NGRAM - 1} words, or is exactly a shorter bench text "
            "(words: lower-cased \\w+ runs)",
            "tasks": [*FILTERED_TASKS, "mt-bench turn 2"],
            "bench_texts": self.count,
        }


def _sharegpt_items(split: str) -> Iterator[tuple[str, list[dict]]]:
    """The prompts' source (a test plants its own conversations here)."""
    from hf_specdec.tasks import sharegpt_items

    return sharegpt_items(split)


def clean_items(
    split: str, bench: BenchFilter, stats: dict | None = None
) -> Iterator[tuple[str, list[dict]]]:
    """ShareGPT's ``(id, messages)`` of ``split`` without those overlapping the bench (counted in ``stats``)."""
    for cid, messages in _sharegpt_items(split):
        if bench.conversation_overlaps(messages):
            if stats is not None:
                stats["dropped_bench_overlap"] = stats.get("dropped_bench_overlap", 0) + 1
            continue
        yield cid, messages
