// Package tier names what the storage tiers below the device page pool share:
// where a page lives ([Medium]), which way a copy goes ([Direction]), the
// identity of a cached page that outlives its device page ([Digest], a
// SHA-256 chain over the namespace and the prefix's tokens), the byte format
// of a page off the device ([PageFormat]), the interface of a remote
// store ([RemoteStore]), and the record of the values a store refused
// ([RejectionLog]: counts per [RejectReason] and a bounded log of recent
// keys).
//
// # Page identity
//
// On the device a cached page is known by its page ID and its parent page
// (package prefixcache). Below the device there is no parent page, so a page
// is named by the digest of everything before and in it:
//
//	d_{-1} = SHA-256("pagedkv/tier/ns/v1" || canonical namespace encoding)
//	d_i    = SHA-256("pagedkv/tier/page/v1" || d_{i-1} || tokens of page i, little-endian int32)
//
// The digest does not depend on a seed, a process or a page ID, so two
// Managers (two replicas) name the same prefix the same way. A tier serves a
// page for digest d_i only if the stored entry also names d_{i-1} as its
// parent and holds exactly the page's tokens; the requester computed both
// from its own tokens, so serving another prefix's K/V would take a SHA-256
// collision.
//
// # Invariants
//
//   - A digest depends only on the namespace's encoding and the tokens up
//     to the page's end: every process computes the same one (a test pins
//     a value computed independently with Python's hashlib).
//   - A page value is decoded strictly ([DecodeValue]: exact lengths,
//     nothing after the checksum, a CRC-32C over every byte) and
//     [Value.Verify] accepts it only as the very page asked for: the same
//     format, namespace and group, digest, parent digest and tokens.
//   - A page's [Retention] rides in its value only when it has one (flags
//     bit 0x02, a 24-byte field checked on decode: level, hint, reserved
//     zeros, duration, deadline); a value without one is byte for byte
//     what it was before the field existed. [Lapses] orders deadlines,
//     ties by id, allocating nothing once made.
//   - [PageFormat.Validate] accepts only formats whose page fits
//     [MaxPageBytes], multiplying one factor at a time so that no geometry
//     wraps int64.
//   - A [Chain]'s Fetch serves a contiguous prefix: each store is asked
//     only for the pages after the stores above it served, and what a
//     lower store served is stored into every store above it.
//   - [FetchMedia] names, for each page it filled, the medium of the store
//     that served it (a Chain's stores' own, nested chains included; a
//     store without a Medium method is [Remote]), so per-request cache
//     accounting can tell a disk read from a remote one.
//   - A [RejectionLog] counts every rejection by reason and keeps at most
//     [RecentRejections] distinct key-and-reason pairs.
//
// # Concurrency
//
// The functions and types here are values, except [RejectionLog], which is
// safe for concurrent use (a mutex, taken only on a rejection and in
// Stats); [RemoteStore] implementations state their own rules (the Redis
// store is safe for concurrent use).
package tier
