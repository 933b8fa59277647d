package api

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/pandastack/pandastack"
)

// The tokens of a revoked key go, the others stay; the keys with live
// tokens are listed once each, expired tokens not at all.
func TestPortTokensOfAKey(t *testing.T) {
	var tt portTokens
	later := time.Now().Add(time.Hour)
	tt.add("a", portToken{sandbox: "sbx_1", port: 1, expires: later, keyID: "key_1"})
	tt.add("b", portToken{sandbox: "sbx_1", port: 2, expires: later, keyID: "key_1"})
	tt.add("c", portToken{sandbox: "sbx_2", port: 1, expires: later, keyID: "key_2"})
	tt.add("d", portToken{sandbox: "sbx_2", port: 1, expires: time.Now().Add(-time.Second), keyID: "key_3"})
	if got := len(tt.keys()); got != 2 {
		t.Errorf("keys with live tokens: %d, want 2", got)
	}
	if n := tt.revokeKey("key_1"); n != 2 {
		t.Errorf("revoked %d tokens, want 2", n)
	}
	if _, ok := tt.get("a"); ok {
		t.Error("a token of the revoked key still works")
	}
	if _, ok := tt.get("c"); !ok {
		t.Error("another key's token went too")
	}
}

// A request cut by its key's revocation answers with the revocation, not
// with the context error its handler saw; any other error stays.
func TestRevokedErr(t *testing.T) {
	other := errors.New("boom")
	ctx, cancel := context.WithCancelCause(context.Background())
	if got := revokedErr(ctx, other); got != other {
		t.Errorf("live request: %v", got)
	}
	cause := pandastack.Errorf(pandastack.EUnauthorized, "API key pds_x… was revoked")
	cancel(cause)
	if got := revokedErr(ctx, context.Canceled); got != cause {
		t.Errorf("revoked: %v", got)
	}
	hungUp, stop := context.WithCancel(context.Background())
	stop()
	if got := revokedErr(hungUp, context.Canceled); got != context.Canceled {
		t.Errorf("a caller that hung up: %v", got)
	}
	if got := revokedErr(nil, other); got != other {
		t.Errorf("no context: %v", got)
	}
}
