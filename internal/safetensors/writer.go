package safetensors

import (
	"bytes"
	"encoding/binary"
	"encoding/json"
	"io"
	"os"
	"sort"
)

// Encode returns the safetensors file holding meta and tensors. Tensors are
// laid out in name order, back to back; the header is padded with spaces to a
// multiple of 8 bytes, as the Python writer does. It returns an [*Error]
// (wrapping ErrMalformed) when a tensor breaks an invariant of the package
// doc (duplicate or reserved name, data length that disagrees with the shape,
// rank above MaxRank, invalid dtype).
func Encode(meta map[string]string, tensors []Tensor) ([]byte, error) {
	ts := append([]Tensor(nil), tensors...)
	sort.Slice(ts, func(i, j int) bool { return ts[i].Name < ts[j].Name })
	type entryOut struct {
		DType       string   `json:"dtype"`
		Shape       []int    `json:"shape"`
		DataOffsets [2]int64 `json:"data_offsets"`
	}
	header := make(map[string]any, len(ts)+1)
	if len(meta) > 0 {
		header[MetadataKey] = meta
	}
	var off int64
	for i, t := range ts {
		switch {
		case t.Name == "" || t.Name == MetadataKey:
			return nil, malformed(t.Name, "reserved or empty tensor name")
		case i > 0 && ts[i-1].Name == t.Name:
			return nil, malformed(t.Name, "appears twice")
		case !t.DType.Valid():
			return nil, malformed(t.Name, "invalid dtype %v", t.DType)
		case len(t.Shape) > MaxRank:
			return nil, malformed(t.Name, "rank %d exceeds %d", len(t.Shape), MaxRank)
		}
		for _, d := range t.Shape {
			if d < 0 {
				return nil, malformed(t.Name, "negative dimension in shape %v", t.Shape)
			}
		}
		if need, ok := byteSize(t.Shape, t.DType.Size()); !ok || need != uint64(len(t.Data)) {
			return nil, malformed(t.Name, "shape %v of %v needs %s bytes but Data holds %d",
				t.Shape, t.DType, byteCount(t.Shape, t.DType.Size()), len(t.Data))
		}
		shape := t.Shape
		if shape == nil {
			shape = []int{}
		}
		header[t.Name] = entryOut{DType: t.DType.String(), Shape: shape, DataOffsets: [2]int64{off, off + int64(len(t.Data))}}
		off += int64(len(t.Data))
	}
	js, err := json.Marshal(header) // map keys come out sorted: deterministic
	if err != nil {
		return nil, err
	}
	for len(js)%8 != 0 {
		js = append(js, ' ')
	}
	var buf bytes.Buffer
	buf.Grow(8 + len(js) + int(off))
	var n [8]byte
	binary.LittleEndian.PutUint64(n[:], uint64(len(js)))
	buf.Write(n[:])
	buf.Write(js)
	for _, t := range ts {
		buf.Write(t.Data)
	}
	return buf.Bytes(), nil
}

// Write writes the file Encode returns to w.
func Write(w io.Writer, meta map[string]string, tensors []Tensor) error {
	b, err := Encode(meta, tensors)
	if err != nil {
		return err
	}
	_, err = w.Write(b)
	return err
}

// WriteFile writes the file Encode returns to path (mode 0644). Nothing is
// written when Encode fails.
func WriteFile(path string, meta map[string]string, tensors []Tensor) error {
	b, err := Encode(meta, tensors)
	if err != nil {
		return err
	}
	return os.WriteFile(path, b, 0o644)
}
