// Package lanequeue owns lanes: per-lane FIFO queues, the groups
// of lanes that draw on one upstream limit, and the bounded table that
// holds the lanes. Callers describe each answer in a limit.Report (a
// status and a Verdict, the parsed rate-limit headers, a hint); the
// group's limit state (package limit) learns from it, and this package
// decides who goes next. It reads no HTTP messages and no header formats;
// a Report's status is only counted (429s absorbed, attempts by status).
//
// # Groups and time
//
// The lanes of one route and credential form a group with one mutex: an
// answer is learned from, the group paused and the next requests
// dispatched under that lock, in that order. The lanes with waiters take
// turns; each draws on a limit (a pool), its model's, or one its model
// shares with others of the group: stated (limit.Limits.PerCredential),
// shown by remaining counts that fall by what other models sent
// (sharing.go), or, where the upstream states no counts, by refusals that
// fall on the lanes together (together.go, on trial). Every decision is
// made at a time taken from an injected clock; blocking happens outside
// the lock. There is no ticker: when the head of the queue must wait for
// time (a pause, the pace), the group arms one one-shot timer.
//
// # Clients
//
// Within a lane, requests that name their client (Request.Client) take
// turns by client: one FIFO per client and priority, the clients with
// waiters of a class served one request each in turn, a retry still ahead
// of every later arrival of its class (clients.go). Requests that name none
// are one client of their own, so a lane without names is one FIFO.
package lanequeue
