// Package replay replays production request traces through the real
// pagedkv.Manager in a metadata-only mode (the Manager keeps bookkeeping
// only; no K/V is stored or computed) and measures what the prefix cache
// recovers: hit ratio, recomputed tokens, evictions, preemptions and peak
// pages, per eviction policy and pool capacity, against two limits computed
// over the very block reference stream the replay produced: Belady's offline
// optimum and the unlimited-capacity ratio.
//
// # Traces
//
// [ReadMooncake] reads the Mooncake trace format (one JSON object per line:
// timestamp in ms, input_length, output_length, hash_ids of the prompt's
// 512-token blocks); [FromSim] converts the project's own trace format
// (internal/sim). A trace is a list of [Request]s whose prompts are
// sequences of block ids: two requests share a prefix of k blocks exactly
// when their first k ids are equal.
//
// # Tokens
//
// The Manager verifies every prefix hit token by token, so the replay gives
// it tokens: block id b becomes a page of [Config.PageTokens] tokens whose
// first token is b and whose others are a fixed mix of (b, position)
// ([BlockTokens]). Equal ids give equal pages, different ids different
// pages, so the Manager's verified chains match exactly where the trace says
// they do. Every block of a prompt, the last (partial) one included, is a
// full page, and the prompt ends with one more token (the one whose logits
// the first step yields; the Manager never matches a whole prompt), so
// every block the trace counts as a hit can be one.
//
// # Modes
//
// Sequential ([Config.Service] nil) admits one request at a time, prefills
// it and releases it: no concurrency and no outputs, the setting of the
// trace's published figures. The service model ([Service]) runs requests
// at their arrival times through a simple engine loop (docs/replay.md).
// [Config.HostPages] adds a write-through host tier below the pool (with a
// dense Manager only: a HybridManager has tiers, but the replay refuses a
// hybrid [Config.Model] with a tier); [RunFleet] runs several replicas
// behind a router (prefix-aware over a kvindex.Index fed with their KV
// events, round robin, least loaded).
//
// # Invariants
//
//   - The replay's hits are the Manager's own verified prefix hits: with
//     room for every block they equal the trace's unlimited-capacity hits
//     block for block, and a sequential LRU replay equals a slow per-block
//     LRU model's hits and evictions.
//   - [Result.Stream] holds every admission and resumption the replay made,
//     and no policy's hits exceed [Belady] on that stream at the same
//     capacity, nor Belady's exceed [Unlimited].
//   - [Config.PageTokens] changes the token work, never the replay: the
//     same hits, evictions and stream as full 512-token pages.
//   - Apart from its wall time, a [Run]'s Result depends only on the trace
//     and the Config: the service model's clock is simulated, not
//     measured, so docs/replay.md's tables reproduce to the block.
//   - The work is bounded before it starts: a trace past [Limits] is
//     refused by name ([ErrBadConfig]), and a service-model replay stops
//     once MaxPreemptionsPerRequest × requests preemptions are spent.
//
// # Concurrency
//
// Nothing here is safe for concurrent use; [Sweep] runs its replays one
// after another.
package replay
