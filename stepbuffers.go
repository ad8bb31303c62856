package pagedkv

import (
	"fmt"

	"github.com/pagedkv/pagedkv/cascade"
	"github.com/pagedkv/pagedkv/layergroup"
	"github.com/pagedkv/pagedkv/pagetable"
	"github.com/pagedkv/pagedkv/stepbuf"
)

// Engine-owned step buffers (docs/manager.md, "Step buffers"): the engine
// binds memory of fixed capacities (pinned host memory it allocated, or
// any memory) and every step's plan arrays are written there, packed at
// the offsets of a [StepBufferLayout], so that one copy moves the whole
// step to the GPU. The plan Reserve returns then aliases that memory.

// StepBufferCapacities bound the steps bound step buffers hold: requests,
// rows (tokens, drafts included), pages of each group's page table and
// cascade levels (see package stepbuf).
type StepBufferCapacities = stepbuf.Capacities

// StepBufferLayout is the packed layout of bound step buffers: one row per
// array with its byte offset and capacity (see package stepbuf).
type StepBufferLayout = stepbuf.Layout

// ErrStepCapacity reports a step that exceeds a capacity of the bound step
// buffers; it wraps [ErrBadArgument] (the C ABI's
// PAGEDKV_ERR_BAD_ARGUMENT). The step is refused before anything changes:
// split the batch.
var ErrStepCapacity = fmt.Errorf("%w: the step exceeds a capacity of the bound step buffers", ErrBadArgument)

// stepBuffers is a core's bound memory and the plans that alias it.
type stepBuffers struct {
	buf    *stepbuf.Buffers
	header []int32 // the pool header row
	copies []int32
	groups []boundGroup
	plan   HybridPlan // Groups[g] = &groups[g].plan
	step   int32
}

// boundGroup is one group's rows and its plan over them.
type boundGroup struct {
	header                                                           []int32
	qo, bi, pos, tok, tokPos, drafts, kvIndptr, kvPages, kvLast, seq []int32
	attnQO, attnKVIndptr, attnKVPages, attnKVLast, attnReqs          []int32
	queryRows, windowLeft, levelBatch                                []int32
	blockTables                                                      []int32 // nil without Config.BlockTablesStride
	levels                                                           [][4][]int32
	plan                                                             Plan
	layout                                                           cascade.Layout
	levelArrays                                                      []cascade.Level
	windows                                                          []int
}

// StepBufferLayoutFor returns the layout of step buffers with caps for a
// manager with the given layer groups (one for a dense Manager) and
// Config.BlockTablesStride blockTablesStride (each group then has a
// block_tables row of caps.MaxRequests*blockTablesStride entries), without
// binding anything: for sizing the memory to allocate.
// [Manager.StepBufferLayoutFor] reads both from the manager.
func StepBufferLayoutFor(caps StepBufferCapacities, groups []LayerGroup, blockTablesStride int) (*StepBufferLayout, error) {
	specs := make([]stepbuf.GroupSpec, len(groups))
	for g, lg := range groups {
		specs[g] = stepbuf.GroupSpec{Chunked: lg.Kind == layergroup.Chunked, BlockTablesStride: blockTablesStride}
	}
	l, err := stepbuf.NewLayout(caps, specs)
	if err != nil {
		return nil, fmt.Errorf("%w: step buffers: %w", ErrBadArgument, err)
	}
	return l, nil
}

// stepBufferLayoutFor is the layout of c's step buffers with caps.
func (c *core) stepBufferLayoutFor(caps StepBufferCapacities) (*StepBufferLayout, error) {
	groups := make([]LayerGroup, len(c.groups))
	for g, m := range c.groups {
		groups[g] = m.layerGroup
	}
	return StepBufferLayoutFor(caps, groups, c.groups[0].cfg.BlockTablesStride)
}

