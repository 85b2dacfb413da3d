// Package redistest starts real Redis processes for tests, end-to-end runs
// and benchmarks: a standalone redis-server (Start), a Redis Cluster of
// three primaries with a replica each (StartCluster), a primary and a
// replica watched by three Sentinels (StartSentinel), and the TLS
// material to serve them with (NewTLS).
//
// Every process listens on a free port of 127.0.0.1, works in a temporary
// directory of its own, and is stopped, its directory removed, by Stop.
// Nothing here needs a *testing.T: the functions return errors, so a main
// program can use them too; Need is the one helper for tests.
package redistest

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/redis/go-redis/v9"
)

// RequireEnv set to 1 makes Need fail, not skip, a test whose programs
// are missing (CI sets it).
const RequireEnv = "LLMPROXY_E2E_REQUIRE_REDIS"

// TB is the part of testing.TB that Need uses.
type TB interface {
	Helper()
	Skip(args ...any)
	Fatal(args ...any)
}

// Need skips t unless every program (e.g. "redis-server",
// "redis-sentinel", "redis-cli") is on PATH; with RequireEnv=1 it fails t
// instead.
func Need(t TB, programs ...string) {
	t.Helper()
	for _, p := range programs {
		if _, err := exec.LookPath(p); err != nil {
			msg := p + " not found on PATH; install it (apt-get install redis-server redis-sentinel redis-tools)"
			if os.Getenv(RequireEnv) == "1" {
				t.Fatal(msg + " (" + RequireEnv + "=1)")
			}
			t.Skip(msg)
		}
	}
}

// Options shape a redis-server started by Start (and each node of
// StartCluster and StartSentinel).
type Options struct {
	// Config holds more redis.conf lines ("maxmemory 10mb").
	Config []string
	// TLS, when set, makes the server speak TLS only (port 0, tls-port)
	// with its server certificate.
	TLS *TLS
	// ClientCerts, with TLS, makes the server require a client
	// certificate signed by the CA (tls-auth-clients yes); else clients
	// need none (no).
	ClientCerts bool
	// Password is the default user's password; the harness's own
	// connections authenticate with it. Empty = no password.
	Password string
	// ACL are ACL file lines ("user proxy on >pw ~llmproxy:* +get"): the
	// server loads them from an ACL file in its directory.
	ACL []string
}

// Server is one redis-server (or redis-sentinel) process.
type Server struct {
	// Port is the port it serves on, TLS or not, on 127.0.0.1.
	Port int

	program string
	opt     Options
	extra   func(port int) []string // per-start config lines (a cluster node's bus port)
	dir     string
	conf    string
	cmd     *exec.Cmd
	exited  chan struct{}
	out     *tail
	mu      sync.Mutex
	stopped bool
}

// Start starts a standalone redis-server of opt and waits until it
// answers.
func Start(opt Options) (*Server, error) {
	return start("redis-server", opt, nil, nil)
}

// start starts program with a redis.conf of opt's, extra's lines and
// lines, on a free port, moving to another if someone took it first.
func start(program string, opt Options, lines []string, extra func(port int) []string) (*Server, error) {
	dir, err := os.MkdirTemp("", "redistest-")
	if err != nil {
		return nil, err
	}
	s := &Server{program: program, opt: opt, extra: extra, dir: dir}
	conf, err := s.writeConfig(lines)
	if err != nil {
		os.RemoveAll(dir)
		return nil, err
	}
	s.conf = conf
	for try := 0; ; try++ {
		if s.Port, err = FreePort(); err != nil {
			break
		}
		if err = s.run(); err == nil {
			return s, nil
		}
		// Another process took the port between the search and the bind:
		// another port. Anything else is no better the next time.
		if !errors.Is(err, errExited) || try == 4 {
			break
		}
	}
	os.RemoveAll(dir)
	return nil, err
}

// writeConfig writes the server's redis.conf (without the port, given
// on the command line) and its ACL file.
func (s *Server) writeConfig(lines []string) (string, error) {
	opt := s.opt
	// A replica's first sync starts at once, not after the default 5 s
	// wait for more replicas.
	conf := []string{"bind 127.0.0.1", "dir " + s.dir, `save ""`, "appendonly no", "repl-diskless-sync-delay 0"}
	if opt.TLS != nil {
		auth := "no"
		if opt.ClientCerts {
			auth = "yes"
		}
		conf = append(conf, "tls-cert-file "+opt.TLS.ServerCert, "tls-key-file "+opt.TLS.ServerKey,
			"tls-ca-cert-file "+opt.TLS.CA, "tls-auth-clients "+auth)
	}
	if len(opt.ACL) > 0 {
		acl := opt.ACL
		if opt.Password != "" {
			acl = append([]string{"user default on >" + opt.Password + " ~* &* +@all"}, acl...)
		}
		file := filepath.Join(s.dir, "users.acl")
		if err := os.WriteFile(file, []byte(strings.Join(acl, "\n")+"\n"), 0o600); err != nil {
			return "", err
		}
		conf = append(conf, "aclfile "+file)
	} else if opt.Password != "" {
		conf = append(conf, "requirepass "+opt.Password)
	}
	if opt.Password != "" && s.program == "redis-server" {
		conf = append(conf, "masterauth "+opt.Password) // a replica's link to its primary
	}
	conf = append(conf, opt.Config...)
	conf = append(conf, lines...)
	file := filepath.Join(s.dir, "redis.conf")
	return file, os.WriteFile(file, []byte(strings.Join(conf, "\n")+"\n"), 0o600)
}

var errExited = errors.New("exited at start")

