package events_test

import (
	"fmt"
	"math/rand/v2"
	"strings"
	"testing"

	"github.com/pagedkv/pagedkv/events"
	"github.com/pagedkv/pagedkv/internal/vllmwire"
	"github.com/pagedkv/pagedkv/prefixcache"
)

// groupHostSink is the host methods of a Recorder's GroupSink.
type groupHostSink interface {
	HostPages() int
	HostPageStored(page int, hash, parentHash uint64, hasParent bool, lora string, tokens []int32)
	HostPageRemoved(page int, hash uint64)
}

// A Recorder of groups with host pages (a HybridManager's): random device
// and host stores and removals in random groups, flushes into a small
// queue that a consumer drains at random (so batches drop and resyncs
// follow). After every delivered flush, the (group, medium) page sets the
// independent decoder reconstructs equal the reference's: what was stored
// and not removed, each in its group and medium. Each event carries its
// group's spec fields.
func TestRecorderGroupHostPagesMatchReference(t *testing.T) {
	const numPages, hostPages, ps = 12, 10, 2
	specs := []events.GroupConfig{{SpecKind: "full_attention"}, {SpecKind: "sliding_window", SlidingWindow: 6}, {SpecKind: "mla_attention"}}
	for seed := range uint64(20) {
		rng := rand.New(rand.NewPCG(seed, 7))
		q, err := events.NewQueue(2)
		if err != nil {
			t.Fatal(err)
		}
		rec, err := events.NewRecorder(events.RecorderConfig{NumPages: numPages, PageSize: ps, HostPages: hostPages, Groups: specs}, q)
		if err != nil {
			t.Fatal(err)
		}
		enc := events.NewEncoder()
		type slot struct {
			live bool
			g    int
			hash uint64
		}
		dev, host := make([]slot, numPages), make([]slot, hostPages)
		got := vllmwire.GroupMedia{}
		next := uint64(1)
		delivered, dropped, hostEvents := 0, 0, 0
		for op := range 400 {
			switch k := rng.IntN(10); {
			case k < 3: // store or remove a device page
				p := rng.IntN(numPages)
				if s := &dev[p]; s.live {
					rec.GroupSink(s.g).PageRemoved(prefixcache.PageID(p), s.hash)
					s.live = false
				} else {
					*s = slot{true, rng.IntN(len(specs)), next}
					next++
					rec.GroupSink(s.g).PageStored(prefixcache.PageID(p), s.hash, -1, 0, prefixcache.Key{}, []int32{int32(p), 1})
				}
			case k < 7: // store or remove a host page
				h := rng.IntN(hostPages)
				if s := &host[h]; s.live {
					rec.GroupSink(s.g).(groupHostSink).HostPageRemoved(h, s.hash)
					s.live = false
				} else {
					*s = slot{true, rng.IntN(len(specs)), next}
					next++
					hs := rec.GroupSink(s.g).(groupHostSink)
					if hs.HostPages() != hostPages {
						t.Fatalf("group %d sink: %d host pages", s.g, hs.HostPages())
					}
					hs.HostPageStored(h, s.hash, s.hash-1, rng.IntN(2) == 0, "", []int32{int32(h), 2})
				}
			default: // flush; the consumer drains now and then
				ok := rec.Flush()
				if !ok {
					dropped++
				}
				if rng.IntN(3) > 0 {
					for _, b := range drain(t, q, enc) {
						for _, e := range b.Events {
							if e.Type == "AllBlocksCleared" {
								continue
							}
							g := int(*e.GroupIdx)
							if sk := specs[g].SpecKind; e.Type == "BlockStored" && (e.SpecKind == nil || *e.SpecKind != sk) {
								t.Fatalf("seed %d op %d: group %d stored with spec %v", seed, op, g, e.SpecKind)
							}
							if medium(e) == events.MediumCPU {
								hostEvents++
							}
						}
						if err := got.Apply(b); err != nil {
							t.Fatalf("seed %d op %d: %v", seed, op, err)
						}
					}
					if ok {
						delivered++
						if err := sameGroupMedia(got, dev, host, func(s slot) (bool, int, uint64) { return s.live, s.g, s.hash }); err != nil {
							t.Fatalf("seed %d op %d: %v", seed, op, err)
						}
					}
				}
			}
		}
		if delivered == 0 || dropped == 0 || hostEvents == 0 {
			t.Fatalf("seed %d: %d delivered checks, %d dropped flushes, %d host events: the run exercised too little", seed, delivered, dropped, hostEvents)
		}
	}
}

// sameGroupMedia compares the reconstructed sets with the reference's live
// device ("GPU") and host ("CPU") slots.
func sameGroupMedia[S any](got vllmwire.GroupMedia, dev, host []S, of func(S) (bool, int, uint64)) error {
	want := map[string]map[int64]map[uint64]bool{"GPU": {}, "CPU": {}}
	for med, slots := range map[string][]S{"GPU": dev, "CPU": host} {
		for _, s := range slots {
			if live, g, h := of(s); live {
				if want[med][int64(g)] == nil {
					want[med][int64(g)] = map[uint64]bool{}
				}
				want[med][int64(g)][h] = true
			}
		}
	}
	for _, med := range []string{"GPU", "CPU"} {
		for g := range int64(3) {
			gs := got[g][med]
			if len(gs) != len(want[med][g]) {
				return fmt.Errorf("group %d %s: reconstructed %d pages, want %d", g, med, len(gs), len(want[med][g]))
			}
			for h := range want[med][g] {
				if _, ok := gs[h]; !ok {
					return fmt.Errorf("group %d %s: %#x missing", g, med, h)
				}
			}
		}
	}
	return nil
}

// A host page is removed through the group that stored it: another
// group's sink, or the Recorder's own methods (group 0's) for a page of
// group 1, panic naming the page and group.
func TestRecorderGroupHostPagesWrongGroup(t *testing.T) {
	q, _ := events.NewQueue(1)
	rec, err := events.NewRecorder(events.RecorderConfig{NumPages: 4, PageSize: 2, HostPages: 2,
		Groups: []events.GroupConfig{{SpecKind: "full_attention"}, {SpecKind: "full_attention"}}}, q)
	if err != nil {
		t.Fatal(err)
	}
	rec.GroupSink(1).(groupHostSink).HostPageStored(1, 0x77, 0, false, "", []int32{1, 2})
	for name, f := range map[string]func(){
		"group 0 sink": func() { rec.GroupSink(0).(groupHostSink).HostPageRemoved(1, 0x77) },
		"recorder":     func() { rec.HostPageRemoved(1, 0x77) },
	} {
		func() {
			defer func() {
				r := recover()
				if s, _ := r.(string); !strings.Contains(s, "host page 1 (hash 0x77) removed from group 0") {
					t.Fatalf("%s: recovered %v", name, r)
				}
			}()
			f()
		}()
	}
	rec.GroupSink(1).(groupHostSink).HostPageRemoved(1, 0x77)
}
