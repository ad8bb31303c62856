package stepbuf

import (
	"encoding/binary"
	"errors"
	"fmt"
	"strings"
	"testing"
	"unsafe"
)

// checkLayout checks the package invariants of l and that Find names
// every row.
func checkLayout(t *testing.T, l *Layout) {
	t.Helper()
	end := 0
	for i, r := range l.Rows {
		if r.Offset%Align != 0 || r.Offset < end || r.Cap < 1 {
			t.Fatalf("row %d %+v: misaligned, overlapping the row before (ends at %d) or empty", i, r, end)
		}
		end = r.Offset + 4*r.Cap
		if got := l.Find(r.Array, r.Group, r.Level); got != i {
			t.Fatalf("Find(%v, %d, %d) = %d, want %d", r.Array, r.Group, r.Level, got, i)
		}
		if !r.Array.IsLevel() && r.Level != -1 || r.Array.IsLevel() && (r.Level < 0 || r.Level >= l.Caps.MaxCascadeLevels) {
			t.Fatalf("row %d %+v: bad level", i, r)
		}
	}
	if want := (end + Align - 1) / Align * Align; l.Size != want {
		t.Fatalf("Size %d, want %d", l.Size, want)
	}
	if l.Find(Copies, -1, -1) != 1 || l.Find(PoolHeader, -1, -1) != 0 {
		t.Fatal("the pool's rows are not first")
	}
}

func TestLayoutRows(t *testing.T) {
	l, err := NewLayout(Capacities{MaxRequests: 3, MaxTokens: 5, MaxPages: 7, MaxCascadeLevels: 2},
		[]GroupSpec{{BlockTablesStride: 4}, {Chunked: true}})
	if err != nil {
		t.Fatal(err)
	}
	checkLayout(t, l)
	// pool 2 rows; group 0: header, 10 plan, block tables, 3 cascade and
	// 2*4 level rows; group 1 the same but block tables plus 5 attention rows.
	if len(l.Rows) != 2+23+27 {
		t.Fatalf("%d rows", len(l.Rows))
	}
	for _, c := range []struct {
		a           Array
		g, lv, want int
	}{
		{Copies, -1, -1, 3 * 3 * 2}, {QOIndptr, 0, -1, 4}, {KVPageIndices, 1, -1, 7}, {TokenIDs, 0, -1, 5},
		{AttnQOIndptr, 1, -1, 6}, {BlockTables, 0, -1, 3 * 4}, {LevelKVPageIndices, 1, 1, 7}, {LevelKVLastPageLen, 0, 0, 3}, {CascadeWindowLeft, 0, -1, 2},
	} {
		if i := l.Find(c.a, c.g, c.lv); i < 0 || l.Rows[i].Cap != c.want {
			t.Errorf("%v of group %d level %d: row %d, want capacity %d", c.a, c.g, c.lv, i, c.want)
		}
	}
	for _, c := range []struct {
		a     Array
		g, lv int
	}{{AttnQOIndptr, 0, -1}, {BlockTables, 1, -1}, {LevelQOIndptr, 0, 2}, {QOIndptr, 2, -1}, {QOIndptr, -2, -1}, {numArrays, 0, -1}} {
		if i := l.Find(c.a, c.g, c.lv); i != -1 {
			t.Errorf("Find(%v, %d, %d) = %d, want -1", c.a, c.g, c.lv, i)
		}
	}
	if QOIndptr.String() != "qo_indptr" || BlockTables.String() != "block_tables" || Array(99).String() != "Array(99)" {
		t.Error("names")
	}
	for _, s := range []int{-1, MaxCap/3 + 1} {
		_, err := NewLayout(Capacities{MaxRequests: 3, MaxTokens: 5, MaxPages: 7}, []GroupSpec{{}, {BlockTablesStride: s}})
		if want := fmt.Sprintf("group 1: BlockTablesStride = %d, want 0..%d", s, MaxCap/3); !errors.Is(err, ErrBadCapacity) ||
			!strings.Contains(err.Error(), want) {
			t.Errorf("stride %d: %v, want %q", s, err, want)
		}
	}
}

// FuzzStepBufferLayout decodes capacities, groups and a memory size and
// offset: NewLayout refuses exactly the capacities out of bounds, a
// layout keeps the invariants, Bind refuses exactly memory too small or
// misaligned, and the bound rows are the memory at their offsets. Values
// stay small (capacities up to 1023, 4 groups), so the memory is bounded.
func FuzzStepBufferLayout(f *testing.F) {
	f.Add([]byte{3, 0, 5, 0, 7, 0, 2, 2, 0, 0})
	f.Add([]byte{0, 0, 1, 0, 1, 0, 65, 1, 4, 3})
	f.Add([]byte{255, 3, 255, 3, 255, 3, 64, 15, 200, 8})
	f.Fuzz(func(t *testing.T, data []byte) {
		if len(data) < 10 {
			return
		}
		v := func(i int) int { return int(binary.LittleEndian.Uint16(data[i:])) & 1023 }
		caps := Capacities{MaxRequests: v(0), MaxTokens: v(2), MaxPages: v(4), MaxCascadeLevels: int(data[6]) % 80}
		if data[7]&0x80 != 0 {
			caps.MaxTokens = -caps.MaxTokens
		}
		groups := make([]GroupSpec, data[7]&3)
		for g := range groups {
			groups[g].Chunked = data[7]>>(2+g)&1 == 1
			groups[g].BlockTablesStride = int(data[9]>>4) * (g & 1)
		}
		l, err := NewLayout(caps, groups)
		bad := caps.MaxRequests < 1 || caps.MaxTokens < 1 || caps.MaxPages < 1 || caps.MaxCascadeLevels > MaxLevels || len(groups) == 0
		if bad != (err != nil) || err != nil && !errors.Is(err, ErrBadCapacity) {
			t.Fatalf("caps %+v, %d groups: err %v", caps, len(groups), err)
		}
		if err != nil {
			return
		}
		checkLayout(t, l)
		short, off := int(data[8])-100, int(data[9])%Align
		raw := make([]byte, l.Size+max(0, -short)+2*Align)
		base := Align - int(uintptr(unsafe.Pointer(&raw[0]))%Align)
		mem := raw[base+off : base+off+max(0, l.Size-max(0, short))]
		b, err := Bind(mem, l)
		switch {
		case len(mem) < l.Size:
			if !errors.Is(err, ErrTooSmall) {
				t.Fatalf("%d bytes for %d: %v", len(mem), l.Size, err)
			}
			return
		case off != 0:
			if !errors.Is(err, ErrMisaligned) {
				t.Fatalf("offset %d: %v", off, err)
			}
			return
		case err != nil:
			t.Fatal(err)
		}
		for i, r := range l.Rows {
			row := b.Rows[i]
			if len(row) != r.Cap || cap(row) != r.Cap || unsafe.Pointer(&row[0]) != unsafe.Pointer(&mem[r.Offset]) {
				t.Fatalf("row %d %+v: view of %d/%d at the wrong place", i, r, len(row), cap(row))
			}
		}
	})
}
