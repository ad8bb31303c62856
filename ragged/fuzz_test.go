package ragged

import (
	"errors"
	"testing"
)

// byteReader hands out fuzz bytes, then zeros once the input runs out.
type byteReader struct{ b []byte }

func (r *byteReader) next() byte {
	if len(r.b) == 0 {
		return 0
	}
	v := r.b[0]
	r.b = r.b[1:]
	return v
}

// FuzzSegmentPackBits: the input is [flags, nseg, len_0..len_{nseg-1}, x...].
// flags bit 0 selects big order. Packing must equal the bit-by-bit model, the
// byte indptr must equal ceil-per-segment prefix sums, unpack∘pack must be
// the identity on the bits, and pack∘unpack the identity on packed bytes
// whose pad bits are 0.
func FuzzSegmentPackBits(f *testing.F) {
	f.Add([]byte{0, 3, 4, 3, 4, 1, 0, 1, 1, 0, 0, 1, 1, 1, 0, 1})                                // the docstring example
	f.Add([]byte{1, 3, 4, 3, 4, 1, 0, 1, 1, 0, 0, 1, 1, 1, 0, 1})                                // big order
	f.Add([]byte{0, 3, 12, 5, 6, 1, 1, 0, 0, 0, 0, 1, 1, 1, 1, 0, 0, 0, 0, 1, 0, 0, 0, 1, 0, 1}) // FlashInfer's figure
	f.Add([]byte{0, 4, 0, 17, 0, 8, 255, 2, 3, 0, 0, 9, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1})
	f.Add([]byte{0, 0})
	f.Fuzz(func(t *testing.T, data []byte) {
		r := &byteReader{data}
		order := BitOrderLittle
		if r.next()&1 == 1 {
			order = BitOrderBig
		}
		nseg := int(r.next() % 9)
		lens := make([]int32, nseg)
		for i := range lens {
			lens[i] = int32(r.next() % 70)
		}
		indptr, err := IndptrFromLengths(lens)
		if err != nil {
			t.Fatal(err)
		}
		nnz := int(indptr[nseg])
		x := make([]byte, nnz)
		for i := range x {
			x[i] = r.next()
		}

		y, yIP, err := SegmentPackBits(x, indptr, order)
		if err != nil {
			t.Fatalf("SegmentPackBits(%v, %v): %v", x, indptr, err)
		}
		wantY, wantIP := modelSegmentPackBits(x, indptr, order)
		if string(y) != string(wantY) || !equalInt32(yIP, wantIP) {
			t.Fatalf("SegmentPackBits(%v, %v, %s) = %v %v, model %v %v", x, indptr, order, y, yIP, wantY, wantIP)
		}
		flat, err := PackBits(x, order)
		if err != nil || string(flat) != string(modelPackBits(x, order)) {
			t.Fatalf("PackBits(%v, %s) = %v, %v; model %v", x, order, flat, err, modelPackBits(x, order))
		}

		back, err := SegmentUnpackBits(y, yIP, indptr, order)
		if err != nil {
			t.Fatal(err)
		}
		for i := range x {
			if (x[i] != 0) != (back[i] == 1) {
				t.Fatalf("unpack(pack(x))[%d] = %d, x = %d", i, back[i], x[i])
			}
		}
		// y has zero pad bits by construction, so packing its unpacked bits
		// must give y back.
		again, _, err := SegmentPackBits(back, indptr, order)
		if err != nil || string(again) != string(y) {
			t.Fatalf("pack(unpack(y)) = %v, %v; y = %v", again, err, y)
		}
		// Random packed bytes (pad bits cleared) survive unpack∘pack.
		rnd := make([]byte, len(y))
		for i := range rnd {
			rnd[i] = y[len(y)-1-i] ^ 0x5a
		}
		for s := 0; s < nseg; s++ {
			if n := int(lens[s]); n%8 != 0 {
				last := int(yIP[s+1]) - 1
				keep := byte(1)<<(n%8) - 1 // little: low bits hold the data
				if order == BitOrderBig {
					keep = ^(byte(0xff) >> (n % 8))
				}
				rnd[last] &= keep
			}
		}
		bits, err := SegmentUnpackBits(rnd, yIP, indptr, order)
		if err != nil {
			t.Fatal(err)
		}
		packed, _, err := SegmentPackBits(bits, indptr, order)
		if err != nil || string(packed) != string(rnd) {
			t.Fatalf("pack(unpack(%v)) = %v, %v", rnd, packed, err)
		}
	})
}