// bindStepBuffers binds mem with caps to c (see Manager.BindStepBuffers).
func (c *core) bindStepBuffers(mem []byte, caps StepBufferCapacities) (*StepBufferLayout, error) {
	lay, err := c.stepBufferLayoutFor(caps)
	if err != nil {
		return nil, err
	}
	buf, err := stepbuf.Bind(mem, lay)
	if err != nil {
		return nil, fmt.Errorf("%w: bind step buffers: %w", ErrBadArgument, err)
	}
	clear(buf.Mem)
	b := &stepBuffers{buf: buf, header: buf.Row(stepbuf.PoolHeader, -1, -1), copies: buf.Row(stepbuf.Copies, -1, -1),
		groups: make([]boundGroup, len(c.groups))}
	b.plan.Groups = make([]*Plan, len(c.groups))
	b.header[stepbuf.PoolNumGroups] = int32(len(c.groups))
	for g := range b.groups {
		bg := &b.groups[g]
		row := func(a stepbuf.Array) []int32 { return buf.Row(a, g, -1) }
		bg.header = row(stepbuf.GroupHeader)
		bg.qo, bg.bi, bg.pos = row(stepbuf.QOIndptr), row(stepbuf.BatchIndices), row(stepbuf.Positions)
		bg.tok, bg.tokPos, bg.drafts = row(stepbuf.TokenIDs), row(stepbuf.TokenPositions), row(stepbuf.Drafts)
		bg.kvIndptr, bg.kvPages, bg.kvLast, bg.seq = row(stepbuf.KVIndptr), row(stepbuf.KVPageIndices), row(stepbuf.KVLastPageLen), row(stepbuf.SeqLens)
		bg.attnQO, bg.attnKVIndptr, bg.attnKVPages = row(stepbuf.AttnQOIndptr), row(stepbuf.AttnKVIndptr), row(stepbuf.AttnKVPageIndices)
		bg.attnKVLast, bg.attnReqs = row(stepbuf.AttnKVLastPageLen), row(stepbuf.AttnRequests)
		bg.queryRows, bg.windowLeft, bg.levelBatch = row(stepbuf.QueryRows), row(stepbuf.CascadeWindowLeft), row(stepbuf.LevelBatchSize)
		bg.blockTables = row(stepbuf.BlockTables)
		bg.levels = make([][4][]int32, caps.MaxCascadeLevels)
		for l := range bg.levels {
			bg.levels[l] = [4][]int32{buf.Row(stepbuf.LevelQOIndptr, g, l), buf.Row(stepbuf.LevelKVIndptr, g, l),
				buf.Row(stepbuf.LevelKVPageIndices, g, l), buf.Row(stepbuf.LevelKVLastPageLen, g, l)}
		}
		bg.levelArrays = make([]cascade.Level, caps.MaxCascadeLevels)
		bg.windows = make([]int, caps.MaxCascadeLevels)
		b.plan.Groups[g] = &bg.plan
	}
	c.bound = b
	for g, m := range c.groups {
		m.levelCap, m.capLevels = caps.MaxCascadeLevels, true
		// The page table exports straight into the rows (their capacity
		// holds every step check admits), so write copies only the rest.
		bg := &b.groups[g]
		m.csr = pagetable.CSR{KVIndptr: bg.kvIndptr[:0], KVPageIndices: bg.kvPages[:0], KVLastPageLen: bg.kvLast[:0], SeqLens: bg.seq[:0]}
		m.appendCSR = pagetable.AppendCSR{AppendIndptr: bg.qo[:0], BatchIndices: bg.bi[:0], Positions: bg.pos[:0]}
		m.blockTables = bg.blockTables[:0:len(bg.blockTables)]
	}
	return lay, nil
}

// unbindStepBuffers returns c to plans over its own buffers.
func (c *core) unbindStepBuffers() {
	c.bound = nil
	for _, m := range c.groups {
		m.levelCap, m.capLevels = 0, false
		// Never export into the caller's memory again; the next step
		// allocates the group's own buffers.
		m.csr, m.appendCSR, m.blockTables = pagetable.CSR{}, pagetable.AppendCSR{}, nil
	}
}

// stepBufferLayout is the bound layout, nil when none is bound.
func (c *core) stepBufferLayout() *StepBufferLayout {
	if c.bound == nil {
		return nil
	}
	return c.bound.buf.Layout
}

// check refuses a prepared step of n requests that would not fit: its
// rows (drafts included) and each group's pages. Copies, chunked
// attention and cascade levels are bounded by these (package stepbuf).
func (b *stepBuffers) check(c *core, n int) error {
	caps := b.buf.Layout.Caps
	if n > caps.MaxRequests {
		return fmt.Errorf("%w: the step has %d requests, MaxRequests = %d", ErrStepCapacity, n, caps.MaxRequests)
	}
	nnz := int64(0)
	for _, t := range c.groups[0].ntokens {
		nnz += int64(t)
	}
	if nnz > int64(caps.MaxTokens) {
		return fmt.Errorf("%w: the step appends %d tokens (drafts included), MaxTokens = %d", ErrStepCapacity, nnz, caps.MaxTokens)
	}
	for g, m := range c.groups {
		if pages := m.preparedSlots / int64(m.pageSize); pages > int64(caps.MaxPages) {
			if len(c.groups) == 1 {
				return fmt.Errorf("%w: the step's page table holds %d pages, MaxPages = %d", ErrStepCapacity, pages, caps.MaxPages)
			}
			return fmt.Errorf("%w: the step's page table of group %d (%v) holds %d pages, MaxPages = %d",
				ErrStepCapacity, g, m.layerGroup.Kind, pages, caps.MaxPages)
		}
	}
	return nil
}

