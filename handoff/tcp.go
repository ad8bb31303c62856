package handoff

import (
	"bufio"
	"context"
	"crypto/hmac"
	"crypto/tls"
	"encoding/binary"
	"fmt"
	"io"
	"net"
	"strconv"
	"time"
)

// The conversation on one connection (docs/handoff.md):
//
//	sender:   prelude ("PKVH", version, 3 zero bytes)
//	receiver: hello ("PKVH", version, flags, 2 zero bytes, nonce)
//	sender:   head, tag, namespace, tokens, runs, tag
//	receiver: reply 1: continue, or refused / busy
//	sender:   pages, tag
//	receiver: reply 2: admitted, already held, or refused
//
// A reply is a status byte, a u16-length message and a tag over both,
// bound to the nonce and the reply's number. Before the hello (a prelude
// of another version, too many connections) the receiver answers in
// version 1's acknowledgement format, without a tag: a status byte (1:
// refused), a u16-length message.
const (
	ackAdmitted    = 0
	ackRefused     = 1
	ackContinue    = 2
	ackAlreadyHeld = 3
	ackBusy        = 4

	// MaxReply bounds a reply's message.
	MaxReply               = 1024
	helloBytes             = preludeBytes + NonceBytes
	helloAuth              = 1 // hello flag: the receiver authenticates (has a key)
	replyVerdict, replyAck = 1, 2
)

// DefaultSendTimeout bounds a Send whose context has no deadline.
const DefaultSendTimeout = 2 * time.Minute

// Send writes r's stream to the receiver at addr and waits for its
// acknowledgement, by ctx's deadline (DefaultSendTimeout when it has
// none). The receiver proves it holds cfg's key: every reply's tag must
// verify, or Send returns ErrAuth.
//
// It returns nil only when the receiver admitted every page with r's
// bytes (pages it already held with equal bytes count as taken).
// ErrAlreadyHeld (not wrapping ErrRefused): the receiver admitted the
// request and will serve its prefix, but for some pages from an earlier
// transfer's different bytes: r's bytes for them were not taken. Any other
// error (ErrRefused, ErrBusy, ErrAuth, a network error): nothing was
// admitted, or the sender cannot know, and it should keep the request.
func Send(ctx context.Context, addr string, cfg Config, r *Request) error {
	if err := cfg.check(); err != nil {
		return err
	}
	if err := cfg.checkRequest(r); err != nil {
		return err
	}
	if _, ok := ctx.Deadline(); !ok {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, DefaultSendTimeout)
		defer cancel()
	}
	var c net.Conn
	var err error
	if cfg.TLS != nil {
		d := tls.Dialer{Config: cfg.TLS}
		c, err = d.DialContext(ctx, "tcp", addr)
	} else {
		var d net.Dialer
		c, err = d.DialContext(ctx, "tcp", addr)
	}
	if err != nil {
		return fmt.Errorf("handoff: send: %w", err)
	}
	defer c.Close()
	dl, _ := ctx.Deadline()
	c.SetDeadline(dl)
	stop := context.AfterFunc(ctx, func() { c.SetDeadline(time.Unix(1, 0)) })
	defer stop()
	err = send(c, &cfg, r)
	if err != nil && ctx.Err() != nil {
		return fmt.Errorf("handoff: send: %w (%w)", err, ctx.Err())
	}
	return err
}

func send(c net.Conn, cfg *Config, r *Request) error {
	if _, err := c.Write(prelude[:]); err != nil {
		return fmt.Errorf("handoff: send: %w", err)
	}
	br := bufio.NewReaderSize(c, 4<<10)
	nonce, err := readHello(br, cfg)
	if err != nil {
		return err
	}
	s := newStreamWriter(c, cfg, &nonce)
	s.header(r)
	if err := s.flush(); err != nil {
		return fmt.Errorf("handoff: send: %w", err)
	}
	status, msg, err := readReply(br, cfg, &nonce, replyVerdict)
	if err != nil {
		return err
	}
	switch status {
	case ackContinue:
	case ackRefused:
		return fmt.Errorf("%w: %s", ErrRefused, msg)
	case ackBusy:
		return fmt.Errorf("%w: %w: %s", ErrRefused, ErrBusy, msg)
	default:
		return fmt.Errorf("handoff: send: status %d in reply to the header", status)
	}
	s.pages(r)
	if err := s.flush(); err != nil {
		return fmt.Errorf("handoff: send: %w", err)
	}
	status, msg, err = readReply(br, cfg, &nonce, replyAck)
	if err != nil {
		return err
	}
	switch status {
	case ackAdmitted:
		return nil
	case ackAlreadyHeld:
		return fmt.Errorf("%w: %s", ErrAlreadyHeld, msg)
	case ackRefused:
		return fmt.Errorf("%w: %s", ErrRefused, msg)
	}
	return fmt.Errorf("handoff: send: status %d in the acknowledgement", status)
}

