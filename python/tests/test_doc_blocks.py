"""Every ```python block of the docs that describe the package runs
(README.md, python/README*, docs/c-abi.md, docs/python.md), each in a
fresh namespace, so the docs cannot drift from the code; a block followed
by a line "prints" and a plain ``` block must print exactly that."""

import contextlib
import glob
import io
import os
import re

import pytest

from conftest import ROOT

DOCS = ["README.md", "docs/c-abi.md", "docs/python.md"] + sorted(
    os.path.relpath(p, ROOT) for p in glob.glob(os.path.join(ROOT, "python", "README*")))

BLOCK = re.compile(r"^```python\n(.*?)^```\n(?:\nprints\n\n```\n(.*?)^```\n)?", re.S | re.M)


def blocks():
    out = []
    for doc in DOCS:
        with open(os.path.join(ROOT, doc)) as f:
            text = f.read()
        for m in BLOCK.finditer(text):
            line = text.count("\n", 0, m.start()) + 1
            out.append(pytest.param(doc, line, m.group(1), m.group(2), id="%s:%d" % (doc, line)))
    return out


BLOCKS = blocks()


def test_the_docs_have_python_blocks():
    docs = {p.values[0] for p in BLOCKS}
    assert {"README.md", "docs/python.md"} <= docs, docs
    assert len(BLOCKS) >= 4


@pytest.mark.parametrize("doc, line, code, printed", BLOCKS)
def test_doc_block_runs(doc, line, code, printed, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        exec(compile(code, "%s:%d" % (doc, line), "exec"), {"__name__": "__doc_block__"})
    if printed is not None:
        assert out.getvalue() == printed, "%s:%d printed %r" % (doc, line, out.getvalue())
