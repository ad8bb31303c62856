#!/usr/bin/env python3
"""Write and check pagedkv reference cases (format pagedkv-golden/1).

One case is one safetensors file holding the inputs of one FlashInfer
operation (in.*), its scalar parameters (__metadata__) and the expected
outputs (out.*); testdata/golden/FORMAT.md defines every operation and
docs/golden.md explains the workflow.

Modes:

  --out DIR        On a machine with a CUDA GPU, torch and flashinfer-python:
                   run FlashInfer's own functions on random inputs and write
                   their results as cases into DIR (each file is checked with
                   the --check rules before it is written).
  --check PATH...  Pure Python (no torch, no GPU): validate files, or every
                   *.safetensors under directories, against the format.
                   Prints one line per file and "check: N ok, M bad"; the
                   exit code is 1 when a file is bad. Without a PATH it
                   checks synthetic cases written to a temporary directory
                   (a self-test of the writer and the checker).
  --synthetic DIR  Pure Python: write small cases whose expected outputs are
                   computed here in float64 (page-table helpers, bit packing,
                   merges, decode, append, masks), so `pagedkv verify DIR`
                   tests this writer against the Go reader.

Examples:

  python3 tools/flashinfer_reference.py --out refs/ --seed 1 --count 3
  python3 tools/flashinfer_reference.py --check testdata/golden refs/
  pagedkv verify --backend cuda refs/
"""

import argparse
import json
import math
import os
import random
import struct
import sys
import tempfile

FORMAT = "pagedkv-golden/1"
MAX_HEADER_BYTES = 100 << 20  # the Go reader's limit
MAX_RANK = 16
DTYPE_SIZE = {"F32": 4, "F16": 2, "BF16": 2, "I32": 4, "U8": 1, "I8": 1, "F8_E4M3": 1, "F8_E5M2": 1}
FLOAT_DTYPES = ("F32", "F16", "BF16")


class FormatError(Exception):
    """A file that does not follow the safetensors format or FORMAT.md."""


# ---------------------------------------------------------------------------
# safetensors, with the same checks as internal/safetensors


class Tensor:
    __slots__ = ("dtype", "shape", "data")

    def __init__(self, dtype, shape, data):
        self.dtype, self.shape, self.data = dtype, list(shape), bytes(data)

    def numel(self):
        n = 1
        for d in self.shape:
            n *= d
        return n

    def ints(self):
        if self.dtype != "I32":
            raise FormatError("dtype %s, want I32" % self.dtype)
        return list(struct.unpack("<%di" % self.numel(), self.data))

    def floats(self):
        n = self.numel()
        if self.dtype == "F32":
            return list(struct.unpack("<%df" % n, self.data))
        if self.dtype == "F16":
            return list(struct.unpack("<%de" % n, self.data))
        if self.dtype == "BF16":
            raw = struct.unpack("<%dH" % n, self.data)
            return [struct.unpack("<f", struct.pack("<I", h << 16))[0] for h in raw]
        raise FormatError("dtype %s is not a float dtype" % self.dtype)


def i32(values, shape=None):
    values = [int(v) for v in values]
    return Tensor("I32", [len(values)] if shape is None else shape, struct.pack("<%di" % len(values), *values))


def u8(values, shape=None):
    values = [int(v) for v in values]
    return Tensor("U8", [len(values)] if shape is None else shape, bytes(values))


def f32(values, shape):
    return Tensor("F32", shape, struct.pack("<%df" % len(values), *values))


def f16(values, shape):
    return Tensor("F16", shape, struct.pack("<%de" % len(values), *values))


def encode(meta, tensors):
    """Serialize like the Python safetensors package: tensors back to back in
    name order, header padded with spaces to a multiple of 8."""
    header = {}
    if meta:
        header["__metadata__"] = {str(k): str(v) for k, v in meta.items()}
    offset = 0
    for name in sorted(tensors):
        t = tensors[name]
        if t.dtype not in DTYPE_SIZE:
            raise FormatError("tensor %r: unknown dtype %r" % (name, t.dtype))
        if t.numel() * DTYPE_SIZE[t.dtype] != len(t.data):
            raise FormatError("tensor %r: shape %s of %s needs %d bytes, has %d"
                              % (name, t.shape, t.dtype, t.numel() * DTYPE_SIZE[t.dtype], len(t.data)))
        header[name] = {"dtype": t.dtype, "shape": t.shape, "data_offsets": [offset, offset + len(t.data)]}
        offset += len(t.data)
    js = json.dumps(header, separators=(",", ":")).encode()
    js += b" " * (-len(js) % 8)
    return struct.pack("<Q", len(js)) + js + b"".join(tensors[n].data for n in sorted(tensors))


def _no_duplicates(pairs):
    out = {}
    for k, v in pairs:
        if k in out:
            raise FormatError("key %r appears twice in the header" % k)
        out[k] = v
    return out


def _is_uint(x):
    return isinstance(x, int) and not isinstance(x, bool) and x >= 0


def decode(buf):
    """Parse a whole file; returns (metadata, {name: Tensor})."""
    if len(buf) < 8:
        raise FormatError("file is %d bytes, shorter than the 8-byte header length" % len(buf))
    (n,) = struct.unpack("<Q", buf[:8])
    if n > MAX_HEADER_BYTES:
        raise FormatError("header length %d exceeds the limit of %d bytes" % (n, MAX_HEADER_BYTES))
    if n > len(buf) - 8:
        raise FormatError("header length %d exceeds the %d bytes after the length prefix" % (n, len(buf) - 8))
    try:
        text = buf[8:8 + n].decode("utf-8")
        header = json.loads(text, object_pairs_hook=_no_duplicates)
    except (UnicodeDecodeError, ValueError) as e:
        raise FormatError("header is not valid UTF-8 JSON: %s" % e)
    if not isinstance(header, dict):
        raise FormatError("header is not a JSON object")
    data = buf[8 + n:]
    meta = header.pop("__metadata__", None) or {}
    if not isinstance(meta, dict) or not all(isinstance(v, str) for v in meta.values()):
        raise FormatError("__metadata__ is not an object of strings")
    tensors, spans = {}, []
    for name, e in header.items():
        if not name:
            raise FormatError("a tensor has an empty name")
        if not isinstance(e, dict) or set(e) != {"dtype", "shape", "data_offsets"}:
            raise FormatError("tensor %r: want exactly the fields dtype, shape, data_offsets" % name)
        dtype, shape, offs = e["dtype"], e["shape"], e["data_offsets"]
        if dtype not in DTYPE_SIZE:
            raise FormatError("tensor %r: unknown dtype %r" % (name, dtype))
        if not isinstance(shape, list) or len(shape) > MAX_RANK or not all(_is_uint(d) for d in shape):
            raise FormatError("tensor %r: shape %r is not a list of at most %d non-negative integers" % (name, shape, MAX_RANK))
        if not isinstance(offs, list) or len(offs) != 2 or not all(_is_uint(o) for o in offs):
            raise FormatError("tensor %r: data_offsets %r is not [begin, end]" % (name, offs))
        begin, end = offs
        if begin > end or end > len(data):
            raise FormatError("tensor %r: data_offsets [%d, %d] out of range: the data section is %d bytes" % (name, begin, end, len(data)))
        numel = 1
        for d in shape:
            numel *= d
        if numel * DTYPE_SIZE[dtype] != end - begin:
            raise FormatError("tensor %r: shape %s of %s needs %d bytes but data_offsets [%d, %d] hold %d"
                              % (name, shape, dtype, numel * DTYPE_SIZE[dtype], begin, end, end - begin))
        tensors[name] = Tensor(dtype, shape, data[begin:end])
        spans.append((begin, end, name))
    pos, prev = 0, None
    for begin, end, name in sorted(spans):
        if begin < pos:
            raise FormatError("tensor %r: data_offsets [%d, %d] overlap tensor %r" % (name, begin, end, prev))
        if begin > pos:
            raise FormatError("tensor %r: data_offsets [%d, %d] leave a gap of %d bytes" % (name, begin, end, begin - pos))
        pos, prev = end, name
    if pos != len(data):
        raise FormatError("the tensors cover %d bytes but the data section holds %d" % (pos, len(data)))
    return meta, tensors


# ---------------------------------------------------------------------------
# The format: every operation of FORMAT.md

