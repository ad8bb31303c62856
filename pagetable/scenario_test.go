package pagetable_test

import (
	"fmt"
	"slices"
	"strconv"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/pagedkv/pagedkv/allocator"
	"github.com/pagedkv/pagedkv/pagetable"
)

// The scenarios below are scripts. Each step is one command and the picture
// of the table after it:
//
//	add ID | shared ID NTOKENS PAGE... | reserve ID:N ... | fork PARENT CHILD |
//	truncate ID N | release ID | window ID W
//
// A picture has one line per sequence, "ID: [Start,Len) | pages", then the
// allocator's "refs page:count ...", then one "copy SRC->DST xENTRIES" line per
// copy-on-write. A failing step's picture starts with "error: " and the error
// text; the state must then be what the previous step drew.

type step struct{ do, want string }

func TestScenarios(t *testing.T) {
	tests := map[string]struct {
		pageSize, numPages int
		steps              []step
	}{
		"AppendFillsPagesInOrder": {4, 8, []step{
			{"add 1", "1: [0,0) |\nrefs"},
			{"reserve 1:0", "1: [0,0) |\nrefs"},
			{"reserve 1:5", "1: [0,5) | 0 1\nrefs 0:1 1:1"},
			{"reserve 1:3", "1: [0,8) | 0 1\nrefs 0:1 1:1"},
			{"reserve 1:1", "1: [0,9) | 0 1 2\nrefs 0:1 1:1 2:1"},
		}},
		"ForkSharesPagesPartialLastPageCopiedOnWrite": {4, 8, []step{
			{"add 1", "1: [0,0) |\nrefs"},
			{"reserve 1:6", "1: [0,6) | 0 1\nrefs 0:1 1:1"},
			{"fork 1 2", "1: [0,6) | 0 1\n2: [0,6) | 0 1\nrefs 0:2 1:2"},
			// The child writes next: page 1 holds 2 entries the parent still
			// reads, so the child moves to a copy.
			{"reserve 2:1", "1: [0,6) | 0 1\n2: [0,7) | 0 2\nrefs 0:2 1:1 2:1\ncopy 1->2 x2"},
			// The parent is now page 1's only holder and writes in place.
			{"reserve 1:1", "1: [0,7) | 0 1\n2: [0,7) | 0 2\nrefs 0:2 1:1 2:1"},
		}},
		"ForkAtAPageBoundaryNeedsNoCopy": {4, 8, []step{
			{"add 1", "1: [0,0) |\nrefs"},
			{"reserve 1:8", "1: [0,8) | 0 1\nrefs 0:1 1:1"},
			{"fork 1 2", "1: [0,8) | 0 1\n2: [0,8) | 0 1\nrefs 0:2 1:2"},
			{"reserve 2:1 1:1", "1: [0,9) | 0 1 3\n2: [0,9) | 0 1 2\nrefs 0:2 1:2 2:1 3:1"},
		}},
		"AllHoldersAppendInOneBatch:LastOneKeepsThePage": {4, 8, []step{
			{"add 1", "1: [0,0) |\nrefs"},
			{"reserve 1:2", "1: [0,2) | 0\nrefs 0:1"},
			{"fork 1 2", "1: [0,2) | 0\n2: [0,2) | 0\nrefs 0:2"},
			{"fork 1 3", "1: [0,2) | 0\n2: [0,2) | 0\n3: [0,2) | 0\nrefs 0:3"},
			{"reserve 1:1 2:1 3:1", "1: [0,3) | 1\n2: [0,3) | 2\n3: [0,3) | 0\nrefs 0:1 1:1 2:1\ncopy 0->1 x2\ncopy 0->2 x2"},
		}},
		"TruncateBackIntoASharedPageCopiesOnNextAppend": {4, 8, []step{
			{"add 1", "1: [0,0) |\nrefs"},
			{"reserve 1:8", "1: [0,8) | 0 1\nrefs 0:1 1:1"},
			{"fork 1 2", "1: [0,8) | 0 1\n2: [0,8) | 0 1\nrefs 0:2 1:2"},
			{"truncate 1 5", "1: [0,5) | 0 1\n2: [0,8) | 0 1\nrefs 0:2 1:2"},
			{"reserve 1:1", "1: [0,6) | 0 2\n2: [0,8) | 0 1\nrefs 0:2 1:1 2:1\ncopy 1->2 x1"},
			{"truncate 1 4", "1: [0,4) | 0\n2: [0,8) | 0 1\nrefs 0:2 1:1"},
			{"truncate 1 0", "1: [0,0) |\n2: [0,8) | 0 1\nrefs 0:1 1:1"},
		}},
		"SharedPagesFromAPrefixCache": {4, 8, []step{
			{"add 1", "1: [0,0) |\nrefs"},
			{"reserve 1:7", "1: [0,7) | 0 1\nrefs 0:1 1:1"},
			{"shared 2 6 0 1", "1: [0,7) | 0 1\n2: [0,6) | 0 1\nrefs 0:2 1:2"},
			{"reserve 2:1", "1: [0,7) | 0 1\n2: [0,7) | 0 2\nrefs 0:2 1:1 2:1\ncopy 1->2 x2"},
			{"release 1", "2: [0,7) | 0 2\nrefs 0:1 2:1"},
			{"shared 3 5 0 1", "error: pagetable: add sequence 3 on shared pages: allocator: bad page: retain pages[1] = 1: refcount 0, not allocated"},
			{"shared 3 5 0 0", "error: pagetable: bad argument: add sequence 3: page 0 listed twice"},
			{"shared 3 9 0 2", "error: pagetable: bad argument: add sequence 3 with 9 tokens on 2 pages of 4 tokens (want 3 pages)"},
			{"shared 3 4 0 2", "error: pagetable: bad argument: add sequence 3 with 4 tokens on 2 pages of 4 tokens (want 1 pages)"},
			{"shared 2 0", "error: pagetable: sequence already exists: add sequence 2"},
			{"shared 3 0", "2: [0,7) | 0 2\n3: [0,0) |\nrefs 0:1 2:1"},
		}},
		"SlidingWindowReleasesLeadingPages": {4, 8, []step{
			{"add 1", "1: [0,0) |\nrefs"},
			{"reserve 1:10", "1: [0,10) | 0 1 2\nrefs 0:1 1:1 2:1"},
			{"window 1 7", "1: [0,10) | 0 1 2\nrefs 0:1 1:1 2:1"},  // tokens 3.. kept: page 0 still needed
			{"window 1 6", "1: [4,10) | 1 2\nrefs 1:1 2:1"},        // tokens 4.. kept
			{"reserve 1:3", "1: [4,13) | 1 2 0\nrefs 0:1 1:1 2:1"}, // Len counts released tokens
			{"window 1 0", "1: [12,13) | 0\nrefs 0:1"},             // the partial last page stays
			{"truncate 1 11", "error: pagetable: bad argument: truncate sequence 1 to 11 tokens, want 12..13 (Start..Len)"},
			{"truncate 1 12", "1: [12,12) |\nrefs"}, // all held tokens gone
			{"window 1 0", "1: [12,12) |\nrefs"},
			{"reserve 1:4", "1: [12,16) | 0\nrefs 0:1"},
			{"window 1 0", "1: [16,16) |\nrefs"}, // a full last page goes too
			{"window 1 -1", "error: pagetable: bad argument: release window of sequence 1: windowTokens = -1 is negative"},
		}},
		"FailedBatchChangesNothing": {4, 3, []step{
			{"add 1", "1: [0,0) |\nrefs"},
			{"add 2", "1: [0,0) |\n2: [0,0) |\nrefs"},
			{"reserve 1:2", "1: [0,2) | 0\n2: [0,0) |\nrefs 0:1"},
			{"fork 1 3", "1: [0,2) | 0\n2: [0,0) |\n3: [0,2) | 0\nrefs 0:2"},
			// 1 copy + 1 page for sequence 3 + 2 pages for sequence 2 > 2 free.
			{"reserve 3:3 2:5", "error: pagetable: reserve 8 token slots for 2 sequences (4 pages): allocator: out of pages: need 4 pages, 2 of 3 free"},
			{"reserve 3:1 3:1", "error: pagetable: bad argument: reserve: ids[1] = 3 appears twice in the batch"},
			{"reserve 3:1 9:1", "error: pagetable: unknown sequence: reserve: ids[1] = 9"},
			{"reserve 3:1 2:-1", "error: pagetable: bad argument: reserve: ntokens[1] = -1 (sequence 2) is negative"},
			{"reserve 3:2 2:4", "1: [0,2) | 0\n2: [0,4) | 2\n3: [0,4) | 1\nrefs 0:1 1:1 2:1\ncopy 0->1 x2"},
		}},
		"ReleaseReturnsOnlyUnsharedPages": {2, 8, []step{
			{"add 1", "1: [0,0) |\nrefs"},
			{"reserve 1:4", "1: [0,4) | 0 1\nrefs 0:1 1:1"},
			{"fork 1 2", "1: [0,4) | 0 1\n2: [0,4) | 0 1\nrefs 0:2 1:2"},
			{"reserve 2:1", "1: [0,4) | 0 1\n2: [0,5) | 0 1 2\nrefs 0:2 1:2 2:1"},
			{"release 2", "1: [0,4) | 0 1\nrefs 0:1 1:1"},
			{"release 2", "error: pagetable: unknown sequence: release 2"},
			{"fork 2 3", "error: pagetable: unknown sequence: fork parent 2"},
			{"fork 1 1", "error: pagetable: sequence already exists: fork child 1 of 1"},
			{"add 1", "error: pagetable: sequence already exists: add sequence 1"},
			{"truncate 1 5", "error: pagetable: bad argument: truncate sequence 1 to 5 tokens, want 0..4 (Start..Len)"},
			{"truncate 7 0", "error: pagetable: unknown sequence: truncate 7"},
			{"window 7 0", "error: pagetable: unknown sequence: release window of 7"},
			{"release 1", "refs"},
		}},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			a, err := allocator.New(allocator.Config{NumPages: tc.numPages})
			require.NoError(t, err)
			tab, err := pagetable.New(pagetable.Config{PageSize: tc.pageSize, Allocator: a})
			require.NoError(t, err)
			var live []pagetable.SeqID
			prev := ""
			for i, s := range tc.steps {
				ops, err := run(tab, s.do, &live)
				got := draw(tab, live, ops)
				if err != nil {
					assert.Equal(t, prev, got, "step %d %q failed but changed the table", i, s.do)
					got = "error: " + err.Error()
				}
				require.Equal(t, s.want, got, "step %d: %s", i, s.do)
				require.NoError(t, tab.CheckInvariants(), "step %d", i)
				require.NoError(t, a.CheckInvariants(), "step %d", i)
				if err == nil {
					prev = draw(tab, live, nil)
				}
			}
		})
	}
}

