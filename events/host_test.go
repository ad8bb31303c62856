package events_test

import (
	"errors"
	"slices"
	"strings"
	"testing"

	"github.com/pagedkv/pagedkv/events"
	"github.com/pagedkv/pagedkv/internal/vllmwire"
	"github.com/pagedkv/pagedkv/prefixcache"
)

// drain decodes every queued batch with the independent decoder.
func drain(t *testing.T, q *events.Queue, enc *events.Encoder) []vllmwire.Batch {
	t.Helper()
	var out []vllmwire.Batch
	for b := q.TryNext(); b != nil; b = q.TryNext() {
		dec, err := vllmwire.Decode(enc.AppendBatch(nil, b, 0))
		q.Done(b)
		if err != nil {
			t.Fatal(err)
		}
		out = append(out, dec)
	}
	return out
}

func medium(e vllmwire.Event) string {
	if e.Medium == nil {
		return "<nil>"
	}
	return *e.Medium
}

// Host pages are announced with medium "CPU", in events of their own (a
// chain is not merged across media), and a resync after a dropped batch
// re-announces both media.
func TestRecorderHostPages(t *testing.T) {
	q, err := events.NewQueue(1)
	if err != nil {
		t.Fatal(err)
	}
	rec, err := events.NewRecorder(events.RecorderConfig{NumPages: 4, HostPages: 3, PageSize: 2}, q)
	if err != nil {
		t.Fatal(err)
	}
	if rec.HostPages() != 3 {
		t.Fatalf("HostPages() = %d, want 3", rec.HostPages())
	}
	enc := events.NewEncoder()
	key := prefixcache.Key{}
	a, b := []int32{1, 2}, []int32{3, 4}
	const h0, h1, seed = 0x1111, 0x2222, 0x99
	rec.PageStored(0, h0, -1, seed, key, a)
	rec.HostPageStored(2, h0, 0, false, "", a)
	rec.HostPageStored(0, h1, h0, true, "", b) // continues the host chain: one event
	rec.PageStored(1, h1, 0, h0, key, b)       // continues the device chain, but the last event is the host's
	if !rec.Flush() {
		t.Fatal("flush refused")
	}
	bs := drain(t, q, enc)
	if len(bs) != 1 || len(bs[0].Events) != 3 {
		t.Fatalf("want one batch of 3 events, got %+v", bs)
	}
	want := []struct {
		medium string
		hashes []uint64
		parent bool
	}{{"GPU", []uint64{h0}, false}, {"CPU", []uint64{h0, h1}, false}, {"GPU", []uint64{h1}, true}}
	for i, w := range want {
		e := bs[0].Events[i]
		if e.Type != "BlockStored" || medium(e) != w.medium || !slices.Equal(e.BlockHashes, w.hashes) || (e.ParentBlockHash != nil) != w.parent {
			t.Fatalf("event %d = %s %s %x parent %v, want BlockStored %s %x parent %v", i, e.Type, medium(e), e.BlockHashes, e.ParentBlockHash, w.medium, w.hashes, w.parent)
		}
	}
	set := vllmwire.Media{}
	if err := set.Apply(bs[0]); err != nil {
		t.Fatal(err)
	}

	// Removals of both media in one step: one event per medium.
	rec.HostPageRemoved(2, h0)
	rec.PageRemoved(1, h1)
	if !rec.Flush() {
		t.Fatal("flush refused")
	}
	bs = drain(t, q, enc)
	if len(bs) != 1 || len(bs[0].Events) != 2 || medium(bs[0].Events[0]) != "CPU" || medium(bs[0].Events[1]) != "GPU" ||
		bs[0].Events[0].Type != "BlockRemoved" || bs[0].Events[1].Type != "BlockRemoved" {
		t.Fatalf("removals: %+v", bs)
	}
	if err := set.Apply(bs[0]); err != nil {
		t.Fatal(err)
	}

	// Fill the queue, then drop a step that stores a host page: the next
	// flush clears and re-announces both media from the mirror.
	rec.HostPageStored(1, 0x3333, h1, true, "lora-x", []int32{5, 6})
	if !rec.Flush() {
		t.Fatal("flush refused")
	}
	rec.HostPageStored(2, 0x4444, 0, false, "", []int32{7, 8})
	if rec.Flush() {
		t.Fatal("a full queue took the batch")
	}
	bs = drain(t, q, enc)
	if err := set.Apply(bs[0]); err != nil {
		t.Fatal(err)
	}
	if !rec.Flush() {
		t.Fatal("resync refused")
	}
	bs = drain(t, q, enc)
	if len(bs) != 1 || bs[0].Events[0].Type != "AllBlocksCleared" {
		t.Fatalf("resync: %+v", bs)
	}
	if err := set.Apply(bs[0]); err != nil {
		t.Fatal(err)
	}
	wantSets := map[string][]uint64{"GPU": {h0}, "CPU": {h1, 0x3333, 0x4444}}
	for m, hs := range wantSets {
		if len(set[m]) != len(hs) {
			t.Fatalf("%s: reconstructed %v, want %x", m, set[m], hs)
		}
		for _, h := range hs {
			if _, ok := set[m][h]; !ok {
				t.Fatalf("%s: %#x missing after resync: %v", m, h, set[m])
			}
		}
	}
	for _, e := range bs[0].Events[1:] {
		if medium(e) == "CPU" && slices.Equal(e.BlockHashes, []uint64{0x3333}) && (e.LoRAName == nil || *e.LoRAName != "lora-x") {
			t.Fatalf("resync lost host page 1's LoRA: %+v", e)
		}
	}
}

