package e2e

import (
	"context"
	"strings"
	"testing"

	"github.com/pandastack/pandastack/client"
)

// A sandbox's names resolve inside it: localhost, and its own hostname,
// which /etc/hostname says too, in a sandbox restored from the template's
// warm image (made by another sandbox) and in a fork's child. Without an
// /etc/hosts (debootstrap makes none) "localhost" went to the resolver
// and failed, and /etc/hostname held the build host's name.
func TestSandboxNames(t *testing.T) {
	s := sharedServer(t)
	c := s.client()
	ctx := context.Background()
	waitWarmTemplate(t, s, "code-interpreter")
	// A server on localhost, reached by that name, and the sandbox's own
	// name looked up, from Python as user code does.
	const check = `hostname; cat /etc/hostname; python3 -c "
import socket
srv = socket.create_server(('localhost', 0))
socket.create_connection(('localhost', srv.getsockname()[1]), timeout=5).close()
print(socket.gethostbyname(socket.gethostname()))
print('localhost ok')
"`
	names := func(id string) string {
		t.Helper()
		out := mustExec(t, s, id, check)
		lines := strings.Split(strings.TrimSpace(out), "\n")
		if len(lines) != 4 || lines[0] != strings.ReplaceAll(id, "_", "-") || lines[1] != lines[0] || lines[2] != "127.0.1.1" || lines[3] != "localhost ok" {
			t.Fatalf("in %s: hostname, /etc/hostname, its address, localhost:\n%s", id, out)
		}
		return lines[0]
	}
	sb := newSandbox(t, s, client.CreateSandboxRequest{Template: "code-interpreter", TTLSeconds: 600})
	names(sb.ID)
	kids, err := c.Fork(ctx, sb.ID, client.ForkRequest{Count: 1, TTLSeconds: 600})
	if err != nil {
		t.Fatalf("fork: %v", err)
	}
	t.Cleanup(func() { c.KillSandbox(context.Background(), kids[0].ID) })
	names(kids[0].ID)
	base := newSandbox(t, s, client.CreateSandboxRequest{Network: &client.NetworkPolicy{AllowOut: []string{}, DenyOut: []string{}}})
	names(base.ID)
}
