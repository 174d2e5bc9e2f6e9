"""Attribution of copied spans (PLD+, arXiv:2412.01447, App. D): where in the context each accepted copy came from."""

from __future__ import annotations

from dataclasses import dataclass

from transformers.generation.utils import GenerateDecoderOnlyOutput


@dataclass(frozen=True)
class CopiedSpan:
    """``length`` accepted output tokens at ``output_start`` were drafted from the context at ``source_start``.

    Both positions index ``sequences[0]`` (prompt included), so the span's text is
    ``sequences[0, output_start : output_start + length]`` and its source is
    ``sequences[0, source_start : source_start + length]``.
    """

    output_start: int
    source_start: int
    length: int


@dataclass
class PLDPlusGenerateOutput(GenerateDecoderOnlyOutput):
    """``GenerateDecoderOnlyOutput`` plus ``attribution``: the :class:`CopiedSpan` list (PLD+, arXiv:2412.01447, App. D)."""

    attribution: list[CopiedSpan] | None = None


def merge_spans(spans: list[CopiedSpan]) -> list[CopiedSpan]:
    """Join consecutive spans that continue the same source (a long copy verified over several steps)."""
    merged: list[CopiedSpan] = []
    for span in spans:
        if merged:
            last = merged[-1]
            if (
                span.output_start == last.output_start + last.length
                and span.source_start == last.source_start + last.length
            ):
                merged[-1] = CopiedSpan(last.output_start, last.source_start, last.length + span.length)
                continue
        merged.append(span)
    return merged
