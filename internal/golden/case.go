package golden

import (
	"errors"
	"fmt"
	"io/fs"
	"math"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"

	"github.com/pagedkv/pagedkv/internal/safetensors"
	"github.com/pagedkv/pagedkv/layout"
)

// Format is the value of the "format" metadata key this package reads.
const Format = "pagedkv-golden/1"

// Ext is the file extension of a case.
const Ext = ".safetensors"

// Sentinel errors, wrapped with the case, tensor or parameter concerned.
var (
	// ErrBadCase: the file is a safetensors file but not a valid case (wrong
	// format, missing or unexpected tensor or parameter, bad shape).
	ErrBadCase = errors.New("golden: invalid case")
	// ErrUnknownOp: the case names an operation this package does not know.
	ErrUnknownOp = errors.New("golden: unknown op")
)

// Case is one reference case.
type Case struct {
	Path string // the file it was loaded from ("" when parsed from memory)
	Name string // the file's base name without .safetensors
	Op   string // metadata "op"
	// Meta is the whole __metadata__ map.
	Meta map[string]string
	file *safetensors.File
}

// Load reads and parses the case at path. It refuses, before reading, a
// path that is not a regular file (a device, a FIFO, a symlink to one) or
// is larger than safetensors.MaxFileBytes, naming the path and the limit.
func Load(path string) (*Case, error) {
	buf, err := safetensors.ReadBounded(path, safetensors.MaxFileBytes)
	if err != nil {
		return nil, err
	}
	c, err := Parse(strings.TrimSuffix(filepath.Base(path), Ext), buf)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	c.Path = path
	return c, nil
}

// Parse parses a case held in memory; name is used in reports. The case's
// tensors alias buf.
func Parse(name string, buf []byte) (*Case, error) {
	f, err := safetensors.Parse(buf)
	if err != nil {
		return nil, err
	}
	switch got := f.Metadata["format"]; {
	case got == "":
		return nil, fmt.Errorf("%w: no \"format\" in __metadata__ (want %q)", ErrBadCase, Format)
	case got != Format:
		return nil, fmt.Errorf("%w: format %q, want %q", ErrBadCase, got, Format)
	case f.Metadata["op"] == "":
		return nil, fmt.Errorf("%w: no \"op\" in __metadata__", ErrBadCase)
	}
	return &Case{Name: name, Op: f.Metadata["op"], Meta: f.Metadata, file: f}, nil
}

// Tensor returns the tensor called name ("in.q", "out.o", ...).
func (c *Case) Tensor(name string) (safetensors.Tensor, bool) { return c.file.Tensor(name) }

// Tensors lists the case's tensors, sorted by name.
func (c *Case) Tensors() []safetensors.Tensor { return c.file.Tensors }

// Find returns every *.safetensors file under the given paths (directories
// are walked recursively; a path naming a file is taken as is), sorted and
// without duplicates. A path that does not exist is an error, and so is a
// directory holding no case, so that a mistyped argument cannot pass.
func Find(paths ...string) ([]string, error) {
	seen := map[string]bool{}
	var out []string
	for _, root := range paths {
		st, err := os.Stat(root)
		if err != nil {
			return nil, err
		}
		if !st.IsDir() {
			if !seen[root] {
				seen[root] = true
				out = append(out, root)
			}
			continue
		}
		n := 0
		err = filepath.WalkDir(root, func(path string, d fs.DirEntry, err error) error {
			if err != nil {
				return err
			}
			if d.IsDir() || !strings.HasSuffix(d.Name(), Ext) {
				return nil
			}
			n++
			if !seen[path] {
				seen[path] = true
				out = append(out, path)
			}
			return nil
		})
		if err != nil {
			return nil, err
		}
		if n == 0 {
			return nil, fmt.Errorf("golden: no *%s case under %s", Ext, root)
		}
	}
	sort.Strings(out)
	return out, nil
}

// params reads the op's scalar parameters from the metadata. Which keys an
// op may have is checked once, against its opSpec, before it runs.
type params struct {
	meta map[string]string
}

func (p params) bad(key, v, want string) error {
	return fmt.Errorf("%w: parameter %s = %q: %s", ErrBadCase, key, v, want)
}

// intReq reads a required integer parameter.
func (p params) intReq(key string) (int, error) {
	v, ok := p.meta[key]
	if !ok {
		return 0, fmt.Errorf("%w: missing parameter %s", ErrBadCase, key)
	}
	n, err := strconv.ParseInt(strings.TrimSpace(v), 10, 32)
	if err != nil {
		return 0, p.bad(key, v, "want a decimal int32")
	}
	return int(n), nil
}

// intOr reads an optional integer parameter.
func (p params) intOr(key string, def int) (int, error) {
	if _, ok := p.meta[key]; !ok {
		return def, nil
	}
	return p.intReq(key)
}

// floatOr reads an optional finite float parameter.
func (p params) floatOr(key string, def float64) (float64, error) {
	v, ok := p.meta[key]
	if !ok {
		return def, nil
	}
	x, err := strconv.ParseFloat(strings.TrimSpace(v), 64)
	if err != nil || math.IsNaN(x) || math.IsInf(x, 0) {
		return 0, p.bad(key, v, "want a finite decimal number")
	}
	return x, nil
}

// boolOr reads an optional "0"/"1" parameter.
func (p params) boolOr(key string, def bool) (bool, error) {
	v, ok := p.meta[key]
	if !ok {
		return def, nil
	}
	switch strings.TrimSpace(v) {
	case "0":
		return false, nil
	case "1":
		return true, nil
	}
	return false, p.bad(key, v, `want "0" or "1"`)
}

// kvLayout reads kv_layout (FlashInfer's default is NHD).
func (p params) kvLayout() (layout.KVLayout, error) {
	v, ok := p.meta["kv_layout"]
	if !ok {
		return layout.NHD, nil
	}
	l, err := layout.ParseKVLayout(v)
	if err != nil {
		return 0, p.bad("kv_layout", v, `want "NHD" or "HND"`)
	}
	return l, nil
}

// tolerance reads atol and rtol, required for outputs compared within a
// tolerance.
func (p params) tolerance() (atol, rtol float64, err error) {
	for _, k := range []string{"atol", "rtol"} {
		v, ok := p.meta[k]
		if !ok {
			return 0, 0, fmt.Errorf("%w: missing parameter %s (the case has floating-point outputs)", ErrBadCase, k)
		}
		x, perr := strconv.ParseFloat(strings.TrimSpace(v), 64)
		if perr != nil || !(x >= 0) || math.IsInf(x, 0) {
			return 0, 0, p.bad(k, v, "want a finite number >= 0")
		}
		if k == "atol" {
			atol = x
		} else {
			rtol = x
		}
	}
	return atol, rtol, nil
}