// readHello reads the receiver's hello (or its refusal before one) and
// checks that both sides agree on authentication.
func readHello(br *bufio.Reader, cfg *Config) (Nonce, error) {
	var n Nonce
	first, err := br.Peek(1)
	if err != nil {
		return n, fmt.Errorf("handoff: send: no hello from the receiver: %w", err)
	}
	if first[0] != streamMagic[0] {
		// A refusal in version 1's format: before the hello, or from a
		// receiver of version 1 refusing this version.
		var h [3]byte
		if _, err := io.ReadFull(br, h[:]); err != nil {
			return n, fmt.Errorf("handoff: send: reading the receiver's answer: %w", err)
		}
		msg, err := readMsg(br, h[1:])
		if err != nil {
			return n, err
		}
		if h[0] == ackRefused {
			return n, fmt.Errorf("%w (before authentication): %s", ErrRefused, msg)
		}
		return n, fmt.Errorf("handoff: send: the receiver answered status %d before its hello: %q", h[0], msg)
	}
	var h [helloBytes]byte
	if _, err := io.ReadFull(br, h[:]); err != nil {
		return n, fmt.Errorf("handoff: send: reading the hello: %w", err)
	}
	switch {
	case string(h[:4]) != streamMagic || h[4] != StreamVersion || h[6]|h[7] != 0:
		return n, fmt.Errorf("handoff: send: hello %q version %d: this sender speaks version %d", h[:4], h[4], StreamVersion)
	case h[5]&helloAuth == 0 && !cfg.Insecure:
		return n, fmt.Errorf("%w: the receiver runs without authentication (Config.Insecure) and this sender has a key: not sending", ErrAuth)
	case h[5]&helloAuth != 0 && cfg.Insecure:
		return n, fmt.Errorf("%w: the receiver requires authentication and this sender has no key (Config.Insecure)", ErrAuth)
	}
	copy(n[:], h[preludeBytes:])
	return n, nil
}

// readMsg reads a message of the u16 length in l.
func readMsg(r io.Reader, l []byte) ([]byte, error) {
	n := int(binary.LittleEndian.Uint16(l))
	if n > MaxReply {
		return nil, fmt.Errorf("handoff: send: a reply of %d bytes, more than %d", n, MaxReply)
	}
	msg := make([]byte, n)
	if _, err := io.ReadFull(r, msg); err != nil {
		return nil, fmt.Errorf("handoff: send: reply cut: %w", err)
	}
	return msg, nil
}

// readReply reads reply seq and verifies its tag.
func readReply(br *bufio.Reader, cfg *Config, nonce *Nonce, seq byte) (byte, string, error) {
	var h [3]byte
	if _, err := io.ReadFull(br, h[:]); err != nil {
		return 0, "", fmt.Errorf("handoff: send: no reply from the receiver: %w", err)
	}
	msg, err := readMsg(br, h[1:])
	if err != nil {
		return 0, "", err
	}
	var tag [TagBytes]byte
	if _, err := io.ReadFull(br, tag[:]); err != nil {
		return 0, "", fmt.Errorf("handoff: send: reply cut: %w", err)
	}
	if want := cfg.replyTag(nonce, seq, h[0], msg); !hmac.Equal(tag[:], want[:]) {
		return 0, "", fmt.Errorf("%w: the receiver's reply does not verify (not a receiver with this key); it says %q", ErrAuth, msg)
	}
	return h[0], string(msg), nil
}

// appendReply appends reply seq.
func appendReply(b []byte, cfg *Config, nonce *Nonce, seq, status byte, msg string) []byte {
	if len(msg) > MaxReply {
		msg = msg[:MaxReply]
	}
	b = append(b, status, 0, 0)
	binary.LittleEndian.PutUint16(b[len(b)-2:], uint16(len(msg)))
	b = append(b, msg...)
	tag := cfg.replyTag(nonce, seq, status, []byte(msg))
	return append(b, tag[:]...)
}

// appendRefusal appends a refusal before the hello (version 1's format).
func appendRefusal(b []byte, msg string) []byte {
	if len(msg) > MaxReply {
		msg = msg[:MaxReply]
	}
	b = append(b, ackRefused, 0, 0)
	binary.LittleEndian.PutUint16(b[len(b)-2:], uint16(len(msg)))
	return append(b, msg...)
}

// admissionMsg is the acknowledgement's message for admission a: its ID,
// or what was already held.
func admissionMsg(a Admission) string {
	if a.Held == 0 {
		return strconv.FormatUint(a.ID, 10)
	}
	return fmt.Sprintf("admission %d: %d of %d pages were already held with other bytes (an earlier transfer's); the receiver serves those, not this transfer's", a.ID, a.Held, a.Pages)
}
