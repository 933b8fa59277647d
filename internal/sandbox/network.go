package sandbox

import (
	"context"

	"github.com/pandastack/pandastack"
)

// Network is what the manager needs of sandbox networking. The runtime it
// was given already puts each sandbox in its network; this is only for
// policies. Implemented by internal/network.
type Network interface {
	// Validate checks a policy: EInvalid or ENetworkDenied naming the entry.
	Validate(p pandastack.NetworkPolicy) error
	// SetPolicy replaces a sandbox's policy at once, or changes nothing.
	SetPolicy(id string, p pandastack.NetworkPolicy) error
	// Policy returns a sandbox's policy; false when it has none.
	Policy(id string) (pandastack.NetworkPolicy, bool)
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
	return m.net.Validate(*p)
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
func (m *Manager) networkOf(id string) *pandastack.NetworkPolicy {
	if m.net == nil {
		return nil
	}
	if p, ok := m.net.Policy(id); ok {
		return &p
	}
	return nil
}

// SetNetwork replaces the policy of a running or paused sandbox of the
// project; it takes effect at once. A rejected policy changes nothing.
func (m *Manager) SetNetwork(ctx context.Context, projectID, id string, p pandastack.NetworkPolicy) (pandastack.Sandbox, error) {
	sb, err := m.store.GetSandbox(ctx, projectID, id)
	if err != nil {
		return sb, err
	}
	if err := m.validNetwork(&p); err != nil {
		return sb, err
	}
	if sb.State != pandastack.StateRunning && sb.State != pandastack.StatePaused {
		return m.running(ctx, projectID, id) // the error that says why
	}
	if err := m.net.SetPolicy(id, p); err != nil {
		return sb, err
	}
	sb.Network = m.networkOf(id)
	return sb, nil
}
