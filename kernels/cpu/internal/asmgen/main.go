// Command asmgen generates kernels/cpu's amd64 assembly (AVX2 + FMA + F16C)
// with avo: the decode inner loops that Go's compiler cannot vectorise
// (f16/bf16 -> f32 widening, four q.k dot products against one key, and
// four keys' weighted V rows accumulated into one row). It lives in its own
// module so that pagedkv does not depend on avo to build; run it through
// `go generate ./kernels/cpu` (see gen.go there).
//
// # Invariants
//
//   - Every function handles a multiple of 8 elements; the Go callers do
//     the tails with the pure-Go loops, which are also the model the
//     assembly is tested against (kernels/cpu's *AsmMatchesGo tests).
//   - The output is a function of this file alone: `go generate
//     ./kernels/cpu` rewrites simd_amd64.s and its stubs, and the committed
//     files are what it writes (scripts/asm-fresh.sh checks it).
package main

import (
	"strings"

	. "github.com/mmcloughlin/avo/build"
	. "github.com/mmcloughlin/avo/operand"
	"github.com/mmcloughlin/avo/reg"
)

func main() {
	ConstraintExpr("!purego")

	genHasF16C()
	genWidenF16()
	genWidenBF16()
	genDot4()
	genAxpy4()
	for _, dt := range []string{"F16", "BF16"} {
		genLogits4(dt)
		genAttnV4(dt)
	}
	genExpBlock4()
	genPrefetchSpan()

	Generate()
}

// genHasF16C: CPUID leaf 1, ECX bit 29 (golang.org/x/sys/cpu has no F16C
// flag; every AVX2 CPU so far has it, but we check rather than assume).
func genHasF16C() {
	TEXT("hasF16C", NOSPLIT, "func() bool")
	Doc("hasF16C reports whether the CPU has the F16C (VCVTPH2PS) instructions.")
	MOVL(U32(1), reg.EAX)
	XORL(reg.ECX, reg.ECX)
	CPUID()
	SHRL(U8(29), reg.ECX)
	ANDL(U32(1), reg.ECX)
	Store(reg.CL, ReturnIndex(0))
	RET()
}

// genWidenF16: dst[i] = float32(src[i]) for n f16 values, 32 per pass.
func genWidenF16() {
	TEXT("widenF16Vec", NOSPLIT, "func(dst *float32, src *byte, n int)")
	Pragma("noescape")
	Doc("widenF16Vec converts n f16 values (n a multiple of 8) at src to float32 at dst.")
	dst := Load(Param("dst"), GP64())
	src := Load(Param("src"), GP64())
	n := Load(Param("n"), GP64())
	y := []reg.VecVirtual{YMM(), YMM(), YMM(), YMM()}

	Label("f16_by32")
	CMPQ(n, U8(32))
	JL(LabelRef("f16_by8"))
	for i, r := range y {
		VCVTPH2PS(Mem{Base: src, Disp: 16 * i}, r)
	}
	for i, r := range y {
		VMOVUPS(r, Mem{Base: dst, Disp: 32 * i})
	}
	ADDQ(U8(64), src)
	ADDQ(U32(128), dst)
	SUBQ(U8(32), n)
	JMP(LabelRef("f16_by32"))

	Label("f16_by8")
	CMPQ(n, U8(8))
	JL(LabelRef("f16_done"))
	VCVTPH2PS(Mem{Base: src}, y[0])
	VMOVUPS(y[0], Mem{Base: dst})
	ADDQ(U8(16), src)
	ADDQ(U8(32), dst)
	SUBQ(U8(8), n)
	JMP(LabelRef("f16_by8"))

	Label("f16_done")
	VZEROUPPER()
	RET()
}

