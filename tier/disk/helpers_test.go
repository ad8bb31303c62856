package disk

import (
	"context"
	"encoding/binary"
	"math/rand/v2"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/pagedkv/pagedkv/layout"
	"github.com/pagedkv/pagedkv/tier"
)

// testFormat is a small page: 4 tokens, 2 layers, 256 bytes of K/V.
var testFormat = tier.PageFormat{Layout: layout.NHD, DType: layout.F16, PageSize: 4, NumKVHeads: 1, HeadDim: 8, Layers: 2}

const testNamespace = "model-a"

func testConfig(dir string, pages int) Config {
	return Config{Dir: dir, Namespace: testNamespace, Format: testFormat, Pages: pages, SegmentPages: 8, QueueLen: 16}
}

// pageUniverse is a fixed set of prefix chains: chain c's page k holds
// tokens derived from (c, k); its K/V bytes are derived from its digest,
// so a page served with the wrong bytes is caught without any record of
// what was written.
type pageUniverse struct {
	f      tier.PageFormat
	chains [][]tier.RemotePage
}

func newUniverse(f tier.PageFormat, chains, depth int) *pageUniverse {
	u := &pageUniverse{f: f}
	root := tier.NamespaceRoot("", "", "")
	for c := range chains {
		parent := root
		var chain []tier.RemotePage
		for k := range depth {
			toks := make([]int32, f.PageSize)
			for i := range toks {
				// Chains share their first pages in pairs (common prefixes).
				toks[i] = int32(1000*(c/2*2+min(k, 1)*(c%2)) + 10*k + i)
			}
			d := tier.Next(nil, parent, toks)
			p := tier.RemotePage{Digest: d, Parent: parent, Chain: chain0(chain, d), Tokens: toks}
			p.Data = contentOf(f, d)
			chain = append(chain, p)
			parent = d
		}
		u.chains = append(u.chains, chain)
	}
	return u
}

func chain0(chain []tier.RemotePage, d tier.Digest) tier.Digest {
	if len(chain) > 0 {
		return chain[0].Digest
	}
	return d
}

// contentOf is page d's K/V: bytes from a generator seeded by the digest.
func contentOf(f tier.PageFormat, d tier.Digest) []byte {
	b := make([]byte, f.PageBytes())
	r := rand.New(rand.NewPCG(binary.LittleEndian.Uint64(d[:8]), binary.LittleEndian.Uint64(d[8:16])))
	for i := 0; i < len(b); i += 8 {
		binary.LittleEndian.PutUint64(b[i:], r.Uint64())
	}
	return b
}

// request returns a lookup for pages of a chain: digests, parents and
// tokens as a Manager would compute them, with empty Data to be filled.
func request(chain []tier.RemotePage) []tier.RemotePage {
	req := make([]tier.RemotePage, len(chain))
	for i, p := range chain {
		req[i] = tier.RemotePage{Digest: p.Digest, Parent: p.Parent, Chain: p.Chain, Tokens: p.Tokens, Data: make([]byte, len(p.Data))}
	}
	return req
}

// fetchChecked fetches req and requires every served page to hold its
// digest's content; it returns how many were served.
func fetchChecked(t testing.TB, s *Store, req []tier.RemotePage) int {
	t.Helper()
	n := s.Fetch(context.Background(), req)
	for i := range n {
		require.Equal(t, contentOf(s.cfg.Format, req[i].Digest), req[i].Data, "page %d (%s) served with the wrong K/V", i, req[i].Digest.String()[:16])
	}
	return n
}

func flush(t testing.TB, s *Store) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	require.NoError(t, s.Flush(ctx, false))
}

// storeAll stores each page of chain, requiring each accepted, and
// flushes.
func storeAll(t testing.TB, s *Store, chain []tier.RemotePage) {
	t.Helper()
	for _, p := range chain {
		require.True(t, s.Store(&p))
	}
	flush(t, s)
}

func openStore(t testing.TB, cfg Config) *Store {
	t.Helper()
	s, err := Open(cfg)
	require.NoError(t, err)
	require.NoError(t, s.CheckInvariants())
	return s
}
