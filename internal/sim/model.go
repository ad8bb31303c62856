package sim

import (
	"fmt"
	"hash/fnv"

	"github.com/pagedkv/pagedkv/layout"
)

// Model is the simulated transformer's attention geometry and the
// deterministic function that stands in for its weights: the K, V and Q
// rows of a token are functions of the token's context hash (the
// namespace, every token up to and including it, and its position) and of
// the layer and head. Two requests therefore get equal K/V for a token
// exactly when everything before it is equal, as in a real model, so a
// prefix-cache hit on the wrong page, a page shared across namespaces, or a
// token written to the wrong slot all change the attention output.
//
// Every value is k/2^g for an integer |k| <= 2^g (g = 10 for f16 and f32,
// 7 for bf16), which the dtype holds exactly: the cache holds exactly what
// the model produced, and the dense check rebuilds it without rounding.
type Model struct {
	Layers     int          // transformer layers, one paged cache each
	NumQOHeads int          // Hq, a multiple of NumKVHeads
	NumKVHeads int          // Hkv
	HeadDim    int          // D, a multiple of 4
	DType      layout.DType // query and output dtype (and the cache's unless KVDType is set): f16, bf16 or f32
	// KVDType is the cache dtype when it differs from DType: layout.NVFP4
	// (K/V rows of DType quantised on append under the global scale
	// NVFP4GlobalScale; HeadDim a multiple of 16). The zero value means
	// DType.
	KVDType layout.DType
	Seed    uint64 // varies every K/V/Q value and sampled token
	// Sinks gives the model gpt-oss's attention sinks: one learned-like
	// logit per query head ([Model.SinkLogits]), passed to every attention
	// as FlashInfer's sinks and included by the dense check.
	Sinks bool
}

// NVFP4GlobalScale is the global (per-tensor) scale of the simulator's NVFP4
// caches, K and V alike: FlashInfer's convention amax/(6*448) for the
// model's values, which lie in [-1, 1), so that block scales use e4m3's
// whole range.
const NVFP4GlobalScale = 1.0 / (6 * 448)

// CacheDType is the dtype of the paged K/V cache: KVDType, or DType when
// KVDType is not set.
func (m *Model) CacheDType() layout.DType {
	if m.KVDType == layout.InvalidDType {
		return m.DType
	}
	return m.KVDType
}

// kvScale is the k_scale/v_scale of appends and attention: the NVFP4
// global scale for an NVFP4 cache, else 0 (1).
func (m *Model) kvScale() float64 {
	if m.CacheDType() == layout.NVFP4 {
		return NVFP4GlobalScale
	}
	return 0
}

// SinkLogits returns the model's sink logits, one per query head (nil
// without Sinks): grid values k/16 in [0.5, 4.5], set by Seed, the same
// in every layer. gpt-oss learns them per layer and head; one set per
// head is what a device step takes with its plan (cuda.StepPlan). A sink
// of e^0.5..e^4.5 weighs as much as a few to ~90 keys of the simulator's
// logits (|q·k|/sqrt(D) of a few units), so a sink dropped or counted
// twice moves the outputs far beyond the check's tolerance.
func (m *Model) SinkLogits() []float32 {
	if !m.Sinks {
		return nil
	}
	s := make([]float32, m.NumQOHeads)
	for h := range s {
		s[h] = 0.5 + float32(mix(m.Seed^uint64(h+1)*golden^kindSink)%65)/16
	}
	return s
}

// Vocab is the size of the simulated vocabulary: tokens are 0..Vocab-1.
const Vocab = 32000

// Bounds of a simulated model: far above any real one, low enough that a
// mistyped flag fails fast instead of exhausting memory.
const (
	MaxLayers  = 1024
	MaxHeads   = 1024 // query heads (and so kv heads)
	MaxHeadDim = 1024
)

// Validate checks the geometry (each dimension within its Max bound) and
// the dtype.
func (m *Model) Validate() error {
	switch {
	case m.Layers < 1 || m.Layers > MaxLayers:
		return fmt.Errorf("%w: layers = %d, want 1..%d", ErrBadConfig, m.Layers, MaxLayers)
	case m.NumKVHeads < 1 || m.NumKVHeads > MaxHeads:
		return fmt.Errorf("%w: kv heads = %d, want 1..%d", ErrBadConfig, m.NumKVHeads, MaxHeads)
	case m.NumQOHeads > MaxHeads:
		return fmt.Errorf("%w: qo heads = %d, want at most %d", ErrBadConfig, m.NumQOHeads, MaxHeads)
	case m.NumQOHeads < m.NumKVHeads || m.NumQOHeads%m.NumKVHeads != 0:
		return fmt.Errorf("%w: qo heads = %d, want a positive multiple of kv heads %d", ErrBadConfig, m.NumQOHeads, m.NumKVHeads)
	case m.HeadDim < 4 || m.HeadDim%4 != 0 || m.HeadDim > MaxHeadDim:
		return fmt.Errorf("%w: head dim = %d, want a multiple of 4 in 4..%d", ErrBadConfig, m.HeadDim, MaxHeadDim)
	}
	if gridBits(m.DType) == 0 {
		return fmt.Errorf("%w: dtype %v, want f16, bf16 or f32", ErrBadConfig, m.DType)
	}
	switch kv := m.KVDType; {
	case kv == layout.InvalidDType || kv == m.DType:
	case kv == layout.NVFP4 && m.HeadDim%layout.NVFP4BlockSize != 0:
		return fmt.Errorf("%w: kv dtype nvfp4 needs a head dim that is a multiple of %d, have %d", ErrBadConfig, layout.NVFP4BlockSize, m.HeadDim)
	case kv != layout.NVFP4:
		return fmt.Errorf("%w: kv dtype %v, want the dtype %v or nvfp4", ErrBadConfig, kv, m.DType)
	}
	return nil
}

