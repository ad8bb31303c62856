package cuda

import "sync"

// Traffic counts what crossed the host/device boundary through a Driver.
type Traffic struct {
	HtoDBytes, DtoHBytes   int64 // bytes copied host to device and back
	HtoDCopies, DtoHCopies int   // copies (HtoD and HtoDAsync count together)
	Launches               int   // kernel launches
	Allocs, Frees          int   // device allocations and releases
	Syncs                  int   // Synchronize calls
	DtoDBytes              int64 // bytes copied within device memory (no host traffic)
	GraphLaunches          int   // graph replays (their copies and launches were counted when captured)
}

// Sub is t - u, the traffic between two snapshots.
func (t Traffic) Sub(u Traffic) Traffic {
	return Traffic{
		HtoDBytes: t.HtoDBytes - u.HtoDBytes, DtoHBytes: t.DtoHBytes - u.DtoHBytes,
		HtoDCopies: t.HtoDCopies - u.HtoDCopies, DtoHCopies: t.DtoHCopies - u.DtoHCopies,
		Launches: t.Launches - u.Launches, DtoDBytes: t.DtoDBytes - u.DtoDBytes, Allocs: t.Allocs - u.Allocs, Frees: t.Frees - u.Frees,
		Syncs: t.Syncs - u.Syncs, GraphLaunches: t.GraphLaunches - u.GraphLaunches,
	}
}

// LaunchRecord is one launch as a [CountingDriver] saw it.
type LaunchRecord struct {
	Kernel      string
	Grid, Block Dim3
	Shared      int
	Args        []uint64
}

// CountingDriver wraps a Driver and counts the bytes and calls that cross
// it; with Record set it also keeps every launch (tests compare the launch
// sequences of two steps). It is safe for concurrent use when the wrapped
// driver is.
type CountingDriver struct {
	Driver
	Record bool

	mu       sync.Mutex
	t        Traffic
	launches []LaunchRecord
}

// Traffic returns the totals so far.
func (c *CountingDriver) Traffic() Traffic {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.t
}

// Launches returns the recorded launches and forgets them.
func (c *CountingDriver) Launches() []LaunchRecord {
	c.mu.Lock()
	defer c.mu.Unlock()
	l := c.launches
	c.launches = nil
	return l
}

func (c *CountingDriver) add(f func(t *Traffic)) {
	c.mu.Lock()
	f(&c.t)
	c.mu.Unlock()
}

func (c *CountingDriver) Alloc(bytes int) (DevicePtr, error) {
	c.add(func(t *Traffic) { t.Allocs++ })
	return c.Driver.Alloc(bytes)
}

func (c *CountingDriver) Free(p DevicePtr) error {
	c.add(func(t *Traffic) { t.Frees++ })
	return c.Driver.Free(p)
}

func (c *CountingDriver) HtoD(dst DevicePtr, src []byte) error {
	c.add(func(t *Traffic) { t.HtoDBytes += int64(len(src)); t.HtoDCopies++ })
	return c.Driver.HtoD(dst, src)
}

func (c *CountingDriver) HtoDAsync(dst DevicePtr, src []byte) error {
	c.add(func(t *Traffic) { t.HtoDBytes += int64(len(src)); t.HtoDCopies++ })
	return c.Driver.HtoDAsync(dst, src)
}

func (c *CountingDriver) DtoH(dst []byte, src DevicePtr) error {
	c.add(func(t *Traffic) { t.DtoHBytes += int64(len(dst)); t.DtoHCopies++ })
	return c.Driver.DtoH(dst, src)
}

func (c *CountingDriver) DtoD(dst, src DevicePtr, bytes int) error {
	c.add(func(t *Traffic) { t.DtoDBytes += int64(bytes) })
	return c.Driver.DtoD(dst, src, bytes)
}

func (c *CountingDriver) Synchronize() error {
	c.add(func(t *Traffic) { t.Syncs++ })
	return c.Driver.Synchronize()
}

func (c *CountingDriver) Launch(kernel string, grid, block Dim3, sharedBytes int, args []uint64) error {
	c.mu.Lock()
	c.t.Launches++
	if c.Record {
		c.launches = append(c.launches, LaunchRecord{kernel, grid, block, sharedBytes, append([]uint64(nil), args...)})
	}
	c.mu.Unlock()
	return c.Driver.Launch(kernel, grid, block, sharedBytes, args)
}

func (c *CountingDriver) LaunchGraph(g GraphExec) error {
	c.add(func(t *Traffic) { t.GraphLaunches++ })
	return c.Driver.LaunchGraph(g)
}

// TransferBytes is the traffic between CPU memory and the device in bytes.
func (t Traffic) TransferBytes() int64 { return t.HtoDBytes + t.DtoHBytes }