func TestRecorderHostPagesBad(t *testing.T) {
	q, _ := events.NewQueue(1)
	_, err := events.NewRecorder(events.RecorderConfig{NumPages: 4, HostPages: -2, PageSize: 2}, q)
	if !errors.Is(err, events.ErrBadConfig) || !strings.Contains(err.Error(), "-2") {
		t.Fatalf("HostPages -2: %v", err)
	}
	rec, err := events.NewRecorder(events.RecorderConfig{NumPages: 4, HostPages: 2, PageSize: 2}, q)
	if err != nil {
		t.Fatal(err)
	}
	for name, f := range map[string]func(){
		"stored outside":  func() { rec.HostPageStored(2, 1, 0, false, "", []int32{1, 2}) },
		"stored short":    func() { rec.HostPageStored(0, 1, 0, false, "", []int32{1}) },
		"removed unknown": func() { rec.HostPageRemoved(1, 5) },
		"stored twice": func() {
			rec.HostPageStored(0, 1, 0, false, "", []int32{1, 2})
			rec.HostPageStored(0, 1, 0, false, "", []int32{1, 2})
		},
	} {
		func() {
			defer func() {
				if recover() == nil {
					t.Errorf("%s: no panic", name)
				}
			}()
			f()
		}()
	}
}

// A Recorder of several groups tags each group's events with its
// group_idx and spec, never merges events across groups, and a resync
// re-announces every group's pages under its own group.
func TestRecorderGroups(t *testing.T) {
	q, err := events.NewQueue(1)
	if err != nil {
		t.Fatal(err)
	}
	rec, err := events.NewRecorder(events.RecorderConfig{NumPages: 4, PageSize: 2,
		Groups: []events.GroupConfig{{SpecKind: "full_attention"}, {SpecKind: "sliding_window", SlidingWindow: 6}}}, q)
	if err != nil {
		t.Fatal(err)
	}
	if rec.NumGroups() != 2 {
		t.Fatalf("NumGroups() = %d", rec.NumGroups())
	}
	if k, w := rec.GroupSpec(1); k != "sliding_window" || w != 6 {
		t.Fatalf("GroupSpec(1) = %q, %d", k, w)
	}
	enc := events.NewEncoder()
	key := prefixcache.Key{}
	a, b := []int32{1, 2}, []int32{3, 4}
	g0, g1 := rec.GroupSink(0), rec.GroupSink(1)
	g0.PageStored(0, 0x10, -1, 7, key, a)
	g1.PageStored(1, 0x10, -1, 7, key, a) // the same prefix in group 1: same hash
	g0.PageStored(2, 0x20, 0, 0x10, key, b)
	g1.PageStored(3, 0x20, 1, 0x10, key, b)
	if !rec.Flush() {
		t.Fatal("flush refused")
	}
	bs := drain(t, q, enc)
	if len(bs) != 1 || len(bs[0].Events) != 4 {
		t.Fatalf("want 4 events (groups alternate), got %+v", bs)
	}
	for i, e := range bs[0].Events {
		g := int64(i % 2)
		if e.GroupIdx == nil || *e.GroupIdx != g || e.SpecKind == nil {
			t.Fatalf("event %d: group %v spec %v, want group %d", i, e.GroupIdx, e.SpecKind, g)
		}
		if (g == 1) != (e.SlidingWindow != nil && *e.SlidingWindow == 6) {
			t.Fatalf("event %d: sliding window %v", i, e.SlidingWindow)
		}
	}
	sets := vllmwire.Groups{}
	if err := sets.Apply(bs[0]); err != nil {
		t.Fatal(err)
	}
	// GroupStats counts each group's events and pages in the batches the
	// queue took (not a dropped one's; a resync's snapshot).
	groupStats := func(when string, want ...events.GroupStats) {
		t.Helper()
		for g, w := range want {
			if got := rec.GroupStats(g); got != w {
				t.Fatalf("%s: GroupStats(%d) = %+v, want %+v", when, g, got, w)
			}
		}
	}
	groupStats("first batch", events.GroupStats{Stored: 2, StoredPages: 2}, events.GroupStats{Stored: 2, StoredPages: 2})
	// Fill the queue, drop a step, resync.
	g1.PageRemoved(3, 0x20)
	if !rec.Flush() {
		t.Fatal("flush refused")
	}
	g0.PageRemoved(2, 0x20)
	if rec.Flush() {
		t.Fatal("a full queue took the batch")
	}
	groupStats("dropped batch", events.GroupStats{Stored: 2, StoredPages: 2}, events.GroupStats{Stored: 2, StoredPages: 2, Removed: 1, RemovedPages: 1})
	for _, b := range drain(t, q, enc) {
		if err := sets.Apply(b); err != nil {
			t.Fatal(err)
		}
	}
	if !rec.Flush() {
		t.Fatal("resync refused")
	}
	for _, b := range drain(t, q, enc) {
		if err := sets.Apply(b); err != nil {
			t.Fatal(err)
		}
	}
	if len(sets[0]) != 1 || len(sets[1]) != 1 {
		t.Fatalf("after resync: %v", sets)
	}
	groupStats("resync", events.GroupStats{Stored: 3, StoredPages: 3}, events.GroupStats{Stored: 3, StoredPages: 3, Removed: 1, RemovedPages: 1})
	if _, ok := sets[0][0x10]; !ok {
		t.Fatalf("group 0 lost 0x10: %v", sets)
	}
	// A group's sink refuses another group's page.
	func() {
		defer func() {
			if recover() == nil {
				t.Error("group 1 removed group 0's page")
			}
		}()
		g1.PageRemoved(0, 0x10)
	}()
	_, err = events.NewRecorder(events.RecorderConfig{NumPages: 4, PageSize: 2, SpecKind: "full_attention",
		Groups: []events.GroupConfig{{SpecKind: "full_attention"}}}, q)
	if !errors.Is(err, events.ErrBadConfig) {
		t.Fatalf("Groups with SpecKind: %v", err)
	}
	_, err = events.NewRecorder(events.RecorderConfig{NumPages: 4, PageSize: 2, Groups: []events.GroupConfig{{}, {SlidingWindow: -3}}}, q)
	if !errors.Is(err, events.ErrBadConfig) || !strings.Contains(err.Error(), "group 1: sliding window -3") {
		t.Fatalf("negative window: %v", err)
	}
}
