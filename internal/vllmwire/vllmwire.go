// Package vllmwire is a strict decoder of vLLM's KV-event wire format,
// written from vLLM's definitions (vllm/distributed/kv_events.py: the
// msgspec structs KVEventBatch, BlockStored, BlockRemoved,
// AllBlocksCleared and ZmqEventPublisher's framing) for tests only. It
// shares no code with package events (the encoder) or package kvindex (the
// router's decoder): it decodes generically into Go values and checks
// every field against vLLM's schema, so an encoder bug cannot hide behind
// a decoder that makes the same mistake.
//
// It is test support, like internal/reference: only tests import it.
//
// # Invariants
//
//   - [Decode] accepts only what vLLM's schema allows (a batch array of 2
//     or 3 elements, a non-negative ts, events of the known types with
//     fields of the schema's types) and names the first field that is not.
//   - Applying a consistent stream never fails: [Set.Apply] reports a block
//     stored under a parent that is not cached, a hash stored twice, a
//     removal of a hash not cached and an event of another medium, so the
//     sets a test rebuilds are exactly the publisher's.
//   - It shares no code with events or kvindex.
//
// # Concurrency
//
// Its values are plain maps and slices: one goroutine each.
package vllmwire

import (
	"encoding/binary"
	"fmt"
	"math"
	"slices"

	"github.com/vmihailenco/msgpack/v5"
)

// Event is one decoded event.
type Event struct {
	Type            string // BlockStored, BlockRemoved, AllBlocksCleared
	BlockHashes     []uint64
	ParentBlockHash *uint64
	TokenIDs        []int64
	BlockSize       int64
	LoRAName        *string
	Medium          *string
	GroupIdx        *int64
	SpecKind        *string  // kv_cache_spec_kind (BlockStored)
	SlidingWindow   *int64   // kv_cache_spec_sliding_window (BlockStored)
	Keys            []string // the map's keys in wire order
}

// Batch is one decoded KVEventBatch.
type Batch struct {
	TS     float64
	Events []Event
	DPRank *int64
}

// Message is one ZMQ message of the PUB socket.
type Message struct {
	Topic   string
	Seq     int64
	Payload []byte
}

// ParseMessage checks the [topic, 8-byte big-endian sequence, payload]
// framing.
func ParseMessage(frames [][]byte) (Message, error) {
	if len(frames) != 3 {
		return Message{}, fmt.Errorf("vllmwire: %d frames, want 3 (topic, seq, payload)", len(frames))
	}
	if len(frames[1]) != 8 {
		return Message{}, fmt.Errorf("vllmwire: sequence frame of %d bytes, want 8", len(frames[1]))
	}
	return Message{Topic: string(frames[0]), Seq: int64(binary.BigEndian.Uint64(frames[1])), Payload: frames[2]}, nil
}

// Fields of vLLM's structs: required ones (no default, so msgspec's
// decoder rejects a map without them) and optional ones.
var (
	storedRequired  = []string{"type", "block_hashes", "parent_block_hash", "token_ids", "block_size", "lora_id", "medium", "lora_name"}
	storedOptional  = []string{"event_version", "extra_keys", "group_idx", "kv_cache_spec_kind", "kv_cache_spec_sliding_window", "locality", "ownership"}
	removedRequired = []string{"type", "block_hashes", "medium"}
	removedOptional = []string{"group_idx", "locality", "ownership"}
)

