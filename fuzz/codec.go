package fuzz

import (
	"fmt"
	"strings"
)

// CmdSize is the encoded size of a [Cmd] in bytes: the op code byte, then
// A, B and C.
const CmdSize = 4

// OpSpace is the number of distinct op codes: the op byte of an encoded
// command is read modulo OpSpace. Each target knows the first n codes
// (n <= OpSpace) and skips the rest, which leaves room to add ops later
// without changing what committed corpora mean.
const OpSpace = 16

// Cmd is one command of a fuzz program: an op code in [0, OpSpace) and three
// argument bytes whose meaning depends on the op (each target documents its
// own).
type Cmd struct {
	Op      uint8
	A, B, C uint8
}

// Decode appends to dst the known commands of data and returns the extended
// slice. data is read as consecutive [CmdSize]-byte commands; the op code is
// data[i] % OpSpace, and commands whose op code is >= known are skipped. A
// trailing partial command (len(data) % CmdSize bytes) is ignored.
func Decode(dst []Cmd, data []byte, known int) []Cmd {
	for ; len(data) >= CmdSize; data = data[CmdSize:] {
		op := data[0] % OpSpace
		if int(op) >= known {
			continue
		}
		dst = append(dst, Cmd{Op: op, A: data[1], B: data[2], C: data[3]})
	}
	return dst
}

// Encode appends the encoding of cmds to dst and returns the extended
// slice: CmdSize bytes per command, op code first. It panics on an op code
// >= OpSpace, which no decoded command has (a programming error in a seed).
func Encode(dst []byte, cmds []Cmd) []byte {
	for i, c := range cmds {
		if c.Op >= OpSpace {
			panic(fmt.Sprintf("fuzz: Encode: cmds[%d] has op code %d, want < %d", i, c.Op, OpSpace))
		}
		dst = append(dst, c.Op, c.A, c.B, c.C)
	}
	return dst
}

// OpSet names the op codes a target knows: op code i is OpSet[i], and
// len(OpSet) is the known argument of [Decode].
type OpSet []string

// Format renders a program one command per line ("3: append a=1 b=7 c=0"),
// for the log of a failing run.
func (s OpSet) Format(cmds []Cmd) string {
	var b strings.Builder
	for i, c := range cmds {
		name := fmt.Sprintf("op%d", c.Op)
		if int(c.Op) < len(s) {
			name = s[c.Op]
		}
		fmt.Fprintf(&b, "%d: %s a=%d b=%d c=%d\n", i, name, c.A, c.B, c.C)
	}
	return b.String()
}

// Op returns the code of the op named name; it panics if s has no such op
// (a programming error in a seed).
func (s OpSet) Op(name string) uint8 {
	for i, n := range s {
		if n == name {
			return uint8(i)
		}
	}
	panic(fmt.Sprintf("fuzz: no op %q in %v", name, []string(s)))
}

// Prog builds an encoded program from commands written as
// (op name, a, b, c) quadruples, for readable seeds:
//
//	ops.Prog("add", 0, 0, 0, "append", 0, 4, 0)
func (s OpSet) Prog(args ...any) []byte {
	if len(args)%4 != 0 {
		panic(fmt.Sprintf("fuzz: Prog: %d arguments, want quadruples (op, a, b, c)", len(args)))
	}
	cmds := make([]Cmd, 0, len(args)/4)
	for i := 0; i < len(args); i += 4 {
		name, ok := args[i].(string)
		if !ok {
			panic(fmt.Sprintf("fuzz: Prog: argument %d is %T, want an op name", i, args[i]))
		}
		var abc [3]uint8
		for k := range abc {
			v, ok := args[i+1+k].(int)
			if !ok || v < 0 || v > 255 {
				panic(fmt.Sprintf("fuzz: Prog: argument %d of %s is %v, want an int in 0..255", k+1, name, args[i+1+k]))
			}
			abc[k] = uint8(v)
		}
		cmds = append(cmds, Cmd{Op: s.Op(name), A: abc[0], B: abc[1], C: abc[2]})
	}
	return Encode(nil, cmds)
}
