package replay

import (
	"bufio"
	"compress/gzip"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"os"
	"strings"

	"github.com/pagedkv/pagedkv/internal/sim"
)

// ErrBadTrace is wrapped by every trace error; the message names the line
// and the bad value.
var ErrBadTrace = errors.New("replay: bad trace")

// MooncakeBlockTokens is the block size of the Mooncake traces' hash ids.
const MooncakeBlockTokens = 512

// MaxBlockID is the largest block id a trace may use: ids become the first
// token of their page, and tokens are non-negative int32.
const MaxBlockID = math.MaxInt32

// Limits bound what a trace may ask for, so that a small or hostile file
// cannot ask for the machine.
type Limits struct {
	// MaxRequests bounds the requests (lines).
	MaxRequests int
	// MaxBlocks bounds the block references of all requests together.
	MaxBlocks int
	// MaxRequestBlocks bounds one request's blocks.
	MaxRequestBlocks int
	// MaxOutputTokens bounds one request's output.
	MaxOutputTokens int
	// First, when > 0, stops reading after the first First requests: the
	// rest of the input is neither read nor checked (replay --first).
	First int
}

// DefaultLimits fit the Mooncake traces with room to spare: 1M requests,
// 16M block references (64 MiB of ids), 4096 blocks (2M tokens) per
// request, 1M output tokens per request.
func DefaultLimits() Limits {
	return Limits{MaxRequests: 1 << 20, MaxBlocks: 1 << 24, MaxRequestBlocks: 4096, MaxOutputTokens: 1 << 20}
}

// errEnoughRequests stops ReadMooncake's scan once Limits.First requests
// are read.
var errEnoughRequests = errors.New("replay: first requests read")

// maxLineBytes bounds one trace line.
const maxLineBytes = 16 << 20

// Request is one request of a trace.
type Request struct {
	// ArrivalMs is the arrival time in milliseconds from the trace's start.
	ArrivalMs int64
	// InputTokens and OutputTokens are the prompt's and the output's
	// lengths in tokens.
	InputTokens, OutputTokens int
	// Blocks are the prompt's blocks of BlockTokens tokens as prefix ids
	// (the last may be partial): len = ceil(InputTokens/BlockTokens).
	Blocks []int32
}

// Trace is a list of requests in arrival order.
type Trace struct {
	// BlockTokens is the tokens per block of the ids.
	BlockTokens int
	Requests    []Request
	// DistinctBlocks is the number of distinct block ids.
	DistinctBlocks int
	// References is the number of block references (the sum of len(Blocks)).
	References int
}

// mooncakeLine is one JSON line; pointers tell absent fields from zeros.
type mooncakeLine struct {
	Timestamp    *int64  `json:"timestamp"`
	InputLength  *int    `json:"input_length"`
	OutputLength *int    `json:"output_length"`
	HashIDs      []int64 `json:"hash_ids"`
}

// ReadMooncake reads a Mooncake trace (JSON lines; see the package doc).
// Every field must be present and in range, timestamps non-decreasing, and
// len(hash_ids) = ceil(input_length/512); the error names the line and the
// value.
func ReadMooncake(r io.Reader, lim Limits) (*Trace, error) {
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 0, 64<<10), maxLineBytes)
	t := &Trace{BlockTokens: MooncakeBlockTokens}
	distinct := map[int32]struct{}{}
	var last int64
	var flat []int32
	line, err := sim.EachTraceLine(sc, func(line int, text []byte) error {
		if lim.First > 0 && len(t.Requests) == lim.First {
			return errEnoughRequests
		}
		if len(t.Requests) >= lim.MaxRequests {
			return fmt.Errorf("%w: line %d: more than %d requests", ErrBadTrace, line, lim.MaxRequests)
		}
		var l mooncakeLine
		if err := json.Unmarshal(text, &l); err != nil {
			return fmt.Errorf("%w: line %d: %v", ErrBadTrace, line, err)
		}
		q, err := l.request(line, last, lim, t.References)
		if err != nil {
			return err
		}
		last = q.ArrivalMs
		start := len(flat)
		for _, id := range l.HashIDs {
			flat = append(flat, int32(id))
			distinct[int32(id)] = struct{}{}
		}
		q.Blocks = flat[start:len(flat):len(flat)]
		t.References += len(q.Blocks)
		t.Requests = append(t.Requests, q)
		return nil
	})
	if err != nil && !errors.Is(err, errEnoughRequests) {
		return nil, err
	}
	if err := sc.Err(); err != nil {
		return nil, fmt.Errorf("%w: after line %d: %v", ErrBadTrace, line, err)
	}
	t.DistinctBlocks = len(distinct)
	return t, nil
}

