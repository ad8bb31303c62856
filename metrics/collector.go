package metrics

import (
	"slices"
	"strconv"
	"strings"

	"github.com/prometheus/client_golang/prometheus"

	pagedkv "github.com/pagedkv/pagedkv"
	"github.com/pagedkv/pagedkv/tier"
)

// Options configure a [Collector].
type Options struct {
	// Namespace prefixes every metric name; "" means "pagedkv".
	Namespace string
	// ConstLabels are added to every series (e.g. {"pool": "gpu0"} when an
	// engine runs several Managers).
	ConstLabels prometheus.Labels
	// RecentRejections also exports the remote store's recent-rejections
	// log (Stats.Tiers.Remote.Recent) as the gauge
	// remote_recent_rejections{key, reason}: the count of each logged
	// key. Off by default: keys are label values chosen by whoever writes
	// bad values, so while it is bounded per scrape (tier.RecentRejections
	// series), a stream of bad keys churns series in the time-series
	// database.
	RecentRejections bool
}

// series is one exported value: a Stats field, with the label value it
// carries when its metric has a variable label.
type series struct {
	labelValue string
	value      func(*pagedkv.Stats) float64
}

// metric is one metric family.
type metric struct {
	name, help string
	typ        prometheus.ValueType
	label      string // variable label name, or "" for a single series
	series     []series
	desc       *prometheus.Desc
}

func one(v func(*pagedkv.Stats) float64) []series { return []series{{value: v}} }

