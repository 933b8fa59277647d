package sandbox

import (
	"bufio"
	"context"
	"fmt"
	"os"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/pandastack/pandastack"
)

// NodeConfig makes the manager one node of several sharing a store (issue
// 12): it heartbeats with its capacity, acts only on its own sandboxes
// (recovery, the reaper, idle suspend, KillAll), and marks the sandboxes of
// nodes that stopped heartbeating lost. With no ID the manager acts on
// every record, as a single server did before nodes existed.
type NodeConfig struct {
	ID        string        // this node's id, kept on each of its sandbox records
	URL       string        // its advertised base URL, where other nodes forward requests
	Heartbeat time.Duration // how often it heartbeats and looks for lost nodes
	// Grace: a node silent this long is lost and its sandboxes stopped
	// with StopLost. It must exceed the heartbeat interval and any clock
	// skew between hosts (times are the nodes' own).
	Grace    time.Duration
	CPUs     int // CPUs offered to sandboxes (0: the host's)
	MemoryMB int // memory offered to sandboxes (0: the host's total)
	// PlaceRestores: restores are placed like creates, for a snapshot
	// store every node reads (s3). With a local one a restore runs on the
	// node that was asked.
	PlaceRestores bool
	PlaceLocal    bool // every create runs on the node asked (a balancer in front places them)
	// StartedFile keeps the start time of this data directory's last run
	// of the node, which its record names: a server restarting finds its
	// own last run there, and one with another data directory (a copied
	// configuration) does not. "": the node's URL tells them apart.
	StartedFile string
}

// DefaultNodeConfig has the timings a node uses when its own are zero.
func DefaultNodeConfig() NodeConfig {
	return NodeConfig{Heartbeat: 2 * time.Second, Grace: 30 * time.Second}
}

func (c *NodeConfig) setDefaults() {
	d := DefaultNodeConfig()
	if c.Heartbeat == 0 {
		c.Heartbeat = d.Heartbeat
	}
	if c.Grace == 0 {
		c.Grace = d.Grace
	}
	if c.CPUs == 0 {
		c.CPUs = runtime.NumCPU()
	}
}

// nodeState is what the manager keeps of the cluster between heartbeats.
type nodeState struct {
	started time.Time
	// okSince starts this node's current run of heartbeats without a
	// failure or a gap; lastOK is the last of them. Only a node that has
	// heartbeated for the whole grace period judges others: after an
	// outage of the store (or a stall of this node) every other node's
	// heartbeat is old because nobody could write one, not because it died.
	okSince, lastOK time.Time
	mu              sync.Mutex
	urls            map[string]string // node id → URL, as of the last heartbeat
	lost            map[string]bool   // node ids found lost
	sameURL         map[string]bool   // other nodes found advertising this node's URL (logged once)
	warnedImages    bool              // the warning of a snapshot store not shared was logged
}

// NodeID returns this node's id ("" without nodes).
func (m *Manager) NodeID() string { return m.cfg.Node.ID }

// owns reports whether a sandbox record is this node's to act on. A
// record of no node is every manager's without nodes; with them, none is
// left once the first node has started (startNode).
func (m *Manager) owns(sb pandastack.Sandbox) bool {
	return sb.NodeID == "" || sb.NodeID == m.cfg.Node.ID
}

// pausedElsewhere is the error for work on sb, a paused sandbox of
// another node, that needs its image: that node answers for it once it is
// back (a lost node's paused sandboxes stay paused), or nil.
func (m *Manager) pausedElsewhere(sb pandastack.Sandbox) error {
	if sb.State != pandastack.StatePaused || m.owns(sb) {
		return nil
	}
	then := "the first request after that node is back resumes it"
	if !sb.AutoResume && !pandastack.Suspended(sb.PauseReason) {
		then = "once that node is back, resume it (POST /v1/sandboxes/" + sb.ID + "/resume): it was paused as asked"
	}
	return pandastack.Errorf(pandastack.EUnavailable,
		"sandbox %s is paused on node %s, which does not answer; its image is on that node's disk, so %s", sb.ID, sb.NodeID, then)
}

// reapsFor reports whether this node's reaper expires sb: its own, and
// the paused ones of a node found lost (their image goes when it is back).
func (m *Manager) reapsFor(sb pandastack.Sandbox) bool {
	if m.owns(sb) {
		return true
	}
	m.node.mu.Lock()
	defer m.node.mu.Unlock()
	return sb.State == pandastack.StatePaused && m.node.lost[sb.NodeID]
}

