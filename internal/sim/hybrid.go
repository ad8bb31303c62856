package sim

import (
	"errors"
	"fmt"
	"slices"
	"strings"

	pagedkv "github.com/pagedkv/pagedkv"
	"github.com/pagedkv/pagedkv/events"
	"github.com/pagedkv/pagedkv/kernels"
	"github.com/pagedkv/pagedkv/kernels/cuda"
	"github.com/pagedkv/pagedkv/layergroup"
)

// Hybrid attention models: Config.Groups describes the model's layer
// groups and the run drives a pagedkv.HybridManager (one page pool, a page
// table and prefix cache per group) instead of a Manager.
//
// Layer l of the model belongs to group l % G as that group's layer l / G
// (G = len(Groups)): the presets' patterns repeat every G layers. Group g's
// layer j keeps its K/V in the engine's cache tensor j, as the root
// package's page-bytes rule has it (a page belongs to one group at a time,
// so the groups never share an entry), and its attention runs over its own
// plan: its page table, its window_left, and a chunked group's Attn arrays.

// ModelPreset is a model shape `pagedkv simulate --model` runs.
type ModelPreset struct {
	Name string
	// Pattern is the groups of one repetition of the layer pattern, layer
	// count unset (each group gets Model.Layers/len(Pattern) layers). Nil
	// for the dense model: one Manager, full attention or --window.
	Pattern []pagedkv.LayerGroup
	// Layers is the preset's layer count when --layers is not given: the
	// default model's 4 layers, or one pattern when that is longer.
	Layers int
	// Doc says what the preset is, and how it is scaled from the model it
	// is named after.
	Doc string
	// Sinks gives the model attention sinks (Model.Sinks).
	Sinks bool
}

// ErrUnknownModel is wrapped by Preset's error for a name it does not know,
// ErrNotSimulated for a model the simulator knows but cannot run.
var (
	ErrUnknownModel = errors.New("sim: unknown model")
	ErrNotSimulated = errors.New("sim: model not simulated")
)

