package events_test

import (
	"testing"

	"github.com/pagedkv/pagedkv/events"
	"github.com/pagedkv/pagedkv/internal/vllmwire"
	"github.com/pagedkv/pagedkv/prefixcache"
)

// checkpointSink is the state-group method of a Recorder's GroupSink.
type checkpointSink interface {
	prefixcache.Sink
	CheckpointStored(page prefixcache.PageID, depth int, hash, parentHash uint64, hasParent bool, lora string, tokens []int32)
}

// TestRecorderCheckpointResync: a state group's checkpoints (blocks whose
// parent is in no group) are mirrored like pages: after a dropped batch
// the resync re-announces each with its parent hash, depth-first order
// and LoRA, and a removal after it removes it.
func TestRecorderCheckpointResync(t *testing.T) {
	q, err := events.NewQueue(1)
	if err != nil {
		t.Fatal(err)
	}
	rec, err := events.NewRecorder(events.RecorderConfig{NumPages: 6, PageSize: 2,
		Groups: []events.GroupConfig{{SpecKind: "full_attention"}, {SpecKind: "mamba"}}}, q)
	if err != nil {
		t.Fatal(err)
	}
	st := rec.GroupSink(1).(checkpointSink)
	st.CheckpointStored(4, 2, 0x30, 0x20, true, "lora-a", []int32{5, 6})
	rec.GroupSink(0).PageStored(0, 0x10, -1, 0, prefixcache.Key{}, []int32{1, 2})
	st.CheckpointStored(5, 0, 0x11, 0, false, "", []int32{1, 2})
	if !rec.Flush() {
		t.Fatal("flush refused")
	}
	st.PageRemoved(5, 0x11)
	if rec.Flush() { // the queue holds the first batch: dropped
		t.Fatal("a full queue took the batch")
	}
	enc := events.NewEncoder()
	b, _ := q.Next()
	q.Done(b)
	if !rec.Flush() {
		t.Fatal("the resync was refused")
	}
	b, _ = q.Next()
	dec, err := vllmwire.Decode(enc.AppendBatch(nil, b, 0))
	q.Done(b)
	if err != nil {
		t.Fatal(err)
	}
	// AllBlocksCleared, then the pages by depth: page 0 (group 0), then
	// the checkpoint at depth 2 (group 1).
	if len(dec.Events) != 3 || dec.Events[0].Type != "AllBlocksCleared" {
		t.Fatalf("resync %+v", dec.Events)
	}
	e := dec.Events[2]
	if *e.GroupIdx != 1 || *e.SpecKind != "mamba" || e.ParentBlockHash == nil || *e.ParentBlockHash != 0x20 ||
		e.LoRAName == nil || *e.LoRAName != "lora-a" || len(e.BlockHashes) != 1 || e.BlockHashes[0] != 0x30 || e.TokenIDs[0] != 5 {
		t.Fatalf("checkpoint re-announced as %+v", e)
	}
	gs := vllmwire.Groups{}
	if err := gs.Apply(dec); err != nil {
		t.Fatal(err)
	}
	st.PageRemoved(4, 0x30)
	if !rec.Flush() {
		t.Fatal("flush refused")
	}
	b, _ = q.Next()
	dec, err = vllmwire.Decode(enc.AppendBatch(nil, b, 0))
	q.Done(b)
	if err != nil {
		t.Fatal(err)
	}
	if err := gs.Apply(dec); err != nil {
		t.Fatal(err)
	}
	if len(gs[1]) != 0 || len(gs[0]) != 1 {
		t.Fatalf("after the removal: group sets %v", gs)
	}
}
