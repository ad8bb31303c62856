package cpuemu

import (
	"fmt"
	"sync"

	"github.com/pagedkv/pagedkv/kernels/cuda"
)

// Stream capture on the emulator: between BeginCapture and EndCapture the
// operations a CUDA stream would capture (asynchronous host-to-device
// copies, device copies, memsets, launches) are recorded instead of run;
// LaunchGraph runs the recording in order. A recorded host-to-device copy
// keeps the host slice, not its bytes, so each replay reads the pinned
// staging buffer as it is then, as a graph's copy node does.

// op is one recorded operation.
type op struct {
	kind        opKind
	dst, src    cuda.DevicePtr
	host        []byte
	bytes       int
	value       byte
	kernel      string
	grid, block cuda.Dim3
	shared      int
	args        []uint64
}

type opKind int

const (
	opHtoD opKind = iota
	opDtoD
	opMemset
	opLaunch
)

// graphs is the capture state of a Driver.
type graphs struct {
	mu        sync.Mutex
	capturing bool
	recorded  []op
	execs     map[cuda.GraphExec][]op
	next      cuda.GraphExec
}

// active reports whether a capture is under way (a hint: record decides).
func (g *graphs) active() bool {
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.capturing
}

// record appends o to the capture when one is under way and reports
// whether it did.
func (g *graphs) record(o op) bool {
	g.mu.Lock()
	defer g.mu.Unlock()
	if !g.capturing {
		return false
	}
	g.recorded = append(g.recorded, o)
	return true
}

// refuseWhileCapturing fails a call that waits for the stream during a
// capture, as CUDA does (CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED).
func (g *graphs) refuseWhileCapturing(call string) error {
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.capturing {
		return fmt.Errorf("cpuemu: %s waits for the stream, which is being captured into a graph (CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED)", call)
	}
	return nil
}

// BeginCapture starts recording the stream's operations.
func (d *Driver) BeginCapture() error {
	d.g.mu.Lock()
	defer d.g.mu.Unlock()
	if d.g.capturing {
		return fmt.Errorf("cpuemu: BeginCapture: the stream is already being captured (CUDA_ERROR_ILLEGAL_STATE)")
	}
	d.g.capturing, d.g.recorded = true, nil
	return nil
}

// EndCapture ends the recording and returns it as a graph.
func (d *Driver) EndCapture() (cuda.GraphExec, error) {
	d.g.mu.Lock()
	defer d.g.mu.Unlock()
	if !d.g.capturing {
		return 0, fmt.Errorf("cpuemu: EndCapture: the stream is not being captured (CUDA_ERROR_ILLEGAL_STATE)")
	}
	if d.g.execs == nil {
		d.g.execs = map[cuda.GraphExec][]op{}
	}
	d.g.next++
	d.g.execs[d.g.next] = d.g.recorded
	d.g.capturing, d.g.recorded = false, nil
	return d.g.next, nil
}

// LaunchGraph runs the recorded operations of g in order.
func (d *Driver) LaunchGraph(g cuda.GraphExec) error {
	if err := d.g.refuseWhileCapturing("LaunchGraph"); err != nil {
		return err
	}
	d.g.mu.Lock()
	ops, ok := d.g.execs[g]
	d.g.mu.Unlock()
	if !ok {
		return fmt.Errorf("cpuemu: LaunchGraph: no graph %d (CUDA_ERROR_INVALID_HANDLE)", g)
	}
	for i := range ops {
		if err := d.run(&ops[i]); err != nil {
			return fmt.Errorf("cpuemu: graph %d, node %d of %d: %w", g, i, len(ops), err)
		}
	}
	return nil
}

// DestroyGraph releases g.
func (d *Driver) DestroyGraph(g cuda.GraphExec) error {
	d.g.mu.Lock()
	defer d.g.mu.Unlock()
	if _, ok := d.g.execs[g]; !ok {
		return fmt.Errorf("cpuemu: DestroyGraph: no graph %d (CUDA_ERROR_INVALID_HANDLE)", g)
	}
	delete(d.g.execs, g)
	return nil
}

// run performs one operation now.
func (d *Driver) run(o *op) error {
	switch o.kind {
	case opHtoD:
		d.htod(o.dst, o.host)
	case opDtoD:
		d.dtod(o.dst, o.src, o.bytes)
	case opMemset:
		d.memset(o.dst, o.value, o.bytes)
	case opLaunch:
		return d.launch(o.kernel, o.grid, o.block, o.shared, o.args)
	}
	return nil
}
