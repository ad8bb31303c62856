package metrics_test

import (
	"bufio"
	"context"
	"io"
	"net/http"
	"net/http/httptest"
	"reflect"
	"sort"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	pagedkv "github.com/pagedkv/pagedkv"
	"github.com/pagedkv/pagedkv/internal/redistest"
	"github.com/pagedkv/pagedkv/layergroup"
	"github.com/pagedkv/pagedkv/layout"
	"github.com/pagedkv/pagedkv/metrics"
	"github.com/pagedkv/pagedkv/tier"
	"github.com/pagedkv/pagedkv/tier/redis"
)

// scrape serves c through promhttp and returns the samples of the text
// exposition ("name{labels} value" lines) in order, comments dropped.
func scrape(t *testing.T, c prometheus.Collector) []string {
	t.Helper()
	reg := prometheus.NewPedanticRegistry()
	require.NoError(t, reg.Register(c))
	srv := httptest.NewServer(promhttp.HandlerFor(reg, promhttp.HandlerOpts{ErrorHandling: promhttp.HTTPErrorOnError}))
	defer srv.Close()
	resp, err := http.Get(srv.URL)
	require.NoError(t, err)
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	require.NoError(t, err)
	require.Equal(t, http.StatusOK, resp.StatusCode, "%s", body)
	var lines []string
	sc := bufio.NewScanner(strings.NewReader(string(body)))
	for sc.Scan() {
		if l := sc.Text(); l != "" && !strings.HasPrefix(l, "#") {
			lines = append(lines, l)
		}
	}
	return lines
}

// numbered returns Stats with its i-th number (in declaration order,
// nested structs such as Stats.Tiers walked in place, arrays of numbers
// such as RemoteStats.RejectedBy element by element) set to i+1, and the
// count of numbers. Arrays of records (RemoteStats.Recent, a log) are not
// numbers and stay zero.
func numbered() (pagedkv.Stats, int) {
	var s pagedkv.Stats
	n := 0
	var walk func(v reflect.Value)
	walk = func(v reflect.Value) {
		switch v.Kind() {
		case reflect.Struct:
			for i := range v.NumField() {
				walk(v.Field(i))
			}
		case reflect.Array:
			if v.Type().Elem().Kind() != reflect.Struct {
				for i := range v.Len() {
					walk(v.Index(i))
				}
			}
		case reflect.Float64:
			n++
			v.SetFloat(float64(n))
		default:
			n++
			v.SetInt(int64(n))
		}
	}
	walk(reflect.ValueOf(&s).Elem())
	return s, n
}

