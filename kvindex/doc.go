// Package kvindex is the router's side of KV-cache events: a [Subscriber]
// follows the vLLM-format event streams of any number of engine replicas
// (pagedkv's package events, or vLLM itself), and an [Index] maps prefix
// hash chains to the replicas that cache them. Given a request's tokens and
// namespace, [Index.Match] answers, per replica, how many leading tokens
// are cached: it computes the same hash chain the Managers publish
// (prefixcache.Hasher, so the router needs the Managers' page size and
// HashSeed, not the engine) and walks it while the replica holds each
// block.
//
// # Groups
//
// Blocks are indexed per KV-cache group (vLLM's group_idx; an event
// without one, from a single-group engine, is group 0): a hybrid model
// (pagedkv's HybridManager, or vLLM with sliding-window and full-attention
// layers) announces the same block hash under several groups, and one
// group's BlockRemoved leaves the others' copies. A replica's match is the
// minimum, over every group its events have named, of the group's
// contiguous match from block 0: HybridManager's admission rule. For vLLM's
// sliding-window groups that is conservative (it never over-reports; vLLM
// could serve some prefixes whose early blocks that group has dropped).
// A state group (its BlockStored events carry kv_cache_spec_kind "mamba")
// holds checkpoints, not chains: the match is then cut back to the deepest
// block every state group holds.
// [Index.Blocks] is the union of the groups, [Index.GroupBlocks] one group.
//
// The decoder is this package's own ([DecodeBatch]): it shares no code with
// the encoder in package events. It reads vLLM's current map-form events
// and the earlier array form, skips fields it does not know, and checks
// every declared length against the bytes left.
//
// # Delivery
//
// Batches of a source are applied in sequence order. A gap (sequence >
// last+1) is repaired from the publisher's replay socket before the newer
// batch is applied; [SubscriberConfig.JoinReplay] makes a late joiner
// replay from 0. AllBlocksCleared empties every group of a replica (the
// groups stay known), and the publisher's resynchronisation that follows
// refills them.
//
// The index never over-reports what a replica caches: whenever the
// subscriber cannot know which blocks a replica holds, it clears them and
// under-reports until the replica stores them again. That is a gap the
// replay cannot fill ([SourceStats].Unrepaired), a batch not applied in
// full (undecodable, or refused by [Index.Apply]: [ReplicaStats].Unapplied),
// a publisher restart, seen as a live sequence number at or below the
// last one received live ([ReplicaStats].Restarts; the new run is then
// taken from its start), and a replay abandoned past
// [SubscriberConfig].ReplayDeadline or over its reply budget
// (MaxReplayReplies, MaxReplayBytes), which no replay endpoint can extend
// ([SourceStats].ReplaysPastDeadline, ReplaysOverBudget). See
// docs/kvindex.md, "Never over-reporting".
//
// # Bounded memory
//
// A replica's index holds at most [Config].MaxBlocks (group, hash)
// entries ([DefaultMaxBlocks], 2^20). At the cap a new block is refused:
// not indexed, and counted in [ReplicaStats].OverCap: the index
// under-reports that replica but keeps what it holds, where a clear would
// drop every hit. Maps that emptied are rebuilt, so a replica's memory is
// bounded by the cap whatever its stream stores and removes (about 36 MiB
// at the default). docs/kvindex.md, "Limits of the index", lists every
// default.
//
// # Hostile publishers
//
// The sockets are internal/zmtp's: every message is read under
// [SubscriberConfig.MaxMessageBytes] and 16 frames, checked from the frame
// headers before anything is allocated. A publisher (or replay endpoint)
// that declares more or breaks ZMTP is disconnected, reconnected after
// 100ms, and counted in [SourceStats].PeerErrors with LastPeerErr naming
// it; the other sources are not affected (docs/events.md, "Bounded
// reads").
//
// # Invariants
//
//   - Never over-reporting: for every replica, [Index.Match] answers at
//     most what the replica's Manager holds as of the last batch applied;
//     whenever that cannot be known the replica's blocks are cleared.
//   - A source's batches are applied in sequence order, each exactly once
//     and whole, or not at all (then the replica is cleared).
//   - A replica's index never holds more than [Config].MaxBlocks (group,
//     hash) entries, and no message is read past
//     [SubscriberConfig].MaxMessageBytes, whatever its publisher sends.
//   - A replica's match is the minimum over the groups its events named of
//     each group's contiguous match from block 0, state groups left out,
//     then cut back to the deepest block every state group holds; 0 for a
//     replica with state groups only.
//
// # Concurrency
//
// An Index is safe for concurrent use. A Subscriber runs one goroutine per
// source (plus socket readers); its methods are safe for concurrent use.
package kvindex
