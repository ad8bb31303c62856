// Command cabi is pagedkv's C ABI: built with -buildmode=c-shared (or
// c-archive) it is libpagedkv, the Manager for engines written in C, C++,
// Rust or Python (python/pagedkv binds it with ctypes). pagedkv.h is the
// stable header; docs/c-abi.md is the contract.
//
// Ownership. A manager is a handle: a number in a registry, never a Go
// pointer, so C holds nothing the Go garbage collector tracks. The handle
// owns the Manager, a runtime.Pinner, and a C array of cascade level
// descriptors. The arrays of a plan are the Manager's own reused buffers
// (Go memory, zero copy); before a plan is handed out, the handle pins every
// buffer the plan points into, so cgo's rules allow C to keep the pointers
// and the collector neither frees nor moves them. Pins are added only when a
// successful Reserve hands out a buffer that is not pinned yet (a buffer
// grew); the previous step's buffers stay pinned, unused, until the
// handle's memory is freed, so a stale pointer into them (valid only
// until the next successful reserve) never reaches freed Go memory.
// Destroy frees it all; pagedkv_destroy_keep_memory ends the Manager and
// keeps the memory for pagedkv_free_memory (the Python package, whose
// numpy views may outlive close()). Nothing the caller passes in is kept
// after a call returns: the Manager copies what it keeps (prompts, tokens,
// namespaces).
//
// Tiers and KV events (tiers.go). pagedkv_create_ex and
// pagedkv_hybrid_create_ex take one options struct for both kinds of
// manager; the handle then owns the stores below the host tier, the KV
// event Recorder (and its queue, or a Publisher), and C buffers for the
// tier copy lists and the drained event payloads, all closed or freed by
// destroy. Host memory the library allocates is pinned for the handle's
// life.
//
// Errors. Every export returns a code (one per Go sentinel error, see
// codeOf) and writes the error's text into the calling thread's buffer
// (errbuf.c: exported Go functions run on the calling C thread). Every
// export recovers panics: a recovered panic is returned as
// PAGEDKV_ERR_INTERNAL and poisons the handle, because the Manager may have
// been left half-changed. Argument checks that C needs and Go does not
// (NULL pointers, negative lengths, values that do not fit Go's types) come
// first, so a failed call changes nothing, as in Go.
//
// Concurrency. As in Go, a Manager belongs to one thread at a time: each
// handle has a busy flag, and a call that finds it set returns
// PAGEDKV_ERR_BUSY instead of racing, at once or, after
// pagedkv_set_busy_timeout, once it has waited that long for the flag
// (woken by each release, not polling). Lock-free, on any thread at any
// time: the stats calls (the Manager's lock-free snapshot) and the calls
// that read what is fixed at creation (pagedkv_hybrid_num_groups,
// pagedkv_host_memory, pagedkv_events_endpoint, pagedkv_set_busy_timeout:
// copies of it taken by register). The registry is guarded by a
// read-write mutex.
//
// # Invariants
//
//   - A failed call changes nothing: C-only mistakes are refused before
//     the Manager sees them, and the Manager's own failures change nothing.
//   - Every code is the one mapped from the Go error (codeOf), and the
//     message is the calling thread's own.
//   - A plan's arrays stay valid and unchanged until the next successful
//     reserve (or destroy); no pointer handed out ever reaches freed or
//     moved Go memory (buffers that grew stay pinned, C arrays that grew
//     are retired, not reallocated, until the handle's memory is freed).
//   - After a recovered panic the handle is poisoned: every later call on
//     it returns PAGEDKV_ERR_INTERNAL until it is destroyed.
//   - The C ABI and the Go Manager agree call for call (FuzzABI, and the
//     Go-written traces the Python tests replay).
package main

/*
#cgo CFLAGS: -O2 -Wall
#include <stdlib.h>
#define PAGEDKV_NO_PROTOTYPES
#include "pagedkv.h"
void pagedkv_set_error(const char *msg, size_t n);
*/
import "C"

