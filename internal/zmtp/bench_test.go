package zmtp

import (
	"bufio"
	"io"
	"net"
	"testing"
)

// BenchmarkPubSub sends KV-event-sized messages ([topic, 8-byte seq,
// 430-byte payload], kvindex.BenchmarkPublishIndex's mean batch) from a
// PUB to a SUB over loopback TCP, against the baseline of the same bytes
// framed the same way, written and read on a bare TCP connection.
func BenchmarkPubSub(b *testing.B) {
	msg := [][]byte{[]byte("kv-events"), make([]byte, 8), make([]byte, 430)}
	size := messageBytes(msg) - 3*frameOverhead
	b.Run("zmtp", func(b *testing.B) {
		pub, err := New(Config{Type: PUB, HWM: 1 << 20})
		if err != nil {
			b.Fatal(err)
		}
		defer pub.Close()
		ep, err := pub.Bind("tcp://127.0.0.1:0")
		if err != nil {
			b.Fatal(err)
		}
		sub, err := New(Config{Type: SUB})
		if err != nil {
			b.Fatal(err)
		}
		defer sub.Close()
		if err := sub.Subscribe(""); err != nil {
			b.Fatal(err)
		}
		if err := sub.Connect(ep); err != nil {
			b.Fatal(err)
		}
		for pub.Subscriptions() == 0 {
			if err := pub.Send(msg); err != nil { // nobody yet: dropped
				b.Fatal(err)
			}
		}
		b.SetBytes(size)
		b.ReportAllocs()
		b.ResetTimer()
		done := make(chan error, 1)
		go func() {
			for range b.N {
				if _, err := sub.Recv(); err != nil {
					done <- err
					return
				}
			}
			done <- nil
		}()
		for range b.N {
			if err := pub.Send(msg); err != nil {
				b.Fatal(err)
			}
		}
		if err := <-done; err != nil {
			b.Fatal(err)
		}
		if d := pub.Stats().Dropped; d > 0 {
			b.Fatalf("%d messages dropped", d)
		}
	})
	b.Run("tcp-baseline", func(b *testing.B) {
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			b.Fatal(err)
		}
		defer ln.Close()
		var wire []byte
		for i, f := range msg {
			flags := byte(flagMore)
			if i == len(msg)-1 {
				flags = 0
			}
			wire = appendFrame(wire, flags, f)
		}
		b.SetBytes(size)
		b.ReportAllocs()
		b.ResetTimer()
		done := make(chan error, 1)
		go func() {
			c, err := ln.Accept()
			if err != nil {
				done <- err
				return
			}
			defer c.Close()
			_, err = io.CopyN(io.Discard, bufio.NewReader(c), int64(b.N)*int64(len(wire)))
			done <- err
		}()
		c, err := net.Dial("tcp", ln.Addr().String())
		if err != nil {
			b.Fatal(err)
		}
		defer c.Close()
		w := bufio.NewWriterSize(c, 32<<10)
		for range b.N {
			if _, err := w.Write(wire); err != nil {
				b.Fatal(err)
			}
		}
		if err := w.Flush(); err != nil {
			b.Fatal(err)
		}
		if err := <-done; err != nil {
			b.Fatal(err)
		}
	})
}
