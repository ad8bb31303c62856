// Package sim drives a serving workload through a pagedkv.Manager with real
// append and attention on a kernels.Backend, and checks the results as it
// goes. It is the engine behind `pagedkv simulate`.
//
// A workload is a list of [Request]s: built in ([Workload]) or read from a
// JSONL trace ([ParseTrace]). Each step, the scheduler puts every decoding
// request in the batch, fills the rest of a token budget with prefill
// chunks, and admits waiting requests (Manager.Add, or Manager.Resume for
// preempted ones) while the pool has room; when Manager.Reserve reports
// ErrOutOfPages it preempts the most recently admitted request and retries.
// The engine then performs the plan's copy-on-write copies in every layer's
// cache, appends the step's K/V with appendkv, and computes attention with
// batch decode, batch prefill, or cascade.Run when the plan has cascade
// levels. Commit records sampled tokens; requests with parallel samples
// fork after their first token; finished requests are released.
//
// K, V and Q come from a [Model]: deterministic functions of the token's
// context (namespace, all tokens up to it, position), layer and head. So
// prefix-cache reuse is correct by construction, and the verifier rebuilds
// any request's dense K/V from its token ids alone.
//
// With Config.Groups (a hybrid model, [Preset]) the run drives a
// pagedkv.HybridManager instead: one page pool, and per layer group its own
// page table, prefix cache and plan. The engine performs the step's
// pool-wide copies once, then appends and attends each group's layers over
// that group's plan (its window_left, and a chunked group's Attn arrays),
// and every checked step verifies samples of every group against dense
// attention under that group's window or chunk. A state group (SSM or
// linear-attention layers: the qwen3-next-like and nemotron-h-like
// presets) runs a deterministic recurrent layer whose state lives in the
// slot page the plan's StateIndices name, after the plan's copies; prefill
// chunks end at HybridManager.NextStateCheckpoint so that checkpoints are
// published. An MLA group (the deepseek-v3.2-like preset) keeps ckv/kpe in
// MLA caches (package mla: append, then MLA decode once per query row), and
// its indexer group writes each token's fp8 indexer K at the MLA group's
// page and slot (layergroup.IndexerLayout).
//
// [RunFleet] runs a workload over several replicas, each a Sim with its own
// Manager (a HybridManager with Config.Groups, its events grouped by
// [RecorderConfig]), backend and verification, connected to a router only
// by their KV events (package events over loopback ZeroMQ, package kvindex
// in the router). The replicas step in lockstep, and before routing the next
// arrivals the router waits until it has indexed every replica's events
// of the step, so routing is deterministic; the policies are documented on
// [Policy] and in docs/events.md.
//
// # Invariants
//
//   - Every VerifyEvery steps, sampled outputs (request, query row, layer,
//     head) are compared with float64 attention over the dense K/V
//     (internal/reference), every K/V row the sampled requests hold in
//     the paged cache is compared bit for bit with the model, and
//     Manager.Audit runs. A mismatch ends the run with an error wrapping
//     [ErrVerify] (or [ErrCheck] for a disagreement about tokens or plan
//     arrays), naming the step, request, layer, head and position.
//   - After every step the Manager's computed count and tokens of each
//     batch request equal the simulator's own record, the plan's token ids
//     are the simulator's tokens at the plan's positions, and appendkv
//     derives the plan's batch_indices and positions independently.
//   - A sampled output of a state group's recurrent layer equals, bit for
//     bit, recomputing its request from token 0 in float32 (so a request
//     resumed from a state checkpoint resumed from exactly its state).
//   - For a hybrid model, after every Reserve the distinct pages the running
//     requests hold in each group that owns pages add up to the pool's
//     pages in use by requests (a page belongs to one group at a time), and
//     an indexer group's pages are its MLA group's.
//   - Every step, an indexer group's plan carries its MLA group's page
//     arrays, and every indexer entry of every scheduled request, read
//     through the MLA group's page table, equals the fp8 quantisation of
//     that token's indexer K (across copy-on-write, preemption, prefix
//     hits, eviction and host round trips).
//   - Model values are exact in the cache dtype, so the paged cache holds
//     exactly what the model produced.
//
// # Concurrency
//
// A [Sim] belongs to the goroutine that calls Run. Its Manager's Stats may
// be read from any goroutine (for metrics) while it runs.
package sim
