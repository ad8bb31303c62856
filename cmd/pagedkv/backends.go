package main

import (
	"fmt"
	"maps"
	"slices"
	"strings"

	"github.com/pagedkv/pagedkv/kernels"
	"github.com/pagedkv/pagedkv/kernels/cpu"
)

// backendFactory opens one kernels.Backend. Backends register from init
// functions like commands do; a backend that needs a build tag registers a
// factory in both files of its tag pair, the untagged one returning an
// error that says how to get it.
type backendFactory struct {
	summary string
	open    func() (kernels.Backend, error)
	// stub marks the untagged twin of a backend this binary was built
	// without: --backend NAME explains how to get it, but `version` does
	// not list it as one this binary can run.
	stub bool
}

// backends holds every backend the --backend flags accept, by name.
var backends = map[string]backendFactory{}

func registerBackend(name string, f backendFactory) {
	if _, dup := backends[name]; dup {
		panic("pagedkv: backend registered twice: " + name)
	}
	backends[name] = f
}

func init() {
	registerBackend("cpu", backendFactory{
		summary: "pure Go (kernels/cpu)",
		open:    func() (kernels.Backend, error) { return cpu.New(cpu.Config{}), nil },
	})
}

// backendNames lists the registered backends, sorted.
func backendNames() []string { return slices.Sorted(maps.Keys(backends)) }

// builtBackendNames lists the backends compiled into this binary (no stubs),
// sorted: the ones it can run, given the device a backend needs.
func builtBackendNames() []string {
	var names []string
	for _, n := range backendNames() {
		if !backends[n].stub {
			names = append(names, n)
		}
	}
	return names
}

// errUnknownBackend is returned by openBackend for a name nobody registered.
type errUnknownBackend string

func (e errUnknownBackend) Error() string {
	return fmt.Sprintf("unknown backend %q (have %s)", string(e), strings.Join(backendNames(), ", "))
}

// openBackend opens the backend called name.
func openBackend(name string) (kernels.Backend, error) {
	f, ok := backends[name]
	if !ok {
		return nil, errUnknownBackend(name)
	}
	b, err := f.open()
	if err != nil {
		return nil, fmt.Errorf("backend %s: %w", name, err)
	}
	return b, nil
}