// genWidenBF16: a bf16 is the high half of a float32, so widening is a
// zero-extension and a 16-bit shift.
func genWidenBF16() {
	TEXT("widenBF16Vec", NOSPLIT, "func(dst *float32, src *byte, n int)")
	Pragma("noescape")
	Doc("widenBF16Vec converts n bf16 values (n a multiple of 8) at src to float32 at dst.")
	dst := Load(Param("dst"), GP64())
	src := Load(Param("src"), GP64())
	n := Load(Param("n"), GP64())
	y := []reg.VecVirtual{YMM(), YMM(), YMM(), YMM()}

	Label("bf16_by32")
	CMPQ(n, U8(32))
	JL(LabelRef("bf16_by8"))
	for i, r := range y {
		VPMOVZXWD(Mem{Base: src, Disp: 16 * i}, r)
	}
	for _, r := range y {
		VPSLLD(U8(16), r, r)
	}
	for i, r := range y {
		VMOVUPS(r, Mem{Base: dst, Disp: 32 * i})
	}
	ADDQ(U8(64), src)
	ADDQ(U32(128), dst)
	SUBQ(U8(32), n)
	JMP(LabelRef("bf16_by32"))

	Label("bf16_by8")
	CMPQ(n, U8(8))
	JL(LabelRef("bf16_done"))
	VPMOVZXWD(Mem{Base: src}, y[0])
	VPSLLD(U8(16), y[0], y[0])
	VMOVUPS(y[0], Mem{Base: dst})
	ADDQ(U8(16), src)
	ADDQ(U8(32), dst)
	SUBQ(U8(8), n)
	JMP(LabelRef("bf16_by8"))

	Label("bf16_done")
	VZEROUPPER()
	RET()
}

// hsum reduces the eight lanes of y to its low lane (in the XMM half of y),
// using tmp.
func hsum(y, tmp reg.VecVirtual) {
	x, t := y.AsX(), tmp.AsX()
	VEXTRACTF128(U8(1), y, t)
	VADDPS(t, x, x)
	VMOVHLPS(x, x, t)
	VADDPS(t, x, x)
	VMOVSHDUP(x, t)
	VADDSS(t, x, x)
}

// genDot4: the logits of four query rows (d elements apart) against one key
// row. Two accumulators per row keep eight FMA chains in flight.
func genDot4() {
	TEXT("dot4Vec", NOSPLIT, "func(q *float32, d int, k *float32, n int) (s0, s1, s2, s3 float32)")
	Pragma("noescape")
	Doc("dot4Vec returns q[j*d:j*d+n] . k[:n] for j < 4 (n a multiple of 8).")
	q0 := Load(Param("q"), GP64())
	d := Load(Param("d"), GP64())
	k := Load(Param("k"), GP64())
	n := Load(Param("n"), GP64())
	SHLQ(U8(2), d) // bytes
	q1, q2, q3 := GP64(), GP64(), GP64()
	LEAQ(Mem{Base: q0, Index: d, Scale: 1}, q1)
	LEAQ(Mem{Base: q1, Index: d, Scale: 1}, q2)
	LEAQ(Mem{Base: q2, Index: d, Scale: 1}, q3)
	qs := []reg.Register{q0, q1, q2, q3}
	var acc [4][2]reg.VecVirtual
	for j := range acc {
		for h := range acc[j] {
			acc[j][h] = YMM()
			VXORPS(acc[j][h], acc[j][h], acc[j][h])
		}
	}
	k0, k1 := YMM(), YMM()

	Label("dot4_by16")
	CMPQ(n, U8(16))
	JL(LabelRef("dot4_by8"))
	VMOVUPS(Mem{Base: k}, k0)
	VMOVUPS(Mem{Base: k, Disp: 32}, k1)
	for j, q := range qs {
		VFMADD231PS(Mem{Base: q}, k0, acc[j][0])
		VFMADD231PS(Mem{Base: q, Disp: 32}, k1, acc[j][1])
	}
	ADDQ(U8(64), k)
	for _, q := range qs {
		ADDQ(U8(64), q)
	}
	SUBQ(U8(16), n)
	JMP(LabelRef("dot4_by16"))

	Label("dot4_by8")
	CMPQ(n, U8(8))
	JL(LabelRef("dot4_sum"))
	VMOVUPS(Mem{Base: k}, k0)
	for j, q := range qs {
		VFMADD231PS(Mem{Base: q}, k0, acc[j][0])
	}

	Label("dot4_sum")
	for j := range acc {
		VADDPS(acc[j][1], acc[j][0], acc[j][0])
		hsum(acc[j][0], k0)
		Store(acc[j][0].AsX(), ReturnIndex(j))
	}
	VZEROUPPER()
	RET()
}

