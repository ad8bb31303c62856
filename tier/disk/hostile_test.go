//go:build unix

package disk

import (
	"encoding/binary"
	"errors"
	"math"
	"os"
	"path/filepath"
	"syscall"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/pagedkv/pagedkv/internal/doclimits"
)

// Planted links named like LOCK or a segment file are refused by name,
// whether they point at a file outside the directory or at nothing: the
// outside file keeps its bytes and a dangling link's target is not
// created.
func TestOpenRefusesLinks(t *testing.T) {
	for _, name := range []string{"LOCK", "seg-0000.pkvd", "seg-0001.pkvd"} {
		for _, dangling := range []bool{false, true} {
			dir, outside := t.TempDir(), t.TempDir()
			victim := filepath.Join(outside, "victim")
			want := []byte("a file outside the store's directory")
			if !dangling {
				require.NoError(t, os.WriteFile(victim, want, 0o644))
			}
			link := filepath.Join(dir, name)
			require.NoError(t, os.Symlink(victim, link))
			_, err := Open(testConfig(dir, 16)) // two segments
			require.ErrorIs(t, err, ErrNotRegularFile, "%s (dangling %v)", name, dangling)
			require.Contains(t, err.Error(), link)
			require.Contains(t, err.Error(), "a symbolic link")
			require.Contains(t, err.Error(), victim)
			if dangling {
				_, err := os.Lstat(victim)
				require.ErrorIs(t, err, os.ErrNotExist, "%s: the dangling link's target was created", name)
			} else {
				got, err := os.ReadFile(victim)
				require.NoError(t, err)
				require.Equal(t, want, got, "%s: the file outside was changed", name)
			}
			// Removed, the directory opens.
			require.NoError(t, os.Remove(link))
			s := openStore(t, testConfig(dir, 16))
			require.NoError(t, s.Close())
		}
	}
	// A link inside the directory (seg-0001 to seg-0000) is refused too:
	// two segments must never be one file.
	dir := t.TempDir()
	s := openStore(t, testConfig(dir, 16))
	require.NoError(t, s.Close())
	require.NoError(t, os.Remove(filepath.Join(dir, "seg-0001.pkvd")))
	require.NoError(t, os.Symlink("seg-0000.pkvd", filepath.Join(dir, "seg-0001.pkvd")))
	_, err := Open(testConfig(dir, 16))
	require.ErrorIs(t, err, ErrNotRegularFile)
	// A link past the last segment is a leftover segment, refused.
	require.NoError(t, os.Remove(filepath.Join(dir, "seg-0001.pkvd")))
	require.NoError(t, os.Symlink(filepath.Join(t.TempDir(), "nothing"), filepath.Join(dir, "seg-0002.pkvd")))
	_, err = Open(testConfig(dir, 16))
	require.ErrorIs(t, err, ErrForeignDir)
	require.Contains(t, err.Error(), "seg-0002.pkvd")
}

// A directory or a named pipe named like LOCK or a segment file is
// refused by name and kind (a pipe does not block the open).
func TestOpenRefusesNonRegularFiles(t *testing.T) {
	for _, name := range []string{"LOCK", "seg-0000.pkvd"} {
		dir := t.TempDir()
		require.NoError(t, os.Mkdir(filepath.Join(dir, name), 0o755))
		_, err := Open(testConfig(dir, 8))
		require.ErrorIs(t, err, ErrNotRegularFile, name)
		require.Contains(t, err.Error(), filepath.Join(dir, name)+" is a directory")

		dir = t.TempDir()
		if err := syscall.Mkfifo(filepath.Join(dir, name), 0o644); err != nil {
			t.Skipf("no named pipes here: %v", err)
		}
		_, err = Open(testConfig(dir, 8))
		require.ErrorIs(t, err, ErrNotRegularFile, name)
		require.Contains(t, err.Error(), filepath.Join(dir, name)+" is a named pipe")
	}
}

