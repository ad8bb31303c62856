package pagedkv_test

// This test enforces the package layering described in docs/architecture.md,
// in the manner of Go's own go/build/deps_test.go: the policy is data, and a
// wrong import fails the build of the test suite, not a code review.

import (
	"errors"
	"fmt"
	"go/ast"
	"go/build"
	"go/parser"
	"go/token"
	"io/fs"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strings"
	"testing"
)

const modulePath = "github.com/pagedkv/pagedkv"

// The layers, bottom to top, as docs/architecture.md draws them. A package
// may import only packages of strictly lower layers. L0-L5 are the library;
// T1-T4 are its test support and programs, each layer above the one it uses.
const (
	L0 = iota // leaves: the standard library (and go.uber.org/atomic) only
	L1
	L2
	L3
	L4 // the engine-facing facade and the KV-event packages
	L5 // collectors over the facade
	T1 // test support: models, harnesses, emulators
	T2 // test suites and the simulator over T1
	T3 // tools over the simulator (trace replay)
	T4 // programs and cross-package fuzzers
)

// layerNames are the labels of the layers in docs/architecture.md.
var layerNames = [...]string{L0: "L0", L1: "L1", L2: "L2", L3: "L3", L4: "L4", L5: "L5", T1: "T1", T2: "T2", T3: "T3", T4: "T4"}

// pkgRule is one package's place: its layer, and exactly the module packages
// (module-relative, "" for the root) and third-party modules its non-test
// files import directly. The standard library is always allowed. An entry
// nothing imports is an error, so the lists cannot rot.
type pkgRule struct {
	layer   int
	imports []string
}

// at is a pkgRule, so that an entry is one line.
func at(layer int, imports ...string) pkgRule { return pkgRule{layer, imports} }

// anyBelow as the only import of a rule allows any module package of a lower
// layer and any third-party module (the negative rules still apply).
const anyBelow = "*"

