package redisstate

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
)

// TestARenewalLeavesPendingLeasesToTheWriter: a permit taken locally
// whose lease the writer has not yet sent is not written by a renewal;
// given back before the writer sends it, it never reaches Redis. (The
// renewal wrote it, and the return, which drops a lease still pending as
// never sent, left it counted in Redis until it expired: a failover test
// found such leases after every permit was back.)
func TestARenewalLeavesPendingLeasesToTheWriter(t *testing.T) {
	t.Parallel()
	srv := startServer(t)
	st := newStore(t, srv.url(), time.Minute)
	sh := st.Shared("g", groupCfg).(*shared)
	// As addLater, but without waking the writer: still pending.
	st.mu.Lock()
	st.adds["pending"], st.leases["pending"] = sh.leases, sh.leases
	st.mu.Unlock()
	if err := st.renew(); err != nil {
		t.Fatal(err)
	}
	st.drop("pending")
	st.returnLater("pending", sh.leases)
	st.flush()
	err := st.rdb().ZScore(context.Background(), sh.leases, "pending").Err()
	if !errors.Is(err, redis.Nil) {
		t.Fatalf("the lease given back before it was sent is in Redis (%v)", err)
	}
}
