package bus

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"errors"
	"math/big"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"

	"github.com/onebitd/onebitd/internal/obtest"
)

// testTLS makes a CA and a server certificate for 127.0.0.1 signed by it;
// it writes the CA to a PEM file and returns that file and the server's
// TLS config.
func testTLS(t *testing.T) (caFile string, srv *tls.Config) {
	t.Helper()
	caKey, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	now := time.Now()
	caTmpl := &x509.Certificate{
		SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "onebitd test CA"},
		NotBefore: now.Add(-time.Hour), NotAfter: now.Add(time.Hour),
		IsCA: true, BasicConstraintsValid: true, KeyUsage: x509.KeyUsageCertSign,
	}
	caDER, err := x509.CreateCertificate(rand.Reader, caTmpl, caTmpl, &caKey.PublicKey, caKey)
	if err != nil {
		t.Fatal(err)
	}
	ca, err := x509.ParseCertificate(caDER)
	if err != nil {
		t.Fatal(err)
	}
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{
		SerialNumber: big.NewInt(2), Subject: pkix.Name{CommonName: "nats"},
		NotBefore: now.Add(-time.Hour), NotAfter: now.Add(time.Hour),
		IPAddresses: []net.IP{net.IPv4(127, 0, 0, 1)},
		KeyUsage:    x509.KeyUsageDigitalSignature, ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, ca, &key.PublicKey, caKey)
	if err != nil {
		t.Fatal(err)
	}
	caFile = filepath.Join(t.TempDir(), "ca.pem")
	if err := os.WriteFile(caFile, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: caDER}), 0o600); err != nil {
		t.Fatal(err)
	}
	return caFile, &tls.Config{
		Certificates: []tls.Certificate{{Certificate: [][]byte{der}, PrivateKey: key}},
		MinVersion:   tls.VersionTLS12,
	}
}

// TestExternalServerAuthAndTLS: against an external server that wants
// nkeys over TLS, the daemon (--nats-nkey or --nats-creds, --nats-tls-ca)
// publishes and a reader receives; without the CA or the key, no
// connection.
func TestExternalServerAuthAndTLS(t *testing.T) {
	caFile, tlsConf := testTLS(t)
	keys := t.TempDir()
	daemon, err := createSeedFile(filepath.Join(keys, "daemon.nk"), "test daemon")
	if err != nil {
		t.Fatal(err)
	}
	reader, err := createSeedFile(filepath.Join(keys, "reader.nk"), "test reader")
	if err != nil {
		t.Fatal(err)
	}
	srv, err := server.NewServer(&server.Options{
		Host: "127.0.0.1", Port: -1, NoSigs: true, NoLog: true,
		TLSConfig: tlsConf, TLSTimeout: 5,
		Nkeys: []*server.NkeyUser{
			{Nkey: daemon.pub, Permissions: daemonPermissions},
			{Nkey: reader.pub, Permissions: readerPermissions},
		},
	})
	if err != nil {
		t.Fatal(err)
	}
	srv.Start()
	if !srv.ReadyForConnections(10 * time.Second) {
		t.Fatal("nats server not ready")
	}
	t.Cleanup(func() { srv.Shutdown(); srv.WaitForShutdown() })
	url := strings.Replace(srv.ClientURL(), "nats://", "tls://", 1)

	t.Run("daemon publishes, reader receives", func(t *testing.T) {
		for _, cfg := range []Config{
			{URLs: url, NKeyFile: daemon.path, TLSCA: caFile},
			{URLs: url, CredsFile: daemon.path, TLSCA: caFile},
		} {
			sub, err := Client{URLs: url, CredsFile: reader.path, TLSCA: caFile}.Connect()
			if err != nil {
				t.Fatal(err)
			}
			c := subscribe(t, sub, "onebit.>")
			b := openBus(t, cfg)
			obtest.WaitFor(t, 10*time.Second, "bus connected", func() bool { return b.nc.IsConnected() })
			for i := range 10 {
				b.Emit(testEvent("node-a", "tls", i))
			}
			obtest.WaitFor(t, 10*time.Second, "events over TLS", func() bool { return c.len() == 10 })
			_ = b.Close()
			sub.Close()
		}
	})

	tests := []struct {
		name string
		c    Client
		want string
	}{
		{"no CA", Client{URLs: url, NKeyFile: reader.path}, "certificate"},
		{"no key", Client{URLs: url, TLSCA: caFile}, "Authorization Violation"},
		{"unknown key", Client{URLs: url, CredsFile: writeSeed(t), TLSCA: caFile}, "Authorization Violation"},
		{"CA file missing", Client{URLs: url, NKeyFile: reader.path, TLSCA: filepath.Join(keys, "nope.pem")}, "rootCA"},
		{"creds and nkey", Client{URLs: url, CredsFile: reader.path, NKeyFile: reader.path, TLSCA: caFile}, "not both"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			nc, err := tt.c.Connect(nats.MaxReconnects(0))
			if err == nil {
				nc.Close()
				t.Fatal("connected")
			}
			if !strings.Contains(err.Error(), tt.want) {
				t.Fatalf("Connect: %v, want %q", err, tt.want)
			}
		})
	}
	t.Run("bad creds fail Open", func(t *testing.T) {
		_, err := Open(context.Background(), Config{URLs: url, CredsFile: filepath.Join(keys, "nope"), Logger: discardLogger()})
		if !errors.Is(err, ErrCreds) {
			t.Fatalf("Open: %v, want %v", err, ErrCreds)
		}
	})
	t.Run("client flags need an external server", func(t *testing.T) {
		_, err := Open(context.Background(), Config{Listen: ListenOff, TLSCA: caFile, Logger: discardLogger()})
		if !errors.Is(err, ErrClientFlagsEmbedded) || !strings.Contains(err.Error(), "--nats-tls-ca") {
			t.Fatalf("Open: %v, want %v naming --nats-tls-ca", err, ErrClientFlagsEmbedded)
		}
	})
}

// writeSeed writes a fresh user seed no server knows.
func writeSeed(t *testing.T) string {
	t.Helper()
	id, err := createSeedFile(filepath.Join(t.TempDir(), "stranger.nk"), "stranger")
	if err != nil {
		t.Fatal(err)
	}
	return id.path
}