// put copies src into row and returns the row's first len(src) entries,
// with the row's capacity (stable from step to step, so a binding that
// caches a view per buffer and capacity keeps it).
func put(row, src []int32) []int32 {
	if len(src) > len(row) {
		// check bounds every array; an overflow here is a bug.
		panic(fmt.Sprintf("pagedkv: step buffers: %d entries in a row of %d", len(src), len(row)))
	}
	if len(src) > 0 && &src[0] != &row[0] { // the page table's arrays are exported in place
		copy(row, src)
	}
	return row[:len(src)]
}

// write copies the reserved step's plan p into the bound memory and
// returns the plan over it.
func (b *stepBuffers) write(p *HybridPlan) *HybridPlan {
	g0 := p.Groups[0]
	b.step = (b.step + 1) & (1<<31 - 1)
	h := b.header
	h[stepbuf.PoolBatchSize], h[stepbuf.PoolNNZ] = int32(len(g0.QOIndptr)-1), int32(len(g0.Positions))
	h[stepbuf.PoolNumCopies], h[stepbuf.PoolStep] = int32(len(p.Copies)), b.step
	if 3*len(p.Copies) > len(b.copies) {
		panic(fmt.Sprintf("pagedkv: step buffers: %d copies in a row of %d", len(p.Copies), len(b.copies)/3))
	}
	for i, c := range p.Copies {
		b.copies[3*i], b.copies[3*i+1], b.copies[3*i+2] = int32(c.Src), int32(c.Dst), int32(c.Entries)
	}
	for g, src := range p.Groups {
		b.groups[g].write(src)
	}
	b.plan.Requests, b.plan.Copies = p.Requests, p.Copies
	return &b.plan
}

// write copies one group's plan into its rows.
func (bg *boundGroup) write(src *Plan) {
	d := &bg.plan
	*d = *src
	d.QOIndptr, d.BatchIndices, d.Positions = put(bg.qo, src.QOIndptr), put(bg.bi, src.BatchIndices), put(bg.pos, src.Positions)
	d.TokenIDs, d.TokenPositions, d.Drafts = put(bg.tok, src.TokenIDs), put(bg.tokPos, src.TokenPositions), put(bg.drafts, src.Drafts)
	d.KVIndptr, d.KVPageIndices = put(bg.kvIndptr, src.KVIndptr), put(bg.kvPages, src.KVPageIndices)
	d.KVLastPageLen, d.SeqLens = put(bg.kvLast, src.KVLastPageLen), put(bg.seq, src.SeqLens)
	if src.BlockTables != nil {
		d.BlockTables = put(bg.blockTables, src.BlockTables)
	}
	h := bg.header
	h[stepbuf.GroupNumPages], h[stepbuf.GroupWindowLeft] = int32(len(src.KVPageIndices)), int32(src.WindowLeft)
	h[stepbuf.GroupNumAttn], h[stepbuf.GroupAttnPages], h[stepbuf.GroupNumLevels] = 0, 0, 0
	if src.AttnQOIndptr != nil {
		d.AttnQOIndptr, d.AttnKVIndptr = put(bg.attnQO, src.AttnQOIndptr), put(bg.attnKVIndptr, src.AttnKVIndptr)
		d.AttnKVPageIndices, d.AttnKVLastPageLen = put(bg.attnKVPages, src.AttnKVPageIndices), put(bg.attnKVLast, src.AttnKVLastPageLen)
		d.AttnRequests = put(bg.attnReqs, src.AttnRequests)
		h[stepbuf.GroupNumAttn], h[stepbuf.GroupAttnPages] = int32(len(src.AttnRequests)), int32(len(src.AttnKVPageIndices))
	}
	if l := src.Cascade; l != nil {
		// The layout's arrays alias the rows as well; RequestOrder,
		// RequestQOIndptr and QOLenByID stay the planner's.
		bg.layout = *l
		for i, lv := range l.Levels {
			r := &bg.levels[i]
			bg.levelArrays[i] = cascade.Level{QOIndptr: put(r[0], lv.QOIndptr), KVIndptr: put(r[1], lv.KVIndptr),
				KVPageIndices: put(r[2], lv.KVPageIndices), KVLastPageLen: put(r[3], lv.KVLastPageLen)}
			bg.levelBatch[i] = int32(len(lv.QOIndptr) - 1)
			bg.windowLeft[i] = int32(src.CascadeWindowLeft[i])
			bg.windows[i] = src.CascadeWindowLeft[i]
		}
		n := len(l.Levels)
		bg.layout.Levels = bg.levelArrays[:n:n]
		d.Cascade, d.CascadeWindowLeft = &bg.layout, bg.windows[:n:n]
		// query_rows: cascade row r holds plan row queryRows[r]; the
		// cascade's request IDs are batch indices.
		k := 0
		for j, id := range l.RequestOrder {
			start := src.QOIndptr[id]
			for i := range l.RequestQOIndptr[j+1] - l.RequestQOIndptr[j] {
				bg.queryRows[k] = start + i
				k++
			}
		}
		h[stepbuf.GroupNumLevels] = int32(n)
	}
}

