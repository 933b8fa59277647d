// Package storetest is the conformance suite every pandastack.Store must
// pass. Only the tests of Store implementations import it.
package storetest

import (
	"context"
	"errors"
	"fmt"
	"reflect"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/pandastack/pandastack"
)

// base is a fixed instant so failures are reproducible.
var base = time.Date(2025, 3, 1, 12, 0, 0, 0, time.UTC)

// Run runs the suite. open must return a new, empty store for each call; Run
// closes every store it opens.
func Run(t *testing.T, open func(t *testing.T) pandastack.Store) {
	tests := []struct {
		name string
		fn   func(t *testing.T, s pandastack.Store)
	}{
		{"Project", testProject},
		{"ProjectConflict", testProjectConflict},
		{"ProjectNotFound", testProjectNotFound},
		{"APIKey", testAPIKey},
		{"APIKeyConflict", testAPIKeyConflict},
		{"APIKeyNotFound", testAPIKeyNotFound},
		{"APIKeyUnknownProject", testAPIKeyUnknownProject},
		{"ListAPIKeys", testListAPIKeys},
		{"RevokeByID", testRevokeByID},
		{"RevokeByPrefix", testRevokeByPrefix},
		{"RevokeIDBeforePrefix", testRevokeIDBeforePrefix},
		{"RevokePrefixIsLiteral", testRevokePrefixIsLiteral},
		{"RevokeNotFound", testRevokeNotFound},
		{"Sandbox", testSandbox},
		{"SandboxConflict", testSandboxConflict},
		{"SandboxProjectIsolation", testSandboxProjectIsolation},
		{"SandboxNotFound", testSandboxNotFound},
		{"Timestamps", testTimestamps},
		{"MetadataNilAndEmpty", testMetadataNilAndEmpty},
		{"ListSandboxes", testListSandboxes},
		{"ListByState", testListByState},
		{"ListPages", testListPages},
		{"ListByMetadata", testListByMetadata},
		{"ListByAwkwardMetadataKeys", testListByAwkwardMetadataKeys},
		{"SetSandboxState", testSetSandboxState},
		{"SetSandboxExpiry", testSetSandboxExpiry},
		{"DeleteSandbox", testDeleteSandbox},
		{"ExpiredSandboxes", testExpiredSandboxes},
		{"PurgeStoppedSandboxes", testPurgeStoppedSandboxes},
		{"PausedSandbox", testPausedSandbox},
		{"ExpiredPausedSandboxes", testExpiredPausedSandboxes},
		{"AutoResume", testAutoResume},
		{"IdleSuspend", testIdleSuspend},
		{"Snapshot", testSnapshot},
		{"SnapshotTimestamps", testSnapshotTimestamps},
		{"SnapshotMetadataNilAndEmpty", testSnapshotMetadataNilAndEmpty},
		{"SnapshotConflict", testSnapshotConflict},
		{"SnapshotProjectIsolation", testSnapshotProjectIsolation},
		{"SnapshotNotFound", testSnapshotNotFound},
		{"DeleteSnapshot", testDeleteSnapshot},
		{"ListSnapshots", testListSnapshots},
		{"ListSnapshotsByMetadata", testListSnapshotsByMetadata},
		{"SnapshotOutlivesSandbox", testSnapshotOutlivesSandbox},
		{"SnapshotCancelledContext", testSnapshotCancelledContext},
		{"Concurrent", testConcurrent},
		{"CancelledContext", testCancelledContext},
		{"RacingCreates", testRacingCreates},
		{"RacingRevokes", testRacingRevokes},
		{"UnstorableTextRefused", testUnstorableTextRefused},
		{"UnstorableTextLookups", testUnstorableTextLookups},
		{"Nodes", testNodes},
		{"HeartbeatSaysWhatItReplaced", testHeartbeatSaysWhatItReplaced},
		{"ListByNode", testListByNode},
		{"ClaimSandboxesOfNoNode", testClaimSandboxesOfNoNode},
		{"PlaceSandbox", testPlaceSandbox},
		{"PlaceByPool", testPlaceByPool},
		{"LoseNodes", testLoseNodes},
		{"ForgetNode", testForgetNode},
		{"RacingPlacements", testRacingPlacements},
		{"History", testHistory},
		{"HistoryTrim", testHistoryTrim},
		{"Origins", testOrigins},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			s := open(t)
			t.Cleanup(func() {
				if err := s.Close(); err != nil {
					t.Errorf("Close: %v", err)
				}
			})
			tc.fn(t, s)
		})
	}
}

// --- fixtures ---

func mustProject(t *testing.T, s pandastack.Store, id, name string) pandastack.Project {
	t.Helper()
	p := pandastack.Project{ID: id, Name: name, CreatedAt: base}
	if err := s.CreateProject(t.Context(), p); err != nil {
		t.Fatalf("CreateProject(%s): %v", id, err)
	}
	return p
}

func mustKey(t *testing.T, s pandastack.Store, k pandastack.APIKey) pandastack.APIKey {
	t.Helper()
	if k.ProjectID == "" {
		k.ProjectID = "prj_1"
	}
	if k.Hash == "" {
		k.Hash = "hash-" + k.ID
	}
	if k.Name == "" {
		k.Name = "key " + k.ID
	}
	if k.CreatedAt.IsZero() {
		k.CreatedAt = base
	}
	if err := s.CreateAPIKey(t.Context(), k); err != nil {
		t.Fatalf("CreateAPIKey(%s): %v", k.ID, err)
	}
	return k
}

// sandbox returns a running sandbox of prj_1 created at base+minute.
func sandbox(id string, minute int) pandastack.Sandbox {
	created := base.Add(time.Duration(minute) * time.Minute)
	return pandastack.Sandbox{
		ID:        id,
		ProjectID: "prj_1",
		Template:  "python",
		State:     pandastack.StateRunning,
		Metadata:  map[string]string{},
		CPU:       1,
		MemoryMB:  512,
		CreatedAt: created,
		ExpiresAt: created.Add(time.Hour),
	}
}

func mustSandbox(t *testing.T, s pandastack.Store, sb pandastack.Sandbox) {
	t.Helper()
	if err := s.CreateSandbox(t.Context(), sb); err != nil {
		t.Fatalf("CreateSandbox(%s): %v", sb.ID, err)
	}
}

func mustGet(t *testing.T, s pandastack.Store, id string) pandastack.Sandbox {
	t.Helper()
	got, err := s.GetSandbox(t.Context(), "", id)
	if err != nil {
		t.Fatalf("GetSandbox(%s): %v", id, err)
	}
	return got
}

func mustKeyByHash(t *testing.T, s pandastack.Store, hash string) pandastack.APIKey {
	t.Helper()
	k, err := s.APIKeyByHash(t.Context(), hash)
	if err != nil {
		t.Fatalf("APIKeyByHash(%s): %v", hash, err)
	}
	return k
}

// --- comparison ---

// stored is what a store must return for t: millisecond precision, UTC.
func stored(t time.Time) time.Time { return t.Truncate(time.Millisecond).UTC() }

func checkTime(t *testing.T, what string, got, want time.Time) {
	t.Helper()
	if !got.Equal(stored(want)) {
		t.Errorf("%s = %v, want %v", what, got, stored(want))
	}
	if got.Location() != time.UTC {
		t.Errorf("%s location = %v, want UTC", what, got.Location())
	}
}

func checkTimePtr(t *testing.T, what string, got, want *time.Time) {
	t.Helper()
	switch {
	case got == nil && want == nil:
	case got == nil || want == nil:
		t.Errorf("%s = %v, want %v", what, fmtPtr(got), fmtPtr(want))
	default:
		checkTime(t, what, *got, *want)
	}
}

func fmtPtr(p *time.Time) string {
	if p == nil {
		return "nil"
	}
	return p.String()
}

func checkSandbox(t *testing.T, got, want pandastack.Sandbox) {
	t.Helper()
	if got.ID != want.ID || got.ProjectID != want.ProjectID || got.Template != want.Template ||
		got.State != want.State || got.CPU != want.CPU || got.MemoryMB != want.MemoryMB ||
		got.StopReason != want.StopReason || got.AutoResume != want.AutoResume ||
		got.IdleTimeoutSeconds != want.IdleTimeoutSeconds || got.PauseReason != want.PauseReason ||
		got.RootFS != want.RootFS || got.NodeID != want.NodeID {
		t.Errorf("sandbox = %+v\nwant %+v", got, want)
	}
	checkMetadata(t, "sandbox "+want.ID, got.Metadata, want.Metadata)
	checkTime(t, want.ID+" CreatedAt", got.CreatedAt, want.CreatedAt)
	checkTime(t, want.ID+" ExpiresAt", got.ExpiresAt, want.ExpiresAt)
	checkTimePtr(t, want.ID+" StoppedAt", got.StoppedAt, want.StoppedAt)
}

// checkMetadata requires got to be non-nil and to hold exactly want's entries.
func checkMetadata(t *testing.T, what string, got, want map[string]string) {
	t.Helper()
	if got == nil {
		t.Errorf("%s: Metadata is nil, want a non-nil map", what)
	}
	if len(got) != len(want) {
		t.Errorf("%s: Metadata = %q, want %q", what, got, want)
		return
	}
	for k, v := range want {
		if gv, ok := got[k]; !ok || gv != v {
			t.Errorf("%s: Metadata = %q, want %q", what, got, want)
			return
		}
	}
}

