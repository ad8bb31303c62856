package redis

import (
	"github.com/pagedkv/pagedkv/tier"
)

// The value format is the tier's page value (package tier, value.go): the
// disk tier and handoff streams use the same bytes and the same verifier.
// These names keep this package's API.

// Value errors: a fetched value that wraps one of them is rejected.
var (
	// ErrCorrupt: truncated or damaged ([tier.ErrCorruptValue]).
	ErrCorrupt = tier.ErrCorruptValue
	// ErrForeign: another namespace, layer group or page format
	// ([tier.ErrForeignValue]).
	ErrForeign = tier.ErrForeignValue
	// ErrStale: another page of this deployment ([tier.ErrStaleValue]).
	ErrStale = tier.ErrStaleValue
)

// crcBytes is the value's trailing checksum.
const crcBytes = tier.ValueCRCBytes

// Value is a decoded value ([tier.Value]).
type Value = tier.Value

// EncodedLen is [tier.EncodedValueLen].
func EncodedLen(f tier.PageFormat, namespace, group string) int {
	return tier.EncodedValueLen(f, namespace, group)
}

// Encode is [tier.EncodeValue].
func Encode(dst []byte, f tier.PageFormat, namespace, group string, p *tier.RemotePage) ([]byte, error) {
	return tier.EncodeValue(dst, f, namespace, group, p)
}

// Decode is [tier.DecodeValue].
func Decode(b []byte, tokens []int32) (Value, error) { return tier.DecodeValue(b, tokens) }
