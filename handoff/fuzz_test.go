package handoff

import (
	"bytes"
	"testing"
)

// FuzzReadRequest feeds raw bytes to the stream reader with small limits:
// it never panics or allocates past the limits, and whatever it accepts is
// exactly the stream the writer produces for what it returned.
func FuzzReadRequest(f *testing.F) {
	cfg := testConfig()
	cfg.Limits = Limits{MaxPages: 8, MaxBytes: 8 << 10}
	var good bytes.Buffer
	if err := WriteRequest(&good, cfg, testRequest(1, 2, []int32{3, 4})); err != nil {
		f.Fatal(err)
	}
	f.Add(good.Bytes())
	f.Add(good.Bytes()[:40])
	f.Add([]byte("PKVH\x01\x00\x00\x00"))
	f.Fuzz(func(t *testing.T, b []byte) {
		r, err := ReadRequest(bytes.NewReader(b), cfg)
		if err != nil {
			return
		}
		req := &Request{Tenant: r.Tenant, LoRA: r.LoRA, Salt: r.Salt, Tokens: r.Tokens, Runs: r.Runs}
		for _, p := range r.Pages {
			req.Pages = append(req.Pages, p.Data)
		}
		var again bytes.Buffer
		if err := WriteRequest(&again, cfg, req); err != nil {
			t.Fatalf("accepted request does not write: %v", err)
		}
		// The reader takes one request and leaves what follows it.
		if again.Len() > len(b) || !bytes.Equal(again.Bytes(), b[:again.Len()]) {
			t.Fatalf("accepted stream is not the writer's")
		}
	})
}
