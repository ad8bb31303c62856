package cuda

import (
	"errors"
	"fmt"

	"github.com/pagedkv/pagedkv/kernels"
	"github.com/pagedkv/pagedkv/layout"
)

// ErrConcurrentUse is wrapped when a Step is called while another call on
// it is running (a Step serves one goroutine at a time), and when a
// backend whose stream is being captured into a graph is asked for work
// that would land in the capture or break it.
var ErrConcurrentUse = errors.New("cuda: concurrent use")

// ErrGraphShape is wrapped when a step replayed through a [Graph] differs
// from the captured one in something the graph holds fixed (see
// [Graph.Replay]).
var ErrGraphShape = errors.New("cuda: step differs from the captured graph")

// enter marks the step busy for the call op, or fails when another call
// holds it or another step of the backend is being captured.
func (s *Step) enter(op string) error {
	if !s.busy.CompareAndSwap(false, true) {
		return fmt.Errorf("%s: step %s: %w: another call on this Step is running (one goroutine at a time; use one Step per stream)",
			s.b.name, op, ErrConcurrentUse)
	}
	if c := s.b.capturing.Load(); c != nil && c != s {
		s.busy.Store(false)
		return fmt.Errorf("%s: step %s: %w: the backend's stream is being captured into another step's graph", s.b.name, op, ErrConcurrentUse)
	}
	return nil
}

func (s *Step) leave() { s.busy.Store(false) }

// noteCaptureErr keeps the first failure of an operation queued while the
// step is capturing: EndCapture then returns it instead of a graph that
// lacks the operation.
func (s *Step) noteCaptureErr(err error) {
	if err != nil && s.capturing && s.captureErr == nil {
		s.captureErr = err
	}
}

// idle fails when the backend's stream is being captured: op would either
// be recorded into the graph or wait for the stream, which a capture
// forbids.
func (b *Backend) idle(op string) error {
	if b.capturing.Load() != nil {
		return fmt.Errorf("%s: %s: %w: the backend's stream is being captured into a graph (Step.BeginCapture); call it before BeginCapture or after EndCapture",
			b.name, op, ErrConcurrentUse)
	}
	return nil
}

// stepShape is what a graph of a step holds fixed besides the limits.
type stepShape struct {
	g       layout.Paged
	kind    kernels.AttentionKind
	hq      int
	levels  int
	appends bool
	causal  bool
	ap      graphParams
}

// graphParams are the attention parameters a graph holds fixed: the
// scalars, and whether there are sinks (their values are uploaded with
// each plan's index arrays).
type graphParams struct {
	NumQOHeads                             int
	SMScale, LogitsSoftCap, KScale, VScale float64
	WindowLeft                             int
	Sinks                                  bool
}

func (s *Step) shapeOf(p *StepPlan) stepShape {
	return stepShape{g: p.Geometry, kind: p.Attention, hq: p.NumQOHeads, levels: len(p.Levels), appends: len(p.BatchIndices) > 0,
		causal: p.Causal, ap: graphParams{NumQOHeads: p.NumQOHeads, SMScale: p.SMScale, LogitsSoftCap: p.LogitsSoftCap,
			KScale: p.KScale, VScale: p.VScale, WindowLeft: p.WindowLeft, Sinks: p.Sinks != nil}}
}

// Graph is one step captured into a CUDA graph ([Step.BeginCapture]): the
// upload of its index arrays from the step's pinned staging buffer, then
// the appends and attentions queued while capturing. [Graph.Replay] runs it
// for the next step's arrays.
type Graph struct {
	s     *Step
	exec  GraphExec
	shape stepShape
}

// BeginCapture plans p into a fixed-layout step ([StepLimits.Fixed]) and
// starts capturing the backend's stream: the plan's upload and every
// Append and Attention of this step until [Step.EndCapture] are recorded,
// not run. The backend must have nothing else queued or waiting meanwhile:
// its other steps and its stream-waiting calls fail with ErrConcurrentUse
// until EndCapture. On an error nothing is being captured.
func (s *Step) BeginCapture(p *StepPlan) error {
	if err := s.enter("capture"); err != nil {
		return err
	}
	defer s.leave()
	if !s.lim.Fixed {
		return fmt.Errorf("%s: step capture: %w: the step's limits are not Fixed (a graph needs every plan padded to the limits)", s.b.name, ErrStepLimit)
	}
	if !s.b.capturing.CompareAndSwap(nil, s) {
		return fmt.Errorf("%s: step capture: %w: the backend's stream is already being captured", s.b.name, ErrConcurrentUse)
	}
	// Wait for the work already queued, so that the staging buffer is free
	// and the capture holds this step's work only.
	err := s.b.drv.Synchronize()
	if err == nil {
		s.b.waits.Add(1)
		s.inflight = false
		err = s.prepare(p)
	}
	if err == nil {
		err = s.b.drv.BeginCapture()
	}
	if err == nil {
		s.capturing, s.captureErr, s.graphShape = true, nil, s.shapeOf(p)
		if err = s.upload(); err == nil {
			return nil
		}
		// abandon the capture: end it and drop what it recorded
		s.capturing = false
		if exec, e := s.b.drv.EndCapture(); e == nil {
			_ = s.b.drv.DestroyGraph(exec)
		}
	}
	s.planned = false
	s.b.capturing.Store(nil)
	return fmt.Errorf("%s: step capture: %w", s.b.name, err)
}