// FuzzIndptr: the input is [mode, values...]. Mode 0 builds an indptr from
// lengths (always valid); otherwise the bytes are raw int8 indptr values,
// often invalid. ValidateIndptr must agree with a direct reading of the
// rules; valid arrays must survive lengths⇄indptr, CSR⇄COO and
// ragged⇄padded round trips; COOToCSR must accept exactly the sorted,
// in-range batch index arrays.
func FuzzIndptr(f *testing.F) {
	f.Add([]byte{0, 3, 0, 2})
	f.Add([]byte{1, 0, 3, 3, 5})
	f.Add([]byte{1, 0, 4, 2, 5})
	f.Add([]byte{1, 1, 3})
	f.Add([]byte{1})
	f.Add([]byte{2, 0, 0, 1, 1, 3})
	f.Fuzz(func(t *testing.T, data []byte) {
		if len(data) == 0 || len(data) > 64 {
			return
		}
		mode, rest := data[0]%3, data[1:]
		switch mode {
		case 0:
			lens := make([]int32, len(rest))
			for i, b := range rest {
				lens[i] = int32(b % 12)
			}
			indptr, err := IndptrFromLengths(lens)
			if err != nil {
				t.Fatal(err)
			}
			checkIndptrRoundTrips(t, indptr, 1+int(data[0]/3%3), int(data[0]/9%3))
		case 1:
			indptr := make([]int32, len(rest))
			for i, b := range rest {
				indptr[i] = int32(int8(b))
			}
			valid := len(indptr) > 0 && indptr[0] == 0
			for i := 1; valid && i < len(indptr); i++ {
				valid = indptr[i] >= indptr[i-1]
			}
			nnz := 0
			if len(indptr) > 0 {
				nnz = int(indptr[len(indptr)-1])
			}
			err := ValidateIndptr(indptr, nnz)
			if valid != (err == nil) {
				t.Fatalf("ValidateIndptr(%v) = %v, rules say valid=%t", indptr, err, valid)
			}
			if err != nil && !errors.Is(err, ErrBadIndptr) {
				t.Fatalf("ValidateIndptr(%v) = %v, want ErrBadIndptr", indptr, err)
			}
			if valid {
				checkIndptrRoundTrips(t, indptr, 2, 1)
				if ValidateIndptr(indptr, nnz+1) == nil {
					t.Fatalf("ValidateIndptr(%v, %d) accepted the wrong nnz", indptr, nnz+1)
				}
			}
		case 2:
			batch := 0
			if len(rest) > 0 {
				batch, rest = int(rest[0]%6), rest[1:]
			}
			bi := make([]int32, len(rest))
			for i, b := range rest {
				bi[i] = int32(int8(b)) % 8
			}
			ok := true
			for i, b := range bi {
				ok = ok && b >= 0 && int(b) < batch && (i == 0 || b >= bi[i-1])
			}
			indptr, err := COOToCSR(bi, nil, batch)
			if ok != (err == nil) {
				t.Fatalf("COOToCSR(%v, batch %d) = %v, rules say ok=%t", bi, batch, err, ok)
			}
			if ok {
				back, _, err := CSRToCOO(indptr)
				if err != nil || !equalInt32(back, bi) {
					t.Fatalf("CSRToCOO(COOToCSR(%v)) = %v, %v", bi, back, err)
				}
			}
		}
	})
}