// genAxpy4: one accumulator row gains four keys' weighted V rows (ts
// elements apart); acc is loaded and stored once per four keys.
func genAxpy4() {
	TEXT("axpy4Vec", NOSPLIT, "func(acc *float32, v *float32, ts int, p *[4]float32, n int)")
	Pragma("noescape")
	Doc("axpy4Vec does acc[i] += p[0]*v[i] + p[1]*v[ts+i] + p[2]*v[2*ts+i] + p[3]*v[3*ts+i] for i < n (n a multiple of 8).")
	a := Load(Param("acc"), GP64())
	v0 := Load(Param("v"), GP64())
	ts := Load(Param("ts"), GP64())
	p := Load(Param("p"), GP64())
	n := Load(Param("n"), GP64())
	SHLQ(U8(2), ts)
	v1, v2, v3 := GP64(), GP64(), GP64()
	LEAQ(Mem{Base: v0, Index: ts, Scale: 1}, v1)
	LEAQ(Mem{Base: v1, Index: ts, Scale: 1}, v2)
	LEAQ(Mem{Base: v2, Index: ts, Scale: 1}, v3)
	vs := []reg.Register{v0, v1, v2, v3}
	var w [4]reg.VecVirtual
	for j := range w {
		w[j] = YMM()
		VBROADCASTSS(Mem{Base: p, Disp: 4 * j}, w[j])
	}
	x0, x1 := YMM(), YMM()

	Label("axpy4_by16")
	CMPQ(n, U8(16))
	JL(LabelRef("axpy4_by8"))
	VMOVUPS(Mem{Base: a}, x0)
	VMOVUPS(Mem{Base: a, Disp: 32}, x1)
	for j, v := range vs {
		VFMADD231PS(Mem{Base: v}, w[j], x0)
		VFMADD231PS(Mem{Base: v, Disp: 32}, w[j], x1)
	}
	VMOVUPS(x0, Mem{Base: a})
	VMOVUPS(x1, Mem{Base: a, Disp: 32})
	ADDQ(U8(64), a)
	for _, v := range vs {
		ADDQ(U8(64), v)
	}
	SUBQ(U8(16), n)
	JMP(LabelRef("axpy4_by16"))

	Label("axpy4_by8")
	CMPQ(n, U8(8))
	JL(LabelRef("axpy4_done"))
	VMOVUPS(Mem{Base: a}, x0)
	for j, v := range vs {
		VFMADD231PS(Mem{Base: v}, w[j], x0)
	}
	VMOVUPS(x0, Mem{Base: a})

	Label("axpy4_done")
	VZEROUPPER()
	RET()
}

// load8 widens eight f16 or bf16 values at m into the float32 lanes of y.
func load8(dt string, m Mem, y reg.VecVirtual) {
	if dt == "F16" {
		VCVTPH2PS(m, y)
		return
	}
	VPMOVZXWD(m, y)
	VPSLLD(U8(16), y, y)
}

// reduce4 sums the eight lanes of each of a[0..3] and returns an XMM
// register holding the four sums in order: two rounds of horizontal adds
// leave, in each 128-bit half, one partial sum per row, and the halves are
// added.
func reduce4(a [4]reg.VecVirtual) reg.VecVirtual {
	VHADDPS(a[1], a[0], a[0])
	VHADDPS(a[3], a[2], a[2])
	VHADDPS(a[2], a[0], a[0])
	return a[0]
}

// paramAddr is the frame address of argument name, for arguments read
// from memory where they are used rather than held in a register.
func paramAddr(name string) Mem {
	b, err := Param(name).Resolve()
	if err != nil {
		panic(err)
	}
	return b.Addr
}

