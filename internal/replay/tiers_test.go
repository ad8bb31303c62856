package replay

import (
	"testing"

	"github.com/stretchr/testify/require"
)

// A host tier below a small pool serves hits the pool lost: the fleet of
// tiers recovers more than the pool alone and no more than the pool and
// host capacity together could (Belady over their sum), and the host
// tier's hits are pages copied up.
func TestHostTier(t *testing.T) {
	tr := prefix(conversation(t), 2000)
	pool := max(tr.DistinctBlocks/50, tr.MinPoolPages())
	host := tr.DistinctBlocks / 10
	if raceEnabled {
		tr = prefix(tr, 500)
	}
	alone, err := Run(tr, Config{CapacityPages: pool, PageTokens: 16})
	require.NoError(t, err)
	tiered, err := Run(tr, Config{CapacityPages: pool, HostPages: host, PageTokens: 16})
	require.NoError(t, err)
	require.Greater(t, tiered.HitBlocks, alone.HitBlocks)
	require.Positive(t, tiered.HostHitBlocks)
	require.Equal(t, tiered.HostHitBlocks, tiered.Onloaded)
	require.Positive(t, tiered.Offloaded)
	require.LessOrEqual(t, tiered.HitBlocks, Belady(&tiered.Stream, pool+host))
	svc := DefaultService()
	res, err := Run(prefix(tr, 150), Config{CapacityPages: pool / 2, HostPages: host, Service: &svc})
	require.NoError(t, err)
	require.Positive(t, res.HostHitBlocks)
	_, err = Run(tr, Config{CapacityPages: pool, HostPages: -1})
	require.ErrorContains(t, err, "HostPages -1")
}
