package disk

import (
	"fmt"
	"sync"

	"github.com/pagedkv/pagedkv/tier"
)

// Fetch reads a run of pages (pages in consecutive slots, pinned by
// lookupRun) in pieces of piecePages pages, one preadv each, and checks
// each piece's pages as soon as it is read. Two goroutines take the pieces
// in turn: Fetch's own and the store's read helper, a goroutine that lives
// as long as the store and sleeps between runs. So while one goroutine
// checksums a piece, the other reads the next one (a read from the page
// cache is a copy, which takes a core as the checksum does), and a run
// costs about half its reads and checks on two free cores. The run's
// pages are served in order up to the first that fails: a piece stops at
// its first failure, and no piece after a failed one is started.

// readPipe is the run being read, shared by Fetch and the read helper;
// mu guards it. Fetch sets it up, both take pieces (next), and Fetch waits
// until no piece is being read (active) before it serves the run.
type readPipe struct {
	mu     sync.Mutex
	idle   sync.Cond // active fell to 0
	pages  []tier.RemotePage
	first  int
	pieces int
	next   int // the next piece to read
	stop   int // no piece from stop on is read: one before it failed
	active int // pieces being read
	res    []pieceResult
	wake   chan struct{} // Fetch wakes the helper (capacity 1)
	done   chan struct{} // closed when the helper has exited
}

// pieceResult is what reading one piece found.
type pieceResult struct {
	n       int        // the piece's leading pages that verified
	err     error      // why page n of the piece failed (n < the piece's length)
	why     DropReason // its classification
	readErr bool       // the preadv failed: no page of the piece was checked
}

// pieceReader is one goroutine's read state: its vector and the token
// buffer its decoded values reuse.
type pieceReader struct {
	rio    vecIO
	tokens []int32
}

// startReadHelper starts the read helper (Open).
func (s *Store) startReadHelper() {
	s.pipe.idle.L = &s.pipe.mu
	s.pipe.wake = make(chan struct{}, 1)
	s.pipe.done = make(chan struct{})
	go func() {
		defer close(s.pipe.done)
		for range s.pipe.wake {
			s.readPieces(&s.readers[1])
		}
	}()
}

// stopReadHelper ends the read helper (Close, with no Fetch running).
func (s *Store) stopReadHelper() {
	close(s.pipe.wake)
	<-s.pipe.done
}

// allocReads sizes Fetch's buffers for runs of n slots.
func (s *Store) allocReads(n int) {
	s.meta = make([]byte, n*(s.valueOff+s.dataOff))
	s.tails = make([]byte, n*s.tailBytes())
	s.runSeqs = make([]uint64, n)
	s.pipe.res = make([]pieceResult, (n+s.piecePages-1)/s.piecePages)
	for i := range s.readers {
		s.readers[i].rio.init(3 * min(n, s.piecePages))
	}
}

// tailBytes is what follows a slot's page bytes: the value's checksum
// and the slot's unused end.
func (s *Store) tailBytes() int {
	return s.slotBytes - s.valueOff - s.valueLen + tier.ValueCRCBytes
}

// readRun reads pages from the slots from first on, the page bytes
// straight into their Data, in pieces shared with the read helper, and
// serves the leading ones that verify; the slots are pinned (lookupRun)
// until it returns.
func (s *Store) readRun(pages []tier.RemotePage, first int) int {
	for k := range pages {
		if len(pages[k].Data) != s.cfg.Format.PageBytes() {
			s.reject(&pages[k], tier.RejectSize, fmt.Errorf("a buffer of %d bytes for a page of %d", len(pages[k].Data), s.cfg.Format.PageBytes()))
			pages = pages[:k] // read and serve those before it
			break
		}
	}
	if len(pages) == 0 {
		s.endRead(nil, first, 0)
		return 0
	}
	p := &s.pipe
	p.mu.Lock()
	p.pages, p.first = pages, first
	p.pieces = (len(pages) + s.piecePages - 1) / s.piecePages
	p.next, p.stop = 0, p.pieces
	p.mu.Unlock()
	if p.pieces > 1 {
		select {
		case p.wake <- struct{}{}:
		default: // a wake is pending
		}
	}
	s.readPieces(&s.readers[0])
	p.mu.Lock()
	for p.active > 0 {
		p.idle.Wait()
	}
	p.pages = nil
	p.mu.Unlock()

	// Every piece before p.stop has been read (and pieces after it may
	// have been): serve in order up to the first failure.
	served, failed := 0, false
	for k := range p.pieces {
		r := &p.res[k]
		if !failed && k < p.stop {
			served += r.n
			failed = r.n < s.pieceLen(k, len(pages))
			switch {
			case failed && r.readErr:
				s.c.Errors.Add(1)
			case failed:
				s.reject(&pages[served], rejectReason(r.why, r.err), r.err)
			}
		}
		*r = pieceResult{}
	}
	s.c.Hits.Add(int64(served))
	s.endRead(pages, first, served)
	return served
}

