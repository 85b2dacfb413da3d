// Package universe draws upstreams at random, for the simulator
// (lanequeue/sim) and e2e/loadbench: each draw is a shape of limit (token
// bucket, fixed window from the first request or aligned to the clock,
// sliding-window log, a concurrency cap, several at once), a rate, a token
// limit that binds or not, a rule for counting a request's tokens that is
// not the proxy's, a dialect in which the limits are spoken of (or not), and
// a load. It is written apart from e2e/mockupstream, which shares the
// proxy's token rule, so that a draw passes because the proxy learned the
// upstream, not because the two agree.
//
// Each draw's ideal is the makespan of an omniscient sender (Ideal): a
// client that knows the true limits and sends each request the instant they
// would admit it. No shape needs a formula of its own.
package universe
