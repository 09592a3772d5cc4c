package bus

import (
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/nats-io/jwt/v2"
	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nkeys"

	"github.com/onebitd/onebitd/internal/obtest"
)

// TestJWTCredsFile: --nats-creds also takes a NATS credentials file (user
// JWT + seed, as nsc writes it) for a server in operator mode.
func TestJWTCredsFile(t *testing.T) {
	must := func(err error) {
		t.Helper()
		if err != nil {
			t.Fatal(err)
		}
	}
	okp, err := nkeys.CreateOperator()
	must(err)
	opub, _ := okp.PublicKey()
	oc := jwt.NewOperatorClaims(opub)
	ojwt, err := oc.Encode(okp)
	must(err)
	op, err := jwt.DecodeOperatorClaims(ojwt)
	must(err)

	newAccount := func(name string) (nkeys.KeyPair, string, string) {
		akp, err := nkeys.CreateAccount()
		must(err)
		apub, _ := akp.PublicKey()
		ac := jwt.NewAccountClaims(apub)
		ac.Name = name
		ajwt, err := ac.Encode(okp)
		must(err)
		return akp, apub, ajwt
	}
	akp, apub, ajwt := newAccount("ONEBIT")
	_, spub, sjwt := newAccount("SYS")
	resolver := &server.MemAccResolver{}
	must(resolver.Store(apub, ajwt))
	must(resolver.Store(spub, sjwt))

	writeCreds := func(name string, perms jwt.Permissions) string {
		ukp, err := nkeys.CreateUser()
		must(err)
		upub, _ := ukp.PublicKey()
		uc := jwt.NewUserClaims(upub)
		uc.Permissions = perms
		ujwt, err := uc.Encode(akp)
		must(err)
		seed, _ := ukp.Seed()
		creds, err := jwt.FormatUserConfig(ujwt, seed)
		must(err)
		p := filepath.Join(t.TempDir(), name+".creds")
		must(os.WriteFile(p, creds, 0o600))
		return p
	}
	daemonCreds := writeCreds("daemon", jwt.Permissions{Pub: jwt.Permission{Allow: []string{StreamSubjects}}})
	readerCreds := writeCreds("reader", jwt.Permissions{
		Pub: jwt.Permission{Deny: []string{StreamSubjects}},
		Sub: jwt.Permission{Allow: []string{StreamSubjects, "_INBOX.>"}},
	})

	srv, err := server.NewServer(&server.Options{
		Host: "127.0.0.1", Port: -1, NoSigs: true, NoLog: true,
		TrustedOperators: []*jwt.OperatorClaims{op},
		AccountResolver:  resolver,
		SystemAccount:    spub,
	})
	must(err)
	srv.Start()
	if !srv.ReadyForConnections(10 * time.Second) {
		t.Fatal("nats server not ready")
	}
	t.Cleanup(func() { srv.Shutdown(); srv.WaitForShutdown() })
	url := srv.ClientURL()

	sub, err := Client{URLs: url, CredsFile: readerCreds}.Connect()
	must(err)
	defer sub.Close()
	c := subscribe(t, sub, "onebit.>")
	b := openBus(t, Config{URLs: url, CredsFile: daemonCreds})
	obtest.WaitFor(t, 10*time.Second, "bus connected", func() bool { return b.nc.IsConnected() })
	b.Emit(testEvent("node-a", "jwt", 0))
	obtest.WaitFor(t, 10*time.Second, "event", func() bool { return c.len() == 1 })

	if nc, err := (Client{URLs: url}).Connect(); err == nil {
		nc.Close()
		t.Fatal("anonymous connection accepted in operator mode")
	}
}
