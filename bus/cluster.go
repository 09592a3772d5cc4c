package bus

import (
	"bytes"
	"errors"
	"fmt"
	"net"
	"net/url"
	"os"
	"strconv"
	"strings"

	"github.com/nats-io/nats-server/v2/server"
)

// Embedded cluster (--nats-cluster): the embedded servers of several nodes
// route to each other and run JetStream as one cluster, so that three
// onebitd processes hold a replicated stream without a separate NATS.
const (
	// DefaultClusterListen is where an embedded server listens for routes
	// unless told otherwise (--nats-cluster-listen): loopback, for trying a
	// cluster on one machine.
	DefaultClusterListen = "127.0.0.1:6222"
	// RouteUser is the user name every route presents; the password is the
	// content of the cluster secret file (--nats-cluster-secret), the same
	// on every node.
	RouteUser = "onebit-route"
	// minRouteSecret is the shortest secret accepted (bytes, after
	// trimming): `openssl rand -base64 32` gives 44.
	minRouteSecret = 16
)

// ErrCluster: the embedded cluster's flags do not fit together, or its
// secret file cannot be used.
var ErrCluster = errors.New("bus: bad embedded nats cluster configuration")

// clusterOptions fills opts' cluster part from cfg: the route listener,
// the routes to the other nodes (each carrying RouteUser and the secret)
// and the secret every incoming route must present. A route is a trusted
// server-to-server link (it may carry any subject), hence never without
// the secret.
func clusterOptions(cfg *Config, opts *server.Options) error {
	if cfg.ClusterName == "" {
		if cfg.ClusterRoutes != "" || cfg.ClusterListen != "" || cfg.ClusterSecretFile != "" {
			return fmt.Errorf("%w: --nats-routes, --nats-cluster-listen and --nats-cluster-secret need --nats-cluster NAME", ErrCluster)
		}
		return nil
	}
	if cfg.ClusterName != Token(cfg.ClusterName) || strings.ContainsAny(cfg.ClusterName, ".*>") {
		return fmt.Errorf("%w: cluster name %q must be one word (letters, digits, - or _)", ErrCluster, cfg.ClusterName)
	}
	secret, err := loadRouteSecret(cfg.ClusterSecretFile)
	if err != nil {
		return err
	}
	listen := cfg.ClusterListen
	if listen == "" {
		listen = DefaultClusterListen
	}
	host, p, err := net.SplitHostPort(listen)
	if err != nil {
		return fmt.Errorf("%w: --nats-cluster-listen %q: %w", ErrCluster, listen, err)
	}
	port, err := strconv.Atoi(p)
	if err != nil || port < -1 || port > 65535 {
		return fmt.Errorf("%w: --nats-cluster-listen %q: port must be a number in 0..65535 (0 or -1: random)", ErrCluster, listen)
	}
	if port == 0 {
		port = server.RANDOM_PORT
	}
	if host == "" {
		host = "127.0.0.1"
	}
	opts.Cluster = server.ClusterOpts{
		Name:     cfg.ClusterName,
		Host:     host,
		Port:     port,
		Username: RouteUser,
		Password: secret,
	}
	for _, r := range strings.Split(cfg.ClusterRoutes, ",") {
		r = strings.TrimSpace(r)
		if r == "" {
			continue
		}
		u, err := routeURL(r, secret)
		if err != nil {
			return err
		}
		opts.Routes = append(opts.Routes, u)
	}
	return nil
}

// routeURL parses one --nats-routes entry (nats-route://host:port, or
// host:port) and gives it the route credentials.
func routeURL(s, secret string) (*url.URL, error) {
	if !strings.Contains(s, "://") {
		s = "nats-route://" + s
	}
	u, err := url.Parse(s)
	if err != nil || u.Host == "" || u.Port() == "" {
		return nil, fmt.Errorf("%w: route %q is not nats-route://host:port", ErrCluster, s)
	}
	if u.User != nil {
		return nil, fmt.Errorf("%w: route %q: put the secret in --nats-cluster-secret, not in the URL", ErrCluster, u.Redacted())
	}
	u.User = url.UserPassword(RouteUser, secret)
	return u, nil
}

// loadRouteSecret reads the cluster secret: a file only its owner can
// read, holding at least minRouteSecret bytes (surrounding space ignored).
func loadRouteSecret(path string) (string, error) {
	if path == "" {
		return "", fmt.Errorf("%w: --nats-cluster needs --nats-cluster-secret FILE (the same secret on every node, e.g. openssl rand -base64 32)", ErrCluster)
	}
	fi, err := os.Stat(path)
	if err != nil {
		return "", fmt.Errorf("%w: %w", ErrCluster, err)
	}
	if perm := fi.Mode().Perm(); perm&0o077 != 0 {
		return "", fmt.Errorf("%w: %s has mode %04o (chmod 600 %s)", ErrCredsMode, path, perm, path)
	}
	data, err := os.ReadFile(path)
	if err != nil {
		return "", fmt.Errorf("%w: %w", ErrCluster, err)
	}
	defer clear(data)
	s := bytes.TrimSpace(data)
	if len(s) < minRouteSecret {
		return "", fmt.Errorf("%w: %s holds %d bytes; a route secret needs at least %d", ErrCluster, path, len(s), minRouteSecret)
	}
	if bytes.ContainsAny(s, " \t\r\n") {
		return "", fmt.Errorf("%w: %s: the secret is one word without spaces (base64 or hex)", ErrCluster, path)
	}
	return string(s), nil
}

// ClusterURL is where the embedded server listens for routes ("" when not
// in a cluster): what the other nodes put in --nats-routes.
func (b *Bus) ClusterURL() string {
	if b.srv == nil || b.cfg.ClusterName == "" {
		return ""
	}
	if a := b.srv.ClusterAddr(); a != nil {
		return "nats-route://" + a.String()
	}
	return ""
}
