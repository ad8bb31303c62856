package prefixcache

import (
	"encoding/binary"
	"math/bits"
)

// HashFunc chains one page into a prefix hash: it returns the hash of a
// prefix whose previous pages hash to prev and whose next page holds tokens.
// The cache only uses hashes to find candidates; every candidate is verified
// token by token, so a HashFunc may collide (even always) without ever
// serving a wrong page, only more slowly. Tests inject a colliding one
// through [Config.Hash].
type HashFunc func(prev uint64, tokens []int32) uint64

// wyhash-style constants (odd, well-mixed 64-bit values).
const (
	k0 = 0xa0761d6478bd642f
	k1 = 0xe7037ed1a0b428db
	k2 = 0x8ebc6af09c88c6e3
	k3 = 0x589965cc75374cc3
)

// mum multiplies to 128 bits and folds the halves: the mixing step of
// wyhash. It costs one MUL on amd64 and arm64.
func mum(a, b uint64) uint64 {
	hi, lo := bits.Mul64(a, b)
	return hi ^ lo
}

// hashTokens is the default [HashFunc], seeded: four int32 tokens (16 bytes)
// per multiply, then the count of tokens so that pages of different lengths
// never share a state.
func hashTokens(seed, prev uint64, tokens []int32) uint64 {
	h := prev ^ seed
	n := len(tokens)
	i := 0
	for ; i+4 <= n; i += 4 {
		a := uint64(uint32(tokens[i])) | uint64(uint32(tokens[i+1]))<<32
		b := uint64(uint32(tokens[i+2])) | uint64(uint32(tokens[i+3]))<<32
		h = mum(a^k1, b^h)
	}
	switch n - i {
	case 3:
		a := uint64(uint32(tokens[i])) | uint64(uint32(tokens[i+1]))<<32
		h = mum(a^k1, uint64(uint32(tokens[i+2]))^h^k2)
	case 2:
		a := uint64(uint32(tokens[i])) | uint64(uint32(tokens[i+1]))<<32
		h = mum(a^k1, h^k2)
	case 1:
		h = mum(uint64(uint32(tokens[i]))^k1, h^k3)
	}
	return mum(h^k2, uint64(n)^k0^seed)
}

// hashBytes hashes a namespace's canonical encoding, 8 bytes per multiply.
func hashBytes(seed uint64, b []byte) uint64 {
	h := seed ^ k3
	for len(b) >= 8 {
		h = mum(binary.LittleEndian.Uint64(b)^k1, h^k2)
		b = b[8:]
	}
	var tail [8]byte
	copy(tail[:], b)
	h = mum(binary.LittleEndian.Uint64(tail[:])^k1, h^uint64(len(b))^k0)
	return mum(h^k2, seed^k1)
}

// Namespace separates caches that must never share pages even for equal
// tokens: different tenants, LoRA adapters (whose K/V differ), or a
// per-user salt that keeps one user from probing another's prompts through
// timing. The zero value is the default namespace.
type Namespace struct {
	Tenant string
	LoRA   string
	Salt   string
}

// Key is a [Namespace] prepared for lookups: its canonical encoding, which
// the cache compares byte for byte, and the seed of the hash chain of every
// prefix in it. Make one with [Cache.Key] and reuse it for the request.
// The zero Key means the default namespace: every Cache method treats it as
// Key(Namespace{}).
type Key struct {
	id   string // canonical encoding; compared exactly on root-level pages
	hash uint64 // h_{-1}: the seed of every chain in this namespace
}

// Hash returns the seed of the namespace's hash chains.
func (k Key) Hash() uint64 { return k.hash }

// encode returns the canonical, domain-separated encoding of ns: for each
// field a tag byte, the length as a uvarint, then the bytes. Tags and
// lengths make the encoding injective, so ("ab", "c") and ("a", "bc") differ
// and a LoRA name can never be read as a salt (vLLM issue #44701).
func (ns Namespace) encode() string {
	b := make([]byte, 0, 3*(1+binary.MaxVarintLen64)+len(ns.Tenant)+len(ns.LoRA)+len(ns.Salt))
	for _, f := range [...]struct {
		tag byte
		s   string
	}{{'T', ns.Tenant}, {'L', ns.LoRA}, {'S', ns.Salt}} {
		b = append(b, f.tag)
		b = binary.AppendUvarint(b, uint64(len(f.s)))
		b = append(b, f.s...)
	}
	return string(b)
}
