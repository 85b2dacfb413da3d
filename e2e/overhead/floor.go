package main

import (
	"fmt"
	"net"
	"net/http"
	"net/http/httputil"
	"net/url"
	"os"
	"os/exec"
	"strconv"
	"time"

	"github.com/llmproxy/llmproxy/upstream"
)

// The go-floor target: the least a Go proxy on net/http does, the
// standard library's httputil.ReverseProxy with llmproxy's transport,
// run as a child process of this command so that its CPU and memory are
// its own. Between it and llmproxy lies what llmproxy adds; between it
// and nginx, what net/http costs.
const floorEnv = "OVERHEAD_FLOOR_UPSTREAM"

// serveFloor runs the go-floor proxy when this process was started as
// one, and reports whether it was.
func serveFloor() bool {
	up := os.Getenv(floorEnv)
	if up == "" {
		return false
	}
	target, err := url.Parse(up)
	if err != nil {
		fmt.Fprintln(os.Stderr, "go-floor:", err)
		os.Exit(1)
	}
	rp := httputil.NewSingleHostReverseProxy(target)
	rp.Transport = upstream.NewTransport()
	srv := &http.Server{Addr: os.Getenv(floorAddrEnv), Handler: rp, ReadHeaderTimeout: 30 * time.Second}
	err = srv.ListenAndServe()
	fmt.Fprintln(os.Stderr, "go-floor:", err)
	os.Exit(1)
	return true
}

// startFloor starts this command again as the go-floor proxy in front of
// upstream, on a free loopback port, and waits until it answers.
func startFloor(upstreamURL string) (*process, error) {
	port, err := freePort()
	if err != nil {
		return nil, err
	}
	self, err := os.Executable()
	if err != nil {
		return nil, err
	}
	addr := net.JoinHostPort("127.0.0.1", strconv.Itoa(port))
	cmd := exec.Command(self)
	cmd.Env = append(cleanEnv(), floorEnv+"="+upstreamURL, floorAddrEnv+"="+addr)
	cmd.Stderr = os.Stderr
	p := &process{cmd: cmd, base: "http://" + addr}
	if err := cmd.Start(); err != nil {
		return nil, err
	}
	return p, p.waitUp()
}

// floorAddrEnv is where the go-floor proxy listens.
const floorAddrEnv = "OVERHEAD_FLOOR_ADDR"
