package kvindex_test

import (
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/pagedkv/pagedkv/kvindex"
)

// TestSubscriberBadConfig: limits and endpoints the transport cannot use
// are refused with ErrBadConfig naming the value, and nothing is left
// running.
func TestSubscriberBadConfig(t *testing.T) {
	ix, err := kvindex.New(kvindex.Config{PageSize: 4, Seed: 1})
	if err != nil {
		t.Fatal(err)
	}
	good := kvindex.Source{Name: "r", Endpoint: "tcp://127.0.0.1:1"}
	for _, tc := range []struct {
		cfg  kvindex.SubscriberConfig
		src  kvindex.Source
		want string
	}{
		{kvindex.SubscriberConfig{MaxMessageBytes: -1}, good, "max message bytes -1"},
		{kvindex.SubscriberConfig{ReplayTimeout: -time.Second}, good, "replay timeout -1s"},
		{kvindex.SubscriberConfig{ReplayDeadline: -time.Millisecond}, good, "replay deadline -1ms"},
		{kvindex.SubscriberConfig{MaxReplayReplies: -3}, good, "max replay replies -3"},
		{kvindex.SubscriberConfig{MaxReplayBytes: -4}, good, "max replay bytes -4"},
		{kvindex.SubscriberConfig{MaxMessageBytes: 10}, good, "max message bytes 10 (want >= 24)"},
		{kvindex.SubscriberConfig{}, kvindex.Source{Name: "r", Endpoint: "127.0.0.1:5557"}, `endpoint "127.0.0.1:5557" is not transport://address`},
		{kvindex.SubscriberConfig{}, kvindex.Source{Name: "r", Endpoint: "inproc://kv"}, `transport "inproc"`},
		{kvindex.SubscriberConfig{}, kvindex.Source{Name: "r", Endpoint: "tcp://127.0.0.1:1", ReplayEndpoint: "tcp://:5558"}, `endpoint "tcp://:5558": connect needs a host`},
	} {
		// The bad source comes second: the first must not stay behind.
		sub, err := kvindex.NewSubscriber(ix, tc.cfg, good, tc.src)
		if !errors.Is(err, kvindex.ErrBadConfig) || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%+v %+v: %v, want ErrBadConfig with %q", tc.cfg, tc.src, err, tc.want)
		}
		if sub != nil {
			t.Errorf("%+v: a Subscriber with the error", tc.src)
			sub.Close()
		}
	}
	if n := ix.Replicas(); n != 0 {
		t.Errorf("refused subscribers added %d replicas", n)
	}
}
