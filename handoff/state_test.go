package handoff

import (
	"bytes"
	"context"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/pagedkv/pagedkv/tier"
)

// groupRequest is a request of 2 pages of a hybrid model's layer group.
func groupRequest(seed uint64) *Request {
	r := testRequest(seed, 2, []int32{7, 8})
	r.GroupTag = "g0:full:w0:c0:l1"
	return r
}

// stateRequest is a state group's checkpoint page after npages whole
// pages of tokens.
func stateRequest(seed uint64, npages int) *Request {
	r := testRequest(seed, npages, seq(npages))
	r.Pages, r.Runs = r.Pages[:1], []Run{{Page: 9, Pages: 1}}
	r.GroupTag, r.State = "g0:state:l1:conv[8 3]/bf16:ssm[2 4 8]/f32:p4096", true
	return r
}

// TestGroupAndStateRequests: a request with a group tag chains its pages
// from the group's root (tier.GroupRoot), and a state checkpoint's page is
// named by the state digest of its prefix (tier.StateParent), computed by
// the receiver from the namespace, tag and tokens; the store serves each
// only as what it is (a state page never as a K/V page); a state request
// of two pages, or without a tag, is refused.
func TestGroupAndStateRequests(t *testing.T) {
	cfg := testConfig()
	ns := tier.NamespaceRoot("acme", "sql", "")
	g := groupRequest(1)
	got, err := ReadRequest(bytes.NewReader(encode(t, cfg, testNonce, g)), cfg, testNonce)
	require.NoError(t, err)
	require.Equal(t, g.GroupTag, got.GroupTag)
	require.False(t, got.State)
	parent := tier.GroupRoot(ns, g.GroupTag)
	for i, p := range got.Pages {
		require.Equal(t, parent, p.Parent)
		require.Equal(t, tier.Next(nil, parent, g.Tokens[4*i:4*i+4]), p.Digest)
		parent = p.Digest
	}

	s := stateRequest(2, 3)
	got2, err := ReadRequest(bytes.NewReader(encode(t, cfg, testNonce, s)), cfg, testNonce)
	require.NoError(t, err)
	require.True(t, got2.State)
	require.Len(t, got2.Pages, 1)
	e := ns
	for i := range 2 {
		e = tier.Next(nil, e, s.Tokens[4*i:4*i+4])
	}
	p := got2.Pages[0]
	require.Equal(t, tier.StateParent(e, s.GroupTag), p.Parent)
	require.Equal(t, s.Tokens[8:12], p.Tokens)
	require.Equal(t, tier.Next(nil, p.Parent, p.Tokens), p.Digest)
	require.True(t, p.State)
	require.Equal(t, s.Pages[0], p.Data)

	st, err := NewStore(cfg, 8)
	require.NoError(t, err)
	_, err = st.Admit(got2)
	require.NoError(t, err)
	want := []tier.RemotePage{{Digest: p.Digest, Parent: p.Parent, Tokens: p.Tokens, State: true, Data: make([]byte, len(p.Data))}}
	require.Equal(t, 1, st.Fetch(context.Background(), want))
	require.Equal(t, s.Pages[0], want[0].Data)
	want[0].State = false
	require.Zero(t, st.Fetch(context.Background(), want), "a state page served as a K/V page")

	for name, bad := range map[string]*Request{
		"two pages": func() *Request {
			r := stateRequest(3, 2)
			r.Pages = append(r.Pages, r.Pages[0])
			r.Runs = Plan(nil, seq(2))
			return r
		}(),
		"no tag": func() *Request { r := stateRequest(3, 2); r.GroupTag = ""; return r }(),
	} {
		require.Error(t, WriteRequest(&bytes.Buffer{}, cfg, testNonce, bad), name)
	}
	// A head turned into a state head in transit fails its tag.
	b := encode(t, cfg, testNonce, groupRequest(4))
	b[preludeBytes+6+1] |= stateBit >> 8
	_, err = ReadRequest(bytes.NewReader(b), cfg, testNonce)
	require.ErrorIs(t, err, ErrBadStream)
}
