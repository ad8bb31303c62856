package zmtp

import "sync"

// messageBytes is what a message counts against the limits.
func messageBytes(frames [][]byte) int64 {
	n := int64(len(frames)) * frameOverhead
	for _, f := range frames {
		n += int64(len(f))
	}
	return n
}

// inbox is the bounded queue between the peers' readers and Recv.
type inbox struct {
	mu       sync.Mutex
	cond     sync.Cond
	ring     []Message
	sizes    []int64
	head     int
	n        int
	bytes    int64
	maxBytes int64
	closed   bool
}

func newInbox(capacity int, maxBytes int64) *inbox {
	q := &inbox{ring: make([]Message, capacity), sizes: make([]int64, capacity), maxBytes: maxBytes}
	q.cond.L = &q.mu
	return q
}

// put waits for room and appends m of the given size; false once closed.
func (q *inbox) put(m Message, size int64) bool {
	q.mu.Lock()
	defer q.mu.Unlock()
	for (q.n == len(q.ring) || q.n > 0 && q.bytes+size > q.maxBytes) && !q.closed {
		q.cond.Wait()
	}
	if q.closed {
		return false
	}
	i := (q.head + q.n) % len(q.ring)
	q.ring[i], q.sizes[i] = m, size
	q.n++
	q.bytes += size
	q.cond.Broadcast()
	return true
}

// get waits for a message; false once closed.
func (q *inbox) get() (Message, bool) {
	q.mu.Lock()
	defer q.mu.Unlock()
	for q.n == 0 && !q.closed {
		q.cond.Wait()
	}
	if q.closed {
		return Message{}, false
	}
	m := q.ring[q.head]
	q.ring[q.head] = Message{}
	q.bytes -= q.sizes[q.head]
	q.head = (q.head + 1) % len(q.ring)
	q.n--
	q.cond.Broadcast()
	return m, true
}

func (q *inbox) close() {
	q.mu.Lock()
	q.closed = true
	q.cond.Broadcast()
	q.mu.Unlock()
}

// sendQueue is a peer's queue of messages to send, at most max. It holds
// memory for what is queued only: a channel would allocate max slots up
// front for every connection, which a peer could multiply by connecting
// many times.
type sendQueue struct {
	mu    sync.Mutex
	msgs  [][][]byte // msgs[head:] are queued, oldest first
	head  int
	max   int
	ready chan struct{} // one slot: a message was pushed
	room  chan struct{} // one slot: a message was popped
}

func newSendQueue(max int) *sendQueue {
	return &sendQueue{max: max, ready: make(chan struct{}, 1), room: make(chan struct{}, 1)}
}

// signal wakes the waiter on c, if any, or the next one.
func signal(c chan struct{}) {
	select {
	case c <- struct{}{}:
	default:
	}
}

// push queues m unless max messages are queued.
func (q *sendQueue) push(m [][]byte) bool {
	q.mu.Lock()
	if len(q.msgs)-q.head >= q.max {
		q.mu.Unlock()
		return false
	}
	q.msgs = append(q.msgs, m)
	q.mu.Unlock()
	signal(q.ready)
	return true
}

// pop takes the oldest message (ok false when there is none) and says
// whether more are queued.
func (q *sendQueue) pop() (m [][]byte, more, ok bool) {
	q.mu.Lock()
	if q.head == len(q.msgs) {
		q.mu.Unlock()
		return nil, false, false
	}
	m = q.msgs[q.head]
	q.msgs[q.head] = nil
	q.head++
	switch {
	case q.head == len(q.msgs) && cap(q.msgs) > 1024:
		q.msgs, q.head = nil, 0 // a burst is over: give its memory back
	case q.head == len(q.msgs):
		q.msgs, q.head = q.msgs[:0], 0
	case q.head >= 1024 && 2*q.head >= len(q.msgs):
		n := copy(q.msgs, q.msgs[q.head:])
		clear(q.msgs[n:])
		q.msgs, q.head = q.msgs[:n], 0
	}
	more = q.head < len(q.msgs)
	q.mu.Unlock()
	signal(q.room)
	return m, more, true
}
