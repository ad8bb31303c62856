// Package redis is the remote tier on Redis: a [tier.RemoteStore] that
// shares prefix pages between Managers (replicas) through one Redis server
// or cluster, with the client github.com/redis/go-redis/v9 (this package is
// its only importer).
//
// # Keys
//
//	pkv:{TAG}:NAMESPACE:FORMAT:GROUP:DIGEST
//
// NAMESPACE is [Config.Namespace] (the deployment: model and revision),
// FORMAT the page format (layout, dtype, page size, heads, head dim,
// layers), GROUP the layer group ([Config.Group]), DIGEST the page's chain
// digest in hex (package tier). TAG is Redis Cluster's hash tag: the page's
// own digest by default (pages spread over every shard), or the digest of
// the first page of its prefix with [Config.TagByChain], so that one
// request's chain lives on one shard and a cluster can serve its lookup in
// one round trip.
//
// # Values
//
// A value is the page's bytes with everything needed to prove them the
// right ones: magic and version, the format, the namespace and group, the
// page's digest and its parent's, its tokens, the bytes, and a CRC-32C over
// all of it ([Encode], [Decode]). A page with a retention hint carries it
// in a 24-byte field (flags bit 0x02: its level, hint, duration and the
// wall-clock deadline of its level); a fetch hands what is left of it to
// the Manager, and with [Config.Expiry] the key's TTL is Expiry plus what
// is left (docs/retention.md, "Below the device"). Every fetched value is decoded strictly
// (exact lengths, no trailing bytes, checksum) and then compared with what
// the Manager asked for: namespace, group and format (a foreign value),
// digest, parent and tokens (a stale value or a key collision). Anything
// that does not match is rejected (counted by reason, its key logged) and
// never served; the Manager recomputes the page.
//
// # Writes, lookups and failures
//
// [Store.Store] encodes the page into one of [Config.QueueLen] buffers and
// queues it for a background writer that sends batches as pipelined SETs
// (write-behind); when every buffer is in use it drops the page and counts
// it. Memory limits and expiry are left to Redis (maxmemory with
// allkeys-lru; [Config.Expiry] optionally sets a TTL).
//
// [Store.Fetch] sends one pipeline for a prefix's pages, TYPE and
// GETRANGE (at most one byte past a page's encoded length) per page, and
// returns the leading pages found and verified: a value of another
// length or a key of another type is refused before its bytes are read,
// and ends the served prefix at its page. Rejections are counted by
// reason and the latest keep their key ([tier.RejectionLog], in
// [Store.Stats]). It honours the caller's
// deadline (the client runs with context timeouts enabled and without
// retries): on a timeout, a refused connection or a protocol error it
// returns what it has verified so far (nothing, for a pipeline that did
// not answer) and counts the failure. It never blocks past the deadline.
//
// # Invariants
//
//   - Nothing wrong is served: a fetched page is served only if its value
//     decodes strictly and verifies as the page asked for, and the pages
//     served are the leading pages of the lookup that did (a rejected page
//     ends the served prefix there).
//   - A lookup never reads more than a page's encoded length with a
//     retention field plus one byte per key, whatever the server holds
//     (TYPE, then GETRANGE), and
//     decoding n bytes allocates at most 2n + 4096 bytes
//     (FuzzDecodeValue).
//   - [Store.Store] never blocks: with every one of the [Config.QueueLen]
//     buffers in use the page is dropped and counted; [New] refuses a
//     queue whose buffers would pass [MaxQueueBytes] before allocating.
//   - A failed write batch is counted, never retried: the store is a cache.
//
// # Concurrency
//
// A Store is safe for concurrent use; its counters are atomics.
package redis
