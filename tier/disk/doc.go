// Package disk is the local-disk tier: a [tier.RemoteStore] over
// preallocated segment files of page-sized slots in one directory.
//
// Each slot holds a checksummed slot header (sequence number, the value's
// checksum) and the tier page value, its page bytes on a 4 KiB boundary
// (format version 2, format.go). Store encodes a page into a queue buffer
// and returns; one writer goroutine takes the queued pages once there are
// 1 MiB of them and writes each run of consecutive slots with one pwritev,
// fsyncing every Config.SyncEvery pages, while Store encodes the next
// ones. Fetch reads a run of slots in pieces of about 512 KiB, one preadv
// each, shared with a read helper goroutine so that one piece is checked
// while the next is read (read.go), and verifies every page before
// serving it. When no slot is free the writer
// overwrites the victim of one of evict's eviction policies
// (Config.Eviction). After a crash, Open rebuilds the index from the slots
// that verify and reports what it dropped (Recovery). Open opens LOCK and
// the segment files relative to the directory without following links,
// and refuses anything but a regular file (ErrNotRegularFile): the store
// never reads, writes or creates a file outside its directory.
// docs/disk-tier.md describes the tier, its crash safety and its measured
// throughput.
//
// # Invariants
//
//   - Every slot is free (on the free list exactly once), being written,
//     or ready; the index holds exactly the ready slots, each at its own
//     page's digest, with a sequence in [1, next); the eviction policy
//     tracks exactly the ready slots ([Store.CheckInvariants]).
//   - A page is served only if its slot's header, its sequence, its value's
//     checksum over every byte and its identity (namespace, group, format,
//     digest, parent, tokens) all verify, on every Fetch; the pages served
//     are the leading pages of the lookup that do.
//   - After a crash at any point Open serves only pages whose write
//     completed, each exactly as written: the header names the value's
//     checksum, so a cut or mixed write never verifies.
//   - A slot being read is pinned: the writer does not overwrite it until
//     the read is done.
//   - Store never blocks, and nothing is read, written or created outside
//     Config.Dir.
//
// # Concurrency
//
// A Store is safe for concurrent use: its state is under one mutex, the
// writer and the read helper are its own goroutines, and Fetch may run
// while the writer writes.
package disk