IDX = "I32"  # every index array
OPS = {
    "get_seq_lens": dict(inputs=["kv_indptr", "kv_last_page_len"], outputs=["seq_lens"], params=["page_size"], required=["page_size"]),
    "get_batch_indices_positions": dict(inputs=["append_indptr", "seq_lens"], outputs=["batch_indices", "positions"], params=["nnz"], required=["nnz"]),
    "append_paged_kv_cache": dict(
        inputs=["append_key", "append_value", "batch_indices", "positions", "kv_indices", "kv_indptr", "kv_last_page_len", "paged_kv_cache"],
        outputs=["paged_kv_cache"], params=["kv_layout", "page_size"], required=["page_size"], exact=["paged_kv_cache"]),
    "append_paged_mla_kv_cache": dict(
        inputs=["append_ckv", "append_kpe", "batch_indices", "positions", "kv_indices", "kv_indptr", "kv_last_page_len", "ckv_cache", "kpe_cache"],
        outputs=["ckv_cache", "kpe_cache"], params=["page_size"], required=["page_size"], exact=["ckv_cache", "kpe_cache"]),
    "batch_decode": dict(
        inputs=["q", "paged_kv_cache", "kv_indptr", "kv_indices", "kv_last_page_len"], outputs=["o", "lse"],
        params=["kv_layout", "page_size", "num_qo_heads", "num_kv_heads", "head_dim", "sm_scale", "window_left", "logits_soft_cap"],
        required=["page_size", "num_qo_heads", "num_kv_heads", "head_dim"], optional=["sinks"]),
    "trtllm_batch_decode": dict(
        inputs=["q", "paged_kv_cache", "block_tables", "seq_lens"], outputs=["o"],
        params=["kv_layout", "page_size", "num_qo_heads", "num_kv_heads", "head_dim", "sm_scale", "window_left", "max_seq_len"],
        required=["kv_layout", "page_size", "num_qo_heads", "num_kv_heads", "head_dim", "max_seq_len"]),
    "batch_prefill_paged": dict(
        inputs=["q", "qo_indptr", "paged_kv_cache", "kv_indptr", "kv_indices", "kv_last_page_len"], outputs=["o", "lse"],
        params=["kv_layout", "page_size", "num_qo_heads", "num_kv_heads", "head_dim", "sm_scale", "window_left", "logits_soft_cap", "causal"],
        required=["page_size", "num_qo_heads", "num_kv_heads", "head_dim"], optional=["sinks"]),
    "nvfp4_quantize_append_paged_kv_cache": dict(
        inputs=["append_key", "append_value", "batch_indices", "positions", "kv_indices", "kv_indptr", "kv_last_page_len",
                "paged_kv_cache", "kv_cache_sf"],
        outputs=["paged_kv_cache", "kv_cache_sf"], params=["kv_layout", "page_size", "k_scale", "v_scale"],
        required=["page_size", "k_scale", "v_scale"], exact=["paged_kv_cache", "kv_cache_sf"]),
    "batch_decode_nvfp4": dict(
        inputs=["q", "paged_kv_cache", "kv_cache_sf", "kv_indptr", "kv_indices", "kv_last_page_len"], outputs=["o", "lse"],
        params=["kv_layout", "page_size", "num_qo_heads", "num_kv_heads", "head_dim", "sm_scale", "window_left", "logits_soft_cap",
                "k_scale", "v_scale"],
        required=["page_size", "num_qo_heads", "num_kv_heads", "head_dim", "k_scale", "v_scale"]),
    "merge_state": dict(inputs=["v_a", "s_a", "v_b", "s_b"], outputs=["v", "s"], params=[], required=[]),
    "merge_states": dict(inputs=["v", "s"], outputs=["v", "s"], params=[], required=[]),
    "cascade_attention": dict(
        inputs=["q", "paged_kv_cache"], level_inputs=["qo_indptr", "kv_indptr", "kv_indices", "kv_last_page_len"], outputs=["o"],
        params=["num_levels", "kv_layout", "page_size", "num_qo_heads", "num_kv_heads", "head_dim", "sm_scale", "causal"],
        required=["num_levels", "page_size", "num_qo_heads", "num_kv_heads", "head_dim"], optional=["sinks"]),
    "mla_decode": dict(
        inputs=["q_nope", "q_pe", "ckv_cache", "kpe_cache", "kv_indptr", "kv_indices", "kv_len"], outputs=["o", "lse"],
        params=["page_size", "num_heads", "head_dim_ckv", "head_dim_kpe", "sm_scale"], required=["page_size", "num_heads", "sm_scale"]),
    "packbits": dict(inputs=["x"], outputs=["y"], params=["bitorder"], required=[]),
    "segment_packbits": dict(inputs=["x", "indptr"], outputs=["y", "indptr"], params=["bitorder"], required=[]),
    "attention_mask": dict(inputs=["q_seqlen", "kv_seqlen"], outputs=["allowed"], params=["mask", "window_size", "kv_padding"], required=["mask"]),
    "swa_mask": dict(inputs=[], outputs=["allowed"], params=["max_seq", "window_size", "compressed", "head_dim"], required=["window_size"]),
}
COMMON_PARAMS = ["format", "op", "case", "atol", "rtol"]
MASK_KINDS = ["block_diagonal", "block_diagonal_causal", "block_diagonal_causal_from_bottomright", "block_diagonal_causal_local",
              "block_diagonal_causal_local_from_bottomright", "block_diagonal_causal_with_offset_padded_keys"]


def _int(lo=None, hi=None):
    def parse(v):
        n = int(v.strip(), 10)
        if (lo is not None and n < lo) or (hi is not None and n > hi):
            raise ValueError("want %s..%s" % (lo, "" if hi is None else hi))
        return n
    return parse


def _float(lo=0.0, strict=False):
    def parse(v):
        x = float(v)
        if math.isnan(x) or math.isinf(x) or x < lo or (strict and x == lo):
            raise ValueError("want a finite number %s %g" % (">" if strict else ">=", lo))
        return x
    return parse


def _choice(*options):
    def parse(v):
        if v not in options:
            raise ValueError("want one of %s" % ", ".join(options))
        return v
    return parse


PARAM_PARSERS = {
    "page_size": _int(1), "num_qo_heads": _int(1), "num_kv_heads": _int(1), "head_dim": _int(1), "num_heads": _int(1),
    "head_dim_ckv": _int(1), "head_dim_kpe": _int(0), "nnz": _int(0), "max_seq_len": _int(1), "num_levels": _int(1, 64), "window_left": _int(-1),
    "window_size": _int(0), "kv_padding": _int(0), "max_seq": _int(1), "compressed": _choice("0", "1"), "causal": _choice("0", "1"),
    "sm_scale": _float(0.0, strict=True), "k_scale": _float(0.0, strict=True), "v_scale": _float(0.0, strict=True), "logits_soft_cap": _float(), "atol": _float(), "rtol": _float(),
    "kv_layout": _choice("NHD", "HND"), "bitorder": _choice("little", "big"), "mask": _choice(*MASK_KINDS),
    "format": _choice(FORMAT), "op": str, "case": str,
}