// setSeq rewrites slot's header (segment 0) with sequence seq and a valid
// header checksum.
func setSeq(t *testing.T, dir string, slot int, seq uint64) {
	b := readSlot(t, dir, slot)
	h, err := decodeSlotHeader(b)
	require.NoError(t, err)
	h.Seq = seq
	h.encode(b)
	require.Equal(t, seq, binary.LittleEndian.Uint64(b[8:]))
	writeSlot(t, dir, slot, b)
}

// plantSequence stores the first 3-page chain of a fresh universe in a
// new 16-slot store, closes it and rewrites the first page's slot to
// sequence seq (with a valid checksum): the directory, the universe and
// that slot.
func plantSequence(t *testing.T, seq uint64) (dir string, u *pageUniverse, first int) {
	t.Helper()
	dir = t.TempDir()
	u = newUniverse(testFormat, 2, 3)
	s := openStore(t, testConfig(dir, 16))
	storeAll(t, s, u.chains[0])
	first = int(s.index[u.chains[0][0].Digest])
	require.NoError(t, s.Close())
	setSeq(t, dir, first, seq)
	return dir, u, first
}

// A slot whose sequence cannot be continued (2^64-1: the next would wrap
// to 0) is dropped as torn, not served; the store goes on, and the next
// page stored is served and survives a restart. (Before: the next page
// got sequence 0, was never served and was dropped on restart.)
func TestSequenceThatCannotContinue(t *testing.T) {
	for _, seq := range []uint64{math.MaxUint64, MaxSequence + 1} {
		dir, u, _ := plantSequence(t, seq)
		s := openStore(t, testConfig(dir, 16))
		rec := s.Recovery()
		require.Equal(t, 1, rec.Torn, "%+v", rec)
		require.Equal(t, 2, rec.Recovered)
		require.Contains(t, rec.Drops[0].Err, "outside 1..9223372036854775807")
		require.Equal(t, 0, fetchChecked(t, s, request(u.chains[0])), "the slot is not served")
		require.True(t, s.Store(&u.chains[1][1]))
		require.True(t, s.Store(&u.chains[0][0]))
		flush(t, s)
		require.NoError(t, s.CheckInvariants())
		require.Equal(t, 3, fetchChecked(t, s, request(u.chains[0])))
		require.Equal(t, 1, fetchChecked(t, s, request(u.chains[1][1:])))
		require.NoError(t, s.Close())

		s = openStore(t, testConfig(dir, 16))
		require.Equal(t, Recovery{Slots: 16, Empty: 12, Recovered: 4}, s.Recovery())
		require.Equal(t, 3, fetchChecked(t, s, request(u.chains[0])))
		require.Equal(t, 1, fetchChecked(t, s, request(u.chains[1][1:])))
		require.NoError(t, s.Close())
	}
}

// A verified slot with the highest sequence a slot may hold is kept, and
// Open renumbers the recovered slots so the writer can go on: the next
// page is served and survives a restart, in order after the others.
func TestSequenceRenumbered(t *testing.T) {
	dir, u, first := plantSequence(t, MaxSequence)
	s := openStore(t, testConfig(dir, 16))
	require.Equal(t, Recovery{Slots: 16, Empty: 13, Recovered: 3, Renumbered: 3}, s.Recovery())
	require.Equal(t, uint64(3), s.slots[first].seq, "the planted slot is the newest")
	require.Equal(t, uint64(4), s.nextSeq)
	require.Equal(t, 3, fetchChecked(t, s, request(u.chains[0])))
	require.True(t, s.Store(&u.chains[1][1]))
	flush(t, s)
	require.NoError(t, s.CheckInvariants())
	require.Equal(t, 1, fetchChecked(t, s, request(u.chains[1][1:])))
	require.NoError(t, s.Close())

	s = openStore(t, testConfig(dir, 16))
	defer s.Close()
	require.Equal(t, Recovery{Slots: 16, Empty: 12, Recovered: 4}, s.Recovery())
	require.Equal(t, 3, fetchChecked(t, s, request(u.chains[0])))
	require.Equal(t, 1, fetchChecked(t, s, request(u.chains[1][1:])))
}

