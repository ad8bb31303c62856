package handoff

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"math/big"
	"net"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// testPKI is a CA and a certificate it signed for each name (the server's
// for 127.0.0.1, a client's).
type testPKI struct {
	pool  *x509.CertPool
	ca    *x509.Certificate
	caKey *ecdsa.PrivateKey
}

func newTestPKI(t *testing.T) *testPKI {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	require.NoError(t, err)
	tmpl := &x509.Certificate{SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "handoff test CA"},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour),
		IsCA: true, BasicConstraintsValid: true, KeyUsage: x509.KeyUsageCertSign}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	require.NoError(t, err)
	ca, err := x509.ParseCertificate(der)
	require.NoError(t, err)
	pool := x509.NewCertPool()
	pool.AddCert(ca)
	return &testPKI{pool: pool, ca: ca, caKey: key}
}

func (p *testPKI) cert(t *testing.T, serial int64, name string, usage x509.ExtKeyUsage) tls.Certificate {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	require.NoError(t, err)
	tmpl := &x509.Certificate{SerialNumber: big.NewInt(serial), Subject: pkix.Name{CommonName: name},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour),
		KeyUsage: x509.KeyUsageDigitalSignature, ExtKeyUsage: []x509.ExtKeyUsage{usage}}
	if ip := net.ParseIP(name); ip != nil {
		tmpl.IPAddresses = []net.IP{ip}
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, p.ca, &key.PublicKey, p.caKey)
	require.NoError(t, err)
	return tls.Certificate{Certificate: [][]byte{der}, PrivateKey: key}
}

// Mutual TLS on top of the key: a sender with a certificate of the
// deployment's CA is admitted; one without (or not speaking TLS) is
// refused in the handshake, and nothing is admitted.
func TestMutualTLS(t *testing.T) {
	pki := newTestPKI(t)
	rcfg := testConfig()
	rcfg.TLS = &tls.Config{MinVersion: tls.VersionTLS13, Certificates: []tls.Certificate{pki.cert(t, 2, "127.0.0.1", x509.ExtKeyUsageServerAuth)},
		ClientAuth: tls.RequireAndVerifyClientCert, ClientCAs: pki.pool}
	st := newStore(t, rcfg, 8)
	srv, addr := serve(t, st, ServerConfig{IdleTimeout: time.Second})
	ctx := testCtx(t)

	scfg := testConfig()
	scfg.TLS = &tls.Config{MinVersion: tls.VersionTLS13, RootCAs: pki.pool, Certificates: []tls.Certificate{pki.cert(t, 3, "prefill-0", x509.ExtKeyUsageClientAuth)}}
	require.NoError(t, Send(ctx, addr, scfg, testRequest(20, 2, []int32{0, 1})))
	require.Equal(t, 2, st.Held())

	noCert := testConfig()
	noCert.TLS = &tls.Config{MinVersion: tls.VersionTLS13, RootCAs: pki.pool}
	require.Error(t, Send(ctx, addr, noCert, testRequest(21, 2, []int32{0, 1})))
	require.Error(t, Send(ctx, addr, testConfig(), testRequest(22, 2, []int32{0, 1})), "not speaking TLS")
	require.Equal(t, 2, st.Held())
	eventually(t, func() bool { return srv.Stats().Open == 0 }, "connections closed")
	s := srv.Stats()
	require.EqualValues(t, 1, s.Admitted)
	require.EqualValues(t, 2, s.BadStreams, "the failed handshakes")
}