// layering places every package of the module. A package missing from it is
// an error: new packages must take a place in the layering (one line here,
// and the same layer in docs/architecture.md).
//
// DO NOT CHANGE THIS DATA TO FIX BUILDS. Change the import instead, or change
// the architecture deliberately and update docs/architecture.md with it.
var layering = map[string]pkgRule{
	"ragged":               at(L0),
	"layout":               at(L0),
	"internal/invariants":  at(L0),
	"internal/sysmem":      at(L0),
	"internal/safetensors": at(L0),
	// The rules of one attention group of a hybrid model: pure functions.
	"layergroup": at(L0),
	// The packed layout of engine-owned step buffers: pure functions over
	// capacities, and views of bound memory.
	"stepbuf": at(L0),
	// ZeroMQ's wire protocol (ZMTP 3.0) with bounded reads, for the event
	// packages.
	"internal/zmtp": at(L0, "go.uber.org/atomic"),
	// Eviction order: the policies and the intrusive queues over slots
	// that the prefix cache and the host and disk tiers keep.
	"evict": at(L0),

	"allocator": at(L1, "internal/invariants"),
	"kernels":   at(L1, "layout", "ragged"),
	"quant":     at(L1, "layout"),
	// What the tiers below the device pool share: page identity, format,
	// the remote-store interface.
	"tier": at(L1, "layout"),

	"kernels/cpu": at(L2, "kernels", "layout", "quant", "golang.org/x/sys/cpu"), // x/sys/cpu: CPU features for the assembly
	// The only importer of gorgonia.org/cu, and only under the cuda tag.
	"kernels/cuda": at(L2, "kernels", "layout", "gorgonia.org/cu"),
	"pagetable":    at(L2, "allocator", "ragged", "internal/invariants"),
	"ppl":          at(L2, "quant", "layout", "kernels"),
	"tier/host":    at(L2, "tier", "evict", "internal/invariants", "internal/sysmem"),
	// The disk tier: segment files (x/sys/unix: preadv into the pages'
	// own buffers), evicted by evict's policies. The Manager sees only
	// tier.RemoteStore, so the facade need not import it.
	"tier/disk": at(L2, "tier", "evict", "golang.org/x/sys/unix"),
	// A request's KV from one Manager to another: plan, stream, receiving
	// store, loopback TCP. It knows pages and tiers, not the Manager.
	"handoff": at(L2, "tier"),
	// The only importer of the Redis client.
	"tier/redis": at(L2, "tier", "github.com/redis/go-redis/v9"),

	"appendkv":    at(L3, "kernels", "pagetable"),
	"mla":         at(L3, "kernels", "layout", "pagetable"),
	"cascade":     at(L3, "kernels", "layout"),
	"prefixcache": at(L3, "allocator", "evict", "internal/invariants"),

	// The engine-facing facade.
	"": at(L4, "allocator", "pagetable", "prefixcache", "layergroup", "stepbuf", "evict", "cascade", "internal/invariants", "internal/sysmem", "tier", "tier/host", "kernels"),
	// KV-cache events. events encodes and publishes (the Manager's
	// prefixcache.Sink); kvindex subscribes and routes. kvindex shares the
	// hash chain with the Manager (prefixcache) but no code with events: its
	// decoder is its own.
	"events":  at(L4, "prefixcache", "internal/zmtp", "github.com/vmihailenco/msgpack/v5"),
	"kvindex": at(L4, "prefixcache", "internal/zmtp", "github.com/vmihailenco/msgpack/v5"),

	// Prometheus collectors over the Manager's stats.
	"metrics": at(L5, "", "tier", "github.com/prometheus/client_golang"),
	// The engine glue: a Plan to the device step and the host kernel calls.
	"stepglue": at(L5, "", "appendkv", "cascade", "kernels", "kernels/cuda", "layout"),

	// internal/reference shares no code with what it checks; it may use
	// plain data types only.
	"internal/reference": at(T1, "layout"),
	// A strict decoder of vLLM's KV-event format written from vLLM's
	// definitions alone, for tests: it shares no code with events or kvindex.
	"internal/vllmwire": at(T1, "github.com/vmihailenco/msgpack/v5"),
	// The CUDA sources compiled for the CPU (cgo); imported by tests and the CLI.
	"internal/cpuemu": at(T1, "kernels", "kernels/cuda"),
	// Runs Debian's python3 as a test peer (standard library only).
	"internal/pythontest": at(T1),
	// Starts a real redis-server for tests (standard library only).
	"internal/redistest": at(T1),
	"internal/doclimits": at(T1),
	"internal/golden":    at(T1, "internal/safetensors", "kernels", "layout", "ragged", "pagetable", "cascade"),

	// Random requests on a Manager for the KV-event tests of events and kvindex.
	"internal/churn": at(T1, ""),
	// Heap growth of a call, for the tests that bound what hostile input
	// costs (standard library only).
	"internal/heaptest": at(T1),

	"kernels/kernelstest": at(T2, "kernels", "layout", "internal/reference", "github.com/stretchr/testify"),
	// The serving-workload simulator behind `pagedkv simulate`.
	"internal/sim": at(T2, "", "appendkv", "events", "handoff", "internal/reference", "kernels", "kernels/cpu", "kernels/cuda", "kvindex", "layergroup", "layout", "mla", "quant", "stepglue", "tier"),

	// Production-trace replay behind `pagedkv replay`: the Manager in
	// metadata-only mode, the limits, the plot (the only importer of gonum).
	"internal/replay": at(T3, "", "evict", "internal/sim", "kvindex", "layout", "prefixcache", "tier", "gonum.org/v1/plot"),

	"cmd/pagedkv": at(T4, anyBelow),
	"fuzz":        at(T4, anyBelow),
	// The Go half of tools/xformers_crosscheck.py (run by hand).
	"tools/xformerscheck": at(T4, "ragged"),
	// The C ABI (package main, built as libpagedkv): the Manager, its KV
	// events, and the tier stores an engine configures through it.
	"cabi": at(T4, "", "events", "layout", "tier", "tier/disk", "tier/redis", "github.com/pkg/errors"),
}

