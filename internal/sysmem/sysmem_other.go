//go:build !linux

package sysmem

func physical() (int64, bool) { return 0, false }
