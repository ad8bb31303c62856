package events

import (
	"bytes"
	"encoding/binary"
	"encoding/hex"
	"math"
	"testing"

	"github.com/pagedkv/pagedkv/prefixcache"
)

// keyOfNoNamespace is the zero Key: no tenant, LoRA or salt.
var keyOfNoNamespace prefixcache.Key

// The bytes msgspec writes for vLLM's KVEventBatch, derived by hand from
// the msgpack spec and msgspec's rules (array_like batch; tagged map events
// with "type" first, fields in declaration order, defaults omitted; ints in
// their shortest unsigned form; floats as float64), independently of the
// encoder: a change of form, order or width fails here even where a
// structural decoder would accept it.

type golden []byte

func (g golden) raw(b ...byte) golden { return append(g, b...) }

// str is a fixstr (< 32 bytes: every key and value here).
func (g golden) str(s string) golden { return append(append(g, 0xa0|byte(len(s))), s...) }

func (g golden) u64(v uint64) golden { return binary.BigEndian.AppendUint64(append(g, 0xcf), v) }

func (g golden) f64(v float64) golden {
	return binary.BigEndian.AppendUint64(append(g, 0xcb), math.Float64bits(v))
}

// goldenCase is a recorder config, the events it records (record; nil:
// two chained device pages stored, the second removed) and their bytes.
type goldenCase struct {
	name   string
	cfg    RecorderConfig
	want   golden
	record func(r *Recorder)
}

func TestWireGolden(t *testing.T) {
	const ts = 1764030000.25
	const h0, h1 = uint64(0x9c3e_0000_0000_abcd), uint64(0xffff_ffff_ffff_fff0)
	group := 1
	cases := []goldenCase{
		{"plain", RecorderConfig{NumPages: 4, PageSize: 2},
			golden{}.raw(0x93).f64(ts).raw(0x92).
				// BlockStored: 8 fields, two chained pages in one event.
				raw(0x88).str("type").str("BlockStored").
				str("block_hashes").raw(0x92).u64(h0).u64(h1).
				str("parent_block_hash").raw(0xc0).
				str("token_ids").raw(0x94, 0x01, 0xcd, 0x01, 0x2c, 0xce, 0x00, 0x01, 0x11, 0x70, 0x05).
				str("block_size").raw(0x02).
				str("lora_id").raw(0xc0).
				str("medium").str("GPU").
				str("lora_name").raw(0xc0).
				// BlockRemoved: 3 fields.
				raw(0x83).str("type").str("BlockRemoved").
				str("block_hashes").raw(0x91).u64(h1).
				str("medium").str("GPU").
				raw(0x00), nil}, // data_parallel_rank
		{"group and spec", RecorderConfig{NumPages: 4, PageSize: 2, Medium: "CPU", Group: &group, SpecKind: "sliding_window", SlidingWindow: 128},
			golden{}.raw(0x93).f64(ts).raw(0x92).
				raw(0x8b).str("type").str("BlockStored").
				str("block_hashes").raw(0x92).u64(h0).u64(h1).
				str("parent_block_hash").raw(0xc0).
				str("token_ids").raw(0x94, 0x01, 0xcd, 0x01, 0x2c, 0xce, 0x00, 0x01, 0x11, 0x70, 0x05).
				str("block_size").raw(0x02).
				str("lora_id").raw(0xc0).
				str("medium").str("CPU").
				str("lora_name").raw(0xc0).
				str("group_idx").raw(0x01).
				str("kv_cache_spec_kind").str("sliding_window").
				str("kv_cache_spec_sliding_window").raw(0xcc, 0x80).
				raw(0x84).str("type").str("BlockRemoved").
				str("block_hashes").raw(0x91).u64(h1).
				str("medium").str("CPU").
				str("group_idx").raw(0x01).
				raw(0x00), nil},
	}
	// A host page of group 1 of a Recorder of groups (a HybridManager's
	// host tier): medium "CPU", group 1's group_idx and spec, the bytes of
	// "group and spec" (whose events are the same, medium "CPU").
	cases = append(cases, goldenCase{"hybrid host page", RecorderConfig{NumPages: 4, PageSize: 2, HostPages: 3,
		Groups: []GroupConfig{{SpecKind: "full_attention"}, {SpecKind: "sliding_window", SlidingWindow: 128}}}, cases[1].want,
		func(r *Recorder) {
			// What GroupSink(1)'s host methods call.
			r.hostPageStored(1, 2, h0, 0, false, "", []int32{1, 300})
			r.hostPageStored(1, 0, h1, h0, true, "", []int32{70000, 5})
			r.hostPageRemoved(1, 0, h1)
		}})
	// A state checkpoint of group 1 ("mamba", vLLM's MambaSpec): one block
	// at depth 1 whose parent h0 is in no group of the recorder, stored
	// and then evicted (docs/events.md, "State groups").
	cases = append(cases, goldenCase{"state checkpoint", RecorderConfig{NumPages: 4, PageSize: 2,
		Groups: []GroupConfig{{SpecKind: "full_attention"}, {SpecKind: "mamba"}}},
		golden{}.raw(0x93).f64(ts).raw(0x92).
			raw(0x8a).str("type").str("BlockStored").
			str("block_hashes").raw(0x91).u64(h1).
			str("parent_block_hash").u64(h0).
			str("token_ids").raw(0x92, 0xce, 0x00, 0x01, 0x11, 0x70, 0x05).
			str("block_size").raw(0x02).
			str("lora_id").raw(0xc0).
			str("medium").str("GPU").
			str("lora_name").raw(0xc0).
			str("group_idx").raw(0x01).
			str("kv_cache_spec_kind").str("mamba").
			raw(0x84).str("type").str("BlockRemoved").
			str("block_hashes").raw(0x91).u64(h1).
			str("medium").str("GPU").
			str("group_idx").raw(0x01).
			raw(0x00),
		func(r *Recorder) {
			s := r.GroupSink(1).(*groupSink)
			s.CheckpointStored(3, 1, h1, h0, true, "", []int32{70000, 5})
			s.PageRemoved(3, h1)
		}})
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			q, err := NewQueue(2)
			if err != nil {
				t.Fatal(err)
			}
			c.cfg.Clock = func() float64 { return ts }
			r, err := NewRecorder(c.cfg, q)
			if err != nil {
				t.Fatal(err)
			}
			if c.record != nil {
				c.record(r)
			} else {
				r.PageStored(0, h0, -1, 0, keyOfNoNamespace, []int32{1, 300})
				r.PageStored(1, h1, 0, h0, keyOfNoNamespace, []int32{70000, 5})
				r.PageRemoved(1, h1)
			}
			if !r.Flush() {
				t.Fatal("flush refused")
			}
			b := q.TryNext()
			got := NewEncoder().AppendBatch(nil, b, 0)
			q.Done(b)
			if !bytes.Equal(got, c.want) {
				t.Fatalf("encoded\n%s\nwant\n%s", hex.Dump(got), hex.Dump(c.want))
			}
		})
	}
	// AllBlocksCleared alone: {"type": "AllBlocksCleared"}.
	b := &Batch{TS: ts}
	b.cleared()
	want := golden{}.raw(0x93).f64(ts).raw(0x91).raw(0x81).str("type").str("AllBlocksCleared").raw(0x07)
	if got := NewEncoder().AppendBatch(nil, b, 7); !bytes.Equal(got, want) {
		t.Fatalf("encoded\n%s\nwant\n%s", hex.Dump(got), hex.Dump(want))
	}
}