// genLogits4 computes the logits of four query rows per head against T
// key rows read straight from the cache in a 16-bit dtype (widened in
// registers: no float32 copy of K is written). Keys go two at a time, so
// each query vector loaded serves two keys, and for each pair every head
// in turn: with NHD pages (a token's heads contiguous) that reads the page
// in address order, which the hardware prefetcher follows. Logits are
// stored key-major per head, s[t*4+j] for query j of key t, so a pair's
// eight logits leave in one store.
func genLogits4(dt string) {
	name := "logits4" + dt + "Vec"
	TEXT(name, NOSPLIT, "func(s *float32, ss int, q *float32, qs int, d int, k *byte, ks int, hs int, T int, heads int)")
	Pragma("noescape")
	Doc(name+" writes, for h < heads, t < T and j < 4, s[h*ss+t*4+j] = q[h*qs+j*d:][:d] . k[h*hs+t*ks:],",
		"the key rows holding d "+strings.ToLower(dt)+" values (d a multiple of 8; ss, qs in elements, hs, ks in bytes).")
	st := Load(Param("s"), GP64())
	d4 := Load(Param("d"), GP64())
	SHLQ(U8(2), d4) // bytes between query rows
	d12 := GP64()
	LEAQ(Mem{Base: d4, Index: d4, Scale: 2}, d12)
	kt := Load(Param("k"), GP64())
	ks := Load(Param("ks"), GP64())
	tn := Load(Param("T"), GP64())
	var a, b [4]reg.VecVirtual
	for j := range a {
		a[j], b[j] = YMM(), YMM()
	}
	x0, x1, y := YMM(), YMM(), YMM()
	l := strings.ToLower(name)

	// qrow is query row j's vector at the current position qp.
	qrow := func(qp reg.Register, j int) Mem {
		switch j {
		case 0:
			return Mem{Base: qp}
		case 1:
			return Mem{Base: qp, Index: d4, Scale: 1}
		case 2:
			return Mem{Base: qp, Index: d4, Scale: 2}
		}
		return Mem{Base: qp, Index: d12, Scale: 1}
	}
	// keys is the pair loop (two == true) or the last odd key: for each
	// head, a dot-product loop over d, then the sums stored at sp.
	keys := func(two bool, lk string) {
		qp := Load(Param("q"), GP64())
		kh := GP64()
		MOVQ(kt, kh)
		sp := GP64()
		MOVQ(st, sp)
		hc := Load(Param("heads"), GP64())
		n := GP64()
		Label(lk + "_head")
		for j := range a {
			VXORPS(a[j], a[j], a[j])
			if two {
				VXORPS(b[j], b[j], b[j])
			}
		}
		MOVQ(d4, n)
		Label(lk + "_dot")
		load8(dt, Mem{Base: kh}, x0)
		if two {
			load8(dt, Mem{Base: kh, Index: ks, Scale: 1}, x1)
		}
		for j := range a {
			if two {
				VMOVUPS(qrow(qp, j), y)
				VFMADD231PS(y, x0, a[j])
				VFMADD231PS(y, x1, b[j])
			} else {
				VFMADD231PS(qrow(qp, j), x0, a[j])
			}
		}
		ADDQ(U8(32), qp)
		ADDQ(U8(16), kh)
		SUBQ(U8(32), n)
		JNZ(LabelRef(lk + "_dot"))
		ra := reduce4(a)
		if two {
			// ra = [key t, low half | key t, high half], rb likewise.
			rb := reduce4(b)
			VPERM2F128(U8(0x20), rb, ra, x0) // [ra.lo, rb.lo]
			VPERM2F128(U8(0x31), rb, ra, x1) // [ra.hi, rb.hi]
			VADDPS(x1, x0, x0)
			VMOVUPS(x0, Mem{Base: sp})
		} else {
			VEXTRACTF128(U8(1), ra, x1.AsX())
			VADDPS(x1.AsX(), ra.AsX(), ra.AsX())
			VMOVUPS(ra.AsX(), Mem{Base: sp})
		}
		nextHead(qp, "qs", kh, sp, d4)
		DECQ(hc)
		JNZ(LabelRef(lk + "_head"))
	}

	keysTwoThenOne(l, tn, keys, func() {
		ADDQ(U8(32), st)
		LEAQ(Mem{Base: kt, Index: ks, Scale: 2}, kt)
	})
}