// BindStepBuffers binds mem, the engine's memory (pinned host memory, or
// any memory), as the step buffers of capacities caps, and returns their
// layout; mem must hold at least layout.Size bytes from an address that is
// a multiple of stepbuf.Align. From the next Reserve on, every step's plan
// arrays are written there at the layout's offsets (the pool header
// first: batch size, rows, copies, groups, a step counter), and the Plan
// Reserve returns aliases mem (its Requests and Copies excepted). A step
// that exceeds a capacity fails with [ErrStepCapacity] before anything
// changes; a cascade deeper than MaxCascadeLevels is planned flat.
//
// The Manager keeps mem until [Manager.UnbindStepBuffers] or the next
// bind, and writes it only during a successful Reserve (the page table is
// exported straight into its rows); it clears mem's layout bytes.
// A bind that fails changes nothing (an earlier binding stays). Binding
// with a step pending is allowed and affects the next Reserve; the
// pending plan stays where it is.
func (m *Manager) BindStepBuffers(mem []byte, caps StepBufferCapacities) (*StepBufferLayout, error) {
	return m.core.bindStepBuffers(mem, caps)
}

// UnbindStepBuffers makes later plans use the Manager's own buffers
// again; the Manager then holds no reference to the memory bound before,
// but for the current plan, which stays valid until the next Reserve.
func (m *Manager) UnbindStepBuffers() { m.core.unbindStepBuffers() }

// StepBufferLayout returns the bound step buffers' layout, nil when none
// is bound.
func (m *Manager) StepBufferLayout() *StepBufferLayout { return m.core.stepBufferLayout() }

// StepBufferLayoutFor returns the layout BindStepBuffers would bind with
// caps (the package's StepBufferLayoutFor with m's groups and
// Config.BlockTablesStride), without binding anything.
func (m *Manager) StepBufferLayoutFor(caps StepBufferCapacities) (*StepBufferLayout, error) {
	return m.core.stepBufferLayoutFor(caps)
}

// BindStepBuffers is [Manager.BindStepBuffers] for a hybrid step: the pool
// header and the pool-wide copies, then one section of rows per group
// (each with its own copy of the step's tokens), the chunked groups with
// their attention rows.
func (h *HybridManager) BindStepBuffers(mem []byte, caps StepBufferCapacities) (*StepBufferLayout, error) {
	if h.core.state != nil {
		return nil, fmt.Errorf("%w: bind step buffers: a model with state groups plans into its own buffers (step buffers do not hold StateIndices yet)", ErrBadArgument)
	}
	return h.core.bindStepBuffers(mem, caps)
}

// UnbindStepBuffers is [Manager.UnbindStepBuffers].
func (h *HybridManager) UnbindStepBuffers() { h.core.unbindStepBuffers() }

// StepBufferLayout is [Manager.StepBufferLayout].
func (h *HybridManager) StepBufferLayout() *StepBufferLayout { return h.core.stepBufferLayout() }

// StepBufferLayoutFor is [Manager.StepBufferLayoutFor].
func (h *HybridManager) StepBufferLayoutFor(caps StepBufferCapacities) (*StepBufferLayout, error) {
	return h.core.stepBufferLayoutFor(caps)
}
