//go:build !race

package invariants

const raceEnabled = false
