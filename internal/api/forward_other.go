//go:build !linux

package api

// Elsewhere connections to other nodes have keep-alive probes only: no
// bound on data left unacknowledged (TCP_USER_TIMEOUT is Linux's).