var presets = []ModelPreset{
	{Name: "dense", Layers: 4,
		Doc: "every layer full attention (or --window W): one Manager; the default"},
	{Name: "gpt-oss-like", Layers: 4,
		Pattern: []pagedkv.LayerGroup{{Kind: pagedkv.SlidingAttention, WindowTokens: 128}, {Kind: pagedkv.FullAttention}},
		Sinks:   true,
		Doc:     "gpt-oss: layers alternate sliding window 128 (even layers) and full attention (odd layers); 2 groups, window at its real size; attention sinks (one learned-like logit per query head, FlashInfer's sinks)"},
	{Name: "gemma-3-like", Layers: 6,
		Pattern: []pagedkv.LayerGroup{
			{Kind: pagedkv.SlidingAttention, WindowTokens: 64}, {Kind: pagedkv.SlidingAttention, WindowTokens: 64},
			{Kind: pagedkv.SlidingAttention, WindowTokens: 64}, {Kind: pagedkv.SlidingAttention, WindowTokens: 64},
			{Kind: pagedkv.SlidingAttention, WindowTokens: 64}, {Kind: pagedkv.FullAttention}},
		Doc: "Gemma 3: five sliding-window layers to one full layer (layers 6i..6i+4 sliding, 6i+5 full); 6 groups of equal layer count; window 64 = Gemma 3's 1024 scaled by 1/16 so the simulator's sequences (up to ~250 tokens by default) outgrow it"},
	{Name: "llama-4-like", Layers: 4,
		Pattern: []pagedkv.LayerGroup{
			{Kind: pagedkv.ChunkedAttention, ChunkTokens: 128}, {Kind: pagedkv.ChunkedAttention, ChunkTokens: 128},
			{Kind: pagedkv.ChunkedAttention, ChunkTokens: 128}, {Kind: pagedkv.FullAttention}},
		Doc: "Llama 4: chunked local attention on three of four layers (layers 4i..4i+2), full attention on the fourth; 4 groups; chunk 128 = Llama 4's 8192 scaled by 1/64 so sequences cross chunk boundaries (a multiple of the page size for pages of up to 128 tokens)"},
	{Name: "qwen3-next-like", Layers: 4,
		Pattern: []pagedkv.LayerGroup{
			{Kind: pagedkv.StateLayers, State: qwen3NextState}, {Kind: pagedkv.StateLayers, State: qwen3NextState},
			{Kind: pagedkv.StateLayers, State: qwen3NextState}, {Kind: pagedkv.FullAttention}},
		Doc: "Qwen3-Next: three Gated DeltaNet layers to one full-attention layer (layers 4i..4i+2 state, 4i+3 full); 4 groups; each GDN state a conv state (conv_dim 128, kernel 4 - 1 = 3, bf16) and a delta-rule state 4 heads x 16 x 16 f32, Qwen3-Next-80B's 32 value heads x 128 x 128 and conv_dim 8192 scaled by 1/8 in heads and dims; run by the simulator's deterministic recurrent layer (docs/simulate.md)"},
	{Name: "nemotron-h-like", Layers: 7,
		Pattern: []pagedkv.LayerGroup{
			{Kind: pagedkv.StateLayers, State: nemotronHState}, {Kind: pagedkv.StateLayers, State: nemotronHState},
			{Kind: pagedkv.StateLayers, State: nemotronHState}, {Kind: pagedkv.StateLayers, State: nemotronHState},
			{Kind: pagedkv.StateLayers, State: nemotronHState}, {Kind: pagedkv.StateLayers, State: nemotronHState},
			{Kind: pagedkv.FullAttention}},
		Doc: "Nemotron-H: six Mamba-2 layers to one full-attention layer (Nemotron-H-8B's 24 Mamba-2 : 4 attention; layers 7i..7i+5 state, 7i+6 full); 7 groups; each Mamba-2 state a conv state (conv_dim 96, kernel 4 - 1 = 3, bf16) and an SSM state 8 heads x 8 x 16 f32, Nemotron-H-8B's 128 heads x head_dim 64 x d_state 128 scaled by 1/16, 1/8, 1/8; run by the simulator's deterministic recurrent layer"},
	{Name: "deepseek-v3.2-like", Layers: 4,
		Pattern: []pagedkv.LayerGroup{{Kind: pagedkv.MLAAttention},
			{Kind: pagedkv.IndexerAttention, Target: 0, IndexerHeadDim: indexerHeadDim, IndexerQuantBlock: indexerQuantBlock}},
		Doc: "DeepSeek-V3.2: MLA in every layer with the lightning indexer's K cache beside it; 2 groups, an MLA group and its indexer group (layer j of the indexer group is MLA layer j's indexer, following its pages page for page); kv_lora_rank 512, qk_rope_head_dim 64, qk_nope_head_dim 128 scaled by 1/16 (ckv 32, kpe 4), index_head_dim 128 by 1/8 (16, fp8 e4m3 with one float32 scale per token); MLA decode per query row on the CPU backend, the indexer pages read back every step (docs/simulate.md)"},
}

// The presets' state shapes (layergroup.StateShape). PageBytes is the
// default simulator page (16 tokens x 2 kv heads x 64 dims x K and V x
// f16 = 8192 bytes); a run sets it to its own page's bytes.
var (
	// Qwen3-Next-80B-A3B (config.json): linear_num_key_heads 16,
	// linear_num_value_heads 32, linear_key_head_dim = linear_value_head_dim
	// = 128, linear_conv_kernel_dim 4: conv_dim = 2*16*128 + 32*128 = 8192,
	// recurrent state (32, 128, 128). Scaled: 2 key heads, 4 value heads,
	// dims 16: conv_dim 2*2*16 + 4*16 = 128.
	qwen3NextState = layergroup.StateShape{ConvShape: [2]int{128, 3}, ConvDType: layergroup.StateBF16,
		SSMShape: [3]int{4, 16, 16}, SSMDType: layergroup.StateF32, PageBytes: 8192}
	// Nemotron-H-8B (config.json): mamba_num_heads 128, mamba_head_dim 64,
	// ssm_state_size 128, n_groups 8, conv_kernel 4, expand 2 (d_inner
	// 8192): conv_dim = 8192 + 2*8*128 = 10240, SSM state (128, 64, 128).
	// Scaled: 8 heads x head_dim 8 (d_inner 64), d_state 16, 1 group:
	// conv_dim 64 + 2*16 = 96.
	nemotronHState = layergroup.StateShape{ConvShape: [2]int{96, 3}, ConvDType: layergroup.StateBF16,
		SSMShape: [3]int{8, 8, 16}, SSMDType: layergroup.StateF32, PageBytes: 8192}
)

