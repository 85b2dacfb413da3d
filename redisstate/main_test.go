package redisstate

import (
	"flag"
	"os"
	"testing"
)

// TestMain runs up to eight parallel tests at once unless -parallel says
// otherwise. Most tests here wait on a redis-server of their own, not on
// the CPU, so the default of one per CPU (two on the CI machine) left the
// suite twice as long, and the mutation run, which runs the suite once per
// mutant, with it. Running eight at a time on two cores must not change
// what they find: times are the fake clock's (newFakeStore) where the
// code reads a clock, a test that needs Redis slow holds its replies
// (slowRedis) rather than racing a sleep, and the few left on the wall
// clock (a blip of a second against a 250 ms cutoff) leave it margins.
func TestMain(m *testing.M) {
	flag.Parse()
	set := false
	flag.Visit(func(f *flag.Flag) { set = set || f.Name == "test.parallel" })
	if !set {
		_ = flag.Set("test.parallel", "8")
	}
	os.Exit(m.Run())
}
