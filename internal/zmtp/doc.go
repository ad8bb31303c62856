// Package zmtp is the ZeroMQ transport of pagedkv's KV events: ZMTP 3.0
// (RFC 23, with RFC 29's PUB/SUB and RFC 28's ROUTER/DEALER semantics)
// over TCP and Unix sockets, NULL security mechanism only. It speaks to
// libzmq (vLLM's pyzmq publisher and subscriber, llm-d, Dynamo) and to
// itself. docs/events.md says why it exists: every byte a peer sends is
// read under limits, checked from the frame headers before anything is
// allocated, so no peer can crash or bloat the process.
//
// # Invariants (limits)
//
//   - A frame header is checked before its body is read: a data frame may
//     not take its message past Config.MaxMessageBytes (frame bodies plus
//     24 bytes per frame), nor past Config.MaxFrames frames; a command
//     frame may not exceed 4 KiB. The size is compared as the unsigned
//     64-bit value on the wire, so 2^62 or 2^64-1 is just "too large".
//   - Bodies above 64 KiB are read into a buffer that grows with the bytes
//     that actually arrive: a header declaring the limit and then silence
//     costs 64 KiB, not the limit.
//   - A peer that breaks a limit or the protocol is disconnected, counted
//     (Stats.PeerErrors) and reported to Config.OnPeerError as a
//     [PeerError] naming the endpoint and the peer's address; the socket
//     carries on with its other peers, and a connecting socket reconnects.
//   - Received messages wait for Recv in a queue bounded in count
//     (RecvQueue) and bytes (RecvQueueBytes); when it is full the readers
//     stop reading and TCP pushes back on the peers. So one socket holds at
//     most RecvQueueBytes + MaxMessageBytes per connection of received data.
//   - Sending: each peer has a queue of at most HWM messages, holding
//     memory only for what is queued. PUB drops what does not fit (counted
//     in Stats.Dropped), as ZeroMQ's PUB does; ROUTER and DEALER wait up to
//     SendTimeout for room (with DropStalled, a ROUTER then disconnects
//     the peer). A PUB peer may hold at most MaxSubscriptions
//     subscriptions of 64 KiB of topics together; a socket at most
//     MaxPeers connections, each with 64 KiB of read and write buffers,
//     and a bound socket at most MaxPeersPerAddress from one remote IP.
//   - No stranger can lock a bound socket: when it is full, a new
//     connection evicts the accepted peer idle longest (no message read
//     from it or written to it for IdleTimeout; commands and
//     subscriptions do not count), and is refused only when no peer is
//     idle. Idle peers are not closed while there is room, so a libzmq
//     subscriber in a quiet period keeps its connection; evicted, it has
//     missed nothing (nothing was sent to it for IdleTimeout) and libzmq
//     reconnects and resubscribes on its own. No PING is sent: any
//     script answers one, so it tells a dead peer from a live one, not a
//     subscriber from a squatter.
//
// # Protocol subset
//
// The greeting announces ZMTP 3.0, so libzmq (which speaks 3.1) talks 3.0
// to us: subscriptions are data messages starting with 0x01 (subscribe) or
// 0x00 (cancel); 3.1's SUBSCRIBE and CANCEL commands are accepted too.
// READY carries Socket-Type and, for ROUTER and DEALER, Identity;
// incompatible socket types are refused. A ROUTER routes by the peer's
// Identity, or by a generated one when it has none: a zero byte and a
// 32-bit counter that starts at a random value, as libzmq's, skipping
// identities in use. A new connection announcing an identity already in
// use is disconnected and the first keeps it (libzmq with ROUTER_HANDOVER
// off, its default, keeps the first too; it leaves the newcomer connected
// but never routes to it). A PING is answered with a PONG (libzmq sends
// heartbeats to 3.0 peers too when ZMQ_HEARTBEAT_IVL is set, and drops a
// peer that does not answer); none is sent. No inproc transport, no CURVE
// or PLAIN.
//
// # Concurrency
//
// A Socket's methods are safe for concurrent use. Each connection runs a
// reader and a writer goroutine; Close ends them all and waits for them.
// OnPeerError is called on a connection's goroutine.
package zmtp
