package proxy

import (
	"math"
	"net/http"
	"strconv"
	"strings"
	"time"
)

// The client's say over its own request, in headers the upstream never
// sees (see attempt): x-llmproxy-max-wait shortens the request's deadline
// below MaxWait, as X-Stainless-Timeout does; x-llmproxy-retry: off hands
// the first answer back as the upstream sent it, a refusal or a failure
// included, instead of absorbing it.
const (
	maxWaitHeader = "X-Llmproxy-Max-Wait"
	retryHeader   = "X-Llmproxy-Retry"
)

// clientHeaders are the request headers that speak to the proxy alone.
var clientHeaders = [...]string{priorityHeader, clientHeader, maxWaitHeader, retryHeader}

// say is what the client said in them.
type say struct {
	maxWait  time.Duration // > 0: the time it asks for, before MaxWait caps it
	retryOff bool
}

// readSay reads the client's say from h: x-llmproxy-max-wait, a number of
// seconds above 0 (one past any deadline asks for none shorter);
// x-llmproxy-retry, on (the default) or off, in any case. Any other value
// is an error naming its header.
func readSay(h http.Header) (say, error) {
	var s say
	if v, ok := h[maxWaitHeader]; ok {
		secs, err := strconv.ParseFloat(strings.TrimSpace(v[0]), 64)
		if err != nil || !(secs > 0) || math.IsInf(secs, 1) {
			return say{}, fail(failBadMaxWait, "x-llmproxy-max-wait must be a number of seconds above 0, such as 30 or 2.5")
		}
		s.maxWait = time.Duration(math.MaxInt64)
		if secs < s.maxWait.Seconds() {
			s.maxWait = max(time.Duration(secs*float64(time.Second)), 1)
		}
	}
	if v, ok := h[retryHeader]; ok {
		switch strings.ToLower(strings.TrimSpace(v[0])) {
		case "off":
			s.retryOff = true
		case "on":
		default:
			return say{}, fail(failBadRetry, "x-llmproxy-retry must be on or off")
		}
	}
	return s, nil
}

// priorityHeader is a request's priority within its lane, high or low;
// it is not sent upstream.
const priorityHeader = "X-Llmproxy-Priority"

// clientHeader names the client a request comes from (an eval, a user):
// the clients of a lane take turns. It is not sent upstream.
const clientHeader = "X-Llmproxy-Client"
