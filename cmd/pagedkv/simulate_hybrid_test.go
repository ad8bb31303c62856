package main

import (
	"fmt"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	pagedkv "github.com/pagedkv/pagedkv"
	"github.com/pagedkv/pagedkv/internal/invariants"
	"github.com/pagedkv/pagedkv/internal/sim"
	"github.com/pagedkv/pagedkv/internal/vllmwire"
)

// smallHybrid is smallModel without --layers: each preset brings its own
// layer count.
var smallHybrid = []string{"--qo-heads", "4", "--kv-heads", "2", "--head-dim", "16", "--quiet", "--verify-every", "2", "--verify-samples", "2"}

// TestSimulateModel runs --model gpt-oss-like with drafts on a small pool:
// the run verifies every group, and the summary has the groups line, a
// line per group (the sliding group holding fewer pages at peak than the
// full one, releasing pages, both verified) and the acceptance line.
func TestSimulateModel(t *testing.T) {
	args := append([]string{"simulate", "--model", "gpt-oss-like", "--requests", "8", "--pages", "64", "--spec-tokens", "3"}, smallHybrid...)
	code, out, errOut := runCLI(args...)
	require.Equal(t, exitOK, code, "stdout:\n%s\nstderr:\n%s", out, errOut)
	assert.Equal(t, "2 of 2 layers each, layer l in group l % 2: sliding 128, full", summaryField(t, out, "layer groups"))
	assert.Regexp(t, `^4 layers, `, summaryField(t, out, "model"))
	assert.Regexp(t, `^\d+ of \d+ prompt tokens \(\d+\.\d%\): the prefix every group could serve$`, summaryField(t, out, "prefix hits"))
	group := regexp.MustCompile(`^(sliding 128|full): pages held by requests peak (\d+), mean \d+\.\d; \d+ cached at the end, \d+ published, \d+ evicted(, (\d+) released \(out of the window or chunk\))?; \d+ tokens its cache alone could serve at admissions; (\d+) outputs verified$`)
	var peak [2]int
	for g, kind := range []string{"sliding 128", "full"} {
		m := group.FindStringSubmatch(summaryField(t, out, "group "+strconv.Itoa(g)))
		require.NotNil(t, m, out)
		assert.Equal(t, kind, m[1])
		peak[g], _ = strconv.Atoi(m[2])
		verified, _ := strconv.Atoi(m[5])
		assert.Positive(t, verified, "group %d", g)
		if g == 0 {
			released, _ := strconv.Atoi(m[4])
			assert.Positive(t, released)
		} else {
			assert.Empty(t, m[3], "a full group releases nothing")
		}
	}
	assert.Less(t, peak[0], peak[1], "the sliding group holds fewer pages")
	assert.Regexp(t, `^k=3, \d+ drafts proposed, [1-9]\d* accepted`, summaryField(t, out, "speculative"))
	assert.Regexp(t, `^passed: \d+ outputs \([1-9]\d* of draft rows\)`, summaryField(t, out, "verification"))

	// --layers overrides the preset's count, in multiples of its pattern.
	code, out, errOut = runCLI(append([]string{"simulate", "--model", "gemma-3-like", "--layers", "12", "--requests", "3"}, smallHybrid...)...)
	require.Equal(t, exitOK, code, "stdout:\n%s\nstderr:\n%s", out, errOut)
	assert.Equal(t, "6 of 2 layers each, layer l in group l % 6: sliding 64, sliding 64, sliding 64, sliding 64, sliding 64, full",
		summaryField(t, out, "layer groups"))

	// --model dense is the default: no group lines.
	code, out, errOut = runCLI(append([]string{"simulate", "--model", "dense", "--requests", "3"}, smallHybrid...)...)
	require.Equal(t, exitOK, code, "stdout:\n%s\nstderr:\n%s", out, errOut)
	assert.NotRegexp(t, `(?m)^(layer groups|group 0):`, out)
}

// TestSimulateModelBad: an unknown model, a layer count off the pattern,
// and the features not combined with a hybrid model are flag errors naming
// the flag and the value.
func TestSimulateModelBad(t *testing.T) {
	for _, c := range []struct {
		args []string
		want []string
	}{
		{[]string{"--model", "nope"}, []string{`--model`, `"nope"`, "dense, gpt-oss-like, gemma-3-like, llama-4-like"}},
		{[]string{"--model", "mla"}, []string{`"mla"`, "not simulated", "MLADecode"}},
		{[]string{"--model", "gemma-3-like", "--layers", "4"}, []string{"--layers", "layers = 4", "multiple of 6"}},
		{[]string{"--model", "gpt-oss-like", "--window", "32"}, []string{"--window", "gpt-oss-like"}},
		{[]string{"--model", "llama-4-like", "--page-size", "48"}, []string{"ChunkTokens = 128", "page size 48"}},
	} {
		code, _, errOut := runCLI(append([]string{"simulate", "--quiet"}, c.args...)...)
		assert.Equal(t, exitUsage, code, "%v: %s", c.args, errOut)
		for _, w := range c.want {
			assert.Contains(t, errOut, w, c.args)
		}
	}
}

