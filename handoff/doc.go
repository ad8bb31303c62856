// Package handoff moves one request's KV cache from one Manager to another
// (a prefill process to a decode process, each with its own page pool):
// the transfer plan, the authenticated byte stream, the receiving side's
// verification, its server and the store the decode Manager is served
// from. docs/handoff.md has the contract and every limit, docs/tiers.md
// ("Trust") who may connect.
//
// # The plan
//
// [Plan] coalesces a request's device pages (in token order) into runs of
// consecutive page IDs. A run is one contiguous region per layer plane of
// a paged cache, so an engine moves it with one copy (one DMA descriptor)
// per plane instead of one per page.
//
// # Authentication
//
// Both sides hold the deployment's key ([Config].Key). The receiver sends
// a fresh random [Nonce] when a connection opens; the stream carries three
// HMAC-SHA256 tags under the key, each over the nonce and the stream so
// far (the fixed head, the header, the whole stream), and every reply of
// the receiver carries one too. A stream without the key, or recorded on
// another connection, does not verify; a sender does not believe a reply
// that does not. Config.Insecure, set explicitly, computes the tags under
// a public constant instead (damage is caught, forgery is not);
// Config.TLS adds TLS (mutual, with client certificates) on top.
//
// # The stream
//
//	prelude  "PKVH", version 3, 3 zero bytes
//	         (the receiver's hello: "PKVH", 2, flags, 2 zero bytes, nonce)
//	head     u16 tenant, LoRA, salt lengths, u16 group field (group tag
//	         length; bit 15: a state checkpoint), u32 token count,
//	         u32 run count, u32 page count, u16 retention range count,
//	         u16 zero; tag 1
//	header   tenant, LoRA, salt, group tag; tokens (int32); runs (int32 page,
//	         int32 pages); retention ranges (24 bytes each, retention.go);
//	         tag 2
//	         (the receiver's verdict: continue, or why not)
//	pages    page count values of tier.EncodedValueLen bytes each
//	         (tier.EncodeValue: the Redis and disk tiers' format); tag 3
//	         (the receiver's acknowledgement)
//
// [ReadRequest] refuses, by name, anything that is not exactly this: a bad
// magic or version, a tag that does not verify, a count past [Limits], a
// run list that names a page twice, passes int32 or does not cover the
// pages, a value that does not decode, belongs to another deployment,
// layer group or format, or is not the page the token chain names (digest,
// parent and tokens, computed by the receiver from the namespace and
// tokens). Nothing is sized by a count before the head's tag verified and
// the count is within the limits; the tokens, the runs and each page's
// buffer then grow as their bytes arrive.
//
// # Admission
//
// A [Store] is the receiving side's [tier.RemoteStore]: [Store.Admit] adds
// a verified request's pages all at once (or nothing, when they do not
// fit), and the decode Manager, with the store as its remote tier (alone
// or in a tier.Chain), is served them by its ordinary prefix lookup in Add:
// they land in host pages and are onloaded into its own device pages. A
// page already held keeps its first bytes: a request bringing equal bytes
// is admitted, one bringing others is answered "already held"
// ([ErrAlreadyHeld] from [Send]). A transfer that fails anywhere (a bad tag
// or byte, a cut connection, a deadline, a full store) admits nothing, and
// the sender keeps the request until it hears the receiver's
// acknowledgement.
//
// # The receiver
//
// [Listen] (or [NewServer] and [Server.Serve]) serves a Store: loopback
// unless [ServerConfig].AllowRemote, at most MaxConns connections, at most
// MaxInflightBytes reserved by requests being received, an idle and a
// request deadline; every zero field is its default, never "no limit".
//
// # Invariants
//
//   - All or nothing: a transfer either admits every page of the request
//     into the Store or none, whatever fails (a tag, a byte, a count, the
//     connection, a deadline, room in the store).
//   - Only a holder of the key gets pages admitted, a stream verifies only
//     on the connection it was made for (the nonce), and a sender hears
//     "admitted" only from a receiver with the key.
//   - Every admitted page is the page its token chain names: the receiver
//     computes the digest and parent from the namespace and tokens itself.
//   - A state checkpoint's page (Request.State) is named by the state
//     digest the receiver computes from the namespace, group tag and
//     tokens, and is served only as a state page, never as K/V.
//   - A page keeps the bytes it was first admitted with; a later request
//     with other bytes for it does not change what the Store serves.
//   - The receiver's memory is bounded before it is spent: nothing is sized
//     by a count before tag 1 verifies and the count is within [Limits],
//     and the requests being received hold at most MaxInflightBytes
//     together.
//
// # Concurrency
//
// A Store and a Server are safe for concurrent use (a Server admits from
// its connection goroutines while the decode Manager fetches). Plan,
// WriteRequest, ReadRequest and Send are functions of their arguments.
package handoff
