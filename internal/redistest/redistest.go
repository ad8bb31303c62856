// Package redistest starts a real redis-server for tests: on a free
// loopback port, with no persistence, stopped when the test ends.
//
// A test that needs Redis calls [Start]. When the redis-server binary
// cannot be found the test is skipped, saying so, except under CI=true,
// where it fails: CI installs the Debian package redis-server and must run
// these tests.
//
// # Invariants
//
//   - A server listens on 127.0.0.1 only, keeps nothing on disk (no RDB, no
//     AOF; its working directory is the test's temporary directory) and
//     answers PING before [Start] returns.
//   - A server never outlives its test: Start registers Kill with the
//     test's cleanup.
//   - [Server.Restart] brings back a fresh, empty server on the same port,
//     so clients reconnect to the same address.
//
// # Concurrency
//
// Servers belong to the test that started them; Kill and Restart may be
// called from that test's goroutine.
package redistest

import (
	"bufio"
	"fmt"
	"net"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"testing"
	"time"
)

// Server is a running redis-server.
type Server struct {
	t    testing.TB
	bin  string
	port int
	args []string
	cmd  *exec.Cmd
	done chan struct{}
}

// Binary returns the path of redis-server, or "" when it cannot be found.
func Binary() string {
	if p, err := exec.LookPath("redis-server"); err == nil {
		return p
	}
	for _, p := range []string{"/usr/bin/redis-server", "/usr/local/bin/redis-server"} {
		if _, err := os.Stat(p); err == nil {
			return p
		}
	}
	return ""
}

// Start starts redis-server on a free loopback port with extra config
// args (e.g. "--maxmemory", "1mb") and stops it at the end of the test.
func Start(t testing.TB, args ...string) *Server {
	t.Helper()
	bin := Binary()
	if bin == "" {
		if os.Getenv("CI") == "true" {
			t.Fatal("redis-server not found: CI must install the Debian package redis-server")
		}
		t.Skip("redis-server not found (install the Debian package redis-server); skipping the test with a real Redis")
	}
	s := &Server{t: t, bin: bin, args: args}
	var err error
	for range 5 { // the free port may be taken between the probe and the bind
		if s.port, err = freePort(); err != nil {
			continue
		}
		if err = s.start(); err == nil {
			t.Cleanup(s.Kill)
			return s
		}
	}
	t.Fatalf("starting redis-server: %v", err)
	return nil
}

func freePort() (int, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, err
	}
	defer ln.Close()
	return ln.Addr().(*net.TCPAddr).Port, nil
}

func (s *Server) start() error {
	args := append([]string{"--port", strconv.Itoa(s.port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no",
		"--protected-mode", "no", "--loglevel", "warning"}, s.args...)
	s.cmd = exec.Command(s.bin, args...)
	s.cmd.Dir = s.t.TempDir()
	if err := s.cmd.Start(); err != nil {
		return err
	}
	s.done = make(chan struct{})
	go func(c *exec.Cmd, done chan struct{}) { c.Wait(); close(done) }(s.cmd, s.done) //nolint:errcheck // killed on purpose
	deadline := time.Now().Add(10 * time.Second)
	for time.Now().Before(deadline) {
		select {
		case <-s.done:
			return fmt.Errorf("redis-server on port %d exited at start", s.port)
		default:
		}
		if r, err := s.Do("PING"); err == nil && r == "+PONG" {
			return nil
		}
		time.Sleep(10 * time.Millisecond)
	}
	s.Kill()
	return fmt.Errorf("redis-server on port %d did not answer PING within 10 s", s.port)
}

// Addr is the server's host:port.
func (s *Server) Addr() string { return "127.0.0.1:" + strconv.Itoa(s.port) }

// Kill stops the server at once (SIGKILL) and waits for it to exit.
func (s *Server) Kill() {
	if s.cmd == nil || s.cmd.Process == nil {
		return
	}
	s.cmd.Process.Kill() //nolint:errcheck // it may have exited
	<-s.done
	s.cmd = nil
}

// Restart starts a fresh, empty server on the same port.
func (s *Server) Restart() {
	s.t.Helper()
	s.Kill()
	var err error
	for range 20 {
		if err = s.start(); err == nil {
			return
		}
		time.Sleep(50 * time.Millisecond)
	}
	s.t.Fatalf("restarting redis-server: %v", err)
}

// Do sends one inline command and returns the first line of the reply
// (e.g. "+OK", ":3"); a test helper independent of any client library.
func (s *Server) Do(args ...string) (string, error) {
	c, err := net.DialTimeout("tcp", s.Addr(), time.Second)
	if err != nil {
		return "", err
	}
	defer c.Close()
	c.SetDeadline(time.Now().Add(5 * time.Second)) //nolint:errcheck // a net.Conn deadline
	var b strings.Builder
	fmt.Fprintf(&b, "*%d\r\n", len(args))
	for _, a := range args {
		fmt.Fprintf(&b, "$%d\r\n%s\r\n", len(a), a)
	}
	if _, err := c.Write([]byte(b.String())); err != nil {
		return "", err
	}
	line, err := bufio.NewReader(c).ReadString('\n')
	return strings.TrimRight(line, "\r\n"), err
}