// TestSimulateModelReplicas runs --model gpt-oss-like --replicas 2 on a
// small pool (evictions and preemptions): each replica is a HybridManager
// verified per group, its grouped events reach the router's index (both
// groups indexed, every batch, no gaps), the prefix-aware run routes
// requests to cached prefixes and hits the cache, and both runs verify.
// Under -race the run is cut to 12 requests checked every 8 steps.
func TestSimulateModelReplicas(t *testing.T) {
	t.Parallel()
	requests, size := 24, []string{}
	if invariants.Enabled {
		requests, size = 12, []string{"--verify-every", "8"} // after smallHybrid's, so it wins
	}
	args := append([]string{"simulate", "--model", "gpt-oss-like", "--replicas", "2", "--requests", strconv.Itoa(requests), "--pages", "64"}, smallHybrid...)
	code, out, errOut := runCLI(append(args, size...)...)
	require.Equal(t, exitOK, code, "stdout:\n%s\nstderr:\n%s", out, errOut)

	assert.Regexp(t, `^2 replicas, each 4 layers, `, summaryField(t, out, "fleet"))
	assert.Equal(t, "2 of 2 layers each, layer l in group l % 2: sliding 128, full; a replica's match is the prefix every group holds",
		summaryField(t, out, "layer groups"))
	hits := regexp.MustCompile(`^prefix-aware (\d+) of (\d+) prompt tokens \([\d.]+%\); round-robin (\d+) of (\d+) prompt tokens \([\d.]+%\)$`).
		FindStringSubmatch(summaryField(t, out, "prefix hits"))
	require.NotNil(t, hits, out)
	assert.Equal(t, hits[2], hits[4], "both policies ran the same prompts")
	pa, _ := strconv.Atoi(hits[1])
	assert.Positive(t, pa, "prefix-aware hits")

	routed := regexp.MustCompile(`^prefix-aware \[(\d+) (\d+)\] \((\d+) requests to a cached prefix; the index promised (\d+) tokens\); round-robin \[(\d+) (\d+)\]$`).
		FindStringSubmatch(summaryField(t, out, "routed"))
	require.NotNil(t, routed, out)
	n := func(i int) int { v, _ := strconv.Atoi(routed[i]); return v }
	assert.Equal(t, requests, n(1)+n(2), "prefix-aware routed every request")
	assert.Equal(t, []int{requests / 2, requests / 2}, []int{n(5), n(6)}, "round robin")
	assert.Positive(t, n(3), "requests routed to a cached prefix")
	assert.Positive(t, n(4), "tokens the index promised")

	// Replays are not counted on: a subscriber that hears nothing for 50 ms
	// asks for a catch-up replay, which a loaded machine triggers (seen:
	// "1 replays"); every batch indexed with no gap is the invariant.
	ev := regexp.MustCompile(`(prefix-aware|round-robin) (\d+) batches, \d+ events, \d+ pages, \d+ bytes published \(0 steps dropped\); (\d+) batches indexed, 0 gaps, \d+ replays, 2 groups indexed per replica`).
		FindAllStringSubmatch(summaryField(t, out, "kv events"), -1)
	require.Len(t, ev, 2, out)
	for _, m := range ev {
		assert.Equal(t, m[2], m[3], "%s: every batch published was indexed", m[1])
	}
	assert.Regexp(t, `^passed on every replica: prefix-aware [1-9]\d* outputs in [1-9]\d* checked steps .*; round-robin [1-9]\d* outputs`,
		summaryField(t, out, "verification"))
}

