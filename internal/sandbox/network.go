package sandbox

import (
	"context"
	"crypto/sha256"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/netip"
	"strings"
	"time"

	"github.com/pandastack/pandastack"
	"github.com/pandastack/pandastack/internal/agentproto"
)

// Network is what the manager needs of sandbox networking. The runtime it
// was given already puts each sandbox in its network; this is only for
// policies. Implemented by internal/network.
type Network interface {
	// Validate checks a policy: EInvalid or ENetworkDenied naming the entry.
	Validate(p pandastack.NetworkPolicy) error
	// Kept returns a stored policy (a snapshot's, for sandbox id) without
	// the allow_out entries this server no longer opens.
	Kept(id string, p pandastack.NetworkPolicy) pandastack.NetworkPolicy
	// SetPolicy replaces a sandbox's policy at once, or changes nothing.
	SetPolicy(id string, p pandastack.NetworkPolicy) error
	// Policy returns a sandbox's policy; false when it has none.
	Policy(id string) (pandastack.NetworkPolicy, bool)
	// Log returns the sandbox's egress log, oldest first.
	Log(id string) []pandastack.EgressEntry
	// Addr returns the sandbox's address, where the host reaches its ports.
	Addr(id string) (netip.Addr, bool)
	// Hold keeps the sandbox's policy and log through the runtime's next
	// Stop (a pause), for its resume.
	Hold(id string)
	// Release drops what the network keeps of a sandbox (the runtime's
	// Stop does so for one that ran).
	Release(id string)
	// Known lists the sandboxes whose policy the network keeps.
	Known() []string
}

// keptNetwork is p, a policy stored in an image of what (a snapshot, a
// paused sandbox) made under this server's openings then, as the server
// can enforce it now: entries it no longer opens are dropped, as a resume
// drops them, rather than refusing the restore over an entry the caller
// never sent. nil stays nil.
func (m *Manager) keptNetwork(what string, p *pandastack.NetworkPolicy) *pandastack.NetworkPolicy {
	if p == nil || m.net == nil {
		return p
	}
	kept := m.net.Kept(what, *p)
	return &kept
}

// UseNetwork enables network policies; call before Start. Without it a
// create that asks for a network is refused.
func (m *Manager) UseNetwork(n Network) { m.net = n }

func (m *Manager) validNetwork(p *pandastack.NetworkPolicy) error {
	if p == nil {
		return nil
	}
	if m.net == nil {
		return pandastack.Errorf(pandastack.EInvalid, "network: this server runs without sandbox networking (serve --network-default off)")
	}
	if err := m.net.Validate(*p); err != nil {
		return err
	}
	// deny_out carves out of the internet. With neither it nor allow_out
	// nothing is reachable, and a deny_out alone says its caller meant to
	// block a range only, not to cut the sandbox off. (deny_out with
	// allow_out, E2B's "deny everything but", does what it says.)
	if !p.AllowInternetAccess && len(p.AllowOut) == 0 && len(p.DenyOut) > 0 {
		return pandastack.Errorf(pandastack.EInvalid, "network.deny_out alone leaves the sandbox no internet at all: it carves out of allow_internet_access: true, which is off; set that to block only these, or list what to reach in allow_out")
	}
	return nil
}

// applyNetwork sets the policy of a sandbox that was started with the
// default one (a pool sandbox); nil keeps the default.
func (m *Manager) applyNetwork(id string, p *pandastack.NetworkPolicy) error {
	if p == nil || m.net == nil {
		return nil
	}
	return m.net.SetPolicy(id, *p)
}

// networkOf returns the sandbox's policy, or nil when it has none.
// WithNetwork fills in the sandbox's network policy, as Get does: records
// from the store do not hold it.
func (m *Manager) WithNetwork(sb pandastack.Sandbox) pandastack.Sandbox {
	sb.Network = m.networkOf(sb.ID)
	return sb
}

func (m *Manager) networkOf(id string) *pandastack.NetworkPolicy {
	if m.net == nil {
		return nil
	}
	if p, ok := m.net.Policy(id); ok {
		return &p
	}
	return nil
}

// keepNetwork gives a sandbox still paused after a failed resume its policy
// p back when the failure took it away (the runtime's stop of what the
// resume made releases the network, policy and all): the next resume would
// otherwise apply the policy of pause time, and a policy tightened while
// paused (no internet) would be lost.
func (m *Manager) keepNetwork(id string, p *pandastack.NetworkPolicy) {
	if m.net == nil || p == nil {
		return
	}
	if _, ok := m.net.Policy(id); ok {
		return
	}
	if sb, err := m.store.GetSandbox(context.Background(), "", id); err != nil || sb.State != pandastack.StatePaused {
		return
	}
	if err := m.net.SetPolicy(id, *p); err != nil {
		m.log.Error("keeping the network policy of a sandbox whose resume failed", "sandbox", id, "err", err)
	}
}

