package disk

import (
	"bufio"
	"context"
	"fmt"
	"math/rand/v2"
	"os"
	"os/exec"
	"strconv"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/pagedkv/pagedkv/tier"
)

// The kill test's child: the test binary re-executed with these set.
const (
	killChildDir  = "PAGEDKV_DISK_KILL_DIR"
	killChildSeed = "PAGEDKV_DISK_KILL_SEED"
)

// killConfig is the store both sides open: small, so the write loop
// evicts and overwrites slots in place all the time.
func killConfig(dir string) Config {
	cfg := testConfig(dir, 48)
	cfg.SegmentPages = 16
	cfg.QueueLen = 8
	cfg.SyncEvery = 16
	return cfg
}

func killUniverse() *pageUniverse { return newUniverse(testFormat, 24, 8) }

// TestMain runs the kill test's child when asked to.
func TestMain(m *testing.M) {
	if dir := os.Getenv(killChildDir); dir != "" {
		os.Exit(killChild(dir))
	}
	os.Exit(m.Run())
}

// killChild writes pages (and looks some up) until it is killed.
func killChild(dir string) int {
	seed, _ := strconv.ParseUint(os.Getenv(killChildSeed), 10, 64)
	s, err := Open(killConfig(dir))
	if err != nil {
		fmt.Fprintln(os.Stderr, "child: open:", err)
		return 2
	}
	// Values are written in 8-byte pieces (about 50 writes a slot): a kill
	// lands in the middle of a slot most of the time the writer is busy.
	s.writeChunk = 8
	fmt.Println("ready")
	u := killUniverse()
	rng := rand.New(rand.NewPCG(seed, 7))
	for {
		ch := u.chains[rng.IntN(len(u.chains))]
		if rng.IntN(8) == 0 {
			s.Fetch(context.Background(), request(ch))
			continue
		}
		for i := range ch[:1+rng.IntN(len(ch))] {
			for !s.Store(&ch[i]) {
				time.Sleep(50 * time.Microsecond)
			}
		}
	}
}

// TestKillNine kills a writing child with SIGKILL at random points,
// reopens the store after each kill and checks every page it serves
// against the K/V its digest determines. PAGEDKV_DISK_KILLS sets the kill
// count (default 200: about 4 s on a 2-core machine).
func TestKillNine(t *testing.T) {
	if testing.Short() {
		t.Skip("-short: the kill test re-executes the test binary")
	}
	kills := envInt(t, "PAGEDKV_DISK_KILLS", 200)
	exe, err := os.Executable()
	require.NoError(t, err)
	dir := t.TempDir()
	u := killUniverse()
	rng := rand.New(rand.NewPCG(uint64(time.Now().UnixNano()), 1))
	var survived, torn, dups, served, maxSurvived int
	for k := range kills {
		cmd := exec.Command(exe, "-test.run=^$")
		cmd.Env = append(os.Environ(), killChildDir+"="+dir, killChildSeed+"="+strconv.Itoa(k))
		out, err := cmd.StdoutPipe()
		require.NoError(t, err)
		var stderr limitedBuffer
		cmd.Stderr = &stderr
		require.NoError(t, cmd.Start())
		line, err := bufio.NewReader(out).ReadString('\n')
		require.NoError(t, err, "kill %d: the child did not start: %s", k, stderr.String())
		require.Equal(t, "ready\n", line)
		time.Sleep(time.Duration(rng.IntN(15000)) * time.Microsecond)
		require.NoError(t, cmd.Process.Signal(syscall.SIGKILL))
		err = cmd.Wait()
		if ws, ok := cmd.ProcessState.Sys().(syscall.WaitStatus); !ok || !ws.Signaled() {
			t.Fatalf("kill %d: the child ended before the kill: %v: %s", k, err, stderr.String())
		}

		s := openStore(t, killConfig(dir))
		rec := s.Recovery()
		if os.Getenv("KILLDEBUG") != "" {
			t.Logf("kill %d: %+v stats %+v", k, rec, s.DiskStats())
		}
		survived += rec.Recovered
		maxSurvived = max(maxSurvived, rec.Recovered)
		torn += rec.Torn
		dups += rec.Duplicate
		require.Zero(t, rec.Foreign, "kill %d: %+v", k, rec.Drops)
		n := 0
		seen := map[tier.Digest]bool{} // pairs of chains share their first page
		for _, ch := range u.chains {
			for i := range ch {
				if !seen[ch[i].Digest] {
					seen[ch[i].Digest] = true
					n += fetchChecked(t, s, request(ch[i:i+1]))
				}
			}
		}
		require.Equal(t, rec.Recovered, n, "kill %d: every recovered page is served", k)
		served += n
		require.NoError(t, s.CheckInvariants())
		require.NoError(t, s.Close())
	}
	t.Logf("%d kills: %.1f pages survived per crash on average (max %d of %d slots), %d pages served and verified, 0 wrong; %d torn and %d duplicate slots dropped",
		kills, float64(survived)/float64(kills), maxSurvived, killConfig(dir).Pages, served, torn, dups)
}

// limitedBuffer keeps the first 4 KiB of a child's stderr.
type limitedBuffer struct{ b []byte }

func (l *limitedBuffer) Write(p []byte) (int, error) {
	l.b = append(l.b, p[:min(len(p), 4096-len(l.b))]...)
	return len(p), nil
}

func (l *limitedBuffer) String() string { return string(l.b) }
