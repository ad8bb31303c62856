package sim

import (
	"bufio"
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"sort"
)

// ErrBadTrace is wrapped by every trace parsing error; the message names
// the line.
var ErrBadTrace = errors.New("sim: bad trace")

// Limits on one trace request, so that a typo cannot ask for the machine.
const (
	MaxPromptTokens = 1 << 16
	MaxOutputTokens = 1 << 16
	MaxSamples      = 64
)

// Request is one request of a workload.
type Request struct {
	// Name identifies the request in messages: "line N" for a trace line,
	// "request N" for a generated one.
	Name string
	// Arrival is the step at which the request arrives (>= 0).
	Arrival int
	// Namespace is the request's tenant: prefix-cache pages are shared only
	// within one namespace, and the model's K/V differ between namespaces.
	Namespace string
	// Prompt is the request's input.
	Prompt []int32
	// Output is the number of tokens to generate, >= 1.
	Output int
	// Samples is the number of parallel samples (>= 1): after the prompt,
	// the request forks Samples-1 times and every branch generates Output
	// tokens.
	Samples int
	// PrefixID and PrefixLen record that Prompt[:PrefixLen] is the shared
	// prefix PrefixID (informational; the tokens are what count).
	PrefixID  string
	PrefixLen int
}

// traceLine is one JSON line of a trace. Pointers tell absent fields from
// zero ones.
type traceLine struct {
	Arrival   *int    `json:"arrival"`
	Namespace string  `json:"namespace"`
	Prompt    []int32 `json:"prompt"`
	PromptLen *int    `json:"prompt_len"`
	Prefix    *string `json:"prefix"`
	PrefixLen *int    `json:"prefix_len"`
	Output    *int    `json:"output"`
	Samples   *int    `json:"samples"`
}

// ParseTrace reads a JSONL trace: one request per line, blank lines
// ignored. Fields:
//
//	arrival     step at which the request arrives (default 0, >= 0)
//	namespace   tenant (default "")
//	prompt      explicit prompt tokens, each in [0, Vocab), or
//	prompt_len  prompt length in tokens (1..MaxPromptTokens), with
//	prefix      optional shared-prefix id: the first prefix_len tokens are
//	prefix_len  the id's tokens (1..prompt_len), the rest unique to the line
//	output      tokens to generate (1..MaxOutputTokens), required
//	samples     parallel samples (1..MaxSamples, default 1)
//
// Unknown fields, malformed JSON, trailing data and out-of-range values
// are errors wrapping [ErrBadTrace] that name the line. Requests are
// returned in arrival order (stable: lines with equal arrivals keep their
// order).
func ParseTrace(r io.Reader) ([]Request, error) {
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 0, 64<<10), 16<<20)
	var reqs []Request
	line := 0
	for sc.Scan() {
		line++
		text := bytes.TrimSpace(sc.Bytes())
		if len(text) == 0 {
			continue
		}
		req, err := parseLine(text, line)
		if err != nil {
			return nil, fmt.Errorf("%w: line %d: %w", ErrBadTrace, line, err)
		}
		reqs = append(reqs, req)
	}
	if err := sc.Err(); err != nil {
		return nil, fmt.Errorf("%w: after line %d: %w", ErrBadTrace, line, err)
	}
	if len(reqs) == 0 {
		return nil, fmt.Errorf("%w: no requests", ErrBadTrace)
	}
	sort.SliceStable(reqs, func(i, j int) bool { return reqs[i].Arrival < reqs[j].Arrival })
	return reqs, nil
}

func parseLine(text []byte, line int) (Request, error) {
	var tl traceLine
	dec := json.NewDecoder(bytes.NewReader(text))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&tl); err != nil {
		return Request{}, err
	}
	if dec.More() {
		return Request{}, errors.New("trailing data after the JSON object")
	}
	req := Request{Name: fmt.Sprintf("line %d", line), Namespace: tl.Namespace, Samples: 1}
	if tl.Arrival != nil {
		if *tl.Arrival < 0 {
			return req, fmt.Errorf("arrival = %d, want >= 0", *tl.Arrival)
		}
		req.Arrival = *tl.Arrival
	}
	switch {
	case tl.Output == nil:
		return req, errors.New("output is missing (tokens to generate)")
	case *tl.Output < 1 || *tl.Output > MaxOutputTokens:
		return req, fmt.Errorf("output = %d, want 1..%d", *tl.Output, MaxOutputTokens)
	}
	req.Output = *tl.Output
	if tl.Samples != nil {
		if *tl.Samples < 1 || *tl.Samples > MaxSamples {
			return req, fmt.Errorf("samples = %d, want 1..%d", *tl.Samples, MaxSamples)
		}
		req.Samples = *tl.Samples
	}
	switch {
	case tl.Prompt != nil && (tl.PromptLen != nil || tl.Prefix != nil || tl.PrefixLen != nil):
		return req, errors.New("prompt (tokens) excludes prompt_len, prefix and prefix_len")
	case tl.Prompt != nil:
		if len(tl.Prompt) == 0 || len(tl.Prompt) > MaxPromptTokens {
			return req, fmt.Errorf("prompt has %d tokens, want 1..%d", len(tl.Prompt), MaxPromptTokens)
		}
		for i, t := range tl.Prompt {
			if t < 0 || t >= Vocab {
				return req, fmt.Errorf("prompt[%d] = %d, want 0..%d", i, t, Vocab-1)
			}
		}
		req.Prompt = tl.Prompt
		return req, nil
	case tl.PromptLen == nil:
		return req, errors.New("prompt or prompt_len is missing")
	case *tl.PromptLen < 1 || *tl.PromptLen > MaxPromptTokens:
		return req, fmt.Errorf("prompt_len = %d, want 1..%d", *tl.PromptLen, MaxPromptTokens)
	case (tl.Prefix == nil) != (tl.PrefixLen == nil):
		return req, errors.New("prefix and prefix_len go together")
	}
	n := *tl.PromptLen
	if tl.Prefix != nil {
		if *tl.PrefixLen < 1 || *tl.PrefixLen > n {
			return req, fmt.Errorf("prefix_len = %d, want 1..prompt_len %d", *tl.PrefixLen, n)
		}
		req.PrefixID, req.PrefixLen = *tl.Prefix, *tl.PrefixLen
	}
	req.Prompt = PromptTokens(req.PrefixID, req.PrefixLen, fmt.Sprintf("trace line %d", line), n)
	return req, nil
}

// PromptTokens returns a prompt of n tokens: the first prefixLen are the
// tokens of the shared prefix prefixID (the same for every caller), the
// rest are unique to the string own.
func PromptTokens(prefixID string, prefixLen int, own string, n int) []int32 {
	p := make([]int32, n)
	shared, mine := streamSeed("prefix", prefixID), streamSeed("own", own)
	for i := range p {
		s := mine
		if i < prefixLen {
			s = shared
		}
		p[i] = int32(mix(s+golden*uint64(i+1)) % Vocab)
	}
	return p
}

func streamSeed(kind, id string) uint64 { return mix(hashString(kind + "\x00" + id)) }
