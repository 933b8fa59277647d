package main

import (
	"fmt"
	"net"
	"net/http"
	"time"

	"github.com/pandastack/pandastack/internal/metrics"
)

// serveMetrics serves GET /metrics on addr, without an API key (so a
// Prometheus needs no secret): the address should be loopback or a private
// network's. A failure of the server is sent on errc.
func serveMetrics(addr string, series *metrics.Registry, errc chan<- error) (*http.Server, net.Addr, error) {
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, nil, fmt.Errorf("--metrics-listen %s: %w", addr, err)
	}
	mux := http.NewServeMux()
	mux.Handle("/metrics", series.Handler())
	mux.HandleFunc("/", func(w http.ResponseWriter, r *http.Request) {
		http.Error(w, "not found: this address serves /metrics only (the API is at --listen)", http.StatusNotFound)
	})
	hs := &http.Server{Handler: mux, ReadHeaderTimeout: 10 * time.Second, WriteTimeout: time.Minute}
	go func() {
		if err := hs.Serve(ln); err != nil && err != http.ErrServerClosed {
			select {
			case errc <- fmt.Errorf("metrics server: %w", err):
			default: // serve is ending already
			}
		}
	}()
	return hs, ln.Addr(), nil
}

// loopback says whether addr (a listener's) takes connections from this
// host only.
func loopback(addr net.Addr) bool {
	a, ok := addr.(*net.TCPAddr)
	return ok && a.IP.IsLoopback()
}
