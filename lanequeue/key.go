package lanequeue

// Key identifies a lane: the route, the credential's hash, the request path
// (without query) and the model. The raw credential is never part of it.
type Key struct {
	Route          string // route name; "" for the default upstream
	CredentialHash string // hex SHA-256 of the credential, or "" when none was sent
	Path           string
	Model          string
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