// notSimulated are model names the simulator knows but cannot run, with why.
var notSimulated = map[string]string{
	"mla": "MLA alone is not a preset; deepseek-v3.2-like runs MLA groups with their indexer (the backends' MLADecode once per query row; see docs/simulate.md)",
}

// ModelNames lists the presets Preset accepts.
func ModelNames() []string {
	names := make([]string, len(presets))
	for i, p := range presets {
		names[i] = p.Name
	}
	return names
}

// Preset returns the preset named name, or an error wrapping
// ErrUnknownModel that names it and lists the valid names.
func Preset(name string) (ModelPreset, error) {
	for _, p := range presets {
		if p.Name == name {
			return p, nil
		}
	}
	valid := strings.Join(ModelNames(), ", ")
	if why, ok := notSimulated[name]; ok {
		return ModelPreset{}, fmt.Errorf("%w: %q: %s; valid models: %s", ErrNotSimulated, name, why, valid)
	}
	return ModelPreset{}, fmt.Errorf("%w: %q; valid models: %s", ErrUnknownModel, name, valid)
}

// Groups returns the layer groups of a model of the preset with layers
// layers (nil for the dense model), or an error if layers is not a
// positive multiple of the pattern's length.
func (p ModelPreset) Groups(layers int) ([]pagedkv.LayerGroup, error) {
	if p.Pattern == nil {
		return nil, nil
	}
	n := len(p.Pattern)
	if layers < n || layers%n != 0 {
		return nil, fmt.Errorf("%w: model %s has a pattern of %d layer groups; layers = %d, want a positive multiple of %d",
			ErrBadConfig, p.Name, n, layers, n)
	}
	groups := make([]pagedkv.LayerGroup, n)
	for g, s := range p.Pattern {
		s.NumLayers = layers / n
		groups[g] = s
	}
	return groups, nil
}

// groupString describes a group: "sliding 128", "chunked 8192", "full".
func groupString(s pagedkv.LayerGroup) string {
	switch s.Kind {
	case pagedkv.SlidingAttention:
		return fmt.Sprintf("sliding %d", s.WindowTokens)
	case pagedkv.ChunkedAttention:
		return fmt.Sprintf("chunked %d", s.ChunkTokens)
	case pagedkv.StateLayers:
		return fmt.Sprintf("state %d B", s.State.Bytes())
	case pagedkv.IndexerAttention:
		return fmt.Sprintf("indexer of %d", s.Target)
	}
	return s.Kind.String()
}

// validateGroups checks what the simulator needs of Config.Groups beyond
// what NewHybrid checks, and the features it does not combine with groups.
func (c *Config) validateGroups() error {
	if c.Groups == nil {
		return nil
	}
	layers := 0
	for _, g := range c.Groups {
		layers += g.NumLayers
	}
	switch {
	case len(c.Groups) == 0:
		return fmt.Errorf("%w: no layer groups", ErrBadConfig)
	case layers != c.Model.Layers:
		return fmt.Errorf("%w: the layer groups have %d layers, the model %d", ErrBadConfig, layers, c.Model.Layers)
	case c.WindowTokens != 0:
		return fmt.Errorf("%w: window %d with layer groups: a hybrid model's windows are its groups'", ErrBadConfig, c.WindowTokens)
	}
	for _, g := range c.Groups {
		if g.Kind == pagedkv.StateLayers {
			if err := c.validateStateModel(); err != nil {
				return err
			}
			break
		}
	}
	if hasMLA(c.Groups) {
		if err := c.validateMLAModel(); err != nil {
			return err
		}
	}
	if DeviceBackend(c.Backend) {
		return fmt.Errorf("%w: backend %s with layer groups: the simulator runs hybrid models on host backends only", ErrBadConfig, c.Backend.Name())
	}
	return nil
}