func TestCollectorExposition(t *testing.T) {
	s, _ := numbered()
	c := metrics.NewCollector(func() pagedkv.Stats { return s }, metrics.Options{ConstLabels: prometheus.Labels{"pool": "gpu0"}})
	// Field numbers: TotalPages 1, FreePages 2, UsedPages 3, ... (the
	// order of pagedkv.Stats), so each line shows which field it reads.
	want := []string{
		`pagedkv_accepted_draft_tokens_total{pool="gpu0"} 27`,
		`pagedkv_cache_read_tokens_total{medium="device",pool="gpu0"} 62`,
		`pagedkv_cache_read_tokens_total{medium="disk",pool="gpu0"} 64`,
		`pagedkv_cache_read_tokens_total{medium="host",pool="gpu0"} 63`,
		`pagedkv_cache_read_tokens_total{medium="remote",pool="gpu0"} 65`,
		`pagedkv_cache_usage_dropped_total{pool="gpu0"} 67`,
		`pagedkv_cache_write_tokens_total{pool="gpu0"} 66`,
		`pagedkv_cached_pages{pool="gpu0"} 6`,
		`pagedkv_chains_cut_total{pool="gpu0"} 25`,
		`pagedkv_computed_tokens_total{pool="gpu0"} 13`,
		`pagedkv_copied_pages_total{pool="gpu0"} 18`,
		`pagedkv_draft_tokens_total{pool="gpu0"} 26`,
		`pagedkv_duplicate_pages_total{pool="gpu0"} 20`,
		`pagedkv_evicted_pages_total{pool="gpu0"} 21`,
		`pagedkv_eviction_freed_pages_total{pool="gpu0"} 22`,
		`pagedkv_eviction_inner_victims_total{pool="gpu0"} 23`,
		`pagedkv_host_pages{pool="gpu0",state="total"} 28`,
		`pagedkv_host_pages{pool="gpu0",state="used"} 29`,
		`pagedkv_miss_ratio_curve_hit_ratio{pool="gpu0",size="0.5"} 58`,
		`pagedkv_miss_ratio_curve_hit_ratio{pool="gpu0",size="2"} 59`,
		`pagedkv_miss_ratio_curve_hit_ratio{pool="gpu0",size="4"} 60`,
		`pagedkv_miss_ratio_curve_hit_ratio{pool="gpu0",size="unlimited"} 61`,
		`pagedkv_miss_ratio_curve_sampled_references_total{pool="gpu0"} 57`,
		`pagedkv_pages{pool="gpu0",state="evictable"} 4`,
		`pagedkv_pages{pool="gpu0",state="free"} 2`,
		`pagedkv_pages{pool="gpu0",state="pinned_idle"} 5`,
		`pagedkv_pages{pool="gpu0",state="used"} 3`,
		`pagedkv_pinned_pages{pool="gpu0"} 7`,
		`pagedkv_pool_pages{pool="gpu0"} 1`,
		`pagedkv_preempted_requests{pool="gpu0"} 10`,
		`pagedkv_preemptions_total{pool="gpu0"} 17`,
		`pagedkv_prompt_hit_tokens_total{pool="gpu0"} 12`,
		`pagedkv_prompt_tokens_total{pool="gpu0"} 11`,
		`pagedkv_published_pages_total{pool="gpu0"} 19`,
		`pagedkv_remote_errors_total{kind="error",pool="gpu0"} 46`,
		`pagedkv_remote_errors_total{kind="timeout",pool="gpu0"} 47`,
		`pagedkv_remote_lookups_total{pool="gpu0"} 41`,
		`pagedkv_remote_pages_total{outcome="dropped",pool="gpu0"} 49`,
		`pagedkv_remote_pages_total{outcome="hit",pool="gpu0"} 43`,
		`pagedkv_remote_pages_total{outcome="miss",pool="gpu0"} 44`,
		`pagedkv_remote_pages_total{outcome="rejected",pool="gpu0"} 45`,
		`pagedkv_remote_pages_total{outcome="requested",pool="gpu0"} 42`,
		`pagedkv_remote_pages_total{outcome="stored",pool="gpu0"} 48`,
		`pagedkv_remote_rejected_pages_total{pool="gpu0",reason="corrupt"} 52`,
		`pagedkv_remote_rejected_pages_total{pool="gpu0",reason="foreign"} 55`,
		`pagedkv_remote_rejected_pages_total{pool="gpu0",reason="size"} 53`,
		`pagedkv_remote_rejected_pages_total{pool="gpu0",reason="stale"} 56`,
		`pagedkv_remote_rejected_pages_total{pool="gpu0",reason="wrong_type"} 54`,
		`pagedkv_requests{pool="gpu0"} 9`,
		`pagedkv_resume_hit_tokens_total{pool="gpu0"} 15`,
		`pagedkv_resumed_tokens_total{pool="gpu0"} 14`,
		`pagedkv_shared_pages{pool="gpu0"} 8`,
		`pagedkv_steps_total{pool="gpu0"} 16`,
		`pagedkv_tier_bytes_total{direction="device_to_host",pool="gpu0"} 35`,
		`pagedkv_tier_bytes_total{direction="host_to_device",pool="gpu0"} 36`,
		`pagedkv_tier_bytes_total{direction="host_to_remote",pool="gpu0"} 51`,
		`pagedkv_tier_bytes_total{direction="remote_to_host",pool="gpu0"} 50`,
		`pagedkv_tier_copied_pages_total{direction="device_to_host",pool="gpu0"} 33`,
		`pagedkv_tier_copied_pages_total{direction="host_to_device",pool="gpu0"} 34`,
		`pagedkv_tier_copies_in_flight{pool="gpu0"} 30`,
		`pagedkv_tier_dropped_pages_total{pool="gpu0"} 37`,
		`pagedkv_tier_hit_tokens_total{pool="gpu0",tier="host"} 31`,
		`pagedkv_tier_hit_tokens_total{pool="gpu0",tier="remote"} 32`,
		`pagedkv_tier_host_full_total{pool="gpu0"} 38`,
		`pagedkv_tier_remote_fetched_pages_total{pool="gpu0"} 39`,
		`pagedkv_tier_remote_queued_pages_total{pool="gpu0"} 40`,
		`pagedkv_window_released_pages_total{pool="gpu0"} 24`,
	}
	assert.Equal(t, want, scrape(t, c))
}