// definitions lists every metric; each Stats field appears exactly once.
func definitions() []metric {
	g, c := prometheus.GaugeValue, prometheus.CounterValue
	return []metric{
		{name: "pool_pages", help: "Pages in the pool.", typ: g,
			series: one(func(s *pagedkv.Stats) float64 { return float64(s.TotalPages) })},
		{name: "pages", help: "Pages of the pool by state: free, used (held by a request), evictable (idle in the prefix cache), pinned_idle (idle, pinned). The states add up to pool_pages.",
			typ: g, label: "state", series: []series{
				{"free", func(s *pagedkv.Stats) float64 { return float64(s.FreePages) }},
				{"used", func(s *pagedkv.Stats) float64 { return float64(s.UsedPages) }},
				{"evictable", func(s *pagedkv.Stats) float64 { return float64(s.EvictablePages) }},
				{"pinned_idle", func(s *pagedkv.Stats) float64 { return float64(s.PinnedIdlePages) }},
			}},
		{name: "cached_pages", help: "Pages in the prefix cache (some also used by requests).", typ: g,
			series: one(func(s *pagedkv.Stats) float64 { return float64(s.CachedPages) })},
		{name: "pinned_pages", help: "Cached pages under a pin, idle or in use.", typ: g,
			series: one(func(s *pagedkv.Stats) float64 { return float64(s.PinnedPages) })},
		{name: "shared_pages", help: "Pages with two or more holders (requests and the cache).", typ: g,
			series: one(func(s *pagedkv.Stats) float64 { return float64(s.SharedPages) })},
		{name: "requests", help: "Requests held by the Manager, running and preempted.", typ: g,
			series: one(func(s *pagedkv.Stats) float64 { return float64(s.Requests) })},
		{name: "preempted_requests", help: "Preempted requests waiting for Resume, holding no page.", typ: g,
			series: one(func(s *pagedkv.Stats) float64 { return float64(s.PreemptedRequests) })},

		{name: "prompt_tokens_total", help: "Prompt tokens of every admitted request.", typ: c,
			series: one(func(s *pagedkv.Stats) float64 { return float64(s.PromptTokens) })},
		{name: "prompt_hit_tokens_total", help: "Prompt tokens served from the prefix cache at admission.", typ: c,
			series: one(func(s *pagedkv.Stats) float64 { return float64(s.PromptHitTokens) })},
		{name: "computed_tokens_total", help: "Tokens whose K/V the engine computed in committed steps, recomputation included.", typ: c,
			series: one(func(s *pagedkv.Stats) float64 { return float64(s.ComputedTokens) })},
		{name: "resumed_tokens_total", help: "Computed tokens discarded by preemptions, due at resume.", typ: c,
			series: one(func(s *pagedkv.Stats) float64 { return float64(s.ResumedTokens) })},
		{name: "resume_hit_tokens_total", help: "Of the resumed tokens, those found in the prefix cache.", typ: c,
			series: one(func(s *pagedkv.Stats) float64 { return float64(s.ResumeHitTokens) })},
		{name: "steps_total", help: "Committed steps.", typ: c,
			series: one(func(s *pagedkv.Stats) float64 { return float64(s.Steps) })},
		{name: "preemptions_total", help: "Requests preempted.", typ: c,
			series: one(func(s *pagedkv.Stats) float64 { return float64(s.Preemptions) })},
		{name: "copied_pages_total", help: "Copy-on-write page copies planned.", typ: c,
			series: one(func(s *pagedkv.Stats) float64 { return float64(s.CopiedPages) })},
		{name: "published_pages_total", help: "Pages added to the prefix cache.", typ: c,
			series: one(func(s *pagedkv.Stats) float64 { return float64(s.PublishedPages) })},
		{name: "duplicate_pages_total", help: "Filled pages whose prefix was already cached (kept private).", typ: c,
			series: one(func(s *pagedkv.Stats) float64 { return float64(s.DuplicatePages) })},
		{name: "miss_ratio_curve_hit_ratio", help: "Live miss-ratio curve (Config.MissRatioSampling): the prefix hit ratio an LRU cache of the given size, relative to the pool, would have had on the pages referenced so far (sampled shadow caches; 0 without sampling).",
			typ: g, label: "size", series: []series{
				{"0.5", func(s *pagedkv.Stats) float64 { return s.MissRatioCurve.Half }},
				{"2", func(s *pagedkv.Stats) float64 { return s.MissRatioCurve.Double }},
				{"4", func(s *pagedkv.Stats) float64 { return s.MissRatioCurve.Quadruple }},
				{"unlimited", func(s *pagedkv.Stats) float64 { return s.MissRatioCurve.Unlimited }},
			}},
		{name: "miss_ratio_curve_sampled_references_total", help: "Page references the miss-ratio curve's shadow caches sampled.", typ: c,
			series: one(func(s *pagedkv.Stats) float64 { return float64(s.MissRatioCurve.SampledReferences) })},
		{name: "evicted_pages_total", help: "Pages removed from the prefix cache.", typ: c,
			series: one(func(s *pagedkv.Stats) float64 { return float64(s.EvictedPages) })},
		{name: "eviction_freed_pages_total", help: "Evicted pages returned to the pool.", typ: c,
			series: one(func(s *pagedkv.Stats) float64 { return float64(s.EvictionFreedPages) })},
		{name: "eviction_inner_victims_total", help: "Eviction victims that had cached children.", typ: c,
			series: one(func(s *pagedkv.Stats) float64 { return float64(s.InnerVictims) })},
		{name: "window_released_pages_total", help: "Pages released from requests by the sliding window.", typ: c,
			series: one(func(s *pagedkv.Stats) float64 { return float64(s.WindowReleasedPages) })},
		{name: "chains_cut_total", help: "Requests whose prefix-cache chain was evicted (they stop publishing).", typ: c,
			series: one(func(s *pagedkv.Stats) float64 { return float64(s.ChainsCut) })},
		{name: "draft_tokens_total", help: "Speculative draft tokens verified by committed steps.", typ: c,
			series: one(func(s *pagedkv.Stats) float64 { return float64(s.DraftTokens) })},
		{name: "accepted_draft_tokens_total", help: "Speculative draft tokens accepted.", typ: c,
			series: one(func(s *pagedkv.Stats) float64 { return float64(s.AcceptedDraftTokens) })},

		// Cache reads and writes as a provider bills them (Manager.CacheUsage, summed).
		{name: "cache_read_tokens_total", help: "Tokens requests read from the cache at admission (Add and Resume), by the medium that served them.",
			typ: c, label: "medium", series: []series{
				{"device", func(s *pagedkv.Stats) float64 { return float64(s.CacheUsage.DeviceReadTokens) }},
				{"host", func(s *pagedkv.Stats) float64 { return float64(s.CacheUsage.HostReadTokens) }},
				{"disk", func(s *pagedkv.Stats) float64 { return float64(s.CacheUsage.DiskReadTokens) }},
				{"remote", func(s *pagedkv.Stats) float64 { return float64(s.CacheUsage.RemoteReadTokens) }},
			}},
		{name: "cache_write_tokens_total", help: "Tokens of pages requests computed and added to the prefix cache.", typ: c,
			series: one(func(s *pagedkv.Stats) float64 { return float64(s.CacheUsage.WriteTokens) })},
		{name: "cache_usage_dropped_total", help: "Released requests whose cache usage was forgotten unread (past KeptCacheUsages).", typ: c,
			series: one(func(s *pagedkv.Stats) float64 { return float64(s.CacheUsageDropped) })},

		// The tiers below the device pool (docs/tiers.md).
		{name: "host_pages", help: "Pages of the host tier by state: total, used (being written or holding a page).",
			typ: g, label: "state", series: []series{
				{"total", func(s *pagedkv.Stats) float64 { return float64(s.Tiers.HostPages) }},
				{"used", func(s *pagedkv.Stats) float64 { return float64(s.Tiers.HostUsedPages) }},
			}},
		{name: "tier_copies_in_flight", help: "Tier copies (offloads and onloads) planned and not yet completed by the engine.", typ: g,
			series: one(func(s *pagedkv.Stats) float64 { return float64(s.Tiers.InFlight) })},
		{name: "tier_hit_tokens_total", help: "Prompt tokens served from a tier below the device pool, by tier.",
			typ: c, label: "tier", series: []series{
				{"host", func(s *pagedkv.Stats) float64 { return float64(s.Tiers.HostHitTokens) }},
				{"remote", func(s *pagedkv.Stats) float64 { return float64(s.Tiers.RemoteHitTokens) }},
			}},
		{name: "tier_copied_pages_total", help: "Tier copies completed, by direction.",
			typ: c, label: "direction", series: []series{
				{"device_to_host", func(s *pagedkv.Stats) float64 { return float64(s.Tiers.OffloadedPages) }},
				{"host_to_device", func(s *pagedkv.Stats) float64 { return float64(s.Tiers.OnloadedPages) }},
			}},
		{name: "tier_bytes_total", help: "Page bytes moved between tiers, by direction.",
			typ: c, label: "direction", series: []series{
				{"device_to_host", func(s *pagedkv.Stats) float64 { return float64(s.Tiers.BytesToHost) }},
				{"host_to_device", func(s *pagedkv.Stats) float64 { return float64(s.Tiers.BytesToDevice) }},
				{"remote_to_host", func(s *pagedkv.Stats) float64 { return float64(s.Tiers.Remote.BytesIn) }},
				{"host_to_remote", func(s *pagedkv.Stats) float64 { return float64(s.Tiers.Remote.BytesOut) }},
			}},
		{name: "tier_dropped_pages_total", help: "Cached pages evicted from the device with no copy in a lower tier.", typ: c,
			series: one(func(s *pagedkv.Stats) float64 { return float64(s.Tiers.DroppedPages) })},
		{name: "tier_host_full_total", help: "Offloads not planned because no host page was free or reclaimable.", typ: c,
			series: one(func(s *pagedkv.Stats) float64 { return float64(s.Tiers.HostFull) })},
		{name: "tier_remote_fetched_pages_total", help: "Pages the Manager fetched from the remote store into host pages.", typ: c,
			series: one(func(s *pagedkv.Stats) float64 { return float64(s.Tiers.RemoteFetched) })},
		{name: "tier_remote_queued_pages_total", help: "Pages the Manager handed to the remote store's write queue.", typ: c,
			series: one(func(s *pagedkv.Stats) float64 { return float64(s.Tiers.RemoteStored) })},
		{name: "remote_lookups_total", help: "Batched lookups sent to the remote store.", typ: c,
			series: one(func(s *pagedkv.Stats) float64 { return float64(s.Tiers.Remote.Lookups) })},
		{name: "remote_pages_total", help: "Remote store page outcomes: requested, hit (served), miss, rejected (corrupt, truncated, stale or foreign values), stored, dropped (write queue full).",
			typ: c, label: "outcome", series: []series{
				{"requested", func(s *pagedkv.Stats) float64 { return float64(s.Tiers.Remote.Requested) }},
				{"hit", func(s *pagedkv.Stats) float64 { return float64(s.Tiers.Remote.Hits) }},
				{"miss", func(s *pagedkv.Stats) float64 { return float64(s.Tiers.Remote.Misses) }},
				{"rejected", func(s *pagedkv.Stats) float64 { return float64(s.Tiers.Remote.Rejected) }},
				{"stored", func(s *pagedkv.Stats) float64 { return float64(s.Tiers.Remote.Stored) }},
				{"dropped", func(s *pagedkv.Stats) float64 { return float64(s.Tiers.Remote.Dropped) }},
			}},
		{name: "remote_rejected_pages_total", help: "Remote values found and refused, by reason: corrupt (damaged), size (another length, refused before reading), wrong_type (not a string key), foreign (another namespace, group or format), stale (another page).",
			typ: c, label: "reason", series: rejectedSeries()},
		{name: "remote_errors_total", help: "Failed remote lookups and writes, by kind: all errors, and of those the lookups cut by the deadline.",
			typ: c, label: "kind", series: []series{
				{"error", func(s *pagedkv.Stats) float64 { return float64(s.Tiers.Remote.Errors) }},
				{"timeout", func(s *pagedkv.Stats) float64 { return float64(s.Tiers.Remote.Timeouts) }},
			}},
	}
}

