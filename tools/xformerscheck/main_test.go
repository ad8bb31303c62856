package main

import (
	"bytes"
	"encoding/json"
	"strings"
	"testing"
)

// The protocol tools/xformers_crosscheck.py relies on: one JSON line out per
// line in, the mask as '0'/'1' cells row-major, errors as text.
func TestRunProtocol(t *testing.T) {
	in := strings.Join([]string{
		`{"id":1,"kind":"paged_block_diagonal_causal_with_offset_padded_keys","q_seqlen":[1,2],"kv_seqlen":[3,4],"block_tables":[[2,0],[1,3]],"page_size":2}`,
		`{"id":2,"op":"make_paged","kind":"block_diagonal_gappy_keys","q_seqlen":[1,1],"kv_seqlen":[2,2],"kv_seqstarts":[1,5,8],` +
			`"paged_kind":"paged_block_diagonal_gappy_keys","paged_block_tables":[[3,1],[0,2]],"paged_page_size":2,"notional_padding":4}`,
		`{"id":3,"kind":"paged_block_diagonal_padded_keys","q_seqlen":[1],"kv_seqlen":[1],"block_tables":[[-4]],"page_size":2}`,
		`{"id":4,"op":"tensor_list","shapes":[[2,1,1],[1,2,1]]}`,
		``,
	}, "\n")
	got := runLines(t, in)
	if len(got) != 4 {
		t.Fatalf("%d results, want 4", len(got))
	}
	// The worked example of ragged's TestXFormersFamilyPictures.
	if r := got[0]; !r.OK || r.Rows != 3 || r.Cols != 8 || r.Mask != "100011000011001000110011" {
		t.Errorf("paged causal: %+v", r)
	}
	if r := got[1]; !r.OK || r.Mask != "0010000101001000" {
		t.Errorf("make_paged gappy: %+v", r)
	}
	if r := got[2]; r.OK || !strings.Contains(r.Error, "block_tables[0][0] = -4") {
		t.Errorf("negative page id: %+v", r)
	}
	if r := got[3]; !r.OK || len(r.Parts) != 2 || r.Parts[1].Shape[1] != 2 || len(r.Concat) != 4 {
		t.Errorf("tensor list: %+v", r)
	}

	var out bytes.Buffer
	if err := run(strings.NewReader(`{"id":1,"kindd":"x"}`), &out); err == nil {
		t.Error("an unknown field was accepted")
	}
	if err := run(strings.NewReader(`{"id":1,"op":"nope"}`), &out); err == nil {
		t.Error("an unknown op was accepted")
	}
}

// The Python half hands window arguments only to the xFormers constructors
// that take them, so a class without a window ignores whatever the
// configuration holds there; one with a window still checks it.
func TestWindowArgumentsOnlyWhereTheClassTakesThem(t *testing.T) {
	in := strings.Join([]string{
		`{"id":1,"kind":"block_diagonal_causal","q_seqlen":[2],"kv_seqlen":[2]}`,
		`{"id":2,"kind":"block_diagonal_causal","q_seqlen":[2],"kv_seqlen":[2],"window_size":5,"window_left":-3,"window_right":7}`,
		`{"id":3,"kind":"block_diagonal_causal_local","q_seqlen":[2],"kv_seqlen":[2],"window_size":0}`,
		`{"id":4,"kind":"block_diagonal_causal_local","q_seqlen":[3],"kv_seqlen":[3],"window_size":1,"window_left":4}`,
		``,
	}, "\n")
	got := runLines(t, in)
	if len(got) != 4 {
		t.Fatalf("%d results, want 4", len(got))
	}
	if a, b := got[0], got[1]; !a.OK || !b.OK || a.Rows != b.Rows || a.Cols != b.Cols || a.Mask != b.Mask || a.Mask != "1011" {
		t.Errorf("window arguments of a windowless class changed the mask: %+v vs %+v", got[1], got[0])
	}
	if r := got[2]; r.OK || !strings.Contains(r.Error, "window_size >= 1, got 0") {
		t.Errorf("a local class took window_size 0: %+v", r)
	}
	if r := got[3]; !r.OK || r.Mask != "100010001" {
		t.Errorf("local window 1 with a stray window_left: %+v", r)
	}
}

// runLines runs the tool on in and decodes its output lines.
func runLines(t *testing.T, in string) []result {
	t.Helper()
	var out bytes.Buffer
	if err := run(strings.NewReader(in), &out); err != nil {
		t.Fatal(err)
	}
	var got []result
	for _, line := range strings.Split(strings.TrimSpace(out.String()), "\n") {
		var r result
		if err := json.Unmarshal([]byte(line), &r); err != nil {
			t.Fatal(err)
		}
		got = append(got, r)
	}
	return got
}
