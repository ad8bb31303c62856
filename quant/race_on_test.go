//go:build race

package quant_test

// raceEnabled scales the randomized NVFP4 tests down to a tenth under the
// race detector, which slows them about tenfold; the default run keeps the
// full counts.
const raceEnabled = true