// TestEveryFieldOnce fails when a Stats field is added without a metric,
// or two metrics read one field.
func TestEveryFieldOnce(t *testing.T) {
	s, n := numbered()
	lines := scrape(t, metrics.NewCollector(func() pagedkv.Stats { return s }, metrics.Options{Namespace: "x"}))
	var got []int
	for _, l := range lines {
		require.True(t, strings.HasPrefix(l, "x_"), "namespace option ignored: %s", l)
		v, err := strconv.Atoi(l[strings.LastIndexByte(l, ' ')+1:])
		require.NoError(t, err, l)
		got = append(got, v)
	}
	sort.Ints(got)
	want := make([]int, n)
	for i := range want {
		want[i] = i + 1
	}
	assert.Equal(t, want, got, "each Stats field (numbered 1..N) must be exported exactly once")
}

// scrapeUntilStopped registers c and scrapes it from n goroutines until
// the returned stop is called (it waits for them), checking that every
// scrape is one snapshot: the page states add up to the pool.
func scrapeUntilStopped(t *testing.T, c prometheus.Collector, n int) (stop func()) {
	reg := prometheus.NewRegistry()
	require.NoError(t, reg.Register(c))
	done := make(chan struct{})
	var wg sync.WaitGroup
	for range n {
		wg.Go(func() {
			for {
				select {
				case <-done:
					return
				default:
				}
				mfs, err := reg.Gather()
				if !assert.NoError(t, err) {
					return
				}
				var pool, sum float64
				for _, mf := range mfs {
					switch mf.GetName() {
					case "pagedkv_pool_pages":
						pool = mf.GetMetric()[0].GetGauge().GetValue()
					case "pagedkv_pages":
						for _, s := range mf.GetMetric() {
							sum += s.GetGauge().GetValue()
						}
					}
				}
				if !assert.Equal(t, pool, sum, "page states of one scrape must add up to the pool") {
					return
				}
			}
		})
	}
	return func() { close(done); wg.Wait() }
}

// TestScrapeWhileRunning scrapes a live Manager from other goroutines while
// it runs steps (run with -race), and checks every scrape is one snapshot:
// the page states add up to the pool.
func TestScrapeWhileRunning(t *testing.T) {
	m, err := pagedkv.New(pagedkv.Config{NumPages: 64, PageSize: 4, HashSeed: 1})
	require.NoError(t, err)
	c := metrics.NewCollector(m.Stats, metrics.Options{})
	stop := scrapeUntilStopped(t, c, 2)
	prompt := []int32{1, 2, 3, 4, 5, 6, 7, 8, 9}
	for i := range 200 {
		id := pagedkv.RequestID(i + 1)
		_, err := m.Add(id, pagedkv.Request{Prompt: prompt})
		require.NoError(t, err)
		for m.Computed(id) < len(m.Tokens(id)) {
			n := int32(len(m.Tokens(id)) - m.Computed(id))
			_, err := m.Reserve([]pagedkv.RequestID{id}, []int32{n})
			require.NoError(t, err)
			require.NoError(t, m.Commit(nil))
		}
		require.NoError(t, m.Release(id))
		prompt = append(prompt[:9], int32(i))
	}
	stop()

	lines := scrape(t, c)
	assert.Contains(t, lines, "pagedkv_steps_total 200")
	// Prompts: 9 tokens, then 199 of 10.
	assert.Contains(t, lines, "pagedkv_prompt_tokens_total 1999")
	// Request 1 published pages [1 2 3 4] [5 6 7 8]; every later prompt
	// starts with them: 199 * 8 hit tokens, 9 + 199*2 computed.
	assert.Contains(t, lines, "pagedkv_prompt_hit_tokens_total 1592")
	assert.Contains(t, lines, "pagedkv_computed_tokens_total 407")
}

