package tier

import (
	"container/heap"
	"encoding/binary"
	"fmt"
	"time"
)

// Retention is a page's retention hint as it travels below the device
// (docs/retention.md, "Below the device"): the eviction level it had, how
// long that level lasts once the page is idle, what was left of that when
// the page was handed over, and its continuation hint. The zero value is
// no retention: level 0, no lapse, no hint.
type Retention struct {
	// Priority is the eviction level, 0..MaxRetentionLevels-1: each tier
	// evicts from its lowest level that holds an evictable page.
	Priority uint8
	// Hint is the continuation hint (evict.Hint's numbering: 0 none,
	// 1 reuse, 2 no reuse).
	Hint uint8
	// Duration is the idle time after which Priority lapses to 0; 0: it
	// never lapses. Every use of the page restarts the count.
	Duration time.Duration
	// Left is what was left of Duration when the page was handed over
	// (0 < Left <= Duration when Duration > 0; 0 otherwise).
	Left time.Duration
}

// Retention limits: what a value, a handoff or an engine may say.
const (
	// MaxRetentionLevels bounds Priority (the Manager's Config.Priorities).
	MaxRetentionLevels = 16
	// MaxRetentionHint is the largest Hint (evict.HintNoReuse).
	MaxRetentionHint = 2
	// MaxRetentionDuration bounds Duration: a year.
	MaxRetentionDuration = 366 * 24 * time.Hour
)

// Check reports whether r is within the limits, naming the bad field.
func (r Retention) Check() error {
	switch {
	case r.Priority >= MaxRetentionLevels:
		return fmt.Errorf("retention priority %d, want 0..%d", r.Priority, MaxRetentionLevels-1)
	case r.Hint > MaxRetentionHint:
		return fmt.Errorf("retention hint %d, want 0..%d", r.Hint, MaxRetentionHint)
	case r.Duration < 0 || r.Duration > MaxRetentionDuration:
		return fmt.Errorf("retention duration %v, want 0..%v", r.Duration, MaxRetentionDuration)
	case r.Duration == 0 && r.Left != 0:
		return fmt.Errorf("retention with %v left of no duration", r.Left)
	case r.Duration > 0 && (r.Left <= 0 || r.Left > r.Duration):
		return fmt.Errorf("retention with %v left of a duration of %v, want 0 < left <= duration", r.Left, r.Duration)
	}
	return nil
}

// Elapsed returns r after d more idle time: Left shrinks by d, and once
// nothing is left the level lapses (level 0, no duration).
func (r Retention) Elapsed(d time.Duration) Retention {
	if r.Duration == 0 || d <= 0 {
		return r
	}
	if d >= r.Left {
		return Retention{Hint: r.Hint}
	}
	r.Left -= d
	return r
}

// retentionBytes is the value's retention field (flags&valueRetention):
// priority, hint, 6 zero bytes, duration (int64 ns) and the wall-clock
// deadline of the level (int64 Unix ns; 0 with no duration).
const retentionBytes = 24

// RetentionFieldBytes is what the retention field adds to a value.
const RetentionFieldBytes = retentionBytes

// appendRetention encodes r, its deadline taken from now.
func appendRetention(dst []byte, r Retention, now time.Time) []byte {
	return AppendValueRetention(dst, r.Written(now))
}

// Written returns r as written at wall-clock time now: its deadline now
// plus what is left.
func (r Retention) Written(now time.Time) ValueRetention {
	v := ValueRetention{Priority: r.Priority, Hint: r.Hint, Duration: r.Duration}
	if r.Duration > 0 {
		v.Deadline = now.UnixNano() + int64(r.Left)
	}
	return v
}

// AppendValueRetention appends the 24-byte retention field of v (a disk
// slot header keeps the same field).
func AppendValueRetention(dst []byte, v ValueRetention) []byte {
	dst = append(dst, v.Priority, v.Hint, 0, 0, 0, 0, 0, 0)
	dst = binary.LittleEndian.AppendUint64(dst, uint64(v.Duration))
	return binary.LittleEndian.AppendUint64(dst, uint64(v.Deadline))
}

// ParseValueRetention decodes and checks a 24-byte retention field,
// naming the bad field.
func ParseValueRetention(b []byte) (ValueRetention, error) {
	if len(b) != retentionBytes {
		return ValueRetention{}, fmt.Errorf("retention field of %d bytes, want %d", len(b), retentionBytes)
	}
	return parseRetention(b)
}

// ValueRetention is a value's retention field as written: Retention with
// an absolute deadline (Unix ns on the writer's wall clock; 0 with no
// duration), so that a value read later, by another process, knows what
// is left ([ValueRetention.At]).
type ValueRetention struct {
	Priority, Hint uint8
	Duration       time.Duration
	Deadline       int64
}

// At returns the retention at wall-clock time now: what is left until the
// deadline, or level 0 once it has passed.
func (v ValueRetention) At(now time.Time) Retention {
	r := Retention{Priority: v.Priority, Hint: v.Hint}
	if v.Duration == 0 {
		return r
	}
	left := time.Duration(v.Deadline - now.UnixNano())
	if left <= 0 {
		return Retention{Hint: v.Hint}
	}
	r.Duration, r.Left = v.Duration, min(left, v.Duration)
	return r
}

