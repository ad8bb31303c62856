package main

/*
#include <stdlib.h>
#include <string.h>
#define PAGEDKV_NO_PROTOTYPES
#include "pagedkv.h"
*/
import "C"

import (
	"context"
	"fmt"
	"runtime"
	"time"
	"unsafe"

	"github.com/pagedkv/pagedkv"
	"github.com/pagedkv/pagedkv/events"
	"github.com/pagedkv/pagedkv/layout"
	"github.com/pagedkv/pagedkv/tier"
	"github.com/pagedkv/pagedkv/tier/disk"
	"github.com/pagedkv/pagedkv/tier/redis"
)

// The tiers below the device pool and the KV cache events, through the C
// ABI (docs/c-abi.md, "Tiers and KV events"). Both are options of
// pagedkv_create_ex and pagedkv_hybrid_create_ex, so one options struct
// serves both kinds of manager.

// extras is what a handle keeps for its tiers, events and cached hashes.
type extras struct {
	tiers   bool
	stores  []store // below the host tier, closed by destroy
	hostMem unsafe.Pointer
	hostPB  int64 // bytes of one host page (0: no format)
	hostN   int64
	// hostPin pins Go-allocated host memory for the handle's lifetime.
	hostPin runtime.Pinner

	// The tier copies handed out: Go scratch, then C arrays (the caller's
	// pointers stay valid until the next take).
	copies             []pagedkv.TierCopy
	cIDs               *C.uint64_t
	cDirs, cDev, cHost *C.int32_t
	copiesCap          int
	retired            []unsafe.Pointer // tier copy lists handed out before the current ones (C memory)
	hashes             []uint64
	rec                *events.Recorder
	q                  *events.Queue
	pub                *events.Publisher
	enc                *events.Encoder
	rank               int
	payload            []byte
	cPayload           unsafe.Pointer
	cPayloadCap        int
}

// store is a store below the host tier that the handle owns.
type store interface {
	tier.RemoteStore
	Close() error
}

// maxMillis bounds every duration passed in milliseconds (a day).
const maxMillis = 24 * 3600 * 1000

// maxHostBytes bounds host_memory_len (64 TiB).
const maxHostBytes = 1 << 46

// DefaultEventBatches is pagedkv_events_config.queue_batches' default.
const DefaultEventBatches = 64

// dtypes maps PAGEDKV_DTYPE_* to layout's dtypes.
var dtypes = [...]layout.DType{C.PAGEDKV_DTYPE_F32: layout.F32, C.PAGEDKV_DTYPE_F16: layout.F16,
	C.PAGEDKV_DTYPE_BF16: layout.BF16, C.PAGEDKV_DTYPE_E4M3: layout.E4M3, C.PAGEDKV_DTYPE_E5M2: layout.E5M2}

//export pagedkv_create_ex
func pagedkv_create_ex(cfg *C.pagedkv_config, size C.size_t, opts *C.pagedkv_options, optsSize C.size_t, out *C.pagedkv_manager) (code C.int32_t) {
	defer recoverTo(&code)
	gcfg, clk, code, ok := goConfig("create", cfg, size, out)
	if !ok {
		return code
	}
	if _, code, ok := stateCheckpointEvery("create", cfg, size, false); !ok {
		return code
	}
	ext, code, ok := newExtras("create", opts, optsSize, &gcfg, nil)
	if !ok {
		return code
	}
	m, err := pagedkv.New(gcfg)
	if err != nil {
		ext.close()
		return failErr(err)
	}
	h := &handle{m: m, plans: make([]planExport, 1), clock: clk}
	h.adopt(ext)
	*out = register(h)
	return C.PAGEDKV_OK
}

// adopt gives h (either kind) the extras made for its manager and pins
// the host memory Go allocated, which C may keep a pointer to until
// destroy.
func (h *handle) adopt(ext *extras) {
	h.ext = ext
	if ext == nil || !ext.tiers || ext.hostMem != nil {
		return
	}
	if p := h.m.HostPage(0); len(p) > 0 {
		ext.hostMem = unsafe.Pointer(unsafe.SliceData(p))
		ext.hostPin.Pin(ext.hostMem)
	}
}

