package fuzz

// chooser is a small deterministic generator (splitmix64) for the choices a
// command's three argument bytes do not spell out, seeded from the command
// and its index so a program replays exactly.
type chooser struct{ x uint64 }

func newChooser(c Cmd, index int) chooser {
	return chooser{x: uint64(c.Op)<<56 ^ uint64(c.A)<<48 ^ uint64(c.B)<<40 ^ uint64(c.C)<<32 ^ uint64(index)}
}

func (r *chooser) next() uint64 {
	r.x += 0x9e3779b97f4a7c15
	z := r.x
	z = (z ^ z>>30) * 0xbf58476d1ce4e5b9
	z = (z ^ z>>27) * 0x94d049bb133111eb
	return z ^ z>>31
}

// intn returns a value in [0, n), or 0 when n <= 0.
func (r *chooser) intn(n int) int {
	if n <= 0 {
		return 0
	}
	return int(r.next() % uint64(n))
}
