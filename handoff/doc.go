// Package handoff moves one request's KV cache from one Manager to another
// (a prefill process to a decode process, each with its own page pool):
// the transfer plan, the byte stream, the receiving side's verification
// and the store the decode Manager is served from.
//
// # The plan
//
// [Plan] coalesces a request's device pages (in token order) into runs of
// consecutive page IDs. A run is one contiguous region per layer plane of
// a paged cache, so an engine moves it with one copy (one DMA descriptor)
// per plane instead of one per page.
//
// # The stream
//
//	"PKVH", version 1, 3 zero bytes
//	tenant, LoRA, salt: u16 length + bytes each (the request's namespace)
//	u32 token count, tokens (little-endian int32): the full pages' tokens
//	u32 run count, runs (i32 first page, u32 pages): the sender's plan
//	u32 page count (token count / page size)
//	u32 CRC-32C of the header above
//	page count page values, each exactly tier.EncodedValueLen bytes
//	  (tier.EncodeValue: the Redis and disk tiers' format)
//
// [ReadRequest] refuses, by name, anything that is not exactly this: a bad
// magic or version, a count past [Limits], a header checksum that does not
// match, a run list that does not cover the pages, a value that does not
// decode, belongs to another deployment, layer group or format, or is not
// the page the token chain names (digest, parent and tokens, computed by
// the receiver from the namespace and tokens). It allocates only after the
// header verified, and never more than Limits allow.
//
// # Admission
//
// A [Store] is the receiving side's [tier.RemoteStore]: [Store.Admit] adds
// a verified request's pages all at once (or nothing, when they do not
// fit), and the decode Manager, with the store as its remote tier (alone
// or in a tier.Chain), is served them by its ordinary prefix lookup in Add:
// they land in host pages and are onloaded into its own device pages. A
// transfer that fails anywhere (a cut connection, a bad byte, a full store)
// admits nothing, and the sender keeps the request until it hears the
// receiver's acknowledgement ([Send], [Serve]).
//
// # Concurrency
//
// A Store is safe for concurrent use (Serve admits from its connection
// goroutines while the decode Manager fetches). Plan, WriteRequest and
// ReadRequest are functions of their arguments.
package handoff
