package sysmem

import (
	"errors"
	"math"
	"runtime"
	"strings"
	"testing"
)

func TestPhysicalOnLinux(t *testing.T) {
	p, ok := Physical()
	if runtime.GOOS != "linux" {
		if ok {
			t.Fatalf("Physical() = %d, true off Linux", p)
		}
		return
	}
	if !ok || p < 64<<20 {
		t.Fatalf("Physical() = %d, %v: want a machine with at least 64 MiB", p, ok)
	}
}

func TestCheck(t *testing.T) {
	if err := Check("pool", 100, 100); err != nil {
		t.Fatalf("Check(100 of 100) = %v", err)
	}
	err := Check("host tier", 101, 100)
	if !errors.Is(err, ErrTooLarge) || !strings.Contains(err.Error(), "host tier needs 101 bytes") ||
		!strings.Contains(err.Error(), "MemoryLimit (100 bytes)") {
		t.Fatalf("Check(101 of 100) = %v", err)
	}
	if p, ok := Physical(); ok {
		err := Check("host tier", p+1, 0)
		if !errors.Is(err, ErrTooLarge) || !strings.Contains(err.Error(), "physical memory") {
			t.Fatalf("Check(physical+1, 0) = %v", err)
		}
		if err := Check("host tier", p/2, 0); err != nil {
			t.Fatalf("Check(physical/2, 0) = %v", err)
		}
	}
}

func TestMulAddSaturates(t *testing.T) {
	for _, c := range []struct{ a, b, c, want int64 }{
		{0, math.MaxInt64, 5, 5},
		{3, 4, 5, 17},
		{1 << 31, 1 << 31, 0, 1 << 62},
		{1 << 32, 1 << 32, 0, math.MaxInt64},
		{math.MaxInt64, 1, 1, math.MaxInt64},
		{1, math.MaxInt64 - 1, 1, math.MaxInt64},
	} {
		if got := MulAdd(c.a, c.b, c.c); got != c.want {
			t.Errorf("MulAdd(%d, %d, %d) = %d, want %d", c.a, c.b, c.c, got, c.want)
		}
	}
}
