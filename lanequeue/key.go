package lanequeue

import (
	"crypto/sha256"
	"encoding/hex"

	"github.com/llmproxy/llmproxy/internal/bound"
)

// Key identifies a lane: the route, the credential's hash, the request path
// (without query) and the model. The raw credential is never part of it.
type Key struct {
	Route          string // route name; "" for the default upstream
	CredentialHash string // hex SHA-256 of the credential, or "" when none was sent
	Path           string
	Model          string
}

// NewKey is the key of a request on route that carries credential (""
// when none) to path for model: the credential hashed, path and model
// bounded (see bounded).
func NewKey(route, credential, path, model string) Key {
	return Key{Route: route, CredentialHash: HashCredential(credential), Path: bounded(path), Model: bounded(model)}
}

// HashCredential returns the hex SHA-256 of a credential; "" stays "".
func HashCredential(raw string) string {
	if raw == "" {
		return ""
	}
	sum := sha256.Sum256([]byte(raw))
	var digits [2 * sha256.Size]byte
	hex.Encode(digits[:], sum[:])
	return string(digits[:])
}

// shortLen is how many hex digits of a hash are shown: 48 bits, enough to
// tell lanes apart on a status page, far too few to help guess a key.
const shortLen = 12

// shortKeyHash is the displayable prefix of the credential hash.
func (k Key) shortKeyHash() string {
	if len(k.CredentialHash) < shortLen {
		return k.CredentialHash
	}
	return k.CredentialHash[:shortLen]
}

// ID is the key's short hashed identifier, stable for a given key: what
// its lane is named by, unless another lane of the table had it first
// (see Table.newIDLocked).
func (k Key) ID() string { return k.digest()[:shortLen] }

// digest is the hex SHA-256 of the key's parts.
func (k Key) digest() string {
	h := sha256.New()
	for _, s := range []string{k.Route, k.CredentialHash, k.Path, k.Model} {
		h.Write([]byte(s))
		h.Write([]byte{0})
	}
	return hex.EncodeToString(h.Sum(nil))
}

// groupKey identifies the group a lane belongs to: its route and
// credential, whose lanes take turns and may share limits.
func (k Key) groupKey() string { return k.Route + "\x00" + k.CredentialHash }

// limitKey identifies the upstream limit a lane draws on to begin with.
// Providers count rate limits per credential and model, whatever the
// endpoint, so lanes that differ only in path share one learned request
// and token budget; perCredential (a route whose models share one limit)
// makes it the credential's, whatever the model.
//
// Without a model in the body (multipart uploads, GET polling, upstreams
// that name the model or deployment in the path) nothing says two paths
// share a limit, so each path keeps its own budget.
func (k Key) limitKey(perCredential bool) string {
	switch {
	case perCredential:
		return k.groupKey()
	case k.Model == "":
		return k.Route + "\x00" + k.CredentialHash + "\x00\x00" + k.Path
	}
	return k.Route + "\x00" + k.CredentialHash + "\x00" + k.Model
}

// String is a compact form for logs: no raw credential.
func (k Key) String() string {
	return k.Route + "|" + k.shortKeyHash() + "|" + k.Path + "|" + k.Model
}

// maxField is the longest a path or model may be in a lane key as given;
// longer ones are shortened (see bound.Field).
const maxField = bound.MaxField

// bounded is s as a lane key field (see bound.Field): a client cannot
// make a lane, its metrics labels or /lanes grow with what it sends.
func bounded(s string) string { return bound.Field(s) }