// run executes one script command.
func run(tab *pagetable.Table, cmd string, live *[]pagetable.SeqID) ([]pagetable.CopyOp, error) {
	f := strings.Fields(cmd)
	num := func(s string) int {
		n, err := strconv.Atoi(s)
		if err != nil {
			panic(err)
		}
		return n
	}
	id := func(s string) pagetable.SeqID { return pagetable.SeqID(num(s)) }
	addLive := func(x pagetable.SeqID) {
		if !slices.Contains(*live, x) {
			*live = append(*live, x)
			slices.Sort(*live)
		}
	}
	switch f[0] {
	case "add":
		err := tab.Add(id(f[1]))
		if err == nil {
			addLive(id(f[1]))
		}
		return nil, err
	case "shared":
		var pages []allocator.PageID
		for _, p := range f[3:] {
			pages = append(pages, allocator.PageID(num(p)))
		}
		err := tab.AddShared(id(f[1]), pages, num(f[2]))
		if err == nil {
			addLive(id(f[1]))
		}
		return nil, err
	case "reserve":
		var ids []pagetable.SeqID
		var ns []int32
		for _, arg := range f[1:] {
			a, b, _ := strings.Cut(arg, ":")
			ids, ns = append(ids, id(a)), append(ns, int32(num(b)))
		}
		return tab.Reserve(nil, ids, ns)
	case "fork":
		err := tab.Fork(id(f[1]), id(f[2]))
		if err == nil {
			addLive(id(f[2]))
		}
		return nil, err
	case "truncate":
		return nil, tab.Truncate(id(f[1]), num(f[2]))
	case "release":
		err := tab.Release(id(f[1]))
		if err == nil {
			*live = slices.DeleteFunc(*live, func(x pagetable.SeqID) bool { return x == id(f[1]) })
		}
		return nil, err
	case "window":
		_, err := tab.ReleaseWindow(id(f[1]), num(f[2]))
		return nil, err
	}
	panic("unknown command " + cmd)
}

// draw renders the table as in the scenario pictures.
func draw(tab *pagetable.Table, live []pagetable.SeqID, ops []pagetable.CopyOp) string {
	var b strings.Builder
	for _, id := range live {
		fmt.Fprintf(&b, "%d: [%d,%d) |", id, tab.Start(id), tab.Len(id))
		for _, p := range tab.Pages(id) {
			fmt.Fprintf(&b, " %d", p)
		}
		b.WriteString("\n")
	}
	b.WriteString("refs")
	a := tab.Allocator()
	for p := range a.NumPages() {
		if r := a.RefCount(allocator.PageID(p)); r > 0 {
			fmt.Fprintf(&b, " %d:%d", p, r)
		}
	}
	for _, o := range ops {
		fmt.Fprintf(&b, "\ncopy %d->%d x%d", o.Src, o.Dst, o.Entries)
	}
	return b.String()
}
