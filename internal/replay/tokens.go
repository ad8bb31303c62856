package replay

import (
	"math"

	"github.com/pagedkv/pagedkv/internal/sim"
)

// BlockTokens writes the page of block id into dst (len(dst) tokens): dst[0]
// is the id itself, so different ids give different pages, and the rest
// mix (id, position) through the simulator's splitmix64 finalizer
// (sim.Mix), so equal ids give equal pages. Every token is a non-negative
// int32.
func BlockTokens(dst []int32, id int32) {
	if len(dst) == 0 {
		return
	}
	dst[0] = id
	base := sim.Mix(uint64(id)<<20 | 0x5eed)
	for i := 1; i < len(dst); i++ {
		dst[i] = int32(sim.Mix(base+uint64(i)) & 0x7fffffff)
	}
}

// outputToken is the token request index q samples at position pos. Output
// pages never equal a prompt block's page: the trace's ids say which
// prompt blocks are shared, and no trace prompt is made of another
// request's synthesized outputs.
func outputToken(q, pos int) int32 {
	return int32(sim.Mix(uint64(q)<<32|uint64(pos)|1<<63) & 0x7fffffff)
}

// queryToken ends every prompt: the token after the last block, whose
// logits the first step yields (the Manager never matches a whole prompt).
const queryToken int32 = 0

// inf is a time after every arrival.
var inf = math.Inf(1)
