package redisstate

// Connect: from Config to a go-redis client of the kind the servers are.
// A standalone server, a Redis Cluster (the URL's hosts are seeds; a
// group's keys share one hash slot, so every script runs on one node) or
// a primary that Sentinels name. TLS, a CA and a client certificate, and
// a password from a file (a mounted secret, read again at every new
// connection so a rotated one is picked up).

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"net"
	"net/url"
	"os"
	"strconv"
	"strings"
	"sync"

	"github.com/redis/go-redis/v9"

	"github.com/llmproxy/llmproxy/internal/setting"
)

// The modes of Config.Mode.
const (
	modeAuto       = "auto"
	modeStandalone = "standalone"
	modeCluster    = "cluster"
	modeSentinel   = "sentinel"
)

// mode is the mode cfg names: Mode, or for auto (or none) sentinel when a
// Sentinel master is named, else auto (the server will say).
func (cfg Config) mode() string {
	m := strings.ToLower(cfg.Mode)
	if m == "" || m == modeAuto {
		if cfg.SentinelMaster != "" {
			return modeSentinel
		}
		return modeAuto
	}
	return m
}

// options is the client's options from cfg, every mode's (the constructor
// picks its part), or a *setting.Error naming the field that is wrong. No
// error quotes the URL: it may hold a password.
func (cfg Config) options() (*redis.UniversalOptions, error) {
	bad := func(field, problem string) error { return setting.Bad("redisstate", field, problem) }
	mode := cfg.mode()
	switch mode {
	case modeAuto, modeStandalone, modeCluster, modeSentinel:
	default:
		return nil, bad("Mode", fmt.Sprintf("%q is not auto, standalone, cluster or sentinel", cfg.Mode))
	}
	u, err := url.Parse(cfg.URL)
	if err != nil || u.Host == "" || u.Opaque != "" {
		return nil, bad("URL", "not a redis://host:port or rediss://host:port URL (the value is not shown: it may hold a password)")
	}
	o := &redis.UniversalOptions{MasterName: cfg.SentinelMaster}
	switch u.Scheme {
	case "redis":
	case "rediss":
		o.TLSConfig = &tls.Config{MinVersion: tls.VersionTLS12, ServerName: u.Hostname()}
	default:
		return nil, bad("URL", "the scheme is not redis:// or rediss:// (the value is not shown: it may hold a password)")
	}
	if o.Addrs, err = addrs(u); err != nil {
		return nil, err
	}
	if db := strings.Trim(u.Path, "/"); db != "" {
		if o.DB, err = strconv.Atoi(db); err != nil || o.DB < 0 {
			return nil, bad("URL", "the path is not a database number")
		}
	}
	// Ifs, not a switch's cases: gremlins counts a case's condition as
	// run by no test, and leaves its mutants untried.
	if mode == modeStandalone && len(o.Addrs) > 1 {
		return nil, bad("URL", "more than one address is for a cluster's seeds or Sentinels, not a standalone server")
	}
	if mode == modeCluster && o.DB != 0 {
		return nil, bad("URL", "a Redis Cluster has only database 0")
	}
	if mode == modeSentinel && cfg.SentinelMaster == "" {
		return nil, bad("SentinelMaster", "missing: sentinel mode needs the name the Sentinels know the primary by")
	}
	if u.User != nil {
		o.Username = u.User.Username()
		o.Password, _ = u.User.Password()
	}
	if err := cfg.secrets(o); err != nil {
		return nil, err
	}
	return o, cfg.tls(o)
}

// addrs are the URL's host (port 6379 when it names none) and its addr
// parameters: more cluster seeds or Sentinels.
func addrs(u *url.URL) ([]string, error) {
	bad := func(problem string) error { return setting.Bad("redisstate", "URL", problem) }
	port := u.Port()
	if port == "" {
		port = "6379"
	}
	all := []string{net.JoinHostPort(u.Hostname(), port)}
	for k, vs := range u.Query() {
		if k != "addr" {
			return nil, bad(fmt.Sprintf("unknown parameter %q (the one parameter is addr=host:port, more cluster seeds or Sentinels)", k))
		}
		for _, a := range vs {
			if _, _, err := net.SplitHostPort(a); err != nil {
				return nil, bad("an addr parameter is not host:port")
			}
			all = append(all, a)
		}
	}
	return all, nil
}

