package main

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"io/fs"
	"os"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/onebitd/onebitd/bus"
	"github.com/onebitd/onebitd/daemon"
)

// defaultStateDir is where `onebitd serve` keeps its state unless told
// otherwise (--state-dir): watch and replay --stream look there for the
// embedded server's reader credentials, so that `make run` then `onebitd
// watch` works without flags.
const defaultStateDir = daemon.DefaultStateDir

// natsFlags are the NATS client flags of watch and replay --stream (and
// any other reader of the bus): where the servers are, who we are, which
// CA signs the servers' certificates.
type natsFlags struct {
	fs     *flag.FlagSet
	client bus.Client
}

// addNATSFlags registers --nats-url (default url), --nats-creds,
// --nats-nkey and --nats-tls-ca on fs.
func addNATSFlags(fs *flag.FlagSet, url string) *natsFlags {
	n := &natsFlags{fs: fs}
	fs.StringVar(&n.client.URLs, "nats-url", url, "NATS server(s), comma-separated")
	fs.StringVar(&n.client.CredsFile, "nats-creds", "",
		"NATS credentials: a .creds file (user JWT + seed) or an nkey seed file\n(default: "+bus.ReaderCredsPath(defaultStateDir)+" if present, the embedded server's reader)")
	fs.StringVar(&n.client.NKeyFile, "nats-nkey", "", "nkey user seed file (instead of --nats-creds)")
	fs.StringVar(&n.client.TLSCA, "nats-tls-ca", "", "PEM file of the CA(s) that sign the NATS servers' certificates (TLS)")
	return n
}

// set reports the NATS flags given on the command line.
func (n *natsFlags) set() []string {
	var set []string
	n.fs.Visit(func(f *flag.Flag) {
		switch f.Name {
		case "nats-url", "nats-creds", "nats-nkey", "nats-tls-ca":
			set = append(set, "--"+f.Name)
		}
	})
	return set
}

// resolve returns the client to connect with, named name: without
// --nats-creds and --nats-nkey, the reader credentials of the default
// state dir when that file exists. from says where the identity came from
// ("" when none is used).
func (n *natsFlags) resolve(name string) (c bus.Client, from string) {
	c = n.client
	c.Name = name
	switch {
	case c.CredsFile != "":
		return c, c.CredsFile
	case c.NKeyFile != "":
		return c, c.NKeyFile
	}
	def := bus.ReaderCredsPath(defaultStateDir)
	if _, err := os.Stat(def); err == nil || !errors.Is(err, fs.ErrNotExist) {
		c.CredsFile = def // a file we cannot read fails loudly in Connect
		return c, def
	}
	return c, ""
}

// connectLive connects a long-lived subscriber (watch, dashboard) that
// reconnects forever and says so on errw, or prints why it cannot connect
// (with a hint about credentials) and returns the error. as names the
// credentials used ("" for none).
func (f *natsFlags) connectLive(cmd string, errw io.Writer) (*nats.Conn, string, error) {
	client, as := f.resolve(cmd)
	nc, err := client.Connect(
		nats.MaxReconnects(-1),
		nats.ReconnectWait(250*time.Millisecond),
		nats.DisconnectErrHandler(func(_ *nats.Conn, err error) {
			if err != nil {
				fmt.Fprintf(errw, "%s: disconnected: %v (reconnecting)\n", cmd, err)
			} else {
				fmt.Fprintf(errw, "%s: disconnected (reconnecting)\n", cmd)
			}
		}),
		nats.ReconnectHandler(func(nc *nats.Conn) {
			fmt.Fprintf(errw, "%s: reconnected to %s\n", cmd, nc.ConnectedUrlRedacted())
		}),
		nats.ErrorHandler(func(_ *nats.Conn, _ *nats.Subscription, err error) {
			// A slow reader: nats.go dropped messages for us.
			fmt.Fprintf(errw, "%s: %v\n", cmd, err)
		}),
	)
	if err != nil {
		hint := "is onebitd serve running? see --nats-url"
		switch {
		case errors.Is(err, nats.ErrAuthorization) && as == "":
			hint = "the server wants credentials: --nats-creds FILE (onebitd serve's is <state-dir>/" + bus.ReaderCredsFile + ")"
		case errors.Is(err, nats.ErrAuthorization):
			hint = "the server refused the credentials of " + as
		case errors.Is(err, bus.ErrCreds):
			hint = "see --nats-creds, --nats-nkey"
		}
		fmt.Fprintf(errw, "%s: cannot reach NATS at %s: %v (%s)\n", cmd, client.URLs, err, hint)
		return nil, as, err
	}
	return nc, as, nil
}