// SetNetwork replaces the policy of a running or paused sandbox of the
// project; it takes effect at once. A rejected policy changes nothing.
func (m *Manager) SetNetwork(ctx context.Context, projectID, id string, p pandastack.NetworkPolicy) (pandastack.Sandbox, error) {
	sb, err := m.settled(ctx, projectID, id)
	if err != nil {
		return sb, err
	}
	if err := m.validNetwork(&p); err != nil {
		return sb, err
	}
	if sb.State != pandastack.StateRunning && sb.State != pandastack.StatePaused {
		return m.running(ctx, projectID, id) // the error that says why
	}
	if err := m.pausedElsewhere(sb); err != nil {
		return sb, err
	}
	if err := m.net.SetPolicy(id, p); err != nil {
		return sb, err
	}
	// Killed meanwhile (this holds no claim on it): the policy went to a
	// sandbox the network no longer knew, which kept it, with its state
	// file, for good. Dropped, and the caller told it is gone (a killed
	// sandbox's record goes: not found, as a GET says then).
	now, err := m.store.GetSandbox(ctx, projectID, id)
	switch {
	case pandastack.IsCode(err, pandastack.ENotFound):
		m.net.Release(id)
		return sb, err
	case err == nil && now.State == pandastack.StateStopped:
		m.net.Release(id)
		return now, StoppedError(now)
	}
	sb.Network = m.networkOf(id)
	return sb, nil
}

// SandboxCAFile is where a sandbox's trust store ends up: its own system
// bundle plus the certificates the server adds (UseSandboxCA), at the path
// OpenSSL, curl and Debian's certifi read by default.
const SandboxCAFile = "/etc/ssl/certs/ca-certificates.crt"

// caEnv are the variables that make other tools use SandboxCAFile.
var caEnv = map[string]string{
	"SSL_CERT_FILE":       SandboxCAFile,
	"REQUESTS_CA_BUNDLE":  SandboxCAFile,
	"PIP_CERT":            SandboxCAFile,
	"NODE_EXTRA_CA_CERTS": SandboxCAFile,
}

// installCA adds the PEM on stdin to the sandbox's system bundle (kept
// aside once, so a restore or a second call does not add it twice) and
// tells pip about it where no pip.conf of the template's own exists.
// setupSandbox appends the write of caMarker.
const installCA = `set -e
d=/usr/local/share/pandastack
mkdir -p $d /etc/ssl/certs
[ -f $d/system-ca.crt ] || { cat /etc/ssl/certs/ca-certificates.crt 2>/dev/null || true; } > $d/system-ca.crt
cat $d/system-ca.crt - > $d/ca-certificates.crt
cp $d/ca-certificates.crt /etc/ssl/certs/ca-certificates.crt
if [ ! -e /etc/pip.conf ] || grep -q '^# pandastack' /etc/pip.conf; then
  printf '# pandastack: the sandbox trust store, with the server'"'"'s CA bundle\n[global]\ncert = /etc/ssl/certs/ca-certificates.crt\n' > /etc/pip.conf
fi
`

// caMarker holds the digest of the certificates installCA installed. The
// file and the agent's environment (POST /v1/env) live in a checkpoint
// alike, so a restored sandbox that has the server's digest already (every
// create from a warm image or a pool) skips installCA: a shell and five
// processes in gVisor, 130-240 ms of a create here.
const caMarker = agentproto.CAMarkerPath

// UseSandboxCA makes every sandbox trust the certificates in pem (e.g. the
// host's system bundle, whose authority a TLS-inspecting proxy may use) in
// addition to its own; nil leaves sandboxes' trust stores alone. Call
// before Start.
func (m *Manager) UseSandboxCA(pem []byte) {
	m.caPEM = pem
	m.caDigest = ""
	if len(pem) > 0 {
		m.caDigest = fmt.Sprintf("%x", sha256.Sum256(pem))
	}
}

// withSetup adds to h what the agent of sandbox id (booted or restored,
// its network up) can do of setupSandbox in its hello: write the resolver,
// report the CA marker. An older agent ignores both, and setupSandbox
// then does them itself.
func (m *Manager) withSetup(id string, h hello) hello {
	if ns, ok := m.resolverOf(id); ok {
		h.resolver = ns
	}
	h.caMarker = len(m.caPEM) > 0
	return h
}

// setupSandbox readies a freshly started or restored sandbox: its
// resolver, its trust store and the variables that point tools at it. A
// restored agent keeps the environment it was checkpointed with, and a
// restored sandbox may sit behind a new gateway, so this runs after every
// boot; it uses the agent's file API (no process) where it can, and
// nothing at all for what the session's hello did already (withSetup): on
// a create from a warm image, no round trip.
func (m *Manager) setupSandbox(parent context.Context, c *AgentClient) error {
	ctx, cancel := context.WithTimeout(parent, setupTimeout)
	defer cancel()
	err := m.setupResolver(ctx, c)
	if err == nil && len(m.caPEM) > 0 && !m.hasCA(ctx, c) {
		var ev agentproto.ExecEvent
		cmd := installCA + "echo " + m.caDigest + " > " + caMarker + "\n"
		ev, err = c.Exec(ctx, agentproto.ExecRequest{Cmd: cmd, Stdin: m.caPEM, Root: true, TimeoutMS: 15_000, Env: setupEnv}, nil)
		if err == nil && ev.ExitCode != 0 {
			err = fmt.Errorf("exit status %d", ev.ExitCode)
		}
		if err == nil {
			err = c.do(ctx, http.MethodPost, "/v1/env", nil, agentproto.EnvRequest{Env: caEnv}, nil)
		}
	}
	if err != nil {
		if ownDeadline(ctx, parent) {
			return pandastack.Errorf(pandastack.ETimeout, "sandbox %s: its setup (resolver, CA bundle) did not finish within %s; the host may be overloaded", c.id, setupTimeout)
		}
		return fmt.Errorf("set up sandbox %s (resolver, CA bundle): %w", c.id, err)
	}
	return nil
}

