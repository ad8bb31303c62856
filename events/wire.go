package events

import (
	"bytes"
	"encoding/binary"

	"github.com/vmihailenco/msgpack/v5"
)

// Wire format (docs/events.md): what msgspec produces for vLLM's
// KVEventBatch. The batch is array-like, [ts, events, data_parallel_rank];
// each event is a map whose first key is the tag "type", then its fields in
// vLLM's declaration order, leaving out the ones that have a default and
// hold it (omit_defaults). Integers take their shortest msgpack form and
// floats are float64, as msgspec writes them.

// Encoder encodes batches. It reuses its buffer: the slice AppendBatch
// returns is the caller's, the encoder's state is not.
type Encoder struct {
	buf bytes.Buffer
	enc *msgpack.Encoder
}

// NewEncoder returns an Encoder.
func NewEncoder() *Encoder {
	e := &Encoder{}
	e.enc = msgpack.NewEncoder(&e.buf)
	return e
}

// AppendBatch appends the msgpack payload of b, published by data-parallel
// rank dpRank, to dst.
func (e *Encoder) AppendBatch(dst []byte, b *Batch, dpRank int) []byte {
	e.buf.Reset()
	w := e.enc
	// Writes to a bytes.Buffer cannot fail.
	_ = w.EncodeArrayLen(3)
	_ = w.EncodeFloat64(b.TS)
	_ = w.EncodeArrayLen(len(b.events))
	for i := range b.events {
		e.event(b, &b.events[i])
	}
	_ = w.EncodeInt(int64(dpRank))
	return append(dst, e.buf.Bytes()...)
}

func (e *Encoder) event(b *Batch, ev *event) {
	w, m := e.enc, b.meta
	if ev.kind == Cleared {
		_ = w.EncodeMapLen(1)
		e.str("type", kindTags[Cleared])
		return
	}
	gm := &m.groups[ev.g]
	switch ev.kind {
	case Removed:
		n := 3
		if gm.hasGroup {
			n++
		}
		_ = w.EncodeMapLen(n)
		e.str("type", kindTags[Removed])
		e.hashes("block_hashes", b.hashes[ev.h0:ev.h1])
		e.str("medium", ev.medium(m))
		if gm.hasGroup {
			e.int("group_idx", int64(gm.group))
		}
	case Stored:
		n := 8
		if gm.hasGroup {
			n++
		}
		if gm.specKind != "" {
			n++
		}
		if gm.slidingWindow > 0 {
			n++
		}
		_ = w.EncodeMapLen(n)
		e.str("type", kindTags[Stored])
		e.hashes("block_hashes", b.hashes[ev.h0:ev.h1])
		_ = w.EncodeString("parent_block_hash")
		if ev.hasParent {
			_ = w.EncodeUint(ev.parent)
		} else {
			_ = w.EncodeNil()
		}
		_ = w.EncodeString("token_ids")
		toks := b.tokens[ev.t0:ev.t1]
		_ = w.EncodeArrayLen(len(toks))
		for _, t := range toks {
			_ = w.EncodeInt(int64(t))
		}
		e.int("block_size", int64(m.pageSize))
		_ = w.EncodeString("lora_id")
		_ = w.EncodeNil()
		e.str("medium", ev.medium(m))
		_ = w.EncodeString("lora_name")
		if ev.lora != "" {
			_ = w.EncodeString(ev.lora)
		} else {
			_ = w.EncodeNil()
		}
		// event_version (1) and extra_keys (None) hold their defaults.
		if gm.hasGroup {
			e.int("group_idx", int64(gm.group))
		}
		if gm.specKind != "" {
			e.str("kv_cache_spec_kind", gm.specKind)
		}
		if gm.slidingWindow > 0 {
			e.int("kv_cache_spec_sliding_window", int64(gm.slidingWindow))
		}
	}
}

// medium is the event's vLLM medium: "CPU" for the host tier's pages, the
// recorder's (default "GPU") for the device's.
func (ev *event) medium(m *meta) string {
	if ev.host {
		return MediumCPU
	}
	return m.medium
}

func (e *Encoder) str(k, v string) {
	_ = e.enc.EncodeString(k)
	_ = e.enc.EncodeString(v)
}

func (e *Encoder) int(k string, v int64) {
	_ = e.enc.EncodeString(k)
	_ = e.enc.EncodeInt(v)
}

func (e *Encoder) hashes(k string, hs []uint64) {
	_ = e.enc.EncodeString(k)
	_ = e.enc.EncodeArrayLen(len(hs))
	for _, h := range hs {
		_ = e.enc.EncodeUint(h)
	}
}

// EndOfReplay is the sequence frame that ends a replay: -1 as an 8-byte
// big-endian signed integer, vLLM's END_SEQ.
var EndOfReplay = []byte{0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff}

// seqFrame encodes a sequence number as vLLM does (8 bytes, big-endian).
func seqFrame(seq uint64) []byte { return binary.BigEndian.AppendUint64(make([]byte, 0, 8), seq) }
