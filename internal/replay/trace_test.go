package replay

import (
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/pagedkv/pagedkv/internal/sim"
)

func TestReadMooncakeRejectsBadLinesByName(t *testing.T) {
	ok := `{"timestamp": 5, "input_length": 1000, "output_length": 3, "hash_ids": [0, 1]}`
	for _, c := range []struct{ text, want string }{
		{`{"timestamp": 0, "input_length": 1000, "output_length": 3}`, "line 1: want timestamp"},
		{`{"timestamp": 0, "input_length": 1000, "output_length": 3, "hash_ids": [0]}`, "1 hash_ids for input_length 1000, want ceil(1000/512) = 2"},
		{`{"timestamp": 0, "input_length": 0, "output_length": 3, "hash_ids": []}`, "input_length 0"},
		{`{"timestamp": 0, "input_length": 10, "output_length": -1, "hash_ids": [1]}`, "output_length -1"},
		{`{"timestamp": 0, "input_length": 10, "output_length": 1, "hash_ids": [-4]}`, "hash_ids[0] = -4"},
		{`{"timestamp": 0, "input_length": 10, "output_length": 1, "hash_ids": [2147483648]}`, "hash_ids[0] = 2147483648"},
		{`{"timestamp": 0, "input_length": 10, "output_length": 1, "hash_ids": [1.5]}`, "line 1"},
		{ok + "\n" + `{"timestamp": 4, "input_length": 10, "output_length": 1, "hash_ids": [0]}`, "line 2: timestamp 4 before the previous line's 5"},
		{`not json`, "line 1"},
	} {
		_, err := ReadMooncake(strings.NewReader(c.text), DefaultLimits())
		require.ErrorIs(t, err, ErrBadTrace, c.text)
		require.ErrorContains(t, err, c.want, c.text)
	}
	lim := DefaultLimits()
	lim.MaxRequests = 1
	_, err := ReadMooncake(strings.NewReader(ok+"\n"+ok), lim)
	require.ErrorContains(t, err, "line 2: more than 1 requests")
	lim = DefaultLimits()
	lim.MaxBlocks = 3
	_, err = ReadMooncake(strings.NewReader(ok+"\n"+ok), lim)
	require.ErrorContains(t, err, "line 2: more than 3 block references")

	tr, err := ReadMooncake(strings.NewReader(ok+"\n\n"+ok), DefaultLimits())
	require.NoError(t, err)
	require.Equal(t, 2, len(tr.Requests))
	require.Equal(t, Request{ArrivalMs: 5, InputTokens: 1000, OutputTokens: 3, Blocks: []int32{0, 1}}, tr.Requests[1])
	require.Equal(t, 2, tr.DistinctBlocks)
	require.Equal(t, 4, tr.References)
}

// Limits.First reads the first requests only: the trace equals the whole
// trace's Prefix, and what follows them is not read (so a bad line there
// is no error).
func TestReadMooncakeFirstStopsReading(t *testing.T) {
	lines := []string{
		`{"timestamp": 1, "input_length": 1000, "output_length": 3, "hash_ids": [0, 1]}`,
		`{"timestamp": 2, "input_length": 600, "output_length": 0, "hash_ids": [0, 2]}`,
		`{"timestamp": 3, "input_length": 10, "output_length": 1, "hash_ids": [3]}`,
	}
	whole, err := ReadMooncake(strings.NewReader(strings.Join(lines, "\n")), DefaultLimits())
	require.NoError(t, err)
	for first := 1; first <= 3; first++ {
		lim := DefaultLimits()
		lim.First = first
		got, err := ReadMooncake(strings.NewReader(strings.Join(lines[:first], "\n")+"\nnot json"), lim)
		require.NoError(t, err, "first %d", first)
		require.Equal(t, whole.Prefix(first), got, "first %d", first)
	}
	lim := DefaultLimits()
	lim.First = 2
	_, err = ReadMooncake(strings.NewReader(lines[0]+"\nnot json\n"+lines[1]), lim)
	require.ErrorContains(t, err, "line 2", "a bad line among the first requests is still refused")
}

// FuzzReadMooncake feeds raw bytes to the reader under small limits: it
// either refuses them with ErrBadTrace or returns a trace whose requests
// keep the format's rules, and a replay of it keeps the limits' order.
func FuzzReadMooncake(f *testing.F) {
	f.Add([]byte(`{"timestamp": 0, "input_length": 1000, "output_length": 3, "hash_ids": [0, 1]}
{"timestamp": 7, "input_length": 600, "output_length": 0, "hash_ids": [0, 2]}`))
	f.Add([]byte(`{"timestamp": 0, "input_length": 1, "output_length": 1, "hash_ids": [2147483647]}`))
	f.Fuzz(func(t *testing.T, data []byte) {
		lim := Limits{MaxRequests: 64, MaxBlocks: 256, MaxRequestBlocks: 32, MaxOutputTokens: 64}
		tr, err := ReadMooncake(strings.NewReader(string(data)), lim)
		if err != nil {
			require.ErrorIs(t, err, ErrBadTrace)
			return
		}
		refs := 0
		for _, q := range tr.Requests {
			require.Equal(t, (q.InputTokens+511)/512, len(q.Blocks))
			refs += len(q.Blocks)
		}
		require.Equal(t, refs, tr.References)
		require.LessOrEqual(t, refs, lim.MaxBlocks)
		if len(tr.Requests) == 0 {
			return
		}
		small := &Trace{BlockTokens: 4, Requests: tr.Requests, References: tr.References, DistinctBlocks: tr.DistinctBlocks}
		res, err := Run(small, Config{CapacityPages: 40})
		require.NoError(t, err)
		unl, blocks := Unlimited(&res.Stream)
		require.Equal(t, blocks, res.Blocks)
		require.LessOrEqual(t, res.HitBlocks, Belady(&res.Stream, 40))
		require.LessOrEqual(t, Belady(&res.Stream, 40), unl)
	})
}

func TestFromSimKeepsSharedPrefixes(t *testing.T) {
	reqs, err := sim.ParseTrace(strings.NewReader(`{"arrival": 0, "prompt": [1,2,3,4,5,6], "output": 2}
{"arrival": 1, "prompt": [1,2,3,4,9], "output": 1, "samples": 2}
{"arrival": 1, "prompt": [1,2,3,4,5,6], "output": 1, "namespace": "b"}`))
	require.NoError(t, err)
	tr, err := FromSim(reqs, 4)
	require.NoError(t, err)
	require.Equal(t, [][]int32{{0, 1}, {0, 2}, {3, 4}}, [][]int32{tr.Requests[0].Blocks, tr.Requests[1].Blocks, tr.Requests[2].Blocks})
	require.Equal(t, 2, tr.Requests[1].OutputTokens, "samples multiply the output")
	require.Equal(t, 5, tr.DistinctBlocks)
	_, err = FromSim(reqs, 0)
	require.ErrorContains(t, err, "block of 0 tokens")
}
