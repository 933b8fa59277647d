package e2e

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/pandastack/pandastack/client"
	"github.com/pandastack/pandastack/internal/paths"
	"github.com/pandastack/pandastack/internal/testutil"
)

// startNodes runs n serves as nodes sharing one PostgreSQL database and one
// S3 bucket, each with its own data dir on loopback; the first makes the API
// key, the others find it in the shared database.
func startNodes(t *testing.T, n int, env ...string) []*server {
	t.Helper()
	db := testutil.StartPostgres(t).NewDatabase(t)
	s3 := testutil.StartS3(t)
	bucket := s3.NewBucket(t)
	env = append(append([]string{
		"PANDASTACK_STORE=" + db, "PANDASTACK_SNAPSHOT_STORE=s3://" + bucket + "/pandastack",
		"PANDASTACK_WARM=0", "PANDASTACK_POOL_SIZE=0",
		"PANDASTACK_NODE_HEARTBEAT=1s",
		// Long enough that a node starved by a loaded host (three serves,
		// PostgreSQL and restores on two cores) is not taken for lost.
		"PANDASTACK_NODE_GRACE=12s",
		// kill -9 of a node leaves its sandboxes' namespaces to the test;
		// these tests are about nodes, not sandbox networking.
		"PANDASTACK_NETWORK_DEFAULT=off",
	}, s3.Env()...), env...)
	nodes := []*server{startServer(t, "", env...)}
	for range n - 1 {
		s := newServer(t, "", env...)
		if err := os.WriteFile(filepath.Join(s.dataDir, "api-key"), []byte(nodes[0].key+"\n"), 0o600); err != nil {
			t.Fatal(err)
		}
		s.start()
		nodes = append(nodes, s)
	}
	// A failure between nodes shows in their logs, not in the test's.
	t.Cleanup(func() {
		if t.Failed() {
			for _, s := range nodes {
				t.Logf("the log of %s:\n%s", s.dataDir, tail(s.out.String(), 60))
			}
		}
	})
	return nodes
}

// sharedStoreKey makes a key of another project in the store s shares.
func sharedStoreKey(t *testing.T, s *server, project string) string {
	t.Helper()
	cmd := exec.Command(filepath.Join(s.bin, "pandastack"), "keys", "create", "--project", project)
	cmd.Env = append(append(os.Environ(), "PANDASTACK_DATA_DIR="+s.dataDir, "PANDASTACK_CACHE_DIR="+paths.CacheDir()), s.env...)
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("keys create: %v", err)
	}
	return strings.TrimSpace(string(out))
}

// nodeID is the id a serve made for itself and keeps in its data dir.
func nodeID(t *testing.T, s *server) string {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(s.dataDir, "node-id"))
	if err != nil {
		t.Fatal(err)
	}
	return strings.TrimSpace(string(b))
}

// stopNodes kills the sandboxes through their nodes' own stop (kill on
// exit) and checks that no process of any node is left. A node killed with
// -9 and not started again (a test that failed before it did) is started
// first: it re-adopts or removes what it left, and its stop kills those.
func stopNodes(t *testing.T, nodes []*server) {
	for _, s := range nodes {
		if s.cmd == nil && len(s.runscList()) > 0 {
			s.start()
		}
		s.stop()
	}
	for _, s := range nodes {
		if list := s.runscList(); len(list) > 0 {
			t.Errorf("containers of %s left after it stopped: %v", s.dataDir, list)
		}
		if pids := processesMentioning(s.dataDir); len(pids) > 0 {
			t.Errorf("processes of %s left after it stopped: %v", s.dataDir, pids)
		}
		os.RemoveAll(s.dataDir)
	}
}