// run starts the process on s.Port and waits until this process, not
// another that holds the port, answers.
func (s *Server) run() error {
	port := "port"
	if s.opt.TLS != nil {
		port = "tls-port"
	}
	conf := s.conf
	if s.extra != nil {
		// A config of this start's own (the lines depend on the port);
		// sentinel rewrites its file, so each start gets a fresh one.
		base, err := os.ReadFile(s.conf)
		if err != nil {
			return err
		}
		conf = s.conf + "." + strconv.Itoa(s.Port)
		more := strings.Join(s.extra(s.Port), "\n") + "\n"
		if err := os.WriteFile(conf, append(base, more...), 0o600); err != nil {
			return err
		}
	}
	args := []string{conf, "--" + port, strconv.Itoa(s.Port)}
	if s.opt.TLS != nil {
		args = append(args, "--port", "0")
	}
	cmd := exec.Command(s.program, args...)
	cmd.Dir = s.dir
	setDeathSignal(cmd)
	s.out = &tail{}
	cmd.Stdout, cmd.Stderr = s.out, s.out
	if err := cmd.Start(); err != nil {
		return err
	}
	exited := make(chan struct{})
	go func() { _ = cmd.Wait(); close(exited) }()
	s.cmd, s.exited = cmd, exited
	mine := fmt.Sprintf("process_id:%d\r\n", cmd.Process.Pid)
	c := s.client(200 * time.Millisecond)
	defer c.Close()
	for deadline := time.Now().Add(10 * time.Second); time.Now().Before(deadline); time.Sleep(20 * time.Millisecond) {
		select {
		case <-exited:
			return fmt.Errorf("%s on port %d: %w (port taken?): %s", s.program, s.Port, errExited, s.out.String())
		default:
		}
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		info, err := c.Info(ctx, "server").Result()
		cancel()
		if err == nil && strings.Contains(info, mine) {
			return nil
		}
	}
	s.signal(syscall.SIGKILL)
	return fmt.Errorf("%s on port %d did not answer within 10s: %s", s.program, s.Port, s.out.String())
}

// Addr is host:port.
func (s *Server) Addr() string { return net.JoinHostPort("127.0.0.1", strconv.Itoa(s.Port)) }

// URL is a redis:// URL of the server (rediss:// with TLS), without
// user or password.
func (s *Server) URL() string {
	if s.opt.TLS != nil {
		return "rediss://" + s.Addr()
	}
	return "redis://" + s.Addr()
}

// Client is a new connection pool to the server as its default user,
// with the client certificate under TLS; the caller closes it.
func (s *Server) Client() *redis.Client { return s.client(time.Second) }

func (s *Server) client(timeout time.Duration) *redis.Client {
	opt := &redis.Options{Addr: s.Addr(), Password: s.opt.Password, DialTimeout: timeout,
		ReadTimeout: timeout, WriteTimeout: timeout, MaxRetries: -1, PoolSize: 2, Protocol: 2}
	if s.opt.TLS != nil {
		opt.TLSConfig = s.opt.TLS.ClientConfig(true)
	}
	return redis.NewClient(opt)
}

// Output is the end of what the process wrote (its log).
func (s *Server) Output() string { return s.out.String() }

// Kill ends the process at once (SIGKILL), as a crash would, and waits
// for it; its directory stays until Stop.
func (s *Server) Kill() error {
	s.signal(syscall.SIGKILL)
	return nil
}

// Stop ends the process (SIGTERM, SIGKILL after 5s) and removes its
// directory. It may be called again, and after Kill.
func (s *Server) Stop() error {
	s.mu.Lock()
	done := s.stopped
	s.stopped = true
	s.mu.Unlock()
	if done {
		return nil
	}
	s.signal(syscall.SIGTERM)
	return os.RemoveAll(s.dir)
}

// signal sends sig to a running process and waits for it to end (at most
// 5 s, then it is killed).
func (s *Server) signal(sig syscall.Signal) {
	if s.cmd == nil {
		return
	}
	select {
	case <-s.exited:
		return
	default:
	}
	_ = s.cmd.Process.Signal(sig)
	select {
	case <-s.exited:
	case <-time.After(5 * time.Second):
		_ = s.cmd.Process.Kill()
		<-s.exited
	}
}

// Alive reports whether the process still runs.
func (s *Server) Alive() bool {
	select {
	case <-s.exited:
		return false
	default:
		return s.cmd != nil
	}
}

// waitFor polls notYet, every 50 ms for at most timeout, until it says
// nothing is missing (""); past timeout it is an error of what and the
// last thing missing.
func waitFor(what string, timeout time.Duration, notYet func() string) error {
	why := "not asked"
	for deadline := time.Now().Add(timeout); time.Now().Before(deadline); time.Sleep(50 * time.Millisecond) {
		if why = notYet(); why == "" {
			return nil
		}
	}
	return fmt.Errorf("redistest: %s after %v: %s", what, timeout, why)
}

// FreePort is a port of 127.0.0.1 that was free a moment ago.
func FreePort() (int, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, err
	}
	defer ln.Close()
	return ln.Addr().(*net.TCPAddr).Port, nil
}

// tail keeps the last 4 KiB written to it.
type tail struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (t *tail) Write(p []byte) (int, error) {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.buf.Write(p)
	if over := t.buf.Len() - 4096; over > 0 {
		t.buf.Next(over)
	}
	return len(p), nil
}

func (t *tail) String() string {
	t.mu.Lock()
	defer t.mu.Unlock()
	return strings.TrimSpace(t.buf.String())
}
