package replay

import (
	"bytes"
	"image"
	"image/color"
	_ "image/png"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/pagedkv/pagedkv/evict"
)

// The service model under pressure: every request finishes with all its
// outputs, preemption happens and is resumed, the stream holds every
// admission and resumption, and no hit exceeds Belady on that stream.
func TestServiceModelUnderPressure(t *testing.T) {
	tr := prefix(conversation(t), 250)
	if raceEnabled {
		tr = prefix(tr, 80)
	}
	var outputs int64
	for _, q := range tr.Requests {
		outputs += int64(q.OutputTokens)
	}
	svc := DefaultService()
	svc.PrefillTokensPerSec = 20_000 // slower than the trace's arrivals: a queue builds
	for _, policy := range evict.Names() {
		finished := 0
		res, err := Run(tr, Config{CapacityPages: 1200, Eviction: policy, Service: &svc, Progress: func(n int) { finished = n }})
		require.NoError(t, err, policy)
		require.Equal(t, len(tr.Requests), finished, policy)
		require.Positive(t, res.Preemptions, "%s: no preemption under pressure", policy)
		require.Equal(t, len(tr.Requests)+int(res.Preemptions), len(res.Stream.Admissions), policy)
		require.Equal(t, int64(tr.References), res.Blocks, policy)
		require.Positive(t, res.HitBlocks, policy)
		require.LessOrEqual(t, res.HitBlocks, Belady(&res.Stream, res.CapacityPages), policy)
		require.LessOrEqual(t, res.PeakPages, 1200, policy)
		// Every output but each request's first (sampled by its last
		// prefill step) is computed by one decode step, unless a
		// preemption discarded it first: then its Resume recomputes it
		// within a prefill.
		require.GreaterOrEqual(t, res.DecodeTokens, outputs-int64(len(tr.Requests))-res.RecomputedTokens, policy)
		require.LessOrEqual(t, res.DecodeTokens, outputs, policy)
		require.Greater(t, res.SimulatedMs, float64(tr.Requests[len(tr.Requests)-1].ArrivalMs), policy)
	}
}

func TestBadConfigIsRefusedByName(t *testing.T) {
	tr := prefix(conversation(t), 10)
	_, err := Run(tr, Config{CapacityPages: 0})
	require.ErrorContains(t, err, "CapacityPages 0")
	_, err = Run(tr, Config{CapacityPages: 100, Eviction: "mru"})
	require.ErrorIs(t, err, ErrBadConfig)
	require.ErrorContains(t, err, `"mru"`)
	svc := DefaultService()
	svc.MaxBatch = 0
	_, err = Run(tr, Config{CapacityPages: 100, Service: &svc})
	require.ErrorContains(t, err, "MaxBatch 0")
	_, err = Run(tr, Config{CapacityPages: 10})
	require.ErrorContains(t, err, "does not fit a pool of 11 pages")
	_, err = RunSweep(tr, SweepConfig{Fractions: []float64{0}, Policies: []string{"lru"}})
	require.ErrorContains(t, err, "capacity fraction 0")
}

// The sweep's table names every policy and Belady at every capacity, and
// its plot is a real picture: a PNG of the stated size with the lines'
// colours in it, and an SVG with every legend entry.
func TestSweepTableAndPlot(t *testing.T) {
	tr := prefix(conversation(t), 600)
	if raceEnabled {
		tr = prefix(tr, 150)
	}
	policies := evict.Names()
	sw, err := RunSweep(tr, SweepConfig{Fractions: []float64{0.05, 0.25}, Policies: policies, PageTokens: 16})
	require.NoError(t, err)
	var out bytes.Buffer
	sw.Format(&out, tr)
	for _, cap := range []string{"5%", "25%"} {
		for _, p := range append(policies, "belady") {
			require.Regexp(t, `(?m)^\s+`+cap+`\s+\d+\s+`+p+`\s+\d+\.\d%`, out.String())
		}
	}
	require.Contains(t, out.String(), "unlimited capacity: ")
	require.Regexp(t, `(?m)^\s+5%\s+lru\s+[1-9]\d*\s+[1-9]\d*\s+0\s+0\s+0\s+[1-9]\d*\s*$`, out.String(), "the cache usage table")

	dir := t.TempDir()
	png := filepath.Join(dir, "hits.png")
	require.NoError(t, sw.WritePlot(png, "test"))
	f, err := os.Open(png)
	require.NoError(t, err)
	defer f.Close()
	img, _, err := image.Decode(f)
	require.NoError(t, err)
	require.Greater(t, img.Bounds().Dx(), 300)
	colours := map[color.RGBA]bool{}
	for y := img.Bounds().Min.Y; y < img.Bounds().Max.Y; y += 2 {
		for x := img.Bounds().Min.X; x < img.Bounds().Max.X; x += 2 {
			r, g, b, _ := img.At(x, y).RGBA()
			colours[color.RGBA{R: uint8(r >> 8), G: uint8(g >> 8), B: uint8(b >> 8)}] = true
		}
	}
	require.Greater(t, len(colours), 20, "a blank or one-colour image")
	require.True(t, colours[color.RGBA{R: 0x1f, G: 0x77, B: 0xb4}], "the first policy's line is missing")

	svg := filepath.Join(dir, "hits.svg")
	require.NoError(t, sw.WritePlot(svg, "test"))
	b, err := os.ReadFile(svg)
	require.NoError(t, err)
	for _, name := range append(policies, "belady", "unlimited") {
		require.True(t, strings.Contains(string(b), ">"+name+"<"), "legend entry %q missing", name)
	}
}