// newExtras checks opts and applies them to cfg (groups: a hybrid
// manager's). It opens the stores below the host tier: the caller closes
// them (ext.close) if the manager is not made.
func newExtras(op string, opts *C.pagedkv_options, size C.size_t, cfg *pagedkv.Config, groups []pagedkv.LayerGroup) (*extras, C.int32_t, bool) {
	if opts == nil {
		return nil, C.PAGEDKV_OK, true
	}
	if size != C.sizeof_pagedkv_options {
		return nil, badArg("%s: opts_size = %d, want sizeof(pagedkv_options) = %d", op, uint64(size), C.sizeof_pagedkv_options), false
	}
	// Every argument is checked before a store or socket is opened.
	var ev *eventsArgs
	if e := opts.events; e != nil {
		if opts.events_size != C.sizeof_pagedkv_events_config {
			return nil, badArg("%s: opts.events_size = %d, want sizeof(pagedkv_events_config) = %d", op, uint64(opts.events_size), C.sizeof_pagedkv_events_config), false
		}
		a, code, ok := checkEvents(op, e)
		if !ok {
			return nil, code, false
		}
		ev = &a
	} else if opts.events_size != 0 {
		return nil, badArg("%s: opts.events is NULL with events_size = %d", op, uint64(opts.events_size)), false
	}
	ext := &extras{}
	if t := opts.tiers; t != nil {
		if opts.tiers_size != C.sizeof_pagedkv_tier_config {
			return nil, badArg("%s: opts.tiers_size = %d, want sizeof(pagedkv_tier_config) = %d", op, uint64(opts.tiers_size), C.sizeof_pagedkv_tier_config), false
		}
		if code, ok := ext.tierConfig(op, t, cfg); !ok {
			return nil, code, false
		}
	} else if opts.tiers_size != 0 {
		return nil, badArg("%s: opts.tiers is NULL with tiers_size = %d", op, uint64(opts.tiers_size)), false
	}
	if ev != nil {
		if code, ok := ext.openEvents(op, ev, cfg, groups); !ok {
			ext.close()
			return nil, code, false
		}
	}
	return ext, C.PAGEDKV_OK, true
}

// tierConfig converts t into cfg.Tiers, opening the stores below the host
// tier last (so that a bad argument opens nothing).
func (ext *extras) tierConfig(op string, t *C.pagedkv_tier_config, cfg *pagedkv.Config) (C.int32_t, bool) {
	tc := &cfg.Tiers
	tc.HostPages = int(t.host_pages)
	if t.host_pages < 0 || t.host_pages >= maxLen {
		return badArg("%s: tiers.host_pages = %d, want 0..%d", op, int64(t.host_pages), maxLen-1), false
	}
	f := &t.format
	if f.kv_layout != 0 || f.dtype != 0 || f.num_kv_heads != 0 || f.head_dim != 0 || f.num_layers != 0 {
		if f.kv_layout != C.PAGEDKV_NHD && f.kv_layout != C.PAGEDKV_HND {
			return badArg("%s: tiers.format.kv_layout = %d, want PAGEDKV_NHD (0) or PAGEDKV_HND (1)", op, int64(f.kv_layout)), false
		}
		if f.dtype < 1 || f.dtype >= C.int64_t(len(dtypes)) {
			return badArg("%s: tiers.format.dtype = %d, want PAGEDKV_DTYPE_F32 (1) .. PAGEDKV_DTYPE_E5M2 (5)", op, int64(f.dtype)), false
		}
		for _, v := range [...]struct {
			name string
			v    C.int64_t
		}{{"num_kv_heads", f.num_kv_heads}, {"head_dim", f.head_dim}, {"num_layers", f.num_layers}} {
			if v.v < 1 || v.v >= maxLen {
				return badArg("%s: tiers.format.%s = %d, want 1..%d", op, v.name, int64(v.v), maxLen-1), false
			}
		}
		tc.Format = tier.PageFormat{Layout: layout.KVLayout(f.kv_layout), DType: dtypes[f.dtype], PageSize: cfg.PageSize,
			NumKVHeads: int(f.num_kv_heads), HeadDim: int(f.head_dim), Layers: int(f.num_layers)}
	}
	switch {
	case t.host_memory_len < 0 || t.host_memory_len > maxHostBytes:
		return badArg("%s: tiers.host_memory_len = %d, want 0..%d", op, int64(t.host_memory_len), int64(maxHostBytes)), false
	case t.host_memory == nil && t.host_memory_len != 0:
		return badArg("%s: tiers.host_memory is NULL with host_memory_len = %d", op, int64(t.host_memory_len)), false
	case t.remote_deadline_us < 0 || t.remote_deadline_us > maxMillis*1000:
		return badArg("%s: tiers.remote_deadline_us = %d, want 0..%d", op, int64(t.remote_deadline_us), int64(maxMillis*1000)), false
	case t.offload_free_pages < 0 || t.offload_free_pages >= maxLen:
		return badArg("%s: tiers.offload_free_pages = %d, want 0..num_pages", op, int64(t.offload_free_pages)), false
	case t.disk == nil && t.disk_size != 0, t.disk != nil && t.disk_size != C.sizeof_pagedkv_disk_config:
		return badArg("%s: tiers.disk = %p with disk_size = %d, want sizeof(pagedkv_disk_config) = %d", op, t.disk, uint64(t.disk_size), C.sizeof_pagedkv_disk_config), false
	case t.redis == nil && t.redis_size != 0, t.redis != nil && t.redis_size != C.sizeof_pagedkv_redis_config:
		return badArg("%s: tiers.redis = %p with redis_size = %d, want sizeof(pagedkv_redis_config) = %d", op, t.redis, uint64(t.redis_size), C.sizeof_pagedkv_redis_config), false
	}
	if t.host_memory != nil {
		// C memory: Go may keep a slice of it; the caller keeps it alive
		// until pagedkv_destroy.
		tc.HostMemory = unsafe.Slice((*byte)(t.host_memory), int(t.host_memory_len))
		ext.hostMem = t.host_memory
	}
	tc.RemoteDeadline = time.Duration(t.remote_deadline_us) * time.Microsecond
	tc.OffloadFreePages = int(t.offload_free_pages)
	tc.WriteThrough = t.write_through != 0
	var dcfg *disk.Config
	var rcfg *redis.Config
	if d := t.disk; d != nil {
		c, code, ok := diskConfig(op, d, tc.Format)
		if !ok {
			return code, false
		}
		dcfg = &c
	}
	if r := t.redis; r != nil {
		c, code, ok := redisConfig(op, r, tc.Format)
		if !ok {
			return code, false
		}
		rcfg = &c
	}
	if (dcfg != nil || rcfg != nil) && tc.Format.Layers == 0 {
		return failErr(fmt.Errorf("%w: %s: tiers.disk or tiers.redis needs tiers.format (num_layers = 0)", pagedkv.ErrBadConfig, op)), false
	}
	if dcfg != nil {
		s, err := disk.Open(*dcfg)
		if err != nil {
			return failErr(fmt.Errorf("%w: %s: tiers.disk: %w", pagedkv.ErrBadConfig, op, err)), false
		}
		ext.stores = append(ext.stores, s)
	}
	if rcfg != nil {
		s, err := redis.New(*rcfg)
		if err != nil {
			ext.close()
			return failErr(fmt.Errorf("%w: %s: tiers.redis: %w", pagedkv.ErrBadConfig, op, err)), false
		}
		ext.stores = append(ext.stores, s)
	}
	switch len(ext.stores) {
	case 1:
		tc.Remote = ext.stores[0]
	case 2:
		tc.Remote = tier.Chain(ext.stores[0], ext.stores[1])
	}
	ext.tiers = tc.HostPages > 0
	ext.hostN = int64(tc.HostPages)
	if tc.Format.Layers > 0 {
		ext.hostPB = int64(tc.Format.PageBytes())
	}
	return C.PAGEDKV_OK, true
}