import (
	"errors"
	"fmt"
	"runtime"
	"sync"
	"sync/atomic"
	"time"
	"unsafe"

	pkgerrors "github.com/pkg/errors"

	"github.com/pagedkv/pagedkv"
)

func main() {}

// maxLen bounds every length passed in: far above any real batch or
// prompt, far below what would overflow a Go slice of C memory.
const maxLen = 1 << 31

// handle is one manager and what the C ABI keeps for it.
type handle struct {
	busy atomic.Bool
	// wait is how long a call that finds busy set waits for it
	// (pagedkv_set_busy_timeout): 0 not at all, < 0 as long as it takes,
	// else nanoseconds. freed gets a token, without blocking, each time busy
	// is cleared, waking one waiting call; destroy sets dead and closes it.
	wait  atomic.Int64
	freed chan struct{}
	dead  atomic.Bool
	// numGroups and endpoints are fixed at creation (register copies
	// them), so that the lock-free calls never read the Manager.
	numGroups int
	endpoints [2]string
	// m is the manager, dense or hybrid (a Manager, or a HybridManager
	// when hybrid is set; the entry points of one kind refuse the other).
	m        pagedkv.KVManager
	clock    *cabiClock // the manager's Config.Clock
	hybrid   bool
	poisoned bool

	// pinner pins every buffer a successful reserve ever handed out (the
	// set pinSet; their first elements) until the handle's memory is
	// freed; pinned are those of the last one. cur is scratch.
	pinner      runtime.Pinner
	pinSet      map[unsafe.Pointer]struct{}
	pinned, cur []unsafe.Pointer
	// retiredC are C arrays handed out before (cascade level arrays that
	// grew), freed with the handle's memory.
	retiredC []unsafe.Pointer
	// outs is export's scratch: the descriptors it writes after pinning.
	outs []arrayOut

	// plans holds what each exported plan needs beyond the Manager's own
	// buffers: one for a dense handle, one per group for a hybrid one.
	plans []planExport
	// draftLists is reserve_spec's scratch: views of the caller's drafts
	// during the call, cleared after it.
	draftLists [][]int32
	// ext holds the tiers, KV events and their buffers (tiers.go); nil
	// for a manager made without options.
	ext *extras
}

// planExport is the C ABI's own memory behind one exported plan.
type planExport struct {
	// levels is a C array of levelsCap descriptors for cascade plans.
	levels    *C.pagedkv_level
	levelsCap int
	// rows is the cascade's query-row permutation, computed per plan.
	rows []int32
	// windowLeft is the plan's CascadeWindowLeft as int32 (hybrid groups).
	windowLeft []int32
	// blockTables and stride are the plan's BlockTables (pinned by
	// export) and BlockTablesStride, for pagedkv_get_block_tables.
	blockTables []int32
	stride      int
	// stateIndices is a state group's Plan.StateIndices (pinned by
	// exportHybrid), for pagedkv_hybrid_state_indices.
	stateIndices []int32
}

// register adds h to the registry and returns its id.
func register(h *handle) C.pagedkv_manager {
	h.freed = make(chan struct{}, 1)
	h.numGroups = h.m.NumGroups()
	if h.ext != nil && h.ext.pub != nil {
		h.endpoints = [2]string{h.ext.pub.Endpoint(), h.ext.pub.ReplayEndpoint()}
	}
	registry.Lock()
	registry.next++
	id := registry.next
	registry.handles[id] = h
	registry.Unlock()
	return C.pagedkv_manager(id)
}

var registry struct {
	sync.RWMutex
	next    uint64
	handles map[uint64]*handle
	// kept are handles destroyed by pagedkv_destroy_keep_memory whose
	// memory is not freed yet (pagedkv_free_memory).
	kept map[uint64]*handle
}

func lookup(id C.pagedkv_manager) *handle {
	registry.RLock()
	h := registry.handles[uint64(id)]
	registry.RUnlock()
	return h
}

