//go:build !race

package cpu

// This file must be kept in sync with attention_race_test.go.
const raceEnabled = false