// Whole returns the retention with its whole duration left and the
// wall-clock time from which that gives v's deadline: EncodeValueAt of a
// page with it, at that time, writes v again.
func (v ValueRetention) Whole() (Retention, time.Time) {
	r := Retention{Priority: v.Priority, Hint: v.Hint, Duration: v.Duration, Left: v.Duration}
	return r, time.Unix(0, v.Deadline-int64(v.Duration))
}

// parseRetention decodes and checks the field.
func parseRetention(b []byte) (ValueRetention, error) {
	v := ValueRetention{Priority: b[0], Hint: b[1],
		Duration: time.Duration(binary.LittleEndian.Uint64(b[8:])), Deadline: int64(binary.LittleEndian.Uint64(b[16:]))}
	for _, c := range b[2:8] {
		if c != 0 {
			return v, fmt.Errorf("retention reserved bytes %x, want zero", b[2:8])
		}
	}
	r := Retention{Priority: v.Priority, Hint: v.Hint, Duration: v.Duration}
	if v.Duration > 0 {
		r.Left = v.Duration
	}
	if err := r.Check(); err != nil {
		return v, err
	}
	switch {
	case v.Duration == 0 && v.Deadline != 0:
		return v, fmt.Errorf("retention deadline %d with no duration", v.Deadline)
	case v.Duration > 0 && v.Deadline <= 0:
		return v, fmt.Errorf("retention deadline %d, want > 0 with a duration of %v", v.Deadline, v.Duration)
	case v == ValueRetention{}:
		return v, fmt.Errorf("retention field present but empty (write the value without it)")
	}
	return v, nil
}

// Lapses is a min-heap of ids (0..n-1) by deadline: the pages of a tier
// whose level lapses at a time. Set, Remove and Due are O(log n) and
// allocate nothing (container/heap, never boxing an id).
type Lapses struct {
	ids []int32         // heap-ordered by at
	at  []time.Duration // at[id]: id's deadline while it is on the heap
	pos []int32         // 1 + id's index in ids; 0: off the heap
}

// NewLapses returns an empty heap for ids 0..n-1.
func NewLapses(n int) *Lapses {
	return &Lapses{ids: make([]int32, 0, n), at: make([]time.Duration, n), pos: make([]int32, n)}
}

// LapsesBytes is what NewLapses allocates per id.
const LapsesBytes = 4 + 8 + 4

func (l *Lapses) Len() int { return len(l.ids) }
func (l *Lapses) Less(i, j int) bool {
	return l.at[l.ids[i]] < l.at[l.ids[j]] || l.at[l.ids[i]] == l.at[l.ids[j]] && l.ids[i] < l.ids[j]
}
func (l *Lapses) Swap(i, j int) {
	l.ids[i], l.ids[j] = l.ids[j], l.ids[i]
	l.pos[l.ids[i]], l.pos[l.ids[j]] = int32(i)+1, int32(j)+1
}

// Push and Pop are container/heap's: Set and Remove are the calls to use.
func (l *Lapses) Push(any) { panic("tier: Lapses.Push: use Set") }
func (l *Lapses) Pop() any {
	l.ids = l.ids[:len(l.ids)-1]
	return nil
}

// Set puts id on the heap with deadline at, or moves it there.
func (l *Lapses) Set(id int32, at time.Duration) {
	l.at[id] = at
	if l.pos[id] == 0 {
		l.ids = append(l.ids, id)
		l.pos[id] = int32(len(l.ids))
	}
	heap.Fix(l, int(l.pos[id])-1)
}

// Remove takes id off the heap, if it is on it.
func (l *Lapses) Remove(id int32) {
	if i := l.pos[id]; i != 0 {
		heap.Remove(l, int(i)-1)
		l.pos[id] = 0
	}
}

// Deadline returns id's deadline; ok is false when it is off the heap.
func (l *Lapses) Deadline(id int32) (at time.Duration, ok bool) {
	return l.at[id], l.pos[id] != 0
}

// Due returns the id with the earliest deadline if it is at or before
// now.
func (l *Lapses) Due(now time.Duration) (int32, bool) {
	if len(l.ids) == 0 || l.at[l.ids[0]] > now {
		return 0, false
	}
	return l.ids[0], true
}

// Check verifies the heap order and positions.
func (l *Lapses) Check() error {
	for i, id := range l.ids {
		if l.pos[id] != int32(i)+1 {
			return fmt.Errorf("tier: lapses: id %d at %d says %d", id, i, l.pos[id]-1)
		}
		if i > 0 && l.Less(i, (i-1)/2) {
			return fmt.Errorf("tier: lapses: id %d is before its parent", id)
		}
	}
	n := 0
	for _, p := range l.pos {
		if p != 0 {
			n++
		}
	}
	if n != len(l.ids) {
		return fmt.Errorf("tier: lapses: %d positions for %d ids", n, len(l.ids))
	}
	return nil
}
