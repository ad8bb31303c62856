package layergroup

import (
	"errors"
	"strings"
	"testing"
)

var (
	tMLA  = Spec{Kind: MLA, NumLayers: 2}
	tFull = Spec{Kind: Full, NumLayers: 2}
	tSl   = Spec{Kind: Sliding, WindowTokens: 8, NumLayers: 2}
	tCh   = Spec{Kind: Chunked, ChunkTokens: 8, NumLayers: 2}
	// tState is a small valid state group (152 bytes of state in a
	// 1 KiB page).
	tState = Spec{Kind: State, NumLayers: 2, State: StateShape{ConvShape: [2]int{4, 3}, ConvDType: StateBF16,
		SSMShape: [3]int{2, 4, 4}, SSMDType: StateF32, PageBytes: 1 << 10}}
)

func tIdx(target int) Spec {
	return Spec{Kind: Indexer, Target: target, NumLayers: 2, IndexerHeadDim: 128, IndexerQuantBlock: 128}
}

func tShared(target, w, c int) Spec {
	return Spec{Kind: SharedKV, Target: target, WindowTokens: w, ChunkTokens: c, NumLayers: 3}
}

// TestValidateAliases: each rule of indexer and shared-KV groups is an
// ErrBadSpec naming the bad value; the good configs pass.
func TestValidateAliases(t *testing.T) {
	for _, c := range []struct {
		groups []Spec
		want   string // "" = valid
	}{
		{[]Spec{tMLA, tIdx(0)}, ""},
		{[]Spec{tSl, tFull, tShared(0, 8, 0), tShared(1, 0, 0)}, ""},
		{[]Spec{tCh, tShared(0, 0, 8)}, ""},
		{[]Spec{tMLA, tIdx(0), tShared(0, 0, 0)}, ""},
		{[]Spec{tMLA, tMLA, tIdx(1), tIdx(0)}, ""},
		{[]Spec{tFull, tIdx(0)}, "groups[1] (indexer) has Target = 0, a full group"},
		{[]Spec{tIdx(0)}, "groups[0] (indexer) has Target = 0, a indexer group"},
		{[]Spec{tMLA, tIdx(2)}, "Target = 2, want a group index 0..1"},
		{[]Spec{tMLA, tIdx(0), tIdx(0)}, "groups[1] and groups[2] are both indexers of MLA group 0"},
		{[]Spec{tMLA, tIdx(0), tFull}, "groups[2] (full) follows groups[1] (indexer)"},
		{[]Spec{tFull, tShared(0, 0, 0), tShared(1, 0, 0)}, "groups[2] (shared_kv) has Target = 1, itself a shared_kv group"},
		{[]Spec{tFull, tShared(5, 0, 0)}, "Target = 5"},
		{[]Spec{tFull, tShared(-1, 0, 0)}, "Target = -1"},
		{[]Spec{tSl, tShared(0, 4, 0)}, "WindowTokens = 4, ChunkTokens = 0; its target groups[0] (sliding) has 8, 0"},
		{[]Spec{tCh, tShared(0, 0, 16)}, "ChunkTokens = 16; its target groups[0] (chunked) has 0, 8"},
		{[]Spec{tFull, tShared(0, 8, 8)}, "WindowTokens = 8, ChunkTokens = 8"},
		{[]Spec{tMLA, {Kind: Indexer, NumLayers: 2, IndexerHeadDim: 128}}, "IndexerQuantBlock = 0"},
		{[]Spec{tMLA, {Kind: Indexer, NumLayers: 2, IndexerHeadDim: 128, IndexerQuantBlock: 100}}, "IndexerQuantBlock = 100"},
		{[]Spec{tMLA, {Kind: Indexer, NumLayers: 2, IndexerHeadDim: 1 << 20, IndexerQuantBlock: 1}}, "IndexerHeadDim = 1048576"},
		{[]Spec{tMLA, {Kind: Indexer, NumLayers: 0, IndexerHeadDim: 128, IndexerQuantBlock: 128}}, "NumLayers = 0"},
		{[]Spec{tMLA, {Kind: Indexer, NumLayers: 2, WindowTokens: 4, IndexerHeadDim: 128, IndexerQuantBlock: 128}}, "indexer group with WindowTokens = 4"},
		{[]Spec{{Kind: Full, NumLayers: 2, IndexerHeadDim: 128}}, "full group with Target = 0, IndexerHeadDim = 128"},
		{[]Spec{tFull, {Kind: SharedKV, NumLayers: 1, IndexerHeadDim: 4}}, "shared_kv group with IndexerHeadDim = 4"},
		// With state groups (state.go): they own pages, so they come before
		// the aliases, and no alias can follow or share a state.
		{[]Spec{tState, tState, tState, tFull, tShared(3, 0, 0)}, ""},
		{[]Spec{tState, tMLA, tIdx(1), tShared(1, 0, 0)}, ""},
		{[]Spec{tState, tShared(0, 0, 0)}, "groups[1] (shared_kv) has Target = 0, a state group: only full, sliding, chunked and mla KV can be shared"},
		{[]Spec{tState, tFull, tIdx(0)}, "groups[2] (indexer) has Target = 0, a state group"},
		{[]Spec{tMLA, tIdx(0), tState}, "groups[2] (state) follows groups[1] (indexer)"},
		{[]Spec{tState, tState}, "2 groups, all of kind state"},
		{[]Spec{tFull, {Kind: SharedKV, NumLayers: 1, State: tState.State}}, "shared_kv group with a State shape"},
		{[]Spec{tMLA, {Kind: Indexer, NumLayers: 2, IndexerHeadDim: 128, IndexerQuantBlock: 128, State: tState.State}}, "indexer group with a State shape"},
		{[]Spec{tState, {Kind: State, NumLayers: 2, State: tState.State, Target: 1}, tFull}, "state group with Target = 1"},
	} {
		err := ValidateGroups(c.groups, 4)
		switch {
		case c.want == "" && err != nil:
			t.Errorf("%v: %v", c.groups, err)
		case c.want != "" && (!errors.Is(err, ErrBadSpec) || !strings.Contains(err.Error(), c.want)):
			t.Errorf("%v: got %v, want ErrBadSpec containing %q", c.groups, err, c.want)
		}
	}
}

