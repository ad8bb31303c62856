package tier

import (
	"context"
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"errors"
	"fmt"

	"github.com/pagedkv/pagedkv/layout"
)

// Medium is where a page's K/V lives.
type Medium uint8

const (
	// Device is accelerator memory: the Manager's page pool (GPU).
	Device Medium = iota
	// Host is CPU memory: the host tier (package tier/host).
	Host
	// Remote is a store shared across machines (package tier/redis), or
	// a prefill worker's handoff (package handoff).
	Remote
	// Disk is a local disk below the host tier (package tier/disk).
	Disk
)

func (m Medium) String() string {
	switch m {
	case Device:
		return "device"
	case Host:
		return "host"
	case Remote:
		return "remote"
	case Disk:
		return "disk"
	}
	return fmt.Sprintf("Medium(%d)", uint8(m))
}

// Direction is the way a tier copy moves a page.
type Direction uint8

const (
	// ToHost copies a device page into a host page (offload).
	ToHost Direction = iota
	// ToDevice copies a host page into a device page (onload).
	ToDevice
)

func (d Direction) String() string {
	if d == ToDevice {
		return "host->device"
	}
	return "device->host"
}

// HostPageID is a page of the host tier's pool, in [0, host pages).
type HostPageID int32

// Digest names a cached page below the device: the SHA-256 chain over the
// namespace and every token up to the end of the page (see the package
// doc).
type Digest [32]byte

func (d Digest) String() string { return hex.EncodeToString(d[:]) }

// NamespaceRoot returns d_{-1}, the digest every chain of a namespace
// starts from. The fields are encoded with a tag and a length each, so
// ("ab", "c") and ("a", "bc") differ.
func NamespaceRoot(tenant, lora, salt string) Digest {
	h := sha256.New()
	h.Write([]byte("pagedkv/tier/ns/v1"))
	var n [binary.MaxVarintLen64]byte
	for _, f := range [...]struct {
		tag byte
		s   string
	}{{'T', tenant}, {'L', lora}, {'S', salt}} {
		h.Write([]byte{f.tag})
		h.Write(n[:binary.PutUvarint(n[:], uint64(len(f.s)))])
		h.Write([]byte(f.s))
	}
	var d Digest
	h.Sum(d[:0])
	return d
}

// pageDomain separates page digests from namespace digests.
const pageDomain = "pagedkv/tier/page/v1"

// Next returns the digest of the page holding tokens after the prefix whose
// digest is parent. scratch, if large enough (len(pageDomain)+32+4*len(tokens)
// bytes), is used for the hash input so that Next does not allocate; it may
// be nil.
func Next(scratch []byte, parent Digest, tokens []int32) Digest {
	n := len(pageDomain) + len(parent) + 4*len(tokens)
	if cap(scratch) < n {
		scratch = make([]byte, 0, n)
	}
	b := append(scratch[:0], pageDomain...)
	b = append(b, parent[:]...)
	for _, t := range tokens {
		b = binary.LittleEndian.AppendUint32(b, uint32(t))
	}
	return sha256.Sum256(b)
}

// PageFormat is the byte format of one page off the device: for each layer
// in order, the page's K plane then its V plane, each PageSize*NumKVHeads*
// HeadDim elements of DType in the cache's Layout order (NHD or HND), exactly
// as they sit in the device cache's page. A host page and a remote value
// hold these bytes. With IndexerLayers > 0 (a DeepSeek sparse-attention
// pool: layergroup.Indexer) the indexer pages of the same page ID follow
// the KV planes: for each indexer layer in order, PageSize*IndexerTokenBytes
// bytes (layergroup.IndexerLayout), so a tier copy moves them with their
// MLA page and never apart.
type PageFormat struct {
	Layout     layout.KVLayout
	DType      layout.DType
	PageSize   int
	NumKVHeads int
	HeadDim    int
	Layers     int
	// IndexerLayers and IndexerTokenBytes: the indexer layers whose pages
	// travel with the KV planes and one token's bytes in each (fp8 K and
	// its float32 scales: 132 for DeepSeek V3.2); both 0 without.
	IndexerLayers, IndexerTokenBytes int
}

// ErrBadFormat reports an invalid [PageFormat].
var ErrBadFormat = errors.New("tier: bad page format")

// MaxPageBytes bounds one page off the device (1 GiB).
const MaxPageBytes = 1 << 30

// Validate checks every field, and that a page's bytes (the product of
// the geometry) are at most MaxPageBytes, computed without overflow.
func (f PageFormat) Validate() error {
	switch {
	case f.Layout != layout.NHD && f.Layout != layout.HND:
		return fmt.Errorf("%w: kv_layout %v", ErrBadFormat, f.Layout)
	case !f.DType.IsFloat():
		return fmt.Errorf("%w: dtype %v is not a float dtype", ErrBadFormat, f.DType)
	case f.PageSize < 1 || f.NumKVHeads < 1 || f.HeadDim < 1 || f.Layers < 1:
		return fmt.Errorf("%w: page size %d, kv heads %d, head dim %d, layers %d: want >= 1 each",
			ErrBadFormat, f.PageSize, f.NumKVHeads, f.HeadDim, f.Layers)
	}
	if (f.IndexerLayers == 0) != (f.IndexerTokenBytes == 0) || f.IndexerLayers < 0 || f.IndexerTokenBytes < 0 {
		return fmt.Errorf("%w: indexer layers %d, indexer token bytes %d: want both >= 1 or both 0",
			ErrBadFormat, f.IndexerLayers, f.IndexerTokenBytes)
	}
	if _, ok := f.checkedPageBytes(); !ok {
		return fmt.Errorf("%w: page size %d x kv heads %d x head dim %d x %d-byte %v x 2 planes x layers %d (+ %d indexer layers x %d bytes a token) exceeds %d bytes",
			ErrBadFormat, f.PageSize, f.NumKVHeads, f.HeadDim, f.DType.Size(), f.DType, f.Layers, f.IndexerLayers, f.IndexerTokenBytes, MaxPageBytes)
	}
	return nil
}