// nextHead moves the pointers of a per-head loop from one head to the
// next, after a loop over d that advanced rowPtr one float32 row (d4
// bytes) and cachePtr half as far (d 16-bit values): rowPtr to the next
// row of rowParam elements, cachePtr to the next head hs bytes on, and
// sPtr ss float32s on.
func nextHead(rowPtr reg.Register, rowParam string, cachePtr, sPtr, d4 reg.Register) {
	t := GP64()
	MOVQ(paramAddr(rowParam), t)
	SHLQ(U8(2), t)
	SUBQ(d4, t)
	ADDQ(t, rowPtr)
	MOVQ(d4, t)
	SHRQ(U8(1), t)
	SUBQ(t, cachePtr)
	ADDQ(paramAddr("hs"), cachePtr)
	MOVQ(paramAddr("ss"), t)
	SHLQ(U8(2), t)
	ADDQ(t, sPtr)
}

// keysTwoThenOne ends genLogits4: keys(true, ...) on pairs of
// keys while tn >= 2 (advance moves the pointers past a pair), then
// keys(false, ...) on a last odd key, then return.
func keysTwoThenOne(l string, tn reg.Register, keys func(two bool, lk string), advance func()) {
	Label(l + "_pair")
	CMPQ(tn, U8(2))
	JL(LabelRef(l + "_one"))
	keys(true, l+"_two")
	advance()
	SUBQ(U8(2), tn)
	JMP(LabelRef(l + "_pair"))

	Label(l + "_one")
	CMPQ(tn, U8(1))
	JL(LabelRef(l + "_done"))
	keys(false, l+"_last")

	Label(l + "_done")
	VZEROUPPER()
	RET()
}

// attnVChunkVectors are the widths, in 8-float vectors, of the column
// chunks genAttnV4 works in, widest first: a chunk's accumulators for the
// four query rows (4*width registers) stay in registers while every key of
// the call is added to them. The last width must be 1 (d is a multiple of
// 8).
var attnVChunkVectors = []int{2, 1}