func checkSnapshot(t *testing.T, got, want pandastack.Snapshot) {
	t.Helper()
	if got.ID != want.ID || got.ProjectID != want.ProjectID || got.SandboxID != want.SandboxID ||
		got.Template != want.Template || got.SizeBytes != want.SizeBytes ||
		got.CPU != want.CPU || got.MemoryMB != want.MemoryMB {
		t.Errorf("snapshot = %+v\nwant %+v", got, want)
	}
	checkMetadata(t, "snapshot "+want.ID, got.Metadata, want.Metadata)
	checkTime(t, want.ID+" CreatedAt", got.CreatedAt, want.CreatedAt)
	if !reflect.DeepEqual(got.Network, want.Network) {
		t.Errorf("snapshot %s network = %+v, want %+v", want.ID, got.Network, want.Network)
	}
}

func checkKey(t *testing.T, got, want pandastack.APIKey) {
	t.Helper()
	if got.ID != want.ID || got.ProjectID != want.ProjectID || got.Name != want.Name ||
		got.Prefix != want.Prefix || got.Hash != want.Hash {
		t.Errorf("key = %+v\nwant %+v", got, want)
	}
	checkTime(t, want.ID+" CreatedAt", got.CreatedAt, want.CreatedAt)
	checkTimePtr(t, want.ID+" RevokedAt", got.RevokedAt, want.RevokedAt)
}

func checkCode(t *testing.T, what string, err error, code string) {
	t.Helper()
	if !pandastack.IsCode(err, code) {
		t.Errorf("%s: err = %v, want code %s", what, err, code)
	}
}

func ids(sbs []pandastack.Sandbox) []string {
	out := make([]string, len(sbs))
	for i, s := range sbs {
		out[i] = s.ID
	}
	return out
}

func list(t *testing.T, s pandastack.Store, f pandastack.SandboxFilter) []string {
	t.Helper()
	got, err := s.ListSandboxes(t.Context(), f)
	if err != nil {
		t.Fatalf("ListSandboxes(%+v): %v", f, err)
	}
	return ids(got)
}

func checkIDs(t *testing.T, what string, got []string, want ...string) {
	t.Helper()
	if !slices.Equal(got, want) && !(len(got) == 0 && len(want) == 0) {
		t.Errorf("%s = %q, want %q", what, got, want)
	}
}

func revokedIDs(t *testing.T, s pandastack.Store) []string {
	t.Helper()
	keys, err := s.ListAPIKeys(t.Context())
	if err != nil {
		t.Fatalf("ListAPIKeys: %v", err)
	}
	var out []string
	for _, k := range keys {
		if k.RevokedAt != nil {
			out = append(out, k.ID)
		}
	}
	slices.Sort(out)
	return out
}

// --- projects ---

func testProject(t *testing.T, s pandastack.Store) {
	want := mustProject(t, s, "prj_1", "default")
	mustProject(t, s, "prj_2", "other")
	got, err := s.ProjectByName(t.Context(), "default")
	if err != nil {
		t.Fatalf("ProjectByName: %v", err)
	}
	if got.ID != want.ID || got.Name != want.Name {
		t.Errorf("ProjectByName = %+v, want %+v", got, want)
	}
	checkTime(t, "CreatedAt", got.CreatedAt, want.CreatedAt)
	all, err := s.ListProjects(t.Context())
	if err != nil {
		t.Fatalf("ListProjects: %v", err)
	}
	if len(all) != 2 || all[0].ID != "prj_1" || all[0].Name != "default" || all[1].ID != "prj_2" || all[1].Name != "other" {
		t.Errorf("ListProjects = %+v, want default then other", all)
	}
}

func testProjectConflict(t *testing.T, s pandastack.Store) {
	mustProject(t, s, "prj_1", "default")
	err := s.CreateProject(t.Context(), pandastack.Project{ID: "prj_2", Name: "default", CreatedAt: base})
	checkCode(t, "duplicate name", err, pandastack.EConflict)
	err = s.CreateProject(t.Context(), pandastack.Project{ID: "prj_1", Name: "another", CreatedAt: base})
	checkCode(t, "duplicate id", err, pandastack.EConflict)
	if _, err := s.ProjectByName(t.Context(), "another"); !pandastack.IsCode(err, pandastack.ENotFound) {
		t.Errorf("a rejected project was stored: ProjectByName err = %v", err)
	}
}

func testProjectNotFound(t *testing.T, s pandastack.Store) {
	mustProject(t, s, "prj_1", "default")
	_, err := s.ProjectByName(t.Context(), "nope")
	checkCode(t, "ProjectByName(nope)", err, pandastack.ENotFound)
	_, err = s.ProjectByName(t.Context(), "DEFAULT")
	checkCode(t, "ProjectByName is case-sensitive", err, pandastack.ENotFound)
	// A name of 100 kB is not echoed whole in the error.
	_, err = s.GetSandbox(t.Context(), "prj_1", "sbx_"+strings.Repeat("a", 100000))
	checkCode(t, "GetSandbox(a 100 kB id)", err, pandastack.ENotFound)
	if err != nil && len(err.Error()) > 200 {
		t.Errorf("the not-found error of a 100 kB id is %d bytes long", len(err.Error()))
	}
}

// --- API keys ---

func testAPIKey(t *testing.T, s pandastack.Store) {
	mustProject(t, s, "prj_1", "default")
	want := mustKey(t, s, pandastack.APIKey{ID: "key_1", Name: "ci", Prefix: "pds_abcd", Hash: "h1"})
	mustKey(t, s, pandastack.APIKey{ID: "key_2", Prefix: "pds_efgh", Hash: "h2", Scope: pandastack.ScopeSandboxes})
	checkKey(t, mustKeyByHash(t, s, "h1"), want)
	// A key made without a scope may do everything; a scope is kept.
	if got := mustKeyByHash(t, s, "h1").Scope; got != pandastack.ScopeAll {
		t.Errorf("the scope of a key made without one: %q, want %q", got, pandastack.ScopeAll)
	}
	if got := mustKeyByHash(t, s, "h2").Scope; got != pandastack.ScopeSandboxes {
		t.Errorf("a key's scope: %q, want %q", got, pandastack.ScopeSandboxes)
	}
}

