package pagedkv

// Audit checks every invariant of the Manager and the packages under it, in
// time linear in pages and tokens, and returns the first violation found:
//
//   - the allocator, page table and prefix cache each pass their own
//     CheckInvariants (free stack, reference counts, tree, hash chains,
//     LRU lists, idle bits);
//   - every page's reference count is exactly the number of requests that
//     hold it plus one if it is cached, so no page is both free and
//     referenced, none is leaked, and none is freed twice;
//   - each running request holds exactly the pages its computed (and, during
//     a step, reserved) tokens need, preempted requests hold none;
//   - each request's cache chain, while not cut, names cached pages whose
//     tokens are the request's own tokens, page by page;
//   - the page partition of Stats adds up;
//   - with tiers: the host pool passes its CheckInvariants, every tier copy
//     in flight holds one reference on its device page and matches its
//     host page's state (an offload writes it, an onload reads it), each
//     request's loading count equals its onloads in flight, and a device
//     page has a tier identity iff it is cached.
//
// Tests and fuzzers call it after every operation. It allocates.
func (m *Manager) Audit() error { return m.core.audit() }
