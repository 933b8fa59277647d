package storetest

import (
	"fmt"
	"testing"

	"github.com/pandastack/pandastack"
)

// unstorable are strings no Store can hold (pandastack.StorableText): what
// PostgreSQL refuses, SQLite refuses too, so both stores answer alike.
var unstorable = []string{"nul\x00byte", "\x00", "bad\xffutf8"}

// A record holding unstorable text is EInvalid and leaves nothing behind.
func testUnstorableTextRefused(t *testing.T, s pandastack.Store) {
	ctx := t.Context()
	mustProject(t, s, "prj_1", "default")
	for i, bad := range unstorable {
		what := func(f string) string { return fmt.Sprintf("%s with %q", f, bad) }
		err := s.CreateProject(ctx, pandastack.Project{ID: fmt.Sprintf("prj_bad%d", i), Name: bad, CreatedAt: base})
		checkCode(t, what("CreateProject name"), err, pandastack.EInvalid)
		err = s.CreateAPIKey(ctx, pandastack.APIKey{ID: fmt.Sprintf("key_%d", i), ProjectID: "prj_1", Name: bad, Prefix: "pds_x", Hash: fmt.Sprintf("h%d", i), CreatedAt: base})
		checkCode(t, what("CreateAPIKey name"), err, pandastack.EInvalid)

		sb := sandbox(fmt.Sprintf("sbx_v%d", i), i)
		sb.Metadata = map[string]string{"k": bad}
		checkCode(t, what("CreateSandbox metadata value"), s.CreateSandbox(ctx, sb), pandastack.EInvalid)
		sb = sandbox(fmt.Sprintf("sbx_k%d", i), i)
		sb.Metadata = map[string]string{bad: "v"}
		checkCode(t, what("CreateSandbox metadata key"), s.CreateSandbox(ctx, sb), pandastack.EInvalid)
		sb = sandbox(fmt.Sprintf("sbx_t%d", i), i)
		sb.Template = bad
		checkCode(t, what("CreateSandbox template"), s.CreateSandbox(ctx, sb), pandastack.EInvalid)

		sn := snapshot(fmt.Sprintf("snap_v%d", i), i)
		sn.Metadata = map[string]string{"k": bad}
		checkCode(t, what("CreateSnapshot metadata value"), s.CreateSnapshot(ctx, sn), pandastack.EInvalid)
		sn = snapshot(fmt.Sprintf("snap_k%d", i), i)
		sn.Metadata = map[string]string{bad: "v"}
		checkCode(t, what("CreateSnapshot metadata key"), s.CreateSnapshot(ctx, sn), pandastack.EInvalid)
	}
	if keys, err := s.ListAPIKeys(ctx); err != nil || len(keys) != 0 {
		t.Errorf("refused keys were stored: ListAPIKeys = %+v, %v", keys, err)
	}
	checkIDs(t, "sandboxes after refused creates", list(t, s, pandastack.SandboxFilter{}))
	checkIDs(t, "snapshots after refused creates", listSnapshots(t, s, "", nil))

	mustSandbox(t, s, sandbox("sbx_1", 0))
	err := s.SetSandboxState(ctx, "sbx_1", pandastack.StateStopped, "why\x00", base)
	checkCode(t, "SetSandboxState with a NUL in the reason", err, pandastack.EInvalid)
	checkSandbox(t, mustGet(t, s, "sbx_1"), sandbox("sbx_1", 0))
}

// A lookup by unstorable text (an id from a URL path, a filter from a
// query string) finds nothing: ENotFound or an empty list, never a
// database error.
func testUnstorableTextLookups(t *testing.T, s pandastack.Store) {
	ctx := t.Context()
	mustProject(t, s, "prj_1", "default")
	mustKey(t, s, pandastack.APIKey{ID: "key_1", Prefix: "pds_a", Hash: "h1"})
	run := sandbox("sbx_1", 0)
	run.Metadata = map[string]string{"k": "v"}
	mustSandbox(t, s, run)
	mustSnapshot(t, s, snapshot("snap_1", 0))
	for _, bad := range unstorable {
		what := func(f string) string { return fmt.Sprintf("%s(%q)", f, bad) }
		_, err := s.ProjectByName(ctx, bad)
		checkCode(t, what("ProjectByName"), err, pandastack.ENotFound)
		_, err = s.APIKeyByHash(ctx, bad)
		checkCode(t, what("APIKeyByHash"), err, pandastack.ENotFound)
		checkCode(t, what("RevokeAPIKey"), s.RevokeAPIKey(ctx, bad, base), pandastack.ENotFound)
		checkCode(t, what("RevokeAPIKey prefix"), s.RevokeAPIKey(ctx, "pds_a"+bad, base), pandastack.ENotFound)
		_, err = s.GetSandbox(ctx, "", bad)
		checkCode(t, what("GetSandbox"), err, pandastack.ENotFound)
		_, err = s.GetSandbox(ctx, bad, "sbx_1")
		checkCode(t, what("GetSandbox project"), err, pandastack.ENotFound)
		checkCode(t, what("SetSandboxState"), s.SetSandboxState(ctx, bad, pandastack.StateRunning, "", base), pandastack.ENotFound)
		checkCode(t, what("SetSandboxExpiry"), s.SetSandboxExpiry(ctx, bad, base), pandastack.ENotFound)
		checkCode(t, what("DeleteSandbox"), s.DeleteSandbox(ctx, bad), pandastack.ENotFound)
		_, err = s.GetSnapshot(ctx, "", bad)
		checkCode(t, what("GetSnapshot"), err, pandastack.ENotFound)
		_, err = s.GetSnapshot(ctx, bad, "snap_1")
		checkCode(t, what("GetSnapshot project"), err, pandastack.ENotFound)
		checkCode(t, what("DeleteSnapshot"), s.DeleteSnapshot(ctx, bad), pandastack.ENotFound)

		checkIDs(t, what("ListSandboxes project"), list(t, s, pandastack.SandboxFilter{ProjectID: bad}))
		checkIDs(t, what("ListSandboxes metadata value"), list(t, s, pandastack.SandboxFilter{Metadata: map[string]string{"k": bad}}))
		checkIDs(t, what("ListSandboxes metadata key"), list(t, s, pandastack.SandboxFilter{Metadata: map[string]string{bad: "v"}}))
		checkIDs(t, what("ListSandboxes state"), list(t, s, pandastack.SandboxFilter{States: []pandastack.SandboxState{pandastack.SandboxState(bad)}}))
		// "Any of these states": an unstorable one does not hide the others.
		checkIDs(t, what("ListSandboxes running or"), list(t, s, pandastack.SandboxFilter{
			States: []pandastack.SandboxState{pandastack.SandboxState(bad), pandastack.StateRunning}}), "sbx_1")
		checkIDs(t, what("ListSnapshots project"), listSnapshots(t, s, bad, nil))
		checkIDs(t, what("ListSnapshots metadata"), listSnapshots(t, s, "", map[string]string{bad: bad}))
	}
	// Nothing was changed by any of it.
	checkSandbox(t, mustGet(t, s, "sbx_1"), run)
	checkSnapshot(t, mustGetSnapshot(t, s, "snap_1"), snapshot("snap_1", 0))
	checkIDs(t, "revoked", revokedIDs(t, s))
}
