package cpu

// The amd64 assembly (simd_amd64.s and its stubs simd_amd64.go) is
// generated with avo by the generator module in internal/asmgen, which
// this module does not depend on; regenerating fetches avo.
//go:generate sh -c "cd internal/asmgen && go run . -pkg cpu -out ../../simd_amd64.s -stubs ../../simd_amd64.go"