// With Options.RecentRejections the recent-rejections log is exported,
// one series per logged key and reason (empty entries skipped, duplicates
// from a careless store dropped, keys made valid UTF-8); without it, not.
func TestRecentRejectionsExposition(t *testing.T) {
	var s pagedkv.Stats
	s.Tiers.Remote.Recent[0] = tier.RemoteRejection{Key: "pkv:{ab}:m:k1", Reason: tier.RejectWrongType, Count: 3, Detail: "the key holds a list"}
	s.Tiers.Remote.Recent[1] = tier.RemoteRejection{Key: "pkv:{cd}:m:k2", Reason: tier.RejectSize, Count: 1}
	s.Tiers.Remote.Recent[2] = tier.RemoteRejection{Key: "pkv:{ab}:m:k1", Reason: tier.RejectWrongType, Count: 9}
	s.Tiers.Remote.Recent[3] = tier.RemoteRejection{Key: "pkv:\xff", Reason: tier.RejectStale, Count: 2}
	stats := func() pagedkv.Stats { return s }
	recent := func(lines []string) []string {
		var out []string
		for _, l := range lines {
			if strings.HasPrefix(l, "pagedkv_remote_recent_rejections") {
				out = append(out, l)
			}
		}
		return out
	}
	assert.Equal(t, []string{
		`pagedkv_remote_recent_rejections{key="pkv:{ab}:m:k1",reason="wrong_type"} 3`,
		`pagedkv_remote_recent_rejections{key="pkv:{cd}:m:k2",reason="size"} 1`,
		`pagedkv_remote_recent_rejections{key="pkv:` + "\uFFFD" + `",reason="stale"} 2`,
	}, recent(scrape(t, metrics.NewCollector(stats, metrics.Options{RecentRejections: true}))))
	assert.Empty(t, recent(scrape(t, metrics.NewCollector(stats, metrics.Options{}))), "off by default")
}

// A Manager over a real Redis: a key of the wrong type under a prompt's
// first page is a rejection recorded with its key and reason, in Stats
// and in the scrape.
func TestRemoteRejectionsScraped(t *testing.T) {
	srv := redistest.Start(t)
	f := tier.PageFormat{Layout: layout.NHD, DType: layout.F16, PageSize: 4, NumKVHeads: 1, HeadDim: 8, Layers: 2}
	store, err := redis.New(redis.Config{Addr: srv.Addr(), Namespace: "model", Format: f, DialTimeout: time.Second})
	require.NoError(t, err)
	defer store.Close()
	m, err := pagedkv.New(pagedkv.Config{NumPages: 16, PageSize: 4, HashSeed: 1,
		Tiers: pagedkv.TierConfig{HostPages: 4, Format: f, Remote: store, RemoteDeadline: 5 * time.Second}})
	require.NoError(t, err)
	prompt := []int32{1, 2, 3, 4, 5, 6, 7, 8, 9}
	first := tier.Next(nil, tier.NamespaceRoot("", "", ""), prompt[:4])
	key := store.Key(&tier.RemotePage{Digest: first, Chain: first})
	require.NoError(t, store.Client().RPush(context.Background(), key, "not a page").Err())

	n, err := m.Add(1, pagedkv.Request{Prompt: prompt})
	require.NoError(t, err)
	require.Zero(t, n)
	r := m.Stats().Tiers.Remote
	require.EqualValues(t, 1, r.RejectedBy[tier.RejectWrongType])
	require.Equal(t, tier.RemoteRejection{Key: key, Reason: tier.RejectWrongType, Count: 1, Detail: "the key holds a list, not a string"}, r.Recent[0])
	lines := scrape(t, metrics.NewCollector(m.Stats, metrics.Options{RecentRejections: true}))
	assert.Contains(t, lines, `pagedkv_remote_rejected_pages_total{reason="wrong_type"} 1`)
	assert.Contains(t, lines, `pagedkv_remote_recent_rejections{key="`+key+`",reason="wrong_type"} 1`)
	assert.Zero(t, r.Errors)
}

