package appendkv_test

import (
	"fmt"
	"math/rand/v2"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/pagedkv/pagedkv/allocator"
	"github.com/pagedkv/pagedkv/appendkv"
	"github.com/pagedkv/pagedkv/kernels"
	"github.com/pagedkv/pagedkv/kernels/cpu"
	"github.com/pagedkv/pagedkv/layout"
	"github.com/pagedkv/pagedkv/pagetable"
)

func TestBuildWorkedExamples(t *testing.T) {
	for _, tc := range []struct {
		name         string
		appendIndptr []int32
		seqLens      []int32
		batchIndices []int32
		positions    []int32
	}{
		{ // flashinfer-semantics §1.7, the page-layout figure
			"figure", []int32{0, 4, 6, 9}, []int32{22, 20, 15},
			[]int32{0, 0, 0, 0, 1, 1, 2, 2, 2}, []int32{18, 19, 20, 21, 18, 19, 12, 13, 14},
		},
		{ // get_batch_indices_positions docstring
			"docstring", []int32{0, 1, 3, 6, 10}, []int32{5, 5, 5, 5},
			[]int32{0, 1, 1, 2, 2, 2, 3, 3, 3, 3}, []int32{4, 3, 4, 2, 3, 4, 1, 2, 3, 4},
		},
		{ // append_paged_kv_cache docstring: a pure prefill
			"prefill", []int32{0, 45, 53, 78, 100}, []int32{45, 8, 25, 22}, nil, nil,
		},
		{"empty requests", []int32{0, 0, 2, 2}, []int32{0, 7, 3}, []int32{1, 1}, []int32{5, 6}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var p appendkv.Plan
			require.NoError(t, p.Build(tc.appendIndptr, tc.seqLens))
			assert.Equal(t, int(tc.appendIndptr[len(tc.appendIndptr)-1]), p.Nnz())
			if tc.batchIndices != nil {
				assert.Equal(t, tc.batchIndices, p.BatchIndices)
				assert.Equal(t, tc.positions, p.Positions)
				return
			}
			// The prefill: positions 0..len-1 of every request.
			i := 0
			for b, n := range tc.seqLens {
				for pos := range n {
					require.Equal(t, [2]int32{int32(b), pos}, [2]int32{p.BatchIndices[i], p.Positions[i]}, "row %d", i)
					i++
				}
			}
		})
	}
}

func TestBuildRejects(t *testing.T) {
	var p appendkv.Plan
	require.NoError(t, p.Build([]int32{0, 2}, []int32{5}))
	before := p.Clone()
	for name, args := range map[string][2][]int32{
		"empty indptr":           {nil, nil},
		"indptr not from 0":      {{1, 2}, {5}},
		"decreasing indptr":      {{0, 3, 2}, {5, 5}},
		"seq_lens too short":     {{0, 1, 2}, {5}},
		"more rows than seq_len": {{0, 4}, {3}},
	} {
		err := p.Build(args[0], args[1])
		require.ErrorIs(t, err, pagetable.ErrBadCSR, name)
		t.Logf("%s: %v", name, err)
		require.Equal(t, before, p.Clone(), "%s: a failed Build leaves the plan as it was", name)
	}
}

// figureTable is the page table of the page-layout figure (§1.7): page_size
// 8, 9 pages; request 0 has pages 0,5,8 (22 tokens), request 1 pages 1,6,7
// (20), request 2 pages 3,4 (15).
func figureTable() kernels.PageTable {
	return kernels.PageTable{KVIndptr: []int32{0, 3, 6, 8}, KVPageIndices: []int32{0, 5, 8, 1, 6, 7, 3, 4}, KVLastPageLen: []int32{6, 4, 7}}
}

// picture draws which entries of each page hold a non-zero K value.
func picture(c *kernels.PagedKVCache) string {
	g := c.Geometry
	var sb strings.Builder
	k := make([]float32, g.HeadDim)
	for page := 0; page < g.NumPages; page++ {
		fmt.Fprintf(&sb, "page %d: ", page)
		for entry := 0; entry < g.PageSize; entry++ {
			c.GatherK(k, page, entry, 0)
			if k[0] != 0 {
				sb.WriteByte('x')
			} else {
				sb.WriteByte('.')
			}
		}
		sb.WriteByte('\n')
	}
	return sb.String()
}

