package main

import (
	"net/http"
	"time"
)

// The HTTP server's own deadlines, for connections rather than requests
// (those have theirs in the API): a client gets 10 s to send its headers,
// and a keep-alive connection between requests is closed after two minutes.
// Without the second, clients that opened connections and went quiet (no
// key needed) held them forever, until serve ran out of descriptors and
// refused everyone (probe P). A WebSocket or a stream in progress is a
// request, not idle, and is not cut.
const (
	headerTimeout   = 10 * time.Second
	idleConnTimeout = 2 * time.Minute
)

func newHTTPServer(h http.Handler) *http.Server {
	return &http.Server{Handler: h, ReadHeaderTimeout: headerTimeout, IdleTimeout: idleConnTimeout}
}
