package pagedkv_test

// This test enforces the package layering described in docs/architecture.md,
// in the manner of Go's own go/build/deps_test.go: the policy is data, and a
// wrong import fails the build of the test suite, not a code review.

import (
	"go/build"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"testing"
)

const modulePath = "github.com/pagedkv/pagedkv"

// allowedImports lists, for every package of the module, the module packages
// and third-party modules its non-test files may import directly. The
// standard library is always allowed. A package missing from this table is an
// error: new packages must take a place in the layering.
//
// DO NOT CHANGE THIS DATA TO FIX BUILDS. Change the import instead, or change
// the architecture deliberately and update docs/architecture.md with it.
var allowedImports = map[string][]string{
	// L0: leaves, standard library only.
	"ragged":               {},
	"layout":               {},
	"internal/invariants":  {},
	"internal/safetensors": {},

	// L1
	"allocator":   {"internal/invariants", "go.uber.org/atomic", "github.com/pkg/errors"},
	"kernels":     {"layout"},
	"kernels/cpu": {"kernels", "layout", "golang.org/x/sys/cpu"}, // x/sys/cpu: CPU features for the assembly
	// The only importer of gorgonia.org/cu, and only under the cuda tag.
	"kernels/cuda": {"kernels", "layout", "gorgonia.org/cu", "github.com/pkg/errors"},
	"quant":        {"layout"},
	// What the tiers below the device pool share: page identity, format,
	// the remote-store interface.
	"tier": {"layout"},

	// L2
	"pagetable": {"allocator", "ragged", "internal/invariants", "github.com/pkg/errors"},
	"ppl":       {"quant", "layout", "kernels", "ragged", "github.com/pkg/errors"},

	// L3
	"append":      {"kernels", "layout", "ragged", "pagetable", "github.com/pkg/errors"},
	"mla":         {"kernels", "layout", "ragged", "pagetable", "github.com/pkg/errors"},
	"cascade":     {"kernels", "layout", "ragged", "github.com/pkg/errors"},
	"prefixcache": {"allocator", "internal/invariants", "go.uber.org/atomic", "github.com/pkg/errors"},
	"tier/host":   {"tier", "internal/invariants"},
	// The disk tier: segment files (x/sys/unix: preadv into the pages'
	// own buffers).
	"tier/disk": {"tier", "golang.org/x/sys/unix"},
	// A request's KV from one Manager to another: plan, stream, receiving
	// store, loopback TCP. It knows pages and tiers, not the Manager.
	"handoff": {"tier"},
	// The only importer of the Redis client.
	"tier/redis": {"tier", "layout", "github.com/redis/go-redis/v9"},
	// The rules of one attention group of a hybrid model (what to keep,
	// window_left, chunk segments, the hit rule): pure functions.
	"layergroup": {},

	// L4: KV-cache events. events encodes and publishes (the Manager's
	// prefixcache.Sink); kvindex subscribes and routes. kvindex shares the
	// hash chain with the Manager (prefixcache) but no code with events:
	// its decoder is its own.
	"events":  {"prefixcache", "github.com/vmihailenco/msgpack/v5", "github.com/go-zeromq/zmq4"},
	"kvindex": {"prefixcache", "github.com/vmihailenco/msgpack/v5", "github.com/go-zeromq/zmq4"},

	// L4: the engine-facing facade.
	"": {"allocator", "pagetable", "prefixcache", "layergroup", "cascade", "append", "mla", "kernels", "kernels/cpu",
		"ragged", "layout", "internal/invariants", "tier", "tier/host", "go.uber.org/atomic", "github.com/pkg/errors"},

	// Test support: slow models and conformance suites. internal/reference
	// shares no code with what it checks; it may use plain data types only.
	"internal/reference":  {"ragged", "layout", "kernels"},
	"kernels/kernelstest": {"kernels", "layout", "internal/reference", "github.com/stretchr/testify"},
	// A strict decoder of vLLM's KV-event format written from vLLM's
	// definitions alone, for tests: it shares no code with events or kvindex.
	"internal/vllmwire": {"github.com/vmihailenco/msgpack/v5"},
	// The CUDA sources compiled for the CPU (cgo); imported by tests and the CLI.
	"internal/cpuemu": {"kernels", "kernels/cuda", "layout"},
	// Starts a real redis-server for tests (standard library only).
	"internal/redistest": {},
	"internal/golden": {"internal/safetensors", "kernels", "kernels/cpu", "layout", "ragged", "pagetable",
		"cascade", "github.com/pkg/errors"},

	// Top: programs and cross-package fuzzers may import anything below them.
	// Prometheus collectors over the Manager's stats.
	"metrics": {"", "tier", "github.com/prometheus/client_golang"},
	// The serving-workload simulator behind `pagedkv simulate`.
	"internal/sim": {"*"},
	"cmd/pagedkv":  {"*"},
	"fuzz":         {"*"},
	// The Go half of tools/xformers_crosscheck.py (run by hand).
	"tools/xformerscheck": {"ragged"},
	// The C ABI (package main, built as libpagedkv): the Manager only.
	"cabi": {""},
}

