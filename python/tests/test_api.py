"""The Python API a reviewer expects (issue 40): every public name has a
docstring, a real signature (not (*args, **kwargs): the locking decorator
keeps it) and type hints; useful reprs; __version__ and ABI_VERSION; the
"pagedkv" logger; dtype spellings; the empty prompt refused; busy_timeout;
and, where Debian's mypy is installed, mypy --strict on a typed example."""

import inspect
import logging
import os
import subprocess
import sys
import tempfile
import threading

import numpy as np
import pytest

import pagedkv
from conftest import HERE, PACKAGE_DIR

PUBLIC_CLASSES = [getattr(pagedkv, n) for n in pagedkv.__all__ if inspect.isclass(getattr(pagedkv, n))]


def public_members(cls):
    """cls's own public methods and properties (not object's, not numpy's)."""
    for name, v in vars(cls).items():
        if name.startswith("_"):
            continue
        if inspect.isfunction(v) or isinstance(v, property):
            yield name, v
    for base in cls.__mro__[1:]:
        if base.__module__ == "pagedkv":
            yield from public_members(base)


def test_every_public_name_has_a_docstring():
    import pagedkv.flashinfer as fi
    missing = []
    for mod in (pagedkv, fi):
        if not (mod.__doc__ or "").strip():
            missing.append(mod.__name__)
    for name in pagedkv.__all__:
        assert hasattr(pagedkv, name), name
    for cls in PUBLIC_CLASSES:
        if not (cls.__doc__ or "").strip():
            missing.append(cls.__name__)
        for name, v in public_members(cls):
            doc = (v.fget.__doc__ if isinstance(v, property) else v.__doc__) or ""
            if not doc.strip():
                missing.append("%s.%s" % (cls.__name__, name))
    for name in fi.__all__ if hasattr(fi, "__all__") else [n for n in vars(fi) if not n.startswith("_")]:
        v = getattr(fi, name)
        if inspect.isfunction(v) and v.__module__ == fi.__name__ and not (v.__doc__ or "").strip():
            missing.append("flashinfer." + name)
    assert not missing, "no docstring: %s" % ", ".join(missing)
    # Module-level values are documented in the module doc or by the attribute docstrings in the source.
    src = open(os.path.join(PACKAGE_DIR, "__init__.py")).read()
    for name in ("NO_TOKEN", "TO_HOST", "TO_DEVICE", "ABI_VERSION", "logger"):
        assert "\n%s" % name in src and '"""' in src.split("\n%s" % name, 1)[1].split("\n\n", 1)[0], name


def test_signatures_and_type_hints_survive_the_lock():
    sig = inspect.signature(pagedkv.Manager.add)
    assert list(sig.parameters) == ["self", "request_id", "prompt", "tenant", "lora", "salt", "priority", "no_cache",
                                    "capacity_tokens"]
    assert pagedkv.Manager.add.__name__ == "add" and "prefix cache" in pagedkv.Manager.add.__doc__
    untyped = []
    for cls in PUBLIC_CLASSES:
        if issubclass(cls, BaseException):
            continue
        for name, v in list(public_members(cls)) + [("__init__", vars(cls).get("__init__"))]:
            fn = v.fget if isinstance(v, property) else v
            if fn is None:
                continue
            sig = inspect.signature(fn)
            if any(p.kind in (p.VAR_POSITIONAL, p.VAR_KEYWORD) for p in sig.parameters.values()):
                untyped.append("%s.%s%s (a wrapper's signature)" % (cls.__name__, name, sig))
                continue
            params = [p for n, p in sig.parameters.items() if n != "self"]
            if any(p.annotation is p.empty for p in params) or (sig.return_annotation is sig.empty):
                untyped.append("%s.%s%s" % (cls.__name__, name, sig))
    assert not untyped, "untyped: %s" % "; ".join(untyped)
    assert os.path.exists(os.path.join(PACKAGE_DIR, "py.typed"))


def test_help_shows_the_signature():
    text = pydoc_text(pagedkv.Manager.reserve)
    assert "reserve(self, request_ids: 'Ints', ntokens: 'Ints') -> 'Plan'" in text, text


def pydoc_text(obj):
    import pydoc
    return pydoc.render_doc(obj, renderer=pydoc.plaintext)


