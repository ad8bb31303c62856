package tier

import (
	"fmt"
	"strings"
	"sync"
)

// RejectReason says why a remote store refused a value it found under a
// page's key. Every rejected value is counted under exactly one reason.
type RejectReason uint8

const (
	// RejectCorrupt: a value of the page's length that is not a value
	// this version writes (bad magic, version, lengths or checksum).
	RejectCorrupt RejectReason = iota
	// RejectSize: a value of another length than the page's encoding,
	// refused from its length before it is read (truncated, padded, a
	// huge value made with SETRANGE).
	RejectSize
	// RejectWrongType: the key holds another kind of value (a Redis
	// list, hash, set...), not bytes.
	RejectWrongType
	// RejectForeign: a valid value of another namespace, layer group or
	// page format.
	RejectForeign
	// RejectStale: a valid value of this deployment for another page
	// (another digest, parent or tokens: stale, or a key collision).
	RejectStale
	// NumRejectReasons is the number of reasons.
	NumRejectReasons
)

var rejectReasonNames = [NumRejectReasons]string{"corrupt", "size", "wrong_type", "foreign", "stale"}

// String is the reason's name as metrics label it ("corrupt", "size",
// "wrong_type", "foreign", "stale").
func (r RejectReason) String() string {
	if r < NumRejectReasons {
		return rejectReasonNames[r]
	}
	return fmt.Sprintf("RejectReason(%d)", uint8(r))
}

// RecentRejections bounds [RemoteStats.Recent].
const RecentRejections = 8

// MaxRejectionDetail bounds [RemoteRejection.Detail] in bytes: details
// quote what the value holds (its namespace, its tokens), which a hostile
// writer chooses.
const MaxRejectionDetail = 256

// RemoteRejection is one entry of the recent-rejections log: the values
// found under Key refused for Reason, Count times in a row of the log's
// life (since the entry last entered it).
type RemoteRejection struct {
	Key    string
	Reason RejectReason
	Count  int64
	// Detail is the latest rejection's error, cut to MaxRejectionDetail
	// bytes ("value of 50331648 bytes, want 193").
	Detail string
}

// RejectionLog records a store's rejections: counts per reason and the
// most recent (key, reason) pairs with their counts, in fixed memory. Its
// methods are safe for concurrent use; the zero value is ready.
type RejectionLog struct {
	mu       sync.Mutex
	byReason [NumRejectReasons]int64
	recent   [RecentRejections]RemoteRejection // most recent first; Count 0: unused
}

// Record counts one rejection of the value under key. A (key, reason)
// pair already in the log has its count bumped and moves to the front;
// another enters at the front, pushing the oldest entry out.
func (l *RejectionLog) Record(key string, reason RejectReason, detail string) {
	if reason >= NumRejectReasons {
		panic(fmt.Sprintf("tier: RejectionLog.Record: reason %d out of range", reason))
	}
	detail = cutDetail(detail)
	l.mu.Lock()
	defer l.mu.Unlock()
	l.byReason[reason]++
	e := RemoteRejection{Key: key, Reason: reason, Count: 1, Detail: detail}
	i := 0
	for i < len(l.recent)-1 && l.recent[i].Count != 0 && (l.recent[i].Key != key || l.recent[i].Reason != reason) {
		i++
	}
	if l.recent[i].Count != 0 && l.recent[i].Key == key && l.recent[i].Reason == reason {
		e.Count += l.recent[i].Count
	}
	copy(l.recent[1:i+1], l.recent[:i])
	l.recent[0] = e
}

// Fill copies the counts and the recent log into s (Rejected is the sum
// of the counts).
func (l *RejectionLog) Fill(s *RemoteStats) {
	l.mu.Lock()
	defer l.mu.Unlock()
	s.RejectedBy = l.byReason
	s.Recent = l.recent
	s.Rejected = 0
	for _, n := range l.byReason {
		s.Rejected += n
	}
}

// cutDetail bounds a detail to MaxRejectionDetail bytes of valid UTF-8.
func cutDetail(s string) string {
	if len(s) <= MaxRejectionDetail {
		return s
	}
	return strings.ToValidUTF8(s[:MaxRejectionDetail-3], "") + "..."
}