// enter takes handle id (of either kind) for one call, or returns the
// code and message of why it cannot.
func enter(id C.pagedkv_manager, op string) (*handle, C.int32_t) {
	h := lookup(id)
	if h == nil {
		return nil, fail(C.PAGEDKV_ERR_BAD_HANDLE, fmt.Sprintf("pagedkv: %s: no manager with handle %d", op, uint64(id)))
	}
	if !h.acquire() {
		if h.dead.Load() {
			return nil, fail(C.PAGEDKV_ERR_BAD_HANDLE, fmt.Sprintf("pagedkv: %s: manager %d was destroyed while the call waited for it", op, uint64(id)))
		}
		return nil, fail(C.PAGEDKV_ERR_BUSY, fmt.Sprintf("pagedkv: %s: manager %d is in use by another thread%s", op, uint64(id), waited(h.wait.Load())))
	}
	if h.poisoned {
		h.release()
		return nil, fail(C.PAGEDKV_ERR_INTERNAL, fmt.Sprintf("pagedkv: %s: manager %d was poisoned by an earlier internal error; destroy it", op, uint64(id)))
	}
	return h, C.PAGEDKV_OK
}

// enterDense is enter for a call only a dense manager has.
func enterDense(id C.pagedkv_manager, op string) (*handle, C.int32_t) {
	return enterKind(id, op, false)
}

// enterHybrid is enter for a call only a hybrid manager has.
func enterHybrid(id C.pagedkv_manager, op string) (*handle, C.int32_t) {
	return enterKind(id, op, true)
}

func enterKind(id C.pagedkv_manager, op string, hybrid bool) (*handle, C.int32_t) {
	h, code := enter(id, op)
	if h == nil || h.hybrid == hybrid {
		return h, code
	}
	h.release()
	return nil, wrongKind(id, op, hybrid)
}

// acquire sets h's busy flag for a call, waiting up to h.wait for the
// call in flight to clear it; false if it did not (or h was destroyed).
func (h *handle) acquire() bool {
	if h.busy.CompareAndSwap(false, true) {
		return true
	}
	w := h.wait.Load()
	if w == 0 {
		return false
	}
	var deadline <-chan time.Time
	if w > 0 {
		t := time.NewTimer(time.Duration(w))
		defer t.Stop()
		deadline = t.C
	}
	for {
		select {
		case <-h.freed:
		case <-deadline:
			return !h.dead.Load() && h.busy.CompareAndSwap(false, true)
		}
		if h.dead.Load() {
			return false
		}
		if h.busy.CompareAndSwap(false, true) {
			return true
		}
	}
}

// release clears h's busy flag and wakes one waiting call.
func (h *handle) release() {
	h.busy.Store(false)
	select {
	case h.freed <- struct{}{}:
	default:
	}
}

// kill ends h for destroy (whose call holds the busy flag, never released):
// every call waiting for the flag returns PAGEDKV_ERR_BAD_HANDLE.
func (h *handle) kill() {
	h.dead.Store(true)
	close(h.freed)
}

// waited is the BUSY message's note of how long the call waited.
func waited(ns int64) string {
	if ns == 0 {
		return ""
	}
	return fmt.Sprintf(" (waited pagedkv_set_busy_timeout's %v)", time.Duration(ns))
}

// peek looks handle id up for a lock-free call, which reads only what is
// fixed at creation.
func peek(id C.pagedkv_manager, op string) (*handle, C.int32_t) {
	h := lookup(id)
	if h == nil {
		return nil, fail(C.PAGEDKV_ERR_BAD_HANDLE, fmt.Sprintf("pagedkv: %s: no manager with handle %d", op, uint64(id)))
	}
	return h, C.PAGEDKV_OK
}

// wrongKind fails a call that needs a hybrid (or a dense) manager on a
// handle of the other kind.
func wrongKind(id C.pagedkv_manager, op string, needHybrid bool) C.int32_t {
	kind, want := "dense", "pagedkv_hybrid_create"
	if !needHybrid {
		kind, want = "hybrid", "pagedkv_create"
	}
	return fail(C.PAGEDKV_ERR_BAD_HANDLE, fmt.Sprintf("pagedkv: %s: manager %d is a %s manager; this call needs one made by %s",
		op, uint64(id), kind, want))
}

