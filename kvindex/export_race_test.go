package kvindex

// RaceEnabled tells the external tests (package kvindex_test) whether the
// race detector is on.
const RaceEnabled = raceEnabled
