//go:build race

package replay

// raceEnabled cuts the full-trace tests to a prefix under the race
// detector (with invariants on, every Manager call checks itself).
const raceEnabled = true