// rejectedSeries reads Stats.Tiers.Remote.RejectedBy, one series per
// reason.
func rejectedSeries() []series {
	out := make([]series, tier.NumRejectReasons)
	for r := range tier.NumRejectReasons {
		out[r] = series{r.String(), func(s *pagedkv.Stats) float64 { return float64(s.Tiers.Remote.RejectedBy[r]) }}
	}
	return out
}

// Collector is a prometheus.Collector over a Manager's Stats.
type Collector struct {
	stats   func() pagedkv.Stats
	metrics []metric
	recent  *prometheus.Desc // nil unless Options.RecentRejections
}

var _ prometheus.Collector = (*Collector)(nil)

// NewCollector returns a collector that calls stats (usually
// Manager.Stats, which is safe from any goroutine) once per scrape.
// Register it with a prometheus.Registerer.
func NewCollector(stats func() pagedkv.Stats, opts Options) *Collector {
	ns := namespace(opts)
	c := &Collector{stats: stats, metrics: definitions()}
	for i := range c.metrics {
		m := &c.metrics[i]
		var labels []string
		if m.label != "" {
			labels = []string{m.label}
		}
		m.desc = prometheus.NewDesc(prometheus.BuildFQName(ns, "", m.name), m.help, labels, opts.ConstLabels)
	}
	if opts.RecentRejections {
		c.recent = prometheus.NewDesc(prometheus.BuildFQName(ns, "", "remote_recent_rejections"),
			"The remote store's recent rejections: for each logged key and reason, the values refused since the entry entered the bounded log.",
			[]string{"key", "reason"}, opts.ConstLabels)
	}
	return c
}