// onlyImportedBy are negative rules: no module package may import these
// (only tests, which this check does not read, and the packages named).
// They hold for anyBelow rules too; a named importer that does not import
// the package is an error, as an unused entry of layering is.
var onlyImportedBy = map[string][]string{
	"internal/reference": {"kernels/kernelstest", "internal/sim"},
	"fuzz":               {},
	"":                   {"cmd/pagedkv", "internal/sim", "internal/replay", "metrics", "stepglue", "cabi", "internal/churn"},
	"gorgonia.org/cu":    {"kernels/cuda"},
	// Metrics are exported by the metrics package and the CLI, never from
	// the library's core.
	"github.com/prometheus/client_golang": {"metrics", "cmd/pagedkv"},
	// Only tests import the independent decoder.
	"internal/vllmwire": {},
	// The wire libraries stay in the event packages.
	"internal/zmtp":                     {"events", "kvindex"},
	"github.com/vmihailenco/msgpack/v5": {"events", "kvindex", "internal/vllmwire"},
	// The Manager knows only tier.RemoteStore; the Redis client stays in
	// tier/redis.
	"github.com/redis/go-redis/v9": {"tier/redis"},
	// The progress bar of `pagedkv simulate` on a terminal.
	"github.com/schollz/progressbar": {"cmd/pagedkv"},
	// Stack traces only where one crosses an API boundary: the C ABI's
	// internal-error message (docs/architecture.md, "Conventions").
	"github.com/pkg/errors": {"cabi"},
	// Typed atomics: sync/atomic's where it has the type, go.uber.org/atomic
	// for the types it lacks (TestAtomicStyle checks which).
	"go.uber.org/atomic": {"internal/zmtp"},
}

func TestImportLayering(t *testing.T) {
	for _, v := range layeringViolations(modulePackages(t), layering, onlyImportedBy) {
		t.Error(v)
	}
}

// layeringViolations checks a package graph (each module package,
// module-relative, to its direct non-test imports outside the standard
// library, as full paths) against rules and guards, and returns every
// violation, sorted:
//   - a package of the graph without a rule, or a rule without a package;
//   - a rule that imports a module package of its own layer or above, or one
//     that has no rule;
//   - an import the package's rule does not list, or a listed import the
//     package does not make;
//   - an import a guard reserves for other packages, or a guard's importer
//     that does not import it.
func layeringViolations(graph map[string][]string, rules map[string]pkgRule, guards map[string][]string) []string {
	var out []string
	report := func(format string, args ...any) { out = append(out, fmt.Sprintf(format, args...)) }
	for rel, rule := range rules {
		if _, ok := graph[rel]; !ok {
			report("layering has an entry for %q, which is not a package of the module", display(rel))
		}
		for _, dep := range rule.imports {
			if dep == anyBelow || isThirdParty(dep) {
				continue
			}
			switch depRule, ok := rules[dep]; {
			case !ok:
				report("package %q may import %q, which has no entry in layering", display(rel), display(dep))
			case depRule.layer >= rule.layer:
				report("package %q (%s) may import %q (%s): imports must go to a strictly lower layer",
					display(rel), layerNames[rule.layer], display(dep), layerNames[depRule.layer])
			}
		}
	}
	for rel, imports := range graph {
		rule, ok := rules[rel]
		if !ok {
			report("package %q has no entry in layering; give it a place in the layering (docs/architecture.md)", display(rel))
			continue
		}
		for _, imp := range imports {
			if !ruleAllows(rule, imp, rules) {
				report("package %q (%s) imports %q, which its entry in layering does not allow (allowed: %v)",
					display(rel), layerNames[rule.layer], imp, rule.imports)
			}
			for guarded, importers := range guards {
				if matches(imp, guarded) && rel != guarded && !slices.Contains(importers, rel) {
					report("package %q imports %q, which only %v may import", display(rel), imp, importers)
				}
			}
		}
		for _, dep := range rule.imports {
			if dep != anyBelow && !slices.ContainsFunc(imports, func(imp string) bool { return matches(imp, dep) }) {
				report("package %q does not import %q; remove it from its entry in layering", display(rel), display(dep))
			}
		}
	}
	for guarded, importers := range guards {
		for _, rel := range importers {
			if !slices.ContainsFunc(graph[rel], func(imp string) bool { return matches(imp, guarded) }) {
				report("package %q does not import %q; remove it from onlyImportedBy", display(rel), display(guarded))
			}
		}
	}
	sort.Strings(out)
	return out
}