// The appended tokens of the figure land in the highlighted cells: page 8
// entries 2..5, page 7 entries 2..3, page 4 entries 4..6.
func TestRunFigure(t *testing.T) {
	const want = `page 0: ........
page 1: ........
page 2: ........
page 3: ........
page 4: ....xxx.
page 5: ........
page 6: ........
page 7: ..xx....
page 8: ..xxxx..
`
	for _, l := range []layout.KVLayout{layout.NHD, layout.HND} {
		for _, f := range []layout.TensorForm{layout.Fused, layout.Split} {
			table := figureTable()
			cache, err := kernels.NewPagedKVCache(layout.Paged{Layout: l, Form: f, DType: layout.F16, NumPages: 9, PageSize: 8, NumKVHeads: 2, HeadDim: 64})
			require.NoError(t, err)
			var p appendkv.Plan
			require.NoError(t, p.BuildFromTable(&table, 8, []int32{0, 4, 6, 9}))
			require.Equal(t, []int32{22, 20, 15}, p.SeqLens)
			vals := make([]float32, 9*2*64)
			for i := range vals {
				vals[i] = float32(1 + i/(2*64)) // row i holds i+1
			}
			key := kernels.TensorFromF32(layout.F16, vals, 9, 2, 64)
			require.NoError(t, p.Run(cpu.New(cpu.Config{}), appendkv.Input{AppendKey: key, AppendValue: key, Cache: &cache, Table: &table}))
			assert.Equal(t, want, picture(&cache), "%v/%v", l, f)
			// Row 6 (request 2, position 12) is page 4 entry 4.
			k := make([]float32, 64)
			cache.GatherK(k, 4, 4, 1)
			assert.Equal(t, float32(7), k[0])
		}
	}
}

func TestRunRejectsMismatchAndWritesNothing(t *testing.T) {
	table := figureTable()
	cache, err := kernels.NewPagedKVCache(layout.Paged{Layout: layout.NHD, Form: layout.Fused, DType: layout.BF16, NumPages: 9, PageSize: 8, NumKVHeads: 1, HeadDim: 64})
	require.NoError(t, err)
	var p appendkv.Plan
	require.NoError(t, p.BuildFromTable(&table, 8, []int32{0, 4, 6, 9}))
	key := kernels.TensorFromF32(layout.BF16, make([]float32, 9*64), 9, 1, 64)
	for i := range key.Data {
		key.Data[i] = 0x3f
	}
	be := cpu.New(cpu.Config{})

	other := figureTable()
	other.KVLastPageLen[1] = 3 // request 1 one token shorter than planned
	err = p.Run(be, appendkv.Input{AppendKey: key, AppendValue: key, Cache: &cache, Table: &other})
	require.ErrorIs(t, err, appendkv.ErrPlanMismatch)
	t.Log(err)

	short := figureTable()
	short.KVIndptr, short.KVLastPageLen = short.KVIndptr[:3], short.KVLastPageLen[:2]
	require.ErrorIs(t, p.Run(be, appendkv.Input{AppendKey: key, AppendValue: key, Cache: &cache, Table: &short}), appendkv.ErrPlanMismatch)

	// The backend's own validation comes through errors.Is.
	badKey := kernels.TensorFromF32(layout.BF16, make([]float32, 8*64), 8, 1, 64)
	err = p.Run(be, appendkv.Input{AppendKey: badKey, AppendValue: key, Cache: &cache, Table: &table})
	require.ErrorIs(t, err, kernels.ErrInvalidTensor)
	t.Log(err)

	bad := figureTable()
	bad.KVPageIndices[2] = 9 // page id outside the pool
	require.ErrorIs(t, p.Run(be, appendkv.Input{AppendKey: key, AppendValue: key, Cache: &cache, Table: &bad}), kernels.ErrIndexOutOfRange)

	require.ErrorIs(t, p.Run(be, appendkv.Input{AppendKey: key, AppendValue: key, Table: &table}), appendkv.ErrPlanMismatch)
	assert.Equal(t, make([]byte, len(cache.Data)), cache.Data, "failed runs wrote nothing")
}