// Three nodes on one PostgreSQL store and one bucket: creates through one
// node spread over all three; any node answers for any sandbox (exec,
// streamed exec, files, the terminal's WebSocket, fork); a snapshot taken
// on one node restores on another; after kill -9 of a node its sandboxes
// are reported lost by the others, whose own sandboxes and API go on; the
// killed node, started again, clears what it left.
func TestNodes(t *testing.T) {
	testutil.Runsc(t)
	ctx := context.Background()
	nodes := startNodes(t, 3)
	defer stopNodes(t, nodes)
	byID := map[string]*server{}
	for _, s := range nodes {
		id := nodeID(t, s)
		if !strings.Contains(s.out.String(), `node=`+id) {
			t.Errorf("%s's log does not name its node %s", s.dataDir, id)
		}
		byID[id] = s
	}
	if len(byID) != 3 {
		t.Fatalf("three serves made node ids %v", byID)
	}
	// A has seen the others heartbeat before the first create.
	a := nodes[0]
	for id := range byID {
		if id != nodeID(t, a) {
			eventually(t, "A sees node "+id, func() bool { return strings.Contains(a.out.String(), `msg="node seen" node=`+id) })
		}
	}
	ca := a.client()

	// Placement: six creates through A land on every node, each where its
	// record says.
	count := map[string]int{}
	var sbs []*client.Sandbox
	for i := range 6 {
		sb, err := ca.CreateSandbox(ctx, client.CreateSandboxRequest{TTLSeconds: 600, Metadata: map[string]string{"n": fmt.Sprint(i)}})
		if err != nil {
			t.Fatalf("create %d through A: %v\n%s", i, err, tail(a.out.String(), 30))
		}
		owner, ok := byID[sb.NodeID]
		if !ok {
			t.Fatalf("sandbox %s names node %q", sb.ID, sb.NodeID)
		}
		if !contains(owner.runscList(), sb.ID) {
			t.Errorf("sandbox %s does not run on its node %s", sb.ID, sb.NodeID)
		}
		count[sb.NodeID]++
		sbs = append(sbs, sb)
	}
	for id := range byID {
		if count[id] == 0 {
			t.Errorf("six creates through A placed %v: none on %s", count, id)
		}
	}
	t.Logf("placement of 6 creates: %v", count)

	// Any node answers for any sandbox.
	for _, sb := range sbs[:3] {
		for _, via := range nodes {
			c := via.client()
			res, err := c.Exec(ctx, sb.ID, client.ExecRequest{Cmd: "echo $PANDASTACK_SANDBOX_ID"})
			if err != nil || strings.TrimSpace(res.Stdout) != sb.ID {
				t.Fatalf("exec in %s (node %s) through %s: %+v %v", sb.ID, sb.NodeID, nodeID(t, via), res, err)
			}
		}
	}
	sb := sbs[0]
	owner := byID[sb.NodeID]
	var other *server // a node that does not run sb
	for _, s := range nodes {
		if s != owner {
			other = s
			break
		}
	}
	co := other.client()
	// A streamed exec comes through line by line.
	var lines []string
	res, err := co.ExecStream(ctx, sb.ID, client.ExecRequest{Cmd: "for i in 1 2 3; do echo line$i; sleep 0.2; done"}, func(ev client.ExecEvent) {
		if ev.Type == "stdout" {
			lines = append(lines, ev.Data)
		}
	})
	if err != nil || res.ExitCode != 0 || strings.Join(lines, "") != "line1\nline2\nline3\n" {
		t.Errorf("streamed exec through another node: %+v %q %v", res, lines, err)
	}
	// Files both ways.
	if _, err := co.WriteFile(ctx, sb.ID, "/home/user/notes.txt", strings.NewReader("written through "+nodeID(t, other))); err != nil {
		t.Fatal(err)
	}
	if res, err := owner.client().Exec(ctx, sb.ID, client.ExecRequest{Cmd: "cat /home/user/notes.txt"}); err != nil || res.Stdout != "written through "+nodeID(t, other) {
		t.Errorf("file written through another node, read on its own: %+v %v", res, err)
	}
	// The terminal's WebSocket.
	term, err := co.OpenTerminal(ctx, sb.ID, 80, 24)
	if err != nil {
		t.Fatalf("terminal through another node: %v", err)
	}
	term.Write(ctx, []byte("echo T$((6*7))T\r"))
	readTerm(t, term, "", "T42T")
	term.Write(ctx, []byte("exit\r"))
	readTerm(t, term, "", "")
	term.Close()
	// Another project's key gets 404 through any node, as on the owner.
	stranger := sharedStoreKey(t, a, "nodes-stranger")
	if st, code, _ := api(t, other, stranger, "GET", "/v1/sandboxes/"+sb.ID, ""); st != http.StatusNotFound || code != "not_found" {
		t.Errorf("another project's GET through another node: %d %s", st, code)
	}
	// The forwarding header grants nothing: a request that says it was
	// forwarded, about a sandbox of another node, is refused, not acted on.
	req, _ := http.NewRequest("DELETE", other.url+"/v1/sandboxes/"+sb.ID, nil)
	req.Header.Set("Authorization", "Bearer "+a.key)
	req.Header.Set("X-Pandastack-Forwarded-By", "someone")
	if resp, err := http.DefaultClient.Do(req); err != nil || resp.StatusCode != http.StatusServiceUnavailable {
		t.Errorf("a DELETE claiming to be forwarded: %v %v", resp, err)
	} else {
		resp.Body.Close()
	}
	if got, err := ca.GetSandbox(ctx, sb.ID); err != nil || got.State != "running" {
		t.Errorf("after the refused DELETE: %+v %v", got, err)
	}

	// Fork through another node: the children run beside their parent.
	kids, err := co.Fork(ctx, sb.ID, client.ForkRequest{Count: 2, TTLSeconds: 600})
	if err != nil || len(kids) != 2 {
		t.Fatalf("fork through another node: %v %v", kids, err)
	}
	for _, k := range kids {
		if k.NodeID != sb.NodeID || !contains(owner.runscList(), k.ID) {
			t.Errorf("fork child %s on node %q, parent on %s", k.ID, k.NodeID, sb.NodeID)
		}
		if res, err := ca.Exec(ctx, k.ID, client.ExecRequest{Cmd: "cat /home/user/notes.txt"}); err != nil || !strings.HasPrefix(res.Stdout, "written through") {
			t.Errorf("fork child %s through A: %+v %v", k.ID, res, err)
		}
	}

	// A snapshot taken through another node restores on a third.
	snap := takeSnapshot(t, other, sb.ID)
	restoredElsewhere := false
	for i := 0; i < 3 && !restoredElsewhere; i++ {
		got, err := nodes[2].client().CreateSandboxFromSnapshot(ctx, client.RestoreRequest{SnapshotID: snap.ID, TTLSeconds: 600})
		if err != nil {
			t.Fatalf("restore: %v", err)
		}
		res, err := ca.Exec(ctx, got.ID, client.ExecRequest{Cmd: "cat /home/user/notes.txt"})
		if err != nil || !strings.HasPrefix(res.Stdout, "written through") {
			t.Fatalf("restored sandbox %s on %s: %+v %v", got.ID, got.NodeID, res, err)
		}
		restoredElsewhere = got.NodeID != sb.NodeID
		t.Logf("snapshot of a sandbox on %s restored on %s", sb.NodeID, got.NodeID)
	}
	if !restoredElsewhere {
		t.Errorf("three restores all placed on the snapshotted sandbox's node %s", sb.NodeID)
	}

	// kill -9 of a node that runs sandboxes, not A.
	var victim *server
	for _, s := range nodes[1:] {
		if count[nodeID(t, s)] > 0 {
			victim = s
			break
		}
	}
	victimID := nodeID(t, victim)
	var theirs, ours []string
	for _, s := range sbs {
		if s.NodeID == victimID {
			theirs = append(theirs, s.ID)
		} else {
			ours = append(ours, s.ID)
		}
	}
	if len(ours) == 0 {
		t.Fatal("every sandbox on the victim")
	}
	victim.cmd.Process.Signal(syscall.SIGKILL)
	victim.cmd.Wait()
	victim.cmd = nil
	// Within the grace period a request for its sandbox says the node does
	// not answer; a create through A never fails for it.
	if _, err := ca.Exec(ctx, theirs[0], client.ExecRequest{Cmd: "true"}); !client.IsCode(err, "sandbox_unavailable") {
		t.Errorf("exec in a sandbox of a killed node: %v, want sandbox_unavailable", err)
	}
	// Its history is in the shared store: A answers it (it was a 503).
	if status, code, msg := api(t, nodes[0], nodes[0].key, "GET", "/v1/sandboxes/"+theirs[0]+"/history", ""); status != 200 {
		t.Errorf("history of a sandbox of a killed node: %d %s %s, want 200 from the store", status, code, msg)
	}
	for range 3 {
		sb, err := ca.CreateSandbox(ctx, client.CreateSandboxRequest{TTLSeconds: 600})
		if err != nil {
			t.Fatalf("create through A with a node just killed: %v", err)
		}
		if sb.NodeID == victimID {
			t.Errorf("create %s recorded on the killed node", sb.ID)
		}
	}
	// After the grace period its sandboxes are stopped, lost.
	deadline := time.Now().Add(60 * time.Second)
	for _, id := range theirs {
		for {
			got, err := ca.GetSandbox(ctx, id)
			if err == nil && got.State == "stopped" && got.StopReason == "lost" {
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("sandbox %s of the killed node: %+v %v, want stopped lost", id, got, err)
			}
			time.Sleep(500 * time.Millisecond)
		}
	}
	// The others' sandboxes and the API go on, through every live node.
	for _, s := range nodes {
		if s == victim {
			continue
		}
		for _, id := range ours {
			if res, err := s.client().Exec(ctx, id, client.ExecRequest{Cmd: "echo ok"}); err != nil || res.Stdout != "ok\n" {
				t.Errorf("sandbox %s through %s after the kill: %+v %v", id, nodeID(t, s), res, err)
			}
		}
		list, err := s.client().ListSandboxes(ctx, nil, "all")
		if err != nil || len(list) < len(sbs) {
			t.Errorf("list through %s: %d sandboxes, %v", nodeID(t, s), len(list), err)
		}
	}
	// The operator sees it lost, and may forget it (a node that is up is
	// refused); a node forgotten that starts again is a node again.
	var store string
	for _, e := range nodes[0].env {
		if v, ok := strings.CutPrefix(e, "PANDASTACK_STORE="); ok {
			store = v
		}
	}
	withStore := []string{"PANDASTACK_STORE=" + store}
	out, errOut, err := nodes[0].cliEnv(withStore, "nodes", "ls")
	if err != nil || !regexp.MustCompile(`(?m)^`+victimID+`\s+lost\s`).MatchString(out) || !regexp.MustCompile(`(?m)^`+nodeID(t, nodes[0])+`\s+up\s`).MatchString(out) {
		t.Errorf("nodes ls: %v %q\n%s", err, errOut, out)
	}
	if _, errOut, err := nodes[0].cliEnv(withStore, "nodes", "forget", nodeID(t, nodes[0])); err == nil || !strings.Contains(errOut, "only a lost node") {
		t.Errorf("nodes forget of a node that is up: %v %q, want a refusal", err, errOut)
	}
	if out, errOut, err := nodes[0].cliEnv(withStore, "nodes", "forget", victimID); err != nil || !strings.Contains(out, "forgot node "+victimID) {
		t.Errorf("nodes forget of the lost node: %v %q %q", err, out, errOut)
	}
	if out, _, _ := nodes[0].cliEnv(withStore, "nodes", "ls"); strings.Contains(out, victimID) {
		t.Errorf("the forgotten node is still listed:\n%s", out)
	}
	// The killed node's sandboxes still hold runsc processes: the node,
	// started again with its data dir, keeps their records lost and
	// removes them.
	victim.start()
	for _, id := range theirs {
		victim.assertGone(t, id)
		if got, err := victim.client().GetSandbox(ctx, id); err != nil || got.StopReason != "lost" {
			t.Errorf("sandbox %s after its node came back: %+v %v", id, got, err)
		}
	}
}