// numberedHybrid returns HybridStats whose pool-wide Stats are numbered()'s
// and whose groups (sliding, full) have their i-th number set to
// 1000*(g+1)+i+1, and the count of numbers of one group.
func numberedHybrid() (pagedkv.HybridStats, int) {
	s := pagedkv.HybridStats{Groups: []pagedkv.GroupStats{{Kind: pagedkv.SlidingAttention}, {Kind: pagedkv.FullAttention}}}
	s.Stats, _ = numbered()
	n := 0
	for g := range s.Groups {
		v := reflect.ValueOf(&s.Groups[g]).Elem()
		n = 0
		for i := range v.NumField() {
			if v.Type().Field(i).Name == "Kind" {
				continue // the kind label
			}
			n++
			v.Field(i).SetInt(int64(1000*(g+1) + n))
		}
	}
	return s, n
}

// TestHybridCollectorExposition: a HybridCollector exports the pool-wide
// Stats exactly as a Collector does, and every GroupStats number once per
// group, labelled with the group and its kind.
func TestHybridCollectorExposition(t *testing.T) {
	s, n := numberedHybrid()
	opts := metrics.Options{Namespace: "x", ConstLabels: prometheus.Labels{"pool": "gpu0"}}
	lines := scrape(t, metrics.NewHybridCollector(func() pagedkv.HybridStats { return s }, opts))
	var pool []string
	got := map[string][]int{}
	for _, l := range lines {
		if !strings.HasPrefix(l, "x_group_") {
			pool = append(pool, l)
			continue
		}
		v, err := strconv.Atoi(l[strings.LastIndexByte(l, ' ')+1:])
		require.NoError(t, err, l)
		labels := l[strings.IndexByte(l, '{'):strings.IndexByte(l, '}')]
		got[labels] = append(got[labels], v)
	}
	assert.Equal(t, scrape(t, metrics.NewCollector(func() pagedkv.Stats { return s.Stats }, opts)), pool,
		"the pool-wide series are a Collector's over HybridStats.Stats")
	for g, labels := range []string{`{group="0",kind="sliding",pool="gpu0"`, `{group="1",kind="full",pool="gpu0"`} {
		vs := got[labels]
		sort.Ints(vs)
		want := make([]int, n)
		for i := range want {
			want[i] = 1000*(g+1) + i + 1
		}
		assert.Equal(t, want, vs, "each GroupStats number of group %d (numbered) must be exported exactly once", g)
	}
	assert.Len(t, got, 2, "series of other groups: %v", got)
	assert.Contains(t, lines, `x_group_pinned_pages{group="1",kind="full",pool="gpu0"} 2003`)
	assert.Contains(t, lines, `x_group_window_released_pages_total{group="0",kind="sliding",pool="gpu0"} 1008`)
}

// TestHybridScrapeWhileRunning scrapes a live gpt-oss-like HybridManager
// (sliding window 6, full; pages of 4) from another goroutine while it
// runs (run with -race: HybridManager.Stats is safe from any goroutine),
// then checks the final scrape's per-group figures.
func TestHybridScrapeWhileRunning(t *testing.T) {
	h, err := pagedkv.NewHybrid(pagedkv.HybridConfig{Config: pagedkv.Config{NumPages: 32, PageSize: 4, HashSeed: 1},
		Groups: []pagedkv.LayerGroup{{Kind: pagedkv.SlidingAttention, WindowTokens: 6, NumLayers: 1}, {Kind: pagedkv.FullAttention, NumLayers: 1}}})
	require.NoError(t, err)
	c := metrics.NewHybridCollector(h.Stats, metrics.Options{})
	stop := scrapeUntilStopped(t, c, 1)
	// Requests 1..50 on one 13-token prompt, each computed and released:
	// request 1 publishes pages [0..3] [4..7] [8..11] in both groups, every
	// later one is served 12 tokens. The sliding group keeps the pages of
	// the last 6 computed tokens, so each request releases its page 0 (at
	// 12 computed tokens on admission, or at 13 after its step for request 1).
	prompt := []int32{1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13}
	for i := range 50 {
		id := pagedkv.RequestID(i + 1)
		_, err := h.Add(id, pagedkv.Request{Prompt: prompt})
		require.NoError(t, err)
		_, err = h.Reserve([]pagedkv.RequestID{id}, []int32{int32(len(prompt) - h.Computed(id))})
		require.NoError(t, err)
		require.NoError(t, h.Commit([]int32{pagedkv.NoToken}))
		require.NoError(t, h.Release(id))
	}
	_, pinned, err := h.Pin(pagedkv.Namespace{}, prompt)
	require.NoError(t, err)
	require.Equal(t, 12, pinned)
	stop()
	require.NoError(t, h.Audit())

	lines := scrape(t, c)
	for _, want := range []string{
		`pagedkv_pool_pages 32`,
		`pagedkv_steps_total 50`,
		`pagedkv_prompt_hit_tokens_total 588`, // 49 * 12
		`pagedkv_pinned_pages 6`,
		`pagedkv_cached_pages 6`,
		`pagedkv_pages{state="pinned_idle"} 6`,
		`pagedkv_pages{state="free"} 26`,
		`pagedkv_group_cached_pages{group="0",kind="sliding"} 3`,
		`pagedkv_group_cached_pages{group="1",kind="full"} 3`,
		`pagedkv_group_pinned_pages{group="0",kind="sliding"} 3`,
		`pagedkv_group_pinned_pages{group="1",kind="full"} 3`,
		`pagedkv_group_evictable_pages{group="0",kind="sliding"} 0`,
		`pagedkv_group_servable_tokens_total{group="0",kind="sliding"} 588`,
		`pagedkv_group_servable_tokens_total{group="1",kind="full"} 588`,
		`pagedkv_group_published_pages_total{group="0",kind="sliding"} 3`,
		`pagedkv_group_published_pages_total{group="1",kind="full"} 3`,
		`pagedkv_group_window_released_pages_total{group="0",kind="sliding"} 50`,
		`pagedkv_group_window_released_pages_total{group="1",kind="full"} 0`,
	} {
		assert.Contains(t, lines, want)
	}
}