class Checker:
    """Checks one decoded case; every problem raises FormatError."""

    def __init__(self, meta, tensors):
        self.meta, self.tensors = meta, tensors
        self.op = meta.get("op")
        self.p = {}

    def fail(self, msg, *args):
        raise FormatError(msg % args if args else msg)

    def t(self, name, dtypes, rank=None):
        t = self.tensors[name]
        if t.dtype not in dtypes:
            self.fail("%s is %s, want %s", name, t.dtype, " or ".join(dtypes))
        if rank is not None and len(t.shape) != rank:
            self.fail("%s has shape %s, want %d dimensions", name, t.shape, rank)
        return t

    def shape(self, name, want):
        got = self.tensors[name].shape
        if got != list(want):
            self.fail("%s has shape %s, want %s", name, got, list(want))

    def indptr(self, name, length=None):
        v = self.t(name, [IDX], 1).ints()
        if not v or v[0] != 0 or any(b < a for a, b in zip(v, v[1:])):
            self.fail("%s = %s is not an indptr (starts at 0, never decreases)", name, v[:16])
        if length is not None and len(v) != length:
            self.fail("%s has length %d, want %d", name, len(v), length)
        return v

    def page_table(self, suffix, batch, pages, page_size):
        ind = self.indptr("in.kv_indptr" + suffix, batch + 1 if batch is not None else None)
        idx = self.t("in.kv_indices" + suffix, [IDX], 1).ints()
        last = self.t("in.kv_last_page_len" + suffix, [IDX], 1).ints()
        b = len(ind) - 1
        if len(last) != b:
            self.fail("kv_last_page_len%s has length %d, want %d", suffix, len(last), b)
        if len(idx) < ind[-1]:
            self.fail("kv_indices%s has %d entries but kv_indptr ends at %d", suffix, len(idx), ind[-1])
        for i in range(b):
            n = ind[i + 1] - ind[i]
            if (n == 0 and last[i] != 0) or (n > 0 and not 1 <= last[i] <= page_size):
                self.fail("request %d: kv_last_page_len%s = %d with %d pages (page_size %d)", i, suffix, last[i], n, page_size)
        for k, pg in enumerate(idx[:ind[-1]]):
            if not 0 <= pg < pages:
                self.fail("kv_indices%s[%d] = %d outside the %d pages of the cache", suffix, k, pg, pages)
        return ind, last

    def run(self):
        if self.meta.get("format") != FORMAT:
            self.fail("format %r, want %r", self.meta.get("format"), FORMAT)
        spec = OPS.get(self.op)
        if spec is None:
            self.fail("unknown op %r (known: %s)", self.op, ", ".join(sorted(OPS)))
        for k, v in self.meta.items():
            if k not in COMMON_PARAMS and k not in spec["params"]:
                self.fail("op %s has no parameter %s", self.op, k)
            try:
                self.p[k] = PARAM_PARSERS[k](v)
            except (ValueError, KeyError) as e:
                self.fail("parameter %s = %r: %s", k, v, e)
        for k in spec["required"]:
            if k not in self.p:
                self.fail("op %s needs parameter %s", self.op, k)
        names = ["in." + n for n in spec["inputs"]]
        for lvl in range(self.p.get("num_levels", 0) if spec.get("level_inputs") else 0):
            names += ["in.%s.%d" % (n, lvl) for n in spec["level_inputs"]]
        names += ["out." + n for n in spec["outputs"]]
        for n in names:
            if n not in self.tensors:
                self.fail("op %s needs tensor %s", self.op, n)
        optional = ["in." + n for n in spec.get("optional", [])]
        for n in self.tensors:
            if n not in names and n not in optional:
                self.fail("op %s has no tensor %s", self.op, n)
        exact = spec.get("exact", [])
        tolerant = [n for n in spec["outputs"] if n not in exact and self.tensors["out." + n].dtype in FLOAT_DTYPES]
        if tolerant and ("atol" not in self.p or "rtol" not in self.p):
            self.fail("op %s has floating-point outputs (%s): atol and rtol are required", self.op, ", ".join(tolerant))
        getattr(self, "check_" + self.op)()

    # -- per-op shape rules --------------------------------------------------

    def check_get_seq_lens(self):
        ind = self.indptr("in.kv_indptr")
        self.t("in.kv_last_page_len", [IDX], 1)
        self.shape("in.kv_last_page_len", [len(ind) - 1])
        self.t("out.seq_lens", [IDX])
        self.shape("out.seq_lens", [len(ind) - 1])

    def check_get_batch_indices_positions(self):
        ind = self.indptr("in.append_indptr")
        self.t("in.seq_lens", [IDX], 1)
        self.shape("in.seq_lens", [len(ind) - 1])
        if self.p["nnz"] != ind[-1]:
            self.fail("nnz = %d but append_indptr ends at %d", self.p["nnz"], ind[-1])
        for n in ("out.batch_indices", "out.positions"):
            self.t(n, [IDX])
            self.shape(n, [self.p["nnz"]])

    def paged_cache(self, name):
        c = self.t(name, FLOAT_DTYPES, 5)
        if c.shape[1] != 2:
            self.fail("%s has shape %s, want [pages, 2, ...]", name, c.shape)
        hnd = self.p.get("kv_layout", "NHD") == "HND"
        pages, n, h, d = c.shape[0], c.shape[3 if hnd else 2], c.shape[2 if hnd else 3], c.shape[4]
        if n != self.p["page_size"]:
            self.fail("%s %s has page_size %d, parameter page_size = %d", name, c.shape, n, self.p["page_size"])
        return c, pages, h, d

    def check_append_paged_kv_cache(self):
        c, pages, h, d = self.paged_cache("in.paged_kv_cache")
        k = self.t("in.append_key", [c.dtype], 3)
        nnz = k.shape[0]
        self.shape("in.append_key", [nnz, h, d])
        self.t("in.append_value", [c.dtype])
        self.shape("in.append_value", [nnz, h, d])
        self.append_rows(nnz, pages)
        self.t("out.paged_kv_cache", [c.dtype])
        self.shape("out.paged_kv_cache", c.shape)

    def append_rows(self, nnz, pages):
        ind, last = self.page_table("", None, pages, self.p["page_size"])
        bi = self.t("in.batch_indices", [IDX], 1).ints()
        pos = self.t("in.positions", [IDX], 1).ints()
        if len(bi) != nnz or len(pos) != nnz:
            self.fail("batch_indices and positions have %d and %d rows, want nnz = %d", len(bi), len(pos), nnz)
        for i, (b, t) in enumerate(zip(bi, pos)):
            if not 0 <= b < len(last):
                self.fail("batch_indices[%d] = %d outside the batch of %d", i, b, len(last))
            pages_b = ind[b + 1] - ind[b]
            length = 0 if pages_b == 0 else (pages_b - 1) * self.p["page_size"] + last[b]
            if not 0 <= t < length:
                self.fail("positions[%d] = %d outside request %d's %d tokens", i, t, b, length)

    def nvfp4_cache(self):
        """in.paged_kv_cache U8 [pages, 2, ..., D/2] and in.kv_cache_sf F8_E4M3 [pages, 2, ..., D/16]."""
        c = self.t("in.paged_kv_cache", ["U8"], 5)
        sf = self.t("in.kv_cache_sf", ["F8_E4M3"], 5)
        if c.shape[1] != 2:
            self.fail("in.paged_kv_cache has shape %s, want [pages, 2, ...]", c.shape)
        if c.shape[4] % 8 or sf.shape != c.shape[:4] + [c.shape[4] // 8]:
            self.fail("in.kv_cache_sf %s does not match in.paged_kv_cache %s (head_dim/16 scales for head_dim/2 bytes)", sf.shape, c.shape)
        hnd = self.p.get("kv_layout", "NHD") == "HND"
        pages, n, h, d = c.shape[0], c.shape[3 if hnd else 2], c.shape[2 if hnd else 3], 2 * c.shape[4]
        if n != self.p["page_size"]:
            self.fail("in.paged_kv_cache %s has page_size %d, parameter page_size = %d", c.shape, n, self.p["page_size"])
        return c, sf, pages, h, d

    def check_nvfp4_quantize_append_paged_kv_cache(self):
        c, sf, pages, h, d = self.nvfp4_cache()
        k = self.t("in.append_key", FLOAT_DTYPES, 3)
        nnz = k.shape[0]
        self.shape("in.append_key", [nnz, h, d])
        self.t("in.append_value", [k.dtype])
        self.shape("in.append_value", [nnz, h, d])
        self.append_rows(nnz, pages)
        self.t("out.paged_kv_cache", ["U8"])
        self.shape("out.paged_kv_cache", c.shape)
        self.t("out.kv_cache_sf", ["F8_E4M3"])
        self.shape("out.kv_cache_sf", sf.shape)

    def query(self, c, h, d):
        """in.q [rows, num_qo_heads, head_dim], checked against the cache c
        (h kv heads of head dim d) and the parameters."""
        q = self.t("in.q", FLOAT_DTYPES, 3)
        if q.shape[1] != self.p["num_qo_heads"] or q.shape[2] != self.p["head_dim"] or d != self.p["head_dim"] or h != self.p["num_kv_heads"]:
            self.fail("q %s / cache %s disagree with num_qo_heads %d, num_kv_heads %d, head_dim %d",
                      q.shape, c.shape, self.p["num_qo_heads"], self.p["num_kv_heads"], self.p["head_dim"])
        if self.p["num_qo_heads"] % self.p["num_kv_heads"]:
            self.fail("num_qo_heads %d is not a multiple of num_kv_heads %d", self.p["num_qo_heads"], self.p["num_kv_heads"])
        return q

    def check_batch_decode_nvfp4(self):
        c, _, pages, h, d = self.nvfp4_cache()
        q = self.query(c, h, d)
        self.page_table("", q.shape[0], pages, self.p["page_size"])
        self.attention_outputs(q.shape[0])

    def check_append_paged_mla_kv_cache(self):
        ckv = self.t("in.ckv_cache", FLOAT_DTYPES, 3)
        kpe = self.t("in.kpe_cache", [ckv.dtype], 3)
        pages, n = ckv.shape[0], ckv.shape[1]
        if kpe.shape[:2] != [pages, n] or n != self.p["page_size"]:
            self.fail("caches %s and %s disagree with each other or with page_size %d", ckv.shape, kpe.shape, self.p["page_size"])
        a = self.t("in.append_ckv", [ckv.dtype], 2)
        nnz = a.shape[0]
        self.shape("in.append_ckv", [nnz, ckv.shape[2]])
        self.t("in.append_kpe", [ckv.dtype])
        self.shape("in.append_kpe", [nnz, kpe.shape[2]])
        self.append_rows(nnz, pages)
        for n_ in ("ckv_cache", "kpe_cache"):
            self.t("out." + n_, [ckv.dtype])
            self.shape("out." + n_, self.tensors["in." + n_].shape)

    def attention_common(self):
        c, pages, h, d = self.paged_cache("in.paged_kv_cache")
        q = self.query(c, h, d)
        if "in.sinks" in self.tensors:  # FlashInfer's sinks: one finite float32 logit per query head
            self.t("in.sinks", ["F32"], 1)
            self.shape("in.sinks", [self.p["num_qo_heads"]])
            if not all(math.isfinite(x) for x in self.tensors["in.sinks"].floats()):
                self.fail("in.sinks holds a value that is not finite")
        return q, pages

    def attention_outputs(self, rows):
        self.t("out.o", ["F32"])
        self.shape("out.o", [rows, self.p["num_qo_heads"], self.p["head_dim"]])
        self.t("out.lse", ["F32"])
        self.shape("out.lse", [rows, self.p["num_qo_heads"]])

    def check_batch_decode(self):
        q, pages = self.attention_common()
        self.page_table("", q.shape[0], pages, self.p["page_size"])
        self.attention_outputs(q.shape[0])

    def check_trtllm_batch_decode(self):
        q, pages = self.attention_common()
        bt = self.t("in.block_tables", [IDX], 2)
        b, cols = q.shape[0], bt.shape[1]
        if bt.shape[0] != b or cols < 1:
            self.fail("block_tables has shape %s, want [%d, max_pages >= 1]", bt.shape, b)
        for k, pg in enumerate(bt.ints()):
            if not 0 <= pg < pages:  # padding too: a kernel may fetch it
                self.fail("block_tables[%d][%d] = %d outside the %d pages of the cache", k // cols, k % cols, pg, pages)
        lens = self.t("in.seq_lens", [IDX], 1).ints()
        if len(lens) != b:
            self.fail("seq_lens has length %d, want %d", len(lens), b)
        for i, n in enumerate(lens):
            if not 1 <= n <= min(self.p["max_seq_len"], cols * self.p["page_size"]):
                self.fail("seq_lens[%d] = %d, want 1..min(max_seq_len %d, max_pages %d * page_size %d)",
                          i, n, self.p["max_seq_len"], cols, self.p["page_size"])
        self.t("out.o", ["F32"])
        self.shape("out.o", [b, self.p["num_qo_heads"], self.p["head_dim"]])

    def check_batch_prefill_paged(self):
        q, pages = self.attention_common()
        ind, _ = self.page_table("", None, pages, self.p["page_size"])
        qo = self.indptr("in.qo_indptr", len(ind))
        if qo[-1] != q.shape[0]:
            self.fail("qo_indptr ends at %d but q has %d rows", qo[-1], q.shape[0])
        self.attention_outputs(q.shape[0])

    def check_cascade_attention(self):
        q, pages = self.attention_common()
        for lvl in range(self.p["num_levels"]):
            s = ".%d" % lvl
            qo = self.indptr("in.qo_indptr" + s)
            if qo[-1] != q.shape[0]:
                self.fail("qo_indptr%s ends at %d but q has %d rows", s, qo[-1], q.shape[0])
            self.page_table(s, len(qo) - 1, pages, self.p["page_size"])
        self.t("out.o", ["F32"])
        self.shape("out.o", q.shape)

    def check_mla_decode(self):
        qn = self.t("in.q_nope", FLOAT_DTYPES, 3)
        b, h, dc = qn.shape
        ckv = self.t("in.ckv_cache", FLOAT_DTYPES, 3)
        kpe = self.t("in.kpe_cache", [ckv.dtype], 3)
        dk = kpe.shape[2]
        self.t("in.q_pe", FLOAT_DTYPES, 3)
        self.shape("in.q_pe", [b, h, dk])
        if ckv.shape[1] != self.p["page_size"] or kpe.shape[:2] != ckv.shape[:2] or ckv.shape[2] != dc or h != self.p["num_heads"]:
            self.fail("q_nope %s, ckv %s, kpe %s disagree with page_size %d / num_heads %d", qn.shape, ckv.shape, kpe.shape, self.p["page_size"], self.p["num_heads"])
        for k, v in (("head_dim_ckv", dc), ("head_dim_kpe", dk)):
            if k in self.p and self.p[k] != v:
                self.fail("parameter %s = %d but the cache has %d", k, self.p[k], v)
        ind = self.indptr("in.kv_indptr", b + 1)
        idx = self.t("in.kv_indices", [IDX], 1).ints()
        kv_len = self.t("in.kv_len", [IDX], 1).ints()
        if len(kv_len) != b or len(idx) < ind[-1]:
            self.fail("kv_len has %d values (want %d) / kv_indices %d entries (want >= %d)", len(kv_len), b, len(idx), ind[-1])
        for i, n in enumerate(kv_len):
            if n < 0 or -(-n // self.p["page_size"]) > ind[i + 1] - ind[i]:
                self.fail("kv_len[%d] = %d does not fit in its %d pages", i, n, ind[i + 1] - ind[i])
        for k, pg in enumerate(idx[:ind[-1]]):
            if not 0 <= pg < ckv.shape[0]:
                self.fail("kv_indices[%d] = %d outside the %d pages", k, pg, ckv.shape[0])
        self.t("out.o", ["F32"])
        self.shape("out.o", [b, h, dc])
        self.t("out.lse", ["F32"])
        self.shape("out.lse", [b, h])

    def check_merge_state(self):
        va = self.t("in.v_a", FLOAT_DTYPES, 3)
        n, h, d = va.shape
        self.t("in.v_b", FLOAT_DTYPES)
        self.shape("in.v_b", va.shape)
        for s in ("in.s_a", "in.s_b", "out.s"):
            self.t(s, ["F32"])
            self.shape(s, [n, h])
        self.t("out.v", ["F32"])
        self.shape("out.v", va.shape)

    def check_merge_states(self):
        v = self.t("in.v", FLOAT_DTYPES, 4)
        n, ns, h, d = v.shape
        self.t("in.s", ["F32"])
        self.shape("in.s", [n, ns, h])
        self.t("out.v", ["F32"])
        self.shape("out.v", [n, h, d])
        self.t("out.s", ["F32"])
        self.shape("out.s", [n, h])

    def check_packbits(self):
        x = self.t("in.x", ["U8"], 1)
        self.t("out.y", ["U8"])
        self.shape("out.y", [(x.shape[0] + 7) // 8])

    def check_segment_packbits(self):
        x = self.t("in.x", ["U8"], 1)
        ind = self.indptr("in.indptr")
        if ind[-1] != x.shape[0]:
            self.fail("indptr ends at %d but x has %d bits", ind[-1], x.shape[0])
        out = self.indptr("out.indptr", len(ind))
        self.t("out.y", ["U8"])
        self.shape("out.y", [out[-1]])

    def check_attention_mask(self):
        q = self.t("in.q_seqlen", [IDX], 1).ints()
        kv = self.t("in.kv_seqlen", [IDX], 1).ints()
        if len(q) != len(kv):
            self.fail("q_seqlen has %d blocks, kv_seqlen %d", len(q), len(kv))
        cols = sum(kv)
        if self.p["mask"] == "block_diagonal_causal_with_offset_padded_keys":
            cols = len(kv) * self.p.get("kv_padding", 0)
        self.t("out.allowed", ["U8"])
        self.shape("out.allowed", [sum(q), cols])

    def check_swa_mask(self):
        size = 512 if self.p.get("compressed") == "1" else self.p.get("max_seq")
        if size is None:
            self.fail("a plain swa_mask needs max_seq")
        self.t("out.allowed", ["U8"])
        self.shape("out.allowed", [size, size])


def check_bytes(buf):
    meta, tensors = decode(buf)
    Checker(meta, tensors).run()
    return meta


def find_cases(paths):
    out = []
    for p in paths:
        if os.path.isdir(p):
            for root, _, files in os.walk(p):
                out += [os.path.join(root, f) for f in files if f.endswith(".safetensors")]
        else:
            out.append(p)
    return sorted(set(out))


def check_paths(paths, out=sys.stdout):
    ok = bad = 0
    for path in find_cases(paths):
        try:
            with open(path, "rb") as f:
                meta = check_bytes(f.read())
            print("ok   %s (%s)" % (path, meta["op"]), file=out)
            ok += 1
        except (OSError, FormatError) as e:
            print("BAD  %s: %s" % (path, e), file=out)
            bad += 1
    print("check: %d ok, %d bad" % (ok, bad), file=out)
    return ok, bad


def write_case(directory, name, meta, tensors):
    """Check a case against the format, then write it (nothing is written for
    a case that would not pass --check)."""
    meta = dict(meta, format=FORMAT, case=name)
    buf = encode(meta, tensors)
    check_bytes(buf)
    path = os.path.join(directory, name + ".safetensors")
    tmp = path + ".tmp"
    with open(tmp, "wb") as f:
        f.write(buf)
    os.replace(tmp, path)
    return path


# ---------------------------------------------------------------------------
# Synthetic cases: expected outputs computed here in float64, no torch.


def _r32(x):
    return struct.unpack("<f", struct.pack("<f", x))[0]


def _r16(x):
    return struct.unpack("<e", struct.pack("<e", x))[0]


def _prefix(lens):
    out = [0]
    for n in lens:
        out.append(out[-1] + n)
    return out


def _pack(bits, little):
    out = bytearray((len(bits) + 7) // 8)
    for k, b in enumerate(bits):
        if b:
            out[k // 8] |= 1 << (k % 8 if little else 7 - k % 8)
    return list(out)


def _paged(rng, seq_lens, page_size):
    counts = [-(-n // page_size) for n in seq_lens]
    last = [n - (c - 1) * page_size if c else 0 for n, c in zip(seq_lens, counts)]
    pages = sum(counts) + rng.randrange(3)
    perm = list(range(pages))
    rng.shuffle(perm)
    return _prefix(counts), perm[:sum(counts)], last, pages


def synthetic_cases(rng):
    """Yields (name, meta, tensors) for a set of small cases."""
    # get_seq_lens
    b, ps = rng.randrange(1, 9), rng.randrange(1, 33)
    lens = [rng.randrange(0, 5 * ps) for _ in range(b)]
    ind, _, last, _ = _paged(rng, lens, ps)
    yield "py_get_seq_lens", {"op": "get_seq_lens", "page_size": str(ps)}, {
        "in.kv_indptr": i32(ind), "in.kv_last_page_len": i32(last), "out.seq_lens": i32(lens)}

    # get_batch_indices_positions
    app = [rng.randrange(0, 6) for _ in range(rng.randrange(1, 7))]
    seq = [a + rng.randrange(0, 9) for a in app]
    bi = [r for r, a in enumerate(app) for _ in range(a)]
    pos = [seq[r] - a + k for r, a in enumerate(app) for k in range(a)]
    yield "py_get_batch_indices_positions", {"op": "get_batch_indices_positions", "nnz": str(len(bi))}, {
        "in.append_indptr": i32(_prefix(app)), "in.seq_lens": i32(seq), "out.batch_indices": i32(bi), "out.positions": i32(pos)}

    # packbits, both orders
    for order in ("little", "big"):
        x = [rng.randrange(2) for _ in range(rng.randrange(1, 40))]
        y = _pack(x, order == "little")
        yield "py_packbits_" + order, {"op": "packbits", "bitorder": order}, {"in.x": u8(x), "out.y": u8(y)}

    # segment_packbits
    seg = [rng.randrange(0, 14) for _ in range(rng.randrange(1, 5))]
    ind = _prefix(seg)
    x = [rng.randrange(2) for _ in range(ind[-1])]
    y, out_ind = [], [0]
    for i in range(len(seg)):
        y += _pack(x[ind[i]:ind[i + 1]], True)
        out_ind.append(len(y))
    yield "py_segment_packbits", {"op": "segment_packbits", "bitorder": "little"}, {
        "in.x": u8(x), "in.indptr": i32(ind), "out.y": u8(y), "out.indptr": i32(out_ind)}

    # merge_state / merge_states (base-2 LSE; -inf is the empty state)
    def merge(vs, ss):
        m = max(ss)
        if m == -math.inf:
            return [0.0] * len(vs[0]), -math.inf
        s = m + math.log2(sum(2.0 ** (x - m) for x in ss))
        return [sum(2.0 ** (ss[i] - s) * vs[i][k] for i in range(len(vs))) for k in range(len(vs[0]))], s

    def lse(n):
        return [-math.inf if rng.random() < 0.15 else _r32(rng.uniform(-6, 6)) for _ in range(n)]

    n, h, d = rng.randrange(1, 4), rng.randrange(1, 3), rng.randrange(1, 17)
    va = [_r32(rng.uniform(-2, 2)) for _ in range(n * h * d)]
    vb = [_r32(rng.uniform(-2, 2)) for _ in range(n * h * d)]
    sa, sb = lse(n * h), lse(n * h)
    v, s = [], []
    for i in range(n * h):
        vi, si = merge([va[i * d:(i + 1) * d], vb[i * d:(i + 1) * d]], [sa[i], sb[i]])
        v += vi
        s.append(si)
    yield "py_merge_state", {"op": "merge_state", "atol": "1e-5", "rtol": "1e-5"}, {
        "in.v_a": f32(va, [n, h, d]), "in.v_b": f32(vb, [n, h, d]), "in.s_a": f32(sa, [n, h]), "in.s_b": f32(sb, [n, h]),
        "out.v": f32(v, [n, h, d]), "out.s": f32(s, [n, h])}

    n, ns, h, d = rng.randrange(1, 4), rng.randrange(1, 5), rng.randrange(1, 3), rng.randrange(1, 17)
    vin = [_r32(rng.uniform(-2, 2)) for _ in range(n * ns * h * d)]
    sin = lse(n * ns * h)
    v, s = [], []
    for r in range(n):
        for hh in range(h):
            idx = [(r * ns + k) * h + hh for k in range(ns)]
            vi, si = merge([vin[i * d:(i + 1) * d] for i in idx], [sin[i] for i in idx])
            v += vi
            s.append(si)
    yield "py_merge_states", {"op": "merge_states", "atol": "1e-5", "rtol": "1e-5"}, {
        "in.v": f32(vin, [n, ns, h, d]), "in.s": f32(sin, [n, ns, h]), "out.v": f32(v, [n, h, d]), "out.s": f32(s, [n, h])}

    # batch_decode on an f16 cache (HND), GQA 2, window and soft cap
    b, hkv, g, d, ps = 2, 1, 2, 8, 3
    hq = hkv * g
    lens = [rng.randrange(1, 10), 0]
    ind, idx, last, pages = _paged(rng, lens, ps)
    cache = [_r16(rng.uniform(-1, 1)) for _ in range(pages * 2 * hkv * ps * d)]
    q = [_r16(rng.uniform(-1, 1)) for _ in range(b * hq * d)]
    scale, window, cap = 0.5, 4, 2.0

    def kv_at(req, t, kv, h, f):  # HND: [pages, 2, H, N, D]
        page, entry = idx[ind[req] + t // ps], t % ps
        return cache[(((page * 2 + kv) * hkv + h) * ps + entry) * d + f]

    o, lse_out = [], []
    for req in range(b):
        for h in range(hq):
            keys = [t for t in range(lens[req]) if t >= lens[req] - 1 - window]
            logits = [cap * math.tanh(scale * sum(q[(req * hq + h) * d + f] * kv_at(req, t, 0, h // g, f) for f in range(d)) / cap) for t in keys]
            if not keys:
                o += [0.0] * d
                lse_out.append(-math.inf)
                continue
            m = max(logits)
            z = sum(math.exp(x - m) for x in logits)
            o += [sum(math.exp(logits[k] - m) / z * kv_at(req, t, 1, h // g, f) for k, t in enumerate(keys)) for f in range(d)]
            lse_out.append((m + math.log(z)) / math.log(2))
    yield "py_batch_decode", {
        "op": "batch_decode", "kv_layout": "HND", "page_size": str(ps), "num_qo_heads": str(hq), "num_kv_heads": str(hkv),
        "head_dim": str(d), "sm_scale": str(scale), "window_left": str(window), "logits_soft_cap": str(cap),
        "atol": "1e-4", "rtol": "1e-4"}, {
        "in.q": f16(q, [b, hq, d]), "in.paged_kv_cache": f16(cache, [pages, 2, hkv, ps, d]),
        "in.kv_indptr": i32(ind), "in.kv_indices": i32(idx), "in.kv_last_page_len": i32(last),
        "out.o": f32(o, [b, hq, d]), "out.lse": f32(lse_out, [b, hq])}

    # trtllm_batch_decode: the padded contract (HND f16 cache, GQA 2, a
    # window), rows padded with page 0 as pagedkv's Plan.BlockTables are,
    # keys read through block_tables alone
    b, hkv, g, d, ps, cols = 3, 2, 2, 8, 4, 5
    hq = hkv * g
    lens = [rng.randrange(1, cols * ps + 1) for _ in range(b)]
    ind, idx, _, pages = _paged(rng, lens, ps)
    table = []
    for req in range(b):
        row = idx[ind[req]:ind[req + 1]]
        table += row + [0] * (cols - len(row))
    cache = [_r16(rng.uniform(-1, 1)) for _ in range(pages * 2 * hkv * ps * d)]
    q = [_r16(rng.uniform(-1, 1)) for _ in range(b * hq * d)]
    scale, window = 0.35, 9

    def kv_bt(req, t, kv, h, f):  # HND: [pages, 2, H, N, D], page from the padded row
        page = table[req * cols + t // ps]
        return cache[(((page * 2 + kv) * hkv + h) * ps + t % ps) * d + f]

    o = []
    for req in range(b):
        keys = [t for t in range(lens[req]) if t >= lens[req] - 1 - window]
        for h in range(hq):
            logits = [scale * sum(q[(req * hq + h) * d + f] * kv_bt(req, t, 0, h // g, f) for f in range(d)) for t in keys]
            m = max(logits)
            z = sum(math.exp(x - m) for x in logits)
            o += [sum(math.exp(logits[k] - m) / z * kv_bt(req, t, 1, h // g, f) for k, t in enumerate(keys)) for f in range(d)]
    yield "py_trtllm_batch_decode", {
        "op": "trtllm_batch_decode", "kv_layout": "HND", "page_size": str(ps), "num_qo_heads": str(hq),
        "num_kv_heads": str(hkv), "head_dim": str(d), "sm_scale": str(scale), "window_left": str(window),
        "max_seq_len": str(cols * ps), "atol": "1e-4", "rtol": "1e-4"}, {
        "in.q": f16(q, [b, hq, d]), "in.paged_kv_cache": f16(cache, [pages, 2, hkv, ps, d]),
        "in.block_tables": i32(table, [b, cols]), "in.seq_lens": i32(lens), "out.o": f32(o, [b, hq, d])}

    # append_paged_kv_cache (NHD, f32): a copy
    h, d, ps = 2, 4, 4
    before = [rng.randrange(0, 7) for _ in range(3)]
    added = [rng.randrange(0, 4) for _ in range(3)]
    after = [x + y for x, y in zip(before, added)]
    ind, idx, last, pages = _paged(rng, after, ps)
    cache = [_r32(rng.uniform(-1, 1)) for _ in range(pages * 2 * ps * h * d)]
    want = list(cache)
    keys, vals, bi, pos = [], [], [], []
    for req in range(3):
        for t in range(before[req], after[req]):
            k = [_r32(rng.uniform(-3, 3)) for _ in range(h * d)]
            v = [_r32(rng.uniform(-3, 3)) for _ in range(h * d)]
            keys, vals, bi, pos = keys + k, vals + v, bi + [req], pos + [t]
            page, entry = idx[ind[req] + t // ps], t % ps
            for hh in range(h):
                for f in range(d):
                    want[(((page * 2 + 0) * ps + entry) * h + hh) * d + f] = k[hh * d + f]
                    want[(((page * 2 + 1) * ps + entry) * h + hh) * d + f] = v[hh * d + f]
    shape = [pages, 2, ps, h, d]
    yield "py_append_paged_kv_cache", {"op": "append_paged_kv_cache", "kv_layout": "NHD", "page_size": str(ps)}, {
        "in.append_key": f32(keys, [len(bi), h, d]), "in.append_value": f32(vals, [len(bi), h, d]),
        "in.batch_indices": i32(bi), "in.positions": i32(pos), "in.kv_indices": i32(idx), "in.kv_indptr": i32(ind),
        "in.kv_last_page_len": i32(last), "in.paged_kv_cache": f32(cache, shape), "out.paged_kv_cache": f32(want, shape)}

    # swa_mask (plain) and attention_mask (block_diagonal_causal)
    n, w = rng.randrange(1, 20), rng.randrange(1, 8)
    allowed = [1 if j <= i and j > i - w else 0 for i in range(n) for j in range(n)]
    yield "py_swa_mask", {"op": "swa_mask", "max_seq": str(n), "window_size": str(w), "compressed": "0"}, {
        "out.allowed": u8(allowed, [n, n])}
    blocks = [rng.randrange(1, 5) for _ in range(rng.randrange(1, 4))]
    total, start = sum(blocks), _prefix(blocks)
    allowed = [0] * (total * total)
    for bk, n in enumerate(blocks):
        for i in range(n):
            for j in range(i + 1):
                allowed[(start[bk] + i) * total + start[bk] + j] = 1
    yield "py_attention_mask", {"op": "attention_mask", "mask": "block_diagonal_causal", "window_size": "0"}, {
        "in.q_seqlen": i32(blocks), "in.kv_seqlen": i32(blocks), "out.allowed": u8(allowed, [total, total])}

    for case in nvfp4_synthetic(rng):
        yield case


# NVFP4 (FlashInfer's page.cuh): written from its description, float64
# arithmetic and nearest-value searches, sharing nothing with the Go code.


def e4m3_value(b):
    """The value of fp8 e4m3fn byte b (NaN for 0x7F/0xFF)."""
    sign = -1.0 if b & 0x80 else 1.0
    e, m = (b >> 3) & 0xF, b & 7
    if e == 15 and m == 7:
        return math.nan
    return sign * (m * 2.0 ** -9 if e == 0 else (1 + m / 8) * 2.0 ** (e - 7))


E4M3_POS = [(e4m3_value(b), b) for b in range(0x7F)]  # every finite non-negative code


def e4m3_satfinite(x):
    """CUDA's __nv_fp8_e4m3(x) for x >= 0: nearest, ties to the even code, above 448 -> 448."""
    if x >= 448:
        return 0x7E
    best = min(E4M3_POS, key=lambda vb: (abs(vb[0] - x), vb[1] & 1))
    return best[1]


E2M1 = [0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0]


def e2m1_code(y):
    """Nearest e2m1 code, ties to the even code, saturating at 6; the sign bit
    is y's (-0.1 -> 0x8); NaN -> 0 (the GPU's canonical NaN is positive)."""
    if math.isnan(y):
        return 0
    sign = 8 if math.copysign(1.0, y) < 0 else 0
    a = abs(y)
    best = min(range(8), key=lambda c: (abs(E2M1[c] - a), c & 1))
    return sign | best


def nvfp4_block(xs, g):
    """nvfp4_append_quantize_block: 16 floats under global scale g -> (8 bytes, scale byte)."""
    amax = 0.0
    for x in xs:
        if abs(x) > amax:  # NaN never is
            amax = abs(x)
    sf = e4m3_satfinite(_r32(amax / _r32(6 * g))) if amax > 0 else 0
    s = e4m3_value(sf)
    mul = _r32(1 / _r32(s * g)) if amax > 0 and s > 0 else 0.0
    codes = [e2m1_code(_r32(x * mul)) for x in xs]
    return [codes[2 * i] | codes[2 * i + 1] << 4 for i in range(8)], sf


def nvfp4_synthetic(rng):
    """An NVFP4 append into a random table, then a decode over the cache it wrote."""
    out = []
    for layout, h, d, ps, hq in (("NHD", 2, 32, 4, 4), ("HND", 1, 16, 3, 2)):
        before = [rng.randrange(0, 7) for _ in range(3)]
        added = [rng.randrange(1, 4) for _ in range(3)]
        after = [x + y for x, y in zip(before, added)]
        ind, idx, last, pages = _paged(rng, after, ps)
        amp = rng.choice([1.0, 20.0])
        ks, vs = _r32(amp / (6 * 448)), _r32(amp / 6 / 3)

        def off(page, kv, entry, hh, width):  # row offset in [pages, 2, N, H, width] / [pages, 2, H, N, width]
            if layout == "NHD":
                return (((page * 2 + kv) * ps + entry) * h + hh) * width
            return (((page * 2 + kv) * h + hh) * ps + entry) * width

        data = [rng.randrange(256) for _ in range(pages * 2 * ps * h * d // 2)]
        sf = [rng.randrange(0x7F) for _ in range(pages * 2 * ps * h * d // 16)]
        data0, sf0 = list(data), list(sf)
        keys, vals, bi, pos = [], [], [], []

        def put(page, kv, entry, hh, row, g):
            for blk in range(d // 16):
                b, s = nvfp4_block(row[16 * blk:16 * blk + 16], g)
                o = off(page, kv, entry, hh, d // 2) + 8 * blk
                data[o:o + 8] = b
                sf[off(page, kv, entry, hh, d // 16) + blk] = s

        for req in range(3):
            for t in range(after[req]):
                k = [_r16(rng.uniform(-amp, amp)) for _ in range(h * d)]
                v = [_r16(rng.uniform(-amp, amp)) for _ in range(h * d)]
                if t >= before[req]:
                    keys, vals, bi, pos = keys + k, vals + v, bi + [req], pos + [t]
                else:  # tokens already in the cache: written before the case starts
                    pass
                page, entry = idx[ind[req] + t // ps], t % ps
                for hh in range(h):
                    put(page, 0, entry, hh, k[hh * d:(hh + 1) * d], ks)
                    put(page, 1, entry, hh, v[hh * d:(hh + 1) * d], vs)
                if t < before[req]:
                    # the pre-existing token is part of the input cache
                    for hh in range(h):
                        for kv in range(2):
                            o, so = off(page, kv, entry, hh, d // 2), off(page, kv, entry, hh, d // 16)
                            data0[o:o + d // 2] = data[o:o + d // 2]
                            sf0[so:so + d // 16] = sf[so:so + d // 16]
        shape = [pages, 2, ps, h] if layout == "NHD" else [pages, 2, h, ps]
        cache_in, sf_in = u8(data0, shape + [d // 2]), Tensor("F8_E4M3", shape + [d // 16], bytes(sf0))
        cache_out, sf_out = u8(data, shape + [d // 2]), Tensor("F8_E4M3", shape + [d // 16], bytes(sf))
        nnz = len(bi)
        out.append(("py_nvfp4_append_" + layout, {
            "op": "nvfp4_quantize_append_paged_kv_cache", "kv_layout": layout, "page_size": str(ps),
            "k_scale": repr(ks), "v_scale": repr(vs)}, {
            "in.append_key": f16(keys, [nnz, h, d]), "in.append_value": f16(vals, [nnz, h, d]),
            "in.batch_indices": i32(bi), "in.positions": i32(pos), "in.kv_indices": i32(idx), "in.kv_indptr": i32(ind),
            "in.kv_last_page_len": i32(last), "in.paged_kv_cache": cache_in, "in.kv_cache_sf": sf_in,
            "out.paged_kv_cache": cache_out, "out.kv_cache_sf": sf_out}))

        # decode over the cache after the append, float64 over the dequantised values
        def at(req, t, kv, hh, f):
            page, entry = idx[ind[req] + t // ps], t % ps
            byte = data[off(page, kv, entry, hh, d // 2) + f // 2]
            code = byte >> 4 if f % 2 else byte & 0xF
            val = E2M1[code & 7] * (-1 if code & 8 else 1)
            return val * e4m3_value(sf[off(page, kv, entry, hh, d // 16) + f // 16]) * (ks if kv == 0 else vs)

        grp = hq // h
        q = [_r16(rng.uniform(-1, 1)) for _ in range(3 * hq * d)]
        scale = 1 / math.sqrt(d)
        o, lse_out = [], []
        for req in range(3):
            for hh in range(hq):
                logits = [scale * sum(q[(req * hq + hh) * d + f] * at(req, t, 0, hh // grp, f) for f in range(d)) for t in range(after[req])]
                m = max(logits)
                z = sum(math.exp(x - m) for x in logits)
                o += [sum(math.exp(logits[t] - m) / z * at(req, t, 1, hh // grp, f) for t in range(after[req])) for f in range(d)]
                lse_out.append((m + math.log(z)) / math.log(2))
        out.append(("py_batch_decode_nvfp4_" + layout, {
            "op": "batch_decode_nvfp4", "kv_layout": layout, "page_size": str(ps), "num_qo_heads": str(hq), "num_kv_heads": str(h),
            "head_dim": str(d), "k_scale": repr(ks), "v_scale": repr(vs), "atol": "1e-4", "rtol": "1e-4"}, {
            "in.q": f16(q, [3, hq, d]), "in.paged_kv_cache": cache_out, "in.kv_cache_sf": sf_out,
            "in.kv_indptr": i32(ind), "in.kv_indices": i32(idx), "in.kv_last_page_len": i32(last),
            "out.o": f32(o, [3, hq, d]), "out.lse": f32(lse_out, [3, hq])}))
    return out


def sink_cases(rng):
    """Yields (name, meta, tensors): batch_decode and batch_prefill_paged with
    FlashInfer's sinks (one logit per query head that joins every softmax
    denominator and carries no value; docs/attention.md), computed in float64.
    Long requests (up to 80 keys in pages of 2) make backends split the keys
    into split-KV chunks, where a sink counted per chunk would show."""
    for op in ("batch_decode", "batch_prefill_paged"):
        hkv, g, d, ps = 2, 4, 16, 2
        hq = hkv * g
        b = 3
        lens = [rng.randrange(40, 81), rng.randrange(1, 12), 0]
        ind, idx, last, pages = _paged(rng, lens, ps)
        cache = [_r16(rng.uniform(-1, 1)) for _ in range(pages * 2 * ps * hkv * d)]
        qo = [1, 1, 1] if op == "batch_decode" else [rng.randrange(1, 5), rng.randrange(1, 4), rng.randrange(0, 3)]
        qo_ind = _prefix(qo)
        rows = qo_ind[-1]
        q = [_r16(rng.uniform(-1, 1)) for _ in range(rows * hq * d)]
        sinks = [_r32(rng.uniform(-1, 5)) for _ in range(hq)]
        scale, causal = 0.25, op == "batch_prefill_paged"

        def kv_at(req, t, kv, h, f):  # NHD: [pages, 2, N, H, D]
            page, entry = idx[ind[req] + t // ps], t % ps
            return cache[(((page * 2 + kv) * ps + entry) * hkv + h) * d + f]

        o, lse_out = [], []
        for req in range(b):
            for i in range(qo[req]):
                pos = i + lens[req] - qo[req]
                keys = [t for t in range(lens[req]) if not causal or t <= pos]
                r = qo_ind[req] + i
                for h in range(hq):
                    logits = [scale * sum(q[(r * hq + h) * d + f] * kv_at(req, t, 0, h // g, f) for f in range(d)) for t in keys]
                    m = max(logits + [sinks[h]])
                    z = math.exp(sinks[h] - m) + sum(math.exp(x - m) for x in logits)
                    o += [sum(math.exp(logits[k] - m) / z * kv_at(req, t, 1, h // g, f) for k, t in enumerate(keys)) for f in range(d)]
                    lse_out.append((m + math.log(z)) / math.log(2))
        meta = {"op": op, "kv_layout": "NHD", "page_size": str(ps), "num_qo_heads": str(hq), "num_kv_heads": str(hkv),
                "head_dim": str(d), "sm_scale": str(scale), "atol": "1e-3", "rtol": "1e-3"}
        tensors = {"in.q": f16(q, [rows, hq, d]), "in.paged_kv_cache": f16(cache, [pages, 2, ps, hkv, d]),
                   "in.kv_indptr": i32(ind), "in.kv_indices": i32(idx), "in.kv_last_page_len": i32(last),
                   "in.sinks": f32(sinks, [hq]), "out.o": f32(o, [rows, hq, d]), "out.lse": f32(lse_out, [rows, hq])}
        if causal:
            meta["causal"] = "1"
            tensors["in.qo_indptr"] = i32(qo_ind)
        yield "py_%s_sinks" % op, meta, tensors


def write_sink_cases(directory, seed):
    """Writes the shipped sink cases: <op>_sinks_<seed>_00."""
    os.makedirs(directory, exist_ok=True)
    rng = random.Random(seed)
    paths = [write_case(directory, name[3:].replace("_sinks", "_sinks_%d_00" % seed), meta, tensors)
             for name, meta, tensors in sink_cases(rng)]
    print("sinks: wrote %d cases to %s" % (len(paths), directory))
    return paths


def write_synthetic(directory, seed):
    os.makedirs(directory, exist_ok=True)
    rng = random.Random(seed)
    paths = [write_case(directory, name, meta, tensors) for name, meta, tensors in synthetic_cases(rng)]
    paths += [write_case(directory, name, meta, tensors) for name, meta, tensors in sink_cases(rng)]
    print("synthetic: wrote %d cases to %s" % (len(paths), directory))
    return paths


# ---------------------------------------------------------------------------
# FlashInfer cases (GPU): the expected outputs are FlashInfer's own results.


def flashinfer_cases(seed, count, dtype_name):
    """Yields (name, meta, tensors) computed with FlashInfer on the GPU."""
    try:
        import torch
        import flashinfer
    except ImportError as e:
        raise SystemExit("--out needs torch and flashinfer-python (%s); --check and --synthetic do not" % e)
    if not torch.cuda.is_available():
        raise SystemExit("--out needs a CUDA GPU (torch.cuda.is_available() is False)")
    dev = "cuda"
    dt = {"float16": torch.float16, "bfloat16": torch.bfloat16}[dtype_name]
    tol = {"float16": "2e-3", "bfloat16": "1.6e-2"}[dtype_name]
    g = torch.Generator(device="cpu").manual_seed(seed)
    rng = random.Random(seed)
    ws = torch.empty(128 << 20, dtype=torch.uint8, device=dev)
    # packbits moved between flashinfer.quantization and the top level across releases.
    packbits = getattr(flashinfer, "packbits", None) or flashinfer.quantization.packbits
    segment_packbits = getattr(flashinfer, "segment_packbits", None) or flashinfer.quantization.segment_packbits

    def to_tensor(x):
        """A torch tensor as a file tensor (float outputs become F32)."""
        x = x.detach().contiguous().cpu()
        if x.dtype == torch.int32:
            return Tensor("I32", list(x.shape), x.numpy().tobytes())
        if x.dtype == torch.uint8:
            return Tensor("U8", list(x.shape), x.numpy().tobytes())
        if x.dtype == torch.float32:
            return Tensor("F32", list(x.shape), x.numpy().tobytes())
        if x.dtype == torch.float8_e4m3fn:
            return Tensor("F8_E4M3", list(x.shape), x.view(torch.uint8).numpy().tobytes())
        if x.dtype in (torch.float16, torch.bfloat16):
            bits = x.view(torch.int16).numpy().tobytes()
            return Tensor("F16" if x.dtype == torch.float16 else "BF16", list(x.shape), bits)
        raise ValueError("no file dtype for %s" % x.dtype)

    def out_f32(x):
        return to_tensor(x.float())

    def rand(*shape):
        return (torch.rand(*shape, generator=g) * 2 - 1).to(dt).to(dev)

    def ivec(v):
        return torch.tensor(v, dtype=torch.int32, device=dev)

    def table(seq_lens, ps):
        ind, idx, last, pages = _paged(rng, seq_lens, ps)
        return ivec(ind), ivec(idx), ivec(last), pages

    for k in range(count):
        tag = "%s_%d_%02d" % (dtype_name, seed, k)
        ps = rng.choice([1, 4, 16])
        B = rng.randrange(1, 6)
        seq = [rng.randrange(1, 60) for _ in range(B)]  # MLA plans need kv_len >= 1
        hkv, grp, D = rng.choice([1, 2, 4]), rng.choice([1, 2, 4, 8]), rng.choice([64, 128, 256])
        hq = hkv * grp
        layout = rng.choice(["NHD", "HND"])

        # get_seq_lens / get_batch_indices_positions
        ind, idx, last, pages = table(seq, ps)
        seq_lens = flashinfer.page.get_seq_lens(ind, last, ps).to(torch.int32)
        yield "get_seq_lens_" + tag, {"op": "get_seq_lens", "page_size": str(ps)}, {
            "in.kv_indptr": to_tensor(ind), "in.kv_last_page_len": to_tensor(last), "out.seq_lens": to_tensor(seq_lens)}
        app = [rng.randrange(0, n + 1) for n in seq]
        app_ind = ivec(_prefix(app))
        nnz = sum(app)
        bi, pos = flashinfer.page.get_batch_indices_positions(app_ind, seq_lens, nnz)
        yield "get_batch_indices_positions_" + tag, {"op": "get_batch_indices_positions", "nnz": str(nnz)}, {
            "in.append_indptr": to_tensor(app_ind), "in.seq_lens": to_tensor(seq_lens),
            "out.batch_indices": to_tensor(bi.to(torch.int32)), "out.positions": to_tensor(pos.to(torch.int32))}

        # append_paged_kv_cache into the post-append table
        shape = [pages, 2, ps, hkv, D] if layout == "NHD" else [pages, 2, hkv, ps, D]
        cache = rand(*shape)
        key, val = rand(nnz, hkv, D), rand(nnz, hkv, D)
        before = cache.clone()
        flashinfer.page.append_paged_kv_cache(key, val, bi, pos, cache, idx, ind, last, kv_layout=layout)
        yield "append_paged_kv_cache_" + tag, {"op": "append_paged_kv_cache", "kv_layout": layout, "page_size": str(ps)}, {
            "in.append_key": to_tensor(key), "in.append_value": to_tensor(val), "in.batch_indices": to_tensor(bi.to(torch.int32)),
            "in.positions": to_tensor(pos.to(torch.int32)), "in.kv_indices": to_tensor(idx), "in.kv_indptr": to_tensor(ind),
            "in.kv_last_page_len": to_tensor(last), "in.paged_kv_cache": to_tensor(before), "out.paged_kv_cache": to_tensor(cache)}

        # NVFP4: FlashInfer's quantising append into a cache of random old
        # bytes, then a decode whose expected output is float64 attention over
        # the bytes FlashInfer wrote (dequantised here from page.cuh's layout).
        if D % 16 == 0 and hasattr(flashinfer.page, "nvfp4_quantize_append_paged_kv_cache"):
            dshape = shape[:4] + [D // 2]
            data = torch.randint(0, 256, dshape, dtype=torch.uint8, generator=g).to(dev)
            sfc = torch.randint(0, 0x7F, shape[:4] + [D // 16], dtype=torch.uint8, generator=g).to(dev).view(torch.float8_e4m3fn)
            data0, sf0 = data.clone(), sfc.clone()
            ks = float(key.float().abs().max()) / (6 * 448) or 1.0
            vs = float(val.float().abs().max()) / (6 * 448) or 1.0
            flashinfer.page.nvfp4_quantize_append_paged_kv_cache(key, val, bi, pos, data, sfc, idx, ind, last, ks, vs, kv_layout=layout)
            nv = {"kv_layout": layout, "page_size": str(ps), "k_scale": repr(ks), "v_scale": repr(vs)}
            yield "nvfp4_quantize_append_paged_kv_cache_" + tag, dict(nv, op="nvfp4_quantize_append_paged_kv_cache"), {
                "in.append_key": to_tensor(key), "in.append_value": to_tensor(val), "in.batch_indices": to_tensor(bi.to(torch.int32)),
                "in.positions": to_tensor(pos.to(torch.int32)), "in.kv_indices": to_tensor(idx), "in.kv_indptr": to_tensor(ind),
                "in.kv_last_page_len": to_tensor(last), "in.paged_kv_cache": to_tensor(data0), "in.kv_cache_sf": to_tensor(sf0),
                "out.paged_kv_cache": to_tensor(data), "out.kv_cache_sf": to_tensor(sfc)}
            lut = torch.tensor([v * (-1 if c & 8 else 1) for c in range(16) for v in [E2M1[c & 7]]], dtype=torch.float64)
            d8 = data.cpu().long()
            codes = torch.stack([d8 & 0xF, d8 >> 4], dim=-1).reshape(shape)
            sfv = sfc.cpu().float().double().repeat_interleave(16, dim=-1)
            deq = lut[codes] * sfv  # [pages, 2, ..., D]
            if layout == "HND":
                deq = deq.transpose(2, 3)  # [pages, 2, N, H, D]
            qn = rand(B, hq, D)
            o = torch.zeros(B, hq, D, dtype=torch.float64)
            lse = torch.zeros(B, hq, dtype=torch.float64)
            il, ii, la = ind.tolist(), idx.tolist(), last.tolist()
            for b in range(B):
                pgs = ii[il[b]:il[b + 1]]
                n = 0 if not pgs else (len(pgs) - 1) * ps + la[b]
                if n == 0:
                    lse[b] = -math.inf
                    continue
                kv = torch.cat([deq[p_] for p_ in pgs], dim=1)[:, :n]  # [2, n, H, D]
                for h in range(hq):
                    kk, vv = kv[0, :, h // (hq // hkv)] * ks, kv[1, :, h // (hq // hkv)] * vs
                    logits = (kk @ qn[b, h].cpu().double()) / math.sqrt(D)
                    w = torch.softmax(logits, 0)
                    o[b, h] = w @ vv
                    lse[b, h] = torch.logsumexp(logits, 0) / math.log(2)
            yield "batch_decode_nvfp4_" + tag, dict(nv, op="batch_decode_nvfp4", num_qo_heads=str(hq), num_kv_heads=str(hkv),
                                                     head_dim=str(D), atol="1e-4", rtol="1e-4"), {
                "in.q": to_tensor(qn), "in.paged_kv_cache": to_tensor(data), "in.kv_cache_sf": to_tensor(sfc),
                "in.kv_indptr": to_tensor(ind), "in.kv_indices": to_tensor(idx), "in.kv_last_page_len": to_tensor(last),
                "out.o": to_tensor(o.float()), "out.lse": to_tensor(lse.float())}

        # append_paged_mla_kv_cache (ckv 512, kpe 64)
        ckv, kpe = rand(pages, ps, 512), rand(pages, ps, 64)
        ckv0, kpe0 = ckv.clone(), kpe.clone()
        a_ckv, a_kpe = rand(nnz, 512), rand(nnz, 64)
        flashinfer.page.append_paged_mla_kv_cache(a_ckv, a_kpe, bi, pos, ckv, kpe, idx, ind, last)
        yield "append_paged_mla_kv_cache_" + tag, {"op": "append_paged_mla_kv_cache", "page_size": str(ps)}, {
            "in.append_ckv": to_tensor(a_ckv), "in.append_kpe": to_tensor(a_kpe), "in.batch_indices": to_tensor(bi.to(torch.int32)),
            "in.positions": to_tensor(pos.to(torch.int32)), "in.kv_indices": to_tensor(idx), "in.kv_indptr": to_tensor(ind),
            "in.kv_last_page_len": to_tensor(last), "in.ckv_cache": to_tensor(ckv0), "in.kpe_cache": to_tensor(kpe0),
            "out.ckv_cache": to_tensor(ckv), "out.kpe_cache": to_tensor(kpe)}

        # batch decode
        sm_scale = 1 / math.sqrt(D)
        window = rng.choice([-1, -1, rng.randrange(0, 20)])
        cap = rng.choice([0.0, 30.0])
        q = rand(B, hq, D)
        dec = flashinfer.BatchDecodeWithPagedKVCacheWrapper(ws, kv_layout=layout)
        dec.plan(ind, idx, last, hq, hkv, D, ps, window_left=window, logits_soft_cap=cap, sm_scale=sm_scale,
                 q_data_type=dt, kv_data_type=dt)
        o, lse = dec.run(q, cache, return_lse=True)
        common = {"kv_layout": layout, "page_size": str(ps), "num_qo_heads": str(hq), "num_kv_heads": str(hkv), "head_dim": str(D),
                  "sm_scale": repr(sm_scale), "atol": tol, "rtol": tol}
        yield "batch_decode_" + tag, dict(common, op="batch_decode", window_left=str(window), logits_soft_cap=repr(cap)), {
            "in.q": to_tensor(q), "in.paged_kv_cache": to_tensor(cache), "in.kv_indptr": to_tensor(ind), "in.kv_indices": to_tensor(idx),
            "in.kv_last_page_len": to_tensor(last), "out.o": out_f32(o), "out.lse": out_f32(lse)}

        # the same decode in the padded contract (trtllm-gen on sm_100,
        # XQA on sm_90/sm_120; skipped where FlashInfer has neither):
        # rows padded with page 0 and one spare column, as Plan.BlockTables
        ind_l, idx_l = ind.tolist(), idx.tolist()
        cols = max(ind_l[i + 1] - ind_l[i] for i in range(B)) + 1
        bt = [0] * (B * cols)
        for i in range(B):
            row = idx_l[ind_l[i]:ind_l[i + 1]]
            bt[i * cols:i * cols + len(row)] = row
        bt = ivec(bt).reshape(B, cols)
        try:
            o = flashinfer.decode.trtllm_batch_decode_with_kv_cache(
                q, cache, ws, bt, seq_lens, cols * ps, bmm1_scale=sm_scale, bmm2_scale=1.0, window_left=window,
                kv_layout=layout)
        except Exception as e:  # noqa: BLE001: an architecture or shape FlashInfer does not build
            print("trtllm_batch_decode_%s skipped: %s" % (tag, e), file=sys.stderr)
        else:
            yield "trtllm_batch_decode_" + tag, dict(common, op="trtllm_batch_decode", window_left=str(window),
                                                     max_seq_len=str(cols * ps)), {
                "in.q": to_tensor(q), "in.paged_kv_cache": to_tensor(cache), "in.block_tables": to_tensor(bt),
                "in.seq_lens": to_tensor(seq_lens), "out.o": out_f32(o)}

        # batch prefill over the same cache: the last qo_len tokens of each request
        qo = [rng.randrange(0, n + 1) for n in seq]
        qo_ind = ivec(_prefix(qo))
        qp = rand(sum(qo), hq, D)
        causal = rng.choice([True, False])
        pre = flashinfer.BatchPrefillWithPagedKVCacheWrapper(ws, kv_layout=layout)
        pre.plan(qo_ind, ind, idx, last, hq, hkv, D, ps, causal=causal, window_left=window, logits_soft_cap=cap,
                 sm_scale=sm_scale, q_data_type=dt, kv_data_type=dt)
        o, lse = pre.run(qp, cache, return_lse=True)
        yield "batch_prefill_paged_" + tag, dict(common, op="batch_prefill_paged", window_left=str(window), logits_soft_cap=repr(cap),
                                                  causal=str(int(causal))), {
            "in.q": to_tensor(qp), "in.qo_indptr": to_tensor(qo_ind), "in.paged_kv_cache": to_tensor(cache),
            "in.kv_indptr": to_tensor(ind), "in.kv_indices": to_tensor(idx), "in.kv_last_page_len": to_tensor(last),
            "out.o": out_f32(o), "out.lse": out_f32(lse)}

        # merge_state / merge_states (FlashInfer takes f16/bf16 v, f32 s)
        n, h = rng.randrange(1, 9), rng.randrange(1, 5)
        va, vb = rand(n, h, D), rand(n, h, D)
        sa = (torch.rand(n, h, generator=g) * 8 - 4).to(dev)
        sb = (torch.rand(n, h, generator=g) * 8 - 4).to(dev)
        v, s = flashinfer.merge_state(va, sa, vb, sb)
        yield "merge_state_" + tag, {"op": "merge_state", "atol": tol, "rtol": tol}, {
            "in.v_a": to_tensor(va), "in.s_a": to_tensor(sa), "in.v_b": to_tensor(vb), "in.s_b": to_tensor(sb),
            "out.v": out_f32(v), "out.s": out_f32(s)}
        ns = rng.randrange(1, 6)
        vs = rand(n, ns, h, D)
        ss = (torch.rand(n, ns, h, generator=g) * 8 - 4).to(dev)
        v, s = flashinfer.merge_states(vs, ss)
        yield "merge_states_" + tag, {"op": "merge_states", "atol": tol, "rtol": tol}, {
            "in.v": to_tensor(vs), "in.s": to_tensor(ss), "out.v": out_f32(v), "out.s": out_f32(s)}

        # MLA decode (BatchMLAPagedAttentionWrapper), kv_len in tokens
        kv_len = ivec([min(n, (int(ind[i + 1]) - int(ind[i])) * ps) for i, n in enumerate(seq)])
        heads = rng.choice([1, 4, 16])
        q_nope, q_pe = rand(B, heads, 512), rand(B, heads, 64)
        mla_scale = 1 / math.sqrt(128 + 64)
        mla = flashinfer.mla.BatchMLAPagedAttentionWrapper(ws)
        mla.plan(ivec(list(range(B + 1))), ind, idx, kv_len, heads, 512, 64, ps, False, mla_scale, dt, dt)
        o, lse = mla.run(q_nope, q_pe, ckv, kpe, return_lse=True)
        yield "mla_decode_" + tag, {"op": "mla_decode", "page_size": str(ps), "num_heads": str(heads), "head_dim_ckv": "512",
                                    "head_dim_kpe": "64", "sm_scale": repr(mla_scale), "atol": tol, "rtol": tol}, {
            "in.q_nope": to_tensor(q_nope), "in.q_pe": to_tensor(q_pe), "in.ckv_cache": to_tensor(ckv), "in.kpe_cache": to_tensor(kpe),
            "in.kv_indptr": to_tensor(ind), "in.kv_indices": to_tensor(idx), "in.kv_len": to_tensor(kv_len),
            "out.o": out_f32(o), "out.lse": out_f32(lse)}

        # Two-level cascade: one shared prefix, then each request's own pages.
        shared = rng.randrange(1, 40)
        s_ind, s_idx, s_last, s_pages = _paged(rng, [shared], ps)
        u_lens = [rng.randrange(1, 30) for _ in range(B)]
        u_ind, u_idx, u_last, u_pages = _paged(rng, u_lens, ps)
        u_idx = [p + s_pages for p in u_idx]
        cshape = [s_pages + u_pages, 2, ps, hkv, D] if layout == "NHD" else [s_pages + u_pages, 2, hkv, ps, D]
        ccache = rand(*cshape)
        qlen = [rng.randrange(1, n + 1) for n in u_lens]
        nq = sum(qlen)
        qc = rand(nq, hq, D)
        qo_arr = [ivec([0, nq]), ivec(_prefix(qlen))]
        casc = flashinfer.MultiLevelCascadeAttentionWrapper(2, ws, kv_layout=layout)
        casc.plan(qo_arr, [ivec(s_ind), ivec(u_ind)], [ivec(s_idx), ivec(u_idx)], [ivec(s_last), ivec(u_last)],
                  hq, hkv, D, ps, causal=True, sm_scale=sm_scale, q_data_type=dt, kv_data_type=dt)
        o = casc.run(qc, ccache)
        tensors = {"in.q": to_tensor(qc), "in.paged_kv_cache": to_tensor(ccache), "out.o": out_f32(o)}
        for lvl, (qi, ki, kx, kl) in enumerate([(qo_arr[0], s_ind, s_idx, s_last), (qo_arr[1], u_ind, u_idx, u_last)]):
            tensors["in.qo_indptr.%d" % lvl] = to_tensor(qi)
            tensors["in.kv_indptr.%d" % lvl] = i32(ki)
            tensors["in.kv_indices.%d" % lvl] = i32(kx)
            tensors["in.kv_last_page_len.%d" % lvl] = i32(kl)
        meta = {k: v for k, v in common.items()}
        yield "cascade_attention_" + tag, dict(meta, op="cascade_attention", num_levels="2", causal="1"), tensors

        # packbits / segment_packbits (little, as FlashInfer's masks use)
        bits = (torch.rand(rng.randrange(1, 200), generator=g) < 0.5).to(torch.uint8).to(dev)
        y = packbits(bits.bool(), "little")
        yield "packbits_" + tag, {"op": "packbits", "bitorder": "little"}, {"in.x": to_tensor(bits), "out.y": to_tensor(y)}
        segs = [rng.randrange(0, 40) for _ in range(rng.randrange(1, 6))]
        seg_ind = ivec(_prefix(segs))
        bits = (torch.rand(sum(segs), generator=g) < 0.5).to(torch.uint8).to(dev)
        y, new_ind = segment_packbits(bits.bool(), seg_ind, "little")
        yield "segment_packbits_" + tag, {"op": "segment_packbits", "bitorder": "little"}, {
            "in.x": to_tensor(bits), "in.indptr": to_tensor(seg_ind), "out.y": to_tensor(y), "out.indptr": to_tensor(new_ind.to(torch.int32))}


def write_flashinfer(directory, seed, count, dtype_name):
    os.makedirs(directory, exist_ok=True)
    n = 0
    for name, meta, tensors in flashinfer_cases(seed, count, dtype_name):
        write_case(directory, name, meta, tensors)
        n += 1
    print("flashinfer: wrote %d cases to %s" % (n, directory))


# ---------------------------------------------------------------------------


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    mode = ap.add_mutually_exclusive_group(required=True)
    mode.add_argument("--out", metavar="DIR", help="write FlashInfer cases (GPU, torch, flashinfer-python)")
    mode.add_argument("--check", metavar="PATH", nargs="*", help="validate files or directories (pure Python)")
    mode.add_argument("--synthetic", metavar="DIR", help="write pure-Python cases (no torch)")
    mode.add_argument("--sinks", metavar="DIR", help="write the pure-Python attention-sink cases shipped in testdata/golden")
    ap.add_argument("--seed", type=int, default=0, help="random seed (default 0)")
    ap.add_argument("--count", type=int, default=1, help="--out: rounds of cases (one per op each), default 1")
    ap.add_argument("--dtype", choices=["float16", "bfloat16"], default="float16", help="--out: q and cache dtype")
    args = ap.parse_args(argv)
    if args.check is not None:
        if args.check:
            _, bad = check_paths(args.check)
            return 1 if bad else 0
        with tempfile.TemporaryDirectory() as tmp:
            write_synthetic(tmp, args.seed)
            ok, bad = check_paths([tmp])
            # The checker must also refuse what it should: a mutated copy.
            sample = find_cases([tmp])[0]
            with open(sample, "rb") as f:
                buf = bytearray(f.read())
            buf[8] = ord("[")  # the header is no longer a JSON object
            try:
                check_bytes(bytes(buf))
                print("self-test: a corrupted header was accepted", file=sys.stderr)
                return 1
            except FormatError:
                pass
            return 1 if bad or not ok else 0
    if args.synthetic is not None:
        write_synthetic(args.synthetic, args.seed)
        return 0
    if args.sinks is not None:
        write_sink_cases(args.sinks, args.seed)
        return 0
    write_flashinfer(args.out, args.seed, args.count, args.dtype)
    return 0


if __name__ == "__main__":
    sys.exit(main())
