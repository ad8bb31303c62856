"""README.md's "From Python" example runs and prints exactly what the Go
Example (example_test.go) prints."""

import contextlib
import io
import os
import re

from conftest import ROOT


def test_readme_example_matches_the_go_example():
    with open(os.path.join(ROOT, "README.md")) as f:
        readme = f.read()
    section = readme.split("## From Python", 1)[1].split("\n## ", 1)[0]
    code = re.search(r"```python\n(.*?)```", section, re.S).group(1)
    with open(os.path.join(ROOT, "example_test.go")) as f:
        go = f.read()
    want = [line.strip()[3:] for line in go.split("// Output:", 1)[1].splitlines() if line.strip().startswith("// ")]
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        exec(compile(code, "README.md", "exec"), {})
    assert out.getvalue().splitlines() == want
    assert len(want) == 3
