package storetest

import (
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/pandastack/pandastack"
)

// racers is how many goroutines race for one record.
const racers = 8

// race runs fn(i) for every racer at once and returns their errors.
func race(fn func(i int) error) []error {
	errs := make([]error, racers)
	start := make(chan struct{})
	var wg sync.WaitGroup
	for i := range racers {
		wg.Go(func() {
			<-start
			errs[i] = fn(i)
		})
	}
	close(start)
	wg.Wait()
	return errs
}

// checkOneWinner requires exactly one nil error and EConflict for the rest,
// and returns the winner's index.
func checkOneWinner(t *testing.T, what string, errs []error) int {
	t.Helper()
	winner := -1
	for i, err := range errs {
		switch {
		case err == nil && winner >= 0:
			t.Errorf("%s: racers %d and %d both succeeded", what, winner, i)
		case err == nil:
			winner = i
		case !pandastack.IsCode(err, pandastack.EConflict):
			t.Errorf("%s: racer %d: err = %v, want nil or %s", what, i, err, pandastack.EConflict)
		}
	}
	if winner < 0 {
		t.Fatalf("%s: no racer succeeded", what)
	}
	return winner
}

// Racing creates of one id (or project name) store exactly one record, the
// winner's; every loser is told EConflict.
func testRacingCreates(t *testing.T, s pandastack.Store) {
	ctx := t.Context()
	pw := checkOneWinner(t, "CreateProject of one name", race(func(i int) error {
		return s.CreateProject(ctx, pandastack.Project{ID: fmt.Sprintf("prj_%d", i), Name: "default", CreatedAt: base})
	}))
	project := fmt.Sprintf("prj_%d", pw)
	if p, err := s.ProjectByName(ctx, "default"); err != nil || p.ID != project {
		t.Errorf("ProjectByName = %+v, %v; want the winner %s", p, err, project)
	}

	w := checkOneWinner(t, "CreateSandbox of one id", race(func(i int) error {
		sb := sandbox("sbx_1", i)
		sb.Metadata = map[string]string{"racer": fmt.Sprint(i)}
		return s.CreateSandbox(ctx, sb)
	}))
	if got := mustGet(t, s, "sbx_1"); got.Metadata["racer"] != fmt.Sprint(w) {
		t.Errorf("stored sandbox is racer %s's, want the winner %d's", got.Metadata["racer"], w)
	}
	checkIDs(t, "sandboxes", list(t, s, pandastack.SandboxFilter{}), "sbx_1")

	w = checkOneWinner(t, "CreateSnapshot of one id", race(func(i int) error {
		sn := snapshot("snap_1", i)
		sn.SizeBytes = int64(i)
		return s.CreateSnapshot(ctx, sn)
	}))
	if got := mustGetSnapshot(t, s, "snap_1"); got.SizeBytes != int64(w) {
		t.Errorf("stored snapshot is racer %d's, want the winner %d's", got.SizeBytes, w)
	}

	w = checkOneWinner(t, "CreateAPIKey of one hash", race(func(i int) error {
		return s.CreateAPIKey(ctx, pandastack.APIKey{ID: fmt.Sprintf("key_%d", i), ProjectID: project,
			Name: "k", Prefix: "pds_a", Hash: "h1", CreatedAt: base})
	}))
	if k := mustKeyByHash(t, s, "h1"); k.ID != fmt.Sprintf("key_%d", w) {
		t.Errorf("stored key is %s, want the winner key_%d", k.ID, w)
	}
}

// Racing revokes of one key all succeed and agree: the key keeps one of
// the racers' times, and a later revoke does not move it.
func testRacingRevokes(t *testing.T, s pandastack.Store) {
	ctx := t.Context()
	mustProject(t, s, "prj_1", "default")
	mustKey(t, s, pandastack.APIKey{ID: "key_1", Prefix: "pds_aaaa", Hash: "h1"})
	mustKey(t, s, pandastack.APIKey{ID: "key_2", Prefix: "pds_bbbb", Hash: "h2"})
	at := func(i int) time.Time { return base.Add(time.Duration(i+1) * time.Minute) }
	errs := race(func(i int) error {
		// Half by id, half by prefix: both paths lead to the same row.
		if i%2 == 0 {
			return s.RevokeAPIKey(ctx, "key_1", at(i))
		}
		return s.RevokeAPIKey(ctx, "pds_aa", at(i))
	})
	for i, err := range errs {
		// A prefix racer may find the key already revoked (ENotFound: only
		// unrevoked keys match a prefix); nothing else may fail.
		if err != nil && !(i%2 == 1 && pandastack.IsCode(err, pandastack.ENotFound)) {
			t.Errorf("revoke racer %d: %v", i, err)
		}
	}
	got := mustKeyByHash(t, s, "h1").RevokedAt
	if got == nil {
		t.Fatal("key_1 not revoked after racing revokes")
	}
	matched := false
	for i := range racers {
		if errs[i] == nil && got.Equal(at(i)) {
			matched = true
		}
	}
	if !matched {
		t.Errorf("key_1 RevokedAt = %v, not the time of any successful racer", got)
	}
	if err := s.RevokeAPIKey(ctx, "key_1", base.Add(time.Hour)); err != nil {
		t.Fatal(err)
	}
	checkTimePtr(t, "RevokedAt after a later revoke", mustKeyByHash(t, s, "h1").RevokedAt, got)
	checkIDs(t, "revoked", revokedIDs(t, s), "key_1")
}