// FuzzXFormersMask: the input is [kind, window, padding, batch, (q, kv)...].
// Construction must fail exactly when xFormers' preconditions fail, with the
// matching sentinel; an accepted mask must match the torch-style model, its
// packed FlashInfer form must match segment_packbits of the model, and its
// FlashInferParams must be right both ways (OK ⇒ FlashInfer's formula gives
// the same mask; !OK ⇒ no causal/window_left pair does).
func FuzzXFormersMask(f *testing.F) {
	f.Add([]byte{3, 3, 0, 3, 2, 2, 1, 1, 2, 2})    // Mistral chunk 1
	f.Add([]byte{4, 3, 0, 3, 2, 4, 0, 1, 1, 3})    // Mistral chunk 2
	f.Add([]byte{5, 0, 3, 3, 1, 3, 1, 2, 1, 3})    // Mistral decode
	f.Add([]byte{1, 0, 0, 2, 2, 4, 3, 1})          // top-left causal with cached keys
	f.Add([]byte{3, 2, 0, 1, 5, 2})                // a local window before the first key
	f.Add([]byte{0, 0, 0, 4, 1, 2, 0, 0, 3, 1, 2}) // block diagonal
	f.Fuzz(func(t *testing.T, data []byte) {
		r := &byteReader{data}
		kind := allKinds[int(r.next())%len(allKinds)]
		window := int(int8(r.next())) % 9
		pad := int(int8(r.next())) % 9
		batch := int(r.next() % 6)
		cfg := MaskConfig{Kind: kind, QSeqLen: make([]int32, batch), KVSeqLen: make([]int32, batch)}
		for b := 0; b < batch; b++ {
			cfg.QSeqLen[b] = int32(int8(r.next())) % 9
			cfg.KVSeqLen[b] = int32(int8(r.next())) % 9
		}
		local := kind == KindBlockDiagonalCausalLocal || kind == KindBlockDiagonalCausalLocalFromBottomRight
		padded := kind == KindBlockDiagonalCausalWithOffsetPaddedKeys
		if local {
			cfg.WindowSize = window
		}
		if padded {
			cfg.KVPadding = pad
		}

		// xFormers' preconditions, read off its constructors.
		var wantErr error
		switch {
		case local && window < 1:
			wantErr = ErrInvalidWindow
		case padded && pad < 1:
			wantErr = ErrNegativeLength
		case padded && batch == 0:
			wantErr = ErrLengthMismatch // xFormers takes max(kv_seqlen)
		}
		for b := 0; b < batch && wantErr == nil; b++ {
			q, kv := int(cfg.QSeqLen[b]), int(cfg.KVSeqLen[b])
			switch {
			case q < 0 || kv < 0:
				wantErr = ErrNegativeLength
			case padded && kv > pad:
				wantErr = ErrOutOfRange
			case (kind == KindBlockDiagonalCausalFromBottomRight || kind == KindBlockDiagonalCausalLocalFromBottomRight) && kv < q:
				wantErr = ErrNoVisibleKey
			case kind == KindBlockDiagonalCausalLocal && q-window >= kv:
				wantErr = ErrNoVisibleKey
			}
		}
		_, err := NewAttentionMask(cfg)
		if wantErr != nil {
			if !errors.Is(err, wantErr) {
				t.Fatalf("NewAttentionMask(%+v) = %v, want %v", cfg, err, wantErr)
			}
			return
		}
		if err != nil {
			t.Fatalf("NewAttentionMask(%+v): %v", cfg, err)
		}
		checkMaskAgainstModels(t, cfg)
	})
}

// FuzzSWAMask: the plain and compressed Ascend masks against the seed's
// Python formulation.
func FuzzSWAMask(f *testing.F) {
	f.Add(uint16(5), uint16(3), uint16(128))
	f.Add(uint16(18), uint16(11), uint16(64))
	f.Add(uint16(30), uint16(4100), uint16(64))
	f.Add(uint16(1), uint16(512), uint16(192))
	f.Fuzz(func(t *testing.T, size, window, headDim uint16) {
		s, w, hd := int(size%40)+1, int(window)+1, int(headDim%600)+1
		m, err := SWAMask(s, w)
		if err != nil {
			t.Fatal(err)
		}
		if diff := Diff(denseFromRows(modelSWAPython(s, w)), m.AsBool()); diff != "" {
			t.Fatalf("SWAMask(%d, %d):\n%s", s, w, diff)
		}
		cw, err := CompressedSWAWindow(w, hd)
		if err != nil || cw != pythonCompressedWindow(w, hd) {
			t.Fatalf("CompressedSWAWindow(%d, %d) = %d, %v; Python gives %d", w, hd, cw, err, pythonCompressedWindow(w, hd))
		}
		if cw < 1 || cw > 3*SWABlockSize(hd) {
			t.Fatalf("CompressedSWAWindow(%d, %d) = %d outside 1..3*block", w, hd, cw)
		}
	})
}