// strings3 reads the three byte strings of a config.
func strings3(op, what string, names [3]string, p [3]*C.char, n [3]C.int64_t) ([3]string, C.int32_t, bool) {
	var out [3]string
	for i, name := range names {
		var code C.int32_t
		var ok bool
		if out[i], code, ok = goBytes(op, what+"."+name, p[i], n[i]); !ok {
			return out, code, false
		}
	}
	return out, C.PAGEDKV_OK, true
}

func millis(op, name string, v C.int64_t) (time.Duration, C.int32_t, bool) {
	if v < 0 || v > maxMillis {
		return 0, badArg("%s: %s = %d, want 0..%d", op, name, int64(v), maxMillis), false
	}
	return time.Duration(v) * time.Millisecond, C.PAGEDKV_OK, true
}

func redisConfig(op string, r *C.pagedkv_redis_config, f tier.PageFormat) (redis.Config, C.int32_t, bool) {
	s, code, ok := strings3(op, "tiers.redis", [3]string{"addr", "ns", "group"}, [3]*C.char{r.addr, r.ns, r.group}, [3]C.int64_t{r.addr_len, r.ns_len, r.group_len})
	if !ok {
		return redis.Config{}, code, false
	}
	c := redis.Config{Addr: s[0], Namespace: s[1], Group: s[2], Format: f, TagByChain: r.tag_by_chain != 0}.FromEnv()
	for _, v := range [...]struct {
		name string
		v    C.int64_t
		dst  *int
	}{{"queue_len", r.queue_len, &c.QueueLen}, {"batch", r.batch, &c.Batch}} {
		if v.v < 0 || v.v >= maxLen {
			return c, badArg("%s: tiers.redis.%s = %d, want 0..%d", op, v.name, int64(v.v), maxLen-1), false
		}
		*v.dst = int(v.v)
	}
	for _, v := range [...]struct {
		name string
		v    C.int64_t
		dst  *time.Duration
	}{{"expiry_ms", r.expiry_ms, &c.Expiry}, {"write_timeout_ms", r.write_timeout_ms, &c.WriteTimeout}, {"dial_timeout_ms", r.dial_timeout_ms, &c.DialTimeout}} {
		if *v.dst, code, ok = millis(op, "tiers.redis."+v.name, v.v); !ok {
			return c, code, false
		}
	}
	return c, C.PAGEDKV_OK, true
}

