// Command xformerscheck is the Go half of tools/xformers_crosscheck.py: it
// reads mask configurations as JSON lines on stdin, builds each with package
// ragged, and writes one JSON line per configuration to stdout: the dense
// mask (rows, cols and the cells as a string of '0'/'1', row-major) or the
// error. The Python half builds the same configurations with xFormers'
// attn_bias.py under torch and compares cell by cell. It has no other use and
// no state; see docs/masks.md.
//
// A configuration is a JSON object:
//
//	{"id": 7, "op": "mask", "kind": "paged_block_diagonal_padded_keys",
//	 "q_seqlen": [...], "kv_seqlen": [...], "window_size": 0,
//	 "window_left": 0, "window_right": 0, "kv_padding": 0,
//	 "kv_seqstarts": [...], "block_tables": [[...], ...], "page_size": 0}
//
// op "mask" (the default) is ragged.NewAttentionMask. op "make_paged" builds
// the unpaged mask described by the same fields (kind), then calls its
// MakePaged with "paged_block_tables", "paged_page_size", "paged_kind" and,
// for the gappy kinds, "notional_padding". op "tensor_list" calls
// ragged.FromTensorList on tensors of the shapes "shapes" holding 0, 1, 2,
// ... in order, and reports the mask, the concatenated data and the Split
// parts (or the split error).
//
// # Invariants
//
//   - One output line per configuration, in input order, with the
//     configuration's id; a configuration ragged refuses yields its error
//     in that line, never a missing line.
//   - An input line with an unknown field or op stops the run with an
//     error naming the line: the two halves never silently disagree on
//     what was asked.
package main

import (
	"bufio"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"strings"

	"github.com/pagedkv/pagedkv/ragged"
)

type config struct {
	ID          int       `json:"id"`
	Op          string    `json:"op"`
	Kind        string    `json:"kind"`
	QSeqLen     []int32   `json:"q_seqlen"`
	KVSeqLen    []int32   `json:"kv_seqlen"`
	WindowSize  int       `json:"window_size"`
	WindowLeft  int       `json:"window_left"`
	WindowRight int       `json:"window_right"`
	KVPadding   int       `json:"kv_padding"`
	KVSeqStarts []int32   `json:"kv_seqstarts"`
	BlockTables [][]int32 `json:"block_tables"`
	PageSize    int       `json:"page_size"`

	PagedKind        string    `json:"paged_kind"`
	PagedBlockTables [][]int32 `json:"paged_block_tables"`
	PagedPageSize    int       `json:"paged_page_size"`
	NotionalPadding  int       `json:"notional_padding"`

	Shapes [][]int `json:"shapes"`
}

type part struct {
	Shape []int `json:"shape"`
	Data  []int `json:"data"`
}

type result struct {
	ID         int    `json:"id"`
	OK         bool   `json:"ok"`
	Error      string `json:"error,omitempty"`
	Rows       int    `json:"rows"`
	Cols       int    `json:"cols"`
	Mask       string `json:"mask,omitempty"`
	Concat     []int  `json:"concat,omitempty"`
	Parts      []part `json:"parts,omitempty"`
	SplitError string `json:"split_error,omitempty"`
}

// blockTables turns a JSON 2-D array into ragged.BlockTables; ragged rows
// (not a rectangle) become a shape that holds a different number of entries,
// which ragged rejects.
func blockTables(rows [][]int32) ragged.BlockTables {
	if rows == nil {
		return ragged.BlockTables{}
	}
	t := ragged.BlockTables{Rows: len(rows), Data: []int32{}}
	if len(rows) > 0 {
		t.Cols = len(rows[0])
	}
	for _, r := range rows {
		t.Data = append(t.Data, r...)
	}
	return t
}

// maskConfig drops the window arguments kind does not take, as the Python
// half does: it passes window_size or window_left/window_right only to the
// xFormers constructors that have them, so a configuration may carry any
// value there for the other classes.
func (c config) maskConfig() ragged.MaskConfig {
	kind := ragged.MaskKind(c.Kind)
	w, wl, wr := c.WindowSize, c.WindowLeft, c.WindowRight
	size, leftRight := kind.WindowArgs()
	if !size {
		w = 0
	}
	if !leftRight {
		wl, wr = 0, 0
	}
	return ragged.MaskConfig{
		Kind: kind, QSeqLen: c.QSeqLen, KVSeqLen: c.KVSeqLen,
		WindowSize: w, WindowLeft: wl, WindowRight: wr,
		KVPadding: c.KVPadding, KVSeqStarts: c.KVSeqStarts,
		BlockTables: blockTables(c.BlockTables), PageSize: c.PageSize,
	}
}