// exit ends a call that entered h: it turns a panic into
// PAGEDKV_ERR_INTERNAL (and poisons h) and releases the busy flag. It must
// be deferred directly so that recover works.
func (h *handle) exit(code *C.int32_t) {
	if r := recover(); r != nil {
		h.poisoned = true
		*code = fail(C.PAGEDKV_ERR_INTERNAL, internalError("pagedkv: internal error (the manager is poisoned; destroy it)", r))
	}
	h.release()
}

// recoverTo turns a panic outside any handle into PAGEDKV_ERR_INTERNAL.
func recoverTo(code *C.int32_t) {
	if r := recover(); r != nil {
		*code = fail(C.PAGEDKV_ERR_INTERNAL, internalError("pagedkv: internal error", r))
	}
}

// internalError is the message of PAGEDKV_ERR_INTERNAL for a recovered
// panic r: "prefix: r", then the stack where it was recovered (the panicking
// frames are still on it), so that the bug report names the panic site. It
// is the one place where a stack trace crosses an API boundary, and the one
// use of github.com/pkg/errors (docs/architecture.md, "Conventions"). The
// C side keeps the first 1023 bytes.
func internalError(prefix string, r any) string {
	return fmt.Sprintf("%+v", pkgerrors.Errorf("%s: %v", prefix, r))
}

// fail records msg as the calling thread's last error and returns code.
func fail(code C.int32_t, msg string) C.int32_t {
	if len(msg) == 0 {
		C.pagedkv_set_error(nil, 0)
	} else {
		C.pagedkv_set_error((*C.char)(unsafe.Pointer(unsafe.StringData(msg))), C.size_t(len(msg)))
	}
	return code
}

// codes maps each sentinel error of package pagedkv to its C code. The
// first match wins.
var codes = [...]struct {
	err  error
	code C.int32_t
}{
	{pagedkv.ErrBadConfig, C.PAGEDKV_ERR_BAD_CONFIG},
	{pagedkv.ErrOutOfPages, C.PAGEDKV_ERR_OUT_OF_PAGES},
	{pagedkv.ErrUnknownRequest, C.PAGEDKV_ERR_UNKNOWN_REQUEST},
	{pagedkv.ErrRequestExists, C.PAGEDKV_ERR_REQUEST_EXISTS},
	{pagedkv.ErrPreempted, C.PAGEDKV_ERR_PREEMPTED},
	{pagedkv.ErrNotPreempted, C.PAGEDKV_ERR_NOT_PREEMPTED},
	{pagedkv.ErrStepPending, C.PAGEDKV_ERR_STEP_PENDING},
	{pagedkv.ErrNoStep, C.PAGEDKV_ERR_NO_STEP},
	{pagedkv.ErrBadArgument, C.PAGEDKV_ERR_BAD_ARGUMENT},
	{pagedkv.ErrNotCached, C.PAGEDKV_ERR_NOT_CACHED},
	{pagedkv.ErrPinLimit, C.PAGEDKV_ERR_PIN_LIMIT},
	{pagedkv.ErrUnknownPin, C.PAGEDKV_ERR_UNKNOWN_PIN},
	{pagedkv.ErrLoading, C.PAGEDKV_ERR_LOADING},
}

// failErr records err and returns its code; an error of no known class is
// PAGEDKV_ERR_INTERNAL (a bug, but the Manager changed nothing, so the
// handle is not poisoned).
func failErr(err error) C.int32_t {
	for _, c := range codes {
		if errors.Is(err, c.err) {
			return fail(c.code, err.Error())
		}
	}
	return fail(C.PAGEDKV_ERR_INTERNAL, "pagedkv: unclassified error: "+err.Error())
}