func diskConfig(op string, d *C.pagedkv_disk_config, f tier.PageFormat) (disk.Config, C.int32_t, bool) {
	s, code, ok := strings3(op, "tiers.disk", [3]string{"dir", "ns", "group"}, [3]*C.char{d.dir, d.ns, d.group}, [3]C.int64_t{d.dir_len, d.ns_len, d.group_len})
	if !ok {
		return disk.Config{}, code, false
	}
	c := disk.Config{Dir: s[0], Namespace: s[1], Group: s[2], Format: f}
	for _, v := range [...]struct {
		name string
		v    C.int64_t
		dst  *int
		neg  bool
	}{{"pages", d.pages, &c.Pages, false}, {"segment_pages", d.segment_pages, &c.SegmentPages, false},
		{"queue_len", d.queue_len, &c.QueueLen, false}, {"sync_every", d.sync_every, &c.SyncEvery, true}} {
		if (v.v < 0 && !v.neg) || v.v <= -maxLen || v.v >= maxLen {
			return c, badArg("%s: tiers.disk.%s = %d, want 0..%d", op, v.name, int64(v.v), maxLen-1), false
		}
		*v.dst = int(v.v)
	}
	return c, C.PAGEDKV_OK, true
}

// eventsArgs are a checked pagedkv_events_config.
type eventsArgs struct {
	batches, rank int
	mode          events.BindMode
	endpoint      [3]string // endpoint, replay endpoint, topic
}

// checkEvents checks e.
func checkEvents(op string, e *C.pagedkv_events_config) (eventsArgs, C.int32_t, bool) {
	switch {
	case e.queue_batches < 0 || e.queue_batches > 1<<20:
		return eventsArgs{}, badArg("%s: events.queue_batches = %d, want 0..%d", op, int64(e.queue_batches), 1<<20), false
	case e.data_parallel_rank < 0 || e.data_parallel_rank >= maxLen:
		return eventsArgs{}, badArg("%s: events.data_parallel_rank = %d, want 0..%d", op, int64(e.data_parallel_rank), maxLen-1), false
	case e.mode < C.PAGEDKV_EVENTS_AUTO || e.mode > C.PAGEDKV_EVENTS_CONNECT:
		return eventsArgs{}, badArg("%s: events.mode = %d, want PAGEDKV_EVENTS_AUTO (0) .. PAGEDKV_EVENTS_CONNECT (3)", op, int64(e.mode)), false
	}
	a := eventsArgs{batches: int(e.queue_batches), rank: int(e.data_parallel_rank), mode: bindModes[e.mode]}
	if a.batches == 0 {
		a.batches = DefaultEventBatches
	}
	var code C.int32_t
	var ok bool
	if a.endpoint, code, ok = strings3(op, "events", [3]string{"endpoint", "replay_endpoint", "topic"},
		[3]*C.char{e.endpoint, e.replay_endpoint, e.topic}, [3]C.int64_t{e.endpoint_len, e.replay_endpoint_len, e.topic_len}); !ok {
		return a, code, false
	}
	if a.endpoint[0] == "" && (a.endpoint[1] != "" || a.endpoint[2] != "") {
		return a, badArg("%s: events.replay_endpoint %q or topic %q without an endpoint", op, a.endpoint[1], a.endpoint[2]), false
	}
	return a, C.PAGEDKV_OK, true
}

// openEvents makes the Recorder, over a queue for pagedkv_drain_events or
// a Publisher with an endpoint, and installs it as cfg's CacheEvents: one
// sink, or one per group of a hybrid manager.
func (ext *extras) openEvents(op string, a *eventsArgs, cfg *pagedkv.Config, groups []pagedkv.LayerGroup) (C.int32_t, bool) {
	rc := recorderConfig(*cfg, groups)
	var err error
	if a.endpoint[0] == "" {
		ext.rec, ext.q, err = newRecorder(rc, a.batches)
	} else {
		ext.pub, err = events.NewPublisher(events.PublisherConfig{Endpoint: a.endpoint[0], Mode: a.mode, ReplayEndpoint: a.endpoint[1],
			Topic: a.endpoint[2], MaxQueue: a.batches, DataParallelRank: a.rank})
		if err == nil {
			ext.rec, err = ext.pub.NewRecorder(rc)
		}
	}
	if err != nil {
		return failErr(fmt.Errorf("%w: %s: events: %w", pagedkv.ErrBadConfig, op, err)), false
	}
	ext.enc, ext.rank = events.NewEncoder(), a.rank
	cfg.CacheEvents = ext.rec
	return C.PAGEDKV_OK, true
}

