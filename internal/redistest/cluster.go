package redistest

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"time"
)

// Cluster is a Redis Cluster of three primaries with one replica each,
// made by redis-cli --cluster create, with a node timeout of one second:
// a primary killed is replaced by its replica within a few seconds.
type Cluster struct {
	// Nodes are the six nodes in the order given to redis-cli, which makes
	// the first three the primaries at the start.
	Nodes []*Server
	opt   Options
}

// StartCluster starts the six nodes of opt (TLS is not supported), joins
// them, and waits until every node says the cluster is ok and every
// replica is in sync.
func StartCluster(opt Options) (*Cluster, error) {
	if opt.TLS != nil {
		return nil, errors.New("redistest: a cluster over TLS is not supported")
	}
	c := &Cluster{opt: opt}
	// The bus port is a free port of its own: port+10000 may not be.
	bus := func(int) []string {
		p, err := FreePort()
		if err != nil {
			return nil // the node fails to start, and the error says why
		}
		return []string{"cluster-port " + strconv.Itoa(p)}
	}
	lines := []string{"cluster-enabled yes", "cluster-config-file nodes.conf", "cluster-node-timeout 1000"}
	args := []string{"--cluster", "create"}
	for range 6 {
		n, err := start("redis-server", opt, lines, bus)
		if err != nil {
			c.Stop()
			return nil, err
		}
		c.Nodes = append(c.Nodes, n)
		args = append(args, n.Addr())
	}
	cli := exec.Command("redis-cli", append(args, "--cluster-replicas", "1", "--cluster-yes")...)
	cli.Env = os.Environ()
	if opt.Password != "" {
		cli.Env = append(cli.Env, "REDISCLI_AUTH="+opt.Password)
	}
	if out, err := cli.CombinedOutput(); err != nil {
		c.Stop()
		return nil, fmt.Errorf("redis-cli --cluster create: %v: %s", err, out)
	}
	if err := c.WaitOK(30 * time.Second); err != nil {
		c.Stop()
		return nil, err
	}
	return c, nil
}

// Addrs are the live nodes' addresses (host:port).
func (c *Cluster) Addrs() []string {
	var a []string
	for _, n := range c.Nodes {
		if n.Alive() {
			a = append(a, n.Addr())
		}
	}
	return a
}

// URL is a redis:// URL of the first live node with every other live
// node as a further seed (?addr=).
func (c *Cluster) URL() string {
	a := c.Addrs()
	if len(a) == 0 {
		return ""
	}
	return "redis://" + a[0] + "?addr=" + strings.Join(a[1:], "&addr=")
}

// WaitOK waits, at most timeout, until every live node says
// cluster_state:ok with all slots served, knows the five others, and
// every live replica whose primary is alive has its link up.
func (c *Cluster) WaitOK(timeout time.Duration) error {
	return waitFor("the cluster is not ok", timeout, c.notOK)
}

// notOK is why the cluster is not ok yet, "" when it is.
func (c *Cluster) notOK() string {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	for _, n := range c.Nodes {
		if !n.Alive() {
			continue
		}
		info, err := call(ctx, n, "CLUSTER", "INFO")
		if err != nil {
			return err.Error()
		}
		for _, want := range []string{"cluster_state:ok", "cluster_slots_ok:16384", "cluster_known_nodes:6"} {
			if !strings.Contains(info, want) {
				return fmt.Sprintf("node %s has no %s", n.Addr(), want)
			}
		}
		slots, err := c.slotsFrom(n)
		if err != nil {
			return err.Error()
		}
		for _, r := range slots {
			if !r.node.Alive() {
				return fmt.Sprintf("node %s sees slots %d-%d on the dead node %s", n.Addr(), r.start, r.end, r.node.Addr())
			}
		}
		repl, err := call(ctx, n, "INFO", "replication")
		if err != nil {
			return err.Error()
		}
		if strings.Contains(repl, "role:slave") && !strings.Contains(repl, "master_link_status:up") {
			if p := c.node(field(repl, "master_port")); p != nil && p.Alive() {
				return fmt.Sprintf("replica %s not in sync with its primary", n.Addr())
			}
		}
	}
	return ""
}

// call runs one command on n and returns its reply as text.
func call(ctx context.Context, n *Server, args ...any) (string, error) {
	cl := n.Client()
	defer cl.Close()
	v, err := cl.Do(ctx, args...).Text()
	if err != nil {
		return "", fmt.Errorf("%s: %v", n.Addr(), err)
	}
	return v, nil
}

// field is the value of name in an INFO reply.
func field(info, name string) string {
	for _, l := range strings.Split(info, "\r\n") {
		if v, ok := strings.CutPrefix(l, name+":"); ok {
			return v
		}
	}
	return ""
}

func (c *Cluster) node(port string) *Server {
	for _, n := range c.Nodes {
		if strconv.Itoa(n.Port) == port {
			return n
		}
	}
	return nil
}

// Primaries are the live nodes that serve slots now.
func (c *Cluster) Primaries() ([]*Server, error) {
	slots, err := c.slots()
	if err != nil {
		return nil, err
	}
	seen := map[*Server]bool{}
	var out []*Server
	for _, s := range slots {
		if !seen[s.node] {
			seen[s.node] = true
			out = append(out, s.node)
		}
	}
	return out, nil
}

// Owner is the primary that serves key's hash slot now.
func (c *Cluster) Owner(key string) (*Server, error) {
	n := c.live()
	if n == nil {
		return nil, errors.New("redistest: no live node")
	}
	cl := n.Client()
	defer cl.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	slot, err := cl.ClusterKeySlot(ctx, key).Result()
	if err != nil {
		return nil, err
	}
	slots, err := c.slots()
	if err != nil {
		return nil, err
	}
	for _, s := range slots {
		if int64(s.start) <= slot && slot <= int64(s.end) {
			return s.node, nil
		}
	}
	return nil, fmt.Errorf("redistest: no node serves slot %d", slot)
}

type slotRange struct {
	start, end int
	node       *Server
}

// slots are the slot ranges and their primaries, as a live node sees
// them.
func (c *Cluster) slots() ([]slotRange, error) {
	n := c.live()
	if n == nil {
		return nil, errors.New("redistest: no live node")
	}
	return c.slotsFrom(n)
}

// slotsFrom are the slot ranges and their primaries, as n sees them.
func (c *Cluster) slotsFrom(n *Server) ([]slotRange, error) {
	cl := n.Client()
	defer cl.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	ranges, err := cl.ClusterSlots(ctx).Result()
	if err != nil {
		return nil, err
	}
	var out []slotRange
	for _, r := range ranges {
		if len(r.Nodes) == 0 {
			continue
		}
		_, port, _ := strings.Cut(r.Nodes[0].Addr, ":")
		node := c.node(port)
		if node == nil {
			return nil, fmt.Errorf("redistest: slots served by %s, not a node of the cluster", r.Nodes[0].Addr)
		}
		out = append(out, slotRange{start: int(r.Start), end: int(r.End), node: node})
	}
	return out, nil
}

func (c *Cluster) live() *Server {
	for _, n := range c.Nodes {
		if n.Alive() {
			return n
		}
	}
	return nil
}

// Stop stops every node.
func (c *Cluster) Stop() error {
	var errs []error
	for _, n := range c.Nodes {
		errs = append(errs, n.Stop())
	}
	return errors.Join(errs...)
}
