package kvindex_test

import (
	"errors"
	"math/rand/v2"
	"slices"
	"strings"
	"testing"

	"github.com/pagedkv/pagedkv/kvindex"
)

const groupPageSize = 4

func newGroupIndex(t *testing.T) (*kvindex.Index, int) {
	t.Helper()
	ix, err := kvindex.New(kvindex.Config{PageSize: groupPageSize, Seed: 3})
	if err != nil {
		t.Fatal(err)
	}
	return ix, ix.AddReplica("r")
}

func stored(group int, medium string, hashes ...uint64) kvindex.Event {
	return kvindex.Event{Kind: kvindex.BlockStored, Hashes: hashes, BlockSize: groupPageSize,
		Tokens: make([]int32, groupPageSize*len(hashes)), Medium: medium, Group: group, HasGroup: group >= 0}
}

func removed(group int, medium string, hashes ...uint64) kvindex.Event {
	return kvindex.Event{Kind: kvindex.BlockRemoved, Hashes: hashes, Medium: medium, Group: group, HasGroup: group >= 0}
}

// fixGroup turns the helpers' group -1 (no group_idx, vLLM's None) into
// what the decoder produces: Group 0, HasGroup false.
func fixGroup(evs []kvindex.Event) []kvindex.Event {
	for i := range evs {
		if !evs[i].HasGroup {
			evs[i].Group = 0
		}
	}
	return evs
}

func apply(t *testing.T, ix *kvindex.Index, r int, evs ...kvindex.Event) {
	t.Helper()
	if err := ix.Apply(r, &kvindex.Batch{Events: fixGroup(evs)}); err != nil {
		t.Fatal(err)
	}
}

// TestGroupRemovalKeepsOtherGroups: on a two-group (hybrid) stream, group
// 1's BlockRemoved of a block group 0 still holds leaves group 0's copy;
// Match drops to group 1's contiguous match, Blocks keeps the union.
func TestGroupRemovalKeepsOtherGroups(t *testing.T) {
	ix, r := newGroupIndex(t)
	chain := []uint64{11, 12, 13, 14}
	apply(t, ix, r, stored(0, "GPU", chain...), stored(1, "GPU", chain...))
	if got := ix.MatchHashes(nil, chain); !slices.Equal(got, []int{4 * groupPageSize}) {
		t.Fatalf("both groups hold the chain: matched %v, want [16]", got)
	}
	// Group 1 (a sliding window, say) drops block 1.
	apply(t, ix, r, removed(1, "GPU", 12))
	if got := ix.MatchHashes(nil, chain); !slices.Equal(got, []int{1 * groupPageSize}) {
		t.Fatalf("group 1 lacks block 1: matched %v, want [4]", got)
	}
	if got := ix.GroupBlocks(r, 0); !slices.Equal(got, chain) {
		t.Fatalf("group 0's blocks: %v, want %v (group 1's removal must leave them)", got, chain)
	}
	if got, want := ix.GroupBlocks(r, 1), []uint64{11, 13, 14}; !slices.Equal(got, want) {
		t.Fatalf("group 1's blocks: %v, want %v", got, want)
	}
	if got := ix.Blocks(r); !slices.Equal(got, chain) {
		t.Fatalf("Blocks: %v, want the union %v", got, chain)
	}
	st := ix.Stats(r)
	if st.Blocks != 4 || st.GroupBlocks != 7 || st.Groups != 2 || st.Stored != 8 || st.Removed != 1 {
		t.Fatalf("stats %+v: want 4 distinct blocks, 7 group entries, 2 groups, 8 stored, 1 removed", st)
	}
	// Group 0 drops block 0: nothing is a hit any more, though group 1
	// still holds it.
	apply(t, ix, r, removed(0, "GPU", 11))
	if got := ix.MatchHashes(nil, chain); !slices.Equal(got, []int{0}) {
		t.Fatalf("group 0 lacks block 0: matched %v, want [0]", got)
	}
	if got := ix.Blocks(r); !slices.Equal(got, chain) {
		t.Fatalf("Blocks: %v, want %v (block 11 is still in group 1)", got, chain)
	}
	if ix.GroupBlocks(r, 2) != nil || ix.GroupBlocks(r+1, 0) != nil {
		t.Fatal("GroupBlocks of an unknown group or replica is not nil")
	}
}