// TestSimulateModelKVEvents runs hybrid presets with --kv-events on a
// loopback port; a subscriber decoding with internal/vllmwire receives
// every batch in sequence, every event decodes, every BlockStored and
// BlockRemoved carries a group_idx of the model (BlockStored with its
// group's kv_cache_spec_kind and sliding window), every group has stored
// blocks, each group's reconstructed set is consistent and as large as the
// summary's "cached at the end" for that group, and the summary's per-group
// counts are what was received. The "/host" run has a host tier: each
// group's host pages come too (medium "CPU", the group's group_idx), a
// consistent stream per group and medium, counted in the summary.
func TestSimulateModelKVEvents(t *testing.T) {
	t.Parallel()
	for _, name := range []string{"gpt-oss-like", "llama-4-like", "gpt-oss-like/host"} {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			model, host := strings.CutSuffix(name, "/host")
			preset, err := sim.Preset(model)
			require.NoError(t, err)
			groups, err := preset.Groups(preset.Layers)
			require.NoError(t, err)
			addr := fmt.Sprintf("tcp://127.0.0.1:%d", freePort(t))
			args := append([]string{"--model", model, "--requests", "8", "--pages", "64", "--kv-events", addr,
				"--kv-events-wait", "1m", "--kv-events-linger", "1s"}, smallHybrid...)
			if host {
				args = append(args, "--host-pages", "32")
			}
			done, simOut, simErr := startSimulate(t, args)

			sub := subscribeKV(t, addr)
			select {
			case code := <-done:
				require.Equal(t, exitOK, code, "stdout:\n%s\nstderr:\n%s", simOut.String(), simErr.String())
			case <-time.After(5 * time.Minute):
				t.Fatal("simulate did not finish")
			}
			out := simOut.String()
			line := regexp.MustCompile(`^(\d+) batches \(seq 0\.\.\d+\), (\d+) events, (\d+) pages`).FindStringSubmatch(summaryField(t, out, "kv events"))
			require.NotNil(t, line, out)
			batches, _ := strconv.Atoi(line[1])
			// Every batch was sent before the run returned (its linger
			// drains the queue); wait for the last to arrive.
			for deadline := time.Now().Add(time.Minute); sub.count() < batches && time.Now().Before(deadline); {
				time.Sleep(10 * time.Millisecond)
			}
			msgs := sub.messages()
			require.Len(t, msgs, batches, "messages received, batches published")
			require.Greater(t, batches, 5)

			sets := vllmwire.GroupMedia{}
			type counts struct{ stored, storedPages, removed, removedPages int }
			seen, hostSeen := make([]counts, len(groups)), make([]counts, len(groups))
			decoded := 0
			for i, m := range msgs {
				require.Equal(t, int64(i), m.Seq)
				b, err := vllmwire.Decode(m.Payload)
				require.NoError(t, err, "message %d", i)
				require.NoError(t, sets.Apply(b), "message %d", i) // every event has a group_idx
				decoded += len(b.Events)
				for _, e := range b.Events {
					if e.Type == "AllBlocksCleared" {
						continue
					}
					g := int(*e.GroupIdx)
					require.True(t, g >= 0 && g < len(groups), "message %d: group_idx %d of %d groups", i, g, len(groups))
					c := &seen[g]
					switch {
					case e.Medium != nil && *e.Medium == "CPU":
						require.True(t, host, "message %d: a CPU page without a host tier", i)
						c = &hostSeen[g]
					default:
						require.True(t, e.Medium != nil && *e.Medium == "GPU", "message %d: medium %v", i, e.Medium)
					}
					if e.Type == "BlockRemoved" {
						c.removed++
						c.removedPages += len(e.BlockHashes)
						continue
					}
					c.stored++
					c.storedPages += len(e.BlockHashes)
					kind, window := pagedkv.KVEventSpec(groups[g])
					require.NotNil(t, e.SpecKind, "message %d: BlockStored of group %d without kv_cache_spec_kind", i, g)
					require.Equal(t, kind, *e.SpecKind, "message %d, group %d", i, g)
					if window == 0 {
						require.Nil(t, e.SlidingWindow, "message %d, group %d", i, g)
					} else {
						require.NotNil(t, e.SlidingWindow, "message %d, group %d", i, g)
						require.Equal(t, int64(window), *e.SlidingWindow, "message %d, group %d", i, g)
					}
					require.EqualValues(t, 16, e.BlockSize)
				}
			}
			nevents, _ := strconv.Atoi(line[2])
			require.Equal(t, nevents, decoded, "events decoded, events published")

			cachedAtEnd := regexp.MustCompile(`; (\d+) cached at the end,`)
			for g, spec := range groups {
				assert.Positive(t, seen[g].stored, "group %d stored blocks", g)
				m := cachedAtEnd.FindStringSubmatch(summaryField(t, out, "group "+strconv.Itoa(g)))
				require.NotNil(t, m, out)
				cached, _ := strconv.Atoi(m[1])
				assert.Len(t, sets[int64(g)]["GPU"], cached, "group %d: reconstructed set, cached pages at the end", g)
				kind, window := pagedkv.KVEventSpec(spec)
				if window != 0 {
					kind += " " + strconv.Itoa(window)
				}
				c, hc := seen[g], hostSeen[g]
				want := fmt.Sprintf("group_idx %d, %s: %d BlockStored (%d pages), %d BlockRemoved (%d pages)",
					g, kind, c.stored, c.storedPages, c.removed, c.removedPages)
				if host {
					assert.Positive(t, hc.stored, "group %d stored host pages", g)
					want += fmt.Sprintf("; host pages (medium CPU): %d BlockStored (%d pages), %d BlockRemoved (%d pages)",
						hc.stored, hc.storedPages, hc.removed, hc.removedPages)
				} else {
					assert.Empty(t, sets[int64(g)]["CPU"], "group %d", g)
				}
				assert.Equal(t, want, summaryField(t, out, "kv group "+strconv.Itoa(g)))
			}
		})
	}
}

