//go:build race

package main

// raceEnabled scales randomized tests down under the race detector, which
// slows them about tenfold; the default run keeps the full counts.
const raceEnabled = true
