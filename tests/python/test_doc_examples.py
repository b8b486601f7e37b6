"""The Python examples of README.md, docs/CHECKPOINTS.md and docs/PYTHON.md that are marked
`<!-- tested: ... -->` run as written (in a temporary directory, on the CPU without a GPU)."""
import os
import re

import pytest

from conftest import need

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
BLOCK = re.compile(r"<!-- tested:[^>]*-->\n```python\n(.*?)```", re.S)


def blocks():
    out = []
    for doc in ("README.md", "docs/CHECKPOINTS.md", "docs/PYTHON.md"):
        with open(os.path.join(ROOT, doc)) as f:
            for i, code in enumerate(BLOCK.findall(f.read())):
                out.append(pytest.param(code, id="%s#%d" % (os.path.basename(doc), i)))
    return out


def test_there_are_examples():
    assert len(blocks()) >= 3


@pytest.mark.parametrize("code", blocks())
def test_doc_example(tmp_path, monkeypatch, code):
    need("torch")
    monkeypatch.chdir(tmp_path)
    exec(compile(code, "doc-example", "exec"), {"__name__": "__doc_example__"})