// bindModes maps PAGEDKV_EVENTS_* to the publisher's bind modes.
var bindModes = [...]events.BindMode{C.PAGEDKV_EVENTS_AUTO: events.BindAuto, C.PAGEDKV_EVENTS_BIND: events.Bind,
	C.PAGEDKV_EVENTS_BIND_OR_CONNECT: events.BindOrConnect, C.PAGEDKV_EVENTS_CONNECT: events.Connect}

// recorderConfig describes a manager made with cfg (groups: a hybrid
// manager's) to its Recorder.
func recorderConfig(cfg pagedkv.Config, groups []pagedkv.LayerGroup) events.RecorderConfig {
	rc := events.RecorderConfig{NumPages: cfg.NumPages, PageSize: cfg.PageSize, HostPages: cfg.Tiers.HostPages}
	for _, g := range groups {
		if !g.OwnsPages() { // indexer and shared-KV groups send no events
			continue
		}
		kind, w := pagedkv.KVEventSpec(g)
		rc.Groups = append(rc.Groups, events.GroupConfig{SpecKind: kind, SlidingWindow: w})
	}
	return rc
}

// newRecorder is a Recorder of rc over a queue of capacity batches, for
// pagedkv_drain_events. The trace test builds the Go reference with it too.
func newRecorder(rc events.RecorderConfig, capacity int) (*events.Recorder, *events.Queue, error) {
	q, err := events.NewQueue(capacity)
	if err != nil {
		return nil, nil, err
	}
	rec, err := events.NewRecorder(rc, q)
	if err != nil {
		return nil, nil, err
	}
	return rec, q, nil
}

// close closes the stores and the publisher and frees the memory.
func (ext *extras) close() {
	ext.closeIO()
	ext.free()
}

// closeIO closes the stores and the publisher: what destroy ends at once,
// even when the memory handed out is kept (pagedkv_destroy_keep_memory).
func (ext *extras) closeIO() {
	if ext == nil {
		return
	}
	for _, s := range ext.stores {
		s.Close() //nolint:errcheck // nothing to report it to
	}
	ext.stores = nil
	if ext.pub != nil {
		ext.pub.Close() //nolint:errcheck // nothing to report it to
		ext.pub = nil
	}
}

// free unpins the host memory Go allocated and frees the C buffers, the
// tier copy lists handed out before (retired) included.
func (ext *extras) free() {
	if ext == nil {
		return
	}
	ext.hostPin.Unpin()
	for _, p := range [...]unsafe.Pointer{unsafe.Pointer(ext.cIDs), unsafe.Pointer(ext.cDirs), unsafe.Pointer(ext.cDev), unsafe.Pointer(ext.cHost), ext.cPayload} {
		C.free(p)
	}
	for _, p := range ext.retired {
		C.free(p)
	}
	ext.retired = nil
	ext.cIDs, ext.cDirs, ext.cDev, ext.cHost, ext.cPayload, ext.copiesCap, ext.cPayloadCap = nil, nil, nil, nil, nil, 0, 0
}

// flushEvents ends the current step's batch of KV events (at commit).
func (h *handle) flushEvents() {
	if h.ext != nil && h.ext.rec != nil {
		h.ext.rec.Flush()
	}
}

// noTiers and noEvents say what a manager made without tiers or events lacks.
const (
	noTiers  = "tiers (create it with pagedkv_create_ex or pagedkv_hybrid_create_ex and opts.tiers)"
	noEvents = "KV events (create it with opts.events)"
)

// enterTiers is enter for a call that needs tiers (either kind).
func enterTiers(id C.pagedkv_manager, op string) (*handle, C.int32_t) {
	h, code := enter(id, op)
	return needs(h, code, id, op, h != nil && h.ext != nil && h.ext.tiers, noTiers)
}

// enterEvents is enter for a call that needs KV events (either kind).
func enterEvents(id C.pagedkv_manager, op string) (*handle, C.int32_t) {
	h, code := enter(id, op)
	return needs(h, code, id, op, h != nil && h.ext != nil && h.ext.rec != nil, noEvents)
}

// needs lets a call that entered h go on if has, else fails it with
// PAGEDKV_ERR_BAD_CONFIG: the manager was made without what.
func needs(h *handle, code C.int32_t, id C.pagedkv_manager, op string, has bool, what string) (*handle, C.int32_t) {
	if h == nil || has {
		return h, code
	}
	h.release()
	return nil, fail(C.PAGEDKV_ERR_BAD_CONFIG, fmt.Sprintf("pagedkv: %s: manager %d has no %s", op, uint64(id), what))
}

