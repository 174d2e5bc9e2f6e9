"""README.md stays a newcomer's page: at most 150 lines, its Python snippets run as written; docs/layout.md's list of
import layers is the one ``tests/test_layout.py`` enforces.

The snippets run in order in one namespace, in a fresh interpreter started from the repository root (where the
README's paths to the shipped drafters point), with one torch thread: on a shared 2-core CPU that is the faster
setting, as ``conftest.one_thread`` says. A failing snippet's traceback names its line in README.md.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from .test_layout import LAYERS

ROOT = Path(__file__).resolve().parent.parent
README = ROOT / "README.md"
LAYOUT = ROOT / "docs" / "layout.md"
MAX_LINES = 150

# Runs the snippets read from stdin as [[first line, code], ...]; each is compiled padded to its place in README.md.
DRIVER = """
import json, sys
namespace = {"__name__": "__main__"}
for line, code in json.load(sys.stdin):
    exec(compile("\\n" * (line - 1) + code, "README.md", "exec"), namespace)
"""


def python_snippets(text: str) -> list[tuple[int, str]]:
    """``(line of its first code line, code)`` of every fenced ```python block of ``text``, in order."""
    return [
        (text.count("\n", 0, match.start(1)) + 1, match.group(1))
        for match in re.finditer(r"^```python\n(.*?)^```", text, re.S | re.M)
    ]


def layout_items(text: str) -> list[str]:
    """The numbered items of the ``## Import layers`` section of docs/layout.md."""
    section = text.split("\n## Import layers\n", 1)[1].split("\n## ", 1)[0]
    return re.split(r"^\d+\. ", section, flags=re.M)[1:]


def short_name(module: str) -> str:
    """``hf_specdec.core`` -> ``core``; the package itself keeps its name."""
    return module if module == "hf_specdec" else module.removeprefix("hf_specdec.")


def test_readme_is_at_most_150_lines():
    lines = len(README.read_text().splitlines())
    assert lines <= MAX_LINES, f"README.md has {lines} lines (at most {MAX_LINES}): move details to docs/"


def test_snippets_are_found_with_their_lines():
    text = "intro\n```python\na = 1\n```\ntext\n```bash\nls\n```\n```python\nb = a\n```\n"
    assert python_snippets(text) == [(3, "a = 1\n"), (10, "b = a\n")]
    assert len(python_snippets(README.read_text())) >= 5  # one per method


def test_layout_doc_lists_the_layers_of_the_import_test():
    items = layout_items(LAYOUT.read_text())
    assert len(items) == len(LAYERS), (
        f"docs/layout.md's import layers are {len(items)}, tests/test_layout.py's {len(LAYERS)}"
    )
    everything = {short_name(m) for _, modules in LAYERS for m in modules}
    for number, (item, (name, modules)) in enumerate(zip(items, LAYERS), 1):
        named = set(re.findall(r"`([\w.]+)`", item)) & everything
        assert named == {short_name(m) for m in modules}, f"docs/layout.md layer {number} is not {name!r}"


@pytest.mark.real
def test_readme_snippets_run_as_written():
    snippets = python_snippets(README.read_text())
    env = dict(os.environ, OMP_NUM_THREADS="1", HF_HUB_OFFLINE="1")
    done = subprocess.run(
        [sys.executable, "-c", DRIVER],
        input=json.dumps(snippets),
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode == 0, f"a README snippet failed:\n{done.stderr[-4000:]}"
