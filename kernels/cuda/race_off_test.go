//go:build !race

package cuda_test

// raceEnabled scales randomized tests down under the race detector, which
// slows them about tenfold; the default run keeps the full counts.
const raceEnabled = false
