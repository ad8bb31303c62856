// Package events publishes a Manager's prefix-cache changes as KV-cache
// events in vLLM's wire format, so that routers built for vLLM (llm-d's
// KV-cache indexer, NVIDIA Dynamo's KV router, SGLang's router, or package
// kvindex here) can send each request to the replica that already holds
// its prefix. docs/events.md states the exact encoding and the vLLM
// version it matches.
//
// # Pieces
//
// A [Recorder] is the Manager's sink ([prefixcache.Sink], installed with
// pagedkv.Config.CacheEvents): it turns each page stored or removed into a
// BlockStored or BlockRemoved event of the current step's [Batch], and
// keeps a mirror of the cached page set. [Recorder.Flush], called by the
// engine once per step, hands the batch to a bounded [Queue] without
// blocking. A [Publisher] drains the queue on its own goroutine: it
// numbers the batches, encodes them with msgpack, sends them on a ZeroMQ
// PUB socket as [topic, 8-byte big-endian sequence, payload], keeps the
// last BufferSteps payloads, and answers replay requests on a ROUTER
// socket exactly as vLLM's ZmqEventPublisher does. What the sockets read
// from peers (subscriptions, replay requests) is bounded by
// [PublisherConfig.MaxRequestBytes] before anything is allocated
// (internal/zmtp); offending peers are disconnected and counted in
// [PublisherStats].PeerErrors.
//
// # Invariants
//
//   - Applying the published batches in sequence order to an empty set
//     (BlockStored adds its hashes, BlockRemoved deletes them,
//     AllBlocksCleared empties the set) gives the Manager's cached page set
//     as of the last flushed step.
//   - A slow or absent consumer never blocks the Manager: when the queue is
//     full, Flush drops the step's batch (counted in [RecorderStats]) and
//     the next batch that fits starts with AllBlocksCleared followed by a
//     BlockStored for every cached page (from the mirror, parents first),
//     so subscribers resynchronise. Dropped batches take no sequence
//     number: the stream stays gap-free.
//   - The per-step path (sink calls and Flush) does not allocate once the
//     recycled batches have grown to the workload's size.
//
// # Concurrency
//
// A Recorder belongs to the Manager's goroutine (like the Manager). A
// Queue connects exactly one Recorder to one consumer. A Publisher's
// methods are safe for concurrent use.
package events