def test_versions():
    assert isinstance(pagedkv.__version__, str) and pagedkv.__version__.count(".") == 2
    assert pagedkv.ABI_VERSION == pagedkv._lib.pagedkv_abi_version() == 3
    header = open(os.path.join(HERE, "..", "..", "cabi", "pagedkv.h")).read()
    assert "#define PAGEDKV_ABI_VERSION %d\n" % pagedkv.ABI_VERSION in header


def test_reprs():
    with pagedkv.Manager(16, 4, hash_seed=1) as m:
        m.add(1, [1, 2, 3, 4, 5])
        assert repr(m) == "<pagedkv.Manager %d: num_pages=16, page_size=4, requests=1, free_pages=16, step=0>" % m._id
        plan = m.reserve([1], [5])
        assert repr(plan) == ("<pagedkv.Plan of step 1: batch_size=1, nnz=5, pages=2, copies=0, window_left=-1, "
                              "cascade=None>")
        assert repr(plan.copy()).startswith("<pagedkv.Plan of owned copy: batch_size=1")
        m.commit([6])
        m.reserve([1], [1])
        assert repr(plan) == "<pagedkv.Plan of step 1, stale>"
    assert repr(m) == "<pagedkv.Manager %d: num_pages=16, page_size=4, closed>" % m._id
    h = pagedkv.HybridManager(16, 4, [pagedkv.LayerGroup("sliding", window_tokens=8), pagedkv.LayerGroup("full")])
    h.add(1, [1, 2, 3, 4, 5])
    assert repr(h).startswith("<pagedkv.HybridManager %d: num_pages=16, page_size=4, groups=['sliding', 'full'], "
                              "requests=1" % h._id)
    assert repr(h.reserve([1], [5])) == ("<pagedkv.HybridPlan of step 1: batch_size=1, copies=0, "
                                         "groups=[nnz=5 pages=2, nnz=5 pages=2]>")
    fmt = pagedkv.PageFormat(dtype=np.float16, num_kv_heads=1, head_dim=1, num_layers=2)
    assert repr(fmt) == ("PageFormat(kv_layout='NHD', dtype=<class 'numpy.float16'>, num_kv_heads=1, head_dim=1, "
                         "num_layers=2)")
    assert repr(pagedkv.Tiers(4)).startswith("Tiers(host_pages=4, format=None")


@pytest.mark.parametrize("dtype, nbytes", [
    ("f16", 2), ("float16", 2), ("half", 2), (np.float16, 2), (np.dtype("float16"), 2),
    ("f32", 4), ("float32", 4), (np.float32, 4), ("bf16", 2), ("bfloat16", 2),
    ("e4m3", 1), ("float8_e4m3fn", 1), ("e5m2", 1), ("float8_e5m2", 1),
])
def test_dtype_spellings(dtype, nbytes):
    fmt = pagedkv.PageFormat(dtype=dtype, num_kv_heads=1, head_dim=1, num_layers=1)
    with pagedkv.Manager(8, 4, tiers=pagedkv.Tiers(2, format=fmt)) as m:
        assert m.host_pages().shape == (2, 2 * 4 * nbytes)  # K and V of 4 tokens


def test_a_torch_like_dtype_and_a_bad_one():
    class TorchDtype:  # str(torch.float16) is "torch.float16"
        def __str__(self):
            return "torch.float16"
    fmt = pagedkv.PageFormat(dtype=TorchDtype(), num_kv_heads=1, head_dim=1, num_layers=1)
    pagedkv.Manager(8, 4, tiers=pagedkv.Tiers(2, format=fmt)).close()
    for bad in ("f64", np.float64, np.int8, 3, None):
        fmt = pagedkv.PageFormat(dtype=bad, num_kv_heads=1, head_dim=1, num_layers=1)
        with pytest.raises(pagedkv.BadArgument, match=r"tiers\.format\.dtype = .*, want one of bf16, bfloat16"):
            pagedkv.Manager(8, 4, tiers=pagedkv.Tiers(2, format=fmt))


def test_an_empty_prompt_is_refused():
    with pagedkv.Manager(8, 4) as m:
        for empty in ([], (), np.zeros(0, np.int32)):
            with pytest.raises(pagedkv.BadArgument) as e:
                m.add(7, empty)
            assert str(e.value) == ("pagedkv: bad argument: add: request 7: prompt is empty; a request needs at "
                                    "least one token")
            assert not m.has(7) and m.stats().requests == 0