// checkedPageBytes multiplies the geometry factor by factor, stopping
// before any product passes MaxPageBytes, so no int64 product wraps (a
// wrapped one once passed as 0 or negative bytes). The factors are >= 1.
func (f PageFormat) checkedPageBytes() (int64, bool) {
	b := int64(1)
	for _, factor := range [...]int{f.PageSize, f.NumKVHeads, f.HeadDim, f.DType.Size(), 2, f.Layers} {
		if factor < 1 || int64(factor) > MaxPageBytes/b {
			return 0, false
		}
		b *= int64(factor)
	}
	if f.IndexerLayers == 0 {
		return b, true
	}
	x := int64(1)
	for _, factor := range [...]int{f.PageSize, f.IndexerTokenBytes, f.IndexerLayers} {
		if factor < 1 || int64(factor) > MaxPageBytes/x {
			return 0, false
		}
		x *= int64(factor)
	}
	if b+x > MaxPageBytes {
		return 0, false
	}
	return b + x, true
}

// PlaneBytes is the size of one layer's K (or V) plane of a page.
func (f PageFormat) PlaneBytes() int { return f.PageSize * f.NumKVHeads * f.HeadDim * f.DType.Size() }

// PageBytes is the size of a page off the device: 2 planes per layer,
// then the indexer pages.
func (f PageFormat) PageBytes() int {
	return 2*f.Layers*f.PlaneBytes() + f.IndexerLayers*f.IndexerPageBytes()
}

// IndexerPageBytes is one indexer layer's page: PageSize*IndexerTokenBytes.
func (f PageFormat) IndexerPageBytes() int { return f.PageSize * f.IndexerTokenBytes }

// IndexerOffset is the byte offset of indexer layer l's page in a page:
// after every layer's K and V planes.
func (f PageFormat) IndexerOffset(l int) int {
	return 2*f.Layers*f.PlaneBytes() + l*f.IndexerPageBytes()
}

// LayerOffset is the byte offset of layer l's K plane in a page; its V plane
// follows at LayerOffset(l)+PlaneBytes().
func (f PageFormat) LayerOffset(l int) int { return 2 * l * f.PlaneBytes() }

// RemotePage is one page in a [RemoteStore] lookup or store.
type RemotePage struct {
	// Digest names the page; Parent is the digest of the prefix before it
	// (a namespace root at depth 0).
	Digest, Parent Digest
	// Chain is the digest of the first page of the page's prefix (the page
	// itself at depth 0): stores that group a prefix's pages (a Redis
	// Cluster hash tag) key by it.
	Chain Digest
	// Tokens are the page's tokens (PageSize of them).
	Tokens []int32
	// Data is PageFormat.PageBytes() bytes: filled by Fetch, read by Store.
	Data []byte
	// State marks a state group's checkpoint page (its Data a recurrent
	// state slot): its value carries flags bit 0x04, and a value without
	// it never serves it, nor it a K/V page (Value.Verify).
	State bool
	// Retention is the page's retention: read by Store (a store keeps it
	// with the page and honours it in its eviction), set by Fetch to what
	// is left of it (zero: none).
	Retention Retention
}

// RemoteStore is a store of pages shared across Managers (replicas). The Manager
// looks up a new request's prefix in one batch and writes pages behind its
// back; a RemoteStore never makes the Manager wait past the caller's deadline
// and never serves a value it has not verified.
type RemoteStore interface {
	// Fetch looks pages up in order and fills Data of the leading pages it
	// found and verified (digest, parent, tokens and format equal to the
	// request's), stopping at the first miss, rejection or error; it
	// returns how many it filled. It returns by ctx's deadline, with what it
	// has; failures are counted in Stats, never returned.
	Fetch(ctx context.Context, pages []RemotePage) int
	// Store queues p for writing (it copies Data and Tokens) and returns
	// false if it dropped it instead (a full queue, a closed store).
	Store(p *RemotePage) bool
	// Stats returns the store's counters; safe from any goroutine.
	Stats() RemoteStats
}

// RemoteStats are a remote store's cumulative counters.
type RemoteStats struct {
	Lookups   int64 // Fetch calls that asked the store
	Requested int64 // pages asked for
	Hits      int64 // pages served (verified)
	Misses    int64 // pages the store did not have (the first miss ends a Fetch)
	Rejected  int64 // values found but refused: corrupt, truncated, stale or foreign
	Errors    int64 // failed lookups and writes (connection, protocol)
	Timeouts  int64 // of Errors, lookups cut by the deadline
	Stored    int64 // pages written
	Dropped   int64 // pages not written: queue full or store closed
	BytesIn   int64 // value bytes read
	BytesOut  int64 // value bytes written

	// RejectedBy splits Rejected by reason (index: a RejectReason).
	RejectedBy [NumRejectReasons]int64
	// Recent are the latest rejections, most recent first, one entry per
	// key and reason, at most RecentRejections (unused entries: Count 0).
	Recent [RecentRejections]RemoteRejection
}