// heartbeat records this node as up with its capacity, marks nodes silent
// for the grace period lost, and drops what this node still runs of its
// own sandboxes that another node marked lost meanwhile (a stall longer
// than the grace period). Whether it was lost is what its own write
// replaced, not what the list before it said: another node may mark it
// lost between the two, and the write would then make it up unawares.
func (m *Manager) heartbeat(ctx context.Context) (err error) {
	nc := m.cfg.Node
	defer func() {
		if err != nil {
			m.node.mu.Lock()
			m.node.okSince = time.Time{}
			m.node.mu.Unlock()
		}
	}()
	nodes, err := m.store.ListNodes(ctx)
	if err != nil {
		return err
	}
	urls, lost := map[string]string{}, map[string]bool{}
	m.node.mu.Lock()
	lastOK := m.node.lastOK
	m.node.mu.Unlock()
	for _, n := range nodes {
		urls[n.ID] = n.URL
		if n.ID == nc.ID && !lastOK.IsZero() && n.HeartbeatAt.After(lastOK) && n.URL != nc.URL {
			// Another server heartbeats as this node since this one last
			// did (one started despite claimNodeID, on a clock ahead).
			m.log.Error("another server runs with this node's id: give each its own --node-id; their sandboxes are at risk", "node", nc.ID, "other_url", n.URL)
		}
		if n.State == pandastack.NodeLost {
			lost[n.ID] = true
		} else if n.ID != nc.ID && n.URL == nc.URL && m.now().Sub(n.HeartbeatAt) < nc.Grace {
			m.node.mu.Lock()
			first := !m.node.sameURL[n.ID]
			if m.node.sameURL == nil {
				m.node.sameURL = map[string]bool{}
			}
			m.node.sameURL[n.ID] = true
			m.node.mu.Unlock()
			if first {
				// Requests forwarded to either reach whichever the URL
				// leads to: creates placed on one run on the other, and
				// requests about their sandboxes are refused.
				m.log.Error("another node advertises this node's URL: give each node the URL it is reached at (--advertise-url; the default is the listen address, loopback unless set)", "node", nc.ID, "other", n.ID, "url", n.URL)
			}
		}
	}
	total, free := hostMemoryMB()
	free = max(0, free-m.cfg.MemoryReserveMB-m.bookedMiB()) // what creates may take (pressure.go)
	if nc.MemoryMB > 0 {
		total = nc.MemoryMB
	}
	pool := map[string]int{}
	m.mu.Lock()
	for name, pl := range m.pools {
		pool[name] = len(pl.ready)
	}
	m.mu.Unlock()
	now := m.now()
	was, err := m.store.Heartbeat(ctx, pandastack.Node{
		ID: nc.ID, URL: nc.URL, StartedAt: m.node.started, HeartbeatAt: now,
		CPUs: nc.CPUs, MemoryMB: total, FreeMemoryMB: free, Pool: pool,
	})
	if err != nil {
		return err
	}
	urls[nc.ID], lost[nc.ID] = nc.URL, false
	m.node.mu.Lock()
	if m.node.okSince.IsZero() || now.Sub(m.node.lastOK) > 2*nc.Heartbeat {
		m.node.okSince = now
	}
	m.node.lastOK = now
	// A node whose heartbeat hung until its timeout (Grace/4) and then
	// waits an interval writes again within Grace/4 + Heartbeat of the
	// store coming back: judging only after a whole grace of this node's
	// own heartbeats leaves it that.
	judge := now.Sub(m.node.okSince) >= nc.Grace
	m.node.mu.Unlock()
	var gone []string
	if judge {
		if gone, err = m.store.LoseNodes(ctx, now.Add(-nc.Grace), now); err != nil {
			return err
		}
	}
	for _, id := range gone {
		lost[id] = true
		m.log.Warn("node lost: its running sandboxes are stopped as lost, its paused ones wait for it", "node", id, "grace", nc.Grace)
		m.countLost(ctx, id, now)
	}
	m.node.mu.Lock()
	before := m.node.urls
	m.node.urls, m.node.lost = urls, lost
	m.node.mu.Unlock()
	for id, url := range urls {
		if _, seen := before[id]; !seen && id != nc.ID && !lost[id] {
			m.log.Info("node seen", "node", id, "url", url)
			m.node.mu.Lock()
			warn := !nc.PlaceRestores && !m.node.warnedImages
			m.node.warnedImages = m.node.warnedImages || warn
			m.node.mu.Unlock()
			if warn {
				m.log.Warn("other nodes share this node's database, and its snapshot store is not s3://: unless it is one every node shares, snapshots taken on one node are missing on the others; give every node the same s3:// --snapshot-store (docs/deploy.md)", "node", id)
			}
		}
	}
	if was == pandastack.NodeLost {
		m.log.Warn("this node was marked lost by another; dropping the sandboxes it recorded lost", "node", nc.ID)
		m.dropLost(ctx)
	} else if was == "" && !lastOK.IsZero() {
		// Its row went since its last heartbeat: it was lost, then
		// forgotten (`nodes forget`) while it stalled.
		m.log.Warn("this node was forgotten by another while it stalled; dropping the sandboxes it recorded lost", "node", nc.ID)
		m.dropLost(ctx)
	}
	return nil
}

