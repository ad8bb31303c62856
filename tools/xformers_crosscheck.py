#!/usr/bin/python3
"""Cross-check package ragged against xFormers' own attn_bias.py.

Run by hand (CI does not install torch), with Debian's python3-torch:

  apt-get install -y python3-torch
  /usr/bin/python3 tools/xformers_crosscheck.py --attn-bias PATH [--seed 1] [--count 400]

PATH is a copy of the maintained attn_bias.py, kept outside this repository:
since April 2026 xFormers' xformers/ops/fmha/attn_bias.py only re-exports
mslk.attention.fmha.attn_bias, whose source lives in github.com/meta-pytorch/MSLK
at mslk/attention/fmha/attn_bias.py (xFormers' last own copy, the parent of
its commit ca6d2aa0, works too). The file is loaded on its own: torch is the
only dependency, and the two names a Debian torch may lack (torch.mtia,
torch._dynamo) are stubbed.

With --configs FILE it compares the configurations of FILE (JSON lines in
the format tools/xformerscheck reads; --write-configs writes the random ones
in that format) instead. For every class of docs/masks.md the tool draws
--count random configurations
(mostly valid, some deliberately not: negative lengths, windows below 1,
block tables of the wrong shape, out-of-range page ids, padding shorter than a
sequence, ...), builds each with xFormers along one of its construction paths
(from_seqlens, make_causal, make_local_attention, make_paged, ...), and the
same with ragged through the Go program tools/xformerscheck (one `go run`, or
--go-bin). It then compares:

  - both accept: the materialised masks must be equal cell for cell
    (xFormers' materialize(shape).exp(), 1 = allowed);
  - xFormers rejects (any exception while building or materialising): ragged
    must reject too;
  - ragged rejects what xFormers accepts: allowed only for the documented
    cases where xFormers' Python slicing would silently produce a mask that is
    not one (negative lengths, negative page ids, gappy keys outside the key
    axis, a paged gappy block past its row of pages);
    each is counted under its reason. Any other is a failure.

It prints per class: configurations, agreed masks, agreed rejections,
documented stricter rejections, failures; and exits 1 on any failure.
"""

import argparse
import collections
import importlib.util
import json
import os
import random
import subprocess
import sys
import types


