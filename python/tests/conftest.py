"""Shared helpers of the pagedkv Python tests.

Which pagedkv they test: the package in $PAGEDKV_PYTHON_DIR when set (an
older wrapper, to show a test fails on it); else the source tree's
python/pagedkv when it can find a library ($PAGEDKV_LIB,
python/pagedkv/libpagedkv.so, or build/cabi/libpagedkv.so after
scripts/cabi.sh); else an installed pagedkv (pip install of the wheel),
so the suite runs unchanged against the installed package. pytest's
header names the one under test.
"""

import importlib.util
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.abspath(os.path.join(HERE, "..", ".."))


def _package_dir():
    """The folder to import pagedkv from, or None for the installed one."""
    if os.environ.get("PAGEDKV_PYTHON_DIR"):
        return os.environ["PAGEDKV_PYTHON_DIR"]
    src = os.path.join(ROOT, "python")
    libs = [os.path.join(src, "pagedkv", "libpagedkv.so"), os.path.join(ROOT, "build", "cabi", "libpagedkv.so")]
    if os.environ.get("PAGEDKV_LIB") or any(os.path.exists(p) for p in libs):
        return src
    if importlib.util.find_spec("pagedkv") is not None:
        return None
    return src  # nothing installed either: the import fails naming the paths tried


_dir = _package_dir()
if _dir is not None:
    sys.path.insert(0, _dir)
sys.path.insert(0, os.path.join(ROOT, "tools"))

import pytest  # noqa: E402

import pagedkv  # noqa: E402

PACKAGE_DIR = os.path.dirname(os.path.abspath(pagedkv.__file__))


def pytest_report_header(config):
    return "pagedkv under test: %s (library %s)" % (PACKAGE_DIR, pagedkv._lib._name)


def snapshot(m, ids, plan=None):
    """Everything observable about m (and plan's arrays): equal snapshots
    before and after a failed call mean it changed nothing."""
    reqs = {}
    for rid in ids:
        try:
            st = m.request_state(rid)
        except pagedkv.UnknownRequest:
            continue
        reqs[rid] = (st._key(), m.tokens(rid).tolist(), m.pages(rid).tolist())
    s = dict(stats=m.stats().as_dict(), pending=m.pending, requests=reqs)
    if plan is not None:
        s["plan"] = plan_values(plan)
    return s


def plan_values(plan):
    out = {name: getattr(plan, name).tolist() for name in (
        "copies", "drafts", "qo_indptr", "batch_indices", "positions", "token_ids", "token_positions", "kv_indptr",
        "kv_page_indices", "kv_last_page_len", "seq_lens")}
    out["window_left"] = plan.window_left
    if plan.cascade is not None:
        out["query_rows"] = plan.query_rows.tolist()
        out["cascade"] = [{f: getattr(lv, f).tolist() for f in pagedkv.Level.__slots__} for lv in plan.cascade]
    return out


def zero_ts(payload):
    """A KV event batch's payload with its timestamp (the float64 at
    offset 2 of [ts, events, rank]) zeroed, as the Go traces record them."""
    assert payload[:2] == b"\x93\xcb", payload[:16]
    return payload[:2] + bytes(8) + payload[10:]


@pytest.fixture
def root():
    return ROOT


@pytest.fixture
def redis_addr(tmp_path):
    """A real redis-server on a free loopback port, empty, stopped after the
    test (as internal/redistest does for Go). Skips when redis-server is
    missing, except under CI=true, where CI must install it."""
    import shutil
    import socket
    import subprocess
    import time

    binary = shutil.which("redis-server") or next(
        (p for p in ("/usr/bin/redis-server", "/usr/local/bin/redis-server") if os.path.exists(p)), None)
    if binary is None:
        if os.environ.get("CI") == "true":
            pytest.fail("redis-server not found: CI must install the Debian package redis-server")
        pytest.skip("redis-server not found (install the Debian package redis-server)")
    for _ in range(5):  # the free port may be taken between the probe and the bind
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        proc = subprocess.Popen([binary, "--port", str(port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no",
                                 "--protected-mode", "no", "--loglevel", "warning"], cwd=tmp_path,
                                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline and proc.poll() is None:
            try:
                with socket.create_connection(("127.0.0.1", port), timeout=1) as c:
                    c.sendall(b"PING\r\n")
                    if c.recv(16).startswith(b"+PONG"):
                        break
            except OSError:
                time.sleep(0.01)
        else:
            proc.kill()
            proc.wait()
            continue
        try:
            yield "127.0.0.1:%d" % port
        finally:
            proc.kill()
            proc.wait()
        return
    pytest.fail("could not start redis-server")