//export pagedkv_tier_copies_take
func pagedkv_tier_copies_take(id C.pagedkv_manager, out *C.pagedkv_tier_copies) (code C.int32_t) {
	h, code := enterTiers(id, "tier_copies")
	if h == nil {
		return code
	}
	defer h.exit(&code)
	if out == nil {
		return badArg("tier_copies: out is NULL")
	}
	e := h.ext
	e.copies = h.m.TierCopies(e.copies[:0])
	n := len(e.copies)
	if n > e.copiesCap {
		// New lists; the ones handed out before stay allocated until the
		// handle's memory is freed, so a stale view of them is never a
		// write into freed memory (docs/c-abi.md, "Lifetimes"). Doubling
		// keeps what is retired below what is in use.
		c := max(n, 2*e.copiesCap, 16)
		ids, dirs, dev, host := C.malloc(C.size_t(c)*8), C.malloc(C.size_t(c)*4), C.malloc(C.size_t(c)*4), C.malloc(C.size_t(c)*4)
		if ids == nil || dirs == nil || dev == nil || host == nil {
			for _, p := range [...]unsafe.Pointer{ids, dirs, dev, host} {
				C.free(p)
			}
			panic("cabi: out of C memory for tier copies")
		}
		if e.cIDs != nil {
			e.retired = append(e.retired, unsafe.Pointer(e.cIDs), unsafe.Pointer(e.cDirs), unsafe.Pointer(e.cDev), unsafe.Pointer(e.cHost))
		}
		e.cIDs, e.cDirs, e.cDev, e.cHost = (*C.uint64_t)(ids), (*C.int32_t)(dirs), (*C.int32_t)(dev), (*C.int32_t)(host)
		e.copiesCap = c
	}
	offloads := 0
	if n > 0 {
		ids, dirs := unsafe.Slice((*uint64)(unsafe.Pointer(e.cIDs)), n), unsafe.Slice((*int32)(unsafe.Pointer(e.cDirs)), n)
		dev, host := unsafe.Slice((*int32)(unsafe.Pointer(e.cDev)), n), unsafe.Slice((*int32)(unsafe.Pointer(e.cHost)), n)
		for i, c := range e.copies {
			ids[i], dirs[i], dev[i], host[i] = c.ID, int32(c.Dir), int32(c.Device), int32(c.Host)
			if c.Dir == tier.ToHost {
				offloads++
			}
		}
	}
	// Integer stores: the caller's struct may hold anything (see export).
	out.n, out.num_offloads = C.int64_t(n), C.int64_t(offloads)
	*(*uintptr)(unsafe.Pointer(&out.ids)) = uintptr(unsafe.Pointer(e.cIDs))
	*(*uintptr)(unsafe.Pointer(&out.dirs)) = uintptr(unsafe.Pointer(e.cDirs))
	*(*uintptr)(unsafe.Pointer(&out.device_pages)) = uintptr(unsafe.Pointer(e.cDev))
	*(*uintptr)(unsafe.Pointer(&out.host_pages)) = uintptr(unsafe.Pointer(e.cHost))
	return C.PAGEDKV_OK
}

//export pagedkv_complete_tier_copies
func pagedkv_complete_tier_copies(id C.pagedkv_manager, ids *C.uint64_t, n C.int64_t) (code C.int32_t) {
	h, code := enterTiers(id, "complete_tier_copies")
	if h == nil {
		return code
	}
	defer h.exit(&code)
	if code, ok := checkArray("complete_tier_copies", "ids", unsafe.Pointer(ids), n); !ok {
		return code
	}
	var list []uint64
	if n > 0 {
		list = unsafe.Slice((*uint64)(unsafe.Pointer(ids)), int(n))
	}
	if err := h.m.CompleteTierCopies(list...); err != nil {
		return failErr(err)
	}
	return C.PAGEDKV_OK
}

//export pagedkv_host_memory
func pagedkv_host_memory(id C.pagedkv_manager, data **C.uint8_t, pageBytes, numPages *C.int64_t) (code C.int32_t) {
	defer recoverTo(&code)
	// Lock-free: the host memory is fixed at creation.
	h, code := peek(id, "host_memory")
	if h == nil {
		return code
	}
	if h.ext == nil || !h.ext.tiers {
		return fail(C.PAGEDKV_ERR_BAD_CONFIG, fmt.Sprintf("pagedkv: host_memory: manager %d has no %s", uint64(id), noTiers))
	}
	if data == nil || pageBytes == nil || numPages == nil {
		return badArg("host_memory: data = %p, page_bytes = %p, num_pages = %p; all are required", data, pageBytes, numPages)
	}
	*(*uintptr)(unsafe.Pointer(data)) = uintptr(h.ext.hostMem) // pinned Go memory, the caller's, or nil
	*pageBytes, *numPages = C.int64_t(h.ext.hostPB), C.int64_t(h.ext.hostN)
	return C.PAGEDKV_OK
}