// neverImportedBy are negative rules: no module package may import these
// (only tests, which this check does not read, and the packages named).
var onlyImportedBy = map[string][]string{
	"internal/reference": {"kernels/kernelstest", "fuzz", "cmd/pagedkv", "internal/sim"},
	"fuzz":               {},
	"":                   {"cmd/pagedkv", "fuzz", "internal/sim", "metrics", "cabi"},
	"gorgonia.org/cu":    {"kernels/cuda"},
	// Metrics are exported by the metrics package and the CLI, never from
	// the library's core.
	"github.com/prometheus/client_golang": {"metrics", "cmd/pagedkv"},
	// Only tests import the independent decoder.
	"internal/vllmwire": {},
	// The wire libraries stay in the event packages.
	"github.com/go-zeromq/zmq4":         {"events", "kvindex"},
	"github.com/vmihailenco/msgpack/v5": {"events", "kvindex", "internal/vllmwire"},
	// The Manager knows only tier.RemoteStore; the Redis client stays in
	// tier/redis.
	"github.com/redis/go-redis/v9": {"tier/redis"},
}

func TestImportLayering(t *testing.T) {
	pkgs := modulePackages(t)
	for rel, imports := range pkgs {
		allowed, ok := allowedImports[rel]
		if !ok {
			t.Errorf("package %q has no entry in allowedImports; give it a place in the layering (docs/architecture.md)", display(rel))
			continue
		}
		for _, imp := range imports {
			if !isAllowed(imp, allowed) {
				t.Errorf("package %q imports %q, which the layering does not allow (allowed: %v)", display(rel), imp, allowed)
			}
			for guarded, importers := range onlyImportedBy {
				if matches(imp, guarded) && rel != guarded && !contains(importers, rel) {
					t.Errorf("package %q imports %q, which only %v may import", display(rel), imp, importers)
				}
			}
		}
	}
}

// modulePackages maps each package of the module (path relative to the
// module root, "" for the root) to its direct non-test imports that are not
// in the standard library, under the default build and under -tags cuda.
func modulePackages(t *testing.T) map[string][]string {
	t.Helper()
	out := map[string][]string{}
	contexts := []build.Context{build.Default, build.Default}
	contexts[1].BuildTags = append(contexts[1].BuildTags, "cuda")
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

func isStd(imp string) bool {
	first, _, _ := strings.Cut(imp, "/")
	return !strings.Contains(first, ".")
}

// isAllowed reports whether imp (a full import path) is covered by an entry
// of allowed: a module-relative package or a third-party module prefix.
func isAllowed(imp string, allowed []string) bool {
	for _, a := range allowed {
		if a == "*" || matches(imp, a) {
			return true
		}
	}
	return false
}

// matches reports whether the full import path imp is the package named by
// rule: a module-relative path ("" for the root) or a third-party module path
// (which also covers its subpackages).
func matches(imp, rule string) bool {
	if strings.Contains(strings.SplitN(rule, "/", 2)[0], ".") {
		return imp == rule || strings.HasPrefix(imp, rule+"/")
	}
	if rule == "" {
		return imp == modulePath
	}
	return imp == modulePath+"/"+rule
}

func contains(list []string, s string) bool {
	for _, x := range list {
		if x == s {
			return true
		}
	}
	return false
}

func display(rel string) string {
	if rel == "" {
		return modulePath
	}
	return rel
}

// The checker itself must be able to fail: these imports are wrong by the
// table above, and each must be caught by the same predicates the test uses.
func TestImportLayeringRejects(t *testing.T) {
	for _, c := range []struct{ pkg, imp string }{
		{"allocator", modulePath + "/pagetable"},        // upward import
		{"layout", modulePath + "/ragged"},              // leaves stay leaves
		{"pagetable", "gorgonia.org/cu"},                // CUDA outside kernels/cuda
		{"cascade", modulePath + "/internal/reference"}, // oracle shares no code
		{"kernels", modulePath},                         // nothing imports the facade
		{"prefixcache", "github.com/prometheus/client_golang/prometheus"},
		{"kvindex", modulePath + "/events"},          // the router's decoder is its own
		{"prefixcache", "github.com/go-zeromq/zmq4"}, // no sockets under the Manager
		{"", "github.com/redis/go-redis/v9"},         // the facade knows tier.RemoteStore only
		{"tier", modulePath + "/tier/host"},          // the interface stays below its implementations
	} {
		if isAllowed(c.imp, allowedImports[c.pkg]) {
			t.Errorf("%s importing %s should be rejected", c.pkg, c.imp)
		}
	}
	if !isAllowed("gorgonia.org/cu", allowedImports["kernels/cuda"]) {
		t.Error("kernels/cuda must be allowed to import gorgonia.org/cu")
	}
}
