package zmtp

import (
	"math/rand/v2"
	"testing"
	"time"
)

// TestSendQueueMatchesModel: random pushes and pops against a slice: the
// same order, the same refusals at max, and `more` exactly when messages
// remain.
func TestSendQueueMatchesModel(t *testing.T) {
	rng := rand.New(rand.NewPCG(28, 4))
	for run := range 200 {
		maxLen := 1 + rng.IntN(3000)
		q := newSendQueue(maxLen)
		var model [][][]byte
		next := 0
		for op := range 5000 {
			if rng.IntN(100) < 55 {
				m := [][]byte{{byte(next), byte(next >> 8)}}
				next++
				ok := q.push(m)
				if want := len(model) < maxLen; ok != want {
					t.Fatalf("run %d op %d: push with %d of %d queued = %v", run, op, len(model), maxLen, ok)
				}
				if ok {
					model = append(model, m)
				}
				continue
			}
			m, more, ok := q.pop()
			if ok != (len(model) > 0) {
				t.Fatalf("run %d op %d: pop ok %v with %d queued", run, op, ok, len(model))
			}
			if !ok {
				continue
			}
			if m[0][0] != model[0][0][0] || m[0][1] != model[0][0][1] {
				t.Fatalf("run %d op %d: popped %v, want %v", run, op, m, model[0])
			}
			model = model[1:]
			if more != (len(model) > 0) {
				t.Fatalf("run %d op %d: more %v with %d left", run, op, more, len(model))
			}
		}
	}
}

// TestInboxBounds: the inbox holds at most its count and bytes, lets one
// message larger than its byte budget in alone, and hands them out in
// order.
func TestInboxBounds(t *testing.T) {
	q := newInbox(4, 100)
	put := func(size int64) chan bool {
		done := make(chan bool, 1)
		go func() { done <- q.put(Message{Peer: string(rune('a' + size%26))}, size) }()
		return done
	}
	blocked := func(c chan bool) bool {
		select {
		case <-c:
			return false
		case <-time.After(50 * time.Millisecond):
			return true
		}
	}
	if blocked(put(500)) {
		t.Fatal("a 500-byte message into an empty 100-byte inbox waited")
	}
	second := put(10)
	if !blocked(second) {
		t.Fatal("a message went in beside one over the byte budget")
	}
	if m, ok := q.get(); !ok || m.Peer != string(rune('a'+500%26)) {
		t.Fatalf("got %+v %v", m, ok)
	}
	if blocked(second) {
		t.Fatal("the second message did not go in once the first was taken")
	}
	for range 3 {
		if blocked(put(20)) {
			t.Fatal("small messages under both bounds waited")
		}
	}
	fifth := put(1)
	if !blocked(fifth) {
		t.Fatal("a fifth message went into a 4-message inbox")
	}
	q.close()
	if <-fifth {
		t.Fatal("put succeeded on a closed inbox")
	}
	if _, ok := q.get(); ok {
		t.Fatal("get succeeded on a closed inbox")
	}
}
