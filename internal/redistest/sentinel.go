package redistest

import (
	"context"
	"errors"
	"fmt"
	"net"
	"strconv"
	"strings"
	"time"
)

// Sentinel is a primary and its replica, watched by three redis-sentinel
// processes under one master name with a quorum of two: the primary
// down for one second is replaced by the replica within a few seconds.
type Sentinel struct {
	// Master is the name the Sentinels monitor the primary under.
	Master string
	// Primary and Replica are the data nodes as started; after a
	// failover the roles are swapped (see PrimaryAddr).
	Primary, Replica *Server
	// Sentinels are the three redis-sentinel processes.
	Sentinels []*Server
}

// StartSentinel starts the primary and replica of opt (TLS is not
// supported) and the Sentinels, and waits until every Sentinel knows the
// replica and the other two.
func StartSentinel(master string, opt Options) (*Sentinel, error) {
	if opt.TLS != nil {
		return nil, errors.New("redistest: Sentinel over TLS is not supported")
	}
	s := &Sentinel{Master: master}
	var err error
	if s.Primary, err = start("redis-server", opt, nil, nil); err != nil {
		return nil, err
	}
	s.Replica, err = start("redis-server", opt, []string{"replicaof 127.0.0.1 " + strconv.Itoa(s.Primary.Port)}, nil)
	if err != nil {
		s.Stop()
		return nil, err
	}
	watch := []string{
		"sentinel monitor " + master + " 127.0.0.1 " + strconv.Itoa(s.Primary.Port) + " 2",
		"sentinel down-after-milliseconds " + master + " 1000",
		"sentinel failover-timeout " + master + " 3000",
		"sentinel parallel-syncs " + master + " 1",
	}
	if opt.Password != "" {
		watch = append(watch, "sentinel auth-pass "+master+" "+opt.Password)
	}
	for range 3 {
		sn, err := start("redis-sentinel", Options{}, watch, nil)
		if err != nil {
			s.Stop()
			return nil, err
		}
		s.Sentinels = append(s.Sentinels, sn)
	}
	if err := s.waitWatching(30 * time.Second); err != nil {
		s.Stop()
		return nil, err
	}
	return s, nil
}

// waitWatching waits until the replica is in sync and every Sentinel
// sees it and the two other Sentinels.
func (s *Sentinel) waitWatching(timeout time.Duration) error {
	return waitFor("the Sentinels are not ready", timeout, s.notWatching)
}

func (s *Sentinel) notWatching() string {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	repl, err := call(ctx, s.Replica, "INFO", "replication")
	if err != nil {
		return err.Error()
	}
	if !strings.Contains(repl, "master_link_status:up") {
		return "the replica is not in sync"
	}
	for _, sn := range s.Sentinels {
		cl := sn.Client()
		replicas, err := cl.Do(ctx, "SENTINEL", "REPLICAS", s.Master).Slice()
		if err == nil && len(replicas) == 1 {
			var others []any
			others, err = cl.Do(ctx, "SENTINEL", "SENTINELS", s.Master).Slice()
			if err == nil && len(others) != 2 {
				err = fmt.Errorf("knows %d other Sentinels", len(others))
			}
		} else if err == nil {
			err = fmt.Errorf("knows %d replicas", len(replicas))
		}
		cl.Close()
		if err != nil {
			return fmt.Sprintf("Sentinel %s: %v", sn.Addr(), err)
		}
	}
	return ""
}

// URL is a redis:// URL of the first Sentinel with the two others as
// further addresses (?addr=): what a client given the master name
// connects through.
func (s *Sentinel) URL() string {
	u := "redis://" + s.Sentinels[0].Addr()
	for i, sn := range s.Sentinels[1:] {
		sep := "&"
		if i == 0 {
			sep = "?"
		}
		u += sep + "addr=" + sn.Addr()
	}
	return u
}

// PrimaryAddr is the primary's address as a live Sentinel says.
func (s *Sentinel) PrimaryAddr() (string, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	var err error
	for _, sn := range s.Sentinels {
		if !sn.Alive() {
			continue
		}
		cl := sn.Client()
		var hp []string
		hp, err = cl.Do(ctx, "SENTINEL", "GET-MASTER-ADDR-BY-NAME", s.Master).StringSlice()
		cl.Close()
		if err == nil && len(hp) == 2 {
			return net.JoinHostPort(hp[0], hp[1]), nil
		}
	}
	return "", fmt.Errorf("redistest: no Sentinel names the primary: %v", err)
}

// WaitFailover waits, at most timeout, until every live Sentinel names
// a primary other than old and that node says it is one.
func (s *Sentinel) WaitFailover(old string, timeout time.Duration) (string, error) {
	var addr string
	err := waitFor("no failover from "+old, timeout, func() (why string) {
		addr, why = s.newPrimary(old)
		return why
	})
	return addr, err
}

func (s *Sentinel) newPrimary(old string) (string, string) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	addr := ""
	for _, sn := range s.Sentinels {
		if !sn.Alive() {
			continue
		}
		cl := sn.Client()
		hp, err := cl.Do(ctx, "SENTINEL", "GET-MASTER-ADDR-BY-NAME", s.Master).StringSlice()
		cl.Close()
		if err != nil || len(hp) != 2 {
			return "", fmt.Sprintf("Sentinel %s: %v", sn.Addr(), err)
		}
		a := net.JoinHostPort(hp[0], hp[1])
		if a == old || addr != "" && a != addr {
			return "", fmt.Sprintf("Sentinel %s names %s", sn.Addr(), a)
		}
		addr = a
	}
	for _, n := range []*Server{s.Primary, s.Replica} {
		if n.Addr() != addr {
			continue
		}
		role, err := call(ctx, n, "INFO", "replication")
		if err != nil || !strings.Contains(role, "role:master") {
			return "", fmt.Sprintf("%s is not a primary yet", addr)
		}
		return addr, ""
	}
	return "", fmt.Sprintf("the Sentinels name %s, not a node of the test", addr)
}

// Node is the data node at addr (host:port), nil if none.
func (s *Sentinel) Node(addr string) *Server {
	for _, n := range []*Server{s.Primary, s.Replica} {
		if n != nil && n.Addr() == addr {
			return n
		}
	}
	return nil
}

// Stop stops the Sentinels and the data nodes.
func (s *Sentinel) Stop() error {
	var errs []error
	for _, n := range append(s.Sentinels, s.Primary, s.Replica) {
		if n != nil {
			errs = append(errs, n.Stop())
		}
	}
	return errors.Join(errs...)
}