// secrets reads the password files into o: the data nodes' (read again at
// every new connection) and the Sentinels'.
func (cfg Config) secrets(o *redis.UniversalOptions) error {
	if cfg.SentinelPasswordFile != "" {
		pw, err := readSecret(cfg.SentinelPasswordFile)
		if err != nil {
			return setting.Bad("redisstate", "SentinelPasswordFile", err.Error())
		}
		o.SentinelPassword = pw
	}
	if cfg.PasswordFile == "" {
		return nil
	}
	pw, err := readSecret(cfg.PasswordFile)
	if err != nil {
		return setting.Bad("redisstate", "PasswordFile", err.Error())
	}
	user, file := o.Username, cfg.PasswordFile
	var mu sync.Mutex
	last := pw
	o.Password = pw
	o.CredentialsProvider = func() (string, string) {
		mu.Lock()
		defer mu.Unlock()
		// A secret being rotated may be missing for a moment: the last
		// one read is still the best guess.
		if pw, err := readSecret(file); err == nil {
			last = pw
		}
		return user, last
	}
	return nil
}

// readSecret is the password in file, without the line end a secret
// written by hand has. The error names the file, never its content.
func readSecret(file string) (string, error) {
	b, err := os.ReadFile(file)
	if err != nil {
		return "", fmt.Errorf("cannot read %s: %v", file, errors.Unwrap(err))
	}
	pw := strings.TrimRight(string(b), "\r\n")
	if pw == "" {
		return "", fmt.Errorf("%s is empty", file)
	}
	return pw, nil
}

// tls adds cfg's CA and client certificate to o's TLS (rediss://).
func (cfg Config) tls(o *redis.UniversalOptions) error {
	if cfg.CAFile == "" && cfg.CertFile == "" && cfg.KeyFile == "" {
		return nil
	}
	if o.TLSConfig == nil {
		field := "CAFile"
		if cfg.CAFile == "" {
			field = "CertFile"
		}
		return setting.Bad("redisstate", field, "set, but the URL is redis://; TLS is rediss://")
	}
	if cfg.CAFile != "" {
		pem, err := os.ReadFile(cfg.CAFile)
		if err != nil {
			return setting.Bad("redisstate", "CAFile", fmt.Sprintf("cannot read %s: %v", cfg.CAFile, errors.Unwrap(err)))
		}
		pool := x509.NewCertPool()
		if !pool.AppendCertsFromPEM(pem) {
			return setting.Bad("redisstate", "CAFile", cfg.CAFile+" holds no PEM certificate")
		}
		o.TLSConfig.RootCAs = pool
	}
	if (cfg.CertFile == "") != (cfg.KeyFile == "") {
		return setting.Bad("redisstate", "CertFile", "a client certificate needs both CertFile and KeyFile")
	}
	if cfg.CertFile != "" {
		cert, err := tls.LoadX509KeyPair(cfg.CertFile, cfg.KeyFile)
		if err != nil {
			return setting.Bad("redisstate", "CertFile", fmt.Sprintf("cannot load %s with %s: %v", cfg.CertFile, cfg.KeyFile, err))
		}
		o.TLSConfig.Certificates = []tls.Certificate{cert}
	}
	return nil
}

// dial is a client of mode on o (auto dials a standalone client, which
// detect may replace by a cluster's).
func dial(o *redis.UniversalOptions, mode string) redis.UniversalClient {
	switch mode {
	case modeCluster:
		return redis.NewClusterClient(o.Cluster())
	case modeSentinel:
		return redis.NewFailoverClient(o.Failover())
	}
	return redis.NewClient(o.Simple())
}

// detect settles an auto mode: a server that says it is a cluster node
// gets a cluster client in place of the standalone one. The error is the
// client's while the server does not answer (the rejoin pings ask again);
// nil once the mode is settled, or was never auto.
func (s *Store) detect(ctx context.Context) error {
	if !s.undecided.Load() {
		return nil
	}
	info, err := s.rdb().Info(ctx, "cluster").Result()
	var reply redis.Error
	if err != nil && !errors.As(err, &reply) {
		return err
	}
	// Not a cluster node, or one that will not say (an ACL without INFO):
	// a standalone server, and the client stays.
	if err == nil && strings.Contains(info, "cluster_enabled:1") {
		old := s.rdb()
		c := dial(s.opts, modeCluster)
		s.client.Store(&c)
		_ = old.Close()
		s.log.Info("redis is a cluster; following its nodes")
	}
	s.undecided.Store(false)
	return nil
}

// rdb is the client the store talks through.
func (s *Store) rdb() redis.UniversalClient { return *s.client.Load() }
