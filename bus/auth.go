package bus

import (
	"bytes"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strings"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nkeys"
)

// Identities of the embedded server: one nkey seed file each in the state
// dir, mode 0600, created on first start and kept (a running `onebitd
// watch` keeps working across restarts; delete both and restart to rotate).
const (
	// DaemonCredsFile may publish on onebit.> and use the JetStream API:
	// the bus's own connection.
	DaemonCredsFile = "nats-daemon.nk"
	// ReaderCredsFile may subscribe to onebit.> and read stream ONEBIT
	// (an ordered consumer), and publish nothing on onebit.>: `onebitd
	// watch`, `onebitd replay --stream`, dashboards, `nats --nkey`.
	ReaderCredsFile = "nats-reader.nk"
)

// ReaderCredsPath is the reader's seed file of the embedded server of the
// daemon whose state dir is stateDir.
func ReaderCredsPath(stateDir string) string { return filepath.Join(stateDir, ReaderCredsFile) }

// Permissions of the two identities. Anything not allowed is refused by
// the server (a publish is dropped and the client gets a "Permissions
// Violation" error); the reader's deny on onebit.> states the rule twice.
var (
	daemonPermissions = &server.Permissions{
		Publish:   &server.SubjectPermission{Allow: []string{StreamSubjects, "$JS.API.>"}},
		Subscribe: &server.SubjectPermission{Allow: []string{"_INBOX.>"}},
	}
	readerPermissions = &server.Permissions{
		Publish: &server.SubjectPermission{
			Allow: []string{
				"$JS.API.INFO",
				"$JS.API.STREAM.NAMES",
				"$JS.API.STREAM.LIST",
				"$JS.API.STREAM.INFO.*", // read-only: an unknown stream is "not found", not a timeout
				"$JS.API.STREAM.MSG.GET." + StreamName,
				"$JS.API.DIRECT.GET." + StreamName,
				"$JS.API.DIRECT.GET." + StreamName + ".>",
				"$JS.API.CONSUMER.CREATE." + StreamName,
				"$JS.API.CONSUMER.CREATE." + StreamName + ".>",
				"$JS.API.CONSUMER.INFO." + StreamName + ".>",
				"$JS.API.CONSUMER.DELETE." + StreamName + ".>",
				"$JS.API.CONSUMER.MSG.NEXT." + StreamName + ".>",
			},
			Deny: []string{StreamSubjects},
		},
		Subscribe: &server.SubjectPermission{Allow: []string{StreamSubjects, "_INBOX.>"}},
	}
)

// identity is one nkey user of the embedded server.
type identity struct {
	seed []byte // nkey user seed ("SU…")
	pub  string
	path string // seed file; "" when kept in memory only (no state dir)
}

// credentials are the embedded server's two identities.
type credentials struct {
	daemon, reader identity
}

// loadOrCreateCredentials reads the two seed files from stateDir, creating
// whichever is missing. With stateDir empty the keys live in memory only:
// nothing outside this process can connect.
func loadOrCreateCredentials(stateDir string) (*credentials, error) {
	var c credentials
	for _, id := range []struct {
		dst  *identity
		file string
		what string
	}{
		{&c.daemon, DaemonCredsFile, "daemon: publishes on onebit.> and uses the JetStream API"},
		{&c.reader, ReaderCredsFile, "reader: subscribes to onebit.>, reads stream " + StreamName + ", publishes nothing on onebit.>"},
	} {
		if stateDir == "" {
			kp, err := nkeys.CreateUser()
			if err != nil {
				return nil, fmt.Errorf("%w: create nkey: %w", ErrCreds, err)
			}
			if *id.dst, err = identityOf(kp, ""); err != nil {
				return nil, err
			}
			continue
		}
		path := filepath.Join(stateDir, id.file)
		got, err := loadSeedFile(path)
		if errors.Is(err, fs.ErrNotExist) {
			got, err = createSeedFile(path, id.what)
		}
		if err != nil {
			return nil, err
		}
		*id.dst = got
	}
	return &c, nil
}

