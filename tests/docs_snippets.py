"""The code blocks of docs/ pages that tests run as written: a block is marked by the line
``<!-- tested: <test id> -->`` right above its fence."""

import os
import re

DOCS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "docs")


def block(page: str, test_name: str) -> str:
    """The fenced block of ``docs/<page>`` marked for ``test_name`` (its text, without the fences)."""
    with open(os.path.join(DOCS, page)) as f:
        text = f.read()
    match = re.search(r"<!-- tested: [^>]*" + re.escape(test_name) + r" -->\n```[a-z]*\n(.*?)```", text, re.S)
    assert match, f"docs/{page} has no block marked for {test_name}"
    return match.group(1)