def test_busy_timeout_waits_for_the_call_in_flight():
    m = pagedkv.Manager(8, 4)
    assert m.busy_timeout == 0
    held, go_on = threading.Event(), threading.Event()

    def hold():
        with m._lock:  # a call in flight on another thread
            held.set()
            go_on.wait()

    t = threading.Thread(target=hold)
    t.start()
    held.wait()
    with pytest.raises(pagedkv.Busy) as e:
        m.add(1, [1])
    assert str(e.value) == "pagedkv: add: Manager %d is in use by another thread" % m._id
    m.busy_timeout = 0.01
    with pytest.raises(pagedkv.Busy, match=r"in use by another thread \(waited busy_timeout = 0.01 s\)"):
        m.add(1, [1])
    assert m.stats().requests == 0  # lock-free, even now
    m.busy_timeout = None  # wait as long as it takes: the call runs once the other one ends
    done = []
    waiter = threading.Thread(target=lambda: done.append(m.add(1, [1])))
    waiter.start()
    go_on.set()
    waiter.join()
    t.join()
    assert done == [0] and m.has(1)
    for bad in (-1, "1", True, float("nan")):
        with pytest.raises(pagedkv.BadArgument, match="busy_timeout = "):
            m.busy_timeout = bad
        with pytest.raises(pagedkv.BadArgument, match="busy_timeout = "):
            pagedkv.HybridManager(8, 4, [pagedkv.LayerGroup("full")], busy_timeout=bad)
    assert pagedkv.Manager(8, 4, busy_timeout=2.5).busy_timeout == 2.5


def test_the_logger_warns_of_dropped_event_steps(caplog):
    m = pagedkv.Manager(32, 4, hash_seed=1, events=pagedkv.Events(queue_batches=1))
    for i in range(4):  # four steps' batches into a queue of one: the stream drops steps
        m.add(i + 1, [10 * i + j for j in range(1, 6)])
        m.reserve([i + 1], [5])
        m.commit([1])
    with caplog.at_level(logging.WARNING, logger="pagedkv"):
        m.drain_events()
    assert m.events_stats().dropped_steps > 0
    warned = [r.getMessage() for r in caplog.records if r.name == "pagedkv"]
    assert len(warned) == 1 and "KV event stream dropped" in warned[0] and "Manager %d" % m._id in warned[0], warned
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="pagedkv"):
        m.drain_events()  # nothing new dropped: no warning
    assert not [r for r in caplog.records if r.name == "pagedkv"]


def test_mypy_strict_on_a_typed_example(tmp_path):
    """mypy --strict on typed_example.py, which uses the package as an
    engine would: the hints are complete enough for strict checking (and
    a call with a wrong type is caught)."""
    try:
        import mypy  # noqa: F401
    except ImportError:
        if os.environ.get("CI") == "true":
            pytest.fail("mypy not importable: CI must install the Debian package python3-mypy")
        pytest.skip("mypy not importable (apt-get install python3-mypy)")
    example = os.path.join(HERE, "typed_example.py")
    bad = tmp_path / "bad.py"
    bad.write_text("import pagedkv\nm = pagedkv.Manager(8, 4)\nm.add('one', [1])\n")
    env = dict(os.environ)
    if os.path.basename(os.path.dirname(PACKAGE_DIR)) != "site-packages":  # mypy finds an installed one itself
        env["MYPYPATH"] = os.path.dirname(PACKAGE_DIR)
    # A cache shared by the runs on this machine (numpy's stubs are most of
    # the work: about 30 s the first time on a loaded 2-core machine, a few
    # seconds after).
    cache = os.path.join(tempfile.gettempdir(), "pagedkv-mypy-cache-%d" % os.getuid())
    cmd = [sys.executable, "-m", "mypy", "--strict", "--follow-imports=silent", "--cache-dir", cache,
           "--python-version", "%d.%d" % sys.version_info[:2]]
    p = subprocess.run(cmd + [example, str(bad)], env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                       universal_newlines=True)
    lines = [line for line in p.stdout.splitlines() if ": error:" in line]
    assert len(lines) == 1 and "bad.py:3:" in lines[0] and '"add" of "_Core" has incompatible type "str"' in lines[0], \
        p.stdout


def test_typed_example_runs():
    import typed_example
    assert typed_example.main() == "0 0 3 0.0 41 41 [31, -1] 32 %s" % pagedkv.__version__
    assert typed_example.state_model() == "2 slots, hit 12, 1 copies"
