package sim

import (
	"fmt"
	"io"
	"slices"
	"strings"
	"time"

	pagedkv "github.com/pagedkv/pagedkv"
)

// Summary is what a run did and found.
type Summary struct {
	Requests     int   // workload requests
	Forks        int   // parallel samples forked from them
	PromptTokens int64 // prompt tokens of the workload's requests
	OutputTokens int64 // tokens the workload asks to generate, every sample included

	Steps         int   // steps run (committed)
	Pages         int   // pool size
	CacheBytes    int64 // K/V cache of every layer
	PeakUsedPages int   // most pages held by requests after a Reserve

	// Stats is the Manager's final snapshot: hit rate, evictions,
	// preemptions, copies, window releases.
	Stats pagedkv.Stats

	cascade cascadeStats

	// Time is the wall time of the steps, split by who spent it.
	Time struct {
		Manager    time.Duration // Manager calls: Add, Resume, Reserve, Commit, Fork, Preempt, Release
		Model      time.Duration // synthesising the step's K/V/Q rows (the stand-in for the model)
		Append     time.Duration // copy-on-write copies, appendkv plan and append kernels
		Attention  time.Duration // decode, prefill and cascade kernels
		Verify     time.Duration // dense checks and audits
		TierCopies time.Duration // host tier copies (offloads and onloads), every layer
		Total      time.Duration // everything, the simulator's scheduling included
	}
	Wall time.Duration // the whole Run

	Verified struct {
		Checks       int     // steps checked
		Outputs      int64   // outputs (query row, head) compared with dense attention
		DraftOutputs int64   // of Outputs, those of draft rows
		KVTokens     int64   // paged K/V rows (token, layer) compared bit for bit
		MaxErr       float64 // largest |got - want| of an output element
		Atol, Rtol   float64 // the tolerance
		// StateOutputs are the outputs of state groups' recurrent layers
		// compared bit for bit with a recomputation from token 0;
		// RestoredOutputs those of requests that resumed from a state
		// checkpoint (a prefix hit of a model with state groups).
		StateOutputs, RestoredOutputs int64
		// MLAOutputs are the outputs of MLA groups (in Outputs), HitOutputs
		// those of requests admitted on a prefix hit; IndexerTokens the
		// indexer entries (token, layer) read back bit for bit through
		// their MLA pages, every step; IndexerHitTokens those of them at
		// positions a request's prefix hit served (pages from the cache,
		// a tier or a disaggregated run's handoff).
		MLAOutputs, HitOutputs, IndexerTokens, IndexerHitTokens int64
	}
	// StateHits are the admissions (Add or Resume) of a model with state
	// groups that resumed from a state checkpoint, StateHitTokens the
	// tokens those hits served.
	StateHits      int
	StateHitTokens int64
	Err            error // nil when every check passed and the run finished

	// Groups are a hybrid model's layer groups, in Config.Groups order; nil
	// for a dense model.
	Groups []GroupSummary

	// Device is the host/device traffic of a run on a device backend
	// (emu, cuda), whose caches stay in device memory; nil otherwise.
	Device *DeviceTraffic
}

// GroupSummary is one layer group's part of a hybrid run.
type GroupSummary struct {
	Spec pagedkv.LayerGroup
	// PeakPages is the most distinct pages the group's requests held after
	// a Reserve; MeanPages the mean over steps.
	PeakPages int
	pageSteps int64
	// Stats are the group's final numbers: cached pages, prefix tokens its
	// cache alone could serve (ServableTokens), evictions, window releases.
	Stats pagedkv.GroupStats
	// Outputs are the outputs of the group's layers compared with dense
	// attention under the group's window or chunk.
	Outputs int64
}

// MeanPages is the mean over a run's steps of the pages the group's
// requests held after a Reserve.
func (g *GroupSummary) MeanPages(steps int) float64 {
	if steps == 0 {
		return 0
	}
	return float64(g.pageSteps) / float64(steps)
}

// CascadeSteps is the number of steps that ran cascade attention.
func (s *Summary) CascadeSteps() int { return s.cascade.steps }

// CascadeLevels maps a level count to the number of steps that used it.
func (s *Summary) CascadeLevels() map[int]int { return s.cascade.byLevels }

// CascadeSavedBytes is the K/V bytes cascade levels did not read, compared
// with reading every request's pages (all layers).
func (s *Summary) CascadeSavedBytes() int64 { return s.cascade.savedBytes }