// RecorderConfig returns the events.RecorderConfig of a run of cfg's KV
// events (Config.Events): the pool's pages and tiers, and for a hybrid
// model one group per layer group, with the group's kv_cache_spec_kind and
// sliding window (pagedkv.KVEventSpec), so that every event carries its
// group_idx; a dense model's window is its sliding window.
func RecorderConfig(cfg *Config) events.RecorderConfig {
	rc := events.RecorderConfig{NumPages: cfg.NumPages, HostPages: cfg.HostPages, PageSize: cfg.PageSize}
	if cfg.Groups == nil {
		rc.SlidingWindow = cfg.WindowTokens
		return rc
	}
	for _, spec := range cfg.Groups {
		if spec.OwnsPages() { // indexer and shared-KV groups send no events
			k, w := pagedkv.KVEventSpec(spec)
			rc.Groups = append(rc.Groups, events.GroupConfig{SpecKind: k, SlidingWindow: w})
		}
	}
	return rc
}

// groupPages counts the distinct pages the running requests hold in each
// group after a Reserve, keeps each group's peak and sum, and checks that
// they add up to the pool's pages in use by requests (a page belongs to
// one group at a time), up to the pages held only by tier copies in flight
// (offloads the Reserve's evictions planned), which count as in use too,
// and for state groups the pages held only by checkpoints that requests
// read and by the step's state copies (their sources).
func (s *Sim) groupPages(used int, plan *pagedkv.HybridPlan) error {
	total, held := 0, 0
	for g := range s.kv.NumGroups() {
		gs := &s.sum.Groups[g]
		if !gs.Spec.OwnsPages() {
			// An indexer's pages are its MLA group's, counted there.
			if err := s.aliasPages(g, gs.Spec.Target); err != nil {
				return err
			}
			continue
		}
		clear(s.mark)
		n := 0
		for _, r := range s.running {
			pages, _ := s.kv.GroupPages(g, r.id)
			for _, p := range pages {
				if !s.mark[p] {
					s.mark[p] = true
					n++
				}
			}
		}
		gs.PeakPages = max(gs.PeakPages, n)
		gs.pageSteps += int64(n)
		total += n
		if gs.Spec.Kind == pagedkv.StateLayers {
			st := s.kv.GroupStats(g)
			held += st.CachedPages - st.EvictablePages
			for _, c := range plan.Groups[g].Copies {
				if !s.mark[c.Src] {
					s.mark[c.Src] = true
					held++
				}
			}
		}
	}
	if inflight := s.kv.TierCopiesInFlight(); total > used || used > total+inflight+held {
		return fmt.Errorf("%w: after step %d's Reserve the running requests hold %d pages over the groups, the pool says %d in use (%d tier copies in flight, %d held by state checkpoints and copies)",
			ErrCheck, s.sum.Steps, total, used, inflight, held)
	}
	return nil
}

// aliasPages checks that every running request's pages in alias group g
// (an indexer) are exactly those of its target group.
func (s *Sim) aliasPages(g, target int) error {
	for _, r := range s.running {
		pages, _ := s.kv.GroupPages(g, r.id)
		want, _ := s.kv.GroupPages(target, r.id)
		if !slices.Equal(pages, want) {
			return fmt.Errorf("%w: after step %d's Reserve request %s has pages %v in group %d, its target group %d has %v",
				ErrCheck, s.sum.Steps, r.name(), pages, g, target, want)
		}
	}
	return nil
}

// DeviceBackend reports whether b keeps the caches in device memory (the
// engine's device-resident path, which runs dense models only).
func DeviceBackend(b kernels.Backend) bool {
	_, ok := b.(*cuda.Backend)
	return ok
}