def load_attn_bias(path):
    import torch

    if not hasattr(torch, "mtia"):
        torch.mtia = types.SimpleNamespace(is_available=lambda: False)
    if not hasattr(torch, "_dynamo"):
        torch._dynamo = types.SimpleNamespace(allow_in_graph=lambda f: f)
    spec = importlib.util.spec_from_file_location("xformers_attn_bias_under_test", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return torch, mod


# ---------------------------------------------------------------------------
# random configurations


def lens(r, b, hi):
    return [r.randint(0, hi) for _ in range(b)]


def maybe_bad_len(r, xs):
    if xs and r.random() < 0.05:
        xs[r.randrange(len(xs))] = -r.randint(1, 3)
    return xs


def rand_block_tables(r, b, cols, n_pages):
    """Rows of page ids; unique within the batch most of the time."""
    if r.random() < 0.7 and n_pages >= b * cols:
        ids = r.sample(range(n_pages), b * cols)
    else:
        ids = [r.randrange(n_pages) for _ in range(b * cols)]
    bt = [ids[i * cols:(i + 1) * cols] for i in range(b)]
    u = r.random()
    if u < 0.03 and bt:
        bt[r.randrange(b)][r.randrange(cols)] = -r.randint(1, 5)  # negative page id
    elif u < 0.05:
        bt = bt + [[0] * cols]  # a row too many
    elif u < 0.07 and b > 1:
        bt = bt[:-1]  # a row too few
    return bt


HUGE = 10 ** 12


def gen(kind, r):
    """One configuration dict for kind (the JSON the Go program reads), with
    a window now and then far beyond any key (or far below)."""
    c = gen1(kind, r)
    for k in ("window_size", "window_left", "window_right"):
        if k in c and "local" in c.get("kind", "") and r.random() < 0.03:
            c[k] = r.choice([HUGE, -HUGE])
    return c


def gen1(kind, r):
    b = r.randint(1, 4) if r.random() > 0.03 else 0
    c = {"kind": kind, "op": "mask"}
    if kind in ("block_diagonal", "block_diagonal_causal", "block_diagonal_causal_from_bottomright",
                "block_diagonal_causal_local", "block_diagonal_causal_local_from_bottomright"):
        c["q_seqlen"] = lens(r, b, 6)
        c["kv_seqlen"] = [q if r.random() < 0.3 else r.randint(0, 7) for q in c["q_seqlen"]]
        maybe_bad_len(r, c["kv_seqlen"])
        if "local" in kind:
            c["window_size"] = r.randint(-1, 6)
        return c
    if kind in ("block_diagonal_padded_keys", "block_diagonal_causal_with_offset_padded_keys",
                "block_diagonal_local_padded_keys", "block_diagonal_causal_local_padded_keys"):
        pad = r.randint(0, 7)
        c["kv_padding"] = pad
        c["q_seqlen"] = maybe_bad_len(r, lens(r, b, 5))
        c["kv_seqlen"] = [min(k, pad) if r.random() < 0.9 else k for k in lens(r, b, 7)]
        if kind == "block_diagonal_local_padded_keys":
            c["window_left"], c["window_right"] = r.randint(-1, 5), r.randint(-1, 4)
        if kind == "block_diagonal_causal_local_padded_keys":
            c["window_size"] = r.randint(-1, 6)
        return c
    if kind.startswith("paged_block_diagonal") and "gappy" not in kind:
        ps, cols = r.randint(1, 4), r.randint(1, 3)
        c["q_seqlen"] = maybe_bad_len(r, lens(r, b, 4))
        c["kv_seqlen"] = [min(k, cols * ps) if r.random() < 0.9 else k for k in lens(r, b, cols * ps + 1)]
        c["block_tables"] = rand_block_tables(r, b, cols, r.randint(b * cols, b * cols + 4) if b else 3)
        c["page_size"] = ps if r.random() > 0.03 else 0
        if "local" in kind:
            c["window_size"] = r.randint(-1, 7)
        if r.random() < 0.5:
            # The same mask through make_paged of an unpaged padded mask.
            unpaged = {"paged_block_diagonal_padded_keys": r.choice(["block_diagonal_padded_keys",
                                                                     "block_diagonal_causal_with_offset_padded_keys"]),
                       "paged_block_diagonal_causal_with_offset_padded_keys": r.choice(["block_diagonal_padded_keys",
                                                                                        "block_diagonal_causal_with_offset_padded_keys"]),
                       "paged_block_diagonal_causal_local_padded_keys": "block_diagonal_causal_local_padded_keys"}[kind]
            if r.random() < 0.05:  # a paged_type whose constructor does not fit
                unpaged = r.choice(["block_diagonal_padded_keys", "block_diagonal_causal_with_offset_padded_keys",
                                    "block_diagonal_causal_local_padded_keys"])
            c = {"op": "make_paged", "kind": unpaged, "q_seqlen": c["q_seqlen"], "kv_seqlen": c["kv_seqlen"],
                 "kv_padding": max([1] + [k for k in c["kv_seqlen"]]),
                 "window_size": c.get("window_size", 1) if "local" in unpaged else 0,
                 "paged_kind": kind, "paged_block_tables": c["block_tables"], "paged_page_size": c["page_size"]}
        return c
    if kind in ("block_diagonal_gappy_keys", "block_diagonal_causal_with_offset_gappy_keys",
                "block_diagonal_local_from_bottomright_gappy_keys"):
        c["q_seqlen"] = maybe_bad_len(r, lens(r, b, 4))
        c["kv_seqlen"] = lens(r, b, 4)
        total = r.randint(0, 14)
        starts = []
        for k in c["kv_seqlen"]:
            s = r.randint(0, max(0, total - k)) if r.random() < 0.9 else r.randint(-2, total + 2)
            starts.append(s)
        c["kv_seqstarts"] = starts + [total]
        if r.random() < 0.03:
            c["kv_seqstarts"] = starts  # one start too few
        if "local" in kind:
            c["window_left"], c["window_right"] = r.randint(-2, 4), r.randint(-2, 4)
        return c
    if kind.startswith("paged_block_diagonal") and "gappy" in kind:
        # xFormers' from_seqlens of these classes always raises (see
        # docs/masks.md): build through make_paged of an unpaged gappy mask,
        # or by hand (op "mask"), which is what make_paged builds.
        ps, cols = r.randint(1, 4), r.randint(1, 3)
        row = ps * cols
        c["q_seqlen"] = maybe_bad_len(r, lens(r, b, 4))
        c["kv_seqlen"] = lens(r, b, row)
        offs = []
        for k in c["kv_seqlen"]:
            offs.append(r.randint(0, max(0, row - k)) if r.random() < 0.9 else r.randint(-1, row + 1))
        c["block_tables"] = rand_block_tables(r, b, cols, r.randint(b * cols, b * cols + 4) if b else 3)
        c["page_size"] = ps
        if r.random() < 0.5:
            c["kv_seqstarts"] = offs
            return c
        notional = ps * r.randint(1, 3) if r.random() > 0.05 else ps * 2 + 1
        starts = [o + i * notional for i, o in enumerate(offs)]
        total = max([notional * b] + [s + k for s, k in zip(starts, c["kv_seqlen"])])
        unpaged = r.choice(["block_diagonal_gappy_keys", "block_diagonal_causal_with_offset_gappy_keys",
                            "block_diagonal_local_from_bottomright_gappy_keys"])
        u = {"op": "make_paged", "kind": unpaged, "q_seqlen": c["q_seqlen"], "kv_seqlen": c["kv_seqlen"],
             "kv_seqstarts": starts + [total], "paged_kind": kind, "paged_block_tables": c["block_tables"],
             "paged_page_size": ps, "notional_padding": notional}
        if "local" in unpaged:
            u["window_left"], u["window_right"] = r.randint(0, 3), r.randint(0, 3)
        return u
    if kind in ("lower_triangular", "lower_triangular_from_bottomright", "lower_triangular_from_bottomright_local",
                "local_attention_from_bottomright"):
        c["q_seqlen"], c["kv_seqlen"] = [r.randint(0, 7)], [r.randint(0, 7)]
        if kind == "lower_triangular_from_bottomright_local":
            c["window_size"] = r.randint(-1, 6)
        if kind == "local_attention_from_bottomright":
            c["window_left"], c["window_right"] = r.randint(-1, 5), r.randint(-1, 5)
        return c
    if kind == "tensor_list":
        n = r.randint(1, 3) if r.random() > 0.03 else 0
        width = r.randint(1, 3) if r.random() > 0.05 else 0
        c = {"op": "tensor_list", "shapes": [[r.randint(0, 3) if r.random() < 0.1 else r.randint(1, 3),
                                            r.randint(0, 4), width] for _ in range(n)]}
        if c["shapes"] and r.random() < 0.05:
            c["shapes"][-1] = c["shapes"][-1][:2] + [width + 1]  # trailing dimensions differ
        if c["shapes"] and r.random() < 0.05:
            c["shapes"] = [s[:2] for s in c["shapes"]]  # [B, M] tensors
        return c
    raise KeyError(kind)


KINDS = [
    "block_diagonal", "block_diagonal_causal", "block_diagonal_causal_from_bottomright",
    "block_diagonal_causal_local", "block_diagonal_causal_local_from_bottomright",
    "block_diagonal_causal_with_offset_padded_keys", "block_diagonal_padded_keys",
    "block_diagonal_local_padded_keys", "block_diagonal_causal_local_padded_keys",
    "paged_block_diagonal_padded_keys", "paged_block_diagonal_causal_with_offset_padded_keys",
    "paged_block_diagonal_causal_local_padded_keys",
    "block_diagonal_gappy_keys", "block_diagonal_causal_with_offset_gappy_keys",
    "block_diagonal_local_from_bottomright_gappy_keys",
    "paged_block_diagonal_gappy_keys", "paged_block_diagonal_causal_with_offset_gappy_keys",
    "lower_triangular", "lower_triangular_from_bottomright", "lower_triangular_from_bottomright_local",
    "local_attention_from_bottomright", "tensor_list",
]

PAGED_CLASS = {
    "paged_block_diagonal_padded_keys": "PagedBlockDiagonalPaddedKeysMask",
    "paged_block_diagonal_causal_with_offset_padded_keys": "PagedBlockDiagonalCausalWithOffsetPaddedKeysMask",
    "paged_block_diagonal_causal_local_padded_keys": "PagedBlockDiagonalCausalLocalPaddedKeysMask",
    "paged_block_diagonal_gappy_keys": "PagedBlockDiagonalGappyKeysMask",
    "paged_block_diagonal_causal_with_offset_gappy_keys": "PagedBlockDiagonalCausalWithOffsetGappyKeysMask",
}

# ---------------------------------------------------------------------------
# xFormers side


def xformers_mask(torch, ab, c, r):
    """Build c with attn_bias.py and return (rows, cols, '0101...'); raises
    whatever xFormers raises."""
    cpu = torch.device("cpu")
    kind = c["kind"]
    q, kv = c.get("q_seqlen"), c.get("kv_seqlen")
    w, wl, wr = c.get("window_size", 0), c.get("window_left", 0), c.get("window_right", 0)
    pad, starts = c.get("kv_padding", 0), c.get("kv_seqstarts")

    def bt_tensor(rows):
        if not rows:
            return torch.zeros((0, 0), dtype=torch.int32)
        return torch.tensor(rows, dtype=torch.int32)

    if kind == "block_diagonal":
        m = ab.BlockDiagonalMask.from_seqlens(q, kv, device=cpu)
    elif kind == "block_diagonal_causal":
        m = (ab.BlockDiagonalCausalMask.from_seqlens(q, kv, device=cpu) if r.random() < 0.5
             else ab.BlockDiagonalMask.from_seqlens(q, kv, device=cpu).make_causal())
    elif kind == "block_diagonal_causal_from_bottomright":
        m = ab.BlockDiagonalMask.from_seqlens(q, kv, device=cpu).make_causal_from_bottomright()
    elif kind == "block_diagonal_causal_local":
        m = ab.BlockDiagonalCausalMask.from_seqlens(q, kv, device=cpu).make_local_attention(w)
    elif kind == "block_diagonal_causal_local_from_bottomright":
        m = ab.BlockDiagonalMask.from_seqlens(q, kv, device=cpu).make_local_attention_from_bottomright(w)
    elif kind == "block_diagonal_causal_with_offset_padded_keys":
        m = ab.BlockDiagonalCausalWithOffsetPaddedKeysMask.from_seqlens(q, pad, kv, device=cpu)
    elif kind == "block_diagonal_padded_keys":
        m = ab.BlockDiagonalPaddedKeysMask.from_seqlens(q, pad, kv, device=cpu)
    elif kind == "block_diagonal_local_padded_keys":
        if r.random() < 0.5:
            m = ab.BlockDiagonalLocalAttentionPaddedKeysMask.from_seqlens_local(q, pad, kv, wl, wr)
        else:
            m = ab.BlockDiagonalPaddedKeysMask.from_seqlens(q, pad, kv, device=cpu).make_local_attention(wl, wr)
    elif kind == "block_diagonal_causal_local_padded_keys":
        m = ab.BlockDiagonalCausalLocalAttentionPaddedKeysMask.from_seqlens_local(q, pad, kv, w)
    elif kind in ("paged_block_diagonal_padded_keys", "paged_block_diagonal_causal_with_offset_padded_keys"):
        m = getattr(ab, PAGED_CLASS[kind]).from_seqlens(q, kv, bt_tensor(c["block_tables"]), c["page_size"], device=cpu)
    elif kind == "paged_block_diagonal_causal_local_padded_keys":
        m = ab.PagedBlockDiagonalCausalLocalPaddedKeysMask.from_seqlens_local(
            q, kv, bt_tensor(c["block_tables"]), c["page_size"], w, device=cpu)
    elif kind == "block_diagonal_gappy_keys":
        m = ab.BlockDiagonalGappyKeysMask.from_seqlens(q, starts, kv, device=cpu)
    elif kind == "block_diagonal_causal_with_offset_gappy_keys":
        m = ab.BlockDiagonalCausalWithOffsetGappyKeysMask.from_seqlens(q, starts, kv, device=cpu)
    elif kind == "block_diagonal_local_from_bottomright_gappy_keys":
        m = ab.BlockDiagonalLocalAttentionFromBottomRightGappyKeysMask.from_seqlens_local_gappy(
            q, starts, kv, wl, wr, device=cpu)
    elif kind in ("paged_block_diagonal_gappy_keys", "paged_block_diagonal_causal_with_offset_gappy_keys"):
        # What make_paged builds, from per-sequence offsets.
        if len(q) != len(kv) or len(starts) != len(kv) or not kv:
            raise ValueError("lengths")
        qinfo = ab._SeqLenInfo.from_seqlens(q, device=cpu)
        sp = list(starts) + [-1]
        ends = [s + k for s, k in zip(starts, kv)]
        kinfo = ab._GappySeqInfo(seqstart=torch.tensor(sp, dtype=torch.int32), max_seqlen=max(kv),
                                 min_seqlen=min(kv), seqstart_py=sp,
                                 seqlen=torch.tensor(ends, dtype=torch.int32), seqlen_py=ends)
        bt = bt_tensor(c["block_tables"])
        row = bt.shape[1] * c["page_size"]
        if not all(0 <= s < row for s in starts) or max(kv) > row:  # make_paged's asserts
            raise AssertionError("make_paged asserts")
        m = getattr(ab, PAGED_CLASS[kind])(q_seqinfo=qinfo, k_seqinfo=kinfo, block_tables=bt, page_size=c["page_size"])
    elif kind == "lower_triangular":
        m = ab.LowerTriangularMask()
    elif kind == "lower_triangular_from_bottomright":
        m = ab.LowerTriangularFromBottomRightMask()
    elif kind == "lower_triangular_from_bottomright_local":
        m = (ab.LowerTriangularFromBottomRightLocalAttentionMask(w) if r.random() < 0.5
             else ab.LowerTriangularFromBottomRightMask().make_local_attention(w))
    elif kind == "local_attention_from_bottomright":
        m = ab.LocalAttentionFromBottomRightMask(window_left=wl, window_right=wr)
    else:
        raise KeyError(kind)

    if c.get("op") == "make_paged":
        bt = bt_tensor(c["paged_block_tables"])
        ptype = getattr(ab, PAGED_CLASS[c["paged_kind"]])
        if "gappy" in kind:
            m = m.make_paged(bt, c["paged_page_size"], c["notional_padding"], ptype)
        else:
            m = m.make_paged(bt, c["paged_page_size"], ptype)
        kind = c["paged_kind"]

    rows = sum(q)
    if kind.startswith("paged"):
        cols = len(q) * m.block_tables.shape[1] * m.page_size
    elif "padded" in kind:
        cols = len(q) * pad
    elif "gappy" in kind:
        cols = starts[-1]
    elif kind in ("lower_triangular", "lower_triangular_from_bottomright", "lower_triangular_from_bottomright_local",
                  "local_attention_from_bottomright"):
        rows, cols = q[0], kv[0]
        if rows < 0 or cols < 0:
            raise ValueError("negative shape")
    else:
        cols = sum(kv)
    d = m.materialize((rows, cols)).exp()
    flat = "".join("1" if v else "0" for v in (d.reshape(-1) > 0.5).tolist())
    return d.shape[-2], d.shape[-1], flat


def xformers_tensor_list(torch, ab, c):
    tensors, nxt = [], 0
    for shape in c["shapes"]:
        n = 1
        for s in shape:
            n *= s
        tensors.append(torch.arange(nxt, nxt + n).reshape(shape))
        nxt += n
    m, cat = ab.BlockDiagonalMask.from_tensor_list(tensors)
    rows = m.q_seqinfo.seqstart_py[-1]
    d = m.materialize((rows, rows)).exp()
    out = {"rows": rows, "cols": rows, "mask": "".join("1" if v else "0" for v in (d.reshape(-1) > 0.5).tolist()),
           "concat": cat.reshape(-1).tolist()}
    try:
        parts = m.split(cat)
        out["parts"] = [{"shape": list(p.shape), "data": p.reshape(-1).tolist()} for p in parts]
    except Exception as e:  # noqa: BLE001 - any torch error is a rejection
        out["split_error"] = repr(e)
    return out


# ---------------------------------------------------------------------------
# documented cases where ragged is stricter than xFormers


def stricter_reason(c):
    q, kv = c.get("q_seqlen") or [], c.get("kv_seqlen") or []
    if any(x < 0 for x in q + kv):
        return "negative length"
    if c.get("page_size", 1) < 0 or c.get("paged_page_size", 1) < 0:
        return "negative page size"
    starts = c.get("kv_seqstarts")
    kind = c["kind"]
    if starts is not None and "gappy" in kind and not kind.startswith("paged") and len(starts) == len(kv) + 1:
        if any(s < 0 or s + k > starts[-1] for s, k in zip(starts, kv)):
            return "gappy keys outside the key axis"
    bt = c.get("paged_block_tables") or c.get("block_tables")
    if bt and any(x < 0 for row in bt for x in row):
        return "negative page id"
    ps = c.get("paged_page_size") or c.get("page_size")
    if bt and ps:
        row = len(bt[0]) * ps
        offs = starts if kind.startswith("paged") else None
        if c.get("op") == "make_paged" and "gappy" in kind and starts:
            n = c["notional_padding"]
            offs = [s - i * n for i, s in enumerate(starts[:-1])]
        if offs and len(offs) == len(kv) and any(o + k > row for o, k in zip(offs, kv)):
            return "paged gappy block past its row of pages"
    return None


# ---------------------------------------------------------------------------


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--attn-bias", required=True, help="path of xFormers' (MSLK's) attn_bias.py")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--count", type=int, default=400, help="random configurations per class")
    ap.add_argument("--go-bin", help="a built tools/xformerscheck (default: go run ./tools/xformerscheck)")
    ap.add_argument("--kinds", help="comma-separated subset of classes")
    ap.add_argument("--configs", help="compare the configurations of this file (JSON lines, the format of "
                    "tools/xformerscheck, e.g. held-back ones; --write-configs makes such a file) instead of random ones")
    ap.add_argument("--write-configs", help="write the configurations compared to this file (JSON lines)")
    ap.add_argument("-v", "--verbose", action="store_true")
    args = ap.parse_args()

    torch, ab = load_attn_bias(args.attn_bias)
    kinds = args.kinds.split(",") if args.kinds else KINDS
    r = random.Random(args.seed)
    configs = []
    if args.configs:
        with open(args.configs) as f:
            for line in f:
                if line.strip():
                    c = json.loads(line)
                    c["id"] = len(configs)
                    c["_class"] = c.get("paged_kind") or c.get("kind") or c.get("op")
                    configs.append(c)
        kinds = list(dict.fromkeys(c["_class"] for c in configs))
    else:
        for kind in kinds:
            for _ in range(args.count):
                c = gen(kind, r)
                c["id"] = len(configs)
                c["_class"] = kind
                configs.append(c)
    if args.write_configs:
        with open(args.write_configs, "w") as f:
            for c in configs:
                f.write(json.dumps({k: v for k, v in c.items() if not k.startswith("_") and k != "id"}) + "\n")

    go_in = "\n".join(json.dumps({k: v for k, v in c.items() if not k.startswith("_")}) for c in configs) + "\n"
    repo = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    cmd = [args.go_bin] if args.go_bin else ["go", "run", "./tools/xformerscheck"]
    proc = subprocess.run(cmd, input=go_in, capture_output=True, text=True, cwd=repo, check=False)
    if proc.returncode != 0:
        sys.exit("xformerscheck failed: " + proc.stderr)
    go_out = {o["id"]: o for o in map(json.loads, proc.stdout.splitlines())}

    stats = collections.OrderedDict((k, collections.Counter()) for k in kinds)
    stricter = collections.Counter()
    failures = []
    for c in configs:
        st = stats[c["_class"]]
        st["configs"] += 1
        g = go_out[c["id"]]
        if c.get("op") == "tensor_list":
            try:
                x = xformers_tensor_list(torch, ab, c)
            except Exception as e:  # noqa: BLE001
                x = {"error": repr(e)}
            if "error" in x:
                if g["ok"]:
                    failures.append((c, "xFormers rejects (%s), ragged accepts" % x["error"]))
                else:
                    st["agreed rejections"] += 1
                continue
            if not g["ok"]:
                failures.append((c, "ragged rejects (%s), xFormers accepts" % g.get("error")))
                continue
            same = (g.get("mask", "") == x["mask"] and g["rows"] == x["rows"] and g.get("concat", []) == x["concat"])
            if ("split_error" in x) != ("split_error" in g):
                same = False
                why = "split: xFormers %s, ragged %s" % (x.get("split_error", "ok"), g.get("split_error", "ok"))
            elif "parts" in x and x["parts"] != g.get("parts"):
                same, why = False, "split parts differ"
            else:
                why = "mask or concatenation differs"
            if same:
                st["agreed masks"] += 1
                if "split_error" in x:
                    st["agreed split rejections"] += 1
            else:
                failures.append((c, why))
            continue
        try:
            rows, cols, flat = xformers_mask(torch, ab, c, r)
            xerr = None
        except Exception as e:  # noqa: BLE001 - any exception is a rejection
            xerr = "%s: %s" % (type(e).__name__, e)
        if xerr is not None:
            if g["ok"]:
                failures.append((c, "xFormers rejects (%s), ragged accepts" % xerr))
            else:
                st["agreed rejections"] += 1
            continue
        if not g["ok"]:
            reason = stricter_reason(c)
            if reason:
                st["documented stricter"] += 1
                stricter[reason] += 1
            else:
                failures.append((c, "ragged rejects (%s), xFormers accepts" % g["error"]))
            continue
        if (rows, cols) != (g["rows"], g["cols"]) or flat != g.get("mask", ""):
            failures.append((c, "masks differ: xFormers %dx%d %s, ragged %dx%d %s" % (
                rows, cols, flat, g["rows"], g["cols"], g.get("mask", ""))))
            continue
        st["agreed masks"] += 1

    fails = collections.Counter(c["_class"] for c, _ in failures)
    print("%-52s %7s %7s %9s %9s %6s" % ("class", "configs", "masks", "rejected", "stricter", "FAIL"))
    tot = collections.Counter()
    for kind, st in stats.items():
        print("%-52s %7d %7d %9d %9d %6d" % (kind, st["configs"], st["agreed masks"], st["agreed rejections"],
                                            st["documented stricter"], fails[kind]))
        tot.update(st)
    print("%-52s %7d %7d %9d %9d %6d" % ("total", tot["configs"], tot["agreed masks"], tot["agreed rejections"],
                                        tot["documented stricter"], len(failures)))
    for reason, n in stricter.items():
        print("  stricter than xFormers (documented): %s: %d" % (reason, n))
    for c, why in failures[:20 if not args.verbose else len(failures)]:
        print("FAIL", why, json.dumps(c))
    sys.exit(1 if failures else 0)


if __name__ == "__main__":
    main()