// Format writes the summary as aligned lines "name: value".
func (s *Summary) Format(w io.Writer, cfg *Config) {
	st := &s.Stats
	m := &cfg.Model
	var b strings.Builder
	line := func(name, format string, args ...any) {
		fmt.Fprintf(&b, "%-14s %s\n", name+":", fmt.Sprintf(format, args...))
	}
	line("requests", "%d (+%d parallel samples), %d prompt tokens, %d output tokens", s.Requests, s.Forks, s.PromptTokens, s.OutputTokens)
	dt := m.DType.String()
	if m.CacheDType() != m.DType {
		dt += " (cache " + m.CacheDType().String() + ")"
	}
	if hasMLA(cfg.Groups) {
		line("model", "%d layers, %d heads, MLA ckv %d + kpe %d, indexer K %d (fp8), %s; pool %d pages of %d tokens (%s of MLA and indexer cache)",
			m.Layers, m.NumQOHeads, mlaCKV, mlaKPE, indexerHeadDim, dt, cfg.NumPages, cfg.PageSize, bytesString(s.CacheBytes))
	} else {
		line("model", "%d layers, Hq %d, Hkv %d, D %d, %s %v; pool %d pages of %d tokens (%s of K/V)",
			m.Layers, m.NumQOHeads, m.NumKVHeads, m.HeadDim, dt, cfg.KVLayout, cfg.NumPages, cfg.PageSize, bytesString(s.CacheBytes))
	}
	if len(s.Groups) > 0 {
		kinds := make([]string, len(s.Groups))
		for g := range s.Groups {
			kinds[g] = groupString(s.Groups[g].Spec)
		}
		line("layer groups", "%d of %d layers each, layer l in group l %% %d: %s", len(s.Groups), s.Groups[0].Spec.NumLayers,
			len(s.Groups), strings.Join(kinds, ", "))
	}
	line("steps", "%d, %d tokens computed (%d recomputed after preemption)", s.Steps, st.ComputedTokens, st.RecomputedTokens())
	line("pages", "peak %d of %d in use by requests", s.PeakUsedPages, s.Pages)
	if len(s.Groups) > 0 {
		line("prefix hits", "%d of %d prompt tokens (%.1f%%): the prefix every group could serve", st.PromptHitTokens, st.PromptTokens, 100*st.HitRate())
		if s.Verified.StateOutputs > 0 || s.StateHits > 0 {
			line("state restores", "%d admissions resumed from a state checkpoint (%d tokens); %d recurrent outputs verified bit-exact against recomputing from token 0, %d of them after a restore",
				s.StateHits, s.StateHitTokens, s.Verified.StateOutputs, s.Verified.RestoredOutputs)
		}
		if v := &s.Verified; v.MLAOutputs > 0 || v.IndexerTokens > 0 {
			line("mla, indexer", "%d MLA outputs verified (%d of requests admitted on a prefix hit); %d indexer entries read back bit-exact through their MLA pages (%d at positions a prefix hit served)",
				v.MLAOutputs, v.HitOutputs, v.IndexerTokens, v.IndexerHitTokens)
		}
	} else {
		line("prefix hits", "%d of %d prompt tokens (%.1f%%)", st.PromptHitTokens, st.PromptTokens, 100*st.HitRate())
	}
	for g := range s.Groups {
		gs := &s.Groups[g]
		released := ""
		if gs.Spec.Kind == pagedkv.SlidingAttention || gs.Spec.Kind == pagedkv.ChunkedAttention {
			released = fmt.Sprintf(", %d released (out of the window or chunk)", gs.Stats.WindowReleasedPages)
		}
		line(fmt.Sprintf("group %d", g), "%s: pages held by requests peak %d, mean %.1f; %d cached at the end, %d published, %d evicted%s; %d tokens its cache alone could serve at admissions; %d outputs verified",
			groupString(gs.Spec), gs.PeakPages, gs.MeanPages(s.Steps), gs.Stats.CachedPages, gs.Stats.PublishedPages, gs.Stats.EvictedPages,
			released, gs.Stats.ServableTokens, gs.Outputs)
	}
	line("prefix cache", "%d pages published, %d duplicates kept private", st.PublishedPages, st.DuplicatePages)
	u := &st.CacheUsage
	line("cache usage", "%d tokens read (device %d, host %d, disk %d, remote %d), %d written", u.ReadTokens(),
		u.DeviceReadTokens, u.HostReadTokens, u.DiskReadTokens, u.RemoteReadTokens, u.WriteTokens)
	line("evictions", "%d pages evicted (%d returned to the pool)", st.EvictedPages, st.EvictionFreedPages)
	if c := &st.MissRatioCurve; c.SampledReferences > 0 {
		line("miss-ratio curve", "an LRU cache of 1/2x, 2x, 4x the pool, no limit: %.1f%%, %.1f%%, %.1f%%, %.1f%% page hits (%d page references sampled)",
			100*c.Half, 100*c.Double, 100*c.Quadruple, 100*c.Unlimited, c.SampledReferences)
	}
	line("preemptions", "%d; %d computed tokens lost, %d of them found in the cache on resume", st.Preemptions, st.ResumedTokens, st.ResumeHitTokens)
	line("copy-on-write", "%d pages copied", st.CopiedPages)
	if t := &st.Tiers; t.HostPages > 0 {
		line("host tier", "%d pages (%s); %d prompt tokens served from host; offloaded %d pages (%s device->host), onloaded %d (%s host->device); %d evicted pages dropped, %d offloads skipped (host full)",
			t.HostPages, bytesString(int64(t.HostPages)*int64(tierFormat(cfg).PageBytes())), t.HostHitTokens,
			t.OffloadedPages, bytesString(t.BytesToHost), t.OnloadedPages, bytesString(t.BytesToDevice), t.DroppedPages, t.HostFull)
	}
	if cfg.Remote != nil {
		r := &st.Tiers.Remote
		line("remote tier", "%d prompt tokens served from the store (%d pages fetched of %d asked in %d lookups); %d pages stored, %d dropped; %s remote->host, %s host->remote; errors %d (%d timeouts), %d values rejected",
			st.Tiers.RemoteHitTokens, st.Tiers.RemoteFetched, r.Requested, r.Lookups, r.Stored, r.Dropped,
			bytesString(r.BytesIn), bytesString(r.BytesOut), r.Errors, r.Timeouts, r.Rejected)
	}
	if cfg.SpecTokens > 0 {
		pct := 0.0
		if st.DraftTokens > 0 {
			pct = 100 * float64(st.AcceptedDraftTokens) / float64(st.DraftTokens)
		}
		line("speculative", "k=%d, %d drafts proposed, %d accepted (%.1f%%)", cfg.SpecTokens, st.DraftTokens, st.AcceptedDraftTokens, pct)
	}
	if cfg.WindowTokens > 0 {
		line("window", "%d tokens; %d pages released", cfg.WindowTokens, st.WindowReleasedPages)
	}
	if s.cascade.steps == 0 {
		line("cascade", "not used")
	} else {
		levels := make([]int, 0, len(s.cascade.byLevels))
		for l := range s.cascade.byLevels {
			levels = append(levels, l)
		}
		slices.Sort(levels)
		var parts []string
		for _, l := range levels {
			parts = append(parts, fmt.Sprintf("%d levels: %d", l, s.cascade.byLevels[l]))
		}
		steps := "steps"
		if len(s.Groups) > 0 {
			steps = "group plans"
		}
		line("cascade", "%d %s (%s); saved %d page reads per layer, %s of K/V reads",
			s.cascade.steps, steps, strings.Join(parts, ", "), s.cascade.savedPages, bytesString(s.cascade.savedBytes))
	}
	per := func(d time.Duration) string {
		if s.Steps == 0 {
			return "-"
		}
		return roundDuration(d / time.Duration(s.Steps)).String()
	}
	copies := ""
	if cfg.HostPages > 0 {
		copies = ", tier copies " + per(s.Time.TierCopies)
	}
	line("time/step", "manager %s, attention %s, append %s, model %s, verification %s%s, total %s",
		per(s.Time.Manager), per(s.Time.Attention), per(s.Time.Append), per(s.Time.Model), per(s.Time.Verify), copies, per(s.Time.Total))
	if d := s.Device; d != nil && s.Steps > 0 {
		n := int64(s.Steps)
		line("device bytes", "%s per step: index arrays %s, activations %s (k/v/q up, o down, %d layers), cache %s; verification read %s of pages, host tier moved %s, copy-on-write copied %s on the device",
			bytesString((d.Index+d.Activations+d.Cache)/n), bytesString(d.Index/n), bytesString(d.Activations/n), m.Layers,
			bytesString(d.Cache/n), bytesString(d.Verify), bytesString(d.Tier), bytesString(d.Copies))
		line("device host", "%s per step: plan %s, append and attention calls %s (%d layers; an emulator runs the kernels inside its calls, a GPU only queues them)",
			per(d.PlanTime+d.LaunchTime), per(d.PlanTime), per(d.LaunchTime), m.Layers)
	}
	line("wall time", "%s", roundDuration(s.Wall))
	v := &s.Verified
	if s.Err != nil {
		line("verification", "FAILED: %v", s.Err)
	} else {
		drafts := ""
		if cfg.SpecTokens > 0 {
			drafts = fmt.Sprintf(" (%d of draft rows)", v.DraftOutputs)
		}
		line("verification", "passed: %d outputs%s in %d checked steps within %.0e + %.2g*|want| of float64 attention (max |diff| %.2g); %d paged K/V rows bit-exact",
			v.Outputs, drafts, v.Checks, v.Atol, v.Rtol, v.MaxErr, v.KVTokens)
	}
	io.WriteString(w, b.String())
}

// roundDuration keeps about four significant digits.
func roundDuration(d time.Duration) time.Duration {
	switch {
	case d >= time.Second:
		return d.Round(time.Millisecond)
	case d >= time.Millisecond:
		return d.Round(10 * time.Microsecond)
	}
	return d.Round(100 * time.Nanosecond)
}

// bytesString formats n bytes in KiB, MiB or GiB.
func bytesString(n int64) string {
	switch {
	case n >= 1<<30:
		return fmt.Sprintf("%.1f GiB", float64(n)/(1<<30))
	case n >= 1<<20:
		return fmt.Sprintf("%.1f MiB", float64(n)/(1<<20))
	case n >= 1<<10:
		return fmt.Sprintf("%.1f KiB", float64(n)/(1<<10))
	}
	return fmt.Sprintf("%d B", n)
}
