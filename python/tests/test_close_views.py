"""Views written after close() (issue 35): an engine's shutdown races its
own copies into pinned buffers, so a write into a numpy view the package
handed out may land after close(). That used to abort the whole process
with a Go "found pointer to free object" error: the views pointed into Go
memory that close() unpinned and the collector then freed and reused. Now
close() keeps that memory until the Manager object and its last view are
gone (pagedkv_destroy_keep_memory, then pagedkv_free_memory), so the
write changes memory nobody reads.

The writes run in a child process, so that an abort fails this test
instead of killing pytest. They write words that look like Go heap
pointers (the views' own addresses) into every kind of view: a plan's
arrays, a cascade's level arrays and query_rows, a view of a step that has
passed (its buffer has grown since), a HybridPlan's copies and its groups'
arrays (attn_* and cascade_window_left), tier_copies() and host_pages(),
while other managers allocate and collections run, and check that the
bytes written are still there (nothing else reused the memory)."""

import gc
import os
import subprocess
import sys
import weakref

import pagedkv

CHILD = r'''
import gc, sys
import numpy as np
import pagedkv

FORMAT = pagedkv.PageFormat(dtype="f32", num_kv_heads=4, head_dim=16, num_layers=2)  # 4 KiB a page of 4
# A hybrid of one-layer groups sharing the per-layer tensors: one layer a page.
SHARED = pagedkv.PageFormat(dtype="f32", num_kv_heads=4, head_dim=16, num_layers=1)


def arrays(plan):
    out = [("plan." + f, getattr(plan, f)) for f in ("copies", "drafts", "qo_indptr", "batch_indices", "positions",
                                                    "token_ids", "token_positions", "kv_indptr", "kv_page_indices",
                                                    "kv_last_page_len", "seq_lens")]
    if plan.cascade is not None:
        out.append(("plan.query_rows", plan.query_rows))
        out += [("level.%d.%s" % (i, f), getattr(lv, f)) for i, lv in enumerate(plan.cascade)
                for f in pagedkv.Level.__slots__]
    for f in ("cascade_window_left", "attn_qo_indptr", "attn_kv_indptr", "attn_kv_page_indices",
              "attn_kv_last_page_len", "attn_requests"):
        a = getattr(plan, f)
        if a is not None:
            out.append(("group." + f, a))
    return out


def views():
    """Every kind of view, of two managers, then closed."""
    out = []
    m = pagedkv.Manager(64, 4, hash_seed=1, tiers=pagedkv.Tiers(64, format=FORMAT, write_through=True))
    shared = list(range(100, 132))
    m.add(1, shared + [1])
    first = m.reserve([1], [33])
    out += [("passed." + k, v) for k, v in arrays(first) if k in ("plan.kv_page_indices", "plan.positions")]
    m.commit(None)
    c = m.tier_copies()  # write-through offloads, left in flight at shutdown
    assert len(c) == 8, len(c)
    out += [("tier_copies." + f, getattr(c, f)) for f in ("ids", "dirs", "device_pages", "host_pages")]
    for i in range(2, 6):
        m.add(i, shared + [i] * 5)
    plan = m.reserve([2, 3, 4, 5], [5, 5, 5, 5])  # a cascade; the first step's buffers grew
    assert plan.cascade is not None
    out += arrays(plan)
    out.append(("host_pages", m.host_pages()))

    groups = [pagedkv.LayerGroup("sliding", window_tokens=8), pagedkv.LayerGroup("chunked", chunk_tokens=8),
              pagedkv.LayerGroup("full")]
    h = pagedkv.HybridManager(64, 4, groups, hash_seed=1)
    h.add(1, list(range(50, 71)))
    h.reserve([1], [21])
    h.commit([5])
    h.fork(1, 2)  # both append to the shared partial page: a copy-on-write
    hp = h.reserve([1, 2], [1, 1])
    assert len(hp.copies), hp.copies
    out.append(("hybrid.copies", hp.copies))
    for g, gp in enumerate(hp.groups):
        out += [("%s of hybrid group %d" % (k, g), v) for k, v in arrays(gp)]
    m.close()
    h.close()
    return [(k, v) for k, v in out if v.size]


def churn():
    """Allocate through the library (Go objects with pointers) and collect."""
    for _ in range(3):  # about 30 MiB of Go heap a round: the collector runs
        x = pagedkv.HybridManager(16384, 4, [pagedkv.LayerGroup("full")] * 4, hash_seed=2,
                                  tiers=pagedkv.Tiers(256, format=SHARED))
        for i in range(1, 200):
            x.add(i, list(range(i, i + 30)))
        x.reserve(list(range(1, 200)), [30] * 199)
        x.commit(None)
        x.close()
        del x
        gc.collect()


vs = views()
kinds = sorted({k.split(".")[0] for k, _ in vs})
assert kinds == ["group", "host_pages", "hybrid", "level", "passed", "plan", "tier_copies"], kinds
written = []
for rnd in range(4):
    written = []
    for k, v in vs:
        b = v.reshape(-1).view(np.uint8)
        words = b[: b.size // 8 * 8].view(np.uint64)
        words[:] = v.__array_interface__["data"][0] + 8 * np.arange(words.size, dtype=np.uint64)  # heap-pointer look
        b[words.size * 8:] = 0x5A
        written.append(b.copy())
    churn()
for (k, v), w in zip(vs, written):
    assert (v.reshape(-1).view(np.uint8) == w).all(), "%s was reused after close()" % k
print("survived: %d views of %s" % (len(vs), ", ".join(kinds)))
'''


def test_writing_views_after_close_is_harmless():
    pkg = os.path.dirname(os.path.dirname(os.path.abspath(pagedkv.__file__)))
    env = dict(os.environ, PYTHONPATH=pkg + os.pathsep + os.environ.get("PYTHONPATH", ""))
    r = subprocess.run([sys.executable, "-c", CHILD], env=env, capture_output=True, text=True, timeout=120)
    tail = (r.stdout + r.stderr)[-3000:]
    assert r.returncode == 0, "the child died (exit %d) writing views after close():\n%s" % (r.returncode, tail)
    assert "survived" in r.stdout, tail


def test_close_keeps_memory_until_the_last_view():
    """The kept memory goes with the last reference: the Manager object is
    collected once its views are, not before."""
    m = pagedkv.Manager(16, 4, hash_seed=1, tiers=pagedkv.Tiers(4, format=pagedkv.PageFormat(
        dtype="f32", num_kv_heads=1, head_dim=1, num_layers=1)))
    m.add(1, [1, 2, 3, 4, 5])
    kv = m.reserve([1], [5]).kv_page_indices
    host = m.host_pages()
    m.close()
    alive = weakref.ref(m)
    del m
    gc.collect()
    assert alive() is not None, "the Manager (and its kept memory) went while views were alive"
    host[:] = 7
    kv[:] = 3
    assert (host == 7).all() and (kv == 3).all()
    del kv, host
    gc.collect()
    assert alive() is None, "the Manager outlived its last view"
    with pagedkv.Manager(16, 4) as m2:  # the library works on
        assert m2.add(1, [1, 2]) == 0