// Decode decodes and checks one payload.
func Decode(payload []byte) (Batch, error) {
	var raw any
	if err := msgpack.Unmarshal(payload, &raw); err != nil {
		return Batch{}, fmt.Errorf("vllmwire: payload is not msgpack: %w", err)
	}
	arr, ok := raw.([]any)
	if !ok || len(arr) < 2 || len(arr) > 3 {
		return Batch{}, fmt.Errorf("vllmwire: batch is %T of %v, want the array [ts, events, data_parallel_rank?]", raw, lenOf(raw))
	}
	var b Batch
	switch ts := arr[0].(type) {
	case float64:
		b.TS = ts
	default:
		return Batch{}, fmt.Errorf("vllmwire: ts is %T, want float64", arr[0])
	}
	if math.IsNaN(b.TS) || b.TS < 0 {
		return Batch{}, fmt.Errorf("vllmwire: ts = %v", b.TS)
	}
	if len(arr) == 3 && arr[2] != nil {
		r, ok := asInt(arr[2])
		if !ok {
			return Batch{}, fmt.Errorf("vllmwire: data_parallel_rank is %T", arr[2])
		}
		b.DPRank = &r
	}
	evs, ok := arr[1].([]any)
	if !ok {
		return Batch{}, fmt.Errorf("vllmwire: events is %T, want an array", arr[1])
	}
	for i, e := range evs {
		ev, err := decodeEvent(e)
		if err != nil {
			return Batch{}, fmt.Errorf("vllmwire: event %d: %w", i, err)
		}
		b.Events = append(b.Events, ev)
	}
	return b, nil
}

func lenOf(v any) int {
	if a, ok := v.([]any); ok {
		return len(a)
	}
	return -1
}

func decodeEvent(e any) (Event, error) {
	// msgspec's tagged map form (vLLM since PR #42892); the keys' order
	// is kept by decoding the map by hand.
	m, ok := e.(map[string]any)
	if !ok {
		return Event{}, fmt.Errorf("event is %T, want a map with a \"type\" tag", e)
	}
	var ev Event
	tag, ok := m["type"].(string)
	if !ok {
		return Event{}, fmt.Errorf("tag \"type\" is %T", m["type"])
	}
	ev.Type = tag
	var req, opt []string
	switch tag {
	case "BlockStored":
		req, opt = storedRequired, storedOptional
	case "BlockRemoved":
		req, opt = removedRequired, removedOptional
	case "AllBlocksCleared":
		req = []string{"type"}
	default:
		return Event{}, fmt.Errorf("unknown tag %q", tag)
	}
	for _, k := range req {
		if _, ok := m[k]; !ok {
			return Event{}, fmt.Errorf("%s without required field %q", tag, k)
		}
	}
	for k := range m {
		if !slices.Contains(req, k) && !slices.Contains(opt, k) {
			return Event{}, fmt.Errorf("%s with unknown field %q", tag, k)
		}
		ev.Keys = append(ev.Keys, k)
	}
	slices.Sort(ev.Keys)
	if tag == "AllBlocksCleared" {
		return ev, nil
	}
	hs, ok := m["block_hashes"].([]any)
	if !ok || len(hs) == 0 {
		return Event{}, fmt.Errorf("%s block_hashes is %T of %d, want a non-empty array", tag, m["block_hashes"], lenOf(m["block_hashes"]))
	}
	for i, h := range hs {
		u, ok := asUint(h)
		if !ok {
			return Event{}, fmt.Errorf("%s block_hashes[%d] is %T, want an integer", tag, i, h)
		}
		ev.BlockHashes = append(ev.BlockHashes, u)
	}
	if s, ok := m["medium"].(string); ok {
		ev.Medium = &s
	} else if m["medium"] != nil {
		return Event{}, fmt.Errorf("%s medium is %T", tag, m["medium"])
	}
	if g, present := m["group_idx"]; present && g != nil {
		v, ok := asInt(g)
		if !ok {
			return Event{}, fmt.Errorf("%s group_idx is %T", tag, g)
		}
		ev.GroupIdx = &v
	}
	if tag == "BlockRemoved" {
		return ev, nil
	}
	if k, present := m["kv_cache_spec_kind"]; present && k != nil {
		s, ok := k.(string)
		if !ok {
			return Event{}, fmt.Errorf("kv_cache_spec_kind is %T", k)
		}
		ev.SpecKind = &s
	}
	if w, present := m["kv_cache_spec_sliding_window"]; present && w != nil {
		v, ok := asInt(w)
		if !ok {
			return Event{}, fmt.Errorf("kv_cache_spec_sliding_window is %T", w)
		}
		ev.SlidingWindow = &v
	}
	if p := m["parent_block_hash"]; p != nil {
		u, ok := asUint(p)
		if !ok {
			return Event{}, fmt.Errorf("parent_block_hash is %T", p)
		}
		ev.ParentBlockHash = &u
	}
	bs, ok := asInt(m["block_size"])
	if !ok || bs < 1 {
		return Event{}, fmt.Errorf("block_size is %v (%T)", m["block_size"], m["block_size"])
	}
	ev.BlockSize = bs
	toks, ok := m["token_ids"].([]any)
	if !ok {
		return Event{}, fmt.Errorf("token_ids is %T", m["token_ids"])
	}
	for i, t := range toks {
		v, ok := asInt(t)
		if !ok {
			return Event{}, fmt.Errorf("token_ids[%d] is %T", i, t)
		}
		ev.TokenIDs = append(ev.TokenIDs, v)
	}
	if int64(len(ev.TokenIDs)) != int64(len(ev.BlockHashes))*bs {
		return Event{}, fmt.Errorf("%d token ids for %d blocks of %d", len(ev.TokenIDs), len(ev.BlockHashes), bs)
	}
	if m["lora_id"] != nil {
		if _, ok := asInt(m["lora_id"]); !ok {
			return Event{}, fmt.Errorf("lora_id is %T", m["lora_id"])
		}
	}
	if s, ok := m["lora_name"].(string); ok {
		ev.LoRAName = &s
	} else if m["lora_name"] != nil {
		return Event{}, fmt.Errorf("lora_name is %T", m["lora_name"])
	}
	return ev, nil
}