// TestHybridScrapeStateGroups scrapes a HybridManager with state groups
// (three recurrent groups to one full-attention group): each state group
// is a series of kind "state" whose cached pages are its checkpoints, one
// page each, counted in the pool's cached pages.
func TestHybridScrapeStateGroups(t *testing.T) {
	gdn := pagedkv.LayerGroup{Kind: pagedkv.StateLayers, NumLayers: 1, State: layergroup.StateShape{
		ConvShape: [2]int{64, 3}, ConvDType: layergroup.StateBF16,
		SSMShape: [3]int{2, 16, 16}, SSMDType: layergroup.StateF32, PageBytes: 4096}}
	h, err := pagedkv.NewHybrid(pagedkv.HybridConfig{Config: pagedkv.Config{NumPages: 64, PageSize: 16, HashSeed: 1},
		Groups: []pagedkv.LayerGroup{gdn, gdn, gdn, {Kind: pagedkv.FullAttention, NumLayers: 1}}})
	require.NoError(t, err)
	prompt := make([]int32, 40)
	for i := range prompt {
		prompt[i] = int32(100 + i)
	}
	for id := range pagedkv.RequestID(2) {
		_, err := h.Add(id, pagedkv.Request{Prompt: prompt})
		require.NoError(t, err)
		for h.Computed(id) < len(prompt) {
			n := len(prompt) - h.Computed(id)
			if b := h.NextStateCheckpoint(id); b > 0 {
				n = b - h.Computed(id)
			}
			_, err := h.Reserve([]pagedkv.RequestID{id}, []int32{int32(n)})
			require.NoError(t, err)
			require.NoError(t, h.Commit(nil))
		}
		require.NoError(t, h.Release(id))
	}
	require.NoError(t, h.Audit())
	lines := scrape(t, metrics.NewHybridCollector(h.Stats, metrics.Options{}))
	for g := range 3 {
		for _, want := range []string{
			`pagedkv_group_cached_pages{group="%d",kind="state"} 1`, // the checkpoint at 32 tokens
			`pagedkv_group_published_pages_total{group="%d",kind="state"} 1`,
			`pagedkv_group_evictable_pages{group="%d",kind="state"} 1`,
		} {
			assert.Contains(t, lines, strings.Replace(want, "%d", strconv.Itoa(g), 1))
		}
	}
	assert.Contains(t, lines, `pagedkv_group_cached_pages{group="3",kind="full"} 2`)
	assert.Contains(t, lines, `pagedkv_cached_pages 5`, "2 attention pages and one checkpoint page per state group")
}
