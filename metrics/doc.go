// Package metrics exports a pagedkv.Manager's Stats as Prometheus metrics
// (github.com/prometheus/client_golang): a [Collector] takes one
// consistent Stats snapshot per scrape and turns every field into a gauge
// (occupancy) or a counter (cumulative counts).
//
// Exported series, with the default namespace "pagedkv":
//
//	pagedkv_pool_pages                        gauge    pages in the pool
//	pagedkv_pages{state="free|used|evictable|pinned_idle"}
//	                                          gauge    the pool's partition: the four add up to pool_pages
//	pagedkv_cached_pages, _pinned_pages, _shared_pages
//	                                          gauge
//	pagedkv_requests, _preempted_requests     gauge    requests held (running and preempted), preempted ones
//	pagedkv_prompt_tokens_total, _prompt_hit_tokens_total, _computed_tokens_total,
//	_resumed_tokens_total, _resume_hit_tokens_total, _steps_total, _preemptions_total,
//	_copied_pages_total, _published_pages_total, _duplicate_pages_total,
//	_evicted_pages_total, _eviction_freed_pages_total, _eviction_inner_victims_total,
//	_window_released_pages_total, _chains_cut_total, _draft_tokens_total,
//	_accepted_draft_tokens_total
//	                                          counter
//	pagedkv_cache_read_tokens_total{medium="device|host|disk|remote"}
//	                                          counter  tokens requests read from the cache at admission
//	pagedkv_cache_write_tokens_total          counter  tokens of pages requests computed and added to the cache
//	pagedkv_cache_usage_dropped_total         counter  released requests' usage forgotten unread
//
// The cache_read and cache_write counters are the sum of every request's
// Manager.CacheUsage (docs/cache-usage.md): what a
// provider bills as cache reads (Anthropic's cache_read_input_tokens) and
// cache writes (cache_creation_input_tokens).
//
// A [HybridCollector] exports a pagedkv.HybridManager's HybridStats: the
// series above over the pool (HybridStats.Stats: the partition of the one
// pool, page counters summed over the groups, request and token counters
// counted once), and per layer group, labelled group="0".."G-1" and
// kind="full|sliding|chunked|mla":
//
//	pagedkv_group_cached_pages, _group_evictable_pages, _group_pinned_pages
//	                                          gauge
//	pagedkv_group_servable_tokens_total, _group_published_pages_total,
//	_group_evicted_pages_total, _group_copied_pages_total,
//	_group_window_released_pages_total, _group_host_hit_tokens_total,
//	_group_remote_hit_tokens_total, _group_offloaded_pages_total,
//	_group_onloaded_pages_total
//	                                          counter
//
// A group whose servable tokens lag the others' is the one that limits the
// hybrid hit (the minimum over groups).
//
// The prefix-cache hit rate over a window is
// rate(pagedkv_prompt_hit_tokens_total[5m]) / rate(pagedkv_prompt_tokens_total[5m]),
// and the speculative acceptance rate
// rate(pagedkv_accepted_draft_tokens_total[5m]) / rate(pagedkv_draft_tokens_total[5m]).
//
// # Invariants
//
//   - One scrape reads one snapshot: the page gauges of a scrape always
//     add up to pagedkv_pool_pages.
//   - Every field of pagedkv.Stats is exported exactly once, and every
//     number of pagedkv.GroupStats once per group (tests enforce both, so
//     a new field cannot be forgotten).
//
// # Concurrency
//
// A Collector is safe for concurrent use: Collect may run on any goroutine
// (an HTTP handler) while the Manager runs on its own, because
// Manager.Stats is (and HybridManager.Stats).
package metrics
