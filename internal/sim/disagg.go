package sim

import (
	"context"
	"errors"
	"fmt"
	"io"
	"slices"
	"time"

	pagedkv "github.com/pagedkv/pagedkv"
	"github.com/pagedkv/pagedkv/handoff"
)

// Disaggregated is what a disaggregated run did: a prefill Sim computes
// each request's prompt (and its first token), exports the request's full
// pages over a loopback TCP stream (package handoff) and releases it once
// the decode side acknowledged them; a decode Sim then runs the workload
// with the received pages as its remote tier, so every prompt's full pages
// arrive as a prefix hit and only the rest (under one page) and the output
// are computed there. Both sides are verified as any run; Single is the
// same workload in one process, whose tokens must equal the decode side's.
// The handoff is authenticated (HMAC-SHA256) under a key drawn at random
// for the run, on a listener bound to loopback.
type Disaggregated struct {
	Prefill, Decode, Single Summary
	// The handoff: requests sent, run descriptors (consecutive device
	// pages), pages and their K/V bytes, stream bytes on the wire, and
	// requests the receiver refused (kept by the prefill side).
	Requests, Descriptors, Pages int
	Bytes, StreamBytes           int64
	Refused                      int
	// AlreadyHeld is the requests (of Requests) the receiver admitted
	// with some pages it held already with other bytes (an earlier
	// request's, for a shared prefix): the decode side is served those.
	// Pages of a shared prefix computed alike are equal and count as
	// taken.
	AlreadyHeld int
	// MaxDescriptors is the most descriptors of one request.
	MaxDescriptors int
	// StatePages is the state checkpoint pages handed off (one per state
	// group of a request whose prompt has a checkpoint); the decode
	// side's state groups count the hits they served (RemoteHitTokens).
	StatePages int
	// SendTime is the wall time of the transfers (encode, loopback,
	// verify, admit, acknowledge).
	SendTime time.Duration
}

// handoffConfig names the simulated deployment in handoff values (as the
// CLI's Redis tier does) and draws the run's handoff key.
func handoffConfig(cfg *Config) handoff.Config {
	key := handoff.NewNonce() // 32 random bytes
	return handoff.Config{Namespace: fmt.Sprintf("simulate-model-seed%d", cfg.Model.Seed), Format: tierFormat(cfg), Key: key[:]}
}

// RunDisaggregated runs workload as a prefill process and a decode process
// in one process, handing every request's KV over loopback TCP, and checks
// the decode side against a single-process run of the same workload.
func RunDisaggregated(cfg Config, workload []Request) (Disaggregated, error) {
	return runDisaggregated(cfg, workload, nil)
}

// runDisaggregated is RunDisaggregated; tests break the prefill Sim with
// prefillHook (nil: none) before it runs.
func runDisaggregated(cfg Config, workload []Request, prefillHook func(*Sim)) (Disaggregated, error) {
	var d Disaggregated
	switch {
	case cfg.Groups != nil && !keepsEveryPage(cfg.Groups):
		return d, fmt.Errorf("%w: a disaggregated run needs a dense model or one of full-attention, MLA, indexer and state groups (a windowed group releases leading pages)", ErrBadConfig)
	case cfg.WindowTokens > 0:
		return d, fmt.Errorf("%w: a disaggregated run needs full attention (a window releases leading pages)", ErrBadConfig)
	case cfg.Remote != nil:
		return d, fmt.Errorf("%w: a disaggregated run's decode side uses the handoff as its remote tier", ErrBadConfig)
	}
	hcfg := handoffConfig(&cfg)
	fullPages := 0
	prefillWork := slices.Clone(workload)
	for i := range prefillWork {
		// Every group's pages, and a checkpoint page per state group.
		fullPages += max(1, len(cfg.Groups)) * (len(prefillWork[i].Prompt)/cfg.PageSize + 1)
		// The prefill side computes the prompt and samples one token.
		prefillWork[i].Output, prefillWork[i].Samples = 1, 1
	}
	st, err := handoff.NewStore(hcfg, max(1, fullPages))
	if err != nil {
		return d, fmt.Errorf("%w: %w", ErrBadConfig, err)
	}
	srv, err := handoff.Listen(st, handoff.ServerConfig{}) // loopback, a free port
	if err != nil {
		return d, err
	}
	defer srv.Close()
	addr := srv.Addr().String()

	pcfg := cfg
	pcfg.Progress = nil
	p, err := New(pcfg, prefillWork)
	if err != nil {
		return d, err
	}
	p.beforeRelease = func(r *reqState) error { return d.send(p, r, addr, hcfg) }
	if prefillHook != nil {
		prefillHook(p)
	}
	if d.Prefill, err = p.Run(); err != nil {
		return d, fmt.Errorf("prefill side: %w", err)
	}

	dcfg := cfg
	dcfg.Remote = st
	if dcfg.HostPages == 0 {
		dcfg.HostPages = cfg.NumPages // received pages land in host pages, then onload
	}
	dcfg.RemoteDeadline = time.Minute // an in-memory store: never the deadline
	dec, err := New(dcfg, workload)
	if err != nil {
		return d, err
	}
	d.Decode, err = dec.Run()
	if err != nil {
		return d, fmt.Errorf("decode side: %w", err)
	}
	scfg := cfg
	scfg.Progress = nil
	single, err := New(scfg, workload)
	if err != nil {
		return d, err
	}
	if d.Single, err = single.Run(); err != nil {
		return d, fmt.Errorf("single-process run: %w", err)
	}
	if err := sameOutputs(dec, single); err != nil {
		return d, err
	}
	return d, nil
}