// otherNodes says whether other nodes share this node's store, as the
// last heartbeat saw them.
func (m *Manager) otherNodes() bool {
	m.node.mu.Lock()
	defer m.node.mu.Unlock()
	for id := range m.node.urls {
		if id != m.cfg.Node.ID {
			return true
		}
	}
	return false
}

// countLost counts in the stops metric the sandboxes of node id that
// this node's LoseNodes recorded lost at at (the store may keep less
// than its nanoseconds): users' sandboxes ended, as a stop of this node's
// own does.
func (m *Manager) countLost(ctx context.Context, id string, at time.Time) {
	if m.metrics.stops == nil {
		return
	}
	recs, err := m.store.ListSandboxes(ctx, pandastack.SandboxFilter{Node: id, States: []pandastack.SandboxState{pandastack.StateStopped}})
	if err != nil {
		return
	}
	n := 0
	for _, r := range recs {
		if r.NodeID == id && r.StopReason == pandastack.StopLost && r.StoppedAt != nil && r.StoppedAt.Sub(at).Abs() < time.Second && r.ProjectID != warmProject {
			n++
		}
	}
	if n > 0 {
		m.metrics.stops.Add(float64(n), pandastack.StopLost)
	}
}

// dropLost tears down what this node runs or keeps paused of its sandboxes
// whose records say lost.
func (m *Manager) dropLost(ctx context.Context) {
	recs, err := m.store.ListSandboxes(ctx, pandastack.SandboxFilter{Node: m.cfg.Node.ID, States: []pandastack.SandboxState{pandastack.StateStopped}})
	if err != nil {
		m.log.Error("list lost sandboxes", "err", err)
		return
	}
	for _, sb := range recs {
		if sb.StopReason != pandastack.StopLost || m.sbx.begin(sb.ID, phaseStopping) != nil {
			continue
		}
		m.teardown(sb.ID, pandastack.StopLost)
		m.sbx.end(sb.ID)
	}
	// Those another node deleted meanwhile (a kill of a lost sandbox
	// removes its record): nothing says lost any more.
	for id := range m.sbx.running() {
		if _, err := m.store.GetSandbox(ctx, "", id); !pandastack.IsCode(err, pandastack.ENotFound) || m.sbx.begin(id, phaseStopping) != nil {
			continue
		}
		m.teardown(id, pandastack.StopKilled)
		m.sbx.end(id)
		m.log.Info("removed a sandbox another node deleted while this one was lost", "sandbox", id)
	}
	// Its paused sandboxes stayed paused while it was lost; those another
	// node killed or expired meanwhile go, image and prepared resume.
	if m.cfg.PausedDir == "" {
		return
	}
	ents, _ := os.ReadDir(m.cfg.PausedDir)
	for _, e := range ents {
		id := e.Name()
		if strings.HasPrefix(id, ".") {
			continue
		}
		sb, err := m.store.GetSandbox(ctx, "", id)
		if (err == nil && sb.State != pandastack.StateStopped) || (err != nil && !pandastack.IsCode(err, pandastack.ENotFound)) {
			continue // paused, being paused or resumed, or the store failed
		}
		if m.sbx.begin(id, phaseStopping) != nil {
			continue
		}
		m.teardown(id, "")
		m.sbx.end(id)
		m.log.Info("removed a paused sandbox another node ended while this one was lost", "sandbox", id)
	}
}

func (m *Manager) heartbeatLoop() {
	defer m.wg.Done()
	t := time.NewTicker(m.cfg.Node.Heartbeat)
	defer t.Stop()
	for {
		select {
		case <-m.stop:
			return
		case <-t.C:
		}
		// Well within the grace: a heartbeat hung on a dead connection
		// must fail, and this node count as silent, long before another
		// node that came back first may judge it.
		ctx, cancel := context.WithTimeout(context.Background(), m.cfg.Node.Grace/4)
		if err := m.heartbeat(ctx); err != nil {
			m.log.Error("node heartbeat", "node", m.cfg.Node.ID, "err", err)
		}
		cancel()
	}
}