// TestAliasAttentionIsTargets: a shared-KV group keeps, windows, segments
// and sees exactly what its target does, and an indexer what its MLA
// group does, at every length and position (the facade hands out the
// target's pages and Plan on that ground).
func TestAliasAttentionIsTargets(t *testing.T) {
	const ps = 4
	for _, pair := range [][2]Spec{{tSl, tShared(0, 8, 0)}, {tCh, tShared(0, 0, 8)}, {tFull, tShared(0, 0, 0)}, {tMLA, tShared(0, 0, 0)}, {tMLA, tIdx(0)}} {
		target, alias := pair[0], pair[1]
		if target.WindowLeft() != alias.WindowLeft() {
			t.Fatalf("%v vs %v: window_left %d, %d", target, alias, target.WindowLeft(), alias.WindowLeft())
		}
		for n := range 40 {
			if a, b := target.KeepFrom(n, ps), alias.KeepFrom(n, ps); a != b {
				t.Fatalf("%v vs %v: KeepFrom(%d) = %d, %d", target, alias, n, a, b)
			}
			for k := range 40 {
				if target.Visible(n, k) != alias.Visible(n, k) {
					t.Fatalf("%v vs %v: Visible(%d, %d) differs", target, alias, n, k)
				}
			}
			for rows := range 12 {
				a := target.Segments(nil, n, rows, target.KeepFrom(n, ps))
				b := alias.Segments(nil, n, rows, alias.KeepFrom(n, ps))
				if len(a) != len(b) {
					t.Fatalf("%v vs %v: segments %v, %v", target, alias, a, b)
				}
				for i := range a {
					if a[i] != b[i] {
						t.Fatalf("%v vs %v: segments %v, %v", target, alias, a, b)
					}
				}
			}
		}
	}
}