func badArg(format string, args ...any) C.int32_t {
	return fail(C.PAGEDKV_ERR_BAD_ARGUMENT, fmt.Sprintf("pagedkv: bad argument: "+format, args...))
}

// checkArray validates a C array argument: n in [0, maxLen), and p not
// NULL when n > 0.
func checkArray(op, name string, p unsafe.Pointer, n C.int64_t) (C.int32_t, bool) {
	switch {
	case n < 0 || n >= maxLen:
		return badArg("%s: %s length %d, want 0..%d", op, name, int64(n), maxLen-1), false
	case p == nil && n > 0:
		return badArg("%s: %s is NULL with length %d", op, name, int64(n)), false
	}
	return C.PAGEDKV_OK, true
}

// int32s views C memory as a Go slice for the duration of a call.
func int32s(p *C.int32_t, n C.int64_t) []int32 {
	if n == 0 {
		return nil
	}
	return unsafe.Slice((*int32)(unsafe.Pointer(p)), int(n))
}

func goBytes(op, name string, p *C.char, n C.int64_t) (string, C.int32_t, bool) {
	if code, ok := checkArray(op, name, unsafe.Pointer(p), n); !ok {
		return "", code, false
	}
	if n == 0 {
		return "", C.PAGEDKV_OK, true
	}
	return C.GoStringN(p, C.int(n)), C.PAGEDKV_OK, true
}

func namespace(op string, ns *C.pagedkv_namespace) (pagedkv.Namespace, C.int32_t, bool) {
	var out pagedkv.Namespace
	if ns == nil {
		return out, C.PAGEDKV_OK, true
	}
	var code C.int32_t
	var ok bool
	if out.Tenant, code, ok = goBytes(op, "ns.tenant", ns.tenant, ns.tenant_len); !ok {
		return out, code, false
	}
	if out.LoRA, code, ok = goBytes(op, "ns.lora", ns.lora, ns.lora_len); !ok {
		return out, code, false
	}
	if out.Salt, code, ok = goBytes(op, "ns.salt", ns.salt, ns.salt_len); !ok {
		return out, code, false
	}
	return out, C.PAGEDKV_OK, true
}

// The C structs must match Go's layout where the ABI shares memory.
func init() {
	var c pagedkv.CopyOp
	if unsafe.Sizeof(c) != 12 || unsafe.Offsetof(c.Dst) != 4 || unsafe.Offsetof(c.Entries) != 8 {
		panic("cabi: pagedkv.CopyOp no longer matches pagedkv_copy")
	}
	if unsafe.Sizeof(pagedkv.RequestID(0)) != 8 || unsafe.Sizeof(pagedkv.PageID(0)) != 4 {
		panic("cabi: RequestID or PageID changed size")
	}
	registry.handles = make(map[uint64]*handle)
	registry.kept = make(map[uint64]*handle)
}

// pagedkv_set_busy_timeout sets how long a call on handle id that finds
// another thread's call in flight waits for it before returning
// PAGEDKV_ERR_BUSY: 0 (the default) not at all, 1..maxMillis
// milliseconds, or -1 as long as it takes. Lock-free.
//
//export pagedkv_set_busy_timeout
func pagedkv_set_busy_timeout(id C.pagedkv_manager, timeoutMS C.int64_t) (code C.int32_t) {
	defer recoverTo(&code)
	h, code := peek(id, "set_busy_timeout")
	if h == nil {
		return code
	}
	if timeoutMS == -1 {
		h.wait.Store(-1)
		return C.PAGEDKV_OK
	}
	d, code, ok := millis("set_busy_timeout", "timeout_ms", timeoutMS)
	if !ok {
		return fail(C.PAGEDKV_ERR_BAD_ARGUMENT, fmt.Sprintf("pagedkv: bad argument: set_busy_timeout: timeout_ms = %d, want 0 (BUSY at once), 1..%d, or -1 (wait as long as it takes)", int64(timeoutMS), int64(maxMillis)))
	}
	h.wait.Store(int64(d))
	return code
}