func identityOf(kp nkeys.KeyPair, path string) (identity, error) {
	seed, err := kp.Seed()
	if err != nil {
		return identity{}, fmt.Errorf("%w: %s: %w", ErrCreds, path, err)
	}
	pub, err := kp.PublicKey()
	if err != nil {
		return identity{}, fmt.Errorf("%w: %s: %w", ErrCreds, path, err)
	}
	return identity{seed: seed, pub: pub, path: path}, nil
}

// loadSeedFile reads a user nkey seed file, refusing one that others can
// read or write.
func loadSeedFile(path string) (identity, error) {
	fi, err := os.Stat(path)
	if err != nil {
		return identity{}, fmt.Errorf("%w: %w", ErrCreds, err) // still fs.ErrNotExist when missing
	}
	if perm := fi.Mode().Perm(); perm&0o077 != 0 {
		return identity{}, fmt.Errorf("%w: %s has mode %04o (chmod 600 %s)", ErrCredsMode, path, perm, path)
	}
	data, err := os.ReadFile(path)
	if err != nil {
		return identity{}, fmt.Errorf("%w: %w", ErrCreds, err)
	}
	defer clear(data)
	kp, err := nkeys.ParseDecoratedUserNKey(data)
	if err != nil {
		return identity{}, fmt.Errorf("%w: %s is not an nkey user seed file: %w", ErrCreds, path, err)
	}
	return identityOf(kp, path)
}

// createSeedFile writes a new user nkey seed to path, mode 0600, atomically
// (a temporary file linked into place): a reader never sees half a file,
// and of two daemons starting on one state dir the second loads the
// first's key.
func createSeedFile(path, what string) (identity, error) {
	kp, err := nkeys.CreateUser()
	if err != nil {
		return identity{}, fmt.Errorf("%w: create nkey: %w", ErrCreds, err)
	}
	id, err := identityOf(kp, path)
	if err != nil {
		return identity{}, err
	}
	var b bytes.Buffer
	fmt.Fprintf(&b, "# onebitd: NATS identity of the embedded server of this state dir.\n# %s\n", what)
	fmt.Fprintf(&b, "# Public key %s. Keep this file secret (mode 0600).\n", id.pub)
	fmt.Fprintf(&b, "# Use: onebitd watch --nats-creds %s   or   nats --nkey %s sub 'onebit.>'\n", path, path)
	fmt.Fprintf(&b, "-----BEGIN USER NKEY SEED-----\n%s\n------END USER NKEY SEED------\n", id.seed)
	defer clear(b.Bytes())

	dir := filepath.Dir(path)
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return identity{}, fmt.Errorf("%w: %w", ErrCreds, err)
	}
	tmp, err := os.CreateTemp(dir, "."+filepath.Base(path)+".*")
	if err != nil {
		return identity{}, fmt.Errorf("%w: %w", ErrCreds, err)
	}
	defer os.Remove(tmp.Name())
	_, err = tmp.Write(b.Bytes())
	if err == nil {
		err = tmp.Chmod(0o600) // CreateTemp makes 0600; say it anyway
	}
	if err == nil {
		err = tmp.Sync()
	}
	if cerr := tmp.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return identity{}, fmt.Errorf("%w: write %s: %w", ErrCreds, tmp.Name(), err)
	}
	if err := os.Link(tmp.Name(), path); err != nil {
		if errors.Is(err, fs.ErrExist) {
			return loadSeedFile(path) // another daemon won the race
		}
		return identity{}, fmt.Errorf("%w: %w", ErrCreds, err)
	}
	if d, err := os.Open(dir); err == nil {
		_ = d.Sync()
		_ = d.Close()
	}
	return id, nil
}

