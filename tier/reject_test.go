package tier

import (
	"fmt"
	"math/rand/v2"
	"strings"
	"sync"
	"testing"
	"unicode/utf8"

	"github.com/stretchr/testify/require"
)

type rejection struct {
	key    string
	reason RejectReason
	detail string
}

// recentModel computes the recent-rejections log from the whole history,
// the slow way: the pairs in the log after event t are the
// RecentRejections distinct (key, reason) pairs seen last, most recent
// first; a pair's count is its events since it last entered the log,
// found by walking back while the pair stayed in the log.
func recentModel(history []rejection) [RecentRejections]RemoteRejection {
	type pair struct {
		key    string
		reason RejectReason
	}
	inLog := func(t int) map[pair]bool { // the log's pairs after event t
		set := map[pair]bool{}
		for i := t; i >= 0 && len(set) < RecentRejections; i-- {
			set[pair{history[i].key, history[i].reason}] = true
		}
		return set
	}
	var out [RecentRejections]RemoteRejection
	seen := map[pair]bool{}
	n := 0
	for i := len(history) - 1; i >= 0 && n < RecentRejections; i-- {
		p := pair{history[i].key, history[i].reason}
		if seen[p] {
			continue
		}
		seen[p] = true
		count := int64(0)
		for t := i; t >= 0 && inLog(t)[p]; t-- {
			if (pair{history[t].key, history[t].reason}) == p {
				count++
			}
		}
		out[n] = RemoteRejection{Key: p.key, Reason: p.reason, Count: count, Detail: cutDetail(history[i].detail)}
		n++
	}
	return out
}

// The log matches the model after every rejection: counts per reason,
// and the recent pairs in order with their counts and latest details.
func TestRejectionLogMatchesModel(t *testing.T) {
	for seed := range uint64(20) {
		rng := rand.New(rand.NewPCG(seed, 28))
		keys := 2 + rng.IntN(14) // fewer and more keys than the log holds
		var log RejectionLog
		var history []rejection
		var byReason [NumRejectReasons]int64
		for step := range 400 {
			r := rejection{key: fmt.Sprintf("pkv:%d", rng.IntN(keys)), reason: RejectReason(rng.IntN(int(NumRejectReasons))),
				detail: fmt.Sprintf("step %d", step)}
			if rng.IntN(20) == 0 {
				r.detail = strings.Repeat("é", MaxRejectionDetail) // cut to a valid prefix
			}
			log.Record(r.key, r.reason, r.detail)
			history = append(history, r)
			byReason[r.reason]++
			var s RemoteStats
			log.Fill(&s)
			require.Equal(t, byReason, s.RejectedBy, "seed %d step %d", seed, step)
			require.EqualValues(t, step+1, s.Rejected, "seed %d step %d", seed, step)
			require.Equal(t, recentModel(history), s.Recent, "seed %d step %d", seed, step)
		}
	}
}

func TestRejectionDetailBounded(t *testing.T) {
	var log RejectionLog
	log.Record("k", RejectStale, strings.Repeat("ü", 10000))
	var s RemoteStats
	log.Fill(&s)
	require.LessOrEqual(t, len(s.Recent[0].Detail), MaxRejectionDetail)
	require.True(t, utf8.ValidString(s.Recent[0].Detail))
	require.Equal(t, []string{"corrupt", "size", "wrong_type", "foreign", "stale"},
		[]string{RejectCorrupt.String(), RejectSize.String(), RejectWrongType.String(), RejectForeign.String(), RejectStale.String()})
	require.Panics(t, func() { log.Record("k", NumRejectReasons, "") }, "a reason out of range is a programming error")
}

// Record and Fill from many goroutines (run with -race): every rejection
// is counted.
func TestRejectionLogConcurrent(t *testing.T) {
	var log RejectionLog
	var wg sync.WaitGroup
	for g := range 4 {
		wg.Go(func() {
			for i := range 500 {
				log.Record(fmt.Sprintf("k%d", i%3), RejectReason(g%int(NumRejectReasons)), "")
				var s RemoteStats
				log.Fill(&s)
			}
		})
	}
	wg.Wait()
	var s RemoteStats
	log.Fill(&s)
	require.EqualValues(t, 2000, s.Rejected)
}
