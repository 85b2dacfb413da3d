package main

import (
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"time"
)

// bodyDeadline bounds how long a request's body may take to arrive: the
// whole of it within timeout of the handler's start, else reading it fails
// and the proxy answers 400 body_read_error. A client trickling its body
// a byte at a time would otherwise hold a connection, and a goroutine, for
// as long as it likes, since the server has no ReadTimeout (that would also
// end the answers, which stream for up to LLMPROXY_MAX_WAIT).
//
// It is a read deadline on the connection, set before the proxy reads the
// body and gone once the body has been read to its end: after that the
// server reads the connection in the background to notice a client that
// leaves, and a deadline passing there would cancel the request and cut
// the answer. net/http clears the deadline itself when it starts that read
// (golang/go#18447); deadlineBody clears it too rather than rely on it.
// Requests without a body get no deadline: their background read is
// already running (golang/go#70834).
func bodyDeadline(next http.Handler, timeout time.Duration) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Body == nil || r.Body == http.NoBody {
			next.ServeHTTP(w, r) // no body: the server already reads ahead
			return
		}
		rc := http.NewResponseController(w)
		if err := rc.SetReadDeadline(time.Now().Add(timeout)); err != nil {
			next.ServeHTTP(w, r)
			return
		}
		// A copy, so the server still sees its own body after the handler
		// and closes a connection whose body was not read to the end.
		r = r.WithContext(r.Context())
		r.Body = &deadlineBody{ReadCloser: r.Body, rc: rc, timeout: timeout}
		next.ServeHTTP(w, r)
	})
}

// deadlineBody clears the read deadline at the end of the body, and names
// the variable when the deadline passes first.
type deadlineBody struct {
	io.ReadCloser
	rc      *http.ResponseController
	timeout time.Duration
	done    bool
}

func (b *deadlineBody) Read(p []byte) (int, error) {
	n, err := b.ReadCloser.Read(p)
	switch {
	case err == io.EOF && !b.done:
		b.done = true
		_ = b.rc.SetReadDeadline(time.Time{})
	case errors.Is(err, os.ErrDeadlineExceeded):
		err = fmt.Errorf("it did not arrive within %v (LLMPROXY_BODY_TIMEOUT)", b.timeout)
	}
	return n, err
}