// The port proxy across nodes, with sandbox networking on: a sandbox's port
// is reached through a node that does not run it, by path, by host name
// ({port}-{id}.domain) and by a token URL minted through that node, and a
// WebSocket to the port passes through both hops.
func TestNodesPortProxy(t *testing.T) {
	testutil.Runsc(t)
	ctx := context.Background()
	nodes := startNodes(t, 2, "PANDASTACK_NETWORK_DEFAULT=internet", "PANDASTACK_PUBLIC_DOMAIN=sbx.test")
	defer func() {
		stopNodes(t, nodes)
		for _, s := range nodes {
			assertNetworkGone(t, s)
		}
	}()
	time.Sleep(2 * time.Second) // each has seen the other heartbeat
	sb, err := nodes[0].client().CreateSandbox(ctx, client.CreateSandboxRequest{TTLSeconds: 600})
	if err != nil {
		t.Fatal(err)
	}
	other := nodes[0]
	if sb.NodeID == nodeID(t, other) {
		other = nodes[1]
	}
	co := other.client()
	startPortServers(t, co, sb.ID, "hello-from-"+sb.NodeID)
	want := "hello-from-" + sb.NodeID + "\n"
	get := func(u, host string, withKey bool) (int, string) {
		t.Helper()
		req, _ := http.NewRequest("GET", u, nil)
		if host != "" {
			req.Host = host
		}
		if withKey {
			req.Header.Set("Authorization", "Bearer "+other.key)
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, string(b)
	}
	page := co.PortURL(sb.ID, 8000) + "page.txt"
	deadline := time.Now().Add(20 * time.Second)
	for {
		st, body := get(page, "", true)
		if st == 200 && body == want {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("GET page.txt through the node that does not run the sandbox: %d %q", st, body)
		}
		time.Sleep(200 * time.Millisecond)
	}
	if st, body := get(other.url+"/page.txt", "8000-"+sb.ID+".sbx.test", true); st != 200 || body != want {
		t.Errorf("host-routed through the other node: %d %q", st, body)
	}
	if st, _ := get(page, "", false); st != http.StatusUnauthorized {
		t.Errorf("without key or token through the other node: %d, want 401", st)
	}
	// Nor does the forwarding header make it say where the sandbox runs.
	claimed, _ := http.NewRequest("GET", page, nil)
	claimed.Header.Set("X-Pandastack-Forwarded-By", "someone")
	if resp, err := http.DefaultClient.Do(claimed); err != nil {
		t.Fatal(err)
	} else if resp.Body.Close(); resp.StatusCode != http.StatusUnauthorized {
		t.Errorf("without key or token, claiming to be forwarded, through the other node: %d, want 401", resp.StatusCode)
	}
	tok, err := co.CreatePortToken(ctx, sb.ID, 8000, time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	u, _ := url.Parse(tok.URL) // {port}-sbx-{id}.sbx.test: the port's own origin
	u.Path += "page.txt"
	host := u.Host
	u.Host = strings.TrimPrefix(other.url, "http://") // with no key: the other node forwards, the owner checks the token
	if st, body := get(u.String(), host, false); st != 200 || body != want {
		t.Errorf("token URL minted through the other node (%s): %d %q", u, st, body)
	}

	checkWSEcho(t, other.url, sb.ID, other.key, "ping across nodes")
}