// keepsEveryPage reports whether every group is full attention, MLA, an
// indexer (it follows its MLA group's pages) or a state group: a hybrid
// whose requests hold every page (no window release), so the prefill side
// can hand each page-owning group's pages off.
func keepsEveryPage(groups []pagedkv.LayerGroup) bool {
	for _, g := range groups {
		switch g.Kind {
		case pagedkv.FullAttention, pagedkv.MLAAttention, pagedkv.IndexerAttention, pagedkv.StateLayers:
		default:
			return false
		}
	}
	return true
}

// send exports request r of the prefill Sim p (its full pages, read from
// the engine's caches) and hands it to the decode side at addr: a dense
// model's one chain; a hybrid's chain per full-attention or MLA group
// (named by its tier tag; an MLA page's tier value carries its indexer
// pages, so an indexer group sends nothing of its own) and, per state group, the checkpoint of the deepest prefix
// the decode side can hit (its pages' state, flags 0x04).
func (d *Disaggregated) send(p *Sim, r *reqState, addr string, hcfg handoff.Config) error {
	if r.branch != 0 {
		return nil
	}
	h, hybrid := p.kv.(*pagedkv.HybridManager)
	if !hybrid {
		return d.sendPages(p, r, addr, hcfg, 0, "")
	}
	for g, spec := range p.cfg.Groups {
		if spec.Kind == pagedkv.FullAttention || spec.Kind == pagedkv.MLAAttention {
			if err := d.sendPages(p, r, addr, hcfg, g, h.TierTag(g)); err != nil {
				return err
			}
		}
	}
	// The decode side hits at most the prompt's pages before its last
	// token; the deepest checkpoint there is the one it can resume from.
	ps := p.cfg.PageSize
	prompt := r.tokens[:len(r.spec.Prompt)]
	n, slot := h.StateCheckpoint(pagedkv.Namespace{Tenant: r.ns}, prompt[:(len(prompt)-1)/ps*ps])
	if n == 0 {
		return nil
	}
	for j, g := range stateGroups(p.cfg.Groups) {
		req := &handoff.Request{Tenant: r.ns, Tokens: prompt[:n], Pages: [][]byte{make([]byte, hcfg.Format.PageBytes())},
			GroupTag: h.TierTag(g), State: true, Runs: []handoff.Run{{Page: int32(slot[j]), Pages: 1}}}
		if err := p.readPage(req.Pages[0], slot[j]); err != nil {
			return fmt.Errorf("export %s, state page %d: %w", r.name(), slot[j], err)
		}
		if err := d.transfer(r, addr, hcfg, req, 1); err != nil {
			return err
		}
		d.StatePages++
	}
	return nil
}

// stateGroups is the indexes of the state groups.
func stateGroups(groups []pagedkv.LayerGroup) []int {
	var out []int
	for g, s := range groups {
		if s.Kind == pagedkv.StateLayers {
			out = append(out, g)
		}
	}
	return out
}