// startNode heartbeats once, so that this node is up before it recovers,
// takes the sandboxes of no node if it is the first node to start on the
// store, and then keeps heartbeating.
func (m *Manager) startNode(ctx context.Context) error {
	if m.cfg.Node.ID == "" {
		return nil
	}
	m.node.started = m.now()
	if err := m.claimNodeID(ctx); err != nil {
		return err
	}
	if err := m.heartbeat(ctx); err != nil {
		return err
	}
	// Records made before nodes existed are the first node's: most likely
	// the server that ran them, restarted as a node. Left of no node,
	// every node took them for its own, and a later node's recovery,
	// which cannot attach to them, recorded them lost while they ran on.
	n, err := m.store.ClaimSandboxesOfNoNode(ctx, m.cfg.Node.ID)
	if err != nil {
		return err
	}
	if n > 0 {
		m.log.Warn("this node took the sandboxes recorded before nodes existed, as the first node to start on this store; if another server runs them, they are recorded lost now", "node", m.cfg.Node.ID, "sandboxes", n)
	}
	m.wg.Add(1)
	go m.heartbeatLoop()
	return nil
}

// claimNodeID refuses to be a second live server of this node's id (a
// copied configuration, two hosts with the same name): each would take
// the other's sandboxes for lost, since its own runtime lacks them, and
// pull the node's URL back and forth. The id's record, heartbeating
// within the grace period, is watched for two heartbeats unless it is
// this data directory's last run (StartedFile; without one, a record of
// this node's URL): one that stands still is an earlier run, gone; one
// that moves on is another server, and this one does not start.
func (m *Manager) claimNodeID(ctx context.Context) error {
	if err := m.claimNodeIDOnce(ctx); err != nil {
		return err
	}
	if f := m.cfg.Node.StartedFile; f != "" {
		if err := os.WriteFile(f, []byte(m.node.started.UTC().Format(time.RFC3339Nano)+"\n"), 0o600); err != nil {
			return fmt.Errorf("node %s: %w", m.cfg.Node.ID, err)
		}
	}
	return nil
}

// ownLastRun reports whether a node record is this data directory's last
// run (or, without a StartedFile, of this node's URL).
func (m *Manager) ownLastRun(n pandastack.Node) bool {
	f := m.cfg.Node.StartedFile
	if f == "" {
		return n.URL == m.cfg.Node.URL
	}
	b, err := os.ReadFile(f)
	if err != nil {
		return false
	}
	last, err := time.Parse(time.RFC3339Nano, strings.TrimSpace(string(b)))
	d := n.StartedAt.Sub(last)
	return err == nil && d < time.Millisecond && d > -time.Millisecond // stores keep microseconds or less
}

func (m *Manager) claimNodeIDOnce(ctx context.Context) error {
	nc := m.cfg.Node
	find := func() (pandastack.Node, bool, error) {
		nodes, err := m.store.ListNodes(ctx)
		if err != nil {
			return pandastack.Node{}, false, err
		}
		for _, n := range nodes {
			if n.ID == nc.ID {
				return n, true, nil
			}
		}
		return pandastack.Node{}, false, nil
	}
	before, ok, err := find()
	if err != nil || !ok || before.State != pandastack.NodeUp || m.ownLastRun(before) || m.now().Sub(before.HeartbeatAt) >= nc.Grace {
		return err
	}
	wait := min(2*nc.Heartbeat+time.Second, nc.Grace)
	m.log.Info("this node's id heartbeats from a run this data directory has no record of (another data directory, or a server of a build that kept none); waiting to see whether that server still runs", "node", nc.ID, "url", before.URL, "wait", wait)
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-time.After(wait):
	}
	after, ok, err := find()
	if err != nil {
		return err
	}
	if ok && after.HeartbeatAt.After(before.HeartbeatAt) {
		return fmt.Errorf("node id %q is in use by a running server at %s (it heartbeats; started %s): give each server its own --node-id; a server restarting on its own data directory keeps its id and is not refused",
			nc.ID, after.URL, after.StartedAt.UTC().Format(time.RFC3339))
	}
	return nil
}

// Remote says where a request about sandbox id must go: "" when this node
// answers it (its own sandbox, a record of no node, a stopped one, or one
// whose node is lost), else the owning node's URL.
func (m *Manager) Remote(ctx context.Context, projectID, id string) (string, error) {
	if m.cfg.Node.ID == "" {
		return "", nil
	}
	sb, err := m.store.GetSandbox(ctx, projectID, id)
	if err != nil || m.owns(sb) || sb.State == pandastack.StateStopped {
		return "", nil // this node answers, errors included
	}
	return m.nodeURL(ctx, sb.NodeID)
}

