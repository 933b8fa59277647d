//go:build linux

package agent_test

import (
	"context"
	"encoding/json"
	"net/http"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/pandastack/pandastack/internal/agentproto"
)

func TestHello(t *testing.T) {
	cfg := testConfig(t)
	st := directStack(t, cfg, 42)
	var h agentproto.Hello
	st.call(t, http.MethodGet, "/v1/hello", nil, nil, http.StatusOK, &h)
	if h.ProtocolVersion != agentproto.ProtocolVersion || h.AgentVersion != "test" || h.Epoch != 42 || !h.BootedAt.Equal(cfg.BootedAt) {
		t.Errorf("hello %+v, want protocol %d, version test, epoch 42, booted %v", h, agentproto.ProtocolVersion, cfg.BootedAt)
	}
}

// TestNewEpochReplacesSession plays a host that restarts: a second session
// on the same pipes takes over, and the first one's command dies with it.
func TestNewEpochReplacesSession(t *testing.T) {
	cfg := testConfig(t)
	pipes := newHostPipes(t, cfg)

	first, closeFirst := pipes.connect(t, 7)
	var h agentproto.Hello
	first.call(t, http.MethodGet, "/v1/hello", nil, nil, http.StatusOK, &h)
	if h.Epoch != 7 {
		t.Fatalf("first session: hello epoch %d, want 7", h.Epoch)
	}
	resp := first.request(t, context.Background(), http.MethodPost, "/v1/exec", nil,
		jsonBody(t, agentproto.ExecRequest{Cmd: "echo $$; exec sleep 60"}))
	var ev agentproto.ExecEvent
	if err := json.NewDecoder(resp.Body).Decode(&ev); err != nil || ev.Type != "stdout" {
		t.Fatalf("first session's command: event %+v, err %v", ev, err)
	}
	pid, err := strconv.Atoi(strings.TrimSpace(string(ev.Data)))
	if err != nil {
		t.Fatalf("pid %q: %v", ev.Data, err)
	}
	closeFirst() // the host forgets the session; the agent learns on the next epoch

	second, closeSecond := pipes.connect(t, 8)
	second.call(t, http.MethodGet, "/v1/hello", nil, nil, http.StatusOK, &h)
	if h.Epoch != 8 {
		t.Fatalf("second session: hello epoch %d, want 8", h.Epoch)
	}
	res := second.exec(t, agentproto.ExecRequest{Argv: []string{"echo", "still here"}})
	if res.stdout.String() != "still here\n" {
		t.Errorf("second session: exec printed %q", res.stdout.String())
	}
	waitGone(t, []int{pid})
	closeSecond()

	// A few more epochs in a row, each answered as itself.
	for epoch := uint32(9); epoch < 12; epoch++ {
		st, closeIt := pipes.connect(t, epoch)
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		resp := st.request(t, ctx, http.MethodGet, "/v1/hello", nil, nil)
		err := json.NewDecoder(resp.Body).Decode(&h)
		resp.Body.Close()
		cancel()
		if err != nil || h.Epoch != epoch {
			t.Fatalf("epoch %d: hello %+v, err %v", epoch, h, err)
		}
		closeIt()
	}
}
