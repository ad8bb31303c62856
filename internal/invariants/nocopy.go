package invariants

// NoCopy, as a blank field of a struct (_ invariants.NoCopy), makes go vet's
// copylocks check report every copy of a value of that struct: for types
// that hold state by reference and must be used through one pointer. It
// takes no space and does nothing at run time.
type NoCopy struct{}

// Lock is a no-op: it is what copylocks looks for.
func (*NoCopy) Lock() {}

// Unlock is a no-op.
func (*NoCopy) Unlock() {}
