package replay

import "math"

// mix is a fixed 64-bit finalizer (splitmix64's): the synthesized tokens
// need only be a deterministic function of their inputs.
func mix(x uint64) uint64 {
	x ^= x >> 30
	x *= 0xbf58476d1ce4e5b9
	x ^= x >> 27
	x *= 0x94d049bb133111eb
	x ^= x >> 31
	return x
}

// BlockTokens writes the page of block id into dst (len(dst) tokens): dst[0]
// is the id itself, so different ids give different pages, and the rest
// mix (id, position), so equal ids give equal pages. Every token is a
// non-negative int32.
func BlockTokens(dst []int32, id int32) {
	if len(dst) == 0 {
		return
	}
	dst[0] = id
	base := mix(uint64(id)<<20 | 0x5eed)
	for i := 1; i < len(dst); i++ {
		dst[i] = int32(mix(base+uint64(i)) & 0x7fffffff)
	}
}

// outputToken is the token request index q samples at position pos. Output
// pages never equal a prompt block's page: the trace's ids say which
// prompt blocks are shared, and no trace prompt is made of another
// request's synthesized outputs.
func outputToken(q, pos int) int32 {
	return int32(mix(uint64(q)<<32|uint64(pos)|1<<63) & 0x7fffffff)
}

// queryToken ends every prompt: the token after the last block, whose
// logits the first step yields (the Manager never matches a whole prompt).
const queryToken int32 = 0

// inf is a time after every arrival.
var inf = math.Inf(1)
