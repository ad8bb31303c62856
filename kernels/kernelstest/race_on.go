//go:build race

package kernelstest

// raceEnabled scales the NVFP4 suite's random cases down to a quarter under
// the race detector, which slows the reference model about tenfold.
const raceEnabled = true
