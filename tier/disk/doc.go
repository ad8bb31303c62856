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
// overwrites the victim of one of prefixcache's eviction policies
// (Config.Eviction). After a crash, Open rebuilds the index from the slots
// that verify and reports what it dropped (Recovery). Open opens LOCK and
// the segment files relative to the directory without following links,
// and refuses anything but a regular file (ErrNotRegularFile): the store
// never reads, writes or creates a file outside its directory.
// docs/disk-tier.md describes the tier, its crash safety and its measured
// throughput.
package disk
