package kvindex

import "testing"

// RaceEnabled tells the external tests (package kvindex_test) whether the
// race detector is on.
const RaceEnabled = raceEnabled

// EncodeBatch is encodeBatch for the external tests: a KVEventBatch payload
// of the given events (vLLM's map form).
func EncodeBatch(t testing.TB, evs ...map[string]any) []byte { return encodeBatch(t, evs...) }