// request checks one line against the limits and the previous arrival.
func (l *mooncakeLine) request(line int, last int64, lim Limits, refs int) (Request, error) {
	bad := func(format string, args ...any) (Request, error) {
		return Request{}, fmt.Errorf("%w: line %d: "+format, append([]any{ErrBadTrace, line}, args...)...)
	}
	switch {
	case l.Timestamp == nil || l.InputLength == nil || l.OutputLength == nil || l.HashIDs == nil:
		return bad("want timestamp, input_length, output_length and hash_ids")
	case *l.Timestamp < last:
		return bad("timestamp %d before the previous line's %d (want arrival order)", *l.Timestamp, last)
	case *l.InputLength < 1:
		return bad("input_length %d, want >= 1", *l.InputLength)
	case *l.OutputLength < 0 || *l.OutputLength > lim.MaxOutputTokens:
		return bad("output_length %d, want 0..%d", *l.OutputLength, lim.MaxOutputTokens)
	case len(l.HashIDs) > lim.MaxRequestBlocks:
		return bad("%d hash_ids, want at most %d", len(l.HashIDs), lim.MaxRequestBlocks)
	case len(l.HashIDs) != (*l.InputLength+MooncakeBlockTokens-1)/MooncakeBlockTokens:
		return bad("%d hash_ids for input_length %d, want ceil(%d/%d) = %d", len(l.HashIDs), *l.InputLength,
			*l.InputLength, MooncakeBlockTokens, (*l.InputLength+MooncakeBlockTokens-1)/MooncakeBlockTokens)
	case refs+len(l.HashIDs) > lim.MaxBlocks:
		return bad("more than %d block references in the trace", lim.MaxBlocks)
	}
	for i, id := range l.HashIDs {
		if id < 0 || id > MaxBlockID {
			return bad("hash_ids[%d] = %d, want 0..%d", i, id, MaxBlockID)
		}
	}
	return Request{ArrivalMs: *l.Timestamp, InputTokens: *l.InputLength, OutputTokens: *l.OutputLength}, nil
}

// OpenMooncake reads a Mooncake trace from a file, gunzipping it when the
// name ends in .gz.
func OpenMooncake(path string, lim Limits) (*Trace, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	var r io.Reader = f
	if strings.HasSuffix(path, ".gz") {
		z, err := gzip.NewReader(f)
		if err != nil {
			return nil, fmt.Errorf("%w: %s: %v", ErrBadTrace, path, err)
		}
		defer z.Close()
		r = z
	}
	t, err := ReadMooncake(r, lim)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	return t, nil
}

// FromSim converts requests of the project's own trace format
// (internal/sim) into a trace of blocks of blockTokens tokens: each distinct
// (namespace, previous block, tokens) gets the next unused id, so block ids
// follow the prompts' real shared prefixes. A sim arrival (a step number)
// is read as milliseconds; parallel samples multiply the output.
func FromSim(reqs []sim.Request, blockTokens int) (*Trace, error) {
	if blockTokens < 1 || blockTokens > MaxBlockTokens {
		return nil, fmt.Errorf("%w: block of %d tokens, want 1..%d (MaxBlockTokens)", ErrBadTrace, blockTokens, MaxBlockTokens)
	}
	type blockKey struct {
		parent int32
		tokens string
	}
	ids := map[blockKey]int32{}
	roots := map[string]int32{} // namespace -> a parent id below every real id
	t := &Trace{BlockTokens: blockTokens}
	var last int64
	for i := range reqs {
		q := &reqs[i]
		if int64(q.Arrival) < last {
			return nil, fmt.Errorf("%w: %s: arrival %d before the previous request's %d", ErrBadTrace, q.Name, q.Arrival, last)
		}
		last = int64(q.Arrival)
		root, ok := roots[q.Namespace]
		if !ok {
			root = -1 - int32(len(roots))
			roots[q.Namespace] = root
		}
		parent := root
		var blocks []int32
		for off := 0; off < len(q.Prompt); off += blockTokens {
			end := min(off+blockTokens, len(q.Prompt))
			var b strings.Builder
			for _, tok := range q.Prompt[off:end] {
				fmt.Fprintf(&b, "%d,", tok)
			}
			k := blockKey{parent, b.String()}
			id, ok := ids[k]
			if !ok {
				id = int32(len(ids))
				ids[k] = id
			}
			blocks = append(blocks, id)
			parent = id
		}
		t.Requests = append(t.Requests, Request{ArrivalMs: last, InputTokens: len(q.Prompt),
			OutputTokens: q.Output * max(q.Samples, 1), Blocks: blocks})
		t.References += len(blocks)
	}
	t.DistinctBlocks = len(ids)
	return t, nil
}

// Prefix returns the trace of t's first n requests (sharing t's blocks).
func (t *Trace) Prefix(n int) *Trace {
	p := &Trace{BlockTokens: t.BlockTokens, Requests: t.Requests[:min(max(n, 0), len(t.Requests))]}
	seen := map[int32]struct{}{}
	for _, q := range p.Requests {
		p.References += len(q.Blocks)
		for _, id := range q.Blocks {
			seen[id] = struct{}{}
		}
	}
	p.DistinctBlocks = len(seen)
	return p
}

// MinPoolPages is the smallest pool that runs every request of t alone:
// its blocks, its outputs and its query token, one page per block.
func (t *Trace) MinPoolPages() int {
	least := 1
	for i := range t.Requests {
		q := &t.Requests[i]
		least = max(least, len(q.Blocks)+(q.OutputTokens+t.BlockTokens-1)/t.BlockTokens+1)
	}
	return least
}
