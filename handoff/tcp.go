package handoff

import (
	"bufio"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net"
	"time"
)

// The receiver's acknowledgement: a status byte (0: admitted, 1:
// refused), then a u16-length message (the admission handle as decimal,
// or why it was refused).
const (
	ackAdmitted = 0
	ackRefused  = 1
	maxAck      = 1024
)

// Serve accepts connections on ln until it is closed, reading one request
// per connection: verified (ReadRequest), admitted into st, acknowledged.
// admitted, if not nil, is told each admission's handle and request
// before the acknowledgement is sent. Each connection must deliver its
// request within timeout (0: no limit). Serve returns ln's Accept error.
func Serve(ln net.Listener, st *Store, timeout time.Duration, admitted func(id uint64, r *Received)) error {
	for {
		c, err := ln.Accept()
		if err != nil {
			return err
		}
		go serveConn(c, st, timeout, admitted)
	}
}

func serveConn(c net.Conn, st *Store, timeout time.Duration, admitted func(uint64, *Received)) {
	defer c.Close()
	if timeout > 0 {
		c.SetDeadline(time.Now().Add(timeout))
	}
	r, err := ReadRequest(bufio.NewReaderSize(c, 1<<20), st.cfg)
	var id uint64
	if err == nil {
		id, err = st.Admit(r)
	}
	if err != nil {
		writeAck(c, ackRefused, err.Error())
		return
	}
	if admitted != nil {
		admitted(id, r)
	}
	writeAck(c, ackAdmitted, fmt.Sprint(id))
}

func writeAck(w io.Writer, status byte, msg string) error {
	if len(msg) > maxAck {
		msg = msg[:maxAck]
	}
	b := append([]byte{status}, 0, 0)
	binary.LittleEndian.PutUint16(b[1:], uint16(len(msg)))
	_, err := w.Write(append(b, msg...))
	return err
}

// Send writes r's stream to the receiver at addr and waits for its
// acknowledgement, by ctx's deadline. It returns nil only when the
// receiver admitted every page: on any error the sender should keep the
// request (nothing was admitted, or the receiver will not serve it).
func Send(ctx context.Context, addr string, cfg Config, r *Request) error {
	var d net.Dialer
	c, err := d.DialContext(ctx, "tcp", addr)
	if err != nil {
		return fmt.Errorf("handoff: send: %w", err)
	}
	defer c.Close()
	if dl, ok := ctx.Deadline(); ok {
		c.SetDeadline(dl)
	}
	if err := WriteRequest(c, cfg, r); err != nil {
		return fmt.Errorf("handoff: send: %w", err)
	}
	var hdr [3]byte
	if _, err := io.ReadFull(c, hdr[:]); err != nil {
		return fmt.Errorf("handoff: send: no acknowledgement: %w", err)
	}
	n := int(binary.LittleEndian.Uint16(hdr[1:]))
	if n > maxAck {
		return fmt.Errorf("handoff: send: acknowledgement of %d bytes", n)
	}
	msg := make([]byte, n)
	if _, err := io.ReadFull(c, msg); err != nil {
		return fmt.Errorf("handoff: send: acknowledgement cut: %w", err)
	}
	switch hdr[0] {
	case ackAdmitted:
		return nil
	case ackRefused:
		return fmt.Errorf("%w: %s", ErrRefused, msg)
	}
	return errors.New("handoff: send: bad acknowledgement status")
}