// gridBits is g: values are k/2^g with |k| <= 2^g, exact in dt (0: the
// model does not support dt).
func gridBits(dt layout.DType) int {
	switch dt {
	case layout.F16, layout.F32:
		return 10 // 11 significant bits
	case layout.BF16:
		return 7 // 8 significant bits
	}
	return 0
}

// mix is splitmix64's finaliser: a bijection of uint64 with good avalanche.
func mix(x uint64) uint64 {
	x ^= x >> 30
	x *= 0xbf58476d1ce4e5b9
	x ^= x >> 27
	x *= 0x94d049bb133111eb
	x ^= x >> 31
	return x
}

// Mix is mix for the packages built on the simulator's workloads (the
// trace replay synthesizes its block tokens with it).
func Mix(x uint64) uint64 { return mix(x) }

const golden = 0x9e3779b97f4a7c15

// Root is the context hash before the first token of a request in
// namespace ns: K/V in different namespaces (tenants, adapters) differ even
// for equal tokens.
func (m *Model) Root(ns string) uint64 {
	return mix(m.Seed ^ mix(hashString(ns)^golden))
}

// hashString is FNV-1a of s.
func hashString(s string) uint64 {
	h := fnv.New64a()
	h.Write([]byte(s))
	return h.Sum64()
}

// Next is the context hash after token tok at position pos, following the
// context hash prev of the tokens before it.
func Next(prev uint64, tok int32, pos int) uint64 {
	return mix(prev + golden*(uint64(uint32(tok))|uint64(pos)<<32) + 1)
}

// Contexts returns the context hash after each token of tokens, a request
// in namespace ns (appending to dst).
func (m *Model) Contexts(dst []uint64, ns string, tokens []int32) []uint64 {
	h := m.Root(ns)
	for i, t := range tokens {
		h = Next(h, t, i)
		dst = append(dst, h)
	}
	return dst
}

// The three row kinds the model produces.
const (
	kindK = iota + 1
	kindV
	kindQ
	kindSink
)

// fill writes heads rows of HeadDim grid values for (ctx, layer, kind) into
// dst [heads*HeadDim], each value scaled by 2^extraBits.
func (m *Model) fill(dst []float32, ctx uint64, layer, kind, heads int, extraBits int) {
	m.fillDim(dst, ctx, layer, kind, heads, m.HeadDim, extraBits)
}

// fillDim is fill with rows of d values (d a multiple of 4).
func (m *Model) fillDim(dst []float32, ctx uint64, layer, kind, heads, d int, extraBits int) {
	g := gridBits(m.DType)
	scale := float32(1) / float32(uint32(1)<<g) * float32(uint32(1)<<extraBits)
	mask := uint64(1)<<(g+1) - 1
	off := int64(1) << g
	for h := range heads {
		base := mix(ctx ^ uint64(layer)<<40 ^ uint64(kind)<<32 ^ uint64(h)<<16)
		row := dst[h*d : (h+1)*d]
		for c := 0; c < d; c += 4 {
			x := mix(base + golden*uint64(c+1))
			for i := range 4 {
				// k in [-2^g, 2^g): exact in the dtype.
				k := int64((x>>(16*i))&mask) - off
				row[c+i] = float32(k) * scale
			}
		}
	}
}

// K writes the keys of the token with context hash ctx in layer layer,
// every kv head: dst [NumKVHeads*HeadDim], values in [-1, 1).
func (m *Model) K(dst []float32, ctx uint64, layer int) {
	m.fill(dst, ctx, layer, kindK, m.NumKVHeads, 0)
}

// V writes the values, like [Model.K].
func (m *Model) V(dst []float32, ctx uint64, layer int) {
	m.fill(dst, ctx, layer, kindV, m.NumKVHeads, 0)
}

// Q writes the queries of the token with context hash ctx in layer layer,
// every qo head: dst [NumQOHeads*HeadDim], values in [-4, 4) so that
// attention is peaked enough for a wrong key to show in the output.
func (m *Model) Q(dst []float32, ctx uint64, layer int) {
	m.fill(dst, ctx, layer, kindQ, m.NumQOHeads, 2)
}

// Sample is the token "sampled" after the token with context hash ctx by
// branch branch of a request (parallel samples diverge by branch).
func (m *Model) Sample(ctx uint64, branch int) int32 {
	return int32(mix(ctx^m.Seed^uint64(branch+1)*golden) % Vocab)
}

// draftSalt separates the draft model's hash from Sample's.
const draftSalt = 0xd4af7d4af7d4af7

// Draft is the draft model's proposal after the token with context hash
// ctx: Sample's token three times in four (decided by a hash of ctx, so a
// run is deterministic), else a different token. A speculative step
// accepts the longest prefix of drafts equal to what Sample gives, so the
// accepted tokens are exactly the ones a run without drafts samples.
func (m *Model) Draft(ctx uint64, branch int) int32 {
	t := m.Sample(ctx, branch)
	if mix(ctx^m.Seed^draftSalt)%4 == 0 {
		t = (t + 1) % Vocab
	}
	return t
}

// KVBytesPerToken is the K and V bytes one token occupies in one layer
// (for NVFP4: head_dim/2 data bytes and head_dim/16 scale bytes per head).
func (m *Model) KVBytesPerToken() int64 {
	if m.CacheDType() == layout.NVFP4 {
		return 2 * int64(m.NumKVHeads) * int64(m.HeadDim/2+m.HeadDim/layout.NVFP4BlockSize)
	}
	return 2 * int64(m.NumKVHeads) * int64(m.HeadDim) * int64(m.DType.Size())
}