// docs/disk-tier.md's table of the disk tier's limits is the code's.
func TestDiskLimitsDocumented(t *testing.T) {
	doclimits.Check(t, "docs/disk-tier.md", map[string]any{
		"disk.MaxSequence":         uint64(MaxSequence),
		"disk.RenumberAbove":       uint64(RenumberAbove),
		"disk.MaxQueueBytes":       int64(MaxQueueBytes),
		"disk.MaxQueueLen":         MaxQueueLen,
		"disk.MaxPages":            MaxPages,
		"disk.maxStoreBytes":       int64(maxStoreBytes),
		"disk.MaxDropReports":      MaxDropReports,
		"disk.maxReadBytes":        maxReadBytes,
		"disk.maxRunBytes":         maxRunBytes,
		"disk.readPieceBytes":      readPieceBytes,
		"disk.maxWriteBytes":       maxWriteBytes,
		"disk.DefaultQueueLen":     DefaultQueueLen,
		"disk.DefaultSegmentPages": DefaultSegmentPages,
		"disk.DefaultSyncEvery":    DefaultSyncEvery,
	})
}

// FuzzDirectoryEntries plants, under LOCK and each segment name of a
// two-segment store, one of: nothing, a regular file (empty, or the bytes
// of a real segment), a link to a file outside, a dangling link, a link
// to another entry, a directory, a named pipe. Open either succeeds with
// every entry a regular file, or refuses by name (ErrNotRegularFile,
// ErrForeignDir); the file outside keeps its bytes and nothing is created
// outside the directory.
func FuzzDirectoryEntries(f *testing.F) {
	f.Add([]byte{0, 0, 0, 0})
	f.Add([]byte{2, 0, 0, 0})
	f.Add([]byte{0, 3, 0, 0})
	f.Add([]byte{0, 0, 4, 5})
	f.Add([]byte{1, 6, 7, 0})
	f.Fuzz(func(t *testing.T, kinds []byte) {
		if len(kinds) > 4 {
			return
		}
		dir, outside := t.TempDir(), t.TempDir()
		victim := filepath.Join(outside, "victim")
		want := []byte("outside the store")
		require.NoError(t, os.WriteFile(victim, want, 0o644))
		seg := make([]byte, segmentHeaderBytes)
		names := []string{"LOCK", "seg-0000.pkvd", "seg-0001.pkvd", "seg-0002.pkvd"}
		for i, k := range kinds {
			p := filepath.Join(dir, names[i])
			switch k % 8 {
			case 1:
				require.NoError(t, os.WriteFile(p, nil, 0o644))
			case 2:
				require.NoError(t, os.WriteFile(p, seg, 0o644))
			case 3:
				require.NoError(t, os.Symlink(victim, p))
			case 4:
				require.NoError(t, os.Symlink(filepath.Join(outside, "dangling"), p))
			case 5:
				require.NoError(t, os.Symlink(names[(i+1)%len(names)], p))
			case 6:
				require.NoError(t, os.Mkdir(p, 0o755))
			case 7:
				if syscall.Mkfifo(p, 0o644) != nil {
					return
				}
			}
		}
		s, err := Open(testConfig(dir, 16))
		if err == nil {
			for _, n := range names[:3] {
				fi, err := os.Lstat(filepath.Join(dir, n))
				require.NoError(t, err)
				require.True(t, fi.Mode().IsRegular(), "%s opened as %v", n, fi.Mode())
			}
			require.NoError(t, s.CheckInvariants())
			require.NoError(t, s.Close())
		} else if !errors.Is(err, ErrNotRegularFile) && !errors.Is(err, ErrForeignDir) {
			t.Fatalf("Open: %v, want success, ErrNotRegularFile or ErrForeignDir", err)
		}
		got, err := os.ReadFile(victim)
		require.NoError(t, err)
		require.Equal(t, want, got, "the file outside changed")
		entries, err := os.ReadDir(outside)
		require.NoError(t, err)
		require.Len(t, entries, 1, "a file was created outside the directory")
	})
}
