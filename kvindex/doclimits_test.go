package kvindex_test

import (
	"testing"

	"github.com/pagedkv/pagedkv/internal/doclimits"
	"github.com/pagedkv/pagedkv/kvindex"
)

// TestDocLimits: docs/kvindex.md's limits table states every default the
// index and subscriber enforce.
func TestDocLimits(t *testing.T) {
	doclimits.Check(t, "docs/kvindex.md", map[string]any{
		"kvindex.DefaultMaxBlocks":        kvindex.DefaultMaxBlocks,
		"kvindex.MaxGroups":               kvindex.MaxGroups,
		"kvindex.DefaultReplayTimeout":    kvindex.DefaultReplayTimeout,
		"kvindex.DefaultReplayDeadline":   kvindex.DefaultReplayDeadline,
		"kvindex.DefaultMaxReplayReplies": kvindex.DefaultMaxReplayReplies,
		"kvindex.DefaultMaxReplayBytes":   kvindex.DefaultMaxReplayBytes,
		"kvindex.DefaultMaxMessageBytes":  kvindex.DefaultMaxMessageBytes,
	})
}
