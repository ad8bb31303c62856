// Package disk is the local-disk tier: a [tier.RemoteStore] over
// preallocated segment files of page-sized slots in one directory.
//
// Each slot holds a checksummed slot header (sequence number, the value's
// checksum) and the tier page value, its page bytes on a 4 KiB boundary
// (format version 2, format.go). Store encodes a page into a queue buffer
// and returns; one writer goroutine gathers a burst of pages and writes
// each run of consecutive slots with one pwritev, fsyncing every
// Config.SyncEvery pages. Fetch reads a run of slots with one preadv and
// verifies every page before serving it. When no slot is free the writer
// overwrites the victim of one of prefixcache's eviction policies
// (Config.Eviction). After a crash, Open rebuilds the index from the slots
// that verify and reports what it dropped (Recovery). docs/tiers.md
// describes the tier, its crash safety and its measured throughput.
package disk