// A decode step (Build + Run) does not allocate once the plan's buffers have
// grown.
func TestStepDoesNotAllocate(t *testing.T) {
	table := figureTable()
	cache, err := kernels.NewPagedKVCache(layout.Paged{Layout: layout.HND, Form: layout.Split, DType: layout.F16, NumPages: 9, PageSize: 8, NumKVHeads: 2, HeadDim: 64})
	require.NoError(t, err)
	key := kernels.NewTensor(layout.F16, 3, 2, 64)
	be := cpu.New(cpu.Config{Workers: 1})
	var p appendkv.Plan
	indptr := []int32{0, 1, 2, 3}
	step := func() {
		if err := p.BuildFromTable(&table, 8, indptr); err != nil {
			t.Fatal(err)
		}
		if err := p.Run(be, appendkv.Input{AppendKey: key, AppendValue: key, Cache: &cache, Table: &table}); err != nil {
			t.Fatal(err)
		}
	}
	step()
	assert.Zero(t, testing.AllocsPerRun(50, step))
}

// token is one token's K and V as written by the test: [H*D] each.
type token struct{ k, v []float32 }

// TestStepsWithPageTable drives several steps through the real page table
// (reserve, export, plan, run) and checks, after each step, that every
// sequence reads back exactly the tokens written to it, in order.
func TestStepsWithPageTable(t *testing.T) {
	for _, l := range []layout.KVLayout{layout.NHD, layout.HND} {
		t.Run(l.String(), func(t *testing.T) {
			const N, H, D, P, S = 4, 2, 8, 64, 5
			r := rand.New(rand.NewPCG(uint64(l), 7))
			alloc, err := allocator.New(allocator.Config{NumPages: P})
			require.NoError(t, err)
			tbl, err := pagetable.New(pagetable.Config{PageSize: N, Allocator: alloc})
			require.NoError(t, err)
			cache, err := kernels.NewPagedKVCache(layout.Paged{Layout: l, Form: layout.Split, DType: layout.F32, NumPages: P, PageSize: N, NumKVHeads: H, HeadDim: D})
			require.NoError(t, err)
			ids := make([]pagetable.SeqID, S)
			model := make([][]token, S) // the dense model: tokens per sequence
			for i := range ids {
				ids[i] = pagetable.SeqID(100 + i)
				require.NoError(t, tbl.Add(ids[i]))
			}
			be := cpu.New(cpu.Config{Workers: 2})
			var plan appendkv.Plan
			var csr pagetable.CSR
			var acsr pagetable.AppendCSR
			for step := range 12 {
				lens := make([]int32, S)
				for i := range lens {
					lens[i] = int32(r.IntN(2 * N)) // 0 = this sequence sits the step out
				}
				_, err := tbl.Reserve(nil, ids, lens)
				require.NoError(t, err)
				require.NoError(t, tbl.ExportTo(&csr, ids))
				require.NoError(t, tbl.ExportAppendTo(&acsr, ids, lens))
				require.NoError(t, plan.FromAppendCSR(&acsr, csr.SeqLens))
				require.Equal(t, acsr.BatchIndices, plan.BatchIndices, "step %d: plan agrees with the page table's export", step)
				require.Equal(t, acsr.Positions, plan.Positions, "step %d", step)

				nnz := plan.Nnz()
				kv := make([]float32, 2*nnz*H*D)
				for i := range kv {
					kv[i] = float32(step*10000 + i + 1)
				}
				for i, b := range plan.BatchIndices {
					model[b] = append(model[b], token{kv[i*H*D : (i+1)*H*D], kv[(nnz+i)*H*D : (nnz+i+1)*H*D]})
				}
				table := kernels.PageTable{KVIndptr: csr.KVIndptr, KVPageIndices: csr.KVPageIndices, KVLastPageLen: csr.KVLastPageLen}
				in := appendkv.Input{
					AppendKey:   kernels.TensorFromF32(layout.F32, kv[:nnz*H*D], nnz, H, D),
					AppendValue: kernels.TensorFromF32(layout.F32, kv[nnz*H*D:], nnz, H, D),
					Cache:       &cache, Table: &table,
				}
				require.NoError(t, plan.Run(be, in), "step %d", step)

				k, v := make([]float32, H*D), make([]float32, H*D)
				for b := range ids {
					require.Equal(t, len(model[b]), table.SeqLen(b, N), "step %d: sequence %d length", step, b)
					for pos, want := range model[b] {
						require.NoError(t, cache.GatherToken(k, v, &table, b, pos))
						if !assert.Equal(t, want.k, k, "step %d: sequence %d token %d K", step, b, pos) ||
							!assert.Equal(t, want.v, v, "step %d: sequence %d token %d V", step, b, pos) {
							t.FailNow()
						}
					}
				}
			}
			require.NoError(t, tbl.CheckInvariants())
		})
	}
}

