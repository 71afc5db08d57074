"""Every Python snippet of the documentation (docs/*.md and README.md) runs as written, each in a fresh
interpreter in an empty directory: a snippet that stops working fails CI. A block that is a fragment (it uses
names the page defines in prose, or starts processes) is marked ``<!-- not run: <why> -->`` right above its fence
and skipped with that reason. Bash blocks that tests run as written are marked ``<!-- tested: <test> -->``
(tests/docs_snippets.py)."""

import glob
import os
import re
import subprocess
import sys

import pytest

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..")
_BLOCK = re.compile(r"(?:<!-- (not run|tested): ([^>]*) -->\n)?```python\n(.*?)```", re.S)


def _snippets():
    pages = sorted(glob.glob(os.path.join(ROOT, "docs", "*.md"))) + [os.path.join(ROOT, "README.md")]
    for page in pages:
        with open(page) as f:
            text = f.read()
        for i, m in enumerate(_BLOCK.finditer(text)):
            name = f"{os.path.relpath(page, ROOT)}#{i + 1}"
            marks = [pytest.mark.skip(reason=f"fragment: {m.group(2)}")] if m.group(1) == "not run" else []
            yield pytest.param(m.group(3), id=name, marks=marks)


@pytest.mark.parametrize("code", list(_snippets()))
def test_python_snippet_runs(code, tmp_path):
    env = dict(os.environ, HF_HUB_OFFLINE="1", PYTHONWARNINGS="ignore")
    proc = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, env=env, capture_output=True, text=True,
                          timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]


def test_every_page_is_in_the_site():
    """docs/index.md's tables of contents list every page (Sphinx warns, and `make docs` fails, otherwise)."""
    with open(os.path.join(ROOT, "docs", "index.md")) as f:
        index = f.read()
    pages = {os.path.splitext(os.path.basename(p))[0] for p in glob.glob(os.path.join(ROOT, "docs", "*.md"))}
    listed = set(re.findall(r"^([A-Za-z_]+)$", index, re.M))
    assert pages - {"index"} <= listed, pages - listed
