//go:build !race

package quant_test

const raceEnabled = false
