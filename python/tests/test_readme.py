"""README.md's Python examples run and print exactly what their Go
examples print: "From Python" what Example (example_test.go) prints,
"Hybrid models from Python" what ExampleHybridManager
(example_hybrid_test.go) prints. "Tiers and KV events from Python" runs
too."""

import contextlib
import io
import os
import re

from conftest import ROOT


def go_output(path, example):
    """The // Output: lines of func example in the Go file path."""
    with open(os.path.join(ROOT, path)) as f:
        go = f.read()
    body = go.split("func %s() {" % example, 1)[1].split("\n}\n", 1)[0]
    return [line.strip()[3:] for line in body.split("// Output:", 1)[1].splitlines() if line.strip().startswith("// ")]


def run_readme_example(heading):
    with open(os.path.join(ROOT, "README.md")) as f:
        readme = f.read()
    section = readme.split("\n%s\n" % heading, 1)[1].split("\n## ", 1)[0].split("\n### ", 1)[0]
    code = re.search(r"```python\n(.*?)```", section, re.S).group(1)
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        exec(compile(code, "README.md", "exec"), {})
    return out.getvalue().splitlines()


def test_readme_example_matches_the_go_example():
    want = go_output("example_test.go", "Example")
    assert run_readme_example("## From Python") == want
    assert len(want) == 3


def test_readme_hybrid_example_matches_the_go_example():
    want = go_output("example_hybrid_test.go", "ExampleHybridManager")
    assert run_readme_example("### Hybrid models from Python") == want
    assert len(want) == 5


def test_readme_tier_example_runs():
    assert run_readme_example("### Tiers and KV events from Python") == [
        "offloaded 3 host hashes 3", "matched 32", "event batches 2"]
