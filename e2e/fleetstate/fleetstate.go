// Package fleetstate reads, for the replica tests and benchmarks, what
// llmproxy replicas keep in Redis: the fleet's set of live replicas (their
// ids) and the leases of the permits they hold, whose members start with
// the id of the replica that took them and a dash. It knows redisstate's
// default key layout ("llmproxy:v2:").
package fleetstate

import (
	"context"
	"strings"

	"github.com/redis/go-redis/v9"
)

// keys lists the keys that match pattern.
func keys(ctx context.Context, rdb redis.Cmdable, pattern string) ([]string, error) {
	var ks []string
	iter := rdb.Scan(ctx, 0, pattern, 100).Iterator()
	for iter.Next(ctx) {
		ks = append(ks, iter.Val())
	}
	return ks, iter.Err()
}

// members is every member of the sorted sets whose keys match pattern.
func members(ctx context.Context, rdb redis.Cmdable, pattern string) ([]string, error) {
	ks, err := keys(ctx, rdb, pattern)
	if err != nil {
		return nil, err
	}
	var ms []string
	for _, k := range ks {
		m, err := rdb.ZRange(ctx, k, 0, -1).Result()
		if err != nil {
			return nil, err
		}
		ms = append(ms, m...)
	}
	return ms, nil
}

// Replicas is the ids in the fleet's set of live replicas.
func Replicas(ctx context.Context, rdb redis.Cmdable) ([]string, error) {
	return members(ctx, rdb, "llmproxy:v2:*replicas")
}

// LeasesOf counts the leases in Redis, over every limit group, expired or
// not, that replica id took.
func LeasesOf(ctx context.Context, rdb redis.Cmdable, id string) (int, error) {
	ms, err := members(ctx, rdb, "llmproxy:v2:*:leases")
	if err != nil {
		return 0, err
	}
	n := 0
	for _, m := range ms {
		if strings.HasPrefix(m, id+"-") {
			n++
		}
	}
	return n, nil
}

// HoldsGroups reports whether the node rdb holds the state of any limit
// group (a key "llmproxy:v2:{g:<group>}<limit>:state"): on a cluster, the
// primary whose slot a group's hash tag falls in.
func HoldsGroups(ctx context.Context, rdb redis.Cmdable) (bool, error) {
	ks, err := keys(ctx, rdb, "llmproxy:v2:{g:*}*:state")
	return len(ks) > 0, err
}