// serverUsers are the embedded server's users: the two identities with
// their permissions. Any other connection, in-process or not, is refused.
func (c *credentials) serverUsers() []*server.NkeyUser {
	return []*server.NkeyUser{
		{Nkey: c.daemon.pub, Permissions: daemonPermissions},
		{Nkey: c.reader.pub, Permissions: readerPermissions},
	}
}

// option signs the server's nonce with id's seed (kept in memory: the
// bus's own connections).
func (id identity) option() nats.Option {
	seed := id.seed
	return nats.Nkey(id.pub, func(nonce []byte) ([]byte, error) {
		kp, err := nkeys.FromSeed(seed)
		if err != nil {
			return nil, err
		}
		defer kp.Wipe()
		return kp.Sign(nonce)
	})
}

// Client says how a client of the bus (onebitd watch, replay --stream, a
// dashboard) reaches NATS and proves who it is.
type Client struct {
	URLs string // comma-separated; empty ⇒ DefaultURL
	// CredsFile (--nats-creds) is a NATS credentials file (user JWT and
	// seed, as `nsc` writes them) or an nkey seed file (as the embedded
	// server's ReaderCredsFile); its content tells which.
	CredsFile string
	NKeyFile  string // --nats-nkey: an nkey user seed file
	TLSCA     string // --nats-tls-ca: PEM file of the CA(s) the server's certificate must chain to
	Name      string // connection name shown by the server
}

// Options are the nats.go options of c's identity and TLS.
func (c Client) Options() ([]nats.Option, error) {
	return authOptions(c.CredsFile, c.NKeyFile, c.TLSCA)
}

// Connect connects to c.URLs with c's identity, TLS and name, then extra.
func (c Client) Connect(extra ...nats.Option) (*nats.Conn, error) {
	opts, err := c.Options()
	if err != nil {
		return nil, err
	}
	if c.Name != "" {
		opts = append(opts, nats.Name(c.Name))
	}
	urls := c.URLs
	if urls == "" {
		urls = DefaultURL
	}
	nc, err := nats.Connect(urls, append(opts, extra...)...)
	if err != nil {
		return nil, fmt.Errorf("bus: connect to %s: %w", redactURLs(urls), err)
	}
	return nc, nil
}

// authOptions turns --nats-creds, --nats-nkey and --nats-tls-ca into
// nats.go options, checking each file now so that a typo fails at start.
func authOptions(creds, nkey, tlsCA string) ([]nats.Option, error) {
	var opts []nats.Option
	if creds != "" && nkey != "" {
		return nil, fmt.Errorf("%w: give --nats-creds or --nats-nkey, not both", ErrCreds)
	}
	if creds != "" {
		data, err := os.ReadFile(creds)
		if err != nil {
			return nil, fmt.Errorf("%w: %w", ErrCreds, err)
		}
		isJWT := bytes.Contains(data, []byte("BEGIN NATS USER JWT"))
		clear(data)
		if isJWT {
			opts = append(opts, nats.UserCredentials(creds))
		} else {
			nkey = creds
		}
	}
	if nkey != "" {
		o, err := nats.NkeyOptionFromSeed(nkey)
		if err != nil {
			return nil, fmt.Errorf("%w: %s is neither a NATS credentials file nor an nkey user seed file: %w", ErrCreds, nkey, err)
		}
		opts = append(opts, o)
	}
	if tlsCA != "" {
		opts = append(opts, nats.RootCAs(tlsCA))
	}
	return opts, nil
}

// credsFlagsSet reports whether any client credential flag is set.
func (cfg *Config) credsFlagsSet() []string {
	var set []string
	for _, f := range []struct{ name, v string }{
		{"--nats-creds", cfg.CredsFile}, {"--nats-nkey", cfg.NKeyFile}, {"--nats-tls-ca", cfg.TLSCA},
	} {
		if strings.TrimSpace(f.v) != "" {
			set = append(set, f.name)
		}
	}
	return set
}
