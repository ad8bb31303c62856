package sim

import (
	"errors"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func TestParseTrace(t *testing.T) {
	trace := `
{"arrival": 3, "prompt_len": 6, "prefix": "sys", "prefix_len": 4, "output": 2, "namespace": "b"}

{"prompt": [7, 8, 9], "output": 1, "samples": 2}
{"arrival": 3, "prompt_len": 5, "prefix": "sys", "prefix_len": 5, "output": 4}
`
	reqs, err := ParseTrace(strings.NewReader(trace))
	require.NoError(t, err)
	require.Len(t, reqs, 3)
	// Arrival order; equal arrivals keep their line order.
	assert.Equal(t, []string{"line 4", "line 2", "line 5"}, []string{reqs[0].Name, reqs[1].Name, reqs[2].Name})

	explicit := reqs[0]
	assert.Equal(t, Request{Name: "line 4", Prompt: []int32{7, 8, 9}, Output: 1, Samples: 2}, explicit)

	a, b := reqs[1], reqs[2]
	assert.Equal(t, 3, a.Arrival)
	assert.Equal(t, "b", a.Namespace)
	assert.Equal(t, 2, a.Output)
	assert.Equal(t, 1, a.Samples)
	assert.Equal(t, "sys", a.PrefixID)
	assert.Len(t, a.Prompt, 6)
	assert.Len(t, b.Prompt, 5)
	// Both start with the 4 tokens of prefix "sys"; b's fifth token is
	// the prefix's too, a's is its own.
	assert.Equal(t, a.Prompt[:4], b.Prompt[:4])
	assert.Equal(t, PromptTokens("sys", 5, "x", 5), b.Prompt)
	assert.NotEqual(t, a.Prompt[4], b.Prompt[4])
	for _, r := range reqs {
		for i, tok := range r.Prompt {
			assert.True(t, tok >= 0 && tok < Vocab, "%s prompt[%d] = %d", r.Name, i, tok)
		}
	}
}

func TestParseTraceErrors(t *testing.T) {
	good := `{"prompt_len": 4, "output": 1}` + "\n"
	for _, tc := range []struct {
		name, line, want string
	}{
		{"malformed JSON", `{"prompt_len": 4, "output": 1`, "line 2: unexpected EOF"},
		{"not an object", `[1, 2]`, "line 2: json: cannot unmarshal array"},
		{"unknown field", `{"prompt_len": 4, "output": 1, "promt": [1]}`, `line 2: json: unknown field "promt"`},
		{"duplicate field", `{"prompt_len": 4, "output": 1, "output": 2}`, `line 2: field "output" appears twice`},
		// encoding/json matched "Output" to output and kept the last value.
		{"field in another case", `{"prompt_len": 4, "output": 1, "Output": 5}`, `line 2: field "Output": want "output"`},
		{"only field in another case", `{"PROMPT_LEN": 4, "output": 1}`, `line 2: field "PROMPT_LEN": want "prompt_len"`},
		{"trailing data", `{"prompt_len": 4, "output": 1} {}`, "line 2: trailing data"},
		{"wrong type", `{"prompt_len": "4", "output": 1}`, "line 2: json: cannot unmarshal string"},
		{"negative prompt_len", `{"prompt_len": -4, "output": 1}`, "line 2: prompt_len = -4, want 1..65536"},
		{"zero prompt_len", `{"prompt_len": 0, "output": 1}`, "line 2: prompt_len = 0"},
		{"negative output", `{"prompt_len": 4, "output": -1}`, "line 2: output = -1, want 1..65536"},
		{"missing output", `{"prompt_len": 4}`, "line 2: output is missing"},
		{"negative arrival", `{"prompt_len": 4, "output": 1, "arrival": -2}`, "line 2: arrival = -2, want >= 0"},
		{"negative prefix_len", `{"prompt_len": 4, "prefix": "s", "prefix_len": -1, "output": 1}`, "line 2: prefix_len = -1, want 1..prompt_len 4"},
		{"prefix longer than prompt", `{"prompt_len": 4, "prefix": "s", "prefix_len": 5, "output": 1}`, "line 2: prefix_len = 5, want 1..prompt_len 4"},
		{"prefix without length", `{"prompt_len": 4, "prefix": "s", "output": 1}`, "line 2: prefix and prefix_len go together"},
		{"no prompt", `{"output": 1}`, "line 2: prompt or prompt_len is missing"},
		{"both prompts", `{"prompt": [1], "prompt_len": 4, "output": 1}`, "line 2: prompt (tokens) excludes prompt_len"},
		{"empty prompt", `{"prompt": [], "output": 1}`, "line 2: prompt has 0 tokens"},
		{"negative token", `{"prompt": [1, -3], "output": 1}`, "line 2: prompt[1] = -3, want 0..31999"},
		{"token beyond vocab", `{"prompt": [32000], "output": 1}`, "line 2: prompt[0] = 32000"},
		{"token beyond int32", `{"prompt": [4294967296], "output": 1}`, "line 2: json: cannot unmarshal number 4294967296"},
		{"zero samples", `{"prompt_len": 4, "output": 1, "samples": 0}`, "line 2: samples = 0, want 1..64"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := ParseTrace(strings.NewReader(good + tc.line + "\n" + good))
			require.Error(t, err)
			assert.True(t, errors.Is(err, ErrBadTrace), "%v does not wrap ErrBadTrace", err)
			assert.Contains(t, err.Error(), tc.want)
		})
	}
	_, err := ParseTrace(strings.NewReader("\n  \n"))
	require.ErrorIs(t, err, ErrBadTrace)
	assert.Contains(t, err.Error(), "no requests")
}

func FuzzParseTrace(f *testing.F) {
	f.Add([]byte(`{"arrival": 1, "prompt_len": 6, "prefix": "sys", "prefix_len": 4, "output": 2, "namespace": "b", "samples": 2}`))
	f.Add([]byte(`{"prompt": [1, 2, 3], "output": 1}` + "\n" + `{"prompt_len": 3, "output": 1}`))
	f.Add([]byte(`{"prompt": [-1], "output": 1}`))
	f.Add([]byte("{\"prompt_len\": 1e9, \"output\": 1}\n\n[]"))
	f.Fuzz(func(t *testing.T, data []byte) {
		reqs, err := ParseTrace(strings.NewReader(string(data)))
		if err != nil {
			if !errors.Is(err, ErrBadTrace) {
				t.Fatalf("error %v does not wrap ErrBadTrace", err)
			}
			return
		}
		if len(reqs) == 0 {
			t.Fatal("no error and no requests")
		}
		for i, r := range reqs {
			if i > 0 && r.Arrival < reqs[i-1].Arrival {
				t.Fatalf("requests out of arrival order: %d then %d", reqs[i-1].Arrival, r.Arrival)
			}
			if r.Arrival < 0 || r.Output < 1 || r.Output > MaxOutputTokens || r.Samples < 1 || r.Samples > MaxSamples ||
				len(r.Prompt) < 1 || len(r.Prompt) > MaxPromptTokens || r.PrefixLen < 0 || r.PrefixLen > len(r.Prompt) {
				t.Fatalf("accepted an invalid request %+v", r)
			}
			for j, tok := range r.Prompt {
				if tok < 0 || tok >= Vocab {
					t.Fatalf("%s: prompt[%d] = %d outside the vocabulary", r.Name, j, tok)
				}
			}
		}
	})
}
