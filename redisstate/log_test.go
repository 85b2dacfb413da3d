package redisstate

import (
	"bytes"
	"fmt"
	"log/slog"
	"net"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
)

type lockedBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (l *lockedBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (l *lockedBuffer) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}

// TestClientLogLinesGoThroughSlogAtDebug: what go-redis says of its own
// failures (dials to a Redis that is down) reaches the store's slog
// logger at debug, in the proxy's format, not stderr in go-redis's.
func TestClientLogLinesGoThroughSlogAtDebug(t *testing.T) {
	ln, _ := net.Listen("tcp", "127.0.0.1:0")
	url := fmt.Sprintf("redis://%s/0", ln.Addr())
	ln.Close()
	var out lockedBuffer
	st, err := New(Config{URL: url, Logger: slog.New(slog.NewTextHandler(&out, &slog.HandlerOptions{Level: slog.LevelDebug}))})
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	deadline := time.Now().Add(10 * time.Second)
	for !strings.Contains(out.String(), `msg="redis client"`) {
		if time.Now().After(deadline) {
			t.Fatalf("no go-redis line through slog in 10 s:\n%s", out.String())
		}
		st.Shared("g", groupCfg).Admit(time.Now(), 1, false)
		time.Sleep(50 * time.Millisecond)
	}
	for _, line := range strings.Split(out.String(), "\n") {
		if strings.Contains(line, `msg="redis client"`) && !strings.Contains(line, "level=DEBUG") {
			t.Errorf("a go-redis line not at debug: %s", line)
		}
	}
	t.Log(out.String()[:min(len(out.String()), 600)])
}

// TestAClusterNodeIsDetected: in auto mode, a store pointed at a Redis
// Cluster node takes a cluster client (and says so once); at a standalone
// server, or told it is standalone, it keeps the one it has.
func TestAClusterNodeIsDetected(t *testing.T) {
	for _, tc := range []struct {
		args    []string
		mode    string
		cluster bool
	}{{[]string{"--cluster-enabled", "yes"}, "", true}, {[]string{"--cluster-enabled", "yes"}, modeStandalone, false}, {nil, "", false}} {
		srv := startServer(t, tc.args...)
		var out lockedBuffer
		st, err := New(Config{URL: srv.url(), Mode: tc.mode, Logger: slog.New(slog.NewTextHandler(&out, nil))})
		if err != nil {
			t.Fatal(err)
		}
		_, isCluster := st.rdb().(*redis.ClusterClient)
		st.Close()
		if said := strings.Count(out.String(), "redis is a cluster"); isCluster != tc.cluster || said != map[bool]int{true: 1}[tc.cluster] {
			t.Errorf("%v, mode %q: cluster client %v, said so %d times:\n%s", tc.args, tc.mode, isCluster, said, out.String())
		}
	}
}
