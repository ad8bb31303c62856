package cpu

import (
	"testing"

	"github.com/pagedkv/pagedkv/kernels"
	"github.com/pagedkv/pagedkv/kernels/kernelstest"
)

var _ kernels.Backend = (*Backend)(nil)

// The conformance suites run with one worker (everything inline) and with
// several (tasks spread over goroutines), so a race between tasks that
// write neighbouring outputs shows up under -race.
func backends() map[string]*Backend {
	return map[string]*Backend{"workers=1": New(Config{Workers: 1}), "workers=3": New(Config{Workers: 3})}
}

func TestBatchDecodeConformance(t *testing.T) {
	for name, b := range backends() {
		t.Run(name, func(t *testing.T) { kernelstest.TestDecode(t, b) })
	}
}

func TestBatchPrefillConformance(t *testing.T) {
	for name, b := range backends() {
		t.Run(name, func(t *testing.T) { kernelstest.TestPrefill(t, b) })
	}
}

func TestMLADecodeConformance(t *testing.T) {
	for name, b := range backends() {
		t.Run(name, func(t *testing.T) { kernelstest.TestMLADecode(t, b) })
	}
}

func TestMergeStateConformance(t *testing.T) {
	for name, b := range backends() {
		t.Run(name, func(t *testing.T) { kernelstest.TestMergeState(t, b) })
	}
}

func TestMergeStatesConformance(t *testing.T) {
	for name, b := range backends() {
		t.Run(name, func(t *testing.T) { kernelstest.TestMergeStates(t, b) })
	}
}