// ruleAllows reports whether rule lets its package import imp (a full
// import path): imp is listed, or the rule is anyBelow and imp is a
// third-party module or a module package of a lower layer.
func ruleAllows(rule pkgRule, imp string, rules map[string]pkgRule) bool {
	for _, dep := range rule.imports {
		if dep == anyBelow {
			rel, inModule := moduleRelative(imp)
			if !inModule {
				return true
			}
			depRule, ok := rules[rel]
			return ok && depRule.layer < rule.layer
		}
		if matches(imp, dep) {
			return true
		}
	}
	return false
}

// modulePackages maps each package of the module (path relative to the
// module root, "" for the root) to its direct non-test imports that are not
// in the standard library: the union over buildContexts, so that the
// check, and its unused-entry rule above all, reads the same on every
// machine.
func modulePackages(t *testing.T) map[string][]string {
	t.Helper()
	out := map[string][]string{}
	contexts := buildContexts()
	err := filepath.WalkDir(".", func(path string, d os.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if !d.IsDir() {
			return nil
		}
		name := d.Name()
		if path != "." && (strings.HasPrefix(name, ".") || strings.HasPrefix(name, "_") || name == "testdata" || name == "docs") {
			return filepath.SkipDir
		}
		if _, err := os.Stat(filepath.Join(path, "go.mod")); path != "." && err == nil {
			return filepath.SkipDir // a module of its own (a code generator), not part of this one
		}
		rel := filepath.ToSlash(path)
		if rel == "." {
			rel = ""
		}
		seen := map[string]bool{}
		found := false
		for i := range contexts {
			p, err := contexts[i].ImportDir(path, 0)
			if err != nil {
				if _, ok := err.(*build.NoGoError); ok {
					continue
				}
				return err
			}
			found = true
			for _, imp := range p.Imports {
				if imp == "C" || isStd(imp) {
					continue
				}
				seen[imp] = true
			}
		}
		if found {
			var imps []string
			for imp := range seen {
				imps = append(imps, imp)
			}
			sort.Strings(imps)
			out[rel] = imps
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return out
}

// buildContexts are the builds the module is made for: linux and darwin on
// amd64 and arm64, with cgo, each without tags, under -tags cuda and under
// -tags purego (which drops the assembly of kernels/cpu).
func buildContexts() []build.Context {
	var out []build.Context
	for _, platform := range []struct{ goos, goarch string }{{"linux", "amd64"}, {"linux", "arm64"}, {"darwin", "amd64"}, {"darwin", "arm64"}} {
		for _, tags := range [][]string{nil, {"cuda"}, {"purego"}} {
			ctx := build.Default
			ctx.GOOS, ctx.GOARCH, ctx.CgoEnabled, ctx.BuildTags = platform.goos, platform.goarch, true, tags
			out = append(out, ctx)
		}
	}
	return out
}

func isStd(imp string) bool {
	first, _, _ := strings.Cut(imp, "/")
	return !strings.Contains(first, ".")
}

// isThirdParty reports whether a rule names a third-party module rather
// than a module-relative package.
func isThirdParty(rule string) bool {
	first, _, _ := strings.Cut(rule, "/")
	return strings.Contains(first, ".")
}

// moduleRelative is the module-relative path of a full import path ("" for
// the root), and whether imp is in the module at all.
func moduleRelative(imp string) (rel string, inModule bool) {
	if imp == modulePath {
		return "", true
	}
	return strings.CutPrefix(imp, modulePath+"/")
}

// matches reports whether the full import path imp is the package named by
// rule: a module-relative path ("" for the root) or a third-party module path
// (which also covers its subpackages).
func matches(imp, rule string) bool {
	if isThirdParty(rule) {
		return imp == rule || strings.HasPrefix(imp, rule+"/")
	}
	if rule == "" {
		return imp == modulePath
	}
	return imp == modulePath+"/"+rule
}

func display(rel string) string {
	if rel == "" {
		return modulePath
	}
	return rel
}

// The checker itself must be able to fail: each case plants one import (and,
// where planted, the allow-list entry that would let it through) into a copy
// of the module's real graph and table, and the same function the real test
// runs must report exactly the violations named.
func TestImportLayeringRejects(t *testing.T) {
	real := modulePackages(t)
	if v := layeringViolations(real, layering, onlyImportedBy); len(v) > 0 {
		t.Fatalf("the real graph breaks the layering (see TestImportLayering): %v", v)
	}
	for _, c := range []struct {
		name         string
		pkg, imp     string // the planted import: a module-relative package or a third-party path
		plantAllowed bool   // also list imp in pkg's entry
		want         []string
	}{
		{"upward import, even when allowed", "allocator", "pagetable", true,
			[]string{`package "allocator" (L1) may import "pagetable" (L2): imports must go to a strictly lower layer`}},
		{"same-layer import, even when allowed", "kernels", "quant", true,
			[]string{`package "kernels" (L1) may import "quant" (L1): imports must go to a strictly lower layer`}},
		{"leaves stay leaves", "layout", "ragged", false,
			[]string{`package "layout" (L0) imports "github.com/pagedkv/pagedkv/ragged", which its entry in layering does not allow (allowed: [])`}},
		{"upward import not allowed", "allocator", "pagetable", false,
			[]string{`package "allocator" (L1) imports "github.com/pagedkv/pagedkv/pagetable", which its entry in layering does not allow (allowed: [internal/invariants])`}},
		{"nothing imports the facade from below", "kernels", "", true, []string{
			`package "kernels" (L1) may import "github.com/pagedkv/pagedkv" (L4): imports must go to a strictly lower layer`,
			`package "kernels" imports "github.com/pagedkv/pagedkv", which only [cmd/pagedkv internal/sim internal/replay metrics stepglue cabi internal/churn] may import`}},
		{"the oracle shares no code", "cascade", "internal/reference", true, []string{
			`package "cascade" (L3) may import "internal/reference" (T1): imports must go to a strictly lower layer`,
			`package "cascade" imports "github.com/pagedkv/pagedkv/internal/reference", which only [kernels/kernelstest internal/sim] may import`}},
		{"CUDA outside kernels/cuda", "pagetable", "gorgonia.org/cu", true,
			[]string{`package "pagetable" imports "gorgonia.org/cu", which only [kernels/cuda] may import`}},
		{"no sockets under the Manager", "prefixcache", "internal/zmtp", true,
			[]string{`package "prefixcache" imports "github.com/pagedkv/pagedkv/internal/zmtp", which only [events kvindex] may import`}},
		{"the router's decoder is its own", "kvindex", "events", true,
			[]string{`package "kvindex" (L4) may import "events" (L4): imports must go to a strictly lower layer`}},
		{"the facade knows tier.RemoteStore only", "", "github.com/redis/go-redis/v9", true,
			[]string{`package "github.com/pagedkv/pagedkv" imports "github.com/redis/go-redis/v9", which only [tier/redis] may import`}},
		{"a program may import anything below it", "cmd/pagedkv", "tier/host", false, nil},
		{"but nothing of its own layer", "cmd/pagedkv", "cabi", false, []string{
			`package "cmd/pagedkv" (T4) imports "github.com/pagedkv/pagedkv/cabi", which its entry in layering does not allow (allowed: [*])`}},
	} {
		t.Run(c.name, func(t *testing.T) {
			graph, rules := plantImport(real, layering, c.pkg, c.imp, c.plantAllowed)
			got := layeringViolations(graph, rules, onlyImportedBy)
			if !slices.Equal(got, c.want) {
				t.Errorf("planted %q -> %q: violations\n%s\nwant\n%s", display(c.pkg), display(c.imp),
					strings.Join(got, "\n"), strings.Join(c.want, "\n"))
			}
		})
	}
}

// plantImport returns copies of graph and rules with pkg importing imp (a
// module-relative package or a third-party path), and with imp listed in
// pkg's rule when allow is set.
func plantImport(graph map[string][]string, rules map[string]pkgRule, pkg, imp string, allow bool) (map[string][]string, map[string]pkgRule) {
	full := imp
	if !isThirdParty(imp) {
		full = modulePath
		if imp != "" {
			full += "/" + imp
		}
	}
	g := maps.Clone(graph)
	g[pkg] = append(slices.Clone(g[pkg]), full)
	r := maps.Clone(rules)
	if allow {
		rule := r[pkg]
		rule.imports = append(slices.Clone(rule.imports), imp)
		r[pkg] = rule
	}
	return g, r
}

// The allow-lists cannot rot: an entry nothing imports, a rule for a
// package that does not exist and a guard's idle importer are reported.
func TestImportLayeringRejectsUnusedEntries(t *testing.T) {
	graph := map[string][]string{
		"ragged":  nil,
		"kernels": {modulePath + "/ragged"},
	}
	rules := map[string]pkgRule{
		"ragged":  at(L0),
		"kernels": at(L1, "ragged", "layout", "github.com/pkg/errors"),
		"layout":  at(L0),
	}
	guards := map[string][]string{"ragged": {"kernels", "cascade"}}
	want := []string{
		`layering has an entry for "layout", which is not a package of the module`,
		`package "cascade" does not import "ragged"; remove it from onlyImportedBy`,
		`package "kernels" does not import "github.com/pkg/errors"; remove it from its entry in layering`,
		`package "kernels" does not import "layout"; remove it from its entry in layering`,
	}
	if got := layeringViolations(graph, rules, guards); !slices.Equal(got, want) {
		t.Errorf("violations\n%s\nwant\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
	}
}

// docs/architecture.md draws the layers; its block must place every package
// exactly where layering does.
func TestArchitectureDocMatchesLayering(t *testing.T) {
	doc, err := os.ReadFile("docs/architecture.md")
	if err != nil {
		t.Fatal(err)
	}
	for _, v := range docLayeringMismatches(string(doc), layering) {
		t.Error(v)
	}
}

// The doc check can fail: a package drawn in the wrong layer, one missing
// and one unknown are each reported.
func TestArchitectureDocMismatchesReported(t *testing.T) {
	doc := "## Layers\n\n```\nL0  ragged/   prose words\nL1  kernels/\n    ghost/ (continued)\n```\n"
	rules := map[string]pkgRule{"ragged": at(L1), "kernels": at(L1, "ragged"), "layout": at(L0)}
	want := []string{
		`docs/architecture.md does not place "layout" (layering: L0)`,
		`docs/architecture.md places "ghost" in L1, but layering has no entry for it`,
		`docs/architecture.md places "ragged" in L0, layering in L1`,
	}
	if got := docLayeringMismatches(doc, rules); !slices.Equal(got, want) {
		t.Errorf("mismatches\n%s\nwant\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
	}
}

// docLayeringMismatches compares the layer block of doc (the text of
// docs/architecture.md) with rules, and returns every difference, sorted.
func docLayeringMismatches(doc string, rules map[string]pkgRule) []string {
	docLayers, err := parseLayerBlock(doc)
	if err != nil {
		return []string{err.Error()}
	}
	var out []string
	for rel, rule := range rules {
		switch layer, ok := docLayers[rel]; {
		case !ok:
			out = append(out, fmt.Sprintf("docs/architecture.md does not place %q (layering: %s)", display(rel), layerNames[rule.layer]))
		case layer != rule.layer:
			out = append(out, fmt.Sprintf("docs/architecture.md places %q in %s, layering in %s", display(rel), layerNames[layer], layerNames[rule.layer]))
		}
	}
	for rel, layer := range docLayers {
		if _, ok := rules[rel]; !ok {
			out = append(out, fmt.Sprintf("docs/architecture.md places %q in %s, but layering has no entry for it", display(rel), layerNames[layer]))
		}
	}
	sort.Strings(out)
	return out
}

// parseLayerBlock reads the code block under "## Layers" of
// docs/architecture.md: a line starts with a layer label (L0..T4) or
// continues the previous layer's line with blanks; its words that end in
// "/" are packages (folders; "./" is the root package), the rest is prose.
func parseLayerBlock(doc string) (map[string]int, error) {
	_, after, ok := strings.Cut(doc, "## Layers")
	if !ok {
		return nil, errors.New(`docs/architecture.md has no "## Layers" section`)
	}
	_, after, ok = strings.Cut(after, "```\n")
	block, _, ok2 := strings.Cut(after, "```")
	if !ok || !ok2 {
		return nil, errors.New(`the "## Layers" section of docs/architecture.md has no code block`)
	}
	layers := map[string]int{}
	layer := -1
	for _, line := range strings.Split(block, "\n") {
		words := strings.Fields(line)
		if len(words) == 0 {
			continue
		}
		if !strings.HasPrefix(line, " ") {
			i := slices.Index(layerNames[:], words[0])
			if i < 0 {
				return nil, fmt.Errorf("layer block line %q starts with %q, want a layer label %v", line, words[0], layerNames)
			}
			layer, words = i, words[1:]
		} else if layer < 0 {
			return nil, fmt.Errorf("layer block line %q continues no layer", line)
		}
		for _, w := range words {
			if !strings.HasSuffix(w, "/") {
				continue
			}
			rel := strings.TrimSuffix(strings.TrimSuffix(w, "/"), ".")
			if prev, dup := layers[rel]; dup {
				return nil, fmt.Errorf("layer block places %q twice (%s and %s)", display(rel), layerNames[prev], layerNames[layer])
			}
			layers[rel] = layer
		}
	}
	return layers, nil
}

// uberOnly are the go.uber.org/atomic types (and their constructors) that
// sync/atomic lacks: the only ones the module may take from it.
var uberOnly = map[string]bool{
	"Duration": true, "NewDuration": true, "Float32": true, "NewFloat32": true, "Float64": true, "NewFloat64": true,
	"String": true, "NewString": true, "Error": true, "NewError": true, "Time": true, "NewTime": true,
}

// TestAtomicStyle enforces the atomics rule of docs/architecture.md
// ("Conventions"): shared words are typed atomic values, never sync/atomic's
// function forms (atomic.AddInt64(&n, 1)); a type sync/atomic has comes from
// sync/atomic, and go.uber.org/atomic, imported as uatomic, supplies only
// the types it lacks (uberOnly). Test files follow the rule too.
func TestAtomicStyle(t *testing.T) {
	for _, v := range atomicStyleViolations(t, ".") {
		t.Error(v)
	}
}

// atomicStyleViolations parses every .go file under root (as
// modulePackages walks the module) and returns each break of the rule.
func atomicStyleViolations(t *testing.T, root string) []string {
	t.Helper()
	var out []string
	fset := token.NewFileSet()
	err := filepath.WalkDir(root, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() {
			name := d.Name()
			if path != root && (strings.HasPrefix(name, ".") || strings.HasPrefix(name, "_") || name == "testdata" || name == "docs") {
				return filepath.SkipDir
			}
			if _, err := os.Stat(filepath.Join(path, "go.mod")); path != root && err == nil {
				return filepath.SkipDir
			}
			return nil
		}
		if !strings.HasSuffix(path, ".go") {
			return nil
		}
		f, err := parser.ParseFile(fset, path, nil, parser.SkipObjectResolution)
		if err != nil {
			return err
		}
		out = append(out, fileAtomicViolations(fset, f)...)
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return out
}

// fileAtomicViolations checks one parsed file against the atomics rule.
func fileAtomicViolations(fset *token.FileSet, f *ast.File) []string {
	var out []string
	std, uber := "", ""
	for _, imp := range f.Imports {
		name := ""
		if imp.Name != nil {
			name = imp.Name.Name
		}
		switch strings.Trim(imp.Path.Value, `"`) {
		case "sync/atomic":
			std = cmpOr(name, "atomic")
		case "go.uber.org/atomic":
			uber = cmpOr(name, "atomic")
			if uber != "uatomic" {
				out = append(out, fmt.Sprintf("%s: go.uber.org/atomic imported as %q, want uatomic", fset.Position(imp.Pos()), uber))
			}
		}
	}
	ast.Inspect(f, func(n ast.Node) bool {
		sel, ok := n.(*ast.SelectorExpr)
		if !ok {
			return true
		}
		x, ok := sel.X.(*ast.Ident)
		if !ok {
			return true
		}
		switch {
		case std != "" && x.Name == std && isAtomicFunc(sel.Sel.Name):
			out = append(out, fmt.Sprintf("%s: sync/atomic's function %s; use a typed atomic (atomic.Int64, ...)", fset.Position(sel.Pos()), sel.Sel.Name))
		case uber != "" && x.Name == uber && !uberOnly[sel.Sel.Name]:
			out = append(out, fmt.Sprintf("%s: go.uber.org/atomic's %s; sync/atomic has it", fset.Position(sel.Pos()), sel.Sel.Name))
		}
		return true
	})
	return out
}

// isAtomicFunc reports whether name is one of sync/atomic's functions on a
// plain word (AddInt64, LoadPointer, CompareAndSwapUint32, ...).
func isAtomicFunc(name string) bool {
	for _, p := range [...]string{"Add", "Load", "Store", "Swap", "CompareAndSwap", "And", "Or"} {
		if rest, ok := strings.CutPrefix(name, p); ok && rest != "" && token.IsExported(rest) {
			return true
		}
	}
	return false
}

func cmpOr(a, b string) string {
	if a != "" {
		return a
	}
	return b
}

// TestAtomicStyleRejects plants each kind of break in a small file.
func TestAtomicStyleRejects(t *testing.T) {
	for name, src := range map[string]string{
		"function form": "package p\nimport \"sync/atomic\"\nvar n int64\nfunc f() { atomic.AddInt64(&n, 1) }\n",
		"uber has std":  "package p\nimport uatomic \"go.uber.org/atomic\"\nvar n uatomic.Int64\n",
		"uber unnamed":  "package p\nimport \"go.uber.org/atomic\"\nvar d atomic.Duration\n",
	} {
		fset := token.NewFileSet()
		f, err := parser.ParseFile(fset, name+".go", src, 0)
		if err != nil {
			t.Fatal(err)
		}
		if got := fileAtomicViolations(fset, f); len(got) != 1 {
			t.Errorf("%s: violations %q, want exactly one", name, got)
		}
	}
	fset := token.NewFileSet()
	ok := "package p\nimport (\n\"sync/atomic\"\nuatomic \"go.uber.org/atomic\"\n)\nvar n atomic.Int64\nvar d uatomic.Duration\nfunc f() { n.Add(1); d.Store(0) }\n"
	f, err := parser.ParseFile(fset, "ok.go", ok, 0)
	if err != nil {
		t.Fatal(err)
	}
	if got := fileAtomicViolations(fset, f); len(got) != 0 {
		t.Errorf("a file that keeps the rule: violations %q", got)
	}
}