// EndCapture ends the capture BeginCapture started and returns the graph.
// When an operation failed while capturing, it returns that error and no
// graph.
func (s *Step) EndCapture() (*Graph, error) {
	if err := s.enter("end capture"); err != nil {
		return nil, err
	}
	defer s.leave()
	if !s.capturing {
		return nil, fmt.Errorf("%s: end capture: %w: the step is not capturing (call BeginCapture first)", s.b.name, ErrNotPlanned)
	}
	s.capturing = false
	defer s.b.capturing.Store(nil)
	exec, err := s.b.drv.EndCapture()
	if err != nil {
		return nil, fmt.Errorf("%s: end capture: %w", s.b.name, err)
	}
	if s.captureErr != nil {
		_ = s.b.drv.DestroyGraph(exec)
		return nil, fmt.Errorf("%s: end capture: an operation failed while capturing: %w", s.b.name, s.captureErr)
	}
	// Nothing ran: the staging buffer is read when the graph is launched.
	s.inflight = false
	return &Graph{s: s, exec: exec, shape: s.graphShape}, nil
}

// Replay validates p like [Step.Plan], checks it against what the graph
// holds fixed, packs its arrays into the step's pinned staging buffer and
// launches the graph: the upload, then the captured appends and
// attentions, now over p's arrays. Fixed: the geometry, the attention kind,
// num_qo_heads, the attention parameters, causal, the number of cascade
// levels, whether rows are appended, the limits, and the caches and tensors
// passed while capturing (their addresses are in the graph). Within the
// limits the batch, the query rows, the appended rows, the pages and the
// sequence lengths may change. A plan that breaks this is refused
// (ErrStepLimit, ErrGraphShape) and nothing is launched.
func (g *Graph) Replay(p *StepPlan) error {
	s := g.s
	if err := s.enter("replay"); err != nil {
		return err
	}
	defer s.leave()
	if g.exec == 0 {
		return fmt.Errorf("%s: replay: %w: the graph was destroyed", s.b.name, ErrNotPlanned)
	}
	if err := s.b.idle("replay"); err != nil {
		return err
	}
	if sh := s.shapeOf(p); sh != g.shape {
		return fmt.Errorf("%s: replay: %w: %s", s.b.name, ErrGraphShape, shapeDiff(g.shape, sh))
	}
	if err := s.prepare(p); err != nil {
		return err
	}
	if err := s.b.drv.LaunchGraph(g.exec); err != nil {
		s.planned = false
		return fmt.Errorf("%s: replay: %w", s.b.name, err)
	}
	s.inflight, s.uploadAt = true, s.b.waits.Load()
	return nil
}

// Destroy releases the graph; it must not be replayed afterwards.
func (g *Graph) Destroy() error {
	if g.exec == 0 {
		return nil
	}
	err := g.s.b.drv.DestroyGraph(g.exec)
	g.exec = 0
	return err
}

// shapeDiff names the first thing in which got differs from the captured
// shape want.
func shapeDiff(want, got stepShape) string {
	for _, f := range []struct {
		what   string
		g, w   any
		differ bool
	}{
		{"the geometry", got.g, want.g, got.g != want.g},
		{"the attention kind", got.kind, want.kind, got.kind != want.kind},
		{"num_qo_heads", got.hq, want.hq, got.hq != want.hq},
		{"the number of cascade levels", got.levels, want.levels, got.levels != want.levels},
		{"appending rows", got.appends, want.appends, got.appends != want.appends},
		{"causal", got.causal, want.causal, got.causal != want.causal},
		{"the attention parameters", got.ap, want.ap, got.ap != want.ap},
	} {
		if f.differ {
			return fmt.Sprintf("%s is %+v, the graph was captured with %+v", f.what, f.g, f.w)
		}
	}
	return "no difference"
}