// TestSimulateModelMetrics: --metrics-addr serves a hybrid run's pool-wide
// Stats, which agree with the summary.
func TestSimulateModelMetrics(t *testing.T) {
	scraped := scrapeWhenServed(t, nil)
	code, out, errOut := runCLI(append([]string{"simulate", "--model", "llama-4-like", "--trace", sharedPrefixTrace, "--metrics-addr", "127.0.0.1:0"}, smallHybrid...)...)
	require.Equal(t, exitOK, code, "stdout:\n%s\nstderr:\n%s", out, errOut)
	steps := strings.SplitN(summaryField(t, out, "steps"), ",", 2)[0]
	hits := strings.SplitN(summaryField(t, out, "prefix hits"), " ", 2)[0]
	assert.Contains(t, *scraped, "\npagedkv_steps_total "+steps+"\n")
	assert.Contains(t, *scraped, "\npagedkv_prompt_hit_tokens_total "+hits+"\n")
	assert.Contains(t, *scraped, "\npagedkv_prompt_tokens_total 514\n")
	assert.Contains(t, *scraped, "\npagedkv_requests 0\n")
}

// TestSimulateStateModel runs --model qwen3-next-like on a small pool (a
// head dim whose pages hold the preset's state): the summary shows the
// state groups, the state restores with their verified outputs, and a
// passed verification; a page too small for the state exits 2 naming it.
func TestSimulateStateModel(t *testing.T) {
	args := []string{"simulate", "--model", "qwen3-next-like", "--requests", "8", "--pages", "40", "--qo-heads", "2", "--kv-heads", "2",
		"--head-dim", "64", "--quiet", "--verify-every", "2", "--verify-samples", "2"}
	code, out, errOut := runCLI(args...)
	require.Equal(t, exitOK, code, "stdout:\n%s\nstderr:\n%s", out, errOut)
	assert.Equal(t, "4 of 1 layers each, layer l in group l % 4: state 4864 B, state 4864 B, state 4864 B, full", summaryField(t, out, "layer groups"))
	assert.Regexp(t, `^[1-9]\d* admissions resumed from a state checkpoint \(\d+ tokens\); [1-9]\d* recurrent outputs verified bit-exact against recomputing from token 0, [1-9]\d* of them after a restore$`,
		summaryField(t, out, "state restores"))
	assert.Regexp(t, `^passed: `, summaryField(t, out, "verification"))

	code, _, errOut = runCLI(append(args, "--page-size", "4")...)
	assert.Equal(t, exitUsage, code)
	assert.Contains(t, errOut, "state of 4864 bytes")
	assert.Contains(t, errOut, "PageBytes = 2048")
}

// TestSimulateMLAModel runs --model deepseek-v3.2-like with a host tier on
// a small pool: the summary shows the MLA and indexer groups, MLA outputs
// verified (some after a prefix hit), indexer entries read back, and a
// passed verification.
func TestSimulateMLAModel(t *testing.T) {
	code, out, errOut := runCLI("simulate", "--model", "deepseek-v3.2-like", "--requests", "12", "--pages", "24", "--host-pages", "24",
		"--quiet", "--verify-every", "2", "--verify-samples", "2")
	require.Equal(t, exitOK, code, "stdout:\n%s\nstderr:\n%s", out, errOut)
	assert.Equal(t, "2 of 2 layers each, layer l in group l % 2: mla, indexer of 0", summaryField(t, out, "layer groups"))
	assert.Regexp(t, `^[1-9]\d* MLA outputs verified \([1-9]\d* of requests admitted on a prefix hit\); [1-9]\d* indexer entries read back bit-exact through their MLA pages \([1-9]\d* at positions a prefix hit served\)$`,
		summaryField(t, out, "mla, indexer"))
	assert.Regexp(t, `^passed: `, summaryField(t, out, "verification"))
}