// sendPages hands off group g's full pages of r (tag: the group's tier tag,
// "" for a dense model).
func (d *Disaggregated) sendPages(p *Sim, r *reqState, addr string, hcfg handoff.Config, g int, tag string) error {
	pages, start := p.kv.GroupPages(g, r.id)
	full := r.computed / p.cfg.PageSize
	if start != 0 || len(pages) < full {
		return fmt.Errorf("%w: %s holds %d pages from token %d, %d computed", ErrCheck, r.name(), len(pages), start, r.computed)
	}
	if full == 0 {
		return nil
	}
	ids := make([]int32, full)
	req := &handoff.Request{Tenant: r.ns, Tokens: r.tokens[:full*p.cfg.PageSize], Pages: make([][]byte, full), GroupTag: tag}
	for i, pg := range pages[:full] {
		ids[i] = int32(pg)
		req.Pages[i] = make([]byte, hcfg.Format.PageBytes())
		if err := p.readPage(req.Pages[i], pg); err != nil {
			return fmt.Errorf("export %s, page %d: %w", r.name(), pg, err)
		}
	}
	req.Runs = handoff.Plan(nil, ids)
	return d.transfer(r, addr, hcfg, req, full)
}

// transfer sends req (full pages) and counts it.
func (d *Disaggregated) transfer(r *reqState, addr string, hcfg handoff.Config, req *handoff.Request, full int) error {
	t := time.Now()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	err := handoff.Send(ctx, addr, hcfg, req)
	cancel()
	d.SendTime += time.Since(t)
	switch {
	case errors.Is(err, handoff.ErrRefused):
		d.Refused++ // the decode side recomputes it
		return nil
	case errors.Is(err, handoff.ErrAlreadyHeld):
		d.AlreadyHeld++ // admitted: the decode side is served the held pages
	case err != nil:
		return fmt.Errorf("hand %s off: %w", r.name(), err)
	}
	d.Requests++
	d.Descriptors += len(req.Runs)
	d.MaxDescriptors = max(d.MaxDescriptors, len(req.Runs))
	d.Pages += full
	d.Bytes += int64(full) * int64(hcfg.Format.PageBytes())
	d.StreamBytes += hcfg.StreamBytes(req)
	return nil
}

// sameOutputs checks that two runs of one workload generated the same
// tokens for every request and sample.
func sameOutputs(a, b *Sim) error {
	key := func(r *reqState) string { return fmt.Sprintf("%s/%d", r.spec.Name, r.branch) }
	want := map[string][]int32{}
	for _, r := range b.finished {
		want[key(r)] = r.tokens
	}
	if len(a.finished) != len(b.finished) {
		return fmt.Errorf("%w: %d requests finished on the decode side, %d in one process", ErrCheck, len(a.finished), len(b.finished))
	}
	for _, r := range a.finished {
		if !slices.Equal(r.tokens, want[key(r)]) {
			return fmt.Errorf("%w: %s: the decode side's tokens differ from the single-process run's", ErrCheck, r.name())
		}
	}
	return nil
}

// Format writes the handoff's numbers, then the decode side's summary.
func (d *Disaggregated) Format(w io.Writer, cfg *Config) {
	fmt.Fprintf(w, "%-14s %d requests handed off over loopback TCP (HMAC-SHA256), %d refused, %d already held; %d pages in %d descriptors (%.2f per request, at most %d), %s of K/V, %s on the wire, %v sending\n",
		"handoff:", d.Requests, d.Refused, d.AlreadyHeld, d.Pages, d.Descriptors, float64(d.Descriptors)/float64(max(1, d.Requests)), d.MaxDescriptors,
		bytesString(d.Bytes), bytesString(d.StreamBytes), d.SendTime.Round(time.Millisecond))
	if d.StatePages > 0 {
		fmt.Fprintf(w, "%-14s %d state checkpoint pages handed off (a request per group: full-attention pages by group, one checkpoint page per state group)\n", "handoff state:", d.StatePages)
	}
	st := d.Decode.Stats.Tiers
	fmt.Fprintf(w, "%-14s %d prompt tokens received as prefix hits (%d pages onloaded); outputs verified: %d on the prefill side, %d on the decode side, %d in one process; tokens equal to the single-process run\n",
		"decode side:", st.RemoteHitTokens, st.OnloadedPages, d.Prefill.Verified.Outputs, d.Decode.Verified.Outputs, d.Single.Verified.Outputs)
	d.Decode.Format(w, cfg)
}
