// Package cost prices what an LLM answer cost and keeps spend against
// budgets.
//
// A Table holds list prices per model and service tier (standard, flex,
// batch, priority), in US dollars per million tokens, read from a data
// file the operator can replace; Table.Cost prices an answer's usage and
// Table.Bound prices the most a request can cost before it is sent.
// Amounts are whole nano-dollars, so that sums over many answers are
// exact and a shared store can add them atomically.
//
// A Ledger keeps the spend of named scopes (a run, a credential, a route)
// and the reservations of requests under way: Reserve takes an upper
// bound before a request is sent, only when every scope's spend plus its
// outstanding reservations plus the bound stays within the scope's cap,
// and Settle replaces the reservation by what the answer cost. Spend so
// never passes a cap. Local is the in-process Ledger; redisstate has one
// that replicas share.
//
// The package reads no requests and makes no HTTP calls; the proxy
// decides what to price and when.
package cost