// pieceLen is the length of piece k of a run of n pages.
func (s *Store) pieceLen(k, n int) int {
	return min(s.piecePages, n-k*s.piecePages)
}

// readPieces reads and checks pieces of the current run until none is
// left (Fetch's goroutine, and the helper when woken).
func (s *Store) readPieces(r *pieceReader) {
	p := &s.pipe
	p.mu.Lock()
	for p.next < p.stop {
		k := p.next
		p.next++
		p.active++
		p.mu.Unlock()
		res := s.readPiece(r, k)
		p.mu.Lock()
		p.res[k] = res
		if res.n < s.pieceLen(k, len(p.pages)) {
			p.stop = min(p.stop, k+1)
		}
		if p.active--; p.active == 0 {
			p.idle.Signal()
		}
	}
	p.mu.Unlock()
}

// readPiece reads piece k of the current run with one preadv (each
// slot's header and value head into meta, its page bytes into the
// caller's Data, its checksum and the slot's unused end into tails) and
// checks its pages in order, stopping at the first that fails.
func (s *Store) readPiece(r *pieceReader, k int) pieceResult {
	p := &s.pipe
	lo := k * s.piecePages
	hi := lo + s.pieceLen(k, len(p.pages))
	metaLen, tailLen := s.valueOff+s.dataOff, s.tailBytes()
	r.rio.reset()
	for i := lo; i < hi; i++ {
		r.rio.add(s.meta[i*metaLen : (i+1)*metaLen])
		r.rio.add(p.pages[i].Data)
		r.rio.add(s.tails[i*tailLen : (i+1)*tailLen])
	}
	f, off := s.slotAt(p.first + lo)
	if err := r.rio.readAt(f, off); err != nil {
		return pieceResult{readErr: true, err: err}
	}
	s.c.BytesIn.Add(int64((hi - lo) * s.valueLen))
	for i := lo; i < hi; i++ {
		pg := &p.pages[i]
		tail := s.tails[i*tailLen : i*tailLen+tier.ValueCRCBytes]
		h, v, why, err := s.checkSlotParts(s.meta[i*metaLen:(i+1)*metaLen], pg.Data, tail, r.tokens)
		if err == nil {
			r.tokens = v.Tokens
			err = v.Verify(s.cfg.Format, s.cfg.Namespace, s.cfg.Group, pg)
		}
		// The slot must still hold the write the index named: a slot
		// overwritten since the lookup is refused, not served.
		if err == nil && h.Seq != s.runSeqs[i] {
			err = fmt.Errorf("%w: slot sequence %d, the index says %d", tier.ErrStaleValue, h.Seq, s.runSeqs[i])
		}
		if err != nil {
			return pieceResult{n: i - lo, err: err, why: why}
		}
	}
	return pieceResult{n: hi - lo}
}

// endRead tells the policy the n slots from first on were served (those
// that still hold the writes the lookup found), gives pages[k] what is
// left of its slot's retention (a use then restarts the count), and lets
// the writer overwrite the run's slots.
func (s *Store) endRead(pages []tier.RemotePage, first, n int) {
	s.mu.Lock()
	now := s.advance()
	for k := range n {
		if e := &s.slots[first+k]; e.state == slotReady && e.seq == s.runSeqs[k] {
			s.policy.Used(first + k)
			pages[k].Retention = e.ret.At(now)
			s.timeRetention(first+k, now, true)
		}
	}
	s.readLo, s.readHi = 0, 0
	s.readDone.Broadcast()
	s.mu.Unlock()
}
