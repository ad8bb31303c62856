package redis

import (
	"fmt"
	"math/rand/v2"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/pagedkv/pagedkv/internal/redistest"
	"github.com/pagedkv/pagedkv/layout"
)

// A server whose default user is off serves only a client with the
// replicas' ACL user: without credentials or with a wrong password every
// lookup misses and counts an error (nothing is served, nothing is
// written), and the password never appears in what the Store reports.
func TestCredentials(t *testing.T) {
	t.Parallel()
	srv := redistest.Start(t)
	const password = "s3cret-replica-password"
	for _, cmd := range [][]string{
		{"ACL", "SETUSER", "replica", "on", ">" + password, "~*", "+@all"},
		{"ACL", "SETUSER", "default", "off"},
	} {
		r, err := srv.Do(cmd...)
		require.NoError(t, err)
		require.Equal(t, "+OK", r, "%v", cmd)
	}
	rng := rand.New(rand.NewPCG(3, 4))
	f := format(layout.F16, layout.NHD)
	pages := chain(rng, f, "t", 3)

	good := newStore(t, srv, Config{Username: "replica", Password: password})
	for i := range pages {
		require.True(t, good.Store(&pages[i]))
	}
	flush(t, good)
	require.Equal(t, 3, fetch(good, asked(pages)))
	require.Zero(t, good.Stats().Errors)

	for _, bad := range []Config{{}, {Username: "replica", Password: "wrong"}, {Password: password}} {
		s := newStore(t, srv, bad)
		require.Zero(t, fetch(s, asked(pages)), "user %q", bad.Username)
		st := s.Stats()
		require.NotZero(t, st.Errors, "user %q", bad.Username)
		require.NotContains(t, fmt.Sprintf("%+v", st), password)
	}
}

func TestCredentialsConfig(t *testing.T) {
	_, err := New(Config{Addr: "127.0.0.1:1", Namespace: "n", Format: format(layout.F16, layout.NHD), Username: "replica"})
	require.ErrorIs(t, err, ErrBadConfig)
	require.Contains(t, err.Error(), `Username = "replica" without a Password`)

	t.Setenv(EnvUsername, "u")
	t.Setenv(EnvPassword, "p")
	require.Equal(t, Config{Username: "u", Password: "p"}, Config{}.FromEnv())
	require.Equal(t, Config{Username: "x", Password: "y"}, Config{Username: "x", Password: "y"}.FromEnv())
}