// genAttnV4 adds T keys' weighted V rows (read straight from the cache in
// a 16-bit dtype) into four accumulator rows per head. It works in column
// chunks: it loads a chunk of the four accumulator rows into registers,
// adds every key's V chunk into them (each V vector widened once for the
// four queries, each weight broadcast once per chunk), and stores the
// chunk once. So the accumulators cost one load and one store per chunk
// and call, instead of one per pair of keys; the V rows of the call (a
// page) stay in L1 between chunks. Keys are added in order with fused
// multiply-adds, as the pure-Go model adds them (but unfused).
func genAttnV4(dt string) {
	name := "attnV4" + dt + "Vec"
	TEXT(name, NOSPLIT, "func(acc *float32, as int, d int, v *byte, vs int, hs int, p *float32, ss int, T int, heads int)")
	Pragma("noescape")
	Doc(name+" does, for h < heads, j < 4 and i < d, acc[h*as+j*d+i] += sum_t p[h*ss+t*4+j]*v[h*hs+t*vs:][i] over t < T,",
		"the V rows holding d "+strings.ToLower(dt)+" values (d a multiple of 8; as, ss in elements, hs, vs in bytes).")
	l := strings.ToLower(name)
	d4 := Load(Param("d"), GP64())
	SHLQ(U8(2), d4) // bytes of an accumulator row
	d12 := GP64()
	LEAQ(Mem{Base: d4, Index: d4, Scale: 2}, d12)
	vs := Load(Param("vs"), GP64())
	ap := Load(Param("acc"), GP64())
	vh := Load(Param("v"), GP64())
	pp := Load(Param("p"), GP64())
	hc := Load(Param("heads"), GP64())
	n := GP64()
	MOVQ(paramAddr("T"), n)
	TESTQ(n, n)
	JZ(LabelRef(l + "_done"))
	TESTQ(hc, hc)
	JZ(LabelRef(l + "_done"))

	arow := func(j, vec int) Mem {
		m := Mem{Base: ap, Disp: 32 * vec}
		switch j {
		case 1:
			m.Index, m.Scale = d4, 1
		case 2:
			m.Index, m.Scale = d4, 2
		case 3:
			m.Index, m.Scale = d12, 1
		}
		return m
	}
	maxW := attnVChunkVectors[0]
	a := make([][]reg.VecVirtual, 4)
	for j := range a {
		a[j] = make([]reg.VecVirtual, maxW)
		for w := range a[j] {
			a[j][w] = YMM()
		}
	}
	x := make([]reg.VecVirtual, maxW)
	for w := range x {
		x[w] = YMM()
	}
	bw := YMM()

	// chunk adds every key into the next width vectors of the four rows.
	chunk := func(width int, lk string) {
		for j := range 4 {
			for w := range width {
				VMOVUPS(arow(j, w), a[j][w])
			}
		}
		vk, wp, tc := GP64(), GP64(), GP64()
		MOVQ(vh, vk)
		MOVQ(pp, wp)
		MOVQ(paramAddr("T"), tc)
		Label(lk + "_key")
		for w := range width {
			load8(dt, Mem{Base: vk, Disp: 16 * w}, x[w])
		}
		for j := range 4 {
			VBROADCASTSS(Mem{Base: wp, Disp: 4 * j}, bw)
			for w := range width {
				VFMADD231PS(x[w], bw, a[j][w])
			}
		}
		ADDQ(vs, vk)
		ADDQ(U8(16), wp)
		DECQ(tc)
		JNZ(LabelRef(lk + "_key"))
		for j := range 4 {
			for w := range width {
				VMOVUPS(a[j][w], arow(j, w))
			}
		}
		ADDQ(U32(32*width), ap)
		ADDQ(U32(16*width), vh)
		SUBQ(U32(32*width), n)
	}

	Label(l + "_head")
	MOVQ(d4, n) // bytes of the rows left
	for _, width := range attnVChunkVectors {
		lw := l + "_w" + string(rune('0'+width))
		Label(lw)
		CMPQ(n, U32(32*width))
		JL(LabelRef(lw + "_end"))
		chunk(width, lw)
		JMP(LabelRef(lw))
		Label(lw + "_end")
	}
	nextHead(ap, "as", vh, pp, d4)
	DECQ(hc)
	JNZ(LabelRef(l + "_head"))

	Label(l + "_done")
	VZEROUPPER()
	RET()
}