// TestGroupsSurviveClear: AllBlocksCleared empties every group but the
// replica keeps needing all of them, so a refill of one group alone is no
// hit; a stream without group_idx is group 0.
func TestGroupsSurviveClear(t *testing.T) {
	ix, r := newGroupIndex(t)
	chain := []uint64{21, 22}
	// No group_idx (vLLM's None) and group_idx 0 are the same group.
	apply(t, ix, r, stored(-1, "", 21), stored(0, "GPU", 22))
	if got := ix.Groups(r); !slices.Equal(got, []int{0}) {
		t.Fatalf("groups %v, want [0]", got)
	}
	if got := ix.MatchHashes(nil, chain); !slices.Equal(got, []int{2 * groupPageSize}) {
		t.Fatalf("matched %v, want [8]", got)
	}
	// A group named only by a removal is known too: it holds nothing.
	apply(t, ix, r, removed(3, "GPU", 99))
	if got := ix.MatchHashes(nil, chain); !slices.Equal(got, []int{0}) {
		t.Fatalf("group 3 holds nothing: matched %v, want [0]", got)
	}
	apply(t, ix, r, stored(3, "CPU", chain...))
	if got := ix.MatchHashes(nil, chain); !slices.Equal(got, []int{2 * groupPageSize}) {
		t.Fatalf("group 3 holds the chain on the CPU: matched %v, want [8]", got)
	}
	apply(t, ix, r, kvindex.Event{Kind: kvindex.AllBlocksCleared}, stored(0, "GPU", chain...))
	if got := ix.Groups(r); !slices.Equal(got, []int{0, 3}) {
		t.Fatalf("groups after AllBlocksCleared: %v, want [0 3]", got)
	}
	if got := ix.MatchHashes(nil, chain); !slices.Equal(got, []int{0}) {
		t.Fatalf("after a clear, only group 0 refilled: matched %v, want [0]", got)
	}
	if st := ix.Stats(r); st.Blocks != 2 || st.GroupBlocks != 2 || st.Groups != 2 || st.Cleared != 1 {
		t.Fatalf("stats %+v", st)
	}
}

// TestTooManyGroups: a batch naming more than MaxGroups groups is refused
// whole, naming the group, and leaves the index as it was.
func TestTooManyGroups(t *testing.T) {
	ix, r := newGroupIndex(t)
	var evs []kvindex.Event
	for g := range kvindex.MaxGroups - 1 {
		evs = append(evs, stored(g, "GPU", uint64(g)+1))
	}
	apply(t, ix, r, evs...)
	before, stBefore := ix.Blocks(r), ix.Stats(r)
	bad := &kvindex.Batch{Events: []kvindex.Event{stored(5000, "GPU", 7), removed(5001, "GPU", 7), stored(0, "GPU", 9)}}
	err := ix.Apply(r, bad)
	if !errors.Is(err, kvindex.ErrBadEvent) || !strings.Contains(err.Error(), "group_idx 5001") {
		t.Fatalf("err = %v, want ErrBadEvent naming group_idx 5001", err)
	}
	if !slices.Equal(ix.Blocks(r), before) || ix.Stats(r) != stBefore || len(ix.Groups(r)) != kvindex.MaxGroups-1 {
		t.Fatal("a refused batch changed the index")
	}
	// One more group fits; a group it already has is always fine.
	apply(t, ix, r, stored(5000, "GPU", 7), stored(5000, "GPU", 8), removed(0, "GPU", 1))
	if n := len(ix.Groups(r)); n != kvindex.MaxGroups {
		t.Fatalf("%d groups, want %d", n, kvindex.MaxGroups)
	}
}

