package pagedkv

import (
	"bufio"
	"context"
	"io"
	"net"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/pagedkv/pagedkv/handoff"
)

// exportRequest builds the handoff of request id of Manager m (its full
// pages' tokens, the plan of its device pages, their bytes from engine e).
func exportRequest(t *testing.T, m *Manager, e *tierEngine, id RequestID, ns Namespace) *handoff.Request {
	pages, start := m.Pages(id)
	require.Zero(t, start)
	full := m.Computed(id) / m.PageSize()
	r := &handoff.Request{Tenant: ns.Tenant, LoRA: ns.LoRA, Salt: ns.Salt, Tokens: m.Tokens(id)[:full*m.PageSize()]}
	ids := make([]int32, full)
	for i, p := range pages[:full] {
		ids[i] = int32(p)
		r.Pages = append(r.Pages, append([]byte(nil), e.page(p)...))
	}
	r.Runs = handoff.Plan(nil, ids)
	return r
}

// A prefill Manager hands a request's pages to a decode Manager (each its
// own pool) over loopback TCP: the decode side is served them and holds
// the K/V the prefill side computed. A transfer refused (a full store) or
// cut half way leaves both sides as they were: the prefill side still has
// the request and its pages, the decode side admits and serves nothing.
func TestHandoffBetweenManagers(t *testing.T) {
	key := handoff.NewNonce() // 32 random bytes: the deployment's key for this test
	hcfg := handoff.Config{Namespace: "test-model", Format: tierFormat(4), Key: key[:]}
	st, err := handoff.NewStore(hcfg, 5)
	require.NoError(t, err)
	srv, err := handoff.Listen(st, handoff.ServerConfig{})
	require.NoError(t, err)
	defer srv.Close()
	addr := srv.Addr().String()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()

	p, ep := newTierManager(t, 16, 8, TierConfig{})
	ns := Namespace{Tenant: "acme"}
	long, short := seqTokens(300, 25), seqTokens(500, 13) // 6 and 3 full pages
	for id, prompt := range [][]int32{1: long, 2: short} {
		if prompt == nil {
			continue
		}
		_, err := ep.add(RequestID(id), Request{Namespace: ns, Prompt: prompt})
		require.NoError(t, err)
		ep.prefill(32, RequestID(id))
	}
	// The long request does not fit the store (6 pages of 5): refused,
	// nothing admitted, the prefill side keeps it.
	err = handoff.Send(ctx, addr, hcfg, exportRequest(t, p, ep, 1, ns))
	require.ErrorIs(t, err, handoff.ErrRefused)
	require.Zero(t, st.Held())
	require.True(t, p.Has(1))
	// Cut half way: nothing admitted.
	r2 := exportRequest(t, p, ep, 2, ns)
	require.Equal(t, []handoff.Run{{Page: pageIDs(p, 2)[0], Pages: 3}}, r2.Runs, "three consecutive pages: one descriptor")
	c, err := net.Dial("tcp", addr)
	require.NoError(t, err)
	br := bufio.NewReader(c)
	var w limitWriter
	w.n = int(hcfg.StreamBytes(r2) / 2)
	// The conversation by hand: the prelude, then the receiver's hello
	// (8 bytes, then the connection's nonce), then half the stream.
	_, err = c.Write([]byte{'P', 'K', 'V', 'H', handoff.StreamVersion, 0, 0, 0})
	require.NoError(t, err)
	var hello [8]byte
	var nonce handoff.Nonce
	_, err = io.ReadFull(br, hello[:])
	require.NoError(t, err)
	_, err = io.ReadFull(br, nonce[:])
	require.NoError(t, err)
	require.NoError(t, handoff.WriteRequest(&w, hcfg, nonce, r2))
	_, err = c.Write(w.b[8:]) // the prelude went first
	require.NoError(t, err)
	require.NoError(t, c.(*net.TCPConn).CloseWrite())
	replies, err := io.ReadAll(br)
	require.NoError(t, err)
	c.Close()
	require.EqualValues(t, 2, replies[0], "the header verified: continue")
	require.EqualValues(t, 1, replies[3+handoff.TagBytes], "then refused")
	require.Zero(t, st.Held())

	d, ed := newTierManager(t, 16, 8, TierConfig{Remote: st, RemoteDeadline: 5 * time.Second})
	n, err := ed.add(2, Request{Namespace: ns, Prompt: short})
	require.NoError(t, err)
	require.Zero(t, n, "nothing was admitted")
	ed.prefill(32, 2)
	ed.check("decode side, computed itself")
	require.NoError(t, d.Release(2))

	// Sent whole: admitted, the prefill side releases, the decode side is
	// served all three pages and holds the prefill side's K/V.
	require.NoError(t, handoff.Send(ctx, addr, hcfg, r2))
	require.Equal(t, 3, st.Held())
	require.NoError(t, p.Release(2))
	d2, ed2 := newTierManager(t, 16, 8, TierConfig{Remote: st, RemoteDeadline: 5 * time.Second})
	n, err = ed2.add(7, Request{Namespace: ns, Prompt: short})
	require.NoError(t, err)
	require.Equal(t, 12, n, "three full pages from the handoff")
	ed2.complete(nil)
	ed2.check("decode side after the onload")
	ed2.prefill(32, 7)
	ed2.check("decode side after its prefill")
	require.NoError(t, p.Audit())
	require.NoError(t, d2.Audit())
	require.NoError(t, st.CheckInvariants())
	require.EqualValues(t, 1, srv.Stats().Admitted)
}

// pageIDs is request id's pages as int32.
func pageIDs(m *Manager, id RequestID) []int32 {
	pages, _ := m.Pages(id)
	out := make([]int32, len(pages))
	for i, p := range pages {
		out[i] = int32(p)
	}
	return out
}

// limitWriter keeps the first n bytes written to it.
type limitWriter struct {
	b []byte
	n int
}

func (w *limitWriter) Write(p []byte) (int, error) {
	w.b = append(w.b, p[:min(len(p), w.n-len(w.b))]...)
	return len(p), nil
}