// genExpBlock4 turns a block of logits s (key-major, four queries per key)
// into weights 2^(s - m) with m the four queries' running maxima, and adds
// each query's weights to l. 2^y for y <= 0 is 2^n * 2^f with n = round(y)
// and |f| <= 1/2: 2^f is the degree-7 Taylor series of e^(f ln 2) (as in
// the Go model, exp2Neg), 2^n is built in the exponent bits. y is clamped
// at -127 first, where 2^n's bits are 0, so -inf gives 0; the clamp keeps
// a NaN (VMAXPS returns its second source operand on NaN).
func genExpBlock4() {
	TEXT("expBlock4Vec", NOSPLIT, "func(s *float32, n int, m *[4]float32, l *[4]float32)")
	Pragma("noescape")
	Doc("expBlock4Vec does s[i] = 2^(s[i]-m[i%4]) and l[i%4] += s[i] for i < n (n a multiple of 4, s[i] <= m[i%4] or NaN).")
	s := Load(Param("s"), GP64())
	n := Load(Param("n"), GP64())
	m := Load(Param("m"), GP64())
	lp := Load(Param("l"), GP64())
	ln2 := 0.6931471805599453
	coef := []float32{1}
	c := 1.0
	for k := 1; k <= 7; k++ {
		c *= ln2 / float64(k)
		coef = append(coef, float32(c))
	}
	cm := make([]reg.VecVirtual, len(coef))
	for k := range coef {
		cm[k] = YMM()
		VBROADCASTSS(ConstData("exp2c"+string(rune('0'+k)), F32(coef[k])), cm[k])
	}
	lo, bias := YMM(), YMM()
	VBROADCASTSS(ConstData("exp2lo", F32(-127)), lo)
	VPBROADCASTD(ConstData("exp2bias", U32(127)), bias)
	mm, sum := YMM(), YMM()
	VBROADCASTF128(Mem{Base: m}, mm)
	VXORPS(sum, sum, sum)
	y, f, pz, e := YMM(), YMM(), YMM(), YMM()

	body := func(wide bool) {
		sz := func(r reg.VecVirtual) reg.Register {
			if wide {
				return r
			}
			return r.AsX()
		}
		if wide {
			VMOVUPS(Mem{Base: s}, y)
		} else {
			VMOVUPS(Mem{Base: s}, y.AsX())
		}
		VSUBPS(sz(mm), sz(y), sz(y))
		VMAXPS(sz(y), sz(lo), sz(y))
		VROUNDPS(U8(0), sz(y), sz(e)) // n, nearest
		VSUBPS(sz(e), sz(y), sz(f))   // f in [-1/2, 1/2]
		VMOVAPS(sz(cm[7]), sz(pz))
		for k := 6; k >= 0; k-- {
			VFMADD213PS(sz(cm[k]), sz(f), sz(pz)) // pz = pz*f + c_k
		}
		VCVTPS2DQ(sz(e), sz(e))
		VPADDD(sz(bias), sz(e), sz(e))
		VPSLLD(U8(23), sz(e), sz(e))
		VMULPS(sz(e), sz(pz), sz(pz))
		VADDPS(sz(pz), sz(sum), sz(sum))
		if wide {
			VMOVUPS(pz, Mem{Base: s})
		} else {
			VMOVUPS(pz.AsX(), Mem{Base: s})
		}
	}
	Label("exp4_by8")
	CMPQ(n, U8(8))
	JL(LabelRef("exp4_by4"))
	body(true)
	ADDQ(U8(32), s)
	SUBQ(U8(8), n)
	JMP(LabelRef("exp4_by8"))
	Label("exp4_by4")
	// Fold the sums' halves before the 128-bit tail: a VEX.128 instruction
	// clears the upper half of its destination.
	VEXTRACTF128(U8(1), sum, y.AsX())
	VADDPS(y.AsX(), sum.AsX(), sum.AsX())
	CMPQ(n, U8(4))
	JL(LabelRef("exp4_done"))
	body(false)
	Label("exp4_done")
	VADDPS(Mem{Base: lp}, sum.AsX(), sum.AsX())
	VMOVUPS(sum.AsX(), Mem{Base: lp})
	VZEROUPPER()
	RET()
}

// genPrefetchSpan asks for every cache line of a span of bytes (PREFETCHT0,
// one per 64 bytes), so that the decode can have the next page of K and V
// on its way while it computes on the current one: pages are scattered, and
// the hardware prefetcher does not follow a jump from one to the next.
func genPrefetchSpan() {
	TEXT("prefetchSpan", NOSPLIT, "func(p *byte, n int)")
	Pragma("noescape")
	Doc("prefetchSpan asks for the cache lines of p[:n] (n > 0) to be brought into the caches; it reads nothing.")
	p := Load(Param("p"), GP64())
	end := Load(Param("n"), GP64())
	ADDQ(p, end)
	Label("prefetch_line")
	PREFETCHT0(Mem{Base: p})
	ADDQ(U8(64), p)
	CMPQ(p, end)
	JB(LabelRef("prefetch_line"))
	RET()
}
