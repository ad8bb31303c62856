package fuzz

import (
	"math/rand/v2"
	"testing"

	"github.com/stretchr/testify/require"
)

func TestDecodeExamples(t *testing.T) {
	tests := map[string]struct {
		data  []byte
		known int
		want  []Cmd
	}{
		"empty":           {data: nil, known: 4, want: nil},
		"partial only":    {data: []byte{1, 2, 3}, known: 4, want: nil},
		"one":             {data: []byte{1, 2, 3, 4}, known: 4, want: []Cmd{{1, 2, 3, 4}}},
		"trailing bytes":  {data: []byte{1, 2, 3, 4, 0, 9}, known: 4, want: []Cmd{{1, 2, 3, 4}}},
		"op modulo space": {data: []byte{OpSpace + 2, 7, 8, 9}, known: 4, want: []Cmd{{2, 7, 8, 9}}},
		"unknown skipped": {
			data:  []byte{0, 1, 1, 1, 5, 2, 2, 2, 3, 3, 3, 3, OpSpace - 1, 4, 4, 4},
			known: 4,
			want:  []Cmd{{0, 1, 1, 1}, {3, 3, 3, 3}},
		},
		"nothing known": {data: []byte{0, 0, 0, 0}, known: 0, want: nil},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			require.Equal(t, tc.want, Decode(nil, tc.data, tc.known))
		})
	}
}

// Decode(Encode(p)) == p for programs of known ops, and Encode(Decode(b))
// is a fixed point of Decode∘Encode (the canonical form of b).
func TestCodecRoundTrip(t *testing.T) {
	rng := rand.New(rand.NewPCG(9, 9))
	for range 2000 {
		known := 1 + rng.IntN(OpSpace)
		p := make([]Cmd, rng.IntN(20))
		for i := range p {
			p[i] = Cmd{Op: uint8(rng.IntN(known)), A: uint8(rng.Uint32()), B: uint8(rng.Uint32()), C: uint8(rng.Uint32())}
		}
		enc := Encode(nil, p)
		require.Len(t, enc, CmdSize*len(p))
		got := Decode(nil, enc, known)
		if len(p) == 0 {
			require.Empty(t, got)
		} else {
			require.Equal(t, p, got)
		}

		raw := make([]byte, rng.IntN(90))
		for i := range raw {
			raw[i] = uint8(rng.Uint32())
		}
		canon := Encode(nil, Decode(nil, raw, known))
		require.Equal(t, canon, Encode(nil, Decode(nil, canon, known)), "raw %x", raw)
		require.LessOrEqual(t, len(canon), len(raw))
	}
}

func TestDecodeAppendsToDst(t *testing.T) {
	dst := []Cmd{{9, 9, 9, 9}}
	got := Decode(dst, []byte{1, 0, 0, 0}, 2)
	require.Equal(t, []Cmd{{9, 9, 9, 9}, {1, 0, 0, 0}}, got)
}

func TestEncodePanicsOnBadOp(t *testing.T) {
	require.PanicsWithValue(t, "fuzz: Encode: cmds[1] has op code 16, want < 16", func() {
		Encode(nil, []Cmd{{}, {Op: OpSpace}})
	})
}

func TestOpSetProgAndFormat(t *testing.T) {
	ops := OpSet{"add", "append"}
	prog := ops.Prog("add", 0, 0, 0, "append", 1, 2, 3)
	require.Equal(t, []byte{0, 0, 0, 0, 1, 1, 2, 3}, prog)
	require.Equal(t, "0: add a=0 b=0 c=0\n1: append a=1 b=2 c=3\n2: op5 a=0 b=0 c=0\n",
		ops.Format(append(Decode(nil, prog, len(ops)), Cmd{Op: 5})))
	require.Panics(t, func() { ops.Prog("nope", 0, 0, 0) })
	require.Panics(t, func() { ops.Prog("add", 256, 0, 0) })
	require.Panics(t, func() { ops.Prog("add", 0, 0) })
}

func TestChooserIsDeterministic(t *testing.T) {
	a, b := newChooser(Cmd{1, 2, 3, 4}, 5), newChooser(Cmd{1, 2, 3, 4}, 5)
	c := newChooser(Cmd{1, 2, 3, 4}, 6)
	same, differ := true, false
	for range 10 {
		x, y, z := a.intn(1000), b.intn(1000), c.intn(1000)
		same = same && x == y
		differ = differ || x != z
		require.Less(t, x, 1000)
	}
	require.True(t, same)
	require.True(t, differ)
	require.Zero(t, a.intn(0))
}