// groupModel is the slow reference: per group, per hash, the set of media
// holding it (names, not bits).
type groupModel map[int]map[uint64]map[string]bool

func mediumName(m string) string {
	switch m {
	case "", "GPU":
		return "GPU"
	case "CPU":
		return "CPU"
	}
	return "other"
}

func (gm groupModel) apply(evs []kvindex.Event) {
	for _, e := range evs {
		switch e.Kind {
		case kvindex.AllBlocksCleared:
			for g := range gm {
				gm[g] = map[uint64]map[string]bool{}
			}
			continue
		}
		if gm[e.Group] == nil {
			gm[e.Group] = map[uint64]map[string]bool{}
		}
		for _, h := range e.Hashes {
			set := gm[e.Group][h]
			if e.Kind == kvindex.BlockStored {
				if set == nil {
					set = map[string]bool{}
					gm[e.Group][h] = set
				}
				set[mediumName(e.Medium)] = true
			} else if set != nil {
				delete(set, mediumName(e.Medium))
				if len(set) == 0 {
					delete(gm[e.Group], h)
				}
			}
		}
	}
}

// match: for every depth d from the chain's length down, is every page
// below d held in every group?
func (gm groupModel) match(chain []uint64) int {
	if len(gm) == 0 {
		return 0
	}
	for d := len(chain); d > 0; d-- {
		ok := true
		for _, blocks := range gm {
			for _, h := range chain[:d] {
				if len(blocks[h]) == 0 {
					ok = false
				}
			}
		}
		if ok {
			return d
		}
	}
	return 0
}

// TestGroupsMatchModel: random stores, removals and clears over a few
// groups and media; after every batch Match, Blocks, GroupBlocks and Stats
// agree with the reference.
func TestGroupsMatchModel(t *testing.T) {
	rng := rand.New(rand.NewPCG(9, 9))
	media := []string{"", "GPU", "CPU", "disk"}
	for run := range 20 {
		ix, r := newGroupIndex(t)
		gm := groupModel{}
		ngroups := 1 + run%4
		for step := range 200 {
			var evs []kvindex.Event
			for range 1 + rng.IntN(4) {
				g := rng.IntN(ngroups) * 2 // sparse indices 0, 2, 4, 6
				hashes := make([]uint64, 1+rng.IntN(4))
				for i := range hashes {
					hashes[i] = uint64(1 + rng.IntN(12))
				}
				m := media[rng.IntN(len(media))]
				switch k := rng.IntN(20); {
				case k == 0:
					evs = append(evs, kvindex.Event{Kind: kvindex.AllBlocksCleared})
				case k < 12:
					e := stored(g, m, hashes...)
					if g == 0 && rng.IntN(2) == 0 {
						e.HasGroup = false
					}
					evs = append(evs, e)
				default:
					evs = append(evs, removed(g, m, hashes...))
				}
			}
			apply(t, ix, r, evs...)
			gm.apply(evs)
			for range 8 {
				chain := make([]uint64, rng.IntN(8))
				for i := range chain {
					chain[i] = uint64(1 + rng.IntN(12))
				}
				if got, want := ix.MatchHashes(nil, chain), gm.match(chain)*groupPageSize; got[0] != want {
					t.Fatalf("run %d step %d: chain %v matched %d, the model %d", run, step, chain, got[0], want)
				}
			}
			union := map[uint64]bool{}
			entries := 0
			var groups []int
			for g, blocks := range gm {
				groups = append(groups, g)
				var want []uint64
				for h := range blocks {
					want = append(want, h)
					union[h] = true
				}
				entries += len(want)
				slices.Sort(want)
				if got := ix.GroupBlocks(r, g); !slices.Equal(got, want) && len(got)+len(want) > 0 {
					t.Fatalf("run %d step %d: group %d holds %v, the model %v", run, step, g, got, want)
				}
			}
			slices.Sort(groups)
			if got := ix.Groups(r); !slices.Equal(got, groups) {
				t.Fatalf("run %d step %d: groups %v, the model %v", run, step, got, groups)
			}
			var want []uint64
			for h := range union {
				want = append(want, h)
			}
			slices.Sort(want)
			if got := ix.Blocks(r); !slices.Equal(got, want) && len(got)+len(want) > 0 {
				t.Fatalf("run %d step %d: Blocks %v, the model %v", run, step, got, want)
			}
			if st := ix.Stats(r); st.Blocks != len(want) || st.GroupBlocks != entries || st.Groups != len(groups) {
				t.Fatalf("run %d step %d: stats %+v, the model %d blocks, %d entries, %d groups", run, step, st, len(want), entries, len(groups))
			}
		}
	}
}