type paddedPager interface {
	MakePaged(ragged.BlockTables, int, ragged.MaskKind) (ragged.AttentionMask, error)
}

type gappyPager interface {
	MakePaged(ragged.BlockTables, int, int, ragged.MaskKind) (ragged.AttentionMask, error)
}

func build(c config) (ragged.AttentionMask, error) {
	m, err := ragged.NewAttentionMask(c.maskConfig())
	if err != nil || c.Op != "make_paged" {
		return m, err
	}
	bt, kind := blockTables(c.PagedBlockTables), ragged.MaskKind(c.PagedKind)
	switch p := m.(type) {
	case ragged.BlockDiagonalCausalLocalAttentionPaddedKeysMask:
		return p.MakePaged(bt, c.PagedPageSize, kind)
	case paddedPager:
		return p.MakePaged(bt, c.PagedPageSize, kind)
	case gappyPager:
		return p.MakePaged(bt, c.PagedPageSize, c.NotionalPadding, kind)
	}
	return nil, fmt.Errorf("%s has no make_paged", m)
}

func dense(res *result, m ragged.AttentionMask) {
	d, err := m.Materialize()
	if err != nil {
		res.OK, res.Error = false, err.Error()
		return
	}
	var sb strings.Builder
	sb.Grow(len(d.Allowed))
	for _, a := range d.Allowed {
		if a {
			sb.WriteByte('1')
		} else {
			sb.WriteByte('0')
		}
	}
	res.OK, res.Rows, res.Cols, res.Mask = true, d.Rows, d.Cols, sb.String()
}

func tensorList(res *result, c config) {
	var tensors []ragged.Tensor[int]
	next := 0
	for _, shape := range c.Shapes {
		n := 1
		for _, d := range shape {
			n *= max(d, 0)
		}
		x := ragged.Tensor[int]{Shape: shape, Data: make([]int, n)}
		for i := range x.Data {
			x.Data[i] = next
			next++
		}
		tensors = append(tensors, x)
	}
	m, cat, err := ragged.FromTensorList(tensors)
	if err != nil {
		res.Error = err.Error()
		return
	}
	dense(res, m)
	res.Concat = cat.Data
	parts, err := ragged.Split(m, cat)
	if err != nil {
		res.SplitError = err.Error()
		return
	}
	for _, p := range parts {
		res.Parts = append(res.Parts, part{Shape: p.Shape, Data: append([]int{}, p.Data...)})
	}
}

func run(in io.Reader, out io.Writer) error {
	sc := bufio.NewScanner(in)
	sc.Buffer(make([]byte, 1<<20), 1<<30)
	w := bufio.NewWriter(out)
	enc := json.NewEncoder(w)
	for line := 1; sc.Scan(); line++ {
		if strings.TrimSpace(sc.Text()) == "" {
			continue
		}
		var c config
		dec := json.NewDecoder(strings.NewReader(sc.Text()))
		dec.DisallowUnknownFields()
		if err := dec.Decode(&c); err != nil {
			return fmt.Errorf("line %d: %w", line, err)
		}
		res := result{ID: c.ID}
		switch c.Op {
		case "", "mask", "make_paged":
			if m, err := build(c); err != nil {
				res.Error = err.Error()
			} else {
				dense(&res, m)
			}
		case "tensor_list":
			tensorList(&res, c)
		default:
			return fmt.Errorf("line %d: unknown op %q", line, c.Op)
		}
		if err := enc.Encode(res); err != nil {
			return err
		}
	}
	if err := sc.Err(); err != nil {
		return err
	}
	return w.Flush()
}

func main() {
	if err := run(os.Stdin, os.Stdout); err != nil {
		fmt.Fprintln(os.Stderr, "xformerscheck:", err)
		os.Exit(1)
	}
}