func asInt(v any) (int64, bool) {
	switch x := v.(type) {
	case int8:
		return int64(x), true
	case int16:
		return int64(x), true
	case int32:
		return int64(x), true
	case int64:
		return x, true
	case uint8:
		return int64(x), true
	case uint16:
		return int64(x), true
	case uint32:
		return int64(x), true
	case uint64:
		if x <= math.MaxInt64 {
			return int64(x), true
		}
	}
	return 0, false
}

func asUint(v any) (uint64, bool) {
	if x, ok := v.(uint64); ok {
		return x, true
	}
	i, ok := asInt(v)
	return uint64(i), ok // vLLM's int hashes may be negative in older versions: the bits are the hash
}

// Set is the page set of one medium that a subscriber reconstructs: chain
// hashes of cached blocks.
type Set map[uint64]struct{}

// mediumOf is an event's medium; vLLM's None is the GPU pool.
func mediumOf(e *Event) string {
	if e.Medium == nil {
		return "GPU"
	}
	return *e.Medium
}

// Apply applies a batch's events in order to a stream of device ("GPU")
// pages. It reports a BlockStored whose parent is not in the set, a hash
// stored twice, a removal of a hash not in the set, and an event of another
// medium (use [Media]): a consistent stream has none.
func (s Set) Apply(b Batch) error {
	for i := range b.Events {
		e := &b.Events[i]
		if e.Type != "AllBlocksCleared" && mediumOf(e) != "GPU" {
			return fmt.Errorf("vllmwire: event %d has medium %q; Set holds GPU pages only", i, mediumOf(e))
		}
		if err := s.apply(i, e, true); err != nil {
			return err
		}
	}
	return nil
}

func (s Set) apply(i int, e *Event, parents bool) error {
	switch e.Type {
	case "AllBlocksCleared":
		clear(s)
	case "BlockStored":
		if parents && e.ParentBlockHash != nil {
			if _, ok := s[*e.ParentBlockHash]; !ok {
				return fmt.Errorf("vllmwire: event %d stores under parent %#x, which is not cached", i, *e.ParentBlockHash)
			}
		}
		for _, h := range e.BlockHashes {
			if _, ok := s[h]; ok {
				return fmt.Errorf("vllmwire: event %d stores %#x twice in %s", i, h, mediumOf(e))
			}
			s[h] = struct{}{}
		}
	case "BlockRemoved":
		for _, h := range e.BlockHashes {
			if _, ok := s[h]; !ok {
				return fmt.Errorf("vllmwire: event %d removes %#x, which is not cached in %s", i, h, mediumOf(e))
			}
			delete(s, h)
		}
	}
	return nil
}

