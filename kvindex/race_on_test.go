//go:build race

package kvindex

// raceEnabled scales TestStreamNeverOverReports down to a tenth under the
// race detector, which slows it about fivefold; the default run keeps the
// full count.
const raceEnabled = true
