package invariants

import "testing"

// TestEnabledMatchesRaceBuild pins the build-tag wiring: a -race build must
// run the checks, because CI relies on -race to turn them on.
func TestEnabledMatchesRaceBuild(t *testing.T) {
	if raceEnabled && !Enabled {
		t.Fatal("invariants.Enabled is false in a -race build")
	}
}
