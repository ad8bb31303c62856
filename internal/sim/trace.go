package sim

import (
	"bufio"
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"sort"
	"strings"
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

// TraceLimits bound a whole trace (or workload), so that a small file
// cannot ask for the machine: 2000 lines of the largest request would
// otherwise hold gigabytes of prompt tokens before the run starts.
type TraceLimits struct {
	// MaxRequests bounds the requests (lines), before forks.
	MaxRequests int
	// MaxTokens bounds the tokens of all requests together: every prompt
	// plus samples*output of every request.
	MaxTokens int64
}

// DefaultTraceLimits are the bounds ParseTrace applies: 100,000 requests
// and 2^24 (16.8M) tokens, a few seconds to minutes of simulation and at
// most 64 MiB of prompt tokens. `pagedkv simulate --trace-max-requests /
// --trace-max-tokens` raises them.
func DefaultTraceLimits() TraceLimits {
	return TraceLimits{MaxRequests: 100_000, MaxTokens: 1 << 24}
}

// maxLineBytes bounds one trace line.
const maxLineBytes = 16 << 20

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
// Unknown fields, duplicate fields, malformed JSON, trailing data, a line
// longer than 16 MiB and out-of-range values are errors wrapping
// [ErrBadTrace] that name the line (counted from 1, blank lines included);
// so is a trace past [DefaultTraceLimits] (see [ParseTraceLimits]).
// Requests are returned in arrival order (stable: lines with equal arrivals
// keep their order).
func ParseTrace(r io.Reader) ([]Request, error) {
	return ParseTraceLimits(r, DefaultTraceLimits())
}

// ParseTraceLimits is [ParseTrace] with the whole-trace bounds lim. The
// tokens of a line are counted before its prompt is built, so a trace past
// the bound fails at the first line that crosses it, having held at most
// the bound's tokens.
func ParseTraceLimits(r io.Reader, lim TraceLimits) ([]Request, error) {
	if lim.MaxRequests < 1 || lim.MaxTokens < 1 {
		return nil, fmt.Errorf("%w: trace limits %d requests, %d tokens: want >= 1 each", ErrBadTrace, lim.MaxRequests, lim.MaxTokens)
	}
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 0, 64<<10), maxLineBytes)
	var reqs []Request
	var tokens int64
	line, err := EachTraceLine(sc, func(line int, text []byte) error {
		if len(reqs) == lim.MaxRequests {
			return fmt.Errorf("%w: line %d: more than %d requests (raise the limit with --trace-max-requests)", ErrBadTrace, line, lim.MaxRequests)
		}
		req, err := parseLine(text, line, lim.MaxTokens-tokens)
		if err != nil {
			return fmt.Errorf("%w: line %d: %w", ErrBadTrace, line, err)
		}
		tokens += requestTokens(&req)
		reqs = append(reqs, req)
		return nil
	})
	if err != nil {
		return nil, err
	}
	if err := sc.Err(); err != nil {
		if errors.Is(err, bufio.ErrTooLong) {
			return nil, fmt.Errorf("%w: line %d: longer than %d bytes", ErrBadTrace, line+1, maxLineBytes)
		}
		return nil, fmt.Errorf("%w: line %d: %w", ErrBadTrace, line+1, err)
	}
	if len(reqs) == 0 {
		return nil, fmt.Errorf("%w: no requests", ErrBadTrace)
	}
	sort.SliceStable(reqs, func(i, j int) bool { return reqs[i].Arrival < reqs[j].Arrival })
	return reqs, nil
}

// EachTraceLine calls each with every non-blank line sc scans (trimmed of
// spaces; line counts every line from 1) until each fails or the scan ends.
// It returns the number of lines scanned and each's error; the scanner's own
// error (sc.Err) is left to the caller, who names it after line+1.
func EachTraceLine(sc *bufio.Scanner, each func(line int, text []byte) error) (int, error) {
	line := 0
	for sc.Scan() {
		line++
		text := bytes.TrimSpace(sc.Bytes())
		if len(text) == 0 {
			continue
		}
		if err := each(line, text); err != nil {
			return line, err
		}
	}
	return line, nil
}

// requestTokens is what a request counts against TraceLimits.MaxTokens.
func requestTokens(q *Request) int64 {
	return int64(len(q.Prompt)) + int64(q.Samples)*int64(q.Output)
}

// parseLine parses one line; budget is the tokens the trace may still take.
func parseLine(text []byte, line int, budget int64) (Request, error) {
	if err := checkDuplicateKeys(text); err != nil {
		return Request{}, err
	}
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
		if t := requestTokens(&req); t > budget {
			return req, overBudget(t, budget)
		}
		return req, nil
	case tl.PromptLen == nil:
		return req, errors.New("prompt or prompt_len is missing")
	case *tl.PromptLen < 1 || *tl.PromptLen > MaxPromptTokens:
		return req, fmt.Errorf("prompt_len = %d, want 1..%d", *tl.PromptLen, MaxPromptTokens)
	case (tl.Prefix == nil) != (tl.PrefixLen == nil):
		return req, errors.New("prefix and prefix_len go together")
	}
	if t := int64(*tl.PromptLen) + int64(req.Samples)*int64(req.Output); t > budget {
		return req, overBudget(t, budget)
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

func overBudget(t, budget int64) error {
	return fmt.Errorf("the request's %d tokens (prompt + samples*output) take the trace past its token limit (%d tokens left; raise it with --trace-max-tokens)", t, budget)
}

// traceFields are traceLine's JSON names.
var traceFields = [...]string{"arrival", "namespace", "prompt", "prompt_len", "prefix", "prefix_len", "output", "samples"}

// checkDuplicateKeys rejects a JSON object that names a field twice
// (encoding/json would silently keep the last value). Only the top level
// matters: every field of a trace line is a scalar or an array of ints.
func checkDuplicateKeys(text []byte) error {
	dec := json.NewDecoder(bytes.NewReader(text))
	if t, err := dec.Token(); err != nil || t != json.Delim('{') {
		return nil // not an object: the full decode reports it
	}
	var seen [8]string
	n := 0
	for dec.More() {
		t, err := dec.Token()
		if err != nil {
			return nil
		}
		key, ok := t.(string)
		if !ok {
			return nil
		}
		// encoding/json matches names case-insensitively: "Output" would
		// silently set (or overwrite) output.
		for _, f := range traceFields {
			if key != f && strings.EqualFold(key, f) {
				return fmt.Errorf("field %q: want %q (field names are case-sensitive)", key, f)
			}
		}
		for _, k := range seen[:n] {
			if k == key {
				return fmt.Errorf("field %q appears twice", key)
			}
		}
		if n == len(seen) {
			// traceLine has 8 fields: a 9th is unknown or repeated.
			return fmt.Errorf("more than %d fields (field %q)", len(seen), key)
		}
		seen[n] = key
		n++
		var skip json.RawMessage
		if err := dec.Decode(&skip); err != nil {
			return nil
		}
	}
	return nil
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
