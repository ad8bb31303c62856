//go:build !race

package kernelstest

const raceEnabled = false
