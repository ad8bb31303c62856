// Command asmgen generates kernels/cpu's amd64 assembly (AVX2 + FMA + F16C)
// with avo: the decode inner loops that Go's compiler cannot vectorise
// (f16/bf16 -> f32 widening, four q.k dot products against one key, and
// four keys' weighted V rows accumulated into one row). It lives in its own
// module so that pagedkv does not depend on avo to build; run it through
// `go generate ./kernels/cpu` (see gen.go there).
//
// Every function handles a multiple of 8 elements; the Go callers do the
// tails with the pure-Go loops, which are also the model the assembly is
// tested against.
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
		genDot4Narrow(dt)
		genAxpy4Narrow(dt)
		genAxpy1Narrow(dt)
	}

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
	TEXT("widenF16AVX", NOSPLIT, "func(dst *float32, src *byte, n int)")
	Doc("widenF16AVX converts n f16 values (n a multiple of 8) at src to float32 at dst.")
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
	TEXT("widenBF16AVX", NOSPLIT, "func(dst *float32, src *byte, n int)")
	Doc("widenBF16AVX converts n bf16 values (n a multiple of 8) at src to float32 at dst.")
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
	TEXT("dot4AVX", NOSPLIT, "func(q *float32, d int, k *float32, n int) (s0, s1, s2, s3 float32)")
	Doc("dot4AVX returns q[j*d:j*d+n] . k[:n] for j < 4 (n a multiple of 8).")
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
	TEXT("axpy4AVX", NOSPLIT, "func(acc *float32, v *float32, ts int, p *[4]float32, n int)")
	Doc("axpy4AVX does acc[i] += p[0]*v[i] + p[1]*v[ts+i] + p[2]*v[2*ts+i] + p[3]*v[3*ts+i] for i < n (n a multiple of 8).")
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

// genDot4Narrow is dot4 reading the key row straight from the cache in its
// 16-bit dtype, widened in registers: no float32 copy of K is written.
func genDot4Narrow(dt string) {
	name := "dot4" + dt + "AVX"
	TEXT(name, NOSPLIT, "func(q *float32, d int, k *byte, n int) (s0, s1, s2, s3 float32)")
	Doc(name + " returns q[j*d:j*d+n] . k[:n] for j < 4, k holding n " + strings.ToLower(dt) + " values (n a multiple of 8).")
	q0 := Load(Param("q"), GP64())
	d := Load(Param("d"), GP64())
	k := Load(Param("k"), GP64())
	n := Load(Param("n"), GP64())
	SHLQ(U8(2), d)
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
	l := strings.ToLower(name)

	Label(l + "_by16")
	CMPQ(n, U8(16))
	JL(LabelRef(l + "_by8"))
	load8(dt, Mem{Base: k}, k0)
	load8(dt, Mem{Base: k, Disp: 16}, k1)
	for j, q := range qs {
		VFMADD231PS(Mem{Base: q}, k0, acc[j][0])
		VFMADD231PS(Mem{Base: q, Disp: 32}, k1, acc[j][1])
	}
	ADDQ(U8(32), k)
	for _, q := range qs {
		ADDQ(U8(64), q)
	}
	SUBQ(U8(16), n)
	JMP(LabelRef(l + "_by16"))

	Label(l + "_by8")
	CMPQ(n, U8(8))
	JL(LabelRef(l + "_sum"))
	load8(dt, Mem{Base: k}, k0)
	for j, q := range qs {
		VFMADD231PS(Mem{Base: q}, k0, acc[j][0])
	}

	Label(l + "_sum")
	for j := range acc {
		VADDPS(acc[j][1], acc[j][0], acc[j][0])
		hsum(acc[j][0], k0)
		Store(acc[j][0].AsX(), ReturnIndex(j))
	}
	VZEROUPPER()
	RET()
}

// genAxpy4Narrow is axpy4 reading four V rows (ts elements apart) straight
// from the cache in its 16-bit dtype.
func genAxpy4Narrow(dt string) {
	name := "axpy4" + dt + "AVX"
	TEXT(name, NOSPLIT, "func(acc *float32, v *byte, ts int, p *[4]float32, n int)")
	Doc(name + " does acc[i] += sum_j p[j]*v[j*ts+i] over j < 4 for i < n, v holding " + strings.ToLower(dt) + " values (n a multiple of 8).")
	a := Load(Param("acc"), GP64())
	v0 := Load(Param("v"), GP64())
	ts := Load(Param("ts"), GP64())
	p := Load(Param("p"), GP64())
	n := Load(Param("n"), GP64())
	SHLQ(U8(1), ts)
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
	t0, t1 := YMM(), YMM()
	l := strings.ToLower(name)

	Label(l + "_by16")
	CMPQ(n, U8(16))
	JL(LabelRef(l + "_by8"))
	VMOVUPS(Mem{Base: a}, x0)
	VMOVUPS(Mem{Base: a, Disp: 32}, x1)
	for j, v := range vs {
		load8(dt, Mem{Base: v}, t0)
		load8(dt, Mem{Base: v, Disp: 16}, t1)
		VFMADD231PS(t0, w[j], x0)
		VFMADD231PS(t1, w[j], x1)
	}
	VMOVUPS(x0, Mem{Base: a})
	VMOVUPS(x1, Mem{Base: a, Disp: 32})
	ADDQ(U8(64), a)
	for _, v := range vs {
		ADDQ(U8(32), v)
	}
	SUBQ(U8(16), n)
	JMP(LabelRef(l + "_by16"))

	Label(l + "_by8")
	CMPQ(n, U8(8))
	JL(LabelRef(l + "_done"))
	VMOVUPS(Mem{Base: a}, x0)
	for j, v := range vs {
		load8(dt, Mem{Base: v}, t0)
		VFMADD231PS(t0, w[j], x0)
	}
	VMOVUPS(x0, Mem{Base: a})

	Label(l + "_done")
	VZEROUPPER()
	RET()
}

// genAxpy1Narrow is one V row's update, for the keys of a page past the
// last multiple of four.
func genAxpy1Narrow(dt string) {
	name := "axpy1" + dt + "AVX"
	TEXT(name, NOSPLIT, "func(acc *float32, v *byte, p float32, n int)")
	Doc(name + " does acc[i] += p*v[i] for i < n, v holding " + strings.ToLower(dt) + " values (n a multiple of 8).")
	a := Load(Param("acc"), GP64())
	v := Load(Param("v"), GP64())
	n := Load(Param("n"), GP64())
	w := YMM()
	VBROADCASTSS(NewParamAddr("p", 16), w)
	x, t := YMM(), YMM()
	l := strings.ToLower(name)

	Label(l + "_by8")
	CMPQ(n, U8(8))
	JL(LabelRef(l + "_done"))
	VMOVUPS(Mem{Base: a}, x)
	load8(dt, Mem{Base: v}, t)
	VFMADD231PS(t, w, x)
	VMOVUPS(x, Mem{Base: a})
	ADDQ(U8(32), a)
	ADDQ(U8(16), v)
	SUBQ(U8(8), n)
	JMP(LabelRef(l + "_by8"))

	Label(l + "_done")
	VZEROUPPER()
	RET()
}