// TestIndexerLayoutDeepSeek: DeepSeek V3.2's indexer page (head dim 128,
// one float32 scale per 128 elements, vLLM's block of 64 tokens): 132
// bytes a token, the K of the 64 tokens first, then their scales.
func TestIndexerLayoutDeepSeek(t *testing.T) {
	l := tIdx(0).IndexerLayout(64)
	got := [...]int{l.TokenBytes(), l.PageBytes(), l.KOffset(1), l.ScaleOffset(0), l.ScaleOffset(63), l.ScalesPerToken()}
	want := [...]int{132, 64 * 132, 128, 64 * 128, 64*128 + 63*4, 1}
	if got != want {
		t.Fatalf("token bytes, page bytes, K offset 1, scale offsets 0 and 63, scales: %v, want %v", got, want)
	}
	l = Spec{Kind: Indexer, IndexerHeadDim: 128, IndexerQuantBlock: 64}.IndexerLayout(16)
	if l.TokenBytes() != 136 || l.ScaleOffset(1) != 16*128+8 {
		t.Fatalf("two scales a token: %d bytes, scale offset 1 = %d", l.TokenBytes(), l.ScaleOffset(1))
	}
}

// FuzzValidateGroups decodes up to 8 groups (4 bytes each: kind, target,
// window/chunk, layers, indexer shape and a state shape) and checks
// ValidateGroups: every error wraps ErrBadSpec; an accepted config has an
// attention group, a state shape exactly on its state groups, lists the
// groups that own pages first, every alias's Owner owns pages and is no
// state group, an indexer's is an MLA group with no other indexer, and a
// shared-KV group's attention is its target's (KeepFrom at every length).
func FuzzValidateGroups(f *testing.F) {
	f.Add([]byte{3, 0, 0, 1, 5, 0, 0, 1})
	f.Add([]byte{1, 0, 2, 1, 0, 0, 0, 1, 6, 0, 2, 0, 6, 1, 0, 0})
	f.Add([]byte{6, 0, 0, 1})
	f.Add([]byte{4, 0, 0, 0, 4, 0, 0, 0, 0, 0, 0, 0, 6, 2, 0, 0})
	f.Fuzz(func(t *testing.T, data []byte) {
		const ps = 4
		var groups []Spec
		for i := 0; i+4 <= len(data) && len(groups) < 8; i += 4 {
			b := data[i : i+4]
			s := Spec{Kind: Kind(b[0] % 8), Target: int(int8(b[1])) % 9, NumLayers: 1 + int(b[3]&1)}
			switch w := int(b[2] % 4); {
			case s.Kind == Sliding || s.Kind == SharedKV && b[2]&0x80 == 0:
				s.WindowTokens = w * 3
			case s.Kind == Chunked || s.Kind == SharedKV:
				s.ChunkTokens = w * ps
			}
			if s.Kind == Indexer || b[3]&0x80 != 0 {
				s.IndexerHeadDim, s.IndexerQuantBlock = int(b[3]>>1&0x3f), int(b[2]>>2&0x1f)
			}
			if s.Kind == State || b[3]&0x20 != 0 {
				s.State = tState.State
			}
			if s.OwnsPages() && b[3]&0x40 == 0 {
				s.Target = 0 // mostly well-formed owners; some with a Target
			}
			groups = append(groups, s)
		}
		err := ValidateGroups(groups, ps)
		if err != nil {
			if !errors.Is(err, ErrBadSpec) {
				t.Fatalf("%v: error %v does not wrap ErrBadSpec", groups, err)
			}
			return
		}
		owners := NumOwners(groups)
		indexed := map[int]bool{}
		attention := false
		for g, s := range groups {
			o := Owner(groups, g)
			if g < owners != s.OwnsPages() || !groups[o].OwnsPages() || o >= owners {
				t.Fatalf("%v: group %d (owners %d) has owner %d", groups, g, owners, o)
			}
			if (s.Kind == State) != (s.State != StateShape{}) || o != g && groups[o].Kind > MLA {
				t.Fatalf("%v: group %d (%v) has state %v and owner %d (%v)", groups, g, s.Kind, s.State, o, groups[o].Kind)
			}
			attention = attention || s.Kind != State
			switch s.Kind {
			case Indexer:
				if groups[o].Kind != MLA || indexed[o] {
					t.Fatalf("%v: indexer %d follows %v (indexed before: %v)", groups, g, groups[o].Kind, indexed[o])
				}
				indexed[o] = true
			case SharedKV:
				for n := range 30 {
					if s.KeepFrom(n, ps) != groups[o].KeepFrom(n, ps) {
						t.Fatalf("%v: shared group %d keeps from %d at %d, its target %d", groups, g, s.KeepFrom(n, ps), n, groups[o].KeepFrom(n, ps))
					}
				}
			}
		}
		if !attention {
			t.Fatalf("%v: accepted without an attention group", groups)
		}
	})
}