func namespace(opts Options) string {
	if opts.Namespace == "" {
		return "pagedkv"
	}
	return opts.Namespace
}

// Describe sends the descriptor of every metric.
func (c *Collector) Describe(ch chan<- *prometheus.Desc) {
	for i := range c.metrics {
		ch <- c.metrics[i].desc
	}
	if c.recent != nil {
		ch <- c.recent
	}
}

// Collect reads one Stats snapshot and sends every series.
func (c *Collector) Collect(ch chan<- prometheus.Metric) {
	s := c.stats()
	c.collect(ch, &s)
}

// collect sends every series of s.
func (c *Collector) collect(ch chan<- prometheus.Metric, s *pagedkv.Stats) {
	for i := range c.metrics {
		m := &c.metrics[i]
		for _, sr := range m.series {
			if m.label == "" {
				ch <- prometheus.MustNewConstMetric(m.desc, m.typ, sr.value(s))
			} else {
				ch <- prometheus.MustNewConstMetric(m.desc, m.typ, sr.value(s), sr.labelValue)
			}
		}
	}
	if c.recent != nil {
		c.collectRecent(ch, &s.Tiers.Remote)
	}
}

// collectRecent sends one series per logged (key, reason). Label values
// must be valid UTF-8 and unique per scrape, whatever store filled the
// log.
func (c *Collector) collectRecent(ch chan<- prometheus.Metric, r *tier.RemoteStats) {
	for i, e := range r.Recent {
		if e.Count <= 0 || slices.ContainsFunc(r.Recent[:i], func(o tier.RemoteRejection) bool {
			return o.Key == e.Key && o.Reason == e.Reason && o.Count > 0
		}) {
			continue
		}
		ch <- prometheus.MustNewConstMetric(c.recent, prometheus.GaugeValue, float64(e.Count),
			strings.ToValidUTF8(e.Key, "\uFFFD"), e.Reason.String())
	}
}

// groupMetric is one per-group metric family of a [HybridCollector]: a
// GroupStats field, one series per group.
type groupMetric struct {
	name, help string
	typ        prometheus.ValueType
	value      func(*pagedkv.GroupStats) float64
	desc       *prometheus.Desc
}