// Media is the page set per medium ("GPU", "CPU", ...) a subscriber
// reconstructs from a stream of several media.
type Media map[string]Set

// Apply applies a batch's events in order: BlockStored and BlockRemoved to
// their medium's set, AllBlocksCleared to every medium. It reports what
// [Set.Apply] does, per medium; a stored block's parent must be cached
// only on the GPU (vLLM's offloading connector keeps blocks below the GPU
// one by one, so a CPU block's parent may be absent).
func (m Media) Apply(b Batch) error {
	for i := range b.Events {
		if err := m.apply(i, &b.Events[i]); err != nil {
			return err
		}
	}
	return nil
}

// apply applies event i: AllBlocksCleared to every medium, the others to
// their medium's set.
func (m Media) apply(i int, e *Event) error {
	if e.Type == "AllBlocksCleared" {
		for _, s := range m {
			clear(s)
		}
		return nil
	}
	med := mediumOf(e)
	s := m[med]
	if s == nil {
		s = Set{}
		m[med] = s
	}
	return s.apply(i, e, med == "GPU" && !isState(e))
}

// Groups is the GPU page set per KV-cache group ("group_idx") that a
// subscriber of a hybrid model's stream reconstructs.
type Groups map[int64]Set

// Apply applies a batch's events in order: BlockStored and BlockRemoved to
// their group's set (each must carry group_idx and medium GPU),
// AllBlocksCleared to every group. It reports what [Set.Apply] does, per
// group: a stored block's parent must be cached in the same group, except
// in a state group (kv_cache_spec_kind "mamba"), whose blocks are
// checkpoints at some prefix ends only.
func (gs Groups) Apply(b Batch) error {
	return applyGrouped(gs, b, true, func() Set { return Set{} }, func(s Set, i int, e *Event) error { return s.apply(i, e, !isState(e)) })
}

// isState reports whether e is a state group's BlockStored.
func isState(e *Event) bool { return e.SpecKind != nil && *e.SpecKind == "mamba" }

// applyGrouped applies b's events in order to the per-group values of gs,
// making a group's with mk on its first event: AllBlocksCleared to every
// group's, each other event, which must carry group_idx (and, gpuOnly,
// medium GPU), to its group's.
func applyGrouped[V any](gs map[int64]V, b Batch, gpuOnly bool, mk func() V, apply func(v V, i int, e *Event) error) error {
	for i := range b.Events {
		e := &b.Events[i]
		if e.Type == "AllBlocksCleared" {
			for _, v := range gs {
				_ = apply(v, i, e)
			}
			continue
		}
		switch {
		case gpuOnly && (e.GroupIdx == nil || mediumOf(e) != "GPU"):
			return fmt.Errorf("vllmwire: event %d (%s, medium %q) has no group_idx or is not on the GPU", i, e.Type, mediumOf(e))
		case e.GroupIdx == nil:
			return fmt.Errorf("vllmwire: event %d (%s, medium %q) has no group_idx", i, e.Type, mediumOf(e))
		}
		v, ok := gs[*e.GroupIdx]
		if !ok {
			v = mk()
			gs[*e.GroupIdx] = v
		}
		if err := apply(v, i, e); err != nil {
			return fmt.Errorf("group %d: %w", *e.GroupIdx, err)
		}
	}
	return nil
}

// GroupMedia is the page set per KV-cache group ("group_idx") and medium
// that a subscriber of a hybrid model's stream with a CPU tier
// reconstructs.
type GroupMedia map[int64]Media

// Apply applies a batch's events in order: BlockStored and BlockRemoved to
// their group's and medium's set (each must carry group_idx),
// AllBlocksCleared to every set. It reports what [Media.Apply] does, per
// group: a stored GPU block's parent must be cached on the GPU in the same
// group.
func (gm GroupMedia) Apply(b Batch) error {
	return applyGrouped(gm, b, false, func() Media { return Media{} }, Media.apply)
}
