package handoff

import (
	"encoding/binary"
	"fmt"
	"math"
	"time"

	"github.com/pagedkv/pagedkv/tier"
)

// RetentionRange is a retention hint for the request's tokens [Start,
// End) (End 0: to the end), as pagedkv.RetentionRange says it: the decode
// side's cache honours it (docs/handoff.md, "Retention"). Where ranges
// overlap, the later one wins, except that Ephemeral in any holds.
type RetentionRange struct {
	Start, End int
	// Priority is the eviction level (0..tier.MaxRetentionLevels-1; the
	// decode Manager refuses one past its own levels when it is passed to
	// Add, and its tiers cut it to theirs).
	Priority uint8
	// Duration: the level lapses after this much idle time (0: never).
	Duration time.Duration
	// Ephemeral: never published (reasoning tokens).
	Ephemeral bool
	// Session: 0 unknown, 1 continues, 2 ended (pagedkv.Session).
	Session uint8
}

// Retention limits on the stream.
const (
	// MaxRetentionRanges bounds a request's ranges (pagedkv's
	// MaxRetentionRanges).
	MaxRetentionRanges = 64
	// retentionRangeBytes: u32 start, u32 end, u8 priority, u8 session,
	// u8 ephemeral (0 or 1), 5 zero bytes, i64 duration (ns).
	retentionRangeBytes = 24
	// maxRangeToken bounds a range's start and end.
	maxRangeToken = math.MaxInt32
)

// checkRetentionRange reports what is wrong with range i, naming the
// field.
func checkRetentionRange(i int, r RetentionRange) error {
	switch {
	case r.Start < 0 || r.Start > maxRangeToken:
		return fmt.Errorf("retention range %d starts at token %d, want 0..%d", i, r.Start, maxRangeToken)
	case r.End != 0 && (r.End <= r.Start || r.End > maxRangeToken):
		return fmt.Errorf("retention range %d is tokens [%d, %d), want an end after the start, at most %d (or 0: to the end)", i, r.Start, r.End, maxRangeToken)
	case r.Priority >= tier.MaxRetentionLevels:
		return fmt.Errorf("retention range %d has priority %d, want 0..%d", i, r.Priority, tier.MaxRetentionLevels-1)
	case r.Duration < 0 || r.Duration > tier.MaxRetentionDuration:
		return fmt.Errorf("retention range %d lasts %v, want 0..%v", i, r.Duration, tier.MaxRetentionDuration)
	case r.Session > tier.MaxRetentionHint:
		return fmt.Errorf("retention range %d has session %d, want 0..%d", i, r.Session, tier.MaxRetentionHint)
	}
	return nil
}

// checkRetention checks a request's ranges.
func checkRetention(ranges []RetentionRange) error {
	if len(ranges) > MaxRetentionRanges {
		return fmt.Errorf("%d retention ranges, want at most %d", len(ranges), MaxRetentionRanges)
	}
	for i, r := range ranges {
		if err := checkRetentionRange(i, r); err != nil {
			return err
		}
	}
	return nil
}

func appendRetentionRange(b []byte, r RetentionRange) []byte {
	b = binary.LittleEndian.AppendUint32(b, uint32(r.Start))
	b = binary.LittleEndian.AppendUint32(b, uint32(r.End))
	eph := byte(0)
	if r.Ephemeral {
		eph = 1
	}
	b = append(b, r.Priority, r.Session, eph, 0, 0, 0, 0, 0)
	return binary.LittleEndian.AppendUint64(b, uint64(r.Duration))
}

// parseRetentionRange decodes and checks range i.
func parseRetentionRange(i int, b []byte) (RetentionRange, error) {
	r := RetentionRange{Start: int(binary.LittleEndian.Uint32(b)), End: int(binary.LittleEndian.Uint32(b[4:])),
		Priority: b[8], Session: b[9], Ephemeral: b[10] == 1, Duration: time.Duration(binary.LittleEndian.Uint64(b[16:]))}
	switch {
	case b[10] > 1:
		return r, fmt.Errorf("retention range %d has ephemeral byte %d, want 0 or 1", i, b[10])
	case b[11]|b[12]|b[13]|b[14]|b[15] != 0:
		return r, fmt.Errorf("retention range %d has reserved bytes %x, want zero", i, b[11:16])
	}
	return r, checkRetentionRange(i, r)
}

// pageRetention resolves page d's retention (tokens [d*ps, (d+1)*ps)) for
// the tiers: the last range covering the page gives its level, duration
// (the whole of it left) and hint; none: zero.
func pageRetention(ranges []RetentionRange, d, ps int) tier.Retention {
	lo, hi := d*ps, (d+1)*ps
	var out tier.Retention
	for _, r := range ranges {
		if r.Start >= hi || r.End != 0 && r.End <= lo {
			continue
		}
		out = tier.Retention{Priority: r.Priority, Hint: r.Session}
		if r.Priority > 0 && r.Duration > 0 {
			out.Duration, out.Left = r.Duration, r.Duration
		}
	}
	return out
}