// TestStateGroupMatch: a state group's blocks (kv_cache_spec_kind "mamba")
// are checkpoints: the match is the other groups' contiguous match cut
// back to the deepest block every state group holds; a replica with state
// groups only matches nothing; the kind is decoded from the wire.
func TestStateGroupMatch(t *testing.T) {
	ix, r := newGroupIndex(t)
	chain := []uint64{11, 12, 13, 14, 15}
	ckpt := func(g int, hashes ...uint64) kvindex.Event {
		e := stored(g, "GPU", hashes...)
		e.State = true
		return e
	}
	apply(t, ix, r, ckpt(1, 12, 14))
	if got := ix.MatchHashes(nil, chain)[0]; got != 0 {
		t.Fatalf("state groups only: matched %d, want 0", got)
	}
	apply(t, ix, r, stored(0, "GPU", chain[:4]...), ckpt(2, 12, 13, 14))
	for _, c := range []struct {
		chain []uint64
		want  int
	}{{chain, 4}, {chain[:3], 2}, {chain[:1], 0}} {
		if got := ix.MatchHashes(nil, c.chain)[0]; got != c.want*groupPageSize {
			t.Fatalf("chain %v: matched %d, want %d blocks", c.chain, got, c.want)
		}
	}
	// Group 2 loses 14: the deepest both state groups hold is 12.
	apply(t, ix, r, removed(2, "GPU", 14))
	if got := ix.MatchHashes(nil, chain)[0]; got != 2*groupPageSize {
		t.Fatalf("after the removal: matched %d, want %d", got, 2*groupPageSize)
	}
	// Decoded: kv_cache_spec_kind "mamba" sets State, another kind not.
	for kind, want := range map[string]bool{"mamba": true, "full_attention": false} {
		payload := []byte{0x93, 0xcb, 0, 0, 0, 0, 0, 0, 0, 0, 0x91, 0x85,
			0xa4, 't', 'y', 'p', 'e', 0xab, 'B', 'l', 'o', 'c', 'k', 'S', 't', 'o', 'r', 'e', 'd',
			0xac, 'b', 'l', 'o', 'c', 'k', '_', 'h', 'a', 's', 'h', 'e', 's', 0x91, 0x07,
			0xa9, 't', 'o', 'k', 'e', 'n', '_', 'i', 'd', 's', 0x91, 0x01,
			0xaa, 'b', 'l', 'o', 'c', 'k', '_', 's', 'i', 'z', 'e', 0x01,
			0xb2}
		payload = append(payload, "kv_cache_spec_kind"...)
		payload = append(append(payload, 0xa0|byte(len(kind))), kind...)
		payload = append(payload, 0x00)
		b, err := kvindex.DecodeBatch(payload)
		if err != nil {
			t.Fatal(err)
		}
		if b.Events[0].State != want {
			t.Fatalf("kv_cache_spec_kind %q: State = %v", kind, b.Events[0].State)
		}
	}
}