// FuzzBuild compares Build with the obvious loop: request b's rows are its
// last appendLen[b] tokens, in order.
func FuzzBuild(f *testing.F) {
	f.Add([]byte{1, 2, 3}, []byte{0, 4, 9})
	f.Add([]byte{}, []byte{})
	f.Add([]byte{0, 0}, []byte{7, 0})
	f.Fuzz(func(t *testing.T, appendLens, extra []byte) {
		B := min(len(appendLens), len(extra))
		indptr := make([]int32, B+1)
		seqLens := make([]int32, B)
		for b := range B {
			indptr[b+1] = indptr[b] + int32(appendLens[b])
			seqLens[b] = int32(appendLens[b]) + int32(extra[b])
		}
		var p appendkv.Plan
		require.NoError(t, p.Build(indptr, seqLens))
		var wantB, wantPos []int32
		for b := range B {
			for k := range int32(appendLens[b]) {
				wantB = append(wantB, int32(b))
				wantPos = append(wantPos, int32(extra[b])+k)
			}
		}
		if len(wantB) == 0 {
			require.Zero(t, p.Nnz())
			return
		}
		require.Equal(t, wantB, p.BatchIndices)
		require.Equal(t, wantPos, p.Positions)
		// A second Build into the same plan (reused buffers) agrees.
		require.NoError(t, p.Build(indptr, seqLens))
		require.Equal(t, wantPos, p.Positions)
	})
}

// BenchmarkDecodeStep is one decode step (256 sequences x 1 token, page 16,
// H=8, D=128, f16): Build + Run, next to the memmove of the same bytes.
func BenchmarkDecodeStep(b *testing.B) {
	const B, N, H, D = 256, 16, 8, 128
	table := kernels.PageTable{KVIndptr: make([]int32, B+1), KVLastPageLen: make([]int32, B)}
	ids := rand.New(rand.NewPCG(1, 1)).Perm(B * 4)
	for i := range B {
		table.KVIndptr[i+1] = int32(4 * (i + 1))
		table.KVLastPageLen[i] = int32(1 + i%N)
	}
	for _, id := range ids {
		table.KVPageIndices = append(table.KVPageIndices, int32(id))
	}
	indptr := make([]int32, B+1)
	for i := range indptr {
		indptr[i] = int32(i)
	}
	cache, err := kernels.NewPagedKVCache(layout.Paged{Layout: layout.NHD, Form: layout.Fused, DType: layout.F16, NumPages: B * 4, PageSize: N, NumKVHeads: H, HeadDim: D})
	require.NoError(b, err)
	key := kernels.NewTensor(layout.F16, B, H, D)
	bytes := int64(2 * len(key.Data))
	be := cpu.New(cpu.Config{})
	var p appendkv.Plan
	b.Run("plan+run", func(b *testing.B) {
		b.SetBytes(bytes)
		b.ReportAllocs()
		for b.Loop() {
			if err := p.BuildFromTable(&table, N, indptr); err != nil {
				b.Fatal(err)
			}
			if err := p.Run(be, appendkv.Input{AppendKey: key, AppendValue: key, Cache: &cache, Table: &table}); err != nil {
				b.Fatal(err)
			}
		}
	})
	dst := make([]byte, len(key.Data))
	b.Run("memmove", func(b *testing.B) {
		b.SetBytes(bytes)
		b.ReportAllocs()
		for b.Loop() {
			copy(dst, key.Data)
			copy(dst, key.Data)
		}
	})
}