// setupEnv overrides, for the platform's own setup commands, what of the
// sandbox's environment (the create's env, the user's to choose) would
// change how they run: a PATH without the system's directories made the
// setup fail, and the create with it.
var setupEnv = map[string]string{
	"PATH":            "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
	"LD_PRELOAD":      "",
	"LD_LIBRARY_PATH": "",
	"BASH_ENV":        "",
	"ENV":             "",
}

// setupTimeout bounds a sandbox's setup after each boot, and its agent's
// hello: both are a few round trips to the agent.
var setupTimeout = 15 * time.Second

// ownDeadline reports whether ctx, derived from parent, ended by its own
// deadline while parent still runs: work that ran past its own bound,
// reported as ETimeout rather than as an internal error.
func ownDeadline(ctx, parent context.Context) bool {
	return errors.Is(ctx.Err(), context.DeadlineExceeded) && parent.Err() == nil
}

// hasCA reports whether the sandbox has the server's certificates
// installed already (caMarker), from the hello's report when it made one;
// any doubt says no.
func (m *Manager) hasCA(ctx context.Context, c *AgentClient) bool {
	if mk := c.hello.CAMarker; mk != nil {
		return *mk == m.caDigest
	}
	rc, _, err := c.GetFile(ctx, caMarker, true)
	if err != nil {
		return false
	}
	defer rc.Close()
	b, err := io.ReadAll(io.LimitReader(rc, 256))
	return err == nil && strings.TrimSpace(string(b)) == m.caDigest
}

// resolverOf returns the nameserver of sandbox id: the resolver on its
// gateway (the first address of its /30); false without networking.
func (m *Manager) resolverOf(id string) (string, bool) {
	if m.net == nil {
		return "", false
	}
	a, ok := m.net.Addr(id)
	if !ok {
		return "", false
	}
	return a.Prev().String(), true
}

// setupResolver points the sandbox's /etc/resolv.conf at its resolver
// (resolverOf), unless the hello did. The firewall redirects DNS to any
// address there anyway, but not to a loopback nameserver a template took
// from its build host (systemd-resolved's 127.0.0.53), which would never
// leave the sandbox. The file API renames a new file into place,
// replacing a symlink rather than writing through it.
func (m *Manager) setupResolver(ctx context.Context, c *AgentClient) error {
	ns, ok := m.resolverOf(c.id)
	if !ok || c.hello.Resolver == ns {
		return nil
	}
	_, err := c.PutFile(ctx, "/etc/resolv.conf", true, strings.NewReader(agentproto.ResolvConf(ns)))
	return err
}

// NetworkLog returns the egress log of a sandbox of the project: DNS
// answers, connections through NAT or the domain proxy and connects the
// firewall refused, newest kept.
func (m *Manager) NetworkLog(ctx context.Context, projectID, id string) ([]pandastack.EgressEntry, error) {
	if sb, err := m.store.GetSandbox(ctx, projectID, id); err != nil {
		return nil, err
	} else if sb.State == pandastack.StateStopped {
		return nil, StoppedError(sb) // its log went with its network: not an empty one
	}
	if m.net == nil {
		return nil, pandastack.Errorf(pandastack.EInvalid, "this server runs without sandbox networking")
	}
	log := m.net.Log(id)
	if log == nil {
		log = []pandastack.EgressEntry{}
	}
	return log, nil
}

// Networking reports whether this server runs sandboxes with networking,
// without which no port of theirs can be reached.
func (m *Manager) Networking() bool { return m.net != nil }

// PortAddr returns where the host reaches port of a running sandbox of the
// project (resuming it first when paused with auto_resume).
func (m *Manager) PortAddr(ctx context.Context, projectID, id string, port int) (netip.AddrPort, error) {
	if _, err := m.usable(ctx, projectID, id); err != nil {
		return netip.AddrPort{}, err
	}
	if m.net == nil {
		return netip.AddrPort{}, pandastack.Errorf(pandastack.EInvalid, "this server runs without sandbox networking: no ports to reach")
	}
	a, ok := m.net.Addr(id)
	if !ok {
		return netip.AddrPort{}, pandastack.Errorf(pandastack.EUnavailable, "sandbox %s has no network address", id)
	}
	return netip.AddrPortFrom(a, uint16(port)), nil
}