// groupDefinitions lists every per-group metric; each GroupStats number
// appears exactly once (Kind is the "kind" label).
func groupDefinitions() []groupMetric {
	g, c := prometheus.GaugeValue, prometheus.CounterValue
	return []groupMetric{
		{name: "group_cached_pages", help: "Pages in the group's prefix cache (some also used by requests).", typ: g,
			value: func(s *pagedkv.GroupStats) float64 { return float64(s.CachedPages) }},
		{name: "group_evictable_pages", help: "Of the group's cached pages, those idle and evictable.", typ: g,
			value: func(s *pagedkv.GroupStats) float64 { return float64(s.EvictablePages) }},
		{name: "group_pinned_pages", help: "Of the group's cached pages, those under a pin, idle or in use.", typ: g,
			value: func(s *pagedkv.GroupStats) float64 { return float64(s.PinnedPages) }},
		{name: "group_servable_tokens_total", help: "Prompt tokens the group's cache alone could have served at Add and Resume (the hit is the minimum over groups).", typ: c,
			value: func(s *pagedkv.GroupStats) float64 { return float64(s.ServableTokens) }},
		{name: "group_published_pages_total", help: "Pages added to the group's prefix cache.", typ: c,
			value: func(s *pagedkv.GroupStats) float64 { return float64(s.PublishedPages) }},
		{name: "group_evicted_pages_total", help: "Pages removed from the group's prefix cache.", typ: c,
			value: func(s *pagedkv.GroupStats) float64 { return float64(s.EvictedPages) }},
		{name: "group_copied_pages_total", help: "Copy-on-write page copies planned in the group.", typ: c,
			value: func(s *pagedkv.GroupStats) float64 { return float64(s.CopiedPages) }},
		{name: "group_window_released_pages_total", help: "Pages the group released because its attention no longer reads them (left the sliding window, or a finished chunk).", typ: c,
			value: func(s *pagedkv.GroupStats) float64 { return float64(s.WindowReleasedPages) }},
		{name: "group_host_hit_tokens_total", help: "Prompt tokens the group onloaded from host pages at admission (tier_hit_tokens_total is the pool's, over every group).", typ: c,
			value: func(s *pagedkv.GroupStats) float64 { return float64(s.HostHitTokens) }},
		{name: "group_remote_hit_tokens_total", help: "Prompt tokens the group onloaded from the remote store at admission.", typ: c,
			value: func(s *pagedkv.GroupStats) float64 { return float64(s.RemoteHitTokens) }},
		{name: "group_offloaded_pages_total", help: "The group's device-to-host tier copies completed.", typ: c,
			value: func(s *pagedkv.GroupStats) float64 { return float64(s.OffloadedPages) }},
		{name: "group_onloaded_pages_total", help: "The group's host-to-device tier copies completed.", typ: c,
			value: func(s *pagedkv.GroupStats) float64 { return float64(s.OnloadedPages) }},
	}
}

// HybridCollector is a prometheus.Collector over a HybridManager's Stats:
// the pool-wide figures under the names and labels of a [Collector]
// (HybridStats.Stats: the pool's partition, and page counters summed over
// the groups), and each group's figures as group_* series labelled
// group="0".."G-1" and kind="full|sliding|chunked|mla|state" (a state
// group's cached pages are its checkpoints, one page each).
type HybridCollector struct {
	stats  func() pagedkv.HybridStats
	pool   *Collector
	groups []groupMetric
}

var _ prometheus.Collector = (*HybridCollector)(nil)

// NewHybridCollector returns a collector that calls stats (usually
// HybridManager.Stats, which is safe from any goroutine) once per scrape.
// Options are a Collector's.
func NewHybridCollector(stats func() pagedkv.HybridStats, opts Options) *HybridCollector {
	c := &HybridCollector{stats: stats, pool: NewCollector(nil, opts), groups: groupDefinitions()}
	ns := namespace(opts)
	for i := range c.groups {
		m := &c.groups[i]
		m.desc = prometheus.NewDesc(prometheus.BuildFQName(ns, "", m.name), m.help, []string{"group", "kind"}, opts.ConstLabels)
	}
	return c
}

// Describe sends the descriptor of every metric.
func (c *HybridCollector) Describe(ch chan<- *prometheus.Desc) {
	c.pool.Describe(ch)
	for i := range c.groups {
		ch <- c.groups[i].desc
	}
}

// Collect reads one HybridStats snapshot and sends every series.
func (c *HybridCollector) Collect(ch chan<- prometheus.Metric) {
	s := c.stats()
	c.pool.collect(ch, &s.Stats)
	for i := range c.groups {
		m := &c.groups[i]
		for g := range s.Groups {
			ch <- prometheus.MustNewConstMetric(m.desc, m.typ, m.value(&s.Groups[g]), strconv.Itoa(g), s.Groups[g].Kind.String())
		}
	}
}
