package proxy

import (
	"io"
	"net/http"
	"strings"

	"github.com/llmproxy/llmproxy/lanequeue"
	"github.com/llmproxy/llmproxy/tokens"
)

// laneRequest is what the lane table needs of r (see lanequeue.Request):
// its lane's key, its estimated cost, its priority, the route's unless the
// client's x-llmproxy-priority says otherwise, and the client that
// x-llmproxy-client names. It notes whether r is a WebSocket handshake.
func (p *Proxy) laneRequest(r *http.Request, req *request) (lanequeue.Request, error) {
	req.upgrade = isUpgrade(r)
	prio := p.settings[req.route].Priority
	if v := r.Header.Get(priorityHeader); v != "" {
		if prio.UnmarshalText([]byte(strings.TrimSpace(v))) != nil {
			return lanequeue.Request{}, fail(failBadPriority, "x-llmproxy-priority must be high or low")
		}
	}
	client := r.Header.Get(clientHeader)
	if !validClient(client) {
		return lanequeue.Request{}, fail(failBadClient, "x-llmproxy-client must be a name of 1 to 64 visible ASCII characters, without spaces")
	}
	// One read of the body for its model and its cost. A spooled body is
	// not read for its prompt (that would take it into memory): it
	// reserves the default output, and its answer's usage settles the
	// rest.
	read := tokens.ReadRequest(req.target.Path, req.body.mem)
	switch {
	case req.body.file != nil:
		read.Model = modelOfSpool(req.body.reader())
	case req.upgrade: // the Realtime API names it in the query
		read.Model = r.URL.Query().Get("model")
	}
	return lanequeue.Request{
		Route:      req.route,
		Credential: credential(r.Header, r.URL.RawQuery),
		Path:       req.target.Path,
		Model:      read.Model,
		Cost:       read.Cost,
		Output:     read.Output,
		Priority:   prio,
		Client:     client,
	}, nil
}

// maxClientName is the longest name x-llmproxy-client may give.
const maxClientName = 64

// validClient reports whether name may name a client: at most
// maxClientName bytes, each visible ASCII (no space, no control). "" is
// no name.
func validClient(name string) bool {
	if len(name) > maxClientName {
		return false
	}
	for i := 0; i < len(name); i++ {
		if name[i] <= ' ' || name[i] > '~' {
			return false
		}
	}
	return true
}

// modelOfSpool reads the top-level "model" of a spooled JSON body, ""
// when there is none, through a window of 16 KiB, whatever the body's
// size: every value before it is checked and let go as it is read, and
// what follows it is not read. The key matches as tokens.ReadRequest's
// does (escapes decoded, in any case), but here the first one counts,
// where ReadRequest takes the last: reading on would mean reading the
// rest of the body. A model of more than 1 KiB as written is not read.
func modelOfSpool(r io.Reader) string {
	model, _ := tokens.FirstString(r, "model", 1<<10)
	return model
}

// isUpgrade reports whether r asks to switch to WebSocket.
func isUpgrade(r *http.Request) bool {
	return strings.EqualFold(r.Header.Get("Upgrade"), "websocket") && hasToken(r.Header.Values("Connection"), "upgrade")
}

// hasToken reports whether a comma-separated header holds token.
func hasToken(values []string, token string) bool {
	for _, v := range values {
		for _, t := range strings.Split(v, ",") {
			if strings.EqualFold(strings.TrimSpace(t), token) {
				return true
			}
		}
	}
	return false
}