// nodeURL returns the URL of a node that is up, or "" when it is lost or
// unknown (this node then answers from the store).
func (m *Manager) nodeURL(ctx context.Context, id string) (string, error) {
	m.node.mu.Lock()
	url, known := m.node.urls[id]
	lost := m.node.lost[id]
	m.node.mu.Unlock()
	if known {
		if lost {
			return "", nil
		}
		return url, nil
	}
	// A node that joined since the last heartbeat.
	nodes, err := m.store.ListNodes(ctx)
	if err != nil {
		return "", err
	}
	for _, n := range nodes {
		if n.ID == id && n.State == pandastack.NodeUp {
			return n.URL, nil
		}
	}
	return "", nil
}

// NodeAt returns the id of the node up at url, as of this node's last
// heartbeat; "" when none is known.
func (m *Manager) NodeAt(url string) string {
	m.node.mu.Lock()
	defer m.node.mu.Unlock()
	for id, u := range m.node.urls {
		if u == url && !m.node.lost[id] {
			return id
		}
	}
	return ""
}

// NodeLost reports whether node id was found lost (silent for the grace
// period), as of this node's last heartbeat: requests passed on to it end
// then rather than wait on a node that may never answer. By id, not URL:
// a lost node's record stays, and a new node may come up at its address.
func (m *Manager) NodeLost(id string) bool {
	m.node.mu.Lock()
	defer m.node.mu.Unlock()
	return m.node.lost[id]
}

// nodesUp counts the nodes up as of the last heartbeat.
func (m *Manager) nodesUp() int {
	m.node.mu.Lock()
	defer m.node.mu.Unlock()
	n := 0
	for id := range m.node.urls {
		if !m.node.lost[id] {
			n++
		}
	}
	return n
}

// Place picks the node for a create: "" for this node, else the chosen
// node's URL. Without nodes, or when the create names nothing placement can
// weigh (a template that does not resolve here), it stays here and the
// local create gives the answer.
func (m *Manager) Place(ctx context.Context, projectID string, req CreateRequest) (string, error) {
	if m.cfg.Node.ID == "" || m.cfg.Node.PlaceLocal || m.nodesUp() < 2 {
		return "", nil
	}
	p := pandastack.Placement{Template: req.Template, CPU: req.CPU, MemoryMB: req.MemoryMB}
	if req.SnapshotID != "" {
		if !m.cfg.Node.PlaceRestores {
			return "", nil
		}
		snap, err := m.store.GetSnapshot(ctx, projectID, req.SnapshotID)
		if err != nil {
			return "", nil
		}
		p.Template, p.CPU, p.MemoryMB = "", snap.CPU, snap.MemoryMB
	} else {
		if p.Template == "" {
			p.Template = "base"
		}
		tpl, err := m.templates.Resolve(ctx, p.Template)
		if err != nil {
			return "", nil
		}
		if p.CPU == 0 {
			p.CPU = tpl.CPU
		}
		if p.MemoryMB == 0 {
			p.MemoryMB = tpl.MemoryMB
		}
	}
	// Only nodes heard from lately: one silent for a few heartbeats is
	// not chosen, though it is lost only after the whole grace period (a
	// stalled node took the creates placed on it until then, and held them).
	now := m.now()
	p.Since, p.At = now.Add(-m.placeFresh()), now
	n, err := m.store.PlaceSandbox(ctx, p)
	if err != nil {
		return "", err
	}
	if n.ID == m.cfg.Node.ID {
		return "", nil
	}
	return n.URL, nil
}

// placeFresh is how recent a node's heartbeat must be for placement to
// choose it: five heartbeats, within the grace period.
func (m *Manager) placeFresh() time.Duration {
	return min(5*m.cfg.Node.Heartbeat, m.cfg.Node.Grace)
}

// hostMemoryMB returns the host's total and available memory in MiB from
// /proc/meminfo; elsewhere (or if it cannot be read) a large figure for
// both, so placement weighs only what is committed.
func hostMemoryMB() (total, free int) {
	const unknown = 1 << 20
	f, err := os.Open("/proc/meminfo")
	if err != nil {
		return unknown, unknown
	}
	defer f.Close()
	total, free = unknown, unknown
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		fields := strings.Fields(sc.Text())
		if len(fields) < 2 {
			continue
		}
		kb, err := strconv.Atoi(fields[1])
		if err != nil {
			continue
		}
		switch fields[0] {
		case "MemTotal:":
			total = kb / 1024
		case "MemAvailable:":
			free = kb / 1024
		}
	}
	return total, free
}
