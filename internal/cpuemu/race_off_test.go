//go:build !race

package cpuemu

// raceEnabled scales tests down under the race detector, which slows them
// about tenfold; the default run keeps the full counts.
const raceEnabled = false
