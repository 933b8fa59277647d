package api

import (
	"context"
	"sync"
	"time"

	"github.com/pandastack/pandastack"
)

// A revoked API key stops working everywhere, not only for new requests:
// the requests it has in flight (a terminal, a followed output, a streamed
// exec or cell, a WebSocket through the port proxy) are cut, and the port
// tokens it made stop opening the port. A revoke through the API does it at
// once; one made elsewhere (`pandastack keys revoke`, another node) within
// keyCheckInterval, while anything of the key is live.

const keyCheckInterval = 2 * time.Second

type keyIDContextKey struct{}

// keyIDOf is the id of the API key that authenticated ctx's request, or "".
func keyIDOf(ctx context.Context) string {
	id, _ := ctx.Value(keyIDContextKey{}).(string)
	return id
}

// liveKeys holds the cancels of the requests in flight, by key id.
type liveKeys struct {
	mu       sync.Mutex
	reqs     cuts
	watching bool
}

// cuts holds the cancels of requests in flight by what let them in (an
// API key's id, a port token), so that its revocation ends them. The zero
// value is ready; its owner locks around it.
type cuts map[string]map[*context.CancelCauseFunc]struct{}

func (c *cuts) add(key string, cancel *context.CancelCauseFunc) {
	if *c == nil {
		*c = cuts{}
	}
	if (*c)[key] == nil {
		(*c)[key] = map[*context.CancelCauseFunc]struct{}{}
	}
	(*c)[key][cancel] = struct{}{}
}

func (c cuts) remove(key string, cancel *context.CancelCauseFunc) {
	delete(c[key], cancel)
	if len(c[key]) == 0 {
		delete(c, key)
	}
}

// cut ends the requests key let in, with cause.
func (c cuts) cut(key string, cause error) {
	for cancel := range c[key] {
		(*cancel)(cause)
	}
	delete(c, key)
}

// track returns ctx, carrying keyID and cut when the key is revoked; done
// ends the tracking.
func (s *Server) trackKey(ctx context.Context, keyID string) (context.Context, func()) {
	ctx, cancel := context.WithCancelCause(context.WithValue(ctx, keyIDContextKey{}, keyID))
	l := &s.live
	l.mu.Lock()
	l.reqs.add(keyID, &cancel)
	s.watchKeysLocked()
	l.mu.Unlock()
	if rec, ok := ctx.Value(recorderKey{}).(*statusRecorder); ok {
		rec.keyCtx = ctx // writeError answers with the revocation
	}
	return ctx, func() {
		l.mu.Lock()
		l.reqs.remove(keyID, &cancel)
		l.mu.Unlock()
		cancel(nil)
	}
}

// revokedErr is the revocation that cut ctx's request, in place of err (a
// context error, to the handler); else err.
func revokedErr(ctx context.Context, err error) error {
	if ctx == nil || ctx.Err() == nil {
		return err
	}
	if c := context.Cause(ctx); pandastack.IsCode(c, pandastack.EUnauthorized) {
		return c
	}
	return err
}

// keyRevoked ends what the key has in flight and drops its port tokens.
func (s *Server) keyRevoked(keyID, prefix string) {
	cause := pandastack.Errorf(pandastack.EUnauthorized, "API key %s… was revoked", prefix)
	s.live.mu.Lock()
	s.live.reqs.cut(keyID, cause)
	s.live.mu.Unlock()
	if n := s.tokens.revokeKey(keyID); n > 0 {
		s.log.Info("port tokens of a revoked API key dropped", "key", keyID, "tokens", n)
	}
}

// watchKeysLocked starts, unless it runs, the loop that looks up the keys
// with something live in the store every keyCheckInterval; it stops once
// no key has anything live. The caller holds s.live.mu.
func (s *Server) watchKeysLocked() {
	if s.live.watching {
		return
	}
	s.live.watching = true
	go func() {
		t := time.NewTicker(keyCheckInterval)
		defer t.Stop()
		for range t.C {
			ids := s.liveKeyIDs()
			if ids == nil {
				return
			}
			ctx, cancel := context.WithTimeout(context.Background(), keyCheckInterval)
			all, err := s.store.ListAPIKeys(ctx)
			cancel()
			if err != nil {
				s.log.Warn("checking API keys for revocations", "err", err)
				continue
			}
			for _, k := range all {
				if ids[k.ID] && k.RevokedAt != nil {
					s.keyRevoked(k.ID, k.Prefix)
				}
			}
		}
	}()
}

// liveKeyIDs are the keys with a request in flight or a port token; nil
// when there are none, and then the watch ends (under the lock, so that a
// request tracked meanwhile starts a new one).
func (s *Server) liveKeyIDs() map[string]bool {
	s.live.mu.Lock()
	defer s.live.mu.Unlock()
	ids := map[string]bool{}
	for id := range s.live.reqs {
		ids[id] = true
	}
	for _, id := range s.tokens.keys() {
		ids[id] = true
	}
	if len(ids) == 0 {
		s.live.watching = false
		return nil
	}
	return ids
}