//export pagedkv_loading
func pagedkv_loading(id C.pagedkv_manager, rid C.uint64_t, loading *C.int32_t) (code C.int32_t) {
	h, code := enterTiers(id, "loading")
	if h == nil {
		return code
	}
	defer h.exit(&code)
	if loading == nil {
		return badArg("loading: loading is NULL")
	}
	if !h.m.Has(pagedkv.RequestID(rid)) {
		return failErr(fmt.Errorf("%w: loading of request %d", pagedkv.ErrUnknownRequest, uint64(rid)))
	}
	*loading = 0
	if h.m.Loading(pagedkv.RequestID(rid)) {
		*loading = 1
	}
	return C.PAGEDKV_OK
}

//export pagedkv_tier_flush
func pagedkv_tier_flush(id C.pagedkv_manager, timeoutMS C.int64_t) (code C.int32_t) {
	h, code := enterTiers(id, "tier_flush")
	if h == nil {
		return code
	}
	defer h.exit(&code)
	d, code, ok := millis("tier_flush", "timeout_ms", timeoutMS)
	if !ok {
		return code
	}
	ctx, cancel := context.WithTimeout(context.Background(), d)
	defer cancel()
	for _, s := range h.ext.stores {
		var err error
		switch s := s.(type) {
		case *redis.Store:
			err = s.Flush(ctx)
		case *disk.Store:
			err = s.Flush(ctx, false)
		}
		if err != nil {
			return badArg("tier_flush: the stores did not write their queues within timeout_ms = %d: %v", int64(timeoutMS), err)
		}
	}
	return C.PAGEDKV_OK
}

//export pagedkv_get_tier_stats
func pagedkv_get_tier_stats(id C.pagedkv_manager, out *C.pagedkv_tier_stats, size C.size_t) (code C.int32_t) {
	defer recoverTo(&code)
	s, code, ok := snapshot(id, "tier_stats", unsafe.Pointer(out))
	if !ok {
		return code
	}
	v := tierStatsList(s.Tiers)
	if len(v)*8 != C.sizeof_pagedkv_tier_stats {
		panic("cabi: pagedkv_tier_stats and TierStats have different field counts")
	}
	writeInt64s(unsafe.Pointer(out), size, v)
	return C.PAGEDKV_OK
}

// tierStatsList is s in pagedkv_tier_stats' field order.
func tierStatsList(s pagedkv.TierStats) []int64 {
	r := s.Remote
	v := []int64{int64(s.HostPages), int64(s.HostUsedPages), int64(s.InFlight),
		s.HostHitTokens, s.RemoteHitTokens, s.OffloadedPages, s.OnloadedPages,
		s.BytesToHost, s.BytesToDevice, s.DroppedPages, s.HostFull, s.RemoteFetched, s.RemoteStored,
		r.Lookups, r.Requested, r.Hits, r.Misses, r.Rejected, r.Errors, r.Timeouts, r.Stored, r.Dropped, r.BytesIn, r.BytesOut}
	return append(v, r.RejectedBy[:]...)
}

//export pagedkv_drain_events
func pagedkv_drain_events(id C.pagedkv_manager, data **C.uint8_t, n *C.int64_t) (code C.int32_t) {
	h, code := enterEvents(id, "drain_events")
	if h == nil {
		return code
	}
	defer h.exit(&code)
	if data == nil || n == nil {
		return badArg("drain_events: data = %p, len = %p; both are required", data, n)
	}
	e := h.ext
	if e.pub != nil {
		return fail(C.PAGEDKV_ERR_BAD_CONFIG, fmt.Sprintf("pagedkv: drain_events: manager %d publishes its KV events at %s itself (events.endpoint)", uint64(id), e.pub.Endpoint()))
	}
	b := nextBatch(e.rec, e.q)
	if b == nil {
		*(*uintptr)(unsafe.Pointer(data)) = 0
		*n = 0
		return C.PAGEDKV_OK
	}
	e.payload = e.enc.AppendBatch(e.payload[:0], b, e.rank)
	e.q.Done(b)
	if len(e.payload) > e.cPayloadCap {
		c := max(len(e.payload), 2*e.cPayloadCap)
		p := C.realloc(e.cPayload, C.size_t(c))
		if p == nil {
			panic("cabi: out of C memory for a KV event batch")
		}
		e.cPayload, e.cPayloadCap = p, c
	}
	C.memcpy(e.cPayload, unsafe.Pointer(unsafe.SliceData(e.payload)), C.size_t(len(e.payload)))
	*(*uintptr)(unsafe.Pointer(data)) = uintptr(e.cPayload)
	*n = C.int64_t(len(e.payload))
	return C.PAGEDKV_OK
}