func testAPIKeyConflict(t *testing.T, s pandastack.Store) {
	mustProject(t, s, "prj_1", "default")
	mustKey(t, s, pandastack.APIKey{ID: "key_1", Prefix: "pds_a", Hash: "h1"})
	err := s.CreateAPIKey(t.Context(), pandastack.APIKey{ID: "key_2", ProjectID: "prj_1", Prefix: "pds_b", Hash: "h1", CreatedAt: base})
	checkCode(t, "duplicate hash", err, pandastack.EConflict)
	err = s.CreateAPIKey(t.Context(), pandastack.APIKey{ID: "key_1", ProjectID: "prj_1", Prefix: "pds_c", Hash: "h3", CreatedAt: base})
	checkCode(t, "duplicate id", err, pandastack.EConflict)
	keys, err := s.ListAPIKeys(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	if len(keys) != 1 {
		t.Errorf("after rejected creates ListAPIKeys has %d keys, want 1", len(keys))
	}
}

func testAPIKeyNotFound(t *testing.T, s pandastack.Store) {
	mustProject(t, s, "prj_1", "default")
	mustKey(t, s, pandastack.APIKey{ID: "key_1", Prefix: "pds_a", Hash: "h1"})
	_, err := s.APIKeyByHash(t.Context(), "h2")
	checkCode(t, "APIKeyByHash(unknown)", err, pandastack.ENotFound)
}

// A key names its project; an unknown one is ENotFound and stores nothing.
func testAPIKeyUnknownProject(t *testing.T, s pandastack.Store) {
	err := s.CreateAPIKey(t.Context(), pandastack.APIKey{ID: "key_1", ProjectID: "prj_nope", Prefix: "pds_a", Hash: "h1", CreatedAt: base})
	checkCode(t, "CreateAPIKey(unknown project)", err, pandastack.ENotFound)
	if _, err := s.APIKeyByHash(t.Context(), "h1"); !pandastack.IsCode(err, pandastack.ENotFound) {
		t.Errorf("key of an unknown project was stored: APIKeyByHash err = %v", err)
	}
}

func testListAPIKeys(t *testing.T, s pandastack.Store) {
	keys, err := s.ListAPIKeys(t.Context())
	if err != nil {
		t.Fatalf("ListAPIKeys on an empty store: %v", err)
	}
	if len(keys) != 0 {
		t.Errorf("ListAPIKeys on an empty store = %+v", keys)
	}
	mustProject(t, s, "prj_1", "default")
	mustProject(t, s, "prj_2", "other")
	// Inserted out of order, so insertion order cannot pass for age.
	k3 := mustKey(t, s, pandastack.APIKey{ID: "key_3", Prefix: "pds_c", CreatedAt: base.Add(3 * time.Second)})
	k1 := mustKey(t, s, pandastack.APIKey{ID: "key_1", Prefix: "pds_a", CreatedAt: base.Add(1 * time.Second)})
	k2 := mustKey(t, s, pandastack.APIKey{ID: "key_2", ProjectID: "prj_2", Prefix: "pds_b", CreatedAt: base.Add(2 * time.Second)})
	keys, err = s.ListAPIKeys(t.Context())
	if err != nil {
		t.Fatalf("ListAPIKeys: %v", err)
	}
	want := []pandastack.APIKey{k1, k2, k3}
	if len(keys) != len(want) {
		t.Fatalf("ListAPIKeys returned %d keys, want %d", len(keys), len(want))
	}
	for i := range want {
		checkKey(t, keys[i], want[i])
	}
}

func testRevokeByID(t *testing.T, s pandastack.Store) {
	mustProject(t, s, "prj_1", "default")
	mustKey(t, s, pandastack.APIKey{ID: "key_1", Prefix: "pds_aaaa", Hash: "h1"})
	mustKey(t, s, pandastack.APIKey{ID: "key_2", Prefix: "pds_aaab", Hash: "h2"})
	at := base.Add(time.Hour + 1234567*time.Nanosecond)
	if err := s.RevokeAPIKey(t.Context(), "key_1", at); err != nil {
		t.Fatalf("RevokeAPIKey(key_1): %v", err)
	}
	got := mustKeyByHash(t, s, "h1")
	checkTimePtr(t, "RevokedAt", got.RevokedAt, &at)
	if k := mustKeyByHash(t, s, "h2"); k.RevokedAt != nil {
		t.Errorf("revoking key_1 revoked key_2 too")
	}
}

func testRevokeByPrefix(t *testing.T, s pandastack.Store) {
	ctx := t.Context()
	mustProject(t, s, "prj_1", "default")
	mustKey(t, s, pandastack.APIKey{ID: "key_1", Prefix: "pds_aaaa1111", Hash: "h1"})
	mustKey(t, s, pandastack.APIKey{ID: "key_2", Prefix: "pds_aaaa2222", Hash: "h2"})
	mustKey(t, s, pandastack.APIKey{ID: "key_3", Prefix: "pds_bbbb3333", Hash: "h3"})
	at := base.Add(time.Hour)

	err := s.RevokeAPIKey(ctx, "pds_aaaa", at)
	checkCode(t, "ambiguous prefix", err, pandastack.EInvalid)
	checkIDs(t, "revoked after an ambiguous prefix", revokedIDs(t, s))

	err = s.RevokeAPIKey(ctx, "", at)
	checkCode(t, "empty prefix", err, pandastack.EInvalid)
	checkIDs(t, "revoked after an empty prefix", revokedIDs(t, s))

	if err := s.RevokeAPIKey(ctx, "pds_b", at); err != nil {
		t.Fatalf("RevokeAPIKey(pds_b): %v", err)
	}
	checkIDs(t, "revoked after pds_b", revokedIDs(t, s), "key_3")
	checkTimePtr(t, "key_3 RevokedAt", mustKeyByHash(t, s, "h3").RevokedAt, &at)

	// A full prefix is a prefix of itself.
	if err := s.RevokeAPIKey(ctx, "pds_aaaa1111", at); err != nil {
		t.Fatalf("RevokeAPIKey(pds_aaaa1111): %v", err)
	}
	checkIDs(t, "revoked after pds_aaaa1111", revokedIDs(t, s), "key_1", "key_3")

	// Revoked keys no longer count, so the prefix is now unique.
	if err := s.RevokeAPIKey(ctx, "pds_aaaa", at); err != nil {
		t.Fatalf("RevokeAPIKey(pds_aaaa) with one unrevoked match: %v", err)
	}
	checkIDs(t, "revoked after pds_aaaa", revokedIDs(t, s), "key_1", "key_2", "key_3")

	// Only unrevoked keys match a prefix.
	err = s.RevokeAPIKey(ctx, "pds_bbbb", at)
	checkCode(t, "prefix of a revoked key", err, pandastack.ENotFound)
}

func testRevokeIDBeforePrefix(t *testing.T, s pandastack.Store) {
	mustProject(t, s, "prj_1", "default")
	mustKey(t, s, pandastack.APIKey{ID: "pds_x", Prefix: "pds_y", Hash: "h1"})
	mustKey(t, s, pandastack.APIKey{ID: "key_2", Prefix: "pds_x1", Hash: "h2"})
	mustKey(t, s, pandastack.APIKey{ID: "key_3", Prefix: "pds_x2", Hash: "h3"})
	// "pds_x" is both an id and an ambiguous prefix; the id wins.
	if err := s.RevokeAPIKey(t.Context(), "pds_x", base); err != nil {
		t.Fatalf("RevokeAPIKey(pds_x): %v", err)
	}
	checkIDs(t, "revoked", revokedIDs(t, s), "pds_x")
}

// A prefix is matched literally, never as a LIKE or glob pattern.
func testRevokePrefixIsLiteral(t *testing.T, s pandastack.Store) {
	mustProject(t, s, "prj_1", "default")
	mustKey(t, s, pandastack.APIKey{ID: "key_1", Prefix: "pds_a%c", Hash: "h1"})
	mustKey(t, s, pandastack.APIKey{ID: "key_2", Prefix: "pds_abc", Hash: "h2"})
	mustKey(t, s, pandastack.APIKey{ID: "key_3", Prefix: "pds_a*c", Hash: "h3"})
	mustKey(t, s, pandastack.APIKey{ID: "key_4", Prefix: "PDS_A_C", Hash: "h4"})
	if err := s.RevokeAPIKey(t.Context(), "pds_a%", base); err != nil {
		t.Fatalf("RevokeAPIKey(pds_a%%): %v", err)
	}
	checkIDs(t, "revoked after pds_a%", revokedIDs(t, s), "key_1")
	if err := s.RevokeAPIKey(t.Context(), "pds_a*", base); err != nil {
		t.Fatalf("RevokeAPIKey(pds_a*): %v", err)
	}
	checkIDs(t, "revoked after pds_a*", revokedIDs(t, s), "key_1", "key_3")
	err := s.RevokeAPIKey(t.Context(), "pds_a_", base)
	checkCode(t, "pds_a_ matches nothing", err, pandastack.ENotFound)
	checkIDs(t, "revoked after pds_a_", revokedIDs(t, s), "key_1", "key_3")
}

func testRevokeNotFound(t *testing.T, s pandastack.Store) {
	mustProject(t, s, "prj_1", "default")
	mustKey(t, s, pandastack.APIKey{ID: "key_1", Prefix: "pds_aaaa", Hash: "h1"})
	err := s.RevokeAPIKey(t.Context(), "pds_zzzz", base)
	checkCode(t, "RevokeAPIKey(unknown)", err, pandastack.ENotFound)
	err = s.RevokeAPIKey(t.Context(), "key_9", base)
	checkCode(t, "RevokeAPIKey(unknown id)", err, pandastack.ENotFound)
	// With a single key, an empty prefix would be "unique"; it must not count.
	err = s.RevokeAPIKey(t.Context(), "", base)
	checkCode(t, "RevokeAPIKey(\"\") with one key", err, pandastack.EInvalid)
	checkIDs(t, "revoked", revokedIDs(t, s))
}

// --- sandboxes ---

func testSandbox(t *testing.T, s pandastack.Store) {
	want := sandbox("sbx_1", 0)
	want.Template = "node"
	want.State = pandastack.StateStarting
	want.CPU = 4
	want.MemoryMB = 2048
	want.Metadata = map[string]string{"user": "ada", "run": "42"}
	mustSandbox(t, s, want)
	mustSandbox(t, s, sandbox("sbx_2", 1))

	got, err := s.GetSandbox(t.Context(), "prj_1", "sbx_1")
	if err != nil {
		t.Fatalf("GetSandbox: %v", err)
	}
	checkSandbox(t, got, want)
	checkSandbox(t, mustGet(t, s, "sbx_1"), want)

	// A caller mutating the map it passed in must not change the record.
	want.Metadata["user"] = "eve"
	if got := mustGet(t, s, "sbx_1"); got.Metadata["user"] != "ada" {
		t.Errorf("stored metadata follows the caller's map: user = %q", got.Metadata["user"])
	}
}

func testSandboxConflict(t *testing.T, s pandastack.Store) {
	orig := sandbox("sbx_1", 0)
	mustSandbox(t, s, orig)
	dup := sandbox("sbx_1", 5)
	dup.ProjectID = "prj_2"
	dup.Template = "other"
	err := s.CreateSandbox(t.Context(), dup)
	checkCode(t, "duplicate id", err, pandastack.EConflict)
	checkSandbox(t, mustGet(t, s, "sbx_1"), orig)
}

func testSandboxProjectIsolation(t *testing.T, s pandastack.Store) {
	a := sandbox("sbx_a", 0)
	b := sandbox("sbx_b", 1)
	b.ProjectID = "prj_2"
	mustSandbox(t, s, a)
	mustSandbox(t, s, b)

	_, err := s.GetSandbox(t.Context(), "prj_1", "sbx_b")
	checkCode(t, "GetSandbox of another project", err, pandastack.ENotFound)
	got, err := s.GetSandbox(t.Context(), "prj_2", "sbx_b")
	if err != nil {
		t.Fatalf("GetSandbox(prj_2, sbx_b): %v", err)
	}
	checkSandbox(t, got, b)

	checkIDs(t, "prj_1", list(t, s, pandastack.SandboxFilter{ProjectID: "prj_1"}), "sbx_a")
	checkIDs(t, "prj_2", list(t, s, pandastack.SandboxFilter{ProjectID: "prj_2"}), "sbx_b")
	checkIDs(t, "prj_3", list(t, s, pandastack.SandboxFilter{ProjectID: "prj_3"}))
	checkIDs(t, "all projects", list(t, s, pandastack.SandboxFilter{}), "sbx_a", "sbx_b")
}

func testSandboxNotFound(t *testing.T, s pandastack.Store) {
	mustSandbox(t, s, sandbox("sbx_1", 0))
	_, err := s.GetSandbox(t.Context(), "", "sbx_2")
	checkCode(t, "GetSandbox(unknown)", err, pandastack.ENotFound)
	_, err = s.GetSandbox(t.Context(), "prj_1", "sbx_2")
	checkCode(t, "GetSandbox(prj_1, unknown)", err, pandastack.ENotFound)
}

func testTimestamps(t *testing.T, s pandastack.Store) {
	ctx := t.Context()
	// Sub-millisecond parts and a zone with a half-hour offset must come
	// back as the same instant, truncated to the millisecond, in UTC.
	zone := time.FixedZone("UTC+5:30", 5*3600+1800)
	t0 := time.Date(2025, 7, 9, 23, 59, 59, 987654321, zone)

	p := pandastack.Project{ID: "prj_1", Name: "default", CreatedAt: t0}
	if err := s.CreateProject(ctx, p); err != nil {
		t.Fatal(err)
	}
	gotP, err := s.ProjectByName(ctx, "default")
	if err != nil {
		t.Fatal(err)
	}
	checkTime(t, "project CreatedAt", gotP.CreatedAt, t0)

	k := mustKey(t, s, pandastack.APIKey{ID: "key_1", Prefix: "pds_a", Hash: "h1", CreatedAt: t0.Add(time.Microsecond)})
	revoked := t0.Add(time.Minute + 999*time.Microsecond)
	if err := s.RevokeAPIKey(ctx, "key_1", revoked); err != nil {
		t.Fatal(err)
	}
	k.RevokedAt = &revoked
	checkKey(t, mustKeyByHash(t, s, "h1"), k)

	sb := sandbox("sbx_1", 0)
	sb.CreatedAt = t0
	sb.ExpiresAt = t0.Add(time.Hour + 500*time.Microsecond)
	mustSandbox(t, s, sb)
	checkSandbox(t, mustGet(t, s, "sbx_1"), sb)

	stopped := t0.Add(2*time.Minute + 1500*time.Microsecond)
	if err := s.SetSandboxState(ctx, "sbx_1", pandastack.StateStopped, pandastack.StopKilled, stopped); err != nil {
		t.Fatal(err)
	}
	sb.State, sb.StopReason, sb.StoppedAt = pandastack.StateStopped, pandastack.StopKilled, &stopped
	checkSandbox(t, mustGet(t, s, "sbx_1"), sb)

	// Dates far from now survive as well.
	far := time.Date(2200, 1, 2, 3, 4, 5, 6_000_000, time.UTC)
	if err := s.SetSandboxExpiry(ctx, "sbx_1", far); err != nil {
		t.Fatal(err)
	}
	checkTime(t, "far ExpiresAt", mustGet(t, s, "sbx_1").ExpiresAt, far)
}

func testMetadataNilAndEmpty(t *testing.T, s pandastack.Store) {
	a := sandbox("sbx_nil", 0)
	a.Metadata = nil
	b := sandbox("sbx_empty", 1)
	b.Metadata = map[string]string{}
	mustSandbox(t, s, a)
	mustSandbox(t, s, b)
	for _, id := range []string{"sbx_nil", "sbx_empty"} {
		got := mustGet(t, s, id)
		if got.Metadata == nil || len(got.Metadata) != 0 {
			t.Errorf("GetSandbox(%s).Metadata = %#v, want an empty non-nil map", id, got.Metadata)
		}
	}
	all, err := s.ListSandboxes(t.Context(), pandastack.SandboxFilter{})
	if err != nil {
		t.Fatal(err)
	}
	for _, got := range all {
		if got.Metadata == nil || len(got.Metadata) != 0 {
			t.Errorf("ListSandboxes: %s.Metadata = %#v, want an empty non-nil map", got.ID, got.Metadata)
		}
	}
}

func testListSandboxes(t *testing.T, s pandastack.Store) {
	checkIDs(t, "empty store", list(t, s, pandastack.SandboxFilter{}))
	// Inserted out of order, so insertion order cannot pass for age.
	want := map[string]pandastack.Sandbox{}
	for _, c := range []struct {
		id     string
		minute int
	}{{"sbx_c", 3}, {"sbx_a", 1}, {"sbx_d", 4}, {"sbx_b", 2}} {
		sb := sandbox(c.id, c.minute)
		sb.Metadata = map[string]string{"n": c.id}
		mustSandbox(t, s, sb)
		want[c.id] = sb
	}
	got, err := s.ListSandboxes(t.Context(), pandastack.SandboxFilter{ProjectID: "prj_1"})
	if err != nil {
		t.Fatal(err)
	}
	checkIDs(t, "oldest first", ids(got), "sbx_a", "sbx_b", "sbx_c", "sbx_d")
	for _, g := range got {
		checkSandbox(t, g, want[g.ID])
	}
	// Zero-length but non-nil filter fields match everything too.
	f := pandastack.SandboxFilter{States: []pandastack.SandboxState{}, Metadata: map[string]string{}}
	checkIDs(t, "empty filter fields", list(t, s, f), "sbx_a", "sbx_b", "sbx_c", "sbx_d")
}

// Pages of a list: oldest or newest first, those of the same millisecond
// by id (byte order), each page after the cursor of the one before, with
// the filters applied; a cursor stays valid when its sandbox is gone.
func testListPages(t *testing.T, s pandastack.Store) {
	// Inserted out of order; sbx_b, sbx_B and sbx_c share a millisecond
	// (byte order puts the upper case first).
	for _, c := range []struct {
		id     string
		minute int
		state  pandastack.SandboxState
	}{{"sbx_c", 2, pandastack.StateStopped}, {"sbx_e", 4, pandastack.StateRunning}, {"sbx_a", 1, pandastack.StateRunning},
		{"sbx_b", 2, pandastack.StateRunning}, {"sbx_d", 3, pandastack.StateStopped}, {"sbx_B", 2, pandastack.StateRunning}} {
		sb := sandbox(c.id, c.minute)
		sb.State = c.state
		mustSandbox(t, s, sb)
	}
	other := sandbox("sbx_other", 2)
	other.ProjectID = "prj_2"
	mustSandbox(t, s, other)
	all := []string{"sbx_a", "sbx_B", "sbx_b", "sbx_c", "sbx_d", "sbx_e"}
	pages := func(f pandastack.SandboxFilter) (out [][]string) {
		t.Helper()
		for range 10 {
			got, err := s.ListSandboxes(t.Context(), f)
			if err != nil {
				t.Fatalf("ListSandboxes(%+v): %v", f, err)
			}
			if len(got) == 0 {
				return out
			}
			out = append(out, ids(got))
			f.After = pandastack.CursorOf(got[len(got)-1])
		}
		t.Fatalf("ListSandboxes(%+v): no end after 10 pages", f)
		return nil
	}
	checkPages := func(what string, got [][]string, want ...[]string) {
		t.Helper()
		if !slices.EqualFunc(got, want, slices.Equal[[]string]) {
			t.Errorf("%s: pages %q, want %q", what, got, want)
		}
	}
	checkIDs(t, "the whole list", list(t, s, pandastack.SandboxFilter{ProjectID: "prj_1"}), all...)
	checkPages("oldest first, 2 a page", pages(pandastack.SandboxFilter{ProjectID: "prj_1", Limit: 2}),
		all[0:2], all[2:4], all[4:6])
	checkPages("oldest first, 4 a page", pages(pandastack.SandboxFilter{ProjectID: "prj_1", Limit: 4}),
		all[0:4], all[4:6])
	rev := slices.Clone(all)
	slices.Reverse(rev)
	checkIDs(t, "newest first", list(t, s, pandastack.SandboxFilter{ProjectID: "prj_1", Newest: true}), rev...)
	checkPages("newest first, 4 a page", pages(pandastack.SandboxFilter{ProjectID: "prj_1", Limit: 4, Newest: true}),
		rev[0:4], rev[4:6])
	checkPages("running ones, 2 a page", pages(pandastack.SandboxFilter{ProjectID: "prj_1", Limit: 2, States: []pandastack.SandboxState{pandastack.StateRunning}}),
		[]string{"sbx_a", "sbx_B"}, []string{"sbx_b", "sbx_e"})
	// A page after a sandbox that is no longer there starts where it was.
	gone := pandastack.SandboxCursor{CreatedAt: base.Add(2 * time.Minute), ID: "sbx_bb"}
	checkIDs(t, "after a place of no sandbox", list(t, s, pandastack.SandboxFilter{ProjectID: "prj_1", After: &gone}), "sbx_c", "sbx_d", "sbx_e")
	checkIDs(t, "before it, newest first", list(t, s, pandastack.SandboxFilter{ProjectID: "prj_1", After: &gone, Newest: true}), "sbx_b", "sbx_B", "sbx_a")
	checkIDs(t, "every project's, after sbx_b", list(t, s, pandastack.SandboxFilter{After: &pandastack.SandboxCursor{CreatedAt: base.Add(2 * time.Minute), ID: "sbx_b"}, Limit: 2}), "sbx_c", "sbx_other")
}

func testListByState(t *testing.T, s pandastack.Store) {
	states := []pandastack.SandboxState{pandastack.StateStarting, pandastack.StateRunning, pandastack.StateStopped, pandastack.StateRunning}
	for i, st := range states {
		sb := sandbox(fmt.Sprintf("sbx_%d", i), i)
		sb.State = st
		mustSandbox(t, s, sb)
	}
	other := sandbox("sbx_other", 9)
	other.ProjectID = "prj_2"
	mustSandbox(t, s, other)

	byStates := func(st ...pandastack.SandboxState) []string {
		return list(t, s, pandastack.SandboxFilter{ProjectID: "prj_1", States: st})
	}
	checkIDs(t, "running", byStates(pandastack.StateRunning), "sbx_1", "sbx_3")
	checkIDs(t, "stopped", byStates(pandastack.StateStopped), "sbx_2")
	checkIDs(t, "starting|stopped", byStates(pandastack.StateStarting, pandastack.StateStopped), "sbx_0", "sbx_2")
	checkIDs(t, "paused, none", byStates(pandastack.StatePaused))
	checkIDs(t, "unknown state", byStates("frozen"))
	checkIDs(t, "running, all projects",
		list(t, s, pandastack.SandboxFilter{States: []pandastack.SandboxState{pandastack.StateRunning}}),
		"sbx_1", "sbx_3", "sbx_other")
}

func testListByMetadata(t *testing.T, s pandastack.Store) {
	md := []map[string]string{
		{"env": "prod", "team": "a"},
		{"env": "prod", "team": "b"},
		{"env": "prod"},
		{"env": "dev", "team": "a", "x": "1"},
		{"team": "a", "empty": ""},
		nil,
	}
	for i, m := range md {
		sb := sandbox(fmt.Sprintf("sbx_%d", i), i)
		sb.Metadata = m
		mustSandbox(t, s, sb)
	}
	other := sandbox("sbx_other", 9)
	other.ProjectID = "prj_2"
	other.Metadata = map[string]string{"env": "prod", "team": "a"}
	mustSandbox(t, s, other)

	byMeta := func(m map[string]string) []string {
		return list(t, s, pandastack.SandboxFilter{ProjectID: "prj_1", Metadata: m})
	}
	checkIDs(t, "env=prod", byMeta(map[string]string{"env": "prod"}), "sbx_0", "sbx_1", "sbx_2")
	checkIDs(t, "env=prod team=a", byMeta(map[string]string{"env": "prod", "team": "a"}), "sbx_0")
	checkIDs(t, "team=a", byMeta(map[string]string{"team": "a"}), "sbx_0", "sbx_3", "sbx_4")
	checkIDs(t, "env=dev team=a x=1", byMeta(map[string]string{"env": "dev", "team": "a", "x": "1"}), "sbx_3")
	checkIDs(t, "env=dev team=b", byMeta(map[string]string{"env": "dev", "team": "b"}))
	checkIDs(t, "value is exact", byMeta(map[string]string{"env": "PROD"}))
	checkIDs(t, "value is not a prefix", byMeta(map[string]string{"env": "pro"}))
	// An empty value matches a present empty value, not a missing key.
	checkIDs(t, "empty=\"\"", byMeta(map[string]string{"empty": ""}), "sbx_4")
	checkIDs(t, "missing key", byMeta(map[string]string{"nope": ""}))
	checkIDs(t, "all projects",
		list(t, s, pandastack.SandboxFilter{Metadata: map[string]string{"env": "prod", "team": "a"}}),
		"sbx_0", "sbx_other")
	checkIDs(t, "state and metadata",
		list(t, s, pandastack.SandboxFilter{
			ProjectID: "prj_1",
			States:    []pandastack.SandboxState{pandastack.StateStopped},
			Metadata:  map[string]string{"env": "prod"},
		}))
}

// Keys and values are arbitrary strings: nothing in them may be read as a
// JSON path, SQL or pattern syntax.
func testListByAwkwardMetadataKeys(t *testing.T, s pandastack.Store) {
	awkward := []string{
		"a.b", "a", `q"uote`, `back\slash`, "it's", "$", "$.a", "[0]", "a[0]",
		"sp ace", "ünï", "日本", "%", "_", "*", "", "nul?", "semi;colon", "--",
	}
	for i, k := range awkward {
		sb := sandbox(fmt.Sprintf("sbx_%02d", i), i)
		sb.Metadata = map[string]string{k: "v" + k + `"'%`}
		mustSandbox(t, s, sb)
	}
	// {"a": "b"} must not match a filter on the key "a.b" read as a path.
	nested := sandbox("sbx_nested", 50)
	nested.Metadata = map[string]string{"a": "b"}
	mustSandbox(t, s, nested)

	for i, k := range awkward {
		id := fmt.Sprintf("sbx_%02d", i)
		got := mustGet(t, s, id)
		if v, ok := got.Metadata[k]; !ok || v != "v"+k+`"'%` || len(got.Metadata) != 1 {
			t.Errorf("%s: Metadata = %q, want {%q: %q}", id, got.Metadata, k, "v"+k+`"'%`)
		}
		checkIDs(t, fmt.Sprintf("key %q", k),
			list(t, s, pandastack.SandboxFilter{Metadata: map[string]string{k: "v" + k + `"'%`}}), id)
	}
	checkIDs(t, `a=b`, list(t, s, pandastack.SandboxFilter{Metadata: map[string]string{"a": "b"}}), "sbx_nested")
	checkIDs(t, `a.b=b`, list(t, s, pandastack.SandboxFilter{Metadata: map[string]string{"a.b": "b"}}))
	checkIDs(t, `%=%`, list(t, s, pandastack.SandboxFilter{Metadata: map[string]string{"%": "%"}}))
}

func testSetSandboxState(t *testing.T, s pandastack.Store) {
	ctx := t.Context()
	want := sandbox("sbx_1", 0)
	want.State = pandastack.StateStarting
	mustSandbox(t, s, want)
	mustSandbox(t, s, sandbox("sbx_2", 1))

	// Reason and time are kept only for StateStopped.
	if err := s.SetSandboxState(ctx, "sbx_1", pandastack.StateRunning, "ignored", base.Add(time.Minute)); err != nil {
		t.Fatalf("SetSandboxState(running): %v", err)
	}
	want.State = pandastack.StateRunning
	checkSandbox(t, mustGet(t, s, "sbx_1"), want)

	at := base.Add(5 * time.Minute)
	if err := s.SetSandboxState(ctx, "sbx_1", pandastack.StateStopped, pandastack.StopDied, at); err != nil {
		t.Fatalf("SetSandboxState(stopped): %v", err)
	}
	want.State, want.StopReason, want.StoppedAt = pandastack.StateStopped, pandastack.StopDied, &at
	checkSandbox(t, mustGet(t, s, "sbx_1"), want)
	checkSandbox(t, mustGet(t, s, "sbx_2"), sandbox("sbx_2", 1))

	err := s.SetSandboxState(ctx, "sbx_9", pandastack.StateStopped, pandastack.StopKilled, at)
	checkCode(t, "SetSandboxState(unknown)", err, pandastack.ENotFound)
}

func testSetSandboxExpiry(t *testing.T, s pandastack.Store) {
	want := sandbox("sbx_1", 0)
	mustSandbox(t, s, want)
	mustSandbox(t, s, sandbox("sbx_2", 1))
	want.ExpiresAt = base.Add(10 * time.Hour)
	if err := s.SetSandboxExpiry(t.Context(), "sbx_1", want.ExpiresAt); err != nil {
		t.Fatalf("SetSandboxExpiry: %v", err)
	}
	checkSandbox(t, mustGet(t, s, "sbx_1"), want)
	checkSandbox(t, mustGet(t, s, "sbx_2"), sandbox("sbx_2", 1))
	err := s.SetSandboxExpiry(t.Context(), "sbx_9", base)
	checkCode(t, "SetSandboxExpiry(unknown)", err, pandastack.ENotFound)
}

func testDeleteSandbox(t *testing.T, s pandastack.Store) {
	mustSandbox(t, s, sandbox("sbx_1", 0))
	mustSandbox(t, s, sandbox("sbx_2", 1))
	if err := s.DeleteSandbox(t.Context(), "sbx_1"); err != nil {
		t.Fatalf("DeleteSandbox: %v", err)
	}
	_, err := s.GetSandbox(t.Context(), "", "sbx_1")
	checkCode(t, "GetSandbox after delete", err, pandastack.ENotFound)
	err = s.DeleteSandbox(t.Context(), "sbx_1")
	checkCode(t, "DeleteSandbox twice", err, pandastack.ENotFound)
	checkIDs(t, "left", list(t, s, pandastack.SandboxFilter{}), "sbx_2")
	// The id is free again.
	mustSandbox(t, s, sandbox("sbx_1", 2))
}

func testExpiredSandboxes(t *testing.T, s pandastack.Store) {
	ctx := t.Context()
	now := base.Add(24 * time.Hour)
	add := func(id, project string, state pandastack.SandboxState, expires time.Time) {
		sb := sandbox(id, 0)
		sb.ProjectID, sb.State, sb.ExpiresAt = project, state, expires
		mustSandbox(t, s, sb)
	}
	add("sbx_past", "prj_1", pandastack.StateRunning, now.Add(-time.Hour))
	add("sbx_exact", "prj_1", pandastack.StateRunning, now)
	add("sbx_starting", "prj_2", pandastack.StateStarting, now.Add(-time.Millisecond))
	add("sbx_future", "prj_1", pandastack.StateRunning, now.Add(time.Millisecond))
	add("sbx_stopped", "prj_1", pandastack.StateStopped, now.Add(-time.Hour))

	got, err := s.ExpiredSandboxes(ctx, now)
	if err != nil {
		t.Fatalf("ExpiredSandboxes: %v", err)
	}
	gotIDs := ids(got)
	slices.Sort(gotIDs)
	checkIDs(t, "expired", gotIDs, "sbx_exact", "sbx_past", "sbx_starting")
	for _, g := range got {
		if g.ID == "sbx_starting" && g.ProjectID != "prj_2" {
			t.Errorf("expired sbx_starting has ProjectID %q, want prj_2", g.ProjectID)
		}
	}

	// Stopping one removes it from the answer.
	if err := s.SetSandboxState(ctx, "sbx_past", pandastack.StateStopped, pandastack.StopExpired, now); err != nil {
		t.Fatal(err)
	}
	got, err = s.ExpiredSandboxes(ctx, now)
	if err != nil {
		t.Fatal(err)
	}
	gotIDs = ids(got)
	slices.Sort(gotIDs)
	checkIDs(t, "expired after stopping sbx_past", gotIDs, "sbx_exact", "sbx_starting")

	got, err = s.ExpiredSandboxes(ctx, base)
	if err != nil {
		t.Fatal(err)
	}
	checkIDs(t, "expired long ago", ids(got))
}

func testPurgeStoppedSandboxes(t *testing.T, s pandastack.Store) {
	ctx := t.Context()
	cutoff := base.Add(24 * time.Hour)
	stop := func(id string, at time.Time) {
		mustSandbox(t, s, sandbox(id, 0))
		if err := s.SetSandboxState(ctx, id, pandastack.StateStopped, pandastack.StopKilled, at); err != nil {
			t.Fatal(err)
		}
	}
	stop("sbx_old", cutoff.Add(-time.Hour))
	stop("sbx_just", cutoff.Add(-time.Millisecond))
	stop("sbx_exact", cutoff)
	stop("sbx_new", cutoff.Add(time.Hour))
	mustSandbox(t, s, sandbox("sbx_running", 0)) // created long before the cutoff

	n, err := s.PurgeStoppedSandboxes(ctx, cutoff)
	if err != nil {
		t.Fatalf("PurgeStoppedSandboxes: %v", err)
	}
	if n != 2 {
		t.Errorf("PurgeStoppedSandboxes = %d, want 2", n)
	}
	checkIDs(t, "left", list(t, s, pandastack.SandboxFilter{}), "sbx_exact", "sbx_new", "sbx_running")

	n, err = s.PurgeStoppedSandboxes(ctx, cutoff)
	if err != nil || n != 0 {
		t.Errorf("second PurgeStoppedSandboxes = %d, %v; want 0, nil", n, err)
	}
}

func testConcurrent(t *testing.T, s pandastack.Store) {
	const workers, each = 8, 10
	ctx := t.Context()
	var wg sync.WaitGroup
	errs := make(chan error, workers*each*2)
	for w := range workers {
		wg.Go(func() {
			for i := range each {
				sb := sandbox(fmt.Sprintf("sbx_%d_%d", w, i), w*each+i)
				sb.Metadata = map[string]string{"worker": fmt.Sprint(w)}
				if err := s.CreateSandbox(ctx, sb); err != nil {
					errs <- fmt.Errorf("create %s: %w", sb.ID, err)
					continue
				}
				if err := s.SetSandboxState(ctx, sb.ID, pandastack.StateStopped, pandastack.StopKilled, base); err != nil {
					errs <- fmt.Errorf("stop %s: %w", sb.ID, err)
				}
				if _, err := s.ListSandboxes(ctx, pandastack.SandboxFilter{Metadata: sb.Metadata}); err != nil {
					errs <- fmt.Errorf("list: %w", err)
				}
			}
		})
	}
	wg.Wait()
	close(errs)
	var msgs []string
	for err := range errs {
		msgs = append(msgs, err.Error())
	}
	if len(msgs) > 0 {
		t.Fatalf("%d concurrent calls failed:\n%s", len(msgs), strings.Join(msgs, "\n"))
	}
	got := list(t, s, pandastack.SandboxFilter{States: []pandastack.SandboxState{pandastack.StateStopped}})
	if len(got) != workers*each {
		t.Errorf("%d stopped sandboxes after concurrent writes, want %d", len(got), workers*each)
	}
}

func testCancelledContext(t *testing.T, s pandastack.Store) {
	ctx, cancel := context.WithCancel(t.Context())
	cancel()
	err := s.CreateSandbox(ctx, sandbox("sbx_1", 0))
	if !errors.Is(err, context.Canceled) {
		t.Errorf("CreateSandbox with a cancelled context: err = %v, want context.Canceled", err)
	}
	if _, err := s.GetSandbox(t.Context(), "", "sbx_1"); !pandastack.IsCode(err, pandastack.ENotFound) {
		t.Errorf("CreateSandbox with a cancelled context stored the sandbox: GetSandbox err = %v", err)
	}
	_, err = s.ListSandboxes(ctx, pandastack.SandboxFilter{})
	if !errors.Is(err, context.Canceled) {
		t.Errorf("ListSandboxes with a cancelled context: err = %v, want context.Canceled", err)
	}
}

// --- paused sandboxes and auto-resume ---

func testPausedSandbox(t *testing.T, s pandastack.Store) {
	ctx := t.Context()
	// Created directly in the paused state.
	want := sandbox("sbx_p", 0)
	want.State = pandastack.StatePaused
	want.Metadata = map[string]string{"k": "v"}
	mustSandbox(t, s, want)
	checkSandbox(t, mustGet(t, s, "sbx_p"), want)

	// Paused by a state change: no stop reason or time is kept.
	run := sandbox("sbx_r", 1)
	mustSandbox(t, s, run)
	if err := s.SetSandboxState(ctx, "sbx_r", pandastack.StatePaused, pandastack.PauseRequested, base.Add(time.Minute)); err != nil {
		t.Fatalf("SetSandboxState(paused): %v", err)
	}
	run.State = pandastack.StatePaused
	checkSandbox(t, mustGet(t, s, "sbx_r"), run)
	mustSandbox(t, s, sandbox("sbx_x", 2))

	got, err := s.ListSandboxes(ctx, pandastack.SandboxFilter{ProjectID: "prj_1", States: []pandastack.SandboxState{pandastack.StatePaused}})
	if err != nil {
		t.Fatal(err)
	}
	checkIDs(t, "paused", ids(got), "sbx_p", "sbx_r")
	for _, g := range got {
		checkSandbox(t, g, map[string]pandastack.Sandbox{"sbx_p": want, "sbx_r": run}[g.ID])
	}
	checkIDs(t, "running", list(t, s, pandastack.SandboxFilter{States: []pandastack.SandboxState{pandastack.StateRunning}}), "sbx_x")

	// And back: resumed, then stopped while paused.
	if err := s.SetSandboxState(ctx, "sbx_r", pandastack.StateRunning, "", base.Add(2*time.Minute)); err != nil {
		t.Fatalf("SetSandboxState(running): %v", err)
	}
	run.State = pandastack.StateRunning
	checkSandbox(t, mustGet(t, s, "sbx_r"), run)
	at := base.Add(3 * time.Minute)
	if err := s.SetSandboxState(ctx, "sbx_p", pandastack.StateStopped, pandastack.StopKilled, at); err != nil {
		t.Fatalf("SetSandboxState(stopped): %v", err)
	}
	want.State, want.StopReason, want.StoppedAt = pandastack.StateStopped, pandastack.StopKilled, &at
	checkSandbox(t, mustGet(t, s, "sbx_p"), want)
}

// A paused sandbox is not stopped: its expiry still ends it.
func testExpiredPausedSandboxes(t *testing.T, s pandastack.Store) {
	ctx := t.Context()
	now := base.Add(24 * time.Hour)
	add := func(id string, state pandastack.SandboxState, expires time.Time) {
		sb := sandbox(id, 0)
		sb.State, sb.ExpiresAt, sb.AutoResume = state, expires, true
		mustSandbox(t, s, sb)
	}
	add("sbx_paused_past", pandastack.StatePaused, now.Add(-time.Hour))
	add("sbx_paused_exact", pandastack.StatePaused, now)
	add("sbx_paused_future", pandastack.StatePaused, now.Add(time.Millisecond))
	add("sbx_running_past", pandastack.StateRunning, now.Add(-time.Minute))
	add("sbx_stopped_past", pandastack.StateStopped, now.Add(-time.Hour))

	got, err := s.ExpiredSandboxes(ctx, now)
	if err != nil {
		t.Fatalf("ExpiredSandboxes: %v", err)
	}
	gotIDs := ids(got)
	slices.Sort(gotIDs)
	checkIDs(t, "expired", gotIDs, "sbx_paused_exact", "sbx_paused_past", "sbx_running_past")
	for _, g := range got {
		if g.ID == "sbx_paused_past" && (g.State != pandastack.StatePaused || !g.AutoResume) {
			t.Errorf("expired sbx_paused_past has State %q AutoResume %v, want paused, true", g.State, g.AutoResume)
		}
	}
}

func testAutoResume(t *testing.T, s pandastack.Store) {
	ctx := t.Context()
	on := sandbox("sbx_on", 0)
	on.AutoResume = true
	on.State = pandastack.StatePaused
	off := sandbox("sbx_off", 1)
	mustSandbox(t, s, on)
	mustSandbox(t, s, off)
	checkSandbox(t, mustGet(t, s, "sbx_on"), on)
	checkSandbox(t, mustGet(t, s, "sbx_off"), off)
	got, err := s.GetSandbox(ctx, "prj_1", "sbx_on")
	if err != nil || !got.AutoResume {
		t.Errorf("GetSandbox(prj_1, sbx_on) = %+v, %v; want AutoResume", got, err)
	}

	all, err := s.ListSandboxes(ctx, pandastack.SandboxFilter{})
	if err != nil {
		t.Fatal(err)
	}
	checkIDs(t, "all", ids(all), "sbx_on", "sbx_off")
	for _, g := range all {
		checkSandbox(t, g, map[string]pandastack.Sandbox{"sbx_on": on, "sbx_off": off}[g.ID])
	}

	// Other updates leave it alone.
	if err := s.SetSandboxState(ctx, "sbx_on", pandastack.StateRunning, "", base); err != nil {
		t.Fatal(err)
	}
	if err := s.SetSandboxExpiry(ctx, "sbx_on", base.Add(5*time.Hour)); err != nil {
		t.Fatal(err)
	}
	on.State, on.ExpiresAt = pandastack.StateRunning, base.Add(5*time.Hour)
	checkSandbox(t, mustGet(t, s, "sbx_on"), on)
}

// --- snapshots ---

// snapshot returns a snapshot of prj_1 taken of sbx_1 at base+minute.
func snapshot(id string, minute int) pandastack.Snapshot {
	return pandastack.Snapshot{
		ID:        id,
		ProjectID: "prj_1",
		SandboxID: "sbx_1",
		Template:  "python",
		SizeBytes: 123 << 20,
		Metadata:  map[string]string{},
		CreatedAt: base.Add(time.Duration(minute) * time.Minute),
		CPU:       1,
		MemoryMB:  512,
	}
}

func mustSnapshot(t *testing.T, s pandastack.Store, sn pandastack.Snapshot) {
	t.Helper()
	if err := s.CreateSnapshot(t.Context(), sn); err != nil {
		t.Fatalf("CreateSnapshot(%s): %v", sn.ID, err)
	}
}

func mustGetSnapshot(t *testing.T, s pandastack.Store, id string) pandastack.Snapshot {
	t.Helper()
	got, err := s.GetSnapshot(t.Context(), "", id)
	if err != nil {
		t.Fatalf("GetSnapshot(%s): %v", id, err)
	}
	return got
}

func listSnapshots(t *testing.T, s pandastack.Store, projectID string, md map[string]string) []string {
	t.Helper()
	got, err := s.ListSnapshots(t.Context(), projectID, md)
	if err != nil {
		t.Fatalf("ListSnapshots(%q, %q): %v", projectID, md, err)
	}
	out := make([]string, len(got))
	for i, sn := range got {
		out[i] = sn.ID
	}
	return out
}

func testSnapshot(t *testing.T, s pandastack.Store) {
	want := snapshot("snap_1", 0)
	want.SandboxID = "sbx_9"
	want.Template = "node"
	want.SizeBytes = 5<<30 + 7 // more than 32 bits
	want.CPU = 4
	want.MemoryMB = 8192
	want.Metadata = map[string]string{"user": "ada", "run": "42"}
	want.Network = &pandastack.NetworkPolicy{AllowOut: []string{"example.com", "*.example.org", "10.1.2.0/24"}, DenyOut: []string{}}
	mustSnapshot(t, s, want)
	mustSnapshot(t, s, snapshot("snap_2", 1)) // no policy: nil

	got, err := s.GetSnapshot(t.Context(), "prj_1", "snap_1")
	if err != nil {
		t.Fatalf("GetSnapshot: %v", err)
	}
	checkSnapshot(t, got, want)
	checkSnapshot(t, mustGetSnapshot(t, s, "snap_1"), want)
	checkSnapshot(t, mustGetSnapshot(t, s, "snap_2"), snapshot("snap_2", 1))

	// A caller mutating the map it passed in must not change the record.
	want.Metadata["user"] = "eve"
	if got := mustGetSnapshot(t, s, "snap_1"); got.Metadata["user"] != "ada" {
		t.Errorf("stored metadata follows the caller's map: user = %q", got.Metadata["user"])
	}
}

func testSnapshotTimestamps(t *testing.T, s pandastack.Store) {
	zone := time.FixedZone("UTC+5:30", 5*3600+1800)
	want := snapshot("snap_1", 0)
	want.CreatedAt = time.Date(2025, 7, 9, 23, 59, 59, 987654321, zone)
	mustSnapshot(t, s, want)
	got := mustGetSnapshot(t, s, "snap_1")
	checkSnapshot(t, got, want)
	checkTime(t, "CreatedAt", got.CreatedAt, want.CreatedAt)

	all, err := s.ListSnapshots(t.Context(), "", nil)
	if err != nil {
		t.Fatal(err)
	}
	if len(all) != 1 {
		t.Fatalf("ListSnapshots returned %d snapshots, want 1", len(all))
	}
	checkTime(t, "listed CreatedAt", all[0].CreatedAt, want.CreatedAt)
}

func testSnapshotMetadataNilAndEmpty(t *testing.T, s pandastack.Store) {
	a := snapshot("snap_nil", 0)
	a.Metadata = nil
	b := snapshot("snap_empty", 1)
	b.Metadata = map[string]string{}
	mustSnapshot(t, s, a)
	mustSnapshot(t, s, b)
	for _, id := range []string{"snap_nil", "snap_empty"} {
		got := mustGetSnapshot(t, s, id)
		if got.Metadata == nil || len(got.Metadata) != 0 {
			t.Errorf("GetSnapshot(%s).Metadata = %#v, want an empty non-nil map", id, got.Metadata)
		}
	}
	all, err := s.ListSnapshots(t.Context(), "", nil)
	if err != nil {
		t.Fatal(err)
	}
	if len(all) != 2 {
		t.Errorf("ListSnapshots returned %d snapshots, want 2", len(all))
	}
	for _, got := range all {
		if got.Metadata == nil || len(got.Metadata) != 0 {
			t.Errorf("ListSnapshots: %s.Metadata = %#v, want an empty non-nil map", got.ID, got.Metadata)
		}
	}
}

func testSnapshotConflict(t *testing.T, s pandastack.Store) {
	orig := snapshot("snap_1", 0)
	mustSnapshot(t, s, orig)
	dup := snapshot("snap_1", 5)
	dup.ProjectID = "prj_2"
	dup.SandboxID = "sbx_2"
	dup.SizeBytes = 1
	err := s.CreateSnapshot(t.Context(), dup)
	checkCode(t, "duplicate id", err, pandastack.EConflict)
	checkSnapshot(t, mustGetSnapshot(t, s, "snap_1"), orig)
	checkIDs(t, "after a rejected create", listSnapshots(t, s, "", nil), "snap_1")
}

func testSnapshotProjectIsolation(t *testing.T, s pandastack.Store) {
	a := snapshot("snap_a", 0)
	b := snapshot("snap_b", 1)
	b.ProjectID = "prj_2"
	mustSnapshot(t, s, a)
	mustSnapshot(t, s, b)

	_, err := s.GetSnapshot(t.Context(), "prj_1", "snap_b")
	checkCode(t, "GetSnapshot of another project", err, pandastack.ENotFound)
	got, err := s.GetSnapshot(t.Context(), "prj_2", "snap_b")
	if err != nil {
		t.Fatalf("GetSnapshot(prj_2, snap_b): %v", err)
	}
	checkSnapshot(t, got, b)
	checkSnapshot(t, mustGetSnapshot(t, s, "snap_b"), b)

	checkIDs(t, "prj_1", listSnapshots(t, s, "prj_1", nil), "snap_a")
	checkIDs(t, "prj_2", listSnapshots(t, s, "prj_2", nil), "snap_b")
	checkIDs(t, "prj_3", listSnapshots(t, s, "prj_3", nil))
	checkIDs(t, "all projects", listSnapshots(t, s, "", nil), "snap_a", "snap_b")
}

func testSnapshotNotFound(t *testing.T, s pandastack.Store) {
	mustSnapshot(t, s, snapshot("snap_1", 0))
	// Snapshot and sandbox ids live apart.
	mustSandbox(t, s, sandbox("sbx_1", 0))
	for _, id := range []string{"snap_2", "sbx_1", ""} {
		_, err := s.GetSnapshot(t.Context(), "", id)
		checkCode(t, fmt.Sprintf("GetSnapshot(%q)", id), err, pandastack.ENotFound)
		_, err = s.GetSnapshot(t.Context(), "prj_1", id)
		checkCode(t, fmt.Sprintf("GetSnapshot(prj_1, %q)", id), err, pandastack.ENotFound)
		err = s.DeleteSnapshot(t.Context(), id)
		checkCode(t, fmt.Sprintf("DeleteSnapshot(%q)", id), err, pandastack.ENotFound)
	}
	checkIDs(t, "left", listSnapshots(t, s, "", nil), "snap_1")
	mustGet(t, s, "sbx_1")
}

func testDeleteSnapshot(t *testing.T, s pandastack.Store) {
	mustSnapshot(t, s, snapshot("snap_1", 0))
	mustSnapshot(t, s, snapshot("snap_2", 1))
	if err := s.DeleteSnapshot(t.Context(), "snap_1"); err != nil {
		t.Fatalf("DeleteSnapshot: %v", err)
	}
	_, err := s.GetSnapshot(t.Context(), "", "snap_1")
	checkCode(t, "GetSnapshot after delete", err, pandastack.ENotFound)
	err = s.DeleteSnapshot(t.Context(), "snap_1")
	checkCode(t, "DeleteSnapshot twice", err, pandastack.ENotFound)
	checkIDs(t, "left", listSnapshots(t, s, "", nil), "snap_2")
	// The id is free again.
	mustSnapshot(t, s, snapshot("snap_1", 2))
	checkIDs(t, "after re-create", listSnapshots(t, s, "", nil), "snap_2", "snap_1")
}

func testListSnapshots(t *testing.T, s pandastack.Store) {
	checkIDs(t, "empty store", listSnapshots(t, s, "", nil))
	checkIDs(t, "empty store, prj_1", listSnapshots(t, s, "prj_1", map[string]string{"a": "b"}))
	// Inserted out of order, so insertion order cannot pass for age.
	want := map[string]pandastack.Snapshot{}
	for _, c := range []struct {
		id     string
		minute int
	}{{"snap_c", 3}, {"snap_a", 1}, {"snap_d", 4}, {"snap_b", 2}} {
		sn := snapshot(c.id, c.minute)
		sn.Metadata = map[string]string{"n": c.id}
		sn.SizeBytes = int64(c.minute)
		mustSnapshot(t, s, sn)
		want[c.id] = sn
	}
	got, err := s.ListSnapshots(t.Context(), "prj_1", nil)
	if err != nil {
		t.Fatal(err)
	}
	gotIDs := make([]string, len(got))
	for i, g := range got {
		gotIDs[i] = g.ID
		checkSnapshot(t, g, want[g.ID])
	}
	checkIDs(t, "oldest first", gotIDs, "snap_a", "snap_b", "snap_c", "snap_d")
	// A zero-length but non-nil filter matches everything too.
	checkIDs(t, "empty metadata filter", listSnapshots(t, s, "prj_1", map[string]string{}),
		"snap_a", "snap_b", "snap_c", "snap_d")
	// Snapshots are not sandboxes.
	checkIDs(t, "sandboxes", list(t, s, pandastack.SandboxFilter{}))
}

func testListSnapshotsByMetadata(t *testing.T, s pandastack.Store) {
	md := []map[string]string{
		{"env": "prod", "team": "a"},
		{"env": "prod", "team": "b"},
		{"env": "prod"},
		{"env": "dev", "team": "a", "x": "1"},
		{"team": "a", "empty": ""},
		nil,
	}
	for i, m := range md {
		sn := snapshot(fmt.Sprintf("snap_%d", i), i)
		sn.Metadata = m
		mustSnapshot(t, s, sn)
	}
	other := snapshot("snap_other", 9)
	other.ProjectID = "prj_2"
	other.Metadata = map[string]string{"env": "prod", "team": "a"}
	mustSnapshot(t, s, other)
	// A sandbox with matching metadata is not a snapshot.
	sb := sandbox("sbx_1", 0)
	sb.Metadata = map[string]string{"env": "prod"}
	mustSandbox(t, s, sb)

	byMeta := func(m map[string]string) []string { return listSnapshots(t, s, "prj_1", m) }
	checkIDs(t, "env=prod", byMeta(map[string]string{"env": "prod"}), "snap_0", "snap_1", "snap_2")
	checkIDs(t, "env=prod team=a", byMeta(map[string]string{"env": "prod", "team": "a"}), "snap_0")
	checkIDs(t, "team=a", byMeta(map[string]string{"team": "a"}), "snap_0", "snap_3", "snap_4")
	checkIDs(t, "env=dev team=a x=1", byMeta(map[string]string{"env": "dev", "team": "a", "x": "1"}), "snap_3")
	checkIDs(t, "env=dev team=b", byMeta(map[string]string{"env": "dev", "team": "b"}))
	checkIDs(t, "value is exact", byMeta(map[string]string{"env": "PROD"}))
	checkIDs(t, "value is not a prefix", byMeta(map[string]string{"env": "pro"}))
	// An empty value matches a present empty value, not a missing key.
	checkIDs(t, "empty=\"\"", byMeta(map[string]string{"empty": ""}), "snap_4")
	checkIDs(t, "missing key", byMeta(map[string]string{"nope": ""}))
	checkIDs(t, "all projects",
		listSnapshots(t, s, "", map[string]string{"env": "prod", "team": "a"}), "snap_0", "snap_other")

	// Keys are arbitrary strings, never JSON paths, SQL or patterns.
	awkward := []string{"a.b", `q"uote`, "$.env", "%", "_", "", "it's"}
	for i, k := range awkward {
		sn := snapshot(fmt.Sprintf("snap_awk_%d", i), 20+i)
		sn.ProjectID = "prj_3"
		sn.Metadata = map[string]string{k: "v" + k + `"'%`}
		mustSnapshot(t, s, sn)
	}
	nested := snapshot("snap_nested", 40)
	nested.ProjectID = "prj_3"
	nested.Metadata = map[string]string{"a": "b"}
	mustSnapshot(t, s, nested)
	for i, k := range awkward {
		id := fmt.Sprintf("snap_awk_%d", i)
		got := mustGetSnapshot(t, s, id)
		checkMetadata(t, id, got.Metadata, map[string]string{k: "v" + k + `"'%`})
		checkIDs(t, fmt.Sprintf("key %q", k), listSnapshots(t, s, "prj_3", map[string]string{k: "v" + k + `"'%`}), id)
	}
	checkIDs(t, "a.b=b", listSnapshots(t, s, "prj_3", map[string]string{"a.b": "b"}))
	checkIDs(t, "%=%", listSnapshots(t, s, "prj_3", map[string]string{"%": "%"}))
}

// A snapshot record does not go away with the sandbox it was taken of.
func testSnapshotOutlivesSandbox(t *testing.T, s pandastack.Store) {
	ctx := t.Context()
	mustSandbox(t, s, sandbox("sbx_1", 0))
	mustSandbox(t, s, sandbox("sbx_2", 1))
	want1 := snapshot("snap_1", 2)
	want2 := snapshot("snap_2", 3)
	want2.SandboxID = "sbx_2"
	mustSnapshot(t, s, want1)
	mustSnapshot(t, s, want2)

	if err := s.DeleteSandbox(ctx, "sbx_1"); err != nil {
		t.Fatal(err)
	}
	if err := s.SetSandboxState(ctx, "sbx_2", pandastack.StateStopped, pandastack.StopKilled, base); err != nil {
		t.Fatal(err)
	}
	if n, err := s.PurgeStoppedSandboxes(ctx, base.Add(time.Hour)); err != nil || n != 1 {
		t.Fatalf("PurgeStoppedSandboxes = %d, %v; want 1, nil", n, err)
	}
	checkSnapshot(t, mustGetSnapshot(t, s, "snap_1"), want1)
	checkSnapshot(t, mustGetSnapshot(t, s, "snap_2"), want2)

	// Nor does a snapshot need its sandbox to exist.
	orphan := snapshot("snap_3", 4)
	orphan.SandboxID = "sbx_never"
	mustSnapshot(t, s, orphan)
	checkIDs(t, "snapshots", listSnapshots(t, s, "prj_1", nil), "snap_1", "snap_2", "snap_3")
}

func testSnapshotCancelledContext(t *testing.T, s pandastack.Store) {
	ctx, cancel := context.WithCancel(t.Context())
	cancel()
	err := s.CreateSnapshot(ctx, snapshot("snap_1", 0))
	if !errors.Is(err, context.Canceled) {
		t.Errorf("CreateSnapshot with a cancelled context: err = %v, want context.Canceled", err)
	}
	if _, err := s.GetSnapshot(t.Context(), "", "snap_1"); !pandastack.IsCode(err, pandastack.ENotFound) {
		t.Errorf("CreateSnapshot with a cancelled context stored the snapshot: GetSnapshot err = %v", err)
	}
	_, err = s.ListSnapshots(ctx, "", nil)
	if !errors.Is(err, context.Canceled) {
		t.Errorf("ListSnapshots with a cancelled context: err = %v, want context.Canceled", err)
	}
}

// The idle timeout is stored as given and changed only by its setter; the
// pause reason lives while paused and goes with any other state.
func testIdleSuspend(t *testing.T, s pandastack.Store) {
	ctx := t.Context()
	want := sandbox("sbx_1", 0)
	want.IdleTimeoutSeconds = 300
	want.RootFS = "/var/cache/pandastack/templates/base-0123/rootfs" // kept as given
	mustSandbox(t, s, want)
	mustSandbox(t, s, sandbox("sbx_2", 1))
	checkSandbox(t, mustGet(t, s, "sbx_1"), want)

	if err := s.SetSandboxIdleTimeout(ctx, "sbx_1", 0); err != nil {
		t.Fatalf("SetSandboxIdleTimeout: %v", err)
	}
	want.IdleTimeoutSeconds = 0
	checkSandbox(t, mustGet(t, s, "sbx_1"), want)
	checkCode(t, "SetSandboxIdleTimeout(unknown)", s.SetSandboxIdleTimeout(ctx, "sbx_9", 5), pandastack.ENotFound)

	if err := s.SetSandboxState(ctx, "sbx_1", pandastack.StatePaused, pandastack.PauseIdle, base); err != nil {
		t.Fatal(err)
	}
	want.State, want.PauseReason = pandastack.StatePaused, pandastack.PauseIdle
	checkSandbox(t, mustGet(t, s, "sbx_1"), want)
	if err := s.SetSandboxState(ctx, "sbx_1", pandastack.StateRunning, "", base); err != nil {
		t.Fatal(err)
	}
	want.State, want.PauseReason = pandastack.StateRunning, ""
	checkSandbox(t, mustGet(t, s, "sbx_1"), want)
	// Stopping a paused sandbox keeps the stop reason, not the pause reason.
	s.SetSandboxState(ctx, "sbx_1", pandastack.StatePaused, pandastack.PauseIdle, base)
	at := base.Add(time.Minute)
	if err := s.SetSandboxState(ctx, "sbx_1", pandastack.StateStopped, pandastack.StopExpired, at); err != nil {
		t.Fatal(err)
	}
	want.State, want.StopReason, want.StoppedAt = pandastack.StateStopped, pandastack.StopExpired, &at
	checkSandbox(t, mustGet(t, s, "sbx_1"), want)
	checkSandbox(t, mustGet(t, s, "sbx_2"), sandbox("sbx_2", 1))
}