// nextBatch is the next queued batch, else the current step's (ended
// now), else nil.
func nextBatch(rec *events.Recorder, q *events.Queue) *events.Batch {
	if b := q.TryNext(); b != nil {
		return b
	}
	rec.Flush()
	return q.TryNext()
}

//export pagedkv_get_events_stats
func pagedkv_get_events_stats(id C.pagedkv_manager, out *C.pagedkv_events_stats, size C.size_t) (code C.int32_t) {
	h, code := enterEvents(id, "events_stats")
	if h == nil {
		return code
	}
	defer h.exit(&code)
	if out == nil {
		return badArg("events_stats: out is NULL")
	}
	s := h.ext.rec.Stats()
	var p events.PublisherStats
	if h.ext.pub != nil {
		p = h.ext.pub.Stats()
	}
	v := [...]int64{s.Batches, s.Events, s.Pages, s.DroppedSteps, s.DroppedEvents, s.Resyncs,
		p.Batches, p.Bytes, p.LastSeq, p.Replays, p.Replayed, p.SendErrors, p.PeerErrors}
	if unsafe.Sizeof(v) != C.sizeof_pagedkv_events_stats {
		panic("cabi: pagedkv_events_stats and RecorderStats have different field counts")
	}
	writeInt64s(unsafe.Pointer(out), size, v[:])
	return C.PAGEDKV_OK
}

//export pagedkv_events_endpoint
func pagedkv_events_endpoint(id C.pagedkv_manager, replay C.int32_t, dst *C.char, capacity C.int64_t, n *C.int64_t) (code C.int32_t) {
	defer recoverTo(&code)
	// Lock-free: the endpoints are fixed at creation (register).
	h, code := peek(id, "events_endpoint")
	if h == nil {
		return code
	}
	if h.ext == nil || h.ext.rec == nil {
		return fail(C.PAGEDKV_ERR_BAD_CONFIG, fmt.Sprintf("pagedkv: events_endpoint: manager %d has no %s", uint64(id), noEvents))
	}
	if code, ok := checkArray("events_endpoint", "dst", unsafe.Pointer(dst), capacity); !ok {
		return code
	}
	switch {
	case n == nil:
		return badArg("events_endpoint: n is NULL")
	case replay != 0 && replay != 1:
		return badArg("events_endpoint: replay = %d, want 0 (the PUB socket) or 1 (the replay socket)", int32(replay))
	case h.endpoints[0] == "":
		return fail(C.PAGEDKV_ERR_BAD_CONFIG, fmt.Sprintf("pagedkv: events_endpoint: manager %d drains its KV events (no events.endpoint)", uint64(id)))
	}
	ep := h.endpoints[replay]
	if capacity > 0 {
		copy(unsafe.Slice((*byte)(unsafe.Pointer(dst)), int(capacity)), ep)
	}
	*n = C.int64_t(len(ep))
	return C.PAGEDKV_OK
}

//export pagedkv_cached_hashes
func pagedkv_cached_hashes(id C.pagedkv_manager, medium C.int32_t, dst *C.uint64_t, capacity C.int64_t, n *C.int64_t) (code C.int32_t) {
	h, code := enter(id, "cached_hashes")
	if h == nil {
		return code
	}
	defer h.exit(&code)
	if code, ok := checkArray("cached_hashes", "dst", unsafe.Pointer(dst), capacity); !ok {
		return code
	}
	if n == nil {
		return badArg("cached_hashes: n is NULL")
	}
	if h.ext == nil {
		h.ext = &extras{}
	}
	e := h.ext
	switch medium {
	case C.PAGEDKV_MEDIUM_GPU:
		m, ok := h.m.(*pagedkv.Manager)
		if !ok {
			// A hybrid manager has a prefix cache per group and no one
			// list of device hashes (its KV events name each group's).
			return fail(C.PAGEDKV_ERR_BAD_HANDLE, fmt.Sprintf("pagedkv: cached_hashes: manager %d is a hybrid manager; medium = PAGEDKV_MEDIUM_GPU (0) needs one made by pagedkv_create (PAGEDKV_MEDIUM_CPU works for both)", uint64(id)))
		}
		e.hashes = m.CachedHashes(e.hashes[:0])
	case C.PAGEDKV_MEDIUM_CPU:
		e.hashes = h.m.HostCachedHashes(e.hashes[:0])
	default:
		return badArg("cached_hashes: medium = %d, want PAGEDKV_MEDIUM_GPU (0) or PAGEDKV_MEDIUM_CPU (1)", int32(medium))
	}
	if capacity > 0 {
		copy(unsafe.Slice((*uint64)(unsafe.Pointer(dst)), int(capacity)), e.hashes)
	}
	*n = C.int64_t(len(e.hashes))
	return C.PAGEDKV_OK
}
